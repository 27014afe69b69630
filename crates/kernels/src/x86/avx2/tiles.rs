//! The AVX2 matmul over 8-row tiles ([`Tiling::Avx2x8`]): each 32-bit lane
//! is one weight row, `maddubs` + `madd` stand in for VNNI's `vpdpbusd`.
//! K-quant sub-block scales multiply in integers (the `madd` against the
//! rows' scales) and add up over a super-block, then one FMA per
//! super-block applies the row and activation steps.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::high_bits;
use crate::format::{QK, QK_K, QKind};
use crate::tiled::{TiledMatmul, Tiling};

/// Rows per tile.
const TILE: usize = 8;
/// Most activation rows per pass over a weight tile.
const ACT_TILE: usize = 4;

/// `out[i, 8t..8t+8]` for every activation row `i < m` and tile `t` in `tiles`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `job` must describe a matrix
/// tiled with [`Tiling::Avx2x8`] and bound `acts` and `out`; no other thread
/// may write the columns of `tiles` meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul_tiles(job: &TiledMatmul<'_>, tiles: Range<usize>) {
    for t in tiles {
        let mut i0 = 0;
        while i0 < job.m {
            let mt = ACT_TILE.min(job.m - i0);
            // SAFETY: forwarded from the caller.
            unsafe {
                match (job.kind, mt) {
                    (QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs, _) => {
                        unreachable!("lookup types are never tiled")
                    }
                    (QKind::Q4_1, 1) => tile_q4_1::<1, false>(job, i0, t),
                    (QKind::Q4_1, 2) => tile_q4_1::<2, false>(job, i0, t),
                    (QKind::Q4_1, 3) => tile_q4_1::<3, false>(job, i0, t),
                    (QKind::Q4_1, _) => tile_q4_1::<4, false>(job, i0, t),
                    (QKind::Q5_1, 1) => tile_q4_1::<1, true>(job, i0, t),
                    (QKind::Q5_1, 2) => tile_q4_1::<2, true>(job, i0, t),
                    (QKind::Q5_1, 3) => tile_q4_1::<3, true>(job, i0, t),
                    (QKind::Q5_1, _) => tile_q4_1::<4, true>(job, i0, t),
                    (QKind::Q8_0, 1) => tile_q8_0::<1>(job, i0, t),
                    (QKind::Q8_0, 2) => tile_q8_0::<2>(job, i0, t),
                    (QKind::Q8_0, 3) => tile_q8_0::<3>(job, i0, t),
                    (QKind::Q8_0, _) => tile_q8_0::<4>(job, i0, t),
                    (QKind::Q4K, 1) => tile_k::<Q4K, 1>(job, i0, t),
                    (QKind::Q4K, 2) => tile_k::<Q4K, 2>(job, i0, t),
                    (QKind::Q4K, 3) => tile_k::<Q4K, 3>(job, i0, t),
                    (QKind::Q4K, _) => tile_k::<Q4K, 4>(job, i0, t),
                    (QKind::Q5K, 1) => tile_k::<Q5K, 1>(job, i0, t),
                    (QKind::Q5K, 2) => tile_k::<Q5K, 2>(job, i0, t),
                    (QKind::Q5K, 3) => tile_k::<Q5K, 3>(job, i0, t),
                    (QKind::Q5K, _) => tile_k::<Q5K, 4>(job, i0, t),
                    (QKind::Q6K, 1) => tile_k::<Q6K, 1>(job, i0, t),
                    (QKind::Q6K, 2) => tile_k::<Q6K, 2>(job, i0, t),
                    (QKind::Q6K, 3) => tile_k::<Q6K, 3>(job, i0, t),
                    (QKind::Q6K, _) => tile_k::<Q6K, 4>(job, i0, t),
                }
            }
            i0 += mt;
        }
    }
}

