//! AVX-512 VNNI matmul on weights repacked in tiles of 16 rows.
//!
//! The row-major kernels in [`super::kernels`] spend most of their
//! instructions on per-block scale handling, one row at a time. Here 16
//! weight rows are interleaved so that one `vpdpbusd` multiplies 4 k-values
//! of all 16 rows with 4 broadcast activation bytes: a 32-value block of 16
//! rows is 8 instructions into integer lanes, then one scale FMA per block,
//! with the 16 row scales in one vector. Weights keep their size (the repack
//! only reorders bytes), so this replaces the ggml layout at load.
//!
//! Layout per (tile, block), tiles outermost:
//! - Q4_1: `d[16]` f16, `m[16]` f16, then 4 groups of 64 bytes; byte
//!   `g*64 + row*4 + t` holds k = `8g + t` (low nibble) and `8g + 4 + t` (high).
//! - Q8_0: `d[16]` f16, then 8 groups of 64 bytes; byte `g*64 + row*4 + t`
//!   is `q[4g + t] + 128` (unsigned, as `vpdpbusd` wants), corrected with
//!   the activation block sums.
#![allow(unsafe_code)]

use super::kernels::{Q8Acts, QK, QKind};

/// Rows per tile.
pub(crate) const TILE: usize = 16;

fn tile_block_bytes(kind: QKind) -> usize {
    match kind {
        QKind::Q4_1 => 64 + 256,
        QKind::Q8_0 => 32 + 512,
    }
}

