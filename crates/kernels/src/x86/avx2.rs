//! AVX2 + FMA + F16C builds: the row-major int8 tile, dequantization, the
//! activation quantizer, SiLU, the attention row and the blocked attention's
//! inner loops.

use std::arch::x86_64::*;

mod tiles;
pub(crate) use tiles::matmul_tiles;

use super::{Dot, KBlock, Q4KBlock, Q5KBlock, Q6KBlock, f16_to_f32, tile_any};
use crate::attention::{KvElem, RowJob};
use crate::blocked::{BK, F32Block, Micro, UnitBuf, UnitJob, unit_impl};
use crate::format::{QK, QK_K, QKind, RowTile, TileOut};
use crate::scalar;

struct Avx2Dot;
impl Dot for Avx2Dot {
    #[inline(always)]
    unsafe fn dot(w: __m256i, a: __m256i) -> __m256i {
        // Products fit i16: at most 2 * 128 * 127.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile(job: &RowTile<'_>, vals: &mut TileOut) {
    // SAFETY: forwarded from the caller.
    unsafe { tile_any::<Avx2Dot>(job, vals) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequantize_row(kind: QKind, row: &[u8], out: &mut [f32]) {
    // SAFETY (K-quants): this function's target features cover theirs.
    match kind {
        QKind::Q4K => return unsafe { dequantize_row_k::<Q4KBlock>(row, out) },
        QKind::Q5K => return unsafe { dequantize_row_k::<Q5KBlock>(row, out) },
        QKind::Q6K => return unsafe { dequantize_row_k::<Q6KBlock>(row, out) },
        // Only rows that do not fill 8-row tiles are kept as Q5_1 blocks.
        QKind::Q5_1 => return scalar::dequantize_row(kind, row, out),
        // The lookup types have only the portable build so far.
        QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => {
            return scalar::dequantize_row(kind, row, out);
        }
        QKind::Q4_1 | QKind::Q8_0 => {}
    }
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
            QKind::Q5_1
            | QKind::Q4K
            | QKind::Q5K
            | QKind::Q6K
            | QKind::Mxfp4
            | QKind::Iq4Nl
            | QKind::Iq4Xs => {
                unreachable!("returned above")
            }
        }
    }
}

/// [`dequantize_row`] for K-quants, in the order of operations ggml uses
/// (`scale * q - min`, not fused), so it matches the scalar build exactly.
#[inline(always)]
unsafe fn dequantize_row_k<K: KBlock>(row: &[u8], out: &mut [f32]) {
    let bb = K::KIND.block_bytes();
    assert!(out.len() >= row.len() / bb * QK_K);
    for (blk, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
        // SAFETY: `blk` is a whole block.
        let (scale, min) = unsafe { K::scales(blk.as_ptr()) };
        for j in 0..8 {
            // SAFETY: `blk` is a whole block; `o` holds 256 floats.
            unsafe {
                let q = K::quants(blk.as_ptr(), j);
                let mn = _mm256_set1_ps(min[j]);
                for part in 0..4 {
                    let bytes = if part < 2 {
                        _mm256_castsi256_si128(q)
                    } else {
                        _mm256_extracti128_si256::<1>(q)
                    };
                    let bytes = if part % 2 == 0 {
                        bytes
                    } else {
                        _mm_srli_si128::<8>(bytes)
                    };
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                    let s = if K::SIGNED {
                        scale[2 * j + part / 2]
                    } else {
                        scale[j]
                    };
                    let s = _mm256_set1_ps(s);
                    let y = _mm256_sub_ps(_mm256_mul_ps(s, v), mn);
                    _mm256_storeu_ps(o.as_mut_ptr().add(32 * j + 8 * part), y);
                }
            }
        }
    }
}

/// [`scalar::quantize`] with explicit vectors (the compiler's version of the
/// scalar loop took 7% of a prefill): the same values, multiply then round
/// half to even.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let blocks = (x.len() / QK).min(q.len() / QK).min(d.len()).min(s.len());
    // SAFETY: block b reads x[32b..32b + 32] and writes q[32b..32b + 32],
    // d[b] and s[b], all within the lengths bounded above.
    unsafe {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        // packs interleaves 128-bit lanes: this puts the 32 bytes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..blocks {
            let xp = x.as_ptr().add(b * QK);
            let mut v = [_mm256_setzero_ps(); 4];
            for (i, vi) in v.iter_mut().enumerate() {
                *vi = _mm256_loadu_ps(xp.add(8 * i));
            }
            let mut amax = _mm256_and_ps(v[0], abs_mask);
            for vi in &v[1..] {
                amax = _mm256_max_ps(amax, _mm256_and_ps(*vi, abs_mask));
            }
            let m4 = _mm_max_ps(
                _mm256_castps256_ps128(amax),
                _mm256_extractf128_ps::<1>(amax),
            );
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
            let scale = _mm_cvtss_f32(m1) / 127.0;
            let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
            let mut r = [_mm256_setzero_si256(); 4];
            for i in 0..4 {
                r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
            }
            let sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(r[0], r[1]),
                _mm256_packs_epi32(r[2], r[3]),
            );
            let packed = _mm256_permutevar8x32_epi32(packed, order);
            _mm256_storeu_si256(q.as_mut_ptr().add(b * QK) as *mut __m256i, packed);
            *d.get_unchecked_mut(b) = scale;
            *s.get_unchecked_mut(b) = scale * _mm_cvtsi128_si32(s1) as f32;
        }
    }
}

