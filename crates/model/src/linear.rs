//! Weight matrices, embedding tables and the matmuls over them.
//!
//! Q4_1, Q8_0, Q4_K, Q5_K and Q6_K weights keep their size and run on our
//! own kernels ([`super::kernels`]): int8 dot products for decode-sized
//! batches (with AVX-512 VNNI, Q4_1 and Q8_0 on 16-row tiles for every
//! batch size) and dequantize + f32 GEMM for long prefill chunks. Q5_0/Q5_1
//! are requantized to Q8_0 at load. Q4_0, Q2_K and Q3_K go through candle's
//! quantized matmul. Float weights are dense f32 (GEMM).

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use zinfer_kernels::{Q8Acts, QKind, QMatrix, matmul_dense, q5_0_as_q5_1};

use super::ModelError;

/// Batches of at least this many rows use dequantize + f32 GEMM.
const GEMM_MIN_ROWS: usize = 32;

/// Reusable buffers for matmuls, owned by the model.
#[derive(Debug)]
pub(crate) struct Workspace {
    acts: Q8Acts,
    scratch: Vec<f32>,
    /// Whether kernels split their work over the kernels' thread pool (false for one thread).
    pub(crate) parallel: bool,
}

/// A `[rows, cols]` weight matrix applied as `x @ W^T`.
#[derive(Debug)]
pub(crate) enum Linear {
    /// Q4_1 / Q8_0 / K-quant blocks on our kernels.
    Quant(Arc<QMatrix>),
    /// Other quantized types on candle's kernels.
    Candle {
        m: QMatMul,
        rows: usize,
        cols: usize,
    },
    /// Dense f32 rows.
    Dense {
        w: Arc<Vec<f32>>,
        rows: usize,
        cols: usize,
    },
}

/// Token embedding table (possibly sharing storage with a tied LM head).
#[derive(Debug)]
pub(crate) enum Embedding {
    /// Q4_1 / Q8_0 / K-quant rows, dequantized on lookup.
    Quant(Arc<QMatrix>),
    /// Other quantized types, looked up by candle.
    Candle(Arc<QTensor>),
    /// Dense f32 rows.
    Dense { w: Arc<Vec<f32>>, cols: usize },
}

impl Workspace {
    /// Buffers for a model that runs on `threads` threads (`None`: the pool's size).
    pub(crate) fn new(threads: Option<usize>) -> Self {
        let parallel = threads.unwrap_or(2) > 1;
        Self {
            acts: Q8Acts::default(),
            scratch: Vec::new(),
            parallel,
        }
    }
}

impl Linear {
    /// Wraps a checkpoint tensor in the fastest form that keeps its size.
    pub(crate) fn from_qtensor(name: &str, qt: QTensor) -> Result<Self, ModelError> {
        Self::from_arc(name, Arc::new(qt))
    }

    fn from_arc(name: &str, qt: Arc<QTensor>) -> Result<Self, ModelError> {
        let (rows, cols) = qt.shape().dims2()?;
        Ok(match qt.dtype() {
            GgmlDType::Q4_1
            | GgmlDType::Q8_0
            | GgmlDType::Q5_0
            | GgmlDType::Q5_1
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K => Self::Quant(Arc::new(qmatrix(name, &qt)?)),
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                let w = qt
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Self::Dense {
                    w: Arc::new(w),
                    rows,
                    cols,
                }
            }
            GgmlDType::Q4_0 | GgmlDType::Q2K | GgmlDType::Q3K => Self::Candle {
                m: QMatMul::from_arc(qt)?,
                rows,
                cols,
            },
            other => return Err(unsupported(name, other)),
        })
    }

    /// Wraps blocks of a type candle does not know (MXFP4, IQ4_NL, IQ4_XS)
    /// for the CPU kernels.
    pub(crate) fn kernel_only(
        name: &str,
        kind: QKind,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self, ModelError> {
        let m = QMatrix::new(kind, rows, cols, data).map_err(|source| ModelError::QuantLayout {
            tensor: name.to_string(),
            source,
        })?;
        Ok(Self::Quant(Arc::new(m)))
    }

    /// Wraps a dense `[rows, cols]` matrix.
    pub(crate) fn dense(w: &Tensor) -> Result<Self, ModelError> {
        let (rows, cols) = w.dims2()?;
        let w = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(Self::Dense {
            w: Arc::new(w),
            rows,
            cols,
        })
    }

    /// Output width.
    pub(crate) fn rows(&self) -> usize {
        match self {
            Self::Quant(q) => q.rows(),
            Self::Candle { rows, .. } | Self::Dense { rows, .. } => *rows,
        }
    }

    /// Input width.
    pub(crate) fn cols(&self) -> usize {
        match self {
            Self::Quant(q) => q.cols(),
            Self::Candle { cols, .. } | Self::Dense { cols, .. } => *cols,
        }
    }

    /// Several matrices applied to the same input (Q/K/V, gate/up): the
    /// activations are quantized once for all of them.
    pub(crate) fn forward_shared(
        lins: &[&Linear],
        outs: &mut [&mut [f32]],
        x: &[f32],
        m: usize,
        ws: &mut Workspace,
    ) -> Result<(), ModelError> {
        let mut quantized = false;
        for (lin, out) in lins.iter().zip(outs.iter_mut()) {
            match lin {
                Self::Quant(q) if q.int8_always() || m < GEMM_MIN_ROWS => {
                    if !quantized {
                        // As every matrix sharing this input reads it.
                        let mats = lins.iter().filter_map(|lin| match lin {
                            Self::Quant(q) => Some(&**q),
                            _ => None,
                        });
                        ws.acts.quantize_for(x, m, q.cols(), mats);
                        quantized = true;
                    }
                    q.matmul_q8(&ws.acts, m, out, ws.parallel);
                }
                _ => lin.forward(x, m, out, ws)?,
            }
        }
        Ok(())
    }

    /// `out[m, rows] = x[m, cols] @ W^T`.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        ws: &mut Workspace,
    ) -> Result<(), ModelError> {
        match self {
            Self::Quant(q) if m >= GEMM_MIN_ROWS && !q.int8_always() => {
                q.matmul_f32(x, m, out, &mut ws.scratch, ws.parallel)
            }
            Self::Quant(q) => {
                ws.acts.quantize_for(x, m, q.cols(), [&**q]);
                q.matmul_q8(&ws.acts, m, out, ws.parallel);
            }
            Self::Candle { m: mm, rows, cols } => {
                let xt = Tensor::from_slice(&x[..m * cols], (m, *cols), &Device::Cpu)?;
                let y = mm.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?;
                out[..m * rows].copy_from_slice(&y);
            }
            Self::Dense { w, rows, cols } => matmul_dense(w, *rows, *cols, x, m, out, ws.parallel),
        }
        Ok(())
    }
}

