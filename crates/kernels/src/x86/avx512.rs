//! AVX-512 builds: the row-major int8 tile with VNNI, the attention row,
//! and the matmul over 16-row tiles ([`crate::tiled`]; K-quants in `ktiles`).

use std::arch::x86_64::*;

use std::ops::Range;

use super::{Dot, tile_any};
use crate::attention::{KvElem, RowJob};
use crate::blocked::{BK, F32Block, Micro, UnitBuf, UnitJob, unit_impl};
use crate::format::{QK, QK_K, QKind, RowTile, TileOut};
use crate::scalar;
use crate::tiled::{TiledMatmul, Tiling};

struct VnniDot;
impl Dot for VnniDot {
    #[inline(always)]
    unsafe fn dot(w: __m256i, a: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a) }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(crate) unsafe fn tile(job: &RowTile<'_>, vals: &mut TileOut) {
    // SAFETY: forwarded from the caller.
    unsafe { tile_any::<VnniDot>(job, vals) }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(crate) unsafe fn attend_row<T: KvElem>(
    job: &RowJob<'_, T>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scalar::attend_row(job, scores, out);
}

/// Most activation rows per pass over a weight tile.
const ACT_TILE: usize = 4;
/// Activation rows per pass over a K-quant weight tile, where there are as many.
const K_ACT_TILE: usize = 8;
/// Activation rows of a K-quant tile pass that reads each super-block once for two groups.
const TWO_K_ACT_TILES: usize = 2 * K_ACT_TILE;

/// `out[i, 16t..16t+16]` for every activation row `i < m` and tile `t` in `tiles`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VNNI; `job` must describe a matrix
/// tiled with [`Tiling::Vnni16`] and bound `acts` and `out`; no other thread
/// may write the columns of `tiles` meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn matmul_tiles(job: &TiledMatmul<'_>, tiles: Range<usize>) {
    for t in tiles {
        let mut i0 = 0;
        while i0 < job.m {
            let left = job.m - i0;
            // K-quant tiles unpack more per weight byte: shared by 8 rows,
            // and (Q4_K, Q5_K) each super-block by two groups of 8 where
            // there are 16.
            let kquant = job.kind.block_values() == QK_K;
            // (Q6_K's two groups measured slower: its quants take more registers.)
            let two_groups = matches!(job.kind, QKind::Q4K | QKind::Q5K);
            let mt = if two_groups && left >= TWO_K_ACT_TILES {
                TWO_K_ACT_TILES
            } else if kquant && left >= K_ACT_TILE {
                K_ACT_TILE
            } else {
                ACT_TILE.min(left)
            };
            // SAFETY: forwarded from the caller.
            unsafe {
                match (job.kind, mt) {
                    (QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs, _) => {
                        unreachable!("lookup types are never tiled")
                    }
                    (QKind::Q4_1, 1) => tiles::tile_q4_1::<1, false>(job, i0, t),
                    (QKind::Q4_1, 2) => tiles::tile_q4_1::<2, false>(job, i0, t),
                    (QKind::Q4_1, 3) => tiles::tile_q4_1::<3, false>(job, i0, t),
                    (QKind::Q4_1, _) => tiles::tile_q4_1::<4, false>(job, i0, t),
                    (QKind::Q5_1, 1) => tiles::tile_q4_1::<1, true>(job, i0, t),
                    (QKind::Q5_1, 2) => tiles::tile_q4_1::<2, true>(job, i0, t),
                    (QKind::Q5_1, 3) => tiles::tile_q4_1::<3, true>(job, i0, t),
                    (QKind::Q5_1, _) => tiles::tile_q4_1::<4, true>(job, i0, t),
                    (QKind::Q8_0, 1) => tiles::tile_q8_0::<1>(job, i0, t),
                    (QKind::Q8_0, 2) => tiles::tile_q8_0::<2>(job, i0, t),
                    (QKind::Q8_0, 3) => tiles::tile_q8_0::<3>(job, i0, t),
                    (QKind::Q8_0, _) => tiles::tile_q8_0::<4>(job, i0, t),
                    (QKind::Q4K, 1) => ktiles::tile_k::<ktiles::Q4K, 1, 1>(job, i0, t),
                    (QKind::Q4K, 2) => ktiles::tile_k::<ktiles::Q4K, 2, 1>(job, i0, t),
                    (QKind::Q4K, 3) => ktiles::tile_k::<ktiles::Q4K, 3, 1>(job, i0, t),
                    (QKind::Q4K, TWO_K_ACT_TILES) => {
                        ktiles::tile_k::<ktiles::Q4K, K_ACT_TILE, 2>(job, i0, t)
                    }
                    (QKind::Q4K, K_ACT_TILE) => {
                        ktiles::tile_k::<ktiles::Q4K, K_ACT_TILE, 1>(job, i0, t)
                    }
                    (QKind::Q4K, _) => ktiles::tile_k::<ktiles::Q4K, 4, 1>(job, i0, t),
                    (QKind::Q5K, 1) => ktiles::tile_k::<ktiles::Q5K, 1, 1>(job, i0, t),
                    (QKind::Q5K, 2) => ktiles::tile_k::<ktiles::Q5K, 2, 1>(job, i0, t),
                    (QKind::Q5K, 3) => ktiles::tile_k::<ktiles::Q5K, 3, 1>(job, i0, t),
                    (QKind::Q5K, TWO_K_ACT_TILES) => {
                        ktiles::tile_k::<ktiles::Q5K, K_ACT_TILE, 2>(job, i0, t)
                    }
                    (QKind::Q5K, K_ACT_TILE) => {
                        ktiles::tile_k::<ktiles::Q5K, K_ACT_TILE, 1>(job, i0, t)
                    }
                    (QKind::Q5K, _) => ktiles::tile_k::<ktiles::Q5K, 4, 1>(job, i0, t),
                    (QKind::Q6K, 1) => ktiles::tile_k::<ktiles::Q6K, 1, 1>(job, i0, t),
                    (QKind::Q6K, 2) => ktiles::tile_k::<ktiles::Q6K, 2, 1>(job, i0, t),
                    (QKind::Q6K, 3) => ktiles::tile_k::<ktiles::Q6K, 3, 1>(job, i0, t),
                    (QKind::Q6K, K_ACT_TILE) => {
                        ktiles::tile_k::<ktiles::Q6K, K_ACT_TILE, 1>(job, i0, t)
                    }
                    (QKind::Q6K, _) => ktiles::tile_k::<ktiles::Q6K, 4, 1>(job, i0, t),
                }
            }
            i0 += mt;
        }
    }
}

