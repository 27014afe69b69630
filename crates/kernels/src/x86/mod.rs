//! x86 builds of the kernels, by instruction set; [`super::dispatch`]
//! calls them only on CPUs that have it. Shared here: the row-major int8
//! tile, generic over the instruction that multiplies bytes ([`Dot`]).

use std::arch::x86_64::*;

use crate::format::{
    Q8Acts, QK, QK_K, QKind, RowTile, TileOut, e8m0_half, iq4xs_scale, lookup_table,
};

pub(super) mod avx2;
pub(super) mod avx512;
pub(super) mod avx512bf16;

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
        // A lookup type's 16 values, for a byte shuffle to look nibbles up in.
        let table = _mm_loadu_si128(lookup_table(kind).as_ptr() as *const __m128i);
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
                    QKind::Mxfp4 | QKind::Iq4Nl => {
                        // Values as signed bytes (nibbles looked up in the
                        // table), then as Q8_0; MXFP4's scale is E8M0.
                        let d = if kind == QKind::Mxfp4 {
                            e8m0_half(*blk)
                        } else {
                            d
                        };
                        let wv = lookup_nibbles(table, blk.add(bb - 16));
                        let wabs = _mm256_sign_epi8(wv, wv);
                        for j in 0..MT {
                            let p = _mm256_cvtepi32_ps(D::dot(wabs, _mm256_sign_epi8(a[j], wv)));
                            acc[r][j] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * da[j]), acc[r][j]);
                        }
                    }
                    QKind::Q5_1 | QKind::Q4K | QKind::Q5K | QKind::Q6K | QKind::Iq4Xs => {
                        unreachable!("see tile_any")
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

/// The 32 values of 16 bytes of nibbles at `p` (low nibbles first), looked
/// up in `table` as signed bytes.
///
/// # Safety
/// 16 bytes at `p` must be readable; the CPU must have AVX2.
#[inline(always)]
unsafe fn lookup_nibbles(table: __m128i, p: *const u8) -> __m256i {
    // SAFETY: forwarded from the caller.
    unsafe {
        let low = _mm_set1_epi8(15);
        let qs = _mm_loadu_si128(p as *const __m128i);
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, low));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), low));
        _mm256_set_m128i(hi, lo)
    }
}

/// [`tile`] for IQ4_XS rows against activations with one step per
/// super-block: per sub-block the table values' signed dot, times its
/// integer scale, summed in i32 lanes over the super-block (at most
/// 8 * 32 * 32 * 127 * 127 in all: no overflow), then scaled once.
#[inline(always)]
// Indexes spell out which register each step reads and writes.
#[allow(clippy::needless_range_loop)]
unsafe fn tile_iq4xs<D: Dot, const RT: usize, const MT: usize>(
    w: &[u8],
    rb: usize,
    acts: &Q8Acts,
    i0: usize,
    vals: &mut TileOut,
) {
    let sbs = acts.blocks / 8;
    // SAFETY: `w` holds RT rows of `sbs` blocks of 136 bytes and activation
    // rows i0..i0+MT exist in `acts` (matmul_q8 asserts both).
    unsafe {
        let table = _mm_loadu_si128(lookup_table(QKind::Iq4Xs).as_ptr() as *const __m128i);
        let mut acc = [[_mm256_setzero_ps(); MT]; RT];
        for sb in 0..sbs {
            let mut da = [0f32; MT];
            let mut ap = [acts.kq.as_ptr(); MT];
            for j in 0..MT {
                let at = (i0 + j) * sbs + sb;
                da[j] = *acts.kd.get_unchecked(at);
                ap[j] = acts.kq.as_ptr().add(at * QK_K);
            }
            for r in 0..RT {
                let blk = w.as_ptr().add(r * rb + sb * 136);
                let head = std::slice::from_raw_parts(blk, 8);
                let mut isum = [_mm256_setzero_si256(); MT];
                for k in 0..8 {
                    let wv = lookup_nibbles(table, blk.add(8 + 16 * k));
                    let wabs = _mm256_sign_epi8(wv, wv);
                    let sc = _mm256_set1_epi32(iq4xs_scale(head, k));
                    for j in 0..MT {
                        let a = _mm256_loadu_si256(ap[j].add(QK * k) as *const __m256i);
                        let p = D::dot(wabs, _mm256_sign_epi8(a, wv));
                        isum[j] = _mm256_add_epi32(isum[j], _mm256_mullo_epi32(p, sc));
                    }
                }
                let d = f16_to_f32(blk);
                for j in 0..MT {
                    let s = _mm256_set1_ps(d * da[j]);
                    acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), s, acc[r][j]);
                }
            }
        }
        for r in 0..RT {
            for j in 0..MT {
                vals[r][j] = hsum(acc[r][j]);
            }
        }
    }
}

