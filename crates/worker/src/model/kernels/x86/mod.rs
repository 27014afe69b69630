//! x86 builds of the kernels, by instruction set; [`super::dispatch`]
//! calls them only on CPUs that have it. Shared here: the row-major int8
//! tile, generic over the instruction that multiplies bytes ([`Dot`]).

use std::arch::x86_64::*;

use super::matrix::{Q8Acts, QK, QKind, TileOut};

pub(super) mod avx2;
pub(super) mod avx512;

/// `sum_j w[j] * a[j]` in eight i32 lanes, `w` unsigned bytes, `a` signed.
pub(super) trait Dot {
    unsafe fn dot(w: __m256i, a: __m256i) -> __m256i;
}

#[inline(always)]
pub(super) unsafe fn f16_to_f32(p: *const u8) -> f32 {
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }
}

/// Dot products of RT weight rows (`rb` bytes apart in `w`) with MT
/// activation rows starting at `i0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<D: Dot, const RT: usize, const MT: usize>(
    kind: QKind,
    w: &[u8],
    rb: usize,
    acts: &Q8Acts,
    i0: usize,
    vals: &mut TileOut,
) {
    // SAFETY: `w` holds RT rows of nb blocks of `bb` bytes and activation
    // rows i0..i0+MT exist in `acts` (matmul_q8 asserts both).
    unsafe {
        let nb = acts.blocks;
        let bb = kind.block_bytes();
        let mut acc = [[_mm256_setzero_ps(); MT]; RT];
        let mut mins = [[0f32; MT]; RT];
        let low = _mm_set1_epi8(15);
        let wp = w.as_ptr();
        let mut a = [_mm256_setzero_si256(); MT];
        let mut da = [0f32; MT];
        let mut sa = [0f32; MT];
        for b in 0..nb {
            for j in 0..MT {
                let at = (i0 + j) * nb + b;
                a[j] = _mm256_loadu_si256(acts.q.as_ptr().add(at * QK) as *const __m256i);
                da[j] = *acts.d.get_unchecked(at);
                sa[j] = *acts.s.get_unchecked(at);
            }
            for r in 0..RT {
                let blk = wp.add(r * rb + b * bb);
                let d = f16_to_f32(blk);
                match kind {
                    QKind::Q4_1 => {
                        let qs = _mm_loadu_si128(blk.add(4) as *const __m128i);
                        let lo = _mm_and_si128(qs, low);
                        let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low);
                        let wv = _mm256_set_m128i(hi, lo);
                        let mn = f16_to_f32(blk.add(2));
                        for j in 0..MT {
                            let p = _mm256_cvtepi32_ps(D::dot(wv, a[j]));
                            acc[r][j] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * da[j]), acc[r][j]);
                            mins[r][j] += mn * sa[j];
                        }
                    }
                    QKind::Q8_0 => {
                        let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                        let wabs = _mm256_sign_epi8(wv, wv);
                        for j in 0..MT {
                            // Signed x signed: move the sign of w onto a.
                            let p = _mm256_cvtepi32_ps(D::dot(wabs, _mm256_sign_epi8(a[j], wv)));
                            acc[r][j] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * da[j]), acc[r][j]);
                        }
                    }
                }
            }
        }
        for r in 0..RT {
            for j in 0..MT {
                vals[r][j] = hsum(acc[r][j]) + mins[r][j];
            }
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_any<D: Dot>(
    kind: QKind,
    w: &[u8],
    rb: usize,
    rt: usize,
    acts: &Q8Acts,
    i0: usize,
    mt: usize,
    vals: &mut TileOut,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match (rt, mt) {
            (4, 1) => tile::<D, 4, 1>(kind, w, rb, acts, i0, vals),
            (4, _) => tile::<D, 4, 2>(kind, w, rb, acts, i0, vals),
            (2, 1) => tile::<D, 2, 1>(kind, w, rb, acts, i0, vals),
            (2, 2) => tile::<D, 2, 2>(kind, w, rb, acts, i0, vals),
            (2, 3) => tile::<D, 2, 3>(kind, w, rb, acts, i0, vals),
            (2, _) => tile::<D, 2, 4>(kind, w, rb, acts, i0, vals),
            (_, 1) => tile::<D, 1, 1>(kind, w, rb, acts, i0, vals),
            (_, 2) => tile::<D, 1, 2>(kind, w, rb, acts, i0, vals),
            (_, 3) => tile::<D, 1, 3>(kind, w, rb, acts, i0, vals),
            _ => tile::<D, 1, 4>(kind, w, rb, acts, i0, vals),
        }
    }
}
