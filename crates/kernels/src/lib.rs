//! zinfer's CPU kernels, one module per job and one build per instruction set:
//!
//! - [`format`] and [`level`] (leaves): the block formats and int8
//!   activations the kernels read, and the instruction sets they are built for;
//! - [`attention`] (a leaf): the head layout and KV element types attention reads;
//! - `fast_exp` (a leaf): the exponential of the softmaxes and SiLU;
//! - [`matrix`]: quantized weight matrices in ggml block layouts, int8
//!   activations, the matmuls over them, and dequantize + f32 GEMM for long
//!   prefill chunks;
//! - [`tiled`]: the row-interleaved tile layouts the AVX2 and AVX-512 VNNI
//!   matmuls read;
//! - [`blocked`]: the unit of work of the blocked (flash-style) attention;
//! - [`scalar`]: portable Rust builds of every kernel (the fallback, and the
//!   bodies the SIMD builds inline);
//! - `x86::avx2`, `x86::avx512`, `x86::avx512bf16`: intrinsics builds
//!   (the last: attention in bf16 with f32 sums), called only through
//! - [`dispatch`], which detects the CPU's widest instruction set once and
//!   picks each kernel's build.
//!
//! The int8 path follows ggml: activations are quantized per block of 32 to
//! i8 with an f32 scale (per 256 for K-quant tiles and IQ4_XS, with integer sums per
//! 16 and 32, so sub-block scales and mins apply in integers), weight
//! nibbles or bytes are multiplied with `maddubs` (AVX2) or `vpdpbusd`
//! (AVX-512 VNNI), and each weight tile is reused for up to four (K-quants:
//! eight) activation rows while it sits in L1, so a batch of decode tokens
//! or a prefill chunk reads the weights once.
//!
//! This is the one crate that uses `unsafe`: SIMD intrinsics behind
//! runtime feature checks, and raw output pointers whose disjointness is
//! argued at each use.
#![allow(unsafe_code)]

pub mod alloc;
mod attention;
mod blocked;
mod dispatch;
mod fast_exp;
mod format;
mod level;
mod matrix;
mod pool;
mod scalar;
pub mod test_data;
mod tiled;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attention::{HeadShape, KvElem, RowJob, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, ScoreRule};
pub use blocked::{
    BK, FlashUnit, Packed, Packing, UnitBuf, UnitFn, UnitJob, Values, first_packed_key,
};
pub use dispatch::{
    attend_row, flash_unit, flash_unit_bf16, flash_units, gelu_mul, pack_keys_bf16,
    pack_values_bf16, silu_mul, swiglu_oai_mul,
};
pub use format::{Q8Acts, QKind, quantize_iq4_nl, quantize_iq4_xs, quantize_mxfp4};
pub use matrix::{Layout, LayoutError, QMatrix, matmul_dense, q5_0_as_q5_1, run_units};
/// The portable build of the blocked attention unit, to check the SIMD
/// builds against.
pub use scalar::flash_unit as flash_unit_portable;

/// Sizes the kernels' thread pool (on first use in the process; see
/// [`pool::global`]) and returns its thread count.
pub fn pool_threads(threads: Option<usize>) -> usize {
    pool::global(threads).threads()
}