/// How the x86 kernels read one K-quant block.
pub(super) trait KBlock {
    const KIND: QKind;
    /// Quants are signed (Q6_K): multiplied with the sign trick, and the
    /// scale changes every 16 values.
    const SIGNED: bool;

    /// The quants of sub-block `j` (values `32j..32j + 32`), one per byte.
    ///
    /// # Safety
    /// `blk` must point at a whole block; the CPU must have AVX2.
    unsafe fn quants(blk: *const u8, j: usize) -> __m256i;

    /// The block's scales and mins as vectors `(a, b, min)`, the values of
    /// `scalar::k_scales` (one multiply each, so the same bits): Q4_K and
    /// Q5_K give the eight sub-block scales in `a` (`b` is zero) and their
    /// mins; Q6_K the sixteen scales of 16 values each in `a` then `b`,
    /// and no mins.
    ///
    /// # Safety
    /// As for [`KBlock::quants`].
    unsafe fn scale_vectors(blk: *const u8) -> (__m256, __m256, __m256);

    /// [`KBlock::scale_vectors`] in arrays: `scale[j]` for sub-block `j`
    /// (Q4_K, Q5_K), `scale[i]` for values `16i..16i + 16` (Q6_K).
    ///
    /// # Safety
    /// As for [`KBlock::quants`].
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> ([f32; 16], [f32; 8]) {
        let (mut scale, mut min) = ([0f32; 16], [0f32; 8]);
        // SAFETY: forwarded from the caller; the stores stay in the arrays.
        unsafe {
            let (a, b, m) = Self::scale_vectors(blk);
            _mm256_storeu_ps(scale.as_mut_ptr(), a);
            _mm256_storeu_ps(scale.as_mut_ptr().add(8), b);
            _mm256_storeu_ps(min.as_mut_ptr(), m);
        }
        (scale, min)
    }
}

/// `by` times each of the eight bytes of `lo` then `hi`, as floats.
#[inline(always)]
unsafe fn widen(lo: u32, hi: u32, by: f32) -> __m256 {
    // SAFETY: register-only intrinsics; the caller vouches for AVX2.
    unsafe {
        let bytes = _mm_cvtsi64_si128((u64::from(hi) << 32 | u64::from(lo)) as i64);
        _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)),
            _mm256_set1_ps(by),
        )
    }
}

/// Scales and mins of Q4_K and Q5_K (the same 12-byte packing after `d`
/// and `dmin`): six bits each, the top two bits of sub-blocks 4..8 kept in
/// the spare bits of the first eight bytes. Unpacked four at a time in
/// 32-bit words.
#[inline(always)]
unsafe fn scales_k4(blk: *const u8) -> (__m256, __m256, __m256) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    // SAFETY: d, dmin and the 12 scale bytes are the block's first 16 bytes.
    unsafe {
        let (d, dmin) = (f16_to_f32(blk), f16_to_f32(blk.add(2)));
        let word = |i: usize| -> u32 {
            u32::from_le(std::ptr::read_unaligned(blk.add(4 + 4 * i) as *const u32))
        };
        let w = [word(0), word(1), word(2)];
        let sc_lo = w[0] & LOW6;
        let m_lo = w[1] & LOW6;
        let sc_hi = (w[2] & LOW4) | (((w[0] >> 6) & LOW2) << 4);
        let m_hi = ((w[2] >> 4) & LOW4) | (((w[1] >> 6) & LOW2) << 4);
        (
            widen(sc_lo, sc_hi, d),
            _mm256_setzero_ps(),
            widen(m_lo, m_hi, dmin),
        )
    }
}

/// The low (`high == false`) or high nibbles of the 32 bytes at `p`.
///
/// # Safety
/// 32 bytes at `p` must be readable; the CPU must have AVX2.
#[inline(always)]
unsafe fn nibbles(p: *const u8, high: bool) -> __m256i {
    // SAFETY: forwarded from the caller.
    unsafe {
        let raw = _mm256_loadu_si256(p as *const __m256i);
        let v = if high {
            _mm256_srli_epi16::<4>(raw)
        } else {
            raw
        };
        _mm256_and_si256(v, _mm256_set1_epi8(0xF))
    }
}