mod ktiles;

mod tiles {
    use std::arch::x86_64::*;

    use super::ktiles::with_high_bits;
    use super::{QK, TiledMatmul};

    /// Rows per tile.
    const TILE: usize = 16;

    /// Broadcasts the 4 activation bytes at `p` to every 32-bit lane.
    #[inline(always)]
    unsafe fn bcast4(p: *const i8) -> __m512i {
        // SAFETY: the caller guarantees 4 readable bytes at p.
        unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
    }

    /// Adds `d_w * d_a * dot + extra * s_a` for each activation row of
    /// block `b` into `facc`; `extra` is the per-row constant of each weight.
    #[inline(always)]
    unsafe fn scale_block<const MT: usize>(
        job: &TiledMatmul<'_>,
        i0: usize,
        b: usize,
        dv: __m512,
        extra: __m512,
        iacc: &[__m512i; MT],
        facc: &mut [__m512; MT],
    ) {
        let nb = job.cols / QK;
        for (j, acc) in iacc.iter().enumerate() {
            let at = (i0 + j) * nb + b;
            // SAFETY: the caller bounds acts to rows i0..i0 + MT.
            unsafe {
                let scale = _mm512_mul_ps(dv, _mm512_set1_ps(*job.acts.d.get_unchecked(at)));
                facc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*acc), scale, facc[j]);
                facc[j] = _mm512_fmadd_ps(
                    extra,
                    _mm512_set1_ps(*job.acts.s.get_unchecked(at)),
                    facc[j],
                );
            }
        }
    }

    /// Stores the 16 columns of tile `t` for each activation row.
    #[inline(always)]
    unsafe fn store<const MT: usize>(
        job: &TiledMatmul<'_>,
        facc: &[__m512; MT],
        i0: usize,
        t: usize,
    ) {
        for (j, v) in facc.iter().enumerate() {
            // SAFETY: the caller bounds out to m * n_rows with i0 + j < m.
            unsafe { _mm512_storeu_ps(job.out.add((i0 + j) * job.n_rows + t * TILE), *v) };
        }
    }

    /// Q4_1 (`FIFTH` false) and Q5_1 (`FIFTH` true: each block's last 64
    /// bytes hold the fifth bits): value = d * q + m.
    #[inline(always)]
    pub(super) unsafe fn tile_q4_1<const MT: usize, const FIFTH: bool>(
        job: &TiledMatmul<'_>,
        i0: usize,
        t: usize,
    ) {
        let nb = job.cols / QK;
        let tb = super::Tiling::Vnni16.block_bytes(job.kind);
        // SAFETY (whole body): tile t has nb blocks of tb bytes in `data`, and
        // activation rows i0..i0+MT of `cols` i8 exist (matmul_q8 asserts).
        unsafe {
            let low = _mm512_set1_epi8(15);
            let mut facc = [_mm512_setzero_ps(); MT];
            for b in 0..nb {
                let base = job.data.as_ptr().add((t * nb + b) * tb);
                let dv = _mm512_cvtph_ps(_mm256_loadu_si256(base as *const __m256i));
                let mv = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(32) as *const __m256i));
                let mut iacc = [_mm512_setzero_si512(); MT];
                for g in 0..4 {
                    let raw = _mm512_loadu_si512(base.add(64 + g * 64) as *const _);
                    let mut lo = _mm512_and_si512(raw, low);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
                    if FIFTH {
                        let top = base.add(64 + 4 * 64);
                        lo = with_high_bits(lo, top, 2 * g, 1);
                        hi = with_high_bits(hi, top, 2 * g + 1, 1);
                    }
                    for (j, acc) in iacc.iter_mut().enumerate() {
                        let ap = job
                            .acts
                            .q
                            .as_ptr()
                            .add((i0 + j) * job.cols + b * QK + g * 8);
                        *acc = _mm512_dpbusd_epi32(*acc, lo, bcast4(ap));
                        *acc = _mm512_dpbusd_epi32(*acc, hi, bcast4(ap.add(4)));
                    }
                }
                scale_block::<MT>(job, i0, b, dv, mv, &iacc, &mut facc);
            }
            store::<MT>(job, &facc, i0, t);
        }
    }

    #[inline(always)]
    pub(super) unsafe fn tile_q8_0<const MT: usize>(job: &TiledMatmul<'_>, i0: usize, t: usize) {
        let nb = job.cols / QK;
        let tb = super::Tiling::Vnni16.block_bytes(job.kind);
        // SAFETY: as in tile_q4_1.
        unsafe {
            let minus128 = _mm512_set1_ps(-128.0);
            let mut facc = [_mm512_setzero_ps(); MT];
            for b in 0..nb {
                let base = job.data.as_ptr().add((t * nb + b) * tb);
                let dv = _mm512_cvtph_ps(_mm256_loadu_si256(base as *const __m256i));
                // Weights were stored +128: subtract 128 * d_w * d_a * sum(q_a) = 128 * d_w * s_a.
                let mv = _mm512_mul_ps(dv, minus128);
                let mut iacc = [_mm512_setzero_si512(); MT];
                for g in 0..8 {
                    let w = _mm512_loadu_si512(base.add(32 + g * 64) as *const _);
                    for (j, acc) in iacc.iter_mut().enumerate() {
                        let ap = job
                            .acts
                            .q
                            .as_ptr()
                            .add((i0 + j) * job.cols + b * QK + g * 4);
                        *acc = _mm512_dpbusd_epi32(*acc, w, bcast4(ap));
                    }
                }
                scale_block::<MT>(job, i0, b, dv, mv, &iacc, &mut facc);
            }
            store::<MT>(job, &facc, i0, t);
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn flash_unit_avx512_tf(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    // Three query vectors per pass, as in AVX2: 12 of the 32 zmm
    // registers accumulate a whole 64-key block.
    // SAFETY: this function's target features are the ones Avx512Micro uses.
    unsafe { unit_impl::<Avx512Micro, 3>(job, buf) }
}

/// [`unit_impl`] for AVX-512; only handed out after the CPU check in
/// `dispatch::flash_unit`, and checked again here because it is a safe fn.
pub(crate) fn flash_unit(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    use crate::level::{Level, level};
    assert_eq!(level(), Level::Avx512Vnni);
    // SAFETY: this level has AVX-512 F and VL, AVX2 and FMA (checked above).
    unsafe { flash_unit_avx512_tf(job, buf) }
}

/// The blocked attention's inner loops in AVX-512 F: twice the lanes of
/// AVX2 and twice the registers, so a whole key block is one pass.
struct Avx512Micro;

impl Micro for Avx512Micro {
    type Block<'a> = F32Block<'a>;

    /// All 64 keys of a block (4 vectors) per pass, `R` query vectors
    /// broadcast one column at a time.
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
        const KV: usize = BK / 16;
        assert!(q.len() >= R * d && kt.len() >= d * BK && BK == 16 * KV);
        // SAFETY: loads stay within kt[..d * BK] and q[..R * d] (asserted),
        // stores within s; the caller vouches for AVX-512 F and FMA.
        unsafe {
            let (qp, kp) = (q.as_ptr(), kt.as_ptr());
            let mut acc = [[_mm512_setzero_ps(); KV]; R];
            for c in 0..d {
                // R broadcasts, then one key vector at a time: R + 1 + R * KV registers.
                let row = kp.add(c * BK);
                let qv: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(*qp.add(r * d + c)));
                for x in 0..KV {
                    let kv = _mm512_loadu_ps(row.add(16 * x));
                    for r in 0..R {
                        acc[r][x] = _mm512_fmadd_ps(qv[r], kv, acc[r][x]);
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

    /// 64 output columns (4 vectors) per pass when `d` allows, else 16;
    /// head sizes that are not a multiple of 16 take the AVX2 loops.
    #[inline(always)]
    unsafe fn pv<const R: usize>(
        p: &[[f32; BK]; R],
        block: &F32Block<'_>,
        d: usize,
        n: usize,
        acc: &mut [f32],
    ) {
        let v = &block.v;
        // SAFETY: forwarded from the caller, whose AVX-512 implies AVX2.
        unsafe {
            if d.is_multiple_of(64) {
                pv_cols::<R, 4>(p, v, d, n, acc);
            } else if d.is_multiple_of(16) {
                pv_cols::<R, 1>(p, v, d, n, acc);
            } else {
                <super::avx2::Avx2Micro as Micro>::pv::<R>(p, block, d, n, acc);
            }
        }
    }
}

/// [`Avx512Micro::pv`] on `16 * CV` output columns at a time.
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
    assert!(n <= BK && acc.len() >= R * d && d.is_multiple_of(16 * CV));
    assert!(v[..n].iter().all(|row| row.len() >= d));
    // SAFETY: loads stay within v[j][..d] for j < n, loads and stores within
    // acc[..R * d] (asserted); the caller vouches for AVX-512 F and FMA.
    unsafe {
        let ap = acc.as_mut_ptr();
        for c0 in (0..d).step_by(16 * CV) {
            let mut a: [[__m512; CV]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|x| _mm512_loadu_ps(ap.add(r * d + c0 + 16 * x)))
            });
            for j in 0..n {
                // R broadcasts, then one value vector at a time: R + 1 + R * CV registers.
                let row = v[j].as_ptr().add(c0);
                let pj: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(p[r][j]));
                for x in 0..CV {
                    let vv = _mm512_loadu_ps(row.add(16 * x));
                    for r in 0..R {
                        a[r][x] = _mm512_fmadd_ps(pj[r], vv, a[r][x]);
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
