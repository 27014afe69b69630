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

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::str::FromStr;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

/// GGUF tensor data alignment (the format's default).
const ALIGNMENT: u64 = 32;

/// Values generated and quantized at once: bounds memory (4 MiB of f32).
const CHUNK_ELEMS: usize = 1 << 20;

/// llama.cpp's token type for vocabulary slots no text maps to.
const TOKEN_TYPE_UNUSED: i64 = 5;

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

/// Llama 3 long-context RoPE scaling (Hugging Face `rope_type: llama3`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    /// Divisor of the lowest frequencies.
    pub factor: f64,
    /// Wavelengths above `original_context / low_freq_factor` are divided by `factor`.
    pub low_freq_factor: f64,
    /// Wavelengths below `original_context / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// Context length the model was pre-trained with.
    pub original_context: usize,
}

/// The architecture numbers of a llama checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthShape {
    /// Preset name, written to `general.name`.
    pub name: String,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Inner width of the MLP.
    pub ffn: usize,
    /// Rows of the embedding (and the tokenizer's token count).
    pub vocab: usize,
    /// `llama.context_length`.
    pub context: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// No `output.weight`: the embedding doubles as the LM head.
    pub tied_embeddings: bool,
    /// Written as the `rope_freqs.weight` tensor when set.
    pub rope_scaling: Option<Llama3RopeScaling>,
}

impl SynthShape {
    /// The shape of a public checkpoint, from its Hugging Face `config.json`.
    pub fn preset(name: &str) -> Result<Self, SynthError> {
        let base = |n_layers, hidden, n_heads, n_kv_heads, ffn, vocab| Self {
            name: name.to_string(),
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            ffn,
            vocab,
            context: 8192,
            rope_theta: 100_000.0,
            rms_eps: 1e-5,
            tied_embeddings: true,
            rope_scaling: None,
        };
        Ok(match name {
            "smollm2-135m" => base(30, 576, 9, 3, 1536, 49_152),
            "smollm2-360m" => base(32, 960, 15, 5, 2560, 49_152),
            "tinyllama-1.1b" => Self {
                context: 2048,
                rope_theta: 10_000.0,
                tied_embeddings: false,
                ..base(22, 2048, 32, 4, 5632, 32_000)
            },
            "llama-3.2-1b" => Self {
                context: 131_072,
                rope_theta: 500_000.0,
                rope_scaling: Some(Llama3RopeScaling {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_context: 8192,
                }),
                ..base(16, 2048, 32, 8, 8192, 128_256)
            },
            other => return Err(SynthError::UnknownShape(other.to_string())),
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.n_heads.max(1)
    }

    /// Checks the relations a llama forward pass relies on.
    pub fn validate(&self) -> Result<(), SynthError> {
        let bad = |why: String| Err(SynthError::InvalidShape(why));
        if [self.n_layers, self.hidden, self.n_heads, self.n_kv_heads]
            .into_iter()
            .chain([self.ffn, self.vocab, self.context])
            .any(|d| d == 0)
        {
            return bad(format!("a dimension is zero: {self:?}"));
        }
        if !self.hidden.is_multiple_of(self.n_heads) || !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "hidden {} is not an even head size times {} heads",
                self.hidden, self.n_heads
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "{} heads are not a multiple of {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        Ok(())
    }

    /// Per-frequency RoPE divisors as llama.cpp's converter writes them to
    /// `rope_freqs.weight` (and as Hugging Face scales `inv_freq`): high
    /// frequencies kept, low ones divided by `factor`, a smooth blend
    /// between. None without scaling.
    pub fn rope_freq_factors(&self) -> Option<Vec<f32>> {
        let s = self.rope_scaling?;
        let dim = self.head_dim();
        let old = s.original_context as f64;
        let low_freq_wavelen = old / s.low_freq_factor;
        let high_freq_wavelen = old / s.high_freq_factor;
        let factors = (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / f64::from(self.rope_theta).powf((2 * i) as f64 / dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < high_freq_wavelen {
                    1.0
                } else if wavelen > low_freq_wavelen {
                    s.factor as f32
                } else {
                    let smooth = (old / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 / ((1.0 - smooth) / s.factor + smooth)) as f32
                }
            })
            .collect();
        Some(factors)
    }
}

/// The weights' storage types: one type for every matrix, or a mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// Every matrix in this type (as `llama-quantize --pure`), except where
    /// a row length does not fit its blocks (see [`fallback`]).
    Pure(GgmlDType),
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output matrix and for
    /// `attn_v` / `ffn_down` of the layers `use_more_bits` picks.
    Q4KM,
}

impl FromStr for Quant {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self, SynthError> {
        let t = match s.to_ascii_lowercase().as_str() {
            "f32" => GgmlDType::F32,
            "f16" => GgmlDType::F16,
            "bf16" => GgmlDType::BF16,
            "q8_0" => GgmlDType::Q8_0,
            "q4_0" => GgmlDType::Q4_0,
            "q4_1" => GgmlDType::Q4_1,
            "q5_0" => GgmlDType::Q5_0,
            "q5_1" => GgmlDType::Q5_1,
            "q4_k" => GgmlDType::Q4K,
            "q5_k" => GgmlDType::Q5K,
            "q6_k" => GgmlDType::Q6K,
            "q4_k_m" => return Ok(Self::Q4KM),
            _ => return Err(SynthError::UnknownQuant(s.to_string())),
        };
        Ok(Self::Pure(t))
    }
}

impl Quant {
    /// llama.cpp's `llama_ftype` for `general.file_type` (pure K-quants are
    /// reported as their `_S` variants, the closest llama.cpp has).
    pub fn file_type(self) -> u32 {
        match self {
            Self::Q4KM => 15,
            Self::Pure(t) => match t {
                GgmlDType::F16 => 1,
                GgmlDType::Q4_0 => 2,
                GgmlDType::Q4_1 => 3,
                GgmlDType::Q8_0 => 7,
                GgmlDType::Q5_0 => 8,
                GgmlDType::Q5_1 => 9,
                GgmlDType::Q4K => 14,
                GgmlDType::Q5K => 16,
                GgmlDType::Q6K => 18,
                GgmlDType::BF16 => 32,
                _ => 0,
            },
        }
    }

