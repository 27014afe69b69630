//! Quantized weight matrices and the matmuls over them: ggml block
//! layouts kept as loaded (or repacked into [`super::tiled`] tiles), int8
//! activations, and dequantize + f32 GEMM for long prefill chunks. Work is
//! split over weight rows on the kernels' thread pool, shared with every other op.

use std::ops::Range;

use crate::dispatch;
use crate::format::{ACT_TILE, Q8Acts, QK, QK_K, QKind, ROW_TILE, RowTile, TileOut};
use crate::level::{Level, level};
use crate::tiled::{TiledMatmul, Tiling};

/// Weight rows per unit of parallel work.
const ROWS_PER_UNIT: usize = 16;

/// Below this many multiply-adds a parallel region costs more than it saves
/// (and on a busy machine a descheduled helper thread stalls it for a time
/// slice). Set so that a one-token decode of the 135M default model splits
/// its projections (110K-885K multiply-adds) over the pool: 1.4x its speed
/// on 2 cores against a 2M threshold.
const PARALLEL_MIN_MACS: usize = 100_000;

/// Runs `f` over `0..units`: on the kernels' pool ([`super::pool`]) when
/// `parallel` and `macs` is worth it, inline otherwise.
pub fn run_units(units: usize, macs: usize, parallel: bool, f: impl Fn(Range<usize>) + Sync) {
    if !parallel || macs < PARALLEL_MIN_MACS {
        f(0..units);
        return;
    }
    super::pool::global(None).run(units, f);
}

/// Q5_0 blocks (`{d: f16, qh: u32, qs: [u8; 16]}`, value = d * (q - 16)) as
/// Q5_1 blocks with min -16d, so one kernel serves both (2 bytes more per
/// 32 values: 24 instead of 22).
pub fn q5_0_as_q5_1(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / 22 * 24);
    for blk in data.chunks_exact(22) {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]);
        out.extend_from_slice(&blk[..2]);
        out.extend_from_slice(&(d * half::f16::from_f32(-16.0)).to_le_bytes());
        out.extend_from_slice(&blk[2..]);
    }
    out
}

/// Why block bytes do not make a matrix.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// A row must hold whole blocks.
    #[error(
        "{kind:?} rows hold whole blocks of {block} values, and {cols} columns is not a multiple"
    )]
    Columns {
        /// The block format.
        kind: QKind,
        /// Columns asked for.
        cols: usize,
        /// Values per block of `kind`.
        block: usize,
    },
    /// The data is not `rows` rows of blocks.
    #[error("{kind:?} matrix {rows}x{cols} needs {expected} bytes, got {got}")]
    Size {
        /// The block format.
        kind: QKind,
        /// Rows asked for.
        rows: usize,
        /// Columns asked for.
        cols: usize,
        /// Bytes that shape takes.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
}

/// A `[rows, cols]` matrix stored as ggml blocks, row after row.
#[derive(Debug)]
pub struct QMatrix {
    kind: QKind,
    rows: usize,
    cols: usize,
    /// Repacked into row tiles for this CPU's int8 kernel ([`super::tiled`]).
    tiling: Option<Tiling>,
    data: Vec<u8>,
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

/// Which kernel layout [`QMatrix::with_layout`] gives a matrix: for
/// benchmarks that time one kernel against another in the same run.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// What [`QMatrix::new`] picks: the widest tiles this CPU runs.
    Widest,
    /// The 8-row AVX2 tiles, on any CPU with AVX2.
    Avx2Tiles,
    /// ggml's row-major blocks (the row-major int8 kernels, and
    /// dequantize + f32 GEMM).
    RowMajor,
}

