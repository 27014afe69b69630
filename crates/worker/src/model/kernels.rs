//! CPU kernels: quantized matmuls (Q4_1 and Q8_0 weights against 8-bit
//! activations), dequantize + f32 GEMM for long prefill chunks, and the
//! attention row kernel compiled for AVX2. On CPUs with AVX-512 VNNI the
//! weights are repacked into 16-row tiles and every batch size runs on the
//! kernel in [`super::tiled`]; the row-major kernels here are the AVX2 and
//! scalar fallbacks.
//!
//! The int8 path follows ggml: activations are quantized per block of 32 to
//! i8 with an f32 scale, weight nibbles (Q4_1) or bytes (Q8_0) are multiplied
//! with `maddubs` (AVX2) or `vpdpbusd` (AVX-512 VNNI), and each weight row is
//! reused for up to four activation rows while it sits in L1, so a batch of
//! decode tokens reads the weights once. Work is split over weight rows on
//! candle's thread pool, shared with every other op.
//!
//! This is the one module that uses `unsafe`: SIMD intrinsics behind runtime
//! feature checks, and raw output pointers whose disjointness is argued at
//! each use.
#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::OnceLock;

use super::attention::{HeadShape, attend_row_impl};
use super::tiled;

/// Values per quantization block.
pub(crate) const QK: usize = 32;
/// Weight rows per unit of parallel work.
const ROWS_PER_UNIT: usize = 16;
/// Most activation rows sharing one pass over a weight row.
const ACT_TILE: usize = 4;
/// Most weight rows sharing one pass over the activations.
const ROW_TILE: usize = 4;
/// Dot products of one tile: `[weight row][activation row]`.
type TileOut = [[f32; ACT_TILE]; ROW_TILE];

/// Below this many multiply-adds a parallel region costs more than it saves,
/// and on a busy machine a descheduled helper thread stalls it for a whole
/// time slice: single-token decode steps stay on the calling thread.
const PARALLEL_MIN_MACS: usize = 2_000_000;

/// Runs `f` over `0..units`: on candle's pool when `parallel` and `macs` is
/// worth it, inline otherwise.
pub(crate) fn run_units(
    units: usize,
    macs: usize,
    parallel: bool,
    f: impl Fn(Range<usize>) + Sync,
) {
    if !parallel || macs < PARALLEL_MIN_MACS {
        f(0..units);
        return;
    }
    let pool = candle_core::utils::barrier_pool();
    if pool.n_workers() == 0 {
        f(0..units);
    } else {
        pool.execute_chunked(units, f);
    }
}

/// Weight formats with kernels here (ggml block layouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QKind {
    /// `{d: f16, m: f16, qs: [u8; 16]}`: value = d * nibble + m.
    Q4_1,
    /// `{d: f16, qs: [i8; 32]}`: value = d * q.
    Q8_0,
}

impl QKind {
    fn block_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }
}

/// A `[rows, cols]` matrix stored as ggml blocks, row after row.
#[derive(Debug)]
pub(crate) struct QMatrix {
    kind: QKind,
    rows: usize,
    cols: usize,
    /// Repacked into 16-row tiles for the AVX-512 VNNI kernel ([`tiled`]).
    tiled: bool,
    data: Vec<u8>,
}

/// Activations quantized to i8 per block of 32: `x ≈ d * q`, `s = d * sum(q)`.
#[derive(Debug, Default)]
pub(crate) struct Q8Acts {
    pub(super) blocks: usize,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
    pub(super) q: Vec<i8>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Scalar,
    Avx2,
    Avx512Vnni,
}

fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
            {
                return Level::Avx512Vnni;
            }
            if avx2 {
                return Level::Avx2;
            }
        }
        Level::Scalar
    })
}

/// A raw output pointer shared by the units of one parallel region.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every use writes disjoint elements from different threads and the
// region ends before the buffer is touched again.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the Sync wrapper, not the field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

