//! What a zinfer process can learn without loading a model: which device a
//! name means and which cores it may use ([`device`]), the host's memory
//! ([`procfs`]), a GGUF file's header and tensor table ([`gguf`]), a
//! safetensors file's ([`safetensors`]), how much
//! KV memory a model takes per cached token ([`kv_bytes_per_token`]), and
//! which architectures this build runs ([`SUPPORTED_ARCHITECTURES`]).
//!
//! The supervisor plans workers with these alone, so it links neither a
//! tensor library nor a tokenizer; the worker's model crate re-uses them.

mod architecture;
pub mod device;
pub mod gguf;
pub mod procfs;
pub mod safetensors;

use std::path::Path;

pub use architecture::{Architecture, SUPPORTED_ARCHITECTURES, UnknownArchitecture};
pub use device::{Device, DeviceError};
pub use gguf::{
    FormatError, GgmlType, GgufHeader, HeaderError, Limits, METADATA_LIMIT_ENV, MetaValue,
    TensorInfo, ValueType, parse_header, read_header, read_header_with,
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

/// Number format the CPU attention multiplies in; sums and the softmax are
/// f32 either way.
///
/// bf16 rounds queries, keys, values and softmax weights to 8 significant
/// bits, as GPU serving of bf16 models does, and runs twice the products
/// per instruction on CPUs with AVX512_BF16 (prefill of long prompts and
/// cached-prefix chunks are attention-bound). Every row of a model uses
/// the same format, so results still do not depend on batching or caching.
/// It lives here, beside [`KvDtype`], so that a worker's configuration
/// (`zinfer_supervisor::WorkerConfig`) names it without linking the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionDtype {
    /// bf16 where the CPU has AVX512_BF16, else f32.
    #[default]
    Auto,
    /// f32 products.
    F32,
    /// bf16 products; the model does not load on a CPU without AVX512_BF16.
    Bf16,
}

/// An `--attention-dtype` that is not `auto`, `f32` or `bf16`.
#[derive(Debug, thiserror::Error)]
#[error("unknown attention dtype `{0}`: use auto, f32 or bf16")]
pub struct UnknownAttentionDtype(pub String);

impl std::str::FromStr for AttentionDtype {
    type Err = UnknownAttentionDtype;

    fn from_str(s: &str) -> Result<Self, UnknownAttentionDtype> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            other => Err(UnknownAttentionDtype(other.to_string())),
        }
    }
}

impl std::fmt::Display for AttentionDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

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
        let key_dim = match header.arch_usize("attention.key_length") {
            Some(width) => width,
            None => need("embedding_length")? / heads.max(1),
        };
        if let Some(shape) = per_layer_kv(header, layers, heads, key_dim)? {
            return Ok(shape);
        }
        let layers = attention_layers(header, layers);
        let kv_heads = header
            .arch_usize("attention.head_count_kv")
            .unwrap_or(heads);
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

/// The pool of a file whose layers differ (Gemma 4): KV heads per layer
/// (`attention.head_count_kv` as an array), sliding layers
/// (`attention.sliding_window_pattern` as an array) with heads
/// `attention.key_length_swa` wide, the last `attention.shared_kv_layers`
/// layers keeping no KV of their own. Described as one layer whose row is
/// every owning layer's row end to end, as the loaded model describes it;
/// `None` when every layer is alike (the plain shape).
/// How many of `layers` keep K and V rows: a hybrid file's (qwen35,
/// qwen35moe) Gated DeltaNet layers keep a state per sequence instead,
/// flagged by `attention.recurrent_layers` or, without it, every layer but
/// each `full_attention_interval`-th (4 by default), as llama.cpp reads them.
fn attention_layers(header: &GgufHeader, layers: usize) -> usize {
    let arch = header.architecture().unwrap_or_default();
    if !matches!(arch, "qwen35" | "qwen35moe") {
        return layers;
    }
    if let Ok(Some(flags)) = header.bools(&format!("{arch}.attention.recurrent_layers")) {
        return flags.iter().filter(|&&recurrent| !recurrent).count();
    }
    let interval = header
        .arch_usize("full_attention_interval")
        .unwrap_or(4)
        .max(1);
    layers / interval
}

fn per_layer_kv(
    header: &GgufHeader,
    layers: usize,
    heads: usize,
    key_dim: usize,
) -> Result<Option<KvShape>, ShapeError> {
    let arch = header.architecture().unwrap_or_default();
    let kv_array = header
        .ints(&format!("{arch}.attention.head_count_kv"))
        .ok()
        .flatten();
    let sliding = header
        .bools(&format!("{arch}.attention.sliding_window_pattern"))
        .ok()
        .flatten()
        .unwrap_or_default();
    let swa_dim = header
        .arch_usize("attention.key_length_swa")
        .unwrap_or(key_dim);
    let shared = header.arch_usize("attention.shared_kv_layers").unwrap_or(0);
    let kv_default = header
        .arch_usize("attention.head_count_kv")
        .unwrap_or(heads);
    let kv_array = kv_array.unwrap_or_default();
    let bad = || ShapeError::Missing("attention.head_count_kv");
    // Layers past both arrays are global, with the default count: only the
    // arrays' layers are walked, whatever `block_count` claims.
    let layer = |l: usize| -> Result<(usize, usize), ShapeError> {
        let kv = match kv_array.get(l) {
            Some(&n) => usize::try_from(n).map_err(|_| bad())?,
            None => kv_default,
        };
        let width = if sliding.get(l) == Some(&true) {
            swa_dim
        } else {
            key_dim
        };
        Ok((kv, width))
    };
    let known = kv_array.len().max(sliding.len()).min(layers);
    let rest = layer(usize::MAX)?;
    let own = layers.saturating_sub(shared);
    let mut alike = layers == known || known == 0 || layer(0)? == rest;
    let mut width = 0usize;
    for l in 0..known {
        let (kv, w) = layer(l)?;
        alike &= (kv, w) == layer(0)?;
        if l < own {
            width = width
                .checked_add(kv.checked_mul(w).ok_or_else(bad)?)
                .ok_or_else(bad)?;
        }
    }
    if own == layers && alike {
        // As the plain reading, with the array's count where there is one.
        let (kv, w) = if known > 0 { layer(0)? } else { rest };
        return Ok((!kv_array.is_empty()).then_some(KvShape {
            layers,
            kv_heads: kv,
            key_dim: w,
            value_dim: w,
        }));
    }
    let tail = own.saturating_sub(known);
    width = tail
        .checked_mul(rest.0.checked_mul(rest.1).ok_or_else(bad)?)
        .and_then(|t| t.checked_add(width))
        .ok_or_else(bad)?;
    Ok(Some(KvShape {
        layers: 1,
        kv_heads: 1,
        key_dim: width,
        value_dim: width,
    }))
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