    /// The type of one weight matrix. `layer` is its block index.
    fn matrix_type(self, role: Role, layer: usize, n_layers: usize) -> GgmlDType {
        match self {
            Self::Pure(t) => t,
            Self::Q4KM => match role {
                Role::Output => GgmlDType::Q6K,
                Role::AttnV | Role::FfnDown if use_more_bits(layer, n_layers) => GgmlDType::Q6K,
                _ => GgmlDType::Q4K,
            },
        }
    }
}

/// llama.cpp's choice of layers that get more bits in the `_M` mixes: the
/// first and last eighth, and every third layer between.
pub fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    let eighth = n_layers / 8;
    layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2
}

/// The type llama.cpp's quantizer uses when a row of `cols` values does not
/// fit `t`'s blocks (576-wide SmolLM2 rows and K-quants' 256-value blocks).
pub fn fallback(t: GgmlDType, cols: usize) -> GgmlDType {
    if cols.is_multiple_of(t.block_size()) {
        return t;
    }
    let alt = match t {
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        _ => GgmlDType::F16,
    };
    if cols.is_multiple_of(alt.block_size()) {
        alt
    } else {
        GgmlDType::F16
    }
}

/// What a tensor is, for picking its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A norm weight or the RoPE factors: always f32.
    Vector,
    /// The token embedding when it is not also the LM head.
    Embedding,
    /// `output.weight`, or the tied embedding that serves as it.
    Output,
    AttnV,
    FfnDown,
    OtherMatrix,
}

/// How a tensor's values are made.
#[derive(Clone, Debug, PartialEq)]
enum Init {
    /// Uniform with standard deviation [`WEIGHT_STD`].
    Random,
    /// All ones (norm weights, so activations keep their scale).
    Ones,
    /// These values (the RoPE factors).
    Values(Vec<f32>),
}

/// One tensor of the file: checkpoint name, candle-order dims
/// (`[rows, cols]`, reversed in the file as ggml's `ne`), type, values.
#[derive(Clone, Debug)]
struct TensorSpec {
    name: String,
    rows: usize,
    cols: usize,
    dtype: GgmlDType,
    init: Init,
    layer: Option<usize>,
}

impl TensorSpec {
    fn is_vector(&self) -> bool {
        self.rows == 1
    }

    fn bytes(&self) -> u64 {
        let elems = (self.rows * self.cols) as u64;
        elems / self.dtype.block_size() as u64 * self.dtype.type_size() as u64
    }
}

