//! Picks each kernel's build for this CPU: the widest instruction set it
//! has, detected once per process. Every `unsafe` call into `x86`
//! sits here, behind the check that makes it sound.

use std::ops::Range;

use crate::attention::{KvElem, RowJob};
use crate::blocked::{FlashUnit, Packing, UnitFn};
use crate::format::{QKind, RowTile, TileOut};
use crate::level::{Level, has_avx512_bf16, level};
use crate::scalar;
use crate::tiled::{TiledMatmul, Tiling};
#[cfg(target_arch = "x86_64")]
use crate::x86::{avx2, avx512, avx512bf16};

/// Runs one attention row with the widest vector unit available.
pub fn attend_row<T: KvElem>(job: &RowJob<'_, T>, scores: &mut Vec<f32>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: AVX-512 was detected at run time.
        Level::Avx512Vnni => unsafe { avx512::attend_row(job, scores, out) },
        // SAFETY: AVX2/FMA were detected at run time.
        Level::Avx2 => unsafe { avx2::attend_row(job, scores, out) },
        Level::Scalar => scalar::attend_row(job, scores, out),
    }
    #[cfg(not(target_arch = "x86_64"))]
    scalar::attend_row(job, scores, out);
}

/// `gate[i] = silu(gate[i]) * up[i]`, the llama MLP activation.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Scalar {
        // SAFETY: AVX2/FMA were detected at run time.
        unsafe { avx2::silu_mul(gate, up) };
        return;
    }
    scalar::silu_mul(gate, up);
}

/// `gate[i] = gelu(gate[i]) * up[i]` (tanh approximation), the Gemma MLP activation.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Scalar {
        // SAFETY: AVX2/FMA were detected at run time.
        unsafe { avx2::gelu_mul(gate, up) };
        return;
    }
    scalar::gelu_mul(gate, up);
}

/// `gate[i] = swiglu_oai(gate[i], up[i])`, gpt-oss's clamped SwiGLU.
pub fn swiglu_oai_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Scalar {
        // SAFETY: AVX2/FMA were detected at run time.
        unsafe { avx2::swiglu_oai_mul(gate, up) };
        return;
    }
    scalar::swiglu_oai_mul(gate, up);
}

/// The blocked attention unit ([`super::blocked::unit_impl`]) in f32,
/// built for the widest vector unit available.
pub fn flash_unit() -> FlashUnit {
    #[cfg(target_arch = "x86_64")]
    match level() {
        Level::Avx512Vnni => return f32_unit("avx512", avx512::flash_unit),
        Level::Avx2 => return f32_unit("avx2", avx2::flash_unit),
        Level::Scalar => {}
    }
    f32_unit("portable", scalar::flash_unit)
}

/// The blocked attention unit in bf16 with f32 sums, where the CPU has
/// AVX512_BF16; it takes heads up to [`FlashUnit::max_head_dim`] wide.
pub fn flash_unit_bf16() -> Option<FlashUnit> {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        return Some(FlashUnit {
            name: "avx512-bf16",
            packing: Packing::Bf16,
            run: avx512bf16::flash_unit,
            max_head_dim: avx512bf16::MAX_HEAD_DIM,
        });
    }
    None
}

fn f32_unit(name: &'static str, run: UnitFn) -> FlashUnit {
    FlashUnit {
        name,
        packing: Packing::F32,
        run,
        max_head_dim: usize::MAX,
    }
}

/// Every build of the blocked attention unit this CPU can run, so tests
/// check each level the machine has, not only the widest.
pub fn flash_units() -> Vec<FlashUnit> {
    let mut units = vec![f32_unit("portable", scalar::flash_unit)];
    #[cfg(target_arch = "x86_64")]
    {
        if level() != Level::Scalar {
            units.push(f32_unit("avx2", avx2::flash_unit));
        }
        if level() == Level::Avx512Vnni {
            units.push(f32_unit("avx512", avx512::flash_unit));
        }
    }
    units.extend(flash_unit_bf16());
    units
}

