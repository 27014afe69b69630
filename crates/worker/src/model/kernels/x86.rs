//! AVX2 and AVX-512 VNNI builds of the row-major int8 kernels, the
//! activation quantizer and the attention row.

use std::arch::x86_64::*;

use super::flash::{BK, Micro, UnitBuf, UnitJob, unit_impl};
use super::{HeadShape, KvElem, Q8Acts, QK, QKind, TileOut, attend_row_impl};

/// `sum_j w[j] * a[j]` in eight i32 lanes, `w` unsigned bytes, `a` signed.
trait Dot {
    unsafe fn dot(w: __m256i, a: __m256i) -> __m256i;
}

struct Avx2Dot;
impl Dot for Avx2Dot {
    #[inline(always)]
    unsafe fn dot(w: __m256i, a: __m256i) -> __m256i {
        // Products fit i16: at most 2 * 128 * 127.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)) }
    }
}

struct VnniDot;
impl Dot for VnniDot {
    #[inline(always)]
    unsafe fn dot(w: __m256i, a: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a) }
    }
}

#[inline(always)]
unsafe fn f16_to_f32(p: *const u8) -> f32 {
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
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
unsafe fn tile_any<D: Dot>(
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

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_avx2(
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
    unsafe { tile_any::<Avx2Dot>(kind, w, rb, rt, acts, i0, mt, vals) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_vnni(
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
    unsafe { tile_any::<VnniDot>(kind, w, rb, rt, acts, i0, mt, vals) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize_row_avx2(kind: QKind, row: &[u8], out: &mut [f32]) {
    let bb = kind.block_bytes();
    assert!(out.len() >= row.len() / bb * QK);
    let low = _mm_set1_epi8(15);
    for (b, o) in out.chunks_exact_mut(QK).enumerate().take(row.len() / bb) {
        // SAFETY: block b lies within `row`; `o` holds 32 floats.
        let blk = unsafe { row.as_ptr().add(b * bb) };
        let d = _mm256_set1_ps(unsafe { f16_to_f32(blk) });
        let op = o.as_mut_ptr();
        match kind {
            QKind::Q4_1 => {
                let mn = _mm256_set1_ps(unsafe { f16_to_f32(blk.add(2)) });
                let qs = unsafe { _mm_loadu_si128(blk.add(4) as *const __m128i) };
                let halves = [
                    _mm_and_si128(qs, low),
                    _mm_and_si128(_mm_srli_epi16(qs, 4), low),
                ];
                for (h, bytes) in halves.into_iter().enumerate() {
                    let a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    let c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
                    unsafe {
                        _mm256_storeu_ps(op.add(16 * h), _mm256_fmadd_ps(a, d, mn));
                        _mm256_storeu_ps(op.add(16 * h + 8), _mm256_fmadd_ps(c, d, mn));
                    }
                }
            }
            QKind::Q8_0 => {
                for part in 0..4 {
                    let bytes = unsafe { _mm_loadl_epi64(blk.add(2 + 8 * part) as *const __m128i) };
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                    unsafe { _mm256_storeu_ps(op.add(8 * part), _mm256_mul_ps(v, d)) };
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    super::quantize_blocks(x, q, d, s);
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(super) unsafe fn attend_row_avx512<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    keys: &[u32],
    shape: HeadShape,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_row_impl(q, k_pool, v_pool, keys, shape, scores, out);
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    super::silu_mul_impl(gate, up);
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn attend_row_avx2<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    keys: &[u32],
    shape: HeadShape,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_row_impl(q, k_pool, v_pool, keys, shape, scores, out);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn flash_unit_avx2_tf(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    // Three query vectors per pass: one row of a 3-way GQA group, and 12
    // of the 16 ymm registers as accumulators.
    // SAFETY: this function's target features are the ones Avx2Micro uses.
    unsafe { unit_impl::<Avx2Micro, 3>(job, buf) }
}

/// [`unit_impl`] for AVX2; only handed out after the CPU check in `flash_unit`.
pub(super) fn flash_unit_avx2(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    assert_ne!(super::level(), super::Level::Scalar);
    // SAFETY: every level above scalar has AVX2 and FMA (checked above).
    unsafe { flash_unit_avx2_tf(job, buf) }
}

/// The blocked attention's inner loops in AVX2 + FMA.
struct Avx2Micro;

impl Micro for Avx2Micro {
    /// 32 keys (4 vectors) per pass, `R` query vectors broadcast one column at a time.
    #[inline(always)]
    // Indexes spell out which register each FMA reads and writes.
    #[allow(clippy::needless_range_loop)]
    unsafe fn qk<const R: usize>(q: &[f32], d: usize, kt: &[f32], s: &mut [[f32; BK]; R]) {
        const KV: usize = 4;
        assert!(q.len() >= R * d && kt.len() >= d * BK && BK.is_multiple_of(8 * KV));
        // SAFETY: loads stay within kt[..d * BK] and q[..R * d] (asserted),
        // stores within s; the caller vouches for AVX2 and FMA.
        unsafe {
            let (qp, kp) = (q.as_ptr(), kt.as_ptr());
            for k0 in (0..BK).step_by(8 * KV) {
                let mut acc = [[_mm256_setzero_ps(); KV]; R];
                for c in 0..d {
                    // R broadcasts, then one key vector at a time: R + 1 + R * KV registers.
                    let row = kp.add(c * BK + k0);
                    let qv: [__m256; R] =
                        std::array::from_fn(|r| _mm256_broadcast_ss(&*qp.add(r * d + c)));
                    for x in 0..KV {
                        let kv = _mm256_loadu_ps(row.add(8 * x));
                        for r in 0..R {
                            acc[r][x] = _mm256_fmadd_ps(qv[r], kv, acc[r][x]);
                        }
                    }
                }
                for (sr, acc_r) in s.iter_mut().zip(&acc) {
                    for (x, a) in acc_r.iter().enumerate() {
                        _mm256_storeu_ps(sr.as_mut_ptr().add(k0 + 8 * x), *a);
                    }
                }
            }
        }
    }

    /// 32 output columns (4 vectors) per pass when `d` allows, else 8.
    #[inline(always)]
    unsafe fn pv<const R: usize>(
        p: &[[f32; BK]; R],
        v: &[f32],
        d: usize,
        n: usize,
        acc: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if d.is_multiple_of(32) {
                pv_cols::<R, 4>(p, v, d, n, acc);
            } else {
                pv_cols::<R, 1>(p, v, d, n, acc);
            }
        }
    }
}

/// [`Avx2Micro::pv`] on `8 * CV` output columns at a time.
#[inline(always)]
// Indexes spell out which register each FMA reads and writes.
#[allow(clippy::needless_range_loop)]
unsafe fn pv_cols<const R: usize, const CV: usize>(
    p: &[[f32; BK]; R],
    v: &[f32],
    d: usize,
    n: usize,
    acc: &mut [f32],
) {
    assert!(n <= BK && v.len() >= n * d && acc.len() >= R * d && d.is_multiple_of(8 * CV));
    // SAFETY: loads stay within v[..n * d], loads and stores within
    // acc[..R * d] (asserted); the caller vouches for AVX2 and FMA.
    unsafe {
        let (vp, ap) = (v.as_ptr(), acc.as_mut_ptr());
        for c0 in (0..d).step_by(8 * CV) {
            let mut a: [[__m256; CV]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|x| _mm256_loadu_ps(ap.add(r * d + c0 + 8 * x)))
            });
            for j in 0..n {
                // R broadcasts, then one value vector at a time: R + 1 + R * CV registers.
                let row = vp.add(j * d + c0);
                let pj: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(p[r][j]));
                for x in 0..CV {
                    let vv = _mm256_loadu_ps(row.add(8 * x));
                    for r in 0..R {
                        a[r][x] = _mm256_fmadd_ps(pj[r], vv, a[r][x]);
                    }
                }
            }
            for (r, ar) in a.iter().enumerate() {
                for (x, o) in ar.iter().enumerate() {
                    _mm256_storeu_ps(ap.add(r * d + c0 + 8 * x), *o);
                }
            }
        }
    }
}