/// Reorders ggml row-major blocks (`rows` a multiple of 16) into tiles.
pub(crate) fn repack(kind: QKind, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    let nb = cols / QK;
    let bb = match kind {
        QKind::Q4_1 => 20,
        QKind::Q8_0 => 34,
    };
    let tb = tile_block_bytes(kind);
    let mut out = vec![0u8; rows / TILE * nb * tb];
    for t in 0..rows / TILE {
        for b in 0..nb {
            let dst = &mut out[(t * nb + b) * tb..(t * nb + b + 1) * tb];
            for rr in 0..TILE {
                let blk = &data[((t * TILE + rr) * nb + b) * bb..][..bb];
                dst[2 * rr..2 * rr + 2].copy_from_slice(&blk[..2]);
                match kind {
                    QKind::Q4_1 => {
                        dst[32 + 2 * rr..34 + 2 * rr].copy_from_slice(&blk[2..4]);
                        let q = |k: usize| {
                            if k < 16 {
                                blk[4 + k] & 15
                            } else {
                                blk[4 + k - 16] >> 4
                            }
                        };
                        for g in 0..4 {
                            for tt in 0..4 {
                                dst[64 + g * 64 + rr * 4 + tt] =
                                    q(8 * g + tt) | (q(8 * g + 4 + tt) << 4);
                            }
                        }
                    }
                    QKind::Q8_0 => {
                        for g in 0..8 {
                            for tt in 0..4 {
                                dst[32 + g * 64 + rr * 4 + tt] = blk[2 + 4 * g + tt] ^ 0x80;
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Row `r` of a tiled matrix as f32.
pub(crate) fn dequantize_row(kind: QKind, cols: usize, data: &[u8], r: usize, out: &mut [f32]) {
    let nb = cols / QK;
    let tb = tile_block_bytes(kind);
    let (t, rr) = (r / TILE, r % TILE);
    let f16 =
        |bytes: &[u8], at: usize| half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32();
    for (b, o) in out.chunks_exact_mut(QK).take(nb).enumerate() {
        let blk = &data[(t * nb + b) * tb..(t * nb + b + 1) * tb];
        let d = f16(blk, 2 * rr);
        match kind {
            QKind::Q4_1 => {
                let mn = f16(blk, 32 + 2 * rr);
                for g in 0..4 {
                    for tt in 0..4 {
                        let byte = blk[64 + g * 64 + rr * 4 + tt];
                        o[8 * g + tt] = d * f32::from(byte & 15) + mn;
                        o[8 * g + 4 + tt] = d * f32::from(byte >> 4) + mn;
                    }
                }
            }
            QKind::Q8_0 => {
                for g in 0..8 {
                    for tt in 0..4 {
                        let q = i32::from(blk[32 + g * 64 + rr * 4 + tt]) - 128;
                        o[4 * g + tt] = d * q as f32;
                    }
                }
            }
        }
    }
}

/// Most activation rows per pass over a weight tile.
const ACT_TILE: usize = 4;

/// `out[i, 16t..16t+16]` for every activation row `i < m` and tile `t` in `tiles`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VNNI; `data` must be a tiled matrix of
/// `n_rows x cols` built by [`repack`]; `acts` must hold `m` rows of `cols`;
/// `out` must hold `m * n_rows` floats whose columns in `tiles` no other
/// thread writes meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_tiles(
    kind: QKind,
    cols: usize,
    n_rows: usize,
    data: &[u8],
    acts: &Q8Acts,
    m: usize,
    tiles: std::ops::Range<usize>,
    out: *mut f32,
) {
    for t in tiles {
        let mut i0 = 0;
        while i0 < m {
            let mt = ACT_TILE.min(m - i0);
            // SAFETY: forwarded from the caller.
            unsafe {
                match (kind, mt) {
                    (QKind::Q4_1, 1) => x86::tile_q4_1::<1>(cols, n_rows, data, acts, i0, t, out),
                    (QKind::Q4_1, 2) => x86::tile_q4_1::<2>(cols, n_rows, data, acts, i0, t, out),
                    (QKind::Q4_1, 3) => x86::tile_q4_1::<3>(cols, n_rows, data, acts, i0, t, out),
                    (QKind::Q4_1, _) => x86::tile_q4_1::<4>(cols, n_rows, data, acts, i0, t, out),
                    (QKind::Q8_0, 1) => x86::tile_q8_0::<1>(cols, n_rows, data, acts, i0, t, out),
                    (QKind::Q8_0, 2) => x86::tile_q8_0::<2>(cols, n_rows, data, acts, i0, t, out),
                    (QKind::Q8_0, 3) => x86::tile_q8_0::<3>(cols, n_rows, data, acts, i0, t, out),
                    (QKind::Q8_0, _) => x86::tile_q8_0::<4>(cols, n_rows, data, acts, i0, t, out),
                }
            }
            i0 += mt;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Q8Acts, QK, QKind, TILE, tile_block_bytes};

    /// Broadcasts the 4 activation bytes at `p` to every 32-bit lane.
    #[inline(always)]
    unsafe fn bcast4(p: *const i8) -> __m512i {
        // SAFETY: the caller guarantees 4 readable bytes at p.
        unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
    }

    /// Adds `d_w * d_a * dot + extra * s_a` for each activation row and stores the 16 columns.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn finish<const MT: usize>(
        facc: &[__m512; MT],
        out: *mut f32,
        n_rows: usize,
        i0: usize,
        t: usize,
    ) {
        for (j, v) in facc.iter().enumerate() {
            // SAFETY: the caller bounds out to m * n_rows with i0 + j < m.
            unsafe { _mm512_storeu_ps(out.add((i0 + j) * n_rows + t * TILE), *v) };
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_q4_1<const MT: usize>(
        cols: usize,
        n_rows: usize,
        data: &[u8],
        acts: &Q8Acts,
        i0: usize,
        t: usize,
        out: *mut f32,
    ) {
        let nb = cols / QK;
        let tb = tile_block_bytes(QKind::Q4_1);
        // SAFETY (whole body): tile t has nb blocks of tb bytes in `data`, and
        // activation rows i0..i0+MT of `cols` i8 exist (matmul_q8 asserts).
        unsafe {
            let low = _mm512_set1_epi8(15);
            let mut facc = [_mm512_setzero_ps(); MT];
            for b in 0..nb {
                let base = data.as_ptr().add((t * nb + b) * tb);
                let dv = _mm512_cvtph_ps(_mm256_loadu_si256(base as *const __m256i));
                let mv = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(32) as *const __m256i));
                let mut iacc = [_mm512_setzero_si512(); MT];
                for g in 0..4 {
                    let raw = _mm512_loadu_si512(base.add(64 + g * 64) as *const _);
                    let lo = _mm512_and_si512(raw, low);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
                    for (j, acc) in iacc.iter_mut().enumerate() {
                        let ap = acts.q.as_ptr().add((i0 + j) * cols + b * QK + g * 8);
                        *acc = _mm512_dpbusd_epi32(*acc, lo, bcast4(ap));
                        *acc = _mm512_dpbusd_epi32(*acc, hi, bcast4(ap.add(4)));
                    }
                }
                for (j, acc) in iacc.iter().enumerate() {
                    let at = (i0 + j) * nb + b;
                    let scale = _mm512_mul_ps(dv, _mm512_set1_ps(*acts.d.get_unchecked(at)));
                    facc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*acc), scale, facc[j]);
                    facc[j] =
                        _mm512_fmadd_ps(mv, _mm512_set1_ps(*acts.s.get_unchecked(at)), facc[j]);
                }
            }
            finish::<MT>(&facc, out, n_rows, i0, t);
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_q8_0<const MT: usize>(
        cols: usize,
        n_rows: usize,
        data: &[u8],
        acts: &Q8Acts,
        i0: usize,
        t: usize,
        out: *mut f32,
    ) {
        let nb = cols / QK;
        let tb = tile_block_bytes(QKind::Q8_0);
        // SAFETY: as in tile_q4_1.
        unsafe {
            let minus128 = _mm512_set1_ps(-128.0);
            let mut facc = [_mm512_setzero_ps(); MT];
            for b in 0..nb {
                let base = data.as_ptr().add((t * nb + b) * tb);
                let dv = _mm512_cvtph_ps(_mm256_loadu_si256(base as *const __m256i));
                // Weights were stored +128: subtract 128 * d_w * d_a * sum(q_a) = 128 * d_w * s_a.
                let mv = _mm512_mul_ps(dv, minus128);
                let mut iacc = [_mm512_setzero_si512(); MT];
                for g in 0..8 {
                    let w = _mm512_loadu_si512(base.add(32 + g * 64) as *const _);
                    for (j, acc) in iacc.iter_mut().enumerate() {
                        let ap = acts.q.as_ptr().add((i0 + j) * cols + b * QK + g * 4);
                        *acc = _mm512_dpbusd_epi32(*acc, w, bcast4(ap));
                    }
                }
                for (j, acc) in iacc.iter().enumerate() {
                    let at = (i0 + j) * nb + b;
                    let scale = _mm512_mul_ps(dv, _mm512_set1_ps(*acts.d.get_unchecked(at)));
                    facc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*acc), scale, facc[j]);
                    facc[j] =
                        _mm512_fmadd_ps(mv, _mm512_set1_ps(*acts.s.get_unchecked(at)), facc[j]);
                }
            }
            finish::<MT>(&facc, out, n_rows, i0, t);
        }
    }
}