impl QMatrix {
    /// Wraps ggml block bytes, row after row.
    pub fn new(kind: QKind, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, LayoutError> {
        Self::with_layout(kind, rows, cols, data, Layout::Widest)
    }

    /// [`QMatrix::new`] with the layout chosen by the caller (falling back to
    /// row-major where the layout does not fit this CPU or shape).
    #[doc(hidden)]
    pub fn with_layout(
        kind: QKind,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        layout: Layout,
    ) -> Result<Self, LayoutError> {
        let block = kind.block_values();
        if !cols.is_multiple_of(block) {
            return Err(LayoutError::Columns { kind, cols, block });
        }
        let expected = rows * (cols / block) * kind.block_bytes();
        if data.len() != expected {
            return Err(LayoutError::Size {
                kind,
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        // The widest tile layout this CPU's kernels read for this kind (the
        // AVX2 one also serves K-quants on AVX-512 CPUs); only the int8
        // kernels read tiles.
        // The table-lookup types (MXFP4, IQ4_NL, IQ4_XS) have no tiles yet:
        // their row-major blocks run on every level.
        let candidates: &[Tiling] = match layout {
            _ if kind.is_lookup() => &[],
            Layout::Widest => &[Tiling::Vnni16, Tiling::Avx2x8],
            Layout::Avx2Tiles => &[Tiling::Avx2x8],
            Layout::RowMajor => &[],
        };
        let tiling = candidates
            .iter()
            .copied()
            .find(|tiling| tiling.runs_on(level()) && rows.is_multiple_of(tiling.rows()));
        let data = match tiling {
            Some(tiling) => tiling.repack(kind, rows, cols, &data),
            None => data,
        };
        Ok(Self {
            kind,
            rows,
            cols,
            tiling,
            data,
        })
    }

    /// The layout's name, for benchmark reports.
    #[doc(hidden)]
    pub fn layout_name(&self) -> &'static str {
        match self.tiling {
            Some(Tiling::Vnni16) => "vnni16",
            Some(Tiling::Avx2x8) => "avx2x8",
            None => "row-major",
        }
    }

    /// Bytes of the weights as stored (what one pass over them reads).
    #[doc(hidden)]
    pub fn stored_bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether the int8 kernel beats dequantize + f32 GEMM at every batch
    /// size; the table-lookup types always take it, with the int8
    /// activations llama.cpp's dot products for them read (Q8_0; Q8_K for
    /// IQ4_XS), so a row's result does not depend on how many rows share
    /// its step.
    pub fn int8_always(&self) -> bool {
        self.tiling.is_some() || self.kind.is_lookup()
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.kind.block_values() * self.kind.block_bytes()
    }

    fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Row `r` as f32 (embedding lookups).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if let Some(tiling) = self.tiling {
            tiling.dequantize_row(self.kind, self.cols, &self.data, r, out);
            return;
        }
        dispatch::dequantize_row(Level::Scalar, self.kind, self.row(r), out);
    }

    /// Whether the int8 kernel reads activations with one step per
    /// super-block ([`Q8Acts::quantize_for`]) instead of per 32 values:
    /// the K-quant tiles, and IQ4_XS (as ggml's IQ4_XS x Q8_K dot).
    pub(crate) fn reads_k_acts(&self) -> bool {
        (self.tiling.is_some() && self.kind.block_values() == QK_K) || self.kind == QKind::Iq4Xs
    }

    /// `out[m, rows] = x[m, cols] @ self^T` with int8 activations, quantized
    /// by [`Q8Acts::quantize_for`] with this matrix among `mats`.
    pub fn matmul_q8(&self, acts: &Q8Acts, m: usize, out: &mut [f32], parallel: bool) {
        assert_eq!(acts.blocks * QK, self.cols);
        assert!(out.len() >= m * self.rows);
        // The kernels read these with unchecked loads: bound them all here.
        if self.reads_k_acts() {
            let sb = m * self.cols / QK_K;
            assert!(acts.has_k, "activations not quantized per super-block");
            assert!(acts.kq.len() >= m * self.cols && acts.kd.len() >= sb);
            assert!(acts.ksum16.len() >= 16 * sb && acts.ksum32.len() >= 8 * sb);
        } else {
            let blocks = m * acts.blocks;
            assert!(acts.has_32, "activations not quantized per 32 values");
            assert!(acts.q.len() >= m * self.cols);
            assert!(acts.d.len() >= blocks && acts.s.len() >= blocks);
        }
        if let Some(tiling) = self.tiling {
            let ptr = OutPtr(out.as_mut_ptr());
            run_units(
                self.rows / tiling.rows(),
                m * self.rows * self.cols,
                parallel,
                |tiles| {
                    let job = TiledMatmul {
                        kind: self.kind,
                        cols: self.cols,
                        n_rows: self.rows,
                        data: &self.data,
                        acts,
                        m,
                        out: ptr.get(),
                    };
                    // SAFETY: a matrix is tiled only for the kernel of the detected
                    // level; each unit owns the output columns of its tiles; the
                    // asserts above bound acts and out.
                    unsafe { dispatch::matmul_tiles(tiling, &job, tiles) };
                },
            );
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
                // SAFETY: `w` holds `rt` rows of `rb` bytes, activation rows
                // i0..i0 + mt exist (asserted in matmul_q8), and `lvl` was detected.
                let job = RowTile {
                    kind: self.kind,
                    w,
                    row_bytes: rb,
                    rows: rt,
                    acts,
                    i0,
                    m: mt,
                };
                unsafe { dispatch::tile(lvl, &job, &mut vals) };
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
    pub fn matmul_f32(
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
        if let Some(tiling) = self.tiling {
            tiling.dequantize_row(self.kind, self.cols, &self.data, r, out);
            return;
        }
        dispatch::dequantize_row(level(), self.kind, self.row(r), out);
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
        super::pool::global(None).threads()
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
pub fn matmul_dense(
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
    /// Quantizes `x[m, k]` (k a multiple of 32) per block of 32 values, for
    /// every kernel but the K-quant tiles (see [`Q8Acts::quantize_for`]).
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize) {
        let nb = k / QK;
        self.blocks = nb;
        self.d.resize(m * nb, 0.0);
        self.s.resize(m * nb, 0.0);
        self.q.resize(m * k, 0);
        dispatch::quantize(&x[..m * k], &mut self.q, &mut self.d, &mut self.s);
        self.has_32 = true;
        self.has_k = false;
    }

    /// Quantizes `x[m, k]` as the int8 kernels of `mats` (all `k` columns
    /// wide) read it: per 32 values, per 256 (the K-quant tiles), or both.
    /// Only what they read is computed, so a model without K-quants pays
    /// nothing for them.
    pub fn quantize_for<'a>(
        &mut self,
        x: &[f32],
        m: usize,
        k: usize,
        mats: impl IntoIterator<Item = &'a QMatrix>,
    ) {
        let (mut per_32, mut per_256) = (false, false);
        for w in mats {
            if w.reads_k_acts() {
                per_256 = true;
            } else {
                per_32 = true;
            }
        }
        if per_32 {
            self.quantize(x, m, k);
        } else {
            self.has_32 = false;
        }
        if per_256 {
            self.quantize_k(x, m, k);
        }
    }

    /// Fills the `k*` fields: one step per 256 values (k a multiple of 256).
    pub(crate) fn quantize_k(&mut self, x: &[f32], m: usize, k: usize) {
        assert!(k.is_multiple_of(QK_K));
        self.blocks = k / QK;
        let sb = m * k / QK_K;
        self.kd.resize(sb, 0.0);
        self.kq.resize(m * k, 0);
        self.ksum16.resize(sb * 16, 0);
        self.ksum32.resize(sb * 8, 0);
        dispatch::quantize_k(
            &x[..m * k],
            &mut self.kq,
            &mut self.kd,
            &mut self.ksum16,
            &mut self.ksum32,
        );
        self.has_k = true;
    }
}

#[cfg(test)]
#[path = "matrix_tests.rs"]
mod tests;
