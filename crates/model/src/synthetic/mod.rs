//! Synthetic checkpoints: GGUF files with the shapes of real models (llama,
//! Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, Phi-3, Gemma 2, Gemma 3, gpt-oss), seeded random weights and any
//! quantization.
//!
//! Only one small real model can be downloaded here, yet how the engine
//! scales with model size, and how it compares with llama.cpp, depend on
//! shapes and quant types, not on the weights' values. A synthetic file uses
//! the tensor names, metadata keys and tokenizer metadata of a checkpoint
//! converted by llama.cpp's `convert_hf_to_gguf.py`, so zinfer's loader,
//! candle-transformers' quantized models and llama.cpp's tools
//! (`llama-bench`) all load it and can be compared on the same bytes. The
//! tiny presets (`*-tiny`) exercise each architecture's features (biases,
//! Q/K norms, fused matrices, sliding windows, soft-caps) in tests.
//!
//! Weights are generated, quantized and written in chunks of rows, one
//! tensor after another, so memory stays at a few MB whatever the model size
//! (candle's `gguf_file::write` needs every tensor in memory at once, which
//! for a 1B model in f32 is over 4 GB; hence the small writer here).

mod gemma4;
mod shape;
mod vocab;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;

pub use gemma4::SynthGemma4;
pub use shape::{
    KernelType, Llama3RopeScaling, LongRope, Quant, SynthHybrid, SynthMoe, SynthShape, fallback,
    use_more_bits,
};
pub use vocab::tokenizer_metadata;
use writer::{ALIGNMENT, write_gguf};
pub use zinfer_probe::Architecture;

/// Names accepted by [`SynthShape::preset`].
pub const PRESETS: &[&str] = &[
    "smollm2-135m",
    "smollm2-360m",
    "tinyllama-1.1b",
    "llama-3.2-1b",
    "qwen2.5-1.5b",
    "qwen3-1.7b",
    "qwen3-30b-a3b",
    "gpt-oss-20b",
    "phi-3-mini",
    "phi-3-mini-128k",
    "gemma-2-2b",
    "gemma-3-1b",
    "llama-swa-tiny",
    "qwen2-tiny",
    "qwen2moe-tiny",
    "qwen3-tiny",
    "qwen3-yarn-tiny",
    "qwen3moe-tiny",
    "qwen3moe-mini",
    "phi3-tiny",
    "gemma2-tiny",
    "gemma3-tiny",
    "gemma4-tiny",
    "gemma4-moe-tiny",
    "gpt-oss-tiny",
    "qwen35-tiny",
    "qwen35moe-tiny",
];

/// The tiny presets, one per architecture (with 16-token sliding windows
/// where the architecture has them), for tests; not the hybrid ones
/// ([`hybrid_tiny_presets`]), which the candle backend and a KV-only cached
/// prefix cannot run.
pub fn tiny_presets() -> impl Iterator<Item = &'static str> {
    PRESETS
        .iter()
        .copied()
        .filter(|p| p.ends_with("-tiny") && !HYBRID_TINY.contains(p))
}

/// Tiny presets of hybrid architectures (Gated DeltaNet layers), tested apart.
const HYBRID_TINY: &[&str] = &["qwen35-tiny", "qwen35moe-tiny"];

/// The tiny presets of hybrid architectures, for their own tests.
pub fn hybrid_tiny_presets() -> impl Iterator<Item = &'static str> {
    HYBRID_TINY.iter().copied()
}

/// Names [`Quant`] parses from (`"q4_k_m".parse()`).
pub const QUANTS: &[&str] = &[
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "q4_k",
    "q5_k",
    "q6_k",
    "q4_k_m",
    "q5_k_m",
    "mxfp4_experts",
    "iq4_nl_experts",
    "iq4_xs_experts",
    "iq4_nl",
    "iq4_xs",
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
    /// The tokenizer source lacks what a GGUF needs.
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
    /// Its stored type (`"Q4K"`, `"MXFP4"`).
    pub dtype: String,
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
    /// Rows of the embedding and tokens of the tokenizer, as written (see
    /// [`SynthShape::fitted_to`]).
    pub vocab: usize,
    /// Tensors per stored type (e.g. `"Q4K" -> 154`), for the report.
    pub tensor_types: BTreeMap<String, usize>,
}