/// Broadcasts the 4 activation bytes at `p` to every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// Adds `d_w * d_a * dot + extra * s_a` for each activation row of block
/// `b` into `facc`; `extra` is the per-row constant of the weights (Q4_1's
/// min), or `None`.
#[inline(always)]
unsafe fn scale_block<const MT: usize>(
    job: &TiledMatmul<'_>,
    i0: usize,
    b: usize,
    dv: __m256,
    extra: Option<__m256>,
    iacc: &[__m256i; MT],
    facc: &mut [__m256; MT],
) {
    let nb = job.cols / QK;
    for j in 0..MT {
        let at = (i0 + j) * nb + b;
        // SAFETY: the caller bounds acts to rows i0..i0 + MT.
        unsafe {
            let scale = _mm256_mul_ps(dv, _mm256_set1_ps(*job.acts.d.get_unchecked(at)));
            facc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[j]), scale, facc[j]);
            if let Some(extra) = extra {
                let s = _mm256_set1_ps(*job.acts.s.get_unchecked(at));
                facc[j] = _mm256_fmadd_ps(extra, s, facc[j]);
            }
        }
    }
}

/// Stores the 8 columns of tile `t` for each activation row.
#[inline(always)]
unsafe fn store<const MT: usize>(job: &TiledMatmul<'_>, facc: &[__m256; MT], i0: usize, t: usize) {
    for (j, v) in facc.iter().enumerate() {
        // SAFETY: the caller bounds out to m * n_rows with i0 + j < m.
        unsafe { _mm256_storeu_ps(job.out.add((i0 + j) * job.n_rows + t * TILE), *v) };
    }
}

/// Q4_1 (`FIFTH` false) and Q5_1 (`FIFTH` true: each block's last 32 bytes
/// hold the fifth bits): value = d * q + m.
#[inline(always)]
unsafe fn tile_q4_1<const MT: usize, const FIFTH: bool>(
    job: &TiledMatmul<'_>,
    i0: usize,
    t: usize,
) {
    let nb = job.cols / QK;
    let kind = if FIFTH { QKind::Q5_1 } else { QKind::Q4_1 };
    let tb = Tiling::Avx2x8.block_bytes(kind);
    // SAFETY (whole body): tile t has nb blocks of tb bytes in `data`, and
    // activation rows i0..i0+MT of `cols` i8 exist (matmul_q8 asserts).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut facc = [_mm256_setzero_ps(); MT];
        for b in 0..nb {
            let base = job.data.as_ptr().add((t * nb + b) * tb);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let mv = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16) as *const __m128i));
            // 4-bit quants: pairs of products sum in i16 over the whole block
            // (8 * 2 * 15 * 128 < 2^15) before one madd. 5-bit ones reach
            // 2 * 31 * 128 per maddubs, so each group goes to i32 at once.
            let mut acc16 = [_mm256_setzero_si256(); MT];
            let mut iacc = [_mm256_setzero_si256(); MT];
            for g in 0..4 {
                let (mut lo, mut hi) = nibbles(base.add(32 + g * 32));
                if FIFTH {
                    lo = _mm256_or_si256(lo, high_bits(base.add(160), 2 * g, 1));
                    hi = _mm256_or_si256(hi, high_bits(base.add(160), 2 * g + 1, 1));
                }
                for j in 0..MT {
                    let ap = job
                        .acts
                        .q
                        .as_ptr()
                        .add((i0 + j) * job.cols + b * QK + g * 8);
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, bcast4(ap)),
                        _mm256_maddubs_epi16(hi, bcast4(ap.add(4))),
                    );
                    if FIFTH {
                        iacc[j] = _mm256_add_epi32(iacc[j], _mm256_madd_epi16(p, ones));
                    } else {
                        acc16[j] = _mm256_add_epi16(acc16[j], p);
                    }
                }
            }
            if !FIFTH {
                for j in 0..MT {
                    iacc[j] = _mm256_madd_epi16(acc16[j], ones);
                }
            }
            scale_block::<MT>(job, i0, b, dv, Some(mv), &iacc, &mut facc);
        }
        store::<MT>(job, &facc, i0, t);
    }
}

#[inline(always)]
unsafe fn tile_q8_0<const MT: usize>(job: &TiledMatmul<'_>, i0: usize, t: usize) {
    let nb = job.cols / QK;
    let tb = Tiling::Avx2x8.block_bytes(QKind::Q8_0);
    // SAFETY: as in tile_q4_1.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut facc = [_mm256_setzero_ps(); MT];
        for b in 0..nb {
            let base = job.data.as_ptr().add((t * nb + b) * tb);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let mut iacc = [_mm256_setzero_si256(); MT];
            for g in 0..8 {
                let w = _mm256_loadu_si256(base.add(16 + g * 32) as *const __m256i);
                // Signed x signed: |w| as unsigned bytes, w's sign moved onto a.
                // A pair of products is at most 2 * 128 * 127 < 2^15.
                let wabs = _mm256_sign_epi8(w, w);
                for (j, acc) in iacc.iter_mut().enumerate() {
                    let ap = job
                        .acts
                        .q
                        .as_ptr()
                        .add((i0 + j) * job.cols + b * QK + g * 4);
                    let p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bcast4(ap), w));
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, ones));
                }
            }
            scale_block::<MT>(job, i0, b, dv, None, &iacc, &mut facc);
        }
        store::<MT>(job, &facc, i0, t);
    }
}

