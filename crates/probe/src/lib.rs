//! What a zinfer process can learn without loading a model: which device a
//! name means and which cores it may use ([`device`]), the host's memory
//! ([`procfs`]), a GGUF file's header and tensor table ([`gguf`]), how much
//! KV memory a model takes per cached token ([`kv_bytes_per_token`]), and
//! which architectures this build runs ([`SUPPORTED_ARCHITECTURES`]).
//!
//! The supervisor plans workers with these alone, so it links neither a
//! tensor library nor a tokenizer; the worker's model crate re-uses them.

pub mod device;
pub mod gguf;
pub mod procfs;

use std::path::Path;

pub use device::{Device, DeviceError};
pub use gguf::{
    FormatError, GgmlType, GgufHeader, HeaderError, MetaValue, TensorInfo, ValueType, read_header,
};

/// How the CPU backend stores K/V rows in its pool.
///
/// f16 halves the bytes per cached token (twice the tokens in the same
/// memory) at the cost of rounding K and V to 11 significant bits; scores
/// and sums stay f32. Transfers between workers always carry f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// 4 bytes per value: exactly what the projections produced.
    #[default]
    F32,
    /// 2 bytes per value (IEEE half precision).
    F16,
}

impl KvDtype {
    /// Bytes one stored K or V value takes.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            other => Err(format!("unknown KV dtype `{other}`: use f32 or f16")),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        })
    }
}

/// Architectures (GGUF `general.architecture`, Hugging Face `model_type`)
/// this build's loader runs, kept here so that `zinfer model inspect` and
/// the loader share one list.
pub const SUPPORTED_ARCHITECTURES: &[&str] =
    &["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"];

/// Why a model's KV shape is not known.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// A dimension the estimate needs is not in the metadata.
    #[error("GGUF metadata has no usable `{{arch}}.{0}`")]
    Missing(&'static str),
    /// The declared dimensions multiply past 64 bits: not a real model.
    #[error("the KV dimensions ({0:?}) are too large")]
    Overflow(KvShape),
}

/// The dimensions that size a model's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Transformer blocks, each with its own K and V rows.
    pub layers: u64,
    /// K/V heads per layer (fewer than query heads under grouped-query
    /// attention).
    pub kv_heads: u64,
    /// Width of one K head.
    pub key_dim: u64,
    /// Width of one V head.
    pub value_dim: u64,
}

impl KvShape {
    /// The shape a GGUF header declares. Head widths come from
    /// `{arch}.attention.key_length` and `value_length` where the file gives
    /// them (Qwen3 and Gemma heads are not `embedding_length / head_count`
    /// wide), else `embedding_length / head_count`.
    pub fn from_header(header: &GgufHeader) -> Result<Self, ShapeError> {
        let need = |key: &'static str| header.arch_usize(key).ok_or(ShapeError::Missing(key));
        let layers = need("block_count")?;
        let heads = need("attention.head_count")?;
        let kv_heads = header
            .arch_usize("attention.head_count_kv")
            .unwrap_or(heads);
        let key_dim = match header.arch_usize("attention.key_length") {
            Some(width) => width,
            None => need("embedding_length")? / heads.max(1),
        };
        let value_dim = header
            .arch_usize("attention.value_length")
            .unwrap_or(key_dim);
        Ok(Self {
            layers: layers as u64,
            kv_heads: kv_heads as u64,
            key_dim: key_dim as u64,
            value_dim: value_dim as u64,
        })
    }

    /// K/V bytes one cached token takes: a K and a V row per layer in
    /// `dtype`.
    pub fn bytes_per_token(&self, dtype: KvDtype) -> Result<u64, ShapeError> {
        self.key_dim
            .checked_add(self.value_dim)
            .and_then(|width| width.checked_mul(self.kv_heads))
            .and_then(|n| n.checked_mul(self.layers))
            .and_then(|n| n.checked_mul(dtype.bytes() as u64))
            .ok_or(ShapeError::Overflow(*self))
    }
}

/// K/V bytes one cached token takes in the CPU backend's pool (a K and a V
/// row per layer in `dtype`), read from a GGUF header without loading
/// weights; for memory budgets. Safetensors directories are not read (an
/// error). See [`KvShape::from_header`] for where the widths come from.
pub fn kv_bytes_per_token(path: &Path, dtype: KvDtype) -> Result<u64, HeaderError> {
    if path.is_dir() {
        return Err(HeaderError::NotGguf {
            path: path.to_path_buf(),
        });
    }
    let header = read_header(path)?;
    KvShape::from_header(&header)
        .and_then(|shape| shape.bytes_per_token(dtype))
        .map_err(|reason| HeaderError::Shape {
            path: path.to_path_buf(),
            reason,
        })
}

/// The name a worker reports to the router for a model path: the file or
/// directory stem.
pub fn model_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string())
}