impl QMatrix {
    /// Wraps ggml block bytes; `cols` must be a multiple of 32.
    pub(crate) fn new(
        kind: QKind,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self, String> {
        let expected = rows * (cols / QK) * kind.block_bytes();
        if !cols.is_multiple_of(QK) || data.len() != expected {
            return Err(format!(
                "{kind:?} matrix {rows}x{cols} needs {expected} bytes, got {}",
                data.len()
            ));
        }
        // Repacking keeps the size; only the AVX-512 VNNI kernel reads tiles.
        if level() == Level::Avx512Vnni && rows.is_multiple_of(tiled::TILE) {
            let data = tiled::repack(kind, rows, cols, &data);
            return Ok(Self {
                kind,
                rows,
                cols,
                tiled: true,
                data,
            });
        }
        Ok(Self {
            kind,
            rows,
            cols,
            tiled: false,
            data,
        })
    }

    /// Whether the int8 kernel beats dequantize + f32 GEMM at every batch size.
    pub(crate) fn int8_always(&self) -> bool {
        self.tiled
    }

    /// Output rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self) -> usize {
        self.cols / QK * self.kind.block_bytes()
    }

    fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Row `r` as f32 (embedding lookups).
    pub(crate) fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if self.tiled {
            tiled::dequantize_row(self.kind, self.cols, &self.data, r, out);
            return;
        }
        dequantize_row_scalar(self.kind, self.row(r), out);
    }

    /// `out[m, rows] = x[m, cols] @ self^T` with int8 activations.
    pub(crate) fn matmul_q8(&self, acts: &Q8Acts, m: usize, out: &mut [f32], parallel: bool) {
        assert_eq!(acts.blocks * QK, self.cols);
        assert!(acts.q.len() >= m * self.cols && out.len() >= m * self.rows);
        #[cfg(target_arch = "x86_64")]
        if self.tiled {
            let ptr = OutPtr(out.as_mut_ptr());
            let (kind, cols, rows, data) = (self.kind, self.cols, self.rows, &self.data);
            run_units(rows / tiled::TILE, m * rows * cols, parallel, |tiles| {
                // SAFETY: tiles are only built when AVX-512 VNNI was detected;
                // each unit owns the 16 output columns of its tiles; the asserts
                // above bound acts and out.
                unsafe { tiled::matmul_tiles(kind, cols, rows, data, acts, m, tiles, ptr.get()) };
            });
            return;
        }
        let units = self.rows.div_ceil(ROWS_PER_UNIT);
        let ptr = OutPtr(out.as_mut_ptr());
        let lvl = level();
        run_units(units, m * self.rows * self.cols, parallel, |range| {
            let rows = range.start * ROWS_PER_UNIT..(range.end * ROWS_PER_UNIT).min(self.rows);
            // SAFETY: each unit owns the output columns of its weight rows, in
            // every activation row; the assert above bounds all writes.
            unsafe { self.matmul_rows(lvl, acts, m, rows, ptr.get()) };
        });
    }

    /// Computes the output columns `rows` for every activation row.
    ///
    /// # Safety
    /// `out` must hold `m * self.rows` floats, and no other thread may write
    /// these columns meanwhile.
    unsafe fn matmul_rows(
        &self,
        lvl: Level,
        acts: &Q8Acts,
        m: usize,
        rows: Range<usize>,
        out: *mut f32,
    ) {
        // Enough independent accumulators to hide FMA latency, few enough to
        // stay in 16 vector registers: 4x2 for one or two tokens, 2x4 above.
        let (row_tile, act_tile) = if m <= 2 { (4, 2) } else { (2, 4) };
        let rb = self.row_bytes();
        let mut vals: TileOut = [[0.0; ACT_TILE]; ROW_TILE];
        let mut r = rows.start;
        while r < rows.end {
            let rt = if rows.end - r >= row_tile {
                row_tile
            } else {
                1
            };
            let w = &self.data[r * rb..(r + rt) * rb];
            let mut i0 = 0;
            while i0 < m {
                let mt = act_tile.min(m - i0);
                match lvl {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the level was detected at run time.
                    Level::Avx512Vnni => unsafe {
                        x86::tile_vnni(self.kind, w, rb, rt, acts, i0, mt, &mut vals)
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    Level::Avx2 => unsafe {
                        x86::tile_avx2(self.kind, w, rb, rt, acts, i0, mt, &mut vals)
                    },
                    _ => {
                        for (rr, v) in vals.iter_mut().take(rt).enumerate() {
                            tile_scalar(self.kind, &w[rr * rb..(rr + 1) * rb], acts, i0, mt, v);
                        }
                    }
                }
                for (rr, row_vals) in vals.iter().take(rt).enumerate() {
                    for (j, v) in row_vals.iter().take(mt).enumerate() {
                        // SAFETY: i0 + j < m and r + rr < self.rows, within the caller's bound.
                        unsafe { *out.add((i0 + j) * self.rows + r + rr) = *v };
                    }
                }
                i0 += mt;
            }
            r += rt;
        }
    }

    /// `out[m, rows] = x[m, cols] @ self^T` in f32: each thread dequantizes
    /// its share of weight rows into `scratch` and runs a GEMM on them.
    pub(crate) fn matmul_f32(
        &self,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
        parallel: bool,
    ) {
        scratch.resize(self.rows * self.cols, 0.0);
        let wptr = OutPtr(scratch.as_mut_ptr());
        let (rows, cols) = (self.rows, self.cols);
        gemm_split(x, m, rows, cols, out, parallel, |range| {
            for r in range {
                // SAFETY: row r of the scratch belongs to this unit alone, and
                // the scratch holds rows * cols floats.
                let dst = unsafe { std::slice::from_raw_parts_mut(wptr.get().add(r * cols), cols) };
                self.dequantize_row_fast(r, dst);
            }
            wptr.get() as *const f32
        });
    }

    fn dequantize_row_fast(&self, r: usize, out: &mut [f32]) {
        if self.tiled {
            tiled::dequantize_row(self.kind, self.cols, &self.data, r, out);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if level() != Level::Scalar {
            // SAFETY: AVX2/FMA/F16C were detected at run time.
            unsafe { x86::dequantize_row_avx2(self.kind, self.row(r), out) };
            return;
        }
        dequantize_row_scalar(self.kind, self.row(r), out);
    }
}

/// `out[m, n] = x[m, k] @ W^T` for f32 `W` `[n, k]` given row by row:
/// `weights(range)` makes rows `range` of W ready and returns W's base pointer.
fn gemm_split(
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    parallel: bool,
    weights: impl Fn(Range<usize>) -> *const f32 + Sync,
) {
    assert!(x.len() >= m * k && out.len() >= m * n);
    let threads = if parallel {
        candle_core::utils::barrier_pool().n_workers() + 1
    } else {
        1
    };
    let per = n.div_ceil(threads).next_multiple_of(16);
    let units = n.div_ceil(per);
    let optr = OutPtr(out.as_mut_ptr());
    let xptr = x.as_ptr() as usize;
    run_units(units, m * n * k, parallel, |range| {
        for unit in range {
            let cols = unit * per..((unit + 1) * per).min(n);
            let w = weights(cols.clone());
            // SAFETY: dst columns `cols` of out[m, n] belong to this unit; lhs is
            // x[m, k] row-major; rhs(kk, j) = W[j * k + kk] for j in `cols`, all
            // within the asserted bounds.
            unsafe {
                gemm::gemm(
                    m,
                    cols.len(),
                    k,
                    optr.get().add(cols.start),
                    1,
                    n as isize,
                    false,
                    xptr as *const f32,
                    1,
                    k as isize,
                    w.add(cols.start * k),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    });
}

/// `out[m, n] = x[m, k] @ w^T` for a dense row-major f32 `w` `[n, k]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_dense(
    w: &[f32],
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
    parallel: bool,
) {
    assert_eq!(w.len(), n * k);
    gemm_split(x, m, n, k, out, parallel, |_| w.as_ptr());
}

impl Q8Acts {
    /// Quantizes `x[m, k]` (k a multiple of 32).
    pub(crate) fn quantize(&mut self, x: &[f32], m: usize, k: usize) {
        let nb = k / QK;
        self.blocks = nb;
        self.d.resize(m * nb, 0.0);
        self.s.resize(m * nb, 0.0);
        self.q.resize(m * k, 0);
        #[cfg(target_arch = "x86_64")]
        if level() != Level::Scalar {
            // SAFETY: AVX2/FMA were detected at run time.
            unsafe { x86::quantize_avx2(&x[..m * k], &mut self.q, &mut self.d, &mut self.s) };
            return;
        }
        quantize_blocks(&x[..m * k], &mut self.q, &mut self.d, &mut self.s);
    }
}

/// Per 32-value block: `d = max|x| / 127`, `q = round(x / d)`, `s = d * sum(q)`.
#[inline(always)]
fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xs, qs), d), s) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(d).zip(s) {
        let mut amax = [0f32; 8];
        for c in xs.chunks_exact(8) {
            for (a, v) in amax.iter_mut().zip(c) {
                *a = a.max(v.abs());
            }
        }
        let scale = amax.iter().fold(0f32, |a, &v| a.max(v)) / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = [0i32; 8];
        for (qc, xc) in qs.chunks_exact_mut(8).zip(xs.chunks_exact(8)) {
            for ((qv, &v), acc) in qc.iter_mut().zip(xc).zip(sum.iter_mut()) {
                let r = (v * inv).round_ties_even() as i32;
                *qv = r as i8;
                *acc += r;
            }
        }
        *d = scale;
        *s = scale * sum.iter().sum::<i32>() as f32;
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

fn dequantize_row_scalar(kind: QKind, row: &[u8], out: &mut [f32]) {
    let bb = kind.block_bytes();
    for (blk, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(blk, 0);
        match kind {
            QKind::Q4_1 => {
                let mn = f16_at(blk, 2);
                for (j, &q) in blk[4..20].iter().enumerate() {
                    o[j] = d * f32::from(q & 15) + mn;
                    o[j + 16] = d * f32::from(q >> 4) + mn;
                }
            }
            QKind::Q8_0 => {
                for (j, &q) in blk[2..34].iter().enumerate() {
                    o[j] = d * f32::from(q as i8);
                }
            }
        }
    }
}

fn tile_scalar(
    kind: QKind,
    w: &[u8],
    acts: &Q8Acts,
    i0: usize,
    mt: usize,
    vals: &mut [f32; ACT_TILE],
) {
    let nb = acts.blocks;
    let bb = kind.block_bytes();
    for (j, v) in vals.iter_mut().take(mt).enumerate() {
        let i = i0 + j;
        let mut sum = 0f32;
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let a = &acts.q[(i * nb + b) * QK..(i * nb + b + 1) * QK];
            let d = f16_at(blk, 0);
            match kind {
                QKind::Q4_1 => {
                    let mut dot = 0i32;
                    for (t, &q) in blk[4..20].iter().enumerate() {
                        dot += i32::from(q & 15) * i32::from(a[t])
                            + i32::from(q >> 4) * i32::from(a[t + 16]);
                    }
                    sum +=
                        d * acts.d[i * nb + b] * dot as f32 + f16_at(blk, 2) * acts.s[i * nb + b];
                }
                QKind::Q8_0 => {
                    let dot: i32 = blk[2..34]
                        .iter()
                        .zip(a)
                        .map(|(&q, &x)| i32::from(q as i8) * i32::from(x))
                        .sum();
                    sum += d * acts.d[i * nb + b] * dot as f32;
                }
            }
        }
        *v = sum;
    }
}