/// How [`tile_k`] reads one K-quant kind's tiles.
trait KTile {
    const KIND: QKind;
    /// Quants are Q6_K's, stored +32: subtracted back and multiplied with
    /// the sign trick; scales per 16 values, no mins.
    const SIGNED: bool;

    /// Group `g` of the sub-block at `sub`: the quants of k = `8g + t` and
    /// `8g + 4 + t` (t < 4) of all 8 rows, one per byte, unsigned.
    ///
    /// # Safety
    /// `sub` must point at a whole sub-block of a tile; the CPU must have AVX2.
    unsafe fn quants(sub: *const u8, g: usize) -> (__m256i, __m256i);
}

struct Q4K;
struct Q5K;
struct Q6K;

/// The low and high nibbles of the 32 bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 32 readable bytes at p.
    unsafe {
        let low = _mm256_set1_epi8(15);
        let raw = _mm256_loadu_si256(p as *const __m256i);
        (
            _mm256_and_si256(raw, low),
            _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low),
        )
    }
}

impl KTile for Q4K {
    const KIND: QKind = QKind::Q4K;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants(sub: *const u8, g: usize) -> (__m256i, __m256i) {
        // SAFETY: forwarded from the caller.
        unsafe { nibbles(sub.add(32 * g)) }
    }
}

impl KTile for Q5K {
    const KIND: QKind = QKind::Q5K;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants(sub: *const u8, g: usize) -> (__m256i, __m256i) {
        // SAFETY: forwarded from the caller; the fifth bits follow the nibbles.
        unsafe {
            let (lo, hi) = nibbles(sub.add(32 * g));
            (
                _mm256_or_si256(lo, high_bits(sub.add(128), 2 * g, 1)),
                _mm256_or_si256(hi, high_bits(sub.add(128), 2 * g + 1, 1)),
            )
        }
    }
}

impl KTile for Q6K {
    const KIND: QKind = QKind::Q6K;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn quants(sub: *const u8, g: usize) -> (__m256i, __m256i) {
        // SAFETY: forwarded from the caller; the top bits follow the nibbles.
        unsafe {
            let (lo, hi) = nibbles(sub.add(32 * g));
            let top = sub.add(128 + 32 * (g / 2));
            let shift = 4 * (g % 2);
            (
                _mm256_or_si256(lo, high_bits(top, shift, 3)),
                _mm256_or_si256(hi, high_bits(top, shift + 2, 3)),
            )
        }
    }
}

/// The 8 byte scales at `p` (one per row), each in both i16 halves of its
/// row's 32-bit lane, for `madd`.
#[inline(always)]
unsafe fn row_scales<const SIGNED: bool>(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 8 readable bytes at p.
    unsafe {
        let bytes = _mm_loadl_epi64(p as *const __m128i);
        let wide = if SIGNED {
            _mm_cvtepi8_epi16(bytes)
        } else {
            _mm_cvtepu8_epi16(bytes)
        };
        let lanes = _mm256_cvtepu16_epi32(wide);
        _mm256_or_si256(lanes, _mm256_slli_epi32::<16>(lanes))
    }
}