/// Writes a synthetic checkpoint to `out`, with the tokenizer metadata of
/// `tokenizer_src` (another GGUF's metadata) fitted to the shape's vocabulary
/// (see [`SynthShape::fitted_to`] and [`tokenizer_metadata`]). The file
/// appears under its name only when complete: it is written beside it first
/// and renamed.
pub fn generate(
    out: &Path,
    spec: &SynthSpec,
    tokenizer_src: &HashMap<String, Value>,
    progress: impl FnMut(&Progress<'_>),
) -> Result<Summary, SynthError> {
    generate_with(out, spec, tokenizer_src, None, progress)
}

/// A reranker's additions to a synthetic checkpoint, as llama.cpp's
/// converter writes Qwen3-Reranker: `{arch}.pooling_type` = rank,
/// `{arch}.classifier.output_labels` = yes, no, and a `cls.output.weight`
/// of two rows.
#[derive(Clone, Debug, Default)]
pub struct Rerank {
    /// `tokenizer.chat_template.rerank`, with `{query}` and `{document}`
    /// where llama-server puts them; None leaves the file without one.
    pub template: Option<String>,
}

/// [`generate`] for a reranker: the same checkpoint plus the head and
/// metadata of `rerank`. The head's rows are spread wider than the other
/// weights ([`CLS_STD`]) so that documents' scores differ clearly.
pub fn generate_reranker(
    out: &Path,
    spec: &SynthSpec,
    tokenizer_src: &HashMap<String, Value>,
    rerank: &Rerank,
    progress: impl FnMut(&Progress<'_>),
) -> Result<Summary, SynthError> {
    generate_with(out, spec, tokenizer_src, Some(rerank), progress)
}

/// Standard deviation of a synthetic reranker's `cls.output` rows.
pub const CLS_STD: f32 = 0.25;

fn generate_with(
    out: &Path,
    spec: &SynthSpec,
    tokenizer_src: &HashMap<String, Value>,
    rerank: Option<&Rerank>,
    mut progress: impl FnMut(&Progress<'_>),
) -> Result<Summary, SynthError> {
    let shape = spec.shape.fitted_to(tokenizer_src)?;
    shape.validate()?;
    if let (Quant::Experts(k), None) = (spec.quant, shape.moe) {
        return Err(SynthError::InvalidShape(format!(
            "{}: {}_experts stores experts, and this shape has none",
            shape.name,
            k.name().to_ascii_lowercase()
        )));
    }
    let mut tensors = shape::plan(&shape, spec.quant);
    let mut metadata = model_metadata(&shape, spec.quant);
    metadata.extend(tokenizer_metadata(tokenizer_src, shape.vocab)?);
    if let Some(r) = rerank {
        let arch = shape.arch;
        metadata.push((format!("{arch}.pooling_type"), Value::U32(4)));
        metadata.push((
            format!("{arch}.classifier.output_labels"),
            Value::Array(vec![
                Value::String("yes".into()),
                Value::String("no".into()),
            ]),
        ));
        if let Some(t) = &r.template {
            metadata.push((
                "tokenizer.chat_template.rerank".into(),
                Value::String(t.clone()),
            ));
        }
        tensors.push(shape::cls_output(shape.hidden, spec.seed));
    }
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
        *tensor_types.entry(t.type_name()).or_insert(0) += 1;
    }
    Ok(Summary {
        file_bytes: std::fs::metadata(out)?.len(),
        vocab: shape.vocab,
        tensor_types,
    })
}

/// The `general.*` keys and the architecture's own (`qwen2.block_count`,
/// ...), with the integer widths llama.cpp checks (u32): those its
/// converter writes for the architecture, plus each option the shape sets.
fn model_metadata(shape: &SynthShape, quant: Quant) -> Vec<(String, Value)> {
    let u = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    let arch = shape.arch;
    let general = |key: &str, v: Value| (format!("general.{key}"), v);
    let mut out = vec![
        general("architecture", Value::String(arch.name().into())),
        general("name", Value::String(format!("synthetic {}", shape.name))),
        general("file_type", Value::U32(quant.file_type())),
        general("quantization_version", Value::U32(2)),
        general("alignment", Value::U32(ALIGNMENT as u32)),
    ];
    let mut kv = |key: &str, v: Value| out.push((format!("{arch}.{key}"), v));
    kv("block_count", u(shape.n_layers));
    kv("context_length", u(shape.context));
    kv("embedding_length", u(shape.hidden));
    if !shape.gemma4.is_some_and(|g| g.double_wide_shared) {
        kv("feed_forward_length", u(shape.ffn));
    }
    kv("attention.head_count", u(shape.n_heads));
    if shape.gemma4.is_none() {
        kv("attention.head_count_kv", u(shape.n_kv_heads));
    }
    // The converter writes head widths where config.json names one (Qwen3,
    // Gemma), and this generator always has for llama; without them
    // llama.cpp takes hidden / heads.
    if matches!(
        arch,
        Architecture::Llama
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            | Architecture::Gemma2
            | Architecture::Gemma3
            | Architecture::Gemma4
            | Architecture::GptOss
            | Architecture::Qwen35
            | Architecture::Qwen35Moe
    ) || shape.q_dim() != shape.hidden
    {
        kv("attention.key_length", u(shape.head_dim));
        kv("attention.value_length", u(shape.head_dim));
    }
    kv("rope.freq_base", Value::F32(shape.rope_theta));
    if let Some(theta) = shape.rope_theta_swa {
        kv("rope.freq_base_swa", Value::F32(theta));
    }
    if matches!(arch, Architecture::Llama | Architecture::Phi3) {
        kv("rope.dimension_count", u(shape.head_dim));
    }
    if let Some(factor) = shape.yarn_factor {
        kv("rope.scaling.type", Value::String("yarn".into()));
        kv("rope.scaling.factor", Value::F32(factor));
    }
    if let Some(n) = shape.rope_original_context {
        kv("rope.scaling.original_context_length", u(n));
    }
    if let Some(f) = shape.long_rope_attn_factor() {
        kv("rope.scaling.attn_factor", Value::F32(f));
    }
    kv(
        "attention.layer_norm_rms_epsilon",
        Value::F32(shape.rms_eps),
    );
    if let Some(w) = shape.sliding_window {
        kv("attention.sliding_window", u(w));
    }
    if let Some(cap) = shape.attn_softcap {
        kv("attn_logit_softcapping", Value::F32(cap));
    }
    if let Some(cap) = shape.final_softcap {
        kv("final_logit_softcapping", Value::F32(cap));
    }
    if let Some(moe) = shape.moe {
        kv("expert_count", u(moe.experts));
        kv("expert_used_count", u(moe.used));
        kv("expert_feed_forward_length", u(moe.expert_ffn));
        if let Some(sf) = moe.shared_ffn {
            kv("expert_shared_feed_forward_length", u(sf));
        }
    }
    if let Some(hy) = shape.hybrid {
        kv("rope.dimension_count", u(hy.rope_dims));
        let sections = hy.sections.iter().map(|&s| Value::I32(s as i32)).collect();
        kv("rope.dimension_sections", Value::Array(sections));
        kv("full_attention_interval", u(hy.interval));
        kv("ssm.conv_kernel", u(hy.conv_kernel));
        kv("ssm.state_size", u(hy.head_dim));
        kv("ssm.group_count", u(hy.k_heads));
        kv("ssm.time_step_rank", u(hy.v_heads));
        kv("ssm.inner_size", u(hy.v_heads * hy.head_dim));
    }
    if arch == Architecture::Llama {
        kv("vocab_size", u(shape.vocab));
    }
    if let Some(g) = &shape.gemma4 {
        g.metadata(shape, &mut kv);
    }
    out
}