/// Packs up to [`crate::BK`] key rows (each at least `d` long, `d` a
/// multiple of 16 up to the bf16 unit's widest) for the bf16 unit:
/// `[d / 2][BK]` pairs of bf16 (dimensions `2i, 2i + 1` of one key), zeros
/// past the last key. Panics where the CPU has no bf16 unit.
pub fn pack_keys_bf16(rows: &[&[f32]], d: usize, kt: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    avx512bf16::pack_keys(rows, d, kt);
    #[cfg(not(target_arch = "x86_64"))]
    panic!(
        "no bf16 attention on this CPU ({} rows, d {d}, {})",
        rows.len(),
        kt.len()
    );
}

/// Packs up to [`crate::BK`] value rows for the bf16 unit: `[BK / 2][d]`
/// pairs of bf16 (keys `2j, 2j + 1` of one column), zeros past the last
/// key. Panics where the CPU has no bf16 unit.
pub fn pack_values_bf16(rows: &[&[f32]], d: usize, v: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    avx512bf16::pack_values(rows, d, v);
    #[cfg(not(target_arch = "x86_64"))]
    panic!(
        "no bf16 attention on this CPU ({} rows, d {d}, {})",
        rows.len(),
        v.len()
    );
}

/// Quantizes activations to i8 blocks ([`crate::Q8Acts`]).
pub(super) fn quantize(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Scalar {
        // SAFETY: AVX2/FMA were detected at run time.
        unsafe { avx2::quantize(x, q, d, s) };
        return;
    }
    scalar::quantize(x, q, d, s);
}

/// Quantizes activations to i8 with one step per 256 values ([`crate::Q8Acts`]'s `k*` fields).
pub(super) fn quantize_k(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum16: &mut [i16],
    sum32: &mut [i16],
) {
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Scalar {
        // SAFETY: AVX2/FMA were detected at run time.
        unsafe { avx2::quantize_k(x, q, d, sum16, sum32) };
        return;
    }
    scalar::quantize_k(x, q, d, sum16, sum32);
}

/// One ggml-layout weight row as f32, built for `lvl` (at most [`level`]).
pub(super) fn dequantize_row(lvl: Level, kind: QKind, row: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if lvl != Level::Scalar && level() != Level::Scalar {
        // SAFETY: AVX2/FMA/F16C were detected at run time.
        unsafe { avx2::dequantize_row(kind, row, out) };
        return;
    }
    let _ = lvl;
    scalar::dequantize_row(kind, row, out);
}

/// Dot products of a tile's weight rows with its activation rows, in
/// `vals[row][act]`.
///
/// # Safety
/// `lvl` must be at most [`level`]; `job.w` must hold `job.rows` rows of
/// `job.row_bytes` bytes; `job.acts` must hold rows `i0..i0 + m` (q, d and s).
pub(super) unsafe fn tile(lvl: Level, job: &RowTile<'_>, vals: &mut TileOut) {
    match lvl {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level was detected; the bounds are the caller's.
        Level::Avx512Vnni => unsafe { avx512::tile(job, vals) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Level::Avx2 => unsafe { avx2::tile(job, vals) },
        _ => scalar::tile_rows(job, vals),
    }
}

/// The int8 matmul over the tiles `tiles` of a matrix repacked by
/// [`Tiling::repack`].
///
/// # Safety
/// `job` must describe a matrix tiled with `tiling` (which exists only for
/// the detected level) and bound `acts` and `out` as [`TiledMatmul`] says;
/// no other thread may write the output columns of `tiles` meanwhile.
pub(super) unsafe fn matmul_tiles(tiling: Tiling, job: &TiledMatmul<'_>, tiles: Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    match tiling {
        Tiling::Vnni16 => {
            assert!(tiling.runs_on(level()));
            // SAFETY: the level is checked above; the rest is the caller's.
            unsafe { avx512::matmul_tiles(job, tiles) };
        }
        Tiling::Avx2x8 => {
            assert!(tiling.runs_on(level()));
            // SAFETY: as above.
            unsafe { avx2::matmul_tiles(job, tiles) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (tiling, job, tiles);
}