/// K-quant tiles against activations with one step per super-block
/// ([`crate::Q8Acts`]'s `k*` fields): the scaled sub-block sums add up in
/// i32 over the whole super-block, mins are one `madd` per pair of
/// sub-blocks against the activations' per-32 sums, then one FMA (two with
/// mins) per super-block applies `d` (and `dmin`) and the activation step.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `job.data` must hold tile `t`
/// laid out by [`Tiling::Avx2x8`] for `K::KIND`; `job.acts` must hold the
/// `k*` fields of rows `i0..i0 + MT` and `job.out` `job.m * job.n_rows`
/// floats, with `i0 + MT <= job.m`.
#[inline(always)]
// Indexes spell out which register each step reads and writes.
#[allow(clippy::needless_range_loop)]
unsafe fn tile_k<K: KTile, const MT: usize>(job: &TiledMatmul<'_>, i0: usize, t: usize) {
    let nsb = job.cols / QK_K;
    let tiling = Tiling::Avx2x8;
    let tb = tiling.block_bytes(K::KIND);
    let (header, sub_bytes) = (tiling.k_header(K::KIND), tiling.k_sub_bytes(K::KIND));
    let acts = job.acts;
    // SAFETY (whole body): tile t has nsb super-blocks of tb bytes in
    // `data`, every offset below stays within one (the layout in
    // `crate::tiled`); activation rows i0..i0 + MT have cols quants, nsb
    // steps and 8 * nsb per-32 sums (matmul_q8 asserts).
    unsafe {
        let offset = _mm256_set1_epi8(32);
        let mut facc = [_mm256_setzero_ps(); MT];
        for b in 0..nsb {
            let base = job.data.as_ptr().add((t * nsb + b) * tb);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            // Per group a pair of products is at most 2 * 31 * 127 (2 * 32 *
            // 128 signed): two fit i16 before the madd; scaled, a super-block's
            // sums stay below 2^28 in i32.
            let mut iacc = [_mm256_setzero_si256(); MT];
            for sb in 0..8 {
                let sub = base.add(header + sb * sub_bytes);
                let (scale_lo, scale_hi) = if K::SIGNED {
                    (
                        row_scales::<true>(base.add(2 * TILE + 2 * TILE * sb)),
                        row_scales::<true>(base.add(3 * TILE + 2 * TILE * sb)),
                    )
                } else {
                    let scale = row_scales::<false>(base.add(4 * TILE + TILE * sb));
                    (scale, scale)
                };
                for g in 0..4 {
                    let (mut lo, mut hi) = K::quants(sub, g);
                    let scale = if g < 2 { scale_lo } else { scale_hi };
                    let (mut lo_abs, mut hi_abs) = (lo, hi);
                    if K::SIGNED {
                        lo = _mm256_sub_epi8(lo, offset);
                        hi = _mm256_sub_epi8(hi, offset);
                        lo_abs = _mm256_sign_epi8(lo, lo);
                        hi_abs = _mm256_sign_epi8(hi, hi);
                    }
                    for (j, acc) in iacc.iter_mut().enumerate() {
                        let ap = acts
                            .kq
                            .as_ptr()
                            .add((i0 + j) * job.cols + b * QK_K + sb * QK + g * 8);
                        let (mut a0, mut a1) = (bcast4(ap), bcast4(ap.add(4)));
                        if K::SIGNED {
                            a0 = _mm256_sign_epi8(a0, lo);
                            a1 = _mm256_sign_epi8(a1, hi);
                        }
                        let p = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo_abs, a0),
                            _mm256_maddubs_epi16(hi_abs, a1),
                        );
                        *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, scale));
                    }
                }
            }
            let mut macc = [_mm256_setzero_si256(); MT];
            if !K::SIGNED {
                for p in 0..4 {
                    // Lane r: (min[2p], min[2p + 1]) of row r, as i16.
                    let at = base.add(12 * TILE + p * 2 * TILE);
                    let mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(at as *const __m128i));
                    for j in 0..MT {
                        let sums = acts.ksum32.as_ptr().add(((i0 + j) * nsb + b) * 8 + 2 * p);
                        let prod = _mm256_madd_epi16(mins, bcast4(sums as *const i8));
                        macc[j] = _mm256_add_epi32(macc[j], prod);
                    }
                }
            }
            let dmin = if K::SIGNED {
                _mm256_setzero_ps()
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(base.add(2 * TILE) as *const __m128i))
            };
            for j in 0..MT {
                let da = _mm256_set1_ps(*acts.kd.get_unchecked((i0 + j) * nsb + b));
                let s = _mm256_mul_ps(dv, da);
                facc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[j]), s, facc[j]);
                if !K::SIGNED {
                    let m = _mm256_mul_ps(dmin, da);
                    facc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(macc[j]), m, facc[j]);
                }
            }
        }
        store::<MT>(job, &facc, i0, t);
    }
}