/// Every tensor of the checkpoint, in file order, with its type.
fn plan(shape: &SynthShape, quant: Quant) -> Vec<TensorSpec> {
    let n = shape.n_layers;
    let kv_dim = shape.n_kv_heads * shape.head_dim();
    let spec = |name: String, rows, cols, role, init, layer: Option<usize>| {
        let dtype = if role == Role::Vector {
            GgmlDType::F32
        } else {
            fallback(quant.matrix_type(role, layer.unwrap_or(0), n), cols)
        };
        TensorSpec {
            name,
            rows,
            cols,
            dtype,
            init,
            layer,
        }
    };
    let vector = |name: String, len, init, layer| spec(name, 1, len, Role::Vector, init, layer);
    let embd_role = if shape.tied_embeddings {
        Role::Output
    } else {
        Role::Embedding
    };
    let mut out = vec![spec(
        "token_embd.weight".into(),
        shape.vocab,
        shape.hidden,
        embd_role,
        Init::Random,
        None,
    )];
    if let Some(factors) = shape.rope_freq_factors() {
        out.push(vector(
            "rope_freqs.weight".into(),
            factors.len(),
            Init::Values(factors),
            None,
        ));
    }
    for i in 0..n {
        let l = Some(i);
        let m = |suffix: &str, rows, cols, role| {
            spec(
                format!("blk.{i}.{suffix}"),
                rows,
                cols,
                role,
                Init::Random,
                l,
            )
        };
        let h = shape.hidden;
        out.extend([
            vector(format!("blk.{i}.attn_norm.weight"), h, Init::Ones, l),
            m("attn_q.weight", h, h, Role::OtherMatrix),
            m("attn_k.weight", kv_dim, h, Role::OtherMatrix),
            m("attn_v.weight", kv_dim, h, Role::AttnV),
            m("attn_output.weight", h, h, Role::OtherMatrix),
            vector(format!("blk.{i}.ffn_norm.weight"), h, Init::Ones, l),
            m("ffn_gate.weight", shape.ffn, h, Role::OtherMatrix),
            m("ffn_up.weight", shape.ffn, h, Role::OtherMatrix),
            m("ffn_down.weight", h, shape.ffn, Role::FfnDown),
        ]);
    }
    out.push(vector(
        "output_norm.weight".into(),
        shape.hidden,
        Init::Ones,
        None,
    ));
    if !shape.tied_embeddings {
        out.push(spec(
            "output.weight".into(),
            shape.vocab,
            shape.hidden,
            Role::Output,
            Init::Random,
            None,
        ));
    }
    out
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
    let tensors = plan(&spec.shape, spec.quant);
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

/// The `tokenizer.*` keys of `src`, fitted to `vocab` tokens.
///
/// llama.cpp requires as many tokens as embedding rows, so the token list is
/// padded or cut. Padding adds `<synthetic-N>` tokens of type "unused": no
/// merge produces them, so no text maps to them, and neither loader treats
/// them as special. Cutting keeps the first `vocab` tokens and only the
/// merges whose two parts and result survive (BPE builders reject merges
/// over missing tokens), and drops special-token ids past the end. Either
/// way the tokenizer still encodes any text (byte-level BPE falls back to
/// the byte tokens, which come first).
pub fn tokenizer_metadata(
    src: &HashMap<String, Value>,
    vocab: usize,
) -> Result<Vec<(String, Value)>, SynthError> {
    let tokens = match src.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => t,
        _ => {
            return Err(SynthError::Tokenizer(
                "the source has no `tokenizer.ggml.tokens` array".into(),
            ));
        }
    };
    let kept: std::collections::HashSet<&str> = tokens
        .iter()
        .take(vocab)
        .filter_map(|t| t.to_string().ok().map(String::as_str))
        .collect();
    let mut keys: Vec<&String> = src.keys().filter(|k| k.starts_with("tokenizer.")).collect();
    keys.sort();
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let value = &src[key];
        let fitted = match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", Value::Array(a)) => {
                Some(Value::Array(resize(a, vocab, |i| {
                    Value::String(format!("<synthetic-{i}>"))
                })))
            }
            ("tokenizer.ggml.token_type", Value::Array(a)) => {
                let like = a.first().cloned().unwrap_or(Value::I32(0));
                Some(Value::Array(resize(a, vocab, |_| {
                    int_like(&like, TOKEN_TYPE_UNUSED)
                })))
            }
            ("tokenizer.ggml.scores", Value::Array(a)) => {
                let lowest = a
                    .iter()
                    .filter_map(|v| v.to_f32().ok())
                    .fold(0.0f32, f32::min);
                Some(Value::Array(resize(a, vocab, |_| Value::F32(lowest))))
            }
            ("tokenizer.ggml.merges", Value::Array(a)) if vocab < tokens.len() => {
                let merges = a
                    .iter()
                    .filter(|m| {
                        m.to_string()
                            .ok()
                            .and_then(|m| m.split_once(' '))
                            .is_some_and(|(x, y)| {
                                kept.contains(x)
                                    && kept.contains(y)
                                    && kept.contains(format!("{x}{y}").as_str())
                            })
                    })
                    .cloned()
                    .collect();
                Some(Value::Array(merges))
            }
            (k, v) if k.ends_with("_token_id") => {
                let id = token_id(v).ok_or_else(|| {
                    SynthError::Tokenizer(format!("`{k}` is not a token id: {v:?}"))
                })?;
                (id < vocab as u64).then(|| v.clone())
            }
            (_, v) => Some(v.clone()),
        };
        if let Some(v) = fitted {
            out.push((key.clone(), v));
        }
    }
    Ok(out)
}

