//! The AVX-512 VNNI matmul over 16-row K-quant tiles ([`Tiling::Vnni16`])
//! against activations with one step per super-block ([`crate::Q8Acts`]'s
//! `k*` fields). Each 32-bit lane is one weight row: `vpdpbusd` sums a
//! sub-block's (Q6_K: a 16-value half's) products in i32, one `vpmulld`
//! applies the rows' integer scales, and the lanes add up in integers over
//! the whole super-block. Q4_K / Q5_K mins are one `vpdpwssd` per pair of
//! sub-blocks against the activations' per-32 sums; Q6_K's +32 offset is
//! taken out by starting each half's sum at -32 times the activations'
//! per-16 sum. Then one float FMA per super-block (two with mins) applies
//! the rows' `d` (and `dmin`) and the activation step.

use std::arch::x86_64::*;

use crate::format::{QK_K, QKind};
use crate::tiled::{TiledMatmul, Tiling};

/// Rows per tile.
const TILE: usize = 16;

/// How [`tile_k`] reads one K-quant kind's tiles.
pub(super) trait KTile {
    const KIND: QKind;
    /// Quants are Q6_K's, stored +32, with a scale per 16 values and no mins.
    const SIGNED: bool;

    /// Group `g` of the sub-block at `sub`: the quants of k = `8g + t` and
    /// `8g + 4 + t` (t < 4) of all 16 rows, one per byte, unsigned.
    ///
    /// # Safety
    /// `sub` must point at a whole sub-block of a tile; the CPU must have
    /// AVX-512 BW.
    unsafe fn quants(sub: *const u8, g: usize) -> (__m512i, __m512i);
}

pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

/// The low and high nibbles of the 64 bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller guarantees 64 readable bytes at p.
    unsafe {
        let low = _mm512_set1_epi8(15);
        let raw = _mm512_loadu_si512(p as *const _);
        (
            _mm512_and_si512(raw, low),
            _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low),
        )
    }
}

/// `quants | ((byte >> shift) & mask) << 4` for each of the 64 bytes at
/// `p`: 4-bit quants with their high bits (`mask` wide, at `shift`). One
/// 16-bit shift moves the bits to bit 4 (they never cross into the other
/// byte of a lane within the bits kept) and one `vpternlogd` masks and
/// merges them.
#[inline(always)]
pub(super) unsafe fn with_high_bits(
    quants: __m512i,
    p: *const u8,
    shift: usize,
    mask: i8,
) -> __m512i {
    // SAFETY: the caller guarantees 64 readable bytes at p.
    unsafe {
        let raw = _mm512_loadu_si512(p as *const _);
        let moved = if shift <= 4 {
            _mm512_sll_epi16(raw, _mm_cvtsi32_si128((4 - shift) as i32))
        } else {
            _mm512_srl_epi16(raw, _mm_cvtsi32_si128((shift - 4) as i32))
        };
        // 0xF8: A | (B & C), with A = quants, B = moved, C = the mask at bit 4.
        _mm512_ternarylogic_epi32::<0xF8>(quants, moved, _mm512_set1_epi8(mask << 4))
    }
}

impl KTile for Q4K {
    const KIND: QKind = QKind::Q4K;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants(sub: *const u8, g: usize) -> (__m512i, __m512i) {
        // SAFETY: forwarded from the caller.
        unsafe { nibbles(sub.add(4 * TILE * g)) }
    }
}

impl KTile for Q5K {
    const KIND: QKind = QKind::Q5K;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants(sub: *const u8, g: usize) -> (__m512i, __m512i) {
        // SAFETY: forwarded from the caller; the fifth bits follow the nibbles.
        unsafe {
            let (lo, hi) = nibbles(sub.add(4 * TILE * g));
            let top = sub.add(16 * TILE);
            (
                with_high_bits(lo, top, 2 * g, 1),
                with_high_bits(hi, top, 2 * g + 1, 1),
            )
        }
    }
}

impl KTile for Q6K {
    const KIND: QKind = QKind::Q6K;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn quants(sub: *const u8, g: usize) -> (__m512i, __m512i) {
        // SAFETY: forwarded from the caller; the top bits follow the nibbles.
        unsafe {
            let (lo, hi) = nibbles(sub.add(4 * TILE * g));
            let top = sub.add(16 * TILE + 4 * TILE * (g / 2));
            let shift = 4 * (g % 2);
            (
                with_high_bits(lo, top, shift, 3),
                with_high_bits(hi, top, shift + 2, 3),
            )
        }
    }
}