impl Embedding {
    /// The table and, for tied embeddings, an LM head over the same storage.
    pub(crate) fn with_tied_head(name: &str, qt: QTensor) -> Result<(Self, Linear), ModelError> {
        let head = Linear::from_qtensor(name, qt)?;
        let table = match &head {
            Linear::Quant(q) => Self::Quant(q.clone()),
            Linear::Dense { w, cols, .. } => Self::Dense {
                w: w.clone(),
                cols: *cols,
            },
            Linear::Candle {
                m: QMatMul::QTensor(t),
                ..
            } => Self::Candle(t.clone()),
            Linear::Candle { .. } => {
                return Err(ModelError::TensorLayout {
                    tensor: name.to_string(),
                    reason: "could not be used as an embedding table",
                });
            }
        };
        Ok((table, head))
    }

    /// The table of a matrix the kernels read ([`Linear::kernel_only`]).
    pub(crate) fn of_kernel_matrix(name: &str, m: &Linear) -> Result<Self, ModelError> {
        match m {
            Linear::Quant(q) => Ok(Self::Quant(q.clone())),
            _ => Err(ModelError::TensorLayout {
                tensor: name.to_string(),
                reason: "could not be used as an embedding table",
            }),
        }
    }

    /// The table alone (the checkpoint has a separate LM head).
    pub(crate) fn from_qtensor(name: &str, qt: QTensor) -> Result<Self, ModelError> {
        Ok(Self::with_tied_head(name, qt)?.0)
    }

    /// Writes row `ids[i]` of the table to `out[i]`.
    pub(crate) fn lookup(&self, ids: &[u32], out: &mut [f32]) -> Result<(), ModelError> {
        match self {
            Self::Quant(q) => {
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(q.cols())) {
                    q.dequantize_row(id as usize, row);
                }
            }
            Self::Dense { w, cols } => {
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(*cols)) {
                    let at = id as usize * cols;
                    row.copy_from_slice(&w[at..at + cols]);
                }
            }
            Self::Candle(t) => {
                let ids = Tensor::from_slice(ids, ids.len(), &Device::Cpu)?;
                let rows = t.embedding(&ids)?.flatten_all()?.to_vec1::<f32>()?;
                out[..rows.len()].copy_from_slice(&rows);
            }
        }
        Ok(())
    }
}

/// Q4_1, Q5_1, Q8_0 and the K-quants as shipped; Q5_0 as Q5_1 (min -16d).
fn qmatrix(name: &str, qt: &QTensor) -> Result<QMatrix, ModelError> {
    let (rows, cols) = qt.shape().dims2()?;
    let (kind, data) = match qt.dtype() {
        GgmlDType::Q4_1 => (QKind::Q4_1, qt.data()?.into_owned()),
        GgmlDType::Q8_0 => (QKind::Q8_0, qt.data()?.into_owned()),
        GgmlDType::Q4K => (QKind::Q4K, qt.data()?.into_owned()),
        GgmlDType::Q5K => (QKind::Q5K, qt.data()?.into_owned()),
        GgmlDType::Q6K => (QKind::Q6K, qt.data()?.into_owned()),
        GgmlDType::Q5_0 => (QKind::Q5_1, q5_0_as_q5_1(&qt.data()?)),
        GgmlDType::Q5_1 => (QKind::Q5_1, qt.data()?.into_owned()),
        other => return Err(unsupported(name, other)),
    };
    QMatrix::new(kind, rows, cols, data).map_err(|source| ModelError::QuantLayout {
        tensor: name.to_string(),
        source,
    })
}

fn unsupported(name: &str, dtype: GgmlDType) -> ModelError {
    ModelError::UnsupportedQuant {
        tensor: name.to_string(),
        dtype: format!("{dtype:?}"),
    }
}