/// A non-negative GGUF integer (writers disagree on widths).
fn token_id(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some((*x).into()),
        Value::U16(x) => Some((*x).into()),
        Value::U32(x) => Some((*x).into()),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

fn resize(a: &[Value], len: usize, pad: impl Fn(usize) -> Value) -> Vec<Value> {
    let mut v: Vec<Value> = a.iter().take(len).cloned().collect();
    v.extend((a.len()..len).map(pad));
    v
}

/// `n` in the same integer type as `like` (GGUF arrays must be homogeneous).
fn int_like(like: &Value, n: i64) -> Value {
    match like {
        Value::U8(_) => Value::U8(n as u8),
        Value::I8(_) => Value::I8(n as i8),
        Value::U16(_) => Value::U16(n as u16),
        Value::I16(_) => Value::I16(n as i16),
        Value::U32(_) => Value::U32(n as u32),
        Value::U64(_) => Value::U64(n as u64),
        Value::I64(_) => Value::I64(n),
        _ => Value::I32(n as i32),
    }
}

/// Writes a GGUF v3 file: header, metadata, tensor infos, then each tensor's
/// data generated and quantized chunk by chunk.
fn write_gguf<W: Write>(
    w: &mut W,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    seed: u64,
    threads: usize,
    progress: &mut impl FnMut(&Progress<'_>),
) -> Result<(), SynthError> {
    let mut header = Vec::new();
    header.extend(0x4655_4747u32.to_le_bytes()); // "GGUF"
    header.extend(3u32.to_le_bytes());
    header.extend((tensors.len() as u64).to_le_bytes());
    header.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut header, key);
        header.extend(value_type(value)?.to_le_bytes());
        put_value(&mut header, value)?;
    }
    let mut offset = 0u64;
    for t in tensors {
        put_string(&mut header, &t.name);
        if t.is_vector() {
            header.extend(1u32.to_le_bytes());
            header.extend((t.cols as u64).to_le_bytes());
        } else {
            header.extend(2u32.to_le_bytes());
            header.extend((t.cols as u64).to_le_bytes());
            header.extend((t.rows as u64).to_le_bytes());
        }
        header.extend(ggml_type_id(t.dtype)?.to_le_bytes());
        header.extend(offset.to_le_bytes());
        offset += padded(t.bytes());
    }
    let bytes_total = offset;
    header.resize(padded(header.len() as u64) as usize, 0);
    w.write_all(&header)?;

    let mut bytes_done = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let written = write_tensor(w, t, seed, threads)?;
        if written != t.bytes() {
            return Err(SynthError::InvalidShape(format!(
                "`{}`: wrote {written} bytes, expected {}",
                t.name,
                t.bytes()
            )));
        }
        let pad = padded(written) - written;
        w.write_all(&vec![0u8; pad as usize])?;
        bytes_done += written + pad;
        progress(&Progress {
            tensor: &t.name,
            dtype: t.dtype,
            layer: t.layer,
            end_of_layer: t.layer.is_some()
                && tensors.get(i + 1).is_none_or(|next| next.layer != t.layer),
            bytes_done,
            bytes_total,
        });
    }
    w.flush()?;
    Ok(())
}