/// Runs one attention row with the widest vector unit available.
pub(crate) fn attend_row(
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    keys: &[u32],
    shape: HeadShape,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: AVX-512 was detected at run time.
        Level::Avx512Vnni => unsafe {
            x86::attend_row_avx512(q, k_pool, v_pool, keys, shape, scores, out)
        },
        // SAFETY: AVX2/FMA were detected at run time.
        Level::Avx2 => unsafe { x86::attend_row_avx2(q, k_pool, v_pool, keys, shape, scores, out) },
        Level::Scalar => attend_row_impl(q, k_pool, v_pool, keys, shape, scores, out),
    }
    #[cfg(not(target_arch = "x86_64"))]
    attend_row_impl(q, k_pool, v_pool, keys, shape, scores, out);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{HeadShape, Q8Acts, QK, QKind, TileOut, attend_row_impl};

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
                                acc[r][j] =
                                    _mm256_fmadd_ps(p, _mm256_set1_ps(d * da[j]), acc[r][j]);
                                mins[r][j] += mn * sa[j];
                            }
                        }
                        QKind::Q8_0 => {
                            let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                            let wabs = _mm256_sign_epi8(wv, wv);
                            for j in 0..MT {
                                // Signed x signed: move the sign of w onto a.
                                let p =
                                    _mm256_cvtepi32_ps(D::dot(wabs, _mm256_sign_epi8(a[j], wv)));
                                acc[r][j] =
                                    _mm256_fmadd_ps(p, _mm256_set1_ps(d * da[j]), acc[r][j]);
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
                        let bytes =
                            unsafe { _mm_loadl_epi64(blk.add(2 + 8 * part) as *const __m128i) };
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
    pub(super) unsafe fn attend_row_avx512(
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        keys: &[u32],
        shape: HeadShape,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        attend_row_impl(q, k_pool, v_pool, keys, shape, scores, out);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn attend_row_avx2(
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        keys: &[u32],
        shape: HeadShape,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        attend_row_impl(q, k_pool, v_pool, keys, shape, scores, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// Raw ggml Q4_1 blocks with varied scales and nibbles.
    fn q4_1_blocks(rows: usize, cols: usize) -> Vec<u8> {
        let mut data = Vec::new();
        let vals = random(rows * cols / 2, 7);
        for (b, chunk) in vals.chunks(16).enumerate() {
            data.extend_from_slice(&half::f16::from_f32(0.01 + b as f32 * 1e-4).to_le_bytes());
            data.extend_from_slice(&half::f16::from_f32(-0.07).to_le_bytes());
            data.extend(chunk.iter().map(|v| (v.abs() * 255.0) as u8));
        }
        data
    }

    /// Raw ggml Q8_0 blocks.
    fn q8_0_blocks(rows: usize, cols: usize) -> Vec<u8> {
        let mut data = Vec::new();
        for (b, chunk) in random(rows * cols, 3).chunks(32).enumerate() {
            data.extend_from_slice(&half::f16::from_f32(0.002 + b as f32 * 1e-5).to_le_bytes());
            data.extend(chunk.iter().map(|v| (v * 127.0) as i8 as u8));
        }
        data
    }

    /// Every layout and kernel this machine has: tiled (when AVX-512 VNNI is
    /// present) and row-major, the latter over 42 rows so 16-row units split
    /// into 4-, 2- and 1-row tiles.
    fn matrices() -> Vec<QMatrix> {
        let (rows, cols) = (48, 96);
        let mut out = Vec::new();
        for (kind, data) in [
            (QKind::Q4_1, q4_1_blocks(rows, cols)),
            (QKind::Q8_0, q8_0_blocks(rows, cols)),
        ] {
            let row_bytes = cols / QK * kind.block_bytes();
            out.push(QMatrix {
                kind,
                rows: 42,
                cols,
                tiled: false,
                data: data[..42 * row_bytes].to_vec(),
            });
            out.push(QMatrix::new(kind, rows, cols, data).unwrap());
        }
        out
    }

    /// The SIMD int8 kernels, the f32 GEMM path and a plain f64 product of
    /// the dequantized weights agree, for every activation tile size.
    #[test]
    fn matmuls_agree_with_dequantized_reference() {
        let all = matrices();
        assert_eq!(all.iter().any(|w| w.tiled), level() == Level::Avx512Vnni);
        for w in all {
            for m in [1, 2, 3, 4, 7] {
                let x = random(m * w.cols(), 11 + m as u32);
                let mut dense = vec![0f32; w.rows() * w.cols()];
                for r in 0..w.rows() {
                    w.dequantize_row(r, &mut dense[r * w.cols()..(r + 1) * w.cols()]);
                }
                let mut acts = Q8Acts::default();
                acts.quantize(&x, m, w.cols());
                let mut int8 = vec![0f32; m * w.rows()];
                w.matmul_q8(&acts, m, &mut int8, true);
                let mut f32_out = vec![0f32; m * w.rows()];
                w.matmul_f32(&x, m, &mut f32_out, &mut Vec::new(), true);
                for i in 0..m {
                    for r in 0..w.rows() {
                        let exact: f64 = (0..w.cols())
                            .map(|c| {
                                f64::from(x[i * w.cols() + c]) * f64::from(dense[r * w.cols() + c])
                            })
                            .sum();
                        let (a, b) = (int8[i * w.rows() + r], f32_out[i * w.rows() + r]);
                        assert!((f64::from(b) - exact).abs() < 1e-4, "f32 {b} vs {exact}");
                        assert!(
                            (f64::from(a) - exact).abs() < 0.02 * (1.0 + exact.abs()),
                            "{:?} tiled={} m={m} int8 {a} vs {exact}",
                            w.kind,
                            w.tiled
                        );
                    }
                }
                if !w.tiled {
                    let mut scalar = [0f32; ACT_TILE];
                    tile_scalar(w.kind, w.row(5), &acts, 0, 1, &mut scalar);
                    assert!((scalar[0] - int8[5]).abs() < 1e-4);
                }
            }
        }
    }
}
