//! The blocked attention in bf16 with f32 sums (AVX-512 BF16): keys,
//! values, queries and weights are rounded to bf16 (nearest even), and
//! `vdpbf16ps` adds two products per f32 lane, so one instruction does the
//! work of two FMAs and a packed block is half the bytes. The softmax stays
//! in f32. Used only on CPUs with AVX512_BF16, for every row alike, so a
//! row's result still does not depend on how its sequence was chunked.

use std::arch::x86_64::*;

use crate::blocked::{BK, BlockOf, Micro, Packed, UnitBuf, UnitJob, unit_impl};

/// Widest head the unit takes: its query vectors are converted on the stack.
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// One bf16 block: keys `[d / 2][BK]` and values `[BK / 2][d]` in pairs.
pub(crate) struct Bf16Block<'a> {
    kt: &'a [u32],
    v: &'a [u32],
}

/// The blocked attention's inner loops on `vdpbf16ps`.
struct Bf16Micro;

impl<'a> BlockOf<'a> for Bf16Block<'a> {
    #[inline(always)]
    fn of(packed: &Packed<'a>, b: usize, _keys: usize, d: usize) -> Self {
        let Packed::Bf16 { kt, v } = *packed else {
            panic!("a bf16 unit was handed f32 blocks");
        };
        let len = BK * d / 2;
        Bf16Block {
            kt: &kt[b * len..(b + 1) * len],
            v: &v[b * len..(b + 1) * len],
        }
    }
}

impl Micro for Bf16Micro {
    type Block<'a> = Bf16Block<'a>;

    /// All 64 keys of a block (4 vectors of 16) per pass, `R` query
    /// vectors broadcast two dimensions at a time.
    #[inline(always)]
    // Indexes spell out which register each dot product reads and writes.
    #[allow(clippy::needless_range_loop)]
    unsafe fn qk<const R: usize>(
        q: &[f32],
        d: usize,
        block: &Bf16Block<'_>,
        s: &mut [[f32; BK]; R],
    ) {
        const KV: usize = BK / 16;
        assert!(d.is_multiple_of(16) && d <= MAX_HEAD_DIM && q.len() >= R * d);
        assert!(block.kt.len() >= d / 2 * BK && BK == 16 * KV);
        // SAFETY: loads stay within q[..R * d], qb[r][..d / 2] and
        // kt[..d / 2 * BK] (asserted), stores within qb and s; the caller
        // vouches for AVX-512 F and BF16.
        unsafe {
            let mut qb = [[0u32; MAX_HEAD_DIM / 2]; R];
            for r in 0..R {
                to_bf16_pairs(&q[r * d..(r + 1) * d], &mut qb[r]);
            }
            let kp = block.kt.as_ptr();
            let mut acc = [[_mm512_setzero_ps(); KV]; R];
            for i in 0..d / 2 {
                let row = kp.add(i * BK);
                let qv: [__m512bh; R] =
                    std::array::from_fn(|r| as_bh(_mm512_set1_epi32(qb[r][i] as i32)));
                for x in 0..KV {
                    let kv = as_bh(_mm512_loadu_si512(row.add(16 * x).cast()));
                    for r in 0..R {
                        acc[r][x] = _mm512_dpbf16_ps(acc[r][x], qv[r], kv);
                    }
                }
            }
            for (sr, acc_r) in s.iter_mut().zip(&acc) {
                for (x, a) in acc_r.iter().enumerate() {
                    _mm512_storeu_ps(sr.as_mut_ptr().add(16 * x), *a);
                }
            }
        }
    }

