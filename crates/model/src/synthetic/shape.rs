//! Model shapes, quant types and the list of tensors a checkpoint holds.

use std::str::FromStr;

use candle_core::quantized::GgmlDType;

use super::SynthError;

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
pub(super) enum Role {
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
pub(super) enum Init {
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
pub(super) struct TensorSpec {
    pub(super) name: String,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) dtype: GgmlDType,
    pub(super) init: Init,
    pub(super) layer: Option<usize>,
}

impl TensorSpec {
    pub(super) fn is_vector(&self) -> bool {
        self.rows == 1
    }

    pub(super) fn bytes(&self) -> u64 {
        let elems = (self.rows * self.cols) as u64;
        elems / self.dtype.block_size() as u64 * self.dtype.type_size() as u64
    }
}

/// Every tensor of the checkpoint, in file order, with its type.
pub(super) fn plan(shape: &SynthShape, quant: Quant) -> Vec<TensorSpec> {
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