/// Generates, quantizes and writes one tensor in chunks of whole rows
/// (quant blocks never span rows, so chunks concatenate exactly), `threads`
/// chunks at a time. Each chunk has its own random stream, so the file does
/// not depend on the thread count.
fn write_tensor<W: Write>(
    w: &mut W,
    t: &TensorSpec,
    seed: u64,
    threads: usize,
) -> Result<u64, SynthError> {
    let threads = threads.max(1);
    let rows_per_chunk = (CHUNK_ELEMS / t.cols).max(1);
    let n_chunks = t.rows.div_ceil(rows_per_chunk);
    let base = tensor_seed(seed, &t.name);
    let chunk = |c: usize| {
        let row = c * rows_per_chunk;
        let rows = rows_per_chunk.min(t.rows - row);
        chunk_bytes(
            t,
            rows,
            base ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        )
    };
    let chunk = &chunk;
    let mut written = 0u64;
    for first in (0..n_chunks).step_by(threads) {
        let last = (first + threads).min(n_chunks);
        let parts: Vec<Result<Vec<u8>, SynthError>> = if last - first == 1 {
            vec![chunk(first)]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (first..last).map(|c| s.spawn(move || chunk(c))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(Err(SynthError::Panicked)))
                    .collect()
            })
        };
        for part in parts {
            let data = part?;
            w.write_all(&data)?;
            written += data.len() as u64;
        }
    }
    Ok(written)
}

/// One chunk of `rows` rows of `t`, generated and quantized.
fn chunk_bytes(t: &TensorSpec, rows: usize, seed: u64) -> Result<Vec<u8>, SynthError> {
    let n = rows * t.cols;
    let values: Vec<f32> = match &t.init {
        Init::Random => {
            let mut rng = StdRng::seed_from_u64(seed);
            // Uniform on [-a, a] has standard deviation a / sqrt(3).
            let a = WEIGHT_STD * 3f32.sqrt();
            (0..n).map(|_| rng.random_range(-a..a)).collect()
        }
        Init::Ones => vec![1.0; n],
        Init::Values(v) => v.clone(),
    };
    if values.len() != n {
        return Err(SynthError::InvalidShape(format!(
            "`{}` has {} values for {n} elements",
            t.name,
            values.len()
        )));
    }
    let chunk = Tensor::from_vec(values, (rows, t.cols), &Device::Cpu)?;
    Ok(QTensor::quantize(&chunk, t.dtype)?.data()?.into_owned())
}

/// A per-tensor seed: FNV-1a of the name mixed with the file's seed.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn padded(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// ggml's type ids (candle keeps its own mapping private).
fn ggml_type_id(t: GgmlDType) -> Result<u32, SynthError> {
    Ok(match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    })
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

/// GGUF metadata value type ids.
fn value_type(v: &Value) -> Result<u32, SynthError> {
    Ok(match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    })
}

fn put_value(buf: &mut Vec<u8>, v: &Value) -> Result<(), SynthError> {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend(x.to_le_bytes()),
        Value::U16(x) => buf.extend(x.to_le_bytes()),
        Value::I16(x) => buf.extend(x.to_le_bytes()),
        Value::U32(x) => buf.extend(x.to_le_bytes()),
        Value::I32(x) => buf.extend(x.to_le_bytes()),
        Value::F32(x) => buf.extend(x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_string(buf, s),
        Value::U64(x) => buf.extend(x.to_le_bytes()),
        Value::I64(x) => buf.extend(x.to_le_bytes()),
        Value::F64(x) => buf.extend(x.to_le_bytes()),
        Value::Array(items) => {
            let elem = items.first().map_or(Ok(4), value_type)?;
            if items.iter().any(|x| value_type(x).ok() != Some(elem)) {
                return Err(SynthError::Tokenizer(
                    "a metadata array mixes value types".into(),
                ));
            }
            buf.extend(elem.to_le_bytes());
            buf.extend((items.len() as u64).to_le_bytes());
            for x in items {
                put_value(buf, x)?;
            }
        }
    }
    Ok(())
}
