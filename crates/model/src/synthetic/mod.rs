//! Synthetic llama checkpoints: GGUF files with the shapes of real models,
//! seeded random weights and any quantization.
//!
//! Only one small real model can be downloaded here, yet how the engine
//! scales with model size, and how it compares with llama.cpp, depend on
//! shapes and quant types, not on the weights' values. A synthetic file uses
//! the tensor names, metadata keys and tokenizer metadata of a converted
//! checkpoint, so zinfer's loader and llama.cpp's tools (`llama-bench`) both
//! load it and can be timed side by side on the same bytes.
//!
//! Weights are generated, quantized and written in chunks of rows, one
//! tensor after another, so memory stays at a few MB whatever the model size
//! (candle's `gguf_file::write` needs every tensor in memory at once, which
//! for a 1B model in f32 is over 4 GB; hence the small writer here).

mod shape;
mod vocab;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value;

pub use shape::{Llama3RopeScaling, Quant, SynthShape, fallback, use_more_bits};
pub use vocab::tokenizer_metadata;
use writer::{ALIGNMENT, write_gguf};

/// Names accepted by [`SynthShape::preset`].
pub const PRESETS: &[&str] = &[
    "smollm2-135m",
    "smollm2-360m",
    "tinyllama-1.1b",
    "llama-3.2-1b",
];

/// Names accepted by [`Quant::from_str`].
pub const QUANTS: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m",
];

/// Standard deviation of the random weights: that of a freshly initialised
/// llama, small enough that activations stay finite through every layer.
pub const WEIGHT_STD: f32 = 0.02;

/// Why a synthetic checkpoint could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The shape name is not a preset.
    #[error("unknown shape `{0}`; presets: {list}", list = PRESETS.join(", "))]
    UnknownShape(String),
    /// The quant name is not supported.
    #[error("unknown quant type `{0}`; use one of: {list}", list = QUANTS.join(", "))]
    UnknownQuant(String),
    /// The shape's dimensions do not fit together.
    #[error("invalid shape: {0}")]
    InvalidShape(String),
    /// The tokenizer source lacks what a llama GGUF needs.
    #[error("tokenizer metadata: {0}")]
    Tokenizer(String),
    /// Writing the file failed.
    #[error("writing GGUF: {0}")]
    Io(#[from] std::io::Error),
    /// Quantizing a tensor failed.
    #[error("quantizing: {0}")]
    Candle(#[from] candle_core::Error),
    /// A generating thread panicked (a bug).
    #[error("a thread generating weights panicked")]
    Panicked,
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    /// Architecture numbers.
    pub shape: SynthShape,
    /// Storage types.
    pub quant: Quant,
    /// Seeds every tensor's values (each tensor from its own stream, so a
    /// tensor's values do not depend on the others).
    pub seed: u64,
    /// Threads generating and quantizing (1 or more; the file is the same
    /// for any count). K-quants are slow to quantize: a 1B model takes
    /// about a minute on one core.
    pub threads: usize,
}

/// Reported after each tensor is written.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    /// Checkpoint name of the tensor just written.
    pub tensor: &'a str,
    /// Its stored type.
    pub dtype: GgmlDType,
    /// Its block, if it belongs to one.
    pub layer: Option<usize>,
    /// Whether it was the last tensor of its block.
    pub end_of_layer: bool,
    /// Bytes of tensor data written so far.
    pub bytes_done: u64,
    /// Bytes of tensor data in the whole file.
    pub bytes_total: u64,
}

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// File size in bytes.
    pub file_bytes: u64,
    /// Tensors per stored type (e.g. `"Q4K" -> 154`), for the report.
    pub tensor_types: BTreeMap<String, usize>,
}

/// Writes a synthetic checkpoint to `out`, with the tokenizer metadata of
/// `tokenizer_src` (another GGUF's metadata) fitted to the shape's vocabulary
/// (see [`tokenizer_metadata`]). The file appears under its name only when
/// complete: it is written beside it first and renamed.
pub fn generate(
    out: &Path,
    spec: &SynthSpec,
    tokenizer_src: &HashMap<String, Value>,
    mut progress: impl FnMut(&Progress<'_>),
) -> Result<Summary, SynthError> {
    spec.shape.validate()?;
    let tensors = shape::plan(&spec.shape, spec.quant);
    let mut metadata = model_metadata(&spec.shape, spec.quant);
    metadata.extend(tokenizer_metadata(tokenizer_src, spec.shape.vocab)?);
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let result = File::create(&partial)
        .map_err(SynthError::from)
        .and_then(|f| {
            let mut w = BufWriter::with_capacity(1 << 20, f);
            write_gguf(
                &mut w,
                &metadata,
                &tensors,
                spec.seed,
                spec.threads,
                &mut progress,
            )?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok(())
        });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, out)?;
    let mut tensor_types = BTreeMap::new();
    for t in &tensors {
        *tensor_types.entry(format!("{:?}", t.dtype)).or_insert(0) += 1;
    }
    Ok(Summary {
        file_bytes: std::fs::metadata(out)?.len(),
        tensor_types,
    })
}

/// The `general.*` and `llama.*` keys llama.cpp and zinfer's loader read,
/// with the integer widths llama.cpp checks (u32).
fn model_metadata(shape: &SynthShape, quant: Quant) -> Vec<(String, Value)> {
    let u = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    let kv = |k: &str, v: Value| (k.to_string(), v);
    vec![
        kv("general.architecture", Value::String("llama".into())),
        kv(
            "general.name",
            Value::String(format!("synthetic {}", shape.name)),
        ),
        kv("general.file_type", Value::U32(quant.file_type())),
        kv("general.quantization_version", Value::U32(2)),
        kv("general.alignment", Value::U32(ALIGNMENT as u32)),
        kv("llama.block_count", u(shape.n_layers)),
        kv("llama.context_length", u(shape.context)),
        kv("llama.embedding_length", u(shape.hidden)),
        kv("llama.feed_forward_length", u(shape.ffn)),
        kv("llama.attention.head_count", u(shape.n_heads)),
        kv("llama.attention.head_count_kv", u(shape.n_kv_heads)),
        kv("llama.attention.key_length", u(shape.head_dim())),
        kv("llama.attention.value_length", u(shape.head_dim())),
        kv("llama.rope.freq_base", Value::F32(shape.rope_theta)),
        kv("llama.rope.dimension_count", u(shape.head_dim())),
        kv(
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(shape.rms_eps),
        ),
        kv("llama.vocab_size", u(shape.vocab)),
    ]
}
