//! CPU kernels, one module per job and one build per instruction set:
//!
//! - [`matrix`]: quantized weight matrices in ggml block layouts, int8
//!   activations, the matmuls over them, and dequantize + f32 GEMM for long
//!   prefill chunks;
//! - [`tiled`]: the row-interleaved tile layouts the AVX2 and AVX-512 VNNI
//!   matmuls read;
//! - [`blocked`]: the unit of work of the blocked (flash-style) attention;
//! - [`scalar`]: portable Rust builds of every kernel (the fallback, and the
//!   bodies the SIMD builds inline);
//! - `x86::avx2`, `x86::avx512`: intrinsics builds, called only through
//! - [`dispatch`], which detects the CPU's widest instruction set once and
//!   picks each kernel's build.
//!
//! The int8 path follows ggml: activations are quantized per block of 32 to
//! i8 with an f32 scale, weight nibbles (Q4_1) or bytes (Q8_0) are multiplied
//! with `maddubs` (AVX2) or `vpdpbusd` (AVX-512 VNNI), and each weight row is
//! reused for up to four activation rows while it sits in L1, so a batch of
//! decode tokens reads the weights once.
//!
//! This is the one module tree that uses `unsafe`: SIMD intrinsics behind
//! runtime feature checks, and raw output pointers whose disjointness is
//! argued at each use.
#![allow(unsafe_code)]

mod blocked;
mod dispatch;
mod matrix;
mod pool;
mod scalar;
mod tiled;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use blocked::{BK, UnitBuf, UnitFn, UnitJob};
pub(crate) use dispatch::{attend_row, flash_unit, silu_mul};
pub(crate) use matrix::{Q8Acts, QKind, QMatrix, matmul_dense, q5_0_as_q5_1, run_units};
#[cfg(test)]
pub(crate) use scalar::flash_unit as flash_unit_portable;

use super::kv::KvElem;

/// Sizes the kernels' thread pool (on first use in the process; see
/// [`pool::global`]) and returns its thread count.
pub(crate) fn pool_threads(threads: Option<usize>) -> usize {
    pool::global(threads).threads()
}

/// Head layout of the attention.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadShape {
    /// Query heads.
    pub(crate) n_heads: usize,
    /// Key/value heads; query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
    pub(crate) n_kv_heads: usize,
    /// Width of one head.
    pub(crate) head_dim: usize,
}

/// One query row's attention: `softmax(q K^T / sqrt(d)) V` over the pool
/// rows at `keys`. `q` is `[n_heads * head_dim]`; the pools are
/// `[slots, n_kv_heads * head_dim]`.
#[derive(Clone, Copy)]
pub(crate) struct RowJob<'a, T> {
    pub(crate) q: &'a [f32],
    pub(crate) k_pool: &'a [T],
    pub(crate) v_pool: &'a [T],
    pub(crate) keys: &'a [u32],
    pub(crate) shape: HeadShape,
}