    /// To bf16 and back: `pv` then converts them exactly.
    #[inline(always)]
    unsafe fn round_weights(p: &mut [f32; BK]) {
        // SAFETY: loads and stores within p; the caller vouches for
        // AVX-512 F and BF16.
        unsafe {
            for c in p.chunks_exact_mut(16) {
                let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(c.as_ptr()));
                let bits = std::mem::transmute::<__m256bh, __m256i>(h);
                let wide = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits));
                _mm512_storeu_ps(c.as_mut_ptr(), _mm512_castsi512_ps(wide));
            }
        }
    }

    /// 64 output columns (4 vectors) per pass when `d` allows, else 16;
    /// two keys per dot product.
    #[inline(always)]
    unsafe fn pv<const R: usize>(
        p: &[[f32; BK]; R],
        block: &Bf16Block<'_>,
        d: usize,
        n: usize,
        acc: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if d.is_multiple_of(64) {
                pv_cols::<R, 4>(p, block, d, n, acc);
            } else {
                pv_cols::<R, 1>(p, block, d, n, acc);
            }
        }
    }
}

/// [`Bf16Micro::pv`] on `16 * CV` output columns at a time.
#[inline(always)]
// Indexes spell out which register each dot product reads and writes.
#[allow(clippy::needless_range_loop)]
unsafe fn pv_cols<const R: usize, const CV: usize>(
    p: &[[f32; BK]; R],
    block: &Bf16Block<'_>,
    d: usize,
    n: usize,
    acc: &mut [f32],
) {
    assert!(n <= BK && acc.len() >= R * d && d.is_multiple_of(16 * CV));
    assert!(block.v.len() >= BK / 2 * d);
    let pairs = n.div_ceil(2);
    // SAFETY: loads stay within p, pb, v[..pairs * d] (pairs <= BK / 2,
    // asserted) and acc[..R * d], stores within pb and acc; the caller
    // vouches for AVX-512 F and BF16. A pair past the last key holds zeros
    // (the packer's) and a weight past `n` is zero (the softmax's).
    unsafe {
        let mut pb = [[0u32; BK / 2]; R];
        for r in 0..R {
            to_bf16_pairs(&p[r], &mut pb[r]);
        }
        let (ap, vp) = (acc.as_mut_ptr(), block.v.as_ptr());
        for c0 in (0..d).step_by(16 * CV) {
            let mut a: [[__m512; CV]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|x| _mm512_loadu_ps(ap.add(r * d + c0 + 16 * x)))
            });
            for jp in 0..pairs {
                let row = vp.add(jp * d + c0);
                let pj: [__m512bh; R] =
                    std::array::from_fn(|r| as_bh(_mm512_set1_epi32(pb[r][jp] as i32)));
                for x in 0..CV {
                    let vv = as_bh(_mm512_loadu_si512(row.add(16 * x).cast()));
                    for r in 0..R {
                        a[r][x] = _mm512_dpbf16_ps(a[r][x], pj[r], vv);
                    }
                }
            }
            for (r, ar) in a.iter().enumerate() {
                for (x, o) in ar.iter().enumerate() {
                    _mm512_storeu_ps(ap.add(r * d + c0 + 16 * x), *o);
                }
            }
        }
    }
}

