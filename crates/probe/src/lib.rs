//! What a zinfer process can learn without loading a model: which device a
//! name means and which cores it may use ([`device`]), the host's memory
//! ([`procfs`]), a GGUF file's header and tensor table ([`gguf`]), a
//! safetensors file's ([`safetensors`]), how much
//! KV memory a model takes per cached token ([`kv_bytes_per_token`]), and
//! which architectures this build runs ([`SUPPORTED_ARCHITECTURES`]).
//!
//! The supervisor plans workers with these alone, so it links neither a
//! tensor library nor a tokenizer; the worker's model crate re-uses them.

pub mod device;
pub mod gguf;
pub mod procfs;
pub mod safetensors;

use std::path::Path;

pub use device::{Device, DeviceError};
pub use gguf::{
    FormatError, GgmlType, GgufHeader, HeaderError, MetaValue, TensorInfo, ValueType, read_header,
};
pub use safetensors::{
    SafetensorsError, SafetensorsHeader, SafetensorsTensor, read_safetensors_header,
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

/// A `--kv-dtype` that is neither `f32` nor `f16`.
#[derive(Debug, thiserror::Error)]
#[error("unknown KV dtype `{0}`: use f32 or f16")]
pub struct UnknownKvDtype(pub String);

impl std::str::FromStr for KvDtype {
    type Err = UnknownKvDtype;

    fn from_str(s: &str) -> Result<Self, UnknownKvDtype> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            other => Err(UnknownKvDtype(other.to_string())),
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

/// A model family this build's loader runs: the one list of them, kept
/// here (the lowest crate) so that `zinfer model inspect`, the supervisor,
/// the loader's table and the synthetic generator read the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, TinyLlama, Mistral.
    Llama,
    /// Qwen2 and Qwen2.5: llama with Q/K/V biases.
    Qwen2,
    /// Qwen3: llama with per-head RMSNorm of Q and K, and a head width of its own.
    Qwen3,
    /// Phi-3: fused QKV and gate|up matrices.
    Phi3,
    /// Gemma 2: norms after attention and MLP too, GELU, soft-capped
    /// logits, every other layer sliding-window.
    Gemma2,
    /// Gemma 3: Gemma 2 with Q/K norms instead of attention soft-capping,
    /// five sliding-window layers to one global.
    Gemma3,
}

impl Architecture {
    /// Every architecture, in the order `--help` and errors list them.
    pub const ALL: [Self; 6] = [
        Self::Llama,
        Self::Qwen2,
        Self::Qwen3,
        Self::Phi3,
        Self::Gemma2,
        Self::Gemma3,
    ];

    /// GGUF `general.architecture`, and the prefix of the model's metadata
    /// keys (`qwen2.block_count`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
        }
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `general.architecture` this build does not run.
#[derive(Debug, thiserror::Error)]
#[error("unknown architecture `{0}`")]
pub struct UnknownArchitecture(pub String);

impl std::str::FromStr for Architecture {
    type Err = UnknownArchitecture;

    fn from_str(s: &str) -> Result<Self, UnknownArchitecture> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownArchitecture(s.to_string()))
    }
}

/// [`Architecture::ALL`]'s names.
const ARCHITECTURE_NAMES: [&str; Architecture::ALL.len()] = {
    let mut names = [""; Architecture::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Architecture::ALL[i].name();
        i += 1;
    }
    names
};

/// The names (GGUF `general.architecture`) of the architectures this
/// build's loader runs, in [`Architecture::ALL`]'s order.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &ARCHITECTURE_NAMES;

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

/// The dimensions of a model's KV cache: what sizes it for memory budgets
/// (from a header, before any model is loaded) and what a cache transfer
/// between workers must agree on (from a loaded model).
///
/// Transferred K/V is f32 and layer-major: for each layer, the K rows of
/// every slot, then the V rows of every slot, each row
/// [`KvShape::kv_dim`] wide (`[layer][k|v][slot][kv_dim]`), which needs
/// `key_dim == value_dim` (the loader runs no other model). The default,
/// all zeros, is a model that cannot transfer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvShape {
    /// Transformer blocks, each with its own K and V rows.
    pub layers: usize,
    /// K/V heads per layer (fewer than query heads under grouped-query
    /// attention).
    pub kv_heads: usize,
    /// Width of one K head.
    pub key_dim: usize,
    /// Width of one V head.
    pub value_dim: usize,
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
            layers,
            kv_heads,
            key_dim,
            value_dim,
        })
    }

    /// Width of one transferred K (or V) row: KV heads times head width.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads.saturating_mul(self.key_dim)
    }

    /// f32 values one slot takes in a transfer, across every layer, K and V.
    pub fn floats_per_slot(&self) -> usize {
        self.layers.saturating_mul(2).saturating_mul(self.kv_dim())
    }

    /// f32 values `slots` slots take in a transfer; None if that overflows.
    pub fn floats_for(&self, slots: usize) -> Option<usize> {
        slots.checked_mul(self.floats_per_slot())
    }

    /// K/V bytes one cached token takes: a K and a V row per layer in
    /// `dtype`.
    pub fn bytes_per_token(&self, dtype: KvDtype) -> Result<u64, ShapeError> {
        let wide = |n: usize| n as u64;
        wide(self.key_dim)
            .checked_add(wide(self.value_dim))
            .and_then(|width| width.checked_mul(wide(self.kv_heads)))
            .and_then(|n| n.checked_mul(wide(self.layers)))
            .and_then(|n| n.checked_mul(wide(dtype.bytes())))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_names_parse_back() {
        assert_eq!(
            SUPPORTED_ARCHITECTURES,
            ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"]
        );
        for a in Architecture::ALL {
            assert_eq!(a.name().parse::<Architecture>().ok(), Some(a));
            assert_eq!(a.to_string(), a.name());
        }
        let err = "mamba".parse::<Architecture>().unwrap_err();
        assert_eq!(err.to_string(), "unknown architecture `mamba`");
    }
}