/// The sum of the eight i32 lanes of `v`.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register-only intrinsics; the caller vouches for AVX2.
    unsafe {
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)))
    }
}

/// [`scalar::quantize_k`] with explicit vectors (the compiler's version of
/// the scalar loop took 4x the time of [`quantize`]): the same values.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_k(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum16: &mut [i16],
    sum32: &mut [i16],
) {
    let supers = (x.len() / QK_K)
        .min(q.len() / QK_K)
        .min(d.len())
        .min(sum16.len() / 16)
        .min(sum32.len() / 8);
    // SAFETY: super-block b reads x[256b..256b + 256] and writes
    // q[256b..256b + 256], d[b], sum16[16b..16b + 16] and sum32[8b..8b + 8],
    // all within the lengths bounded above.
    unsafe {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        // packs interleaves 128-bit lanes: this puts the 32 bytes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..supers {
            let xp = x.as_ptr().add(b * QK_K);
            let mut amax = _mm256_setzero_ps();
            for i in 0..QK_K / 8 {
                amax = _mm256_max_ps(
                    amax,
                    _mm256_and_ps(_mm256_loadu_ps(xp.add(8 * i)), abs_mask),
                );
            }
            let m4 = _mm_max_ps(
                _mm256_castps256_ps128(amax),
                _mm256_extractf128_ps::<1>(amax),
            );
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
            let scale = _mm_cvtss_f32(m1) / 127.0;
            let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
            for j in 0..QK_K / QK {
                let mut r = [_mm256_setzero_si256(); 4];
                for (i, ri) in r.iter_mut().enumerate() {
                    let v = _mm256_loadu_ps(xp.add(QK * j + 8 * i));
                    *ri = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
                }
                let lo = hsum_i32(_mm256_add_epi32(r[0], r[1]));
                let hi = hsum_i32(_mm256_add_epi32(r[2], r[3]));
                // |sums| <= 32 * 127.
                *sum16.get_unchecked_mut(16 * b + 2 * j) = lo as i16;
                *sum16.get_unchecked_mut(16 * b + 2 * j + 1) = hi as i16;
                *sum32.get_unchecked_mut(8 * b + j) = (lo + hi) as i16;
                let packed = _mm256_packs_epi16(
                    _mm256_packs_epi32(r[0], r[1]),
                    _mm256_packs_epi32(r[2], r[3]),
                );
                let packed = _mm256_permutevar8x32_epi32(packed, order);
                let qp = q.as_mut_ptr().add(b * QK_K + QK * j);
                _mm256_storeu_si256(qp as *mut __m256i, packed);
            }
            *d.get_unchecked_mut(b) = scale;
        }
    }
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    scalar::silu_mul(gate, up);
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    scalar::gelu_mul(gate, up);
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn swiglu_oai_mul(gate: &mut [f32], up: &[f32]) {
    scalar::swiglu_oai_mul(gate, up);
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn attend_row<T: KvElem>(
    job: &RowJob<'_, T>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scalar::attend_row(job, scores, out);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn flash_unit_avx2_tf(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    // Three query vectors per pass: one row of a 3-way GQA group, and 12
    // of the 16 ymm registers as accumulators.
    // SAFETY: this function's target features are the ones Avx2Micro uses.
    unsafe { unit_impl::<Avx2Micro, 3>(job, buf) }
}

/// [`unit_impl`] for AVX2; only handed out after the CPU check in
/// `dispatch::flash_unit`, and checked again here because it is a safe fn.
pub(crate) fn flash_unit(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    use crate::level::{Level, level};
    assert_ne!(level(), Level::Scalar);
    // SAFETY: every level above scalar has AVX2 and FMA (checked above).
    unsafe { flash_unit_avx2_tf(job, buf) }
}

/// The blocked attention's inner loops in AVX2 + FMA.
pub(crate) struct Avx2Micro;

impl Micro for Avx2Micro {
    type Block<'a> = F32Block<'a>;

    /// 32 keys (4 vectors) per pass, `R` query vectors broadcast one column at a time.
    #[inline(always)]
    // Indexes spell out which register each FMA reads and writes.
    #[allow(clippy::needless_range_loop)]
    unsafe fn qk<const R: usize>(
        q: &[f32],
        d: usize,
        block: &F32Block<'_>,
        s: &mut [[f32; BK]; R],
    ) {
        let kt = block.kt;
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
        block: &F32Block<'_>,
        d: usize,
        n: usize,
        acc: &mut [f32],
    ) {
        let v = &block.v;
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
    v: &[&[f32]; BK],
    d: usize,
    n: usize,
    acc: &mut [f32],
) {
    assert!(n <= BK && acc.len() >= R * d && d.is_multiple_of(8 * CV));
    assert!(v[..n].iter().all(|row| row.len() >= d));
    // SAFETY: loads stay within v[j][..d] for j < n, loads and stores within
    // acc[..R * d] (asserted); the caller vouches for AVX2 and FMA.
    unsafe {
        let ap = acc.as_mut_ptr();
        for c0 in (0..d).step_by(8 * CV) {
            let mut a: [[__m256; CV]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|x| _mm256_loadu_ps(ap.add(r * d + c0 + 8 * x)))
            });
            for j in 0..n {
                // R broadcasts, then one value vector at a time: R + 1 + R * CV registers.
                let row = v[j].as_ptr().add(c0);
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