/// The bits of a vector as 32 bf16.
#[inline(always)]
unsafe fn as_bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain data; every bit pattern is a value.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// `x` (a multiple of 16 long) as bf16 in order, two per `u32` (the first
/// in the lower half), into `out[..x.len() / 2]`.
#[inline(always)]
unsafe fn to_bf16_pairs(x: &[f32], out: &mut [u32]) {
    assert!(x.len().is_multiple_of(16) && out.len() >= x.len() / 2);
    // SAFETY: loads within x, stores within out[..x.len() / 2] (asserted);
    // the caller vouches for AVX-512 F and BF16.
    unsafe {
        for (i, c) in x.chunks_exact(16).enumerate() {
            let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(c.as_ptr()));
            let bits = std::mem::transmute::<__m256bh, __m256i>(h);
            _mm256_storeu_si256(out.as_mut_ptr().add(8 * i).cast(), bits);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
unsafe fn flash_unit_bf16_tf(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    // Three query vectors per pass, 12 accumulators, as in the f32 unit.
    // SAFETY: this function's target features are the ones Bf16Micro uses.
    unsafe { unit_impl::<Bf16Micro, 3>(job, buf) }
}

/// [`unit_impl`] on bf16 blocks; only handed out after the CPU check in
/// `dispatch`, and checked again here because it is a safe fn.
pub(crate) fn flash_unit(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    assert!(crate::level::has_avx512_bf16());
    // SAFETY: the CPU has AVX-512 F/BW/VL/BF16, AVX2 and FMA (checked above).
    unsafe { flash_unit_bf16_tf(job, buf) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_keys_tf(rows: &[&[f32]], d: usize, kt: &mut [u32]) {
    // A key's row as pairs, then 16 keys' pairs transposed into place.
    let mut pairs = [[0u32; MAX_HEAD_DIM / 2]; 16];
    for (g, keys) in rows.chunks(16).enumerate() {
        for (p, row) in pairs.iter_mut().zip(keys) {
            // SAFETY: the target features above; lengths asserted inside.
            unsafe { to_bf16_pairs(&row[..d], p) };
        }
        for p in pairs.iter_mut().skip(keys.len()) {
            p[..d / 2].fill(0);
        }
        for (i, column) in kt.chunks_exact_mut(BK).take(d / 2).enumerate() {
            for (x, p) in column[16 * g..16 * g + 16].iter_mut().zip(&pairs) {
                *x = p[i];
            }
        }
    }
    let packed = rows.len().div_ceil(16) * 16;
    for column in kt.chunks_exact_mut(BK).take(d / 2) {
        column[packed..].fill(0);
    }
}

/// Packs up to [`BK`] key rows (each at least `d` long) as `[d / 2][BK]`
/// bf16 pairs into `kt`, zeros past the last key.
pub(crate) fn pack_keys(rows: &[&[f32]], d: usize, kt: &mut [u32]) {
    assert!(crate::level::has_avx512_bf16());
    assert!(rows.len() <= BK && d.is_multiple_of(16) && d <= MAX_HEAD_DIM);
    assert!(kt.len() >= d / 2 * BK && rows.iter().all(|r| r.len() >= d));
    // SAFETY: the CPU has the target features (checked above).
    unsafe { pack_keys_tf(rows, d, kt) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_values_tf(rows: &[&[f32]], d: usize, v: &mut [u32]) {
    // Word k of the result: word k / 2 of the even key's half (the low 16
    // words of cvtne2ps) for even k, of the odd key's (the high 16) for odd k.
    let interleave: [i16; 32] = std::array::from_fn(|k| (k / 2 + 16 * (k % 2)) as i16);
    let zero = [0f32; MAX_HEAD_DIM];
    // SAFETY: the index and zero row are read within bounds; loads stay
    // within each row's first d values, stores within v[..BK / 2 * d]
    // (the caller asserted both); the target features are enabled above.
    unsafe {
        let idx = _mm512_loadu_si512(interleave.as_ptr().cast());
        for jp in 0..BK / 2 {
            let even = rows.get(2 * jp).map_or(&zero[..d], |r| &r[..d]);
            let odd = rows.get(2 * jp + 1).map_or(&zero[..d], |r| &r[..d]);
            for c in (0..d).step_by(16) {
                let both = _mm512_cvtne2ps_pbh(
                    _mm512_loadu_ps(odd.as_ptr().add(c)),
                    _mm512_loadu_ps(even.as_ptr().add(c)),
                );
                let bits = std::mem::transmute::<__m512bh, __m512i>(both);
                let pairs = _mm512_permutexvar_epi16(idx, bits);
                _mm512_storeu_si512(v.as_mut_ptr().add(jp * d + c).cast(), pairs);
            }
        }
    }
}

/// Packs up to [`BK`] value rows (each at least `d` long) as `[BK / 2][d]`
/// bf16 pairs of consecutive keys into `v`, zeros past the last key.
pub(crate) fn pack_values(rows: &[&[f32]], d: usize, v: &mut [u32]) {
    assert!(crate::level::has_avx512_bf16());
    assert!(rows.len() <= BK && d.is_multiple_of(16) && d <= MAX_HEAD_DIM);
    assert!(v.len() >= BK / 2 * d && rows.iter().all(|r| r.len() >= d));
    // SAFETY: the CPU has the target features (checked above).
    unsafe { pack_values_tf(rows, d, v) }
}