/// Bits `shift..` (`mask` wide) of each of the 32 bytes at `p`, moved to
/// bit 4: the top of a 5- or 6-bit quant. The 16-bit shifts never carry
/// bits across bytes into the masked result.
///
/// # Safety
/// As for [`nibbles`].
#[inline(always)]
unsafe fn high_bits(p: *const u8, shift: usize, mask: i8) -> __m256i {
    // SAFETY: forwarded from the caller.
    unsafe {
        let bits = _mm256_srl_epi16(
            _mm256_loadu_si256(p as *const __m256i),
            _mm_cvtsi32_si128(shift as i32),
        );
        _mm256_slli_epi16::<4>(_mm256_and_si256(bits, _mm256_set1_epi8(mask)))
    }
}

pub(super) struct Q4KBlock;
pub(super) struct Q5KBlock;
pub(super) struct Q6KBlock;

impl KBlock for Q4KBlock {
    const KIND: QKind = QKind::Q4K;
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn scale_vectors(blk: *const u8) -> (__m256, __m256, __m256) {
        // SAFETY: forwarded from the caller.
        unsafe { scales_k4(blk) }
    }

    #[inline(always)]
    unsafe fn quants(blk: *const u8, j: usize) -> __m256i {
        // SAFETY: qs (bytes 16..144) lies within the block.
        unsafe { nibbles(blk.add(16 + 32 * (j / 2)), !j.is_multiple_of(2)) }
    }
}

impl KBlock for Q5KBlock {
    const KIND: QKind = QKind::Q5K;
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn scale_vectors(blk: *const u8) -> (__m256, __m256, __m256) {
        // SAFETY: forwarded from the caller.
        unsafe { scales_k4(blk) }
    }

    #[inline(always)]
    unsafe fn quants(blk: *const u8, j: usize) -> __m256i {
        // SAFETY: qh (bytes 16..48) and qs (48..176) lie within the block.
        unsafe {
            let low = nibbles(blk.add(48 + 32 * (j / 2)), !j.is_multiple_of(2));
            // Bit j of each qh byte.
            _mm256_or_si256(low, high_bits(blk.add(16), j, 1))
        }
    }
}

impl KBlock for Q6KBlock {
    const KIND: QKind = QKind::Q6K;
    const SIGNED: bool = true;

    #[inline(always)]
    unsafe fn scale_vectors(blk: *const u8) -> (__m256, __m256, __m256) {
        // SAFETY: the 16 i8 scales are bytes 192..208, d bytes 208..210.
        unsafe {
            let d = _mm256_set1_ps(f16_to_f32(blk.add(208)));
            let raw = _mm_loadu_si128(blk.add(192) as *const __m128i);
            let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
            let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(raw)));
            (
                _mm256_mul_ps(d, lo),
                _mm256_mul_ps(d, hi),
                _mm256_setzero_ps(),
            )
        }
    }

    #[inline(always)]
    unsafe fn quants(blk: *const u8, j: usize) -> __m256i {
        let (half, t) = (j / 4, j % 4);
        // SAFETY: ql (bytes 0..128) and qh (128..192) lie within the block.
        unsafe {
            let low = nibbles(blk.add(64 * half + 32 * (t % 2)), t >= 2);
            // Bits 2t and 2t + 1 of each qh byte.
            let high = high_bits(blk.add(128 + 32 * half), 2 * t, 3);
            _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32))
        }
    }
}

