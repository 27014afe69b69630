//! Weight matrices and the matmuls over them.
//!
//! Quantized weights stay quantized (candle's vec-dot kernels); types that
//! candle only has a scalar fallback for (Q4_1, Q5_0, Q5_1) are requantized
//! to Q8_0 once at load, which keeps memory near the file size and runs on
//! candle's AVX kernels. Float weights become dense f32 matrices.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};

use super::ModelError;

/// A `[out, in]` weight matrix applied as `x @ W^T`.
#[derive(Debug)]
pub(crate) enum Linear {
    /// Quantized rows, multiplied by candle's quantized matmul.
    Quant(QMatMul),
    /// Dense f32 rows.
    Dense(Tensor),
}

impl Linear {
    /// Wraps a checkpoint tensor, requantizing types without a fast kernel.
    pub(crate) fn from_qtensor(name: &str, qt: QTensor) -> Result<Self, ModelError> {
        let qt = fast_quant(name, qt)?;
        Self::from_arc(Arc::new(qt))
    }

    /// Wraps a tensor that may also be used elsewhere (a tied embedding).
    pub(crate) fn from_arc(qt: Arc<QTensor>) -> Result<Self, ModelError> {
        match qt.dtype() {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => Ok(Self::Dense(
                qt.dequantize(&qt.device())?.to_dtype(DType::F32)?,
            )),
            _ => Ok(Self::Quant(QMatMul::from_arc(qt)?)),
        }
    }

    /// Wraps a dense `[out, in]` matrix.
    pub(crate) fn from_dense(w: Tensor) -> Result<Self, ModelError> {
        Ok(Self::Dense(w.to_dtype(DType::F32)?.contiguous()?))
    }

    /// `x: [n, in]` (f32, contiguous) -> `[n, out]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        Ok(match self {
            Self::Quant(m) => m.forward(x)?,
            Self::Dense(w) => x.matmul(&w.t()?)?,
        })
    }
}

/// Whether candle has a SIMD kernel for this weight type (floats become dense f32).
pub(crate) fn has_fast_kernel(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::F32
            | GgmlDType::F16
            | GgmlDType::BF16
            | GgmlDType::Q4_0
            | GgmlDType::Q8_0
            | GgmlDType::Q2K
            | GgmlDType::Q3K
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K
    )
}

/// The tensor as it is kept for matmuls: as stored when candle has a SIMD
/// kernel for its type, requantized to Q8_0 when it is Q4_1, Q5_0 or Q5_1.
pub(crate) fn fast_quant(name: &str, qt: QTensor) -> Result<QTensor, ModelError> {
    match qt.dtype() {
        d if has_fast_kernel(d) => Ok(qt),
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 => requantize(&qt),
        other => Err(ModelError::UnsupportedQuant {
            tensor: name.to_string(),
            dtype: format!("{other:?}"),
        }),
    }
}

/// A Q8_0 copy of `qt`.
pub(crate) fn requantize(qt: &QTensor) -> Result<QTensor, ModelError> {
    let dense = qt.dequantize(&qt.device())?;
    Ok(QTensor::quantize(&dense, GgmlDType::Q8_0)?)
}