/// Broadcasts the 4 bytes at `p` to every 32-bit lane.
#[inline(always)]
unsafe fn bcast4<T>(p: *const T) -> __m512i {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// `out[i, 16t..16t+16]` for activation rows `i0..i0 + G * MT` of a
/// K-quant tile: each super-block is read once and used for the `G`
/// groups of `MT` rows while it is in L1, so a tile's weights come from
/// memory in one pass (the `MT` rows of a group fill the registers).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VNNI, FMA and F16C; `job.data` must hold
/// tile `t` laid out by [`Tiling::Vnni16`] for `K::KIND`; `job.acts` must
/// hold the `k*` fields of rows `i0..i0 + MT` of `job.cols` values and
/// `job.out` `job.m * job.n_rows` floats, with `i0 + G * MT <= job.m`.
// Indexes spell out which register each step reads and writes.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn tile_k<K: KTile, const MT: usize, const G: usize>(
    job: &TiledMatmul<'_>,
    first: usize,
    t: usize,
) {
    let nsb = job.cols / QK_K;
    let tiling = Tiling::Vnni16;
    let tb = tiling.block_bytes(K::KIND);
    let (header, sub_bytes) = (tiling.k_header(K::KIND), tiling.k_sub_bytes(K::KIND));
    let acts = job.acts;
    // SAFETY (whole body): tile t has nsb super-blocks of tb bytes in
    // `data`; every offset below stays within one (the layout in
    // `crate::tiled`); activation rows first..first + G * MT have cols quants, nsb
    // steps, 16 * nsb per-16 and 8 * nsb per-32 sums (matmul_q8 asserts).
    unsafe {
        let mut faccs = [[_mm512_setzero_ps(); MT]; G];
        for b in 0..nsb {
            let base = job.data.as_ptr().add((t * nsb + b) * tb);
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(base as *const __m256i));
            for (group, facc) in faccs.iter_mut().enumerate() {
                let i0 = first + group * MT;
                let mut iacc = [_mm512_setzero_si512(); MT];
                for sb in 0..8 {
                    let sub = base.add(header + sb * sub_bytes);
                    // Q6_K: two 16-value halves, each with its own scale.
                    for h in 0..if K::SIGNED { 2 } else { 1 } {
                        let sc = if K::SIGNED {
                            let p = base.add(2 * TILE + (2 * sb + h) * TILE);
                            _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))
                        } else {
                            let p = base.add(4 * TILE + sb * TILE);
                            _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
                        };
                        let mut sacc = [_mm512_setzero_si512(); MT];
                        if K::SIGNED {
                            for j in 0..MT {
                                let at = ((i0 + j) * nsb + b) * 16 + 2 * sb + h;
                                let sum = i32::from(*acts.ksum16.get_unchecked(at));
                                sacc[j] = _mm512_set1_epi32(-32 * sum);
                            }
                        }
                        let groups = if K::SIGNED { 2 * h..2 * h + 2 } else { 0..4 };
                        for g in groups {
                            let (lo, hi) = K::quants(sub, g);
                            for j in 0..MT {
                                let ap = acts
                                    .kq
                                    .as_ptr()
                                    .add((i0 + j) * job.cols + b * QK_K + sb * 32 + g * 8);
                                sacc[j] = _mm512_dpbusd_epi32(sacc[j], lo, bcast4(ap));
                                sacc[j] = _mm512_dpbusd_epi32(sacc[j], hi, bcast4(ap.add(4)));
                            }
                        }
                        // |sacc| < 2^17 and |scale| <= 128: no overflow in
                        // i32 over a super-block.
                        for j in 0..MT {
                            iacc[j] = _mm512_add_epi32(iacc[j], _mm512_mullo_epi32(sacc[j], sc));
                        }
                    }
                }
                let mut macc = [_mm512_setzero_si512(); MT];
                if !K::SIGNED {
                    for p in 0..4 {
                        // Lane r: (min[2p], min[2p + 1]) of row r, as i16.
                        let at = base.add(12 * TILE + p * 2 * TILE);
                        let mins = _mm512_cvtepu8_epi16(_mm256_loadu_si256(at as *const __m256i));
                        for j in 0..MT {
                            let sums = acts.ksum32.as_ptr().add(((i0 + j) * nsb + b) * 8 + 2 * p);
                            macc[j] = _mm512_dpwssd_epi32(macc[j], mins, bcast4(sums));
                        }
                    }
                }
                let dmin = if K::SIGNED {
                    _mm512_setzero_ps()
                } else {
                    _mm512_cvtph_ps(_mm256_loadu_si256(base.add(2 * TILE) as *const __m256i))
                };
                for j in 0..MT {
                    let da = _mm512_set1_ps(*acts.kd.get_unchecked((i0 + j) * nsb + b));
                    let s = _mm512_mul_ps(dv, da);
                    facc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[j]), s, facc[j]);
                    if !K::SIGNED {
                        let m = _mm512_mul_ps(dmin, da);
                        facc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(macc[j]), m, facc[j]);
                    }
                }
            }
        }
        for (group, facc) in faccs.iter().enumerate() {
            for (j, v) in facc.iter().enumerate() {
                let row = first + group * MT + j;
                _mm512_storeu_ps(job.out.add(row * job.n_rows + t * TILE), *v);
            }
        }
    }
}