/// [`tile`] for K-quant rows: each 32-value sub-block is a block with its
/// own scale (two, for Q6_K) and min, against one activation block.
#[inline(always)]
// Indexes spell out which register each FMA reads and writes.
#[allow(clippy::needless_range_loop)]
unsafe fn tile_k<D: Dot, K: KBlock, const RT: usize, const MT: usize>(
    w: &[u8],
    rb: usize,
    acts: &Q8Acts,
    i0: usize,
    vals: &mut TileOut,
) {
    let nb = acts.blocks;
    let bb = K::KIND.block_bytes();
    // SAFETY: `w` holds RT rows of nb / 8 blocks of `bb` bytes and
    // activation rows i0..i0+MT exist in `acts` (matmul_q8 asserts both).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); MT]; RT];
        let mut mins = [[0f32; MT]; RT];
        let mut a = [_mm256_setzero_si256(); MT];
        let mut da = [0f32; MT];
        let mut sa = [0f32; MT];
        for sb in 0..nb / 8 {
            // Loops, not closures: intrinsics inline only into code built
            // with the target features, which a closure here is not.
            let mut blocks = [w.as_ptr(); RT];
            let mut scales = [([0f32; 16], [0f32; 8]); RT];
            for r in 0..RT {
                blocks[r] = w.as_ptr().add(r * rb + sb * bb);
                scales[r] = K::scales(blocks[r]);
            }
            for j in 0..8 {
                for jj in 0..MT {
                    let at = (i0 + jj) * nb + sb * 8 + j;
                    a[jj] = _mm256_loadu_si256(acts.q.as_ptr().add(at * QK) as *const __m256i);
                    da[jj] = *acts.d.get_unchecked(at);
                    sa[jj] = *acts.s.get_unchecked(at);
                }
                for r in 0..RT {
                    let (scale, min) = &scales[r];
                    let q = K::quants(blocks[r], j);
                    let sv = if K::SIGNED {
                        _mm256_set_m128(_mm_set1_ps(scale[2 * j + 1]), _mm_set1_ps(scale[2 * j]))
                    } else {
                        _mm256_set1_ps(scale[j])
                    };
                    let wv = if K::SIGNED { _mm256_sign_epi8(q, q) } else { q };
                    for jj in 0..MT {
                        // Signed quants: move the sign of w onto a.
                        let av = if K::SIGNED {
                            _mm256_sign_epi8(a[jj], q)
                        } else {
                            a[jj]
                        };
                        let p = _mm256_cvtepi32_ps(D::dot(wv, av));
                        let s = _mm256_mul_ps(sv, _mm256_set1_ps(da[jj]));
                        acc[r][jj] = _mm256_fmadd_ps(p, s, acc[r][jj]);
                        mins[r][jj] += min[j] * sa[jj];
                    }
                }
            }
        }
        for r in 0..RT {
            for jj in 0..MT {
                vals[r][jj] = hsum(acc[r][jj]) - mins[r][jj];
            }
        }
    }
}

/// [`tile_k`] for one activation row (decode): the eight sub-block dot
/// products of a super-block are summed across lanes together (two rounds
/// of `hadd` give each 16-value half's sum in its own lane), so scales,
/// activation steps and mins apply once per super-block, as vectors.
#[inline(always)]
// Indexes spell out which register each step reads and writes.
#[allow(clippy::needless_range_loop)]
unsafe fn tile_k1<D: Dot, K: KBlock, const RT: usize>(
    w: &[u8],
    rb: usize,
    acts: &Q8Acts,
    i0: usize,
    vals: &mut TileOut,
) {
    let nb = acts.blocks;
    let bb = K::KIND.block_bytes();
    // SAFETY: `w` holds RT rows of nb / 8 blocks of `bb` bytes and
    // activation row i0 exists in `acts` (matmul_q8 asserts both).
    unsafe {
        // Q6_K's per-16 scales in the lane order the hadds leave the halves in.
        let halves = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        let mut acc = [_mm256_setzero_ps(); RT];
        for sb in 0..nb / 8 {
            let at = i0 * nb + sb * 8;
            let da = _mm256_loadu_ps(acts.d.as_ptr().add(at));
            let sa = _mm256_loadu_ps(acts.s.as_ptr().add(at));
            let (da0, da1) = (
                _mm256_permute2f128_ps::<0x00>(da, da),
                _mm256_permute2f128_ps::<0x11>(da, da),
            );
            let ap = acts.q.as_ptr().add(at * QK);
            for r in 0..RT {
                let blk = w.as_ptr().add(r * rb + sb * bb);
                let mut dots = [_mm256_setzero_si256(); 8];
                for j in 0..8 {
                    let q = K::quants(blk, j);
                    let a = _mm256_loadu_si256(ap.add(j * QK) as *const __m256i);
                    dots[j] = if K::SIGNED {
                        D::dot(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q))
                    } else {
                        D::dot(q, a)
                    };
                }
                // Lanes of u0: the first then second 16-value halves of
                // sub-blocks 0..4; u1 the same for sub-blocks 4..8.
                let u0 = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(dots[0], dots[1]),
                    _mm256_hadd_epi32(dots[2], dots[3]),
                );
                let u1 = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(dots[4], dots[5]),
                    _mm256_hadd_epi32(dots[6], dots[7]),
                );
                let (a, b, min) = K::scale_vectors(blk);
                let (s0, s1) = if K::SIGNED {
                    (
                        _mm256_permutevar8x32_ps(a, halves),
                        _mm256_permutevar8x32_ps(b, halves),
                    )
                } else {
                    (
                        _mm256_permute2f128_ps::<0x00>(a, a),
                        _mm256_permute2f128_ps::<0x11>(a, a),
                    )
                };
                let mut v = acc[r];
                v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u0), _mm256_mul_ps(s0, da0), v);
                v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u1), _mm256_mul_ps(s1, da1), v);
                if !K::SIGNED {
                    v = _mm256_fnmadd_ps(min, sa, v);
                }
                acc[r] = v;
            }
        }
        for r in 0..RT {
            vals[r][0] = hsum(acc[r]);
        }
    }
}

/// Calls `$f::<generics.., RT, MT>(args..)` for the tile shape `(rt, mt)`.
macro_rules! by_shape {
    ($rt:expr, $mt:expr, $f:ident::<$($g:ty),*>($($arg:expr),*)) => {
        match ($rt, $mt) {
            (4, 1) => $f::<$($g,)* 4, 1>($($arg),*),
            (4, _) => $f::<$($g,)* 4, 2>($($arg),*),
            (2, 1) => $f::<$($g,)* 2, 1>($($arg),*),
            (2, 2) => $f::<$($g,)* 2, 2>($($arg),*),
            (2, 3) => $f::<$($g,)* 2, 3>($($arg),*),
            (2, _) => $f::<$($g,)* 2, 4>($($arg),*),
            (_, 1) => $f::<$($g,)* 1, 1>($($arg),*),
            (_, 2) => $f::<$($g,)* 1, 2>($($arg),*),
            (_, 3) => $f::<$($g,)* 1, 3>($($arg),*),
            _ => $f::<$($g,)* 1, 4>($($arg),*),
        }
    };
}

#[inline(always)]
pub(super) unsafe fn tile_any<D: Dot>(job: &RowTile<'_>, vals: &mut TileOut) {
    let &RowTile {
        kind,
        w,
        row_bytes: rb,
        rows: rt,
        acts,
        i0,
        m: mt,
    } = job;
    // SAFETY: forwarded from the caller.
    unsafe {
        match (kind, rt, mt) {
            (QKind::Q4K, 4, 1) => tile_k1::<D, Q4KBlock, 4>(w, rb, acts, i0, vals),
            (QKind::Q4K, 1, 1) => tile_k1::<D, Q4KBlock, 1>(w, rb, acts, i0, vals),
            (QKind::Q5K, 4, 1) => tile_k1::<D, Q5KBlock, 4>(w, rb, acts, i0, vals),
            (QKind::Q5K, 1, 1) => tile_k1::<D, Q5KBlock, 1>(w, rb, acts, i0, vals),
            (QKind::Q6K, 4, 1) => tile_k1::<D, Q6KBlock, 4>(w, rb, acts, i0, vals),
            (QKind::Q6K, 1, 1) => tile_k1::<D, Q6KBlock, 1>(w, rb, acts, i0, vals),
            (QKind::Q4K, ..) => by_shape!(rt, mt, tile_k::<D, Q4KBlock>(w, rb, acts, i0, vals)),
            (QKind::Q5K, ..) => by_shape!(rt, mt, tile_k::<D, Q5KBlock>(w, rb, acts, i0, vals)),
            (QKind::Q6K, ..) => by_shape!(rt, mt, tile_k::<D, Q6KBlock>(w, rb, acts, i0, vals)),
            (QKind::Q5_1, ..) => {
                // Only rows that do not fill 8-row tiles are kept as Q5_1
                // blocks: the portable build serves them.
                super::scalar::tile_rows(job, vals);
            }
            (QKind::Iq4Xs, ..) => by_shape!(rt, mt, tile_iq4xs::<D>(w, rb, acts, i0, vals)),
            (QKind::Q4_1 | QKind::Q8_0 | QKind::Mxfp4 | QKind::Iq4Nl, ..) => {
                by_shape!(rt, mt, tile::<D>(kind, w, rb, acts, i0, vals))
            }
        }
    }
}
