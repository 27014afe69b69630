//! Model shapes, quant types and the list of tensors a checkpoint holds.

use std::collections::HashMap;
use std::str::FromStr;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value;

use zinfer_probe::Architecture;

use super::SynthError;

/// llama.cpp builds Q and the attention output `hidden` wide for these,
/// so their heads must tile the hidden width exactly.
fn heads_tile_hidden(arch: Architecture) -> bool {
    matches!(
        arch,
        Architecture::Qwen2 | Architecture::Qwen2Moe | Architecture::Phi3
    )
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

/// Phi-3 long-context RoPE (Hugging Face `rope_type: longrope`, once `su`):
/// per-frequency divisors, one set for sequences past
/// [`SynthShape::rope_original_context`] and one within it. Written as the
/// `rope_factors_long.weight` and `rope_factors_short.weight` tensors, with
/// the attention scale [`SynthShape::long_rope_attn_factor`].
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// `head_dim / 2` divisors for long sequences.
    pub long_factors: Vec<f32>,
    /// `head_dim / 2` divisors for short sequences.
    pub short_factors: Vec<f32>,
}

impl LongRope {
    /// Stand-in factors of the right length for a model stretched `scale`
    /// times: short ones 1 (plain RoPE), long ones rising geometrically from
    /// 1 at the highest frequency to `scale` at the lowest. Real checkpoints
    /// carry factors fitted per model; values do not change speed.
    pub fn stand_in(head_dim: usize, scale: f64) -> Self {
        let n = head_dim / 2;
        let long_factors = (0..n)
            .map(|i| scale.powf(i as f64 / (n.max(2) - 1) as f64) as f32)
            .collect();
        Self {
            long_factors,
            short_factors: vec![1.0; n],
        }
    }
}

/// A mixture of experts in place of every dense MLP, written as
/// llama.cpp's converter writes Qwen3-MoE: a router `ffn_gate_inp` and
/// stacked `ffn_{gate,up,down}_exps` tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthMoe {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token runs.
    pub used: usize,
    /// Inner width of one expert's MLP.
    pub expert_ffn: usize,
    /// Inner width of the gated shared expert (`*_shexp` tensors), for the
    /// architectures that have one (qwen2moe).
    pub shared_ffn: Option<usize>,
}

/// The Gated DeltaNet part of a hybrid shape (qwen35), written as
/// llama.cpp's converter writes Qwen3.5: `ssm.*` keys, a full-attention
/// layer every `interval` layers, partial multi-section RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthHybrid {
    /// Every `interval`-th layer is full attention (`full_attention_interval`).
    pub interval: usize,
    /// Rotated dimensions of an attention head (`rope.dimension_count`).
    pub rope_dims: usize,
    /// `rope.dimension_sections`; they sum to `rope_dims / 2`.
    pub sections: [usize; 4],
    /// Taps of the causal convolution (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Width of a key and value head (`ssm.state_size`).
    pub head_dim: usize,
    /// Key heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`).
    pub v_heads: usize,
}

impl SynthHybrid {
    /// Whether `layer` is a Gated DeltaNet layer.
    pub fn is_recurrent(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.interval)
    }
}

/// The architecture numbers of a checkpoint, as llama.cpp's converter writes
/// them from the model's Hugging Face `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthShape {
    /// Preset name, written to `general.name`.
    pub name: String,
    /// Model family: tensor names, metadata keys, which layers slide.
    pub arch: Architecture,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of one attention head (`attention.key_length`): Qwen3 and Gemma
    /// have `head_dim * n_heads != hidden`.
    pub head_dim: usize,
    /// Inner width of the MLP.
    pub ffn: usize,
    /// Rows of the embedding (and the tokenizer's token count).
    pub vocab: usize,
    /// `vocab` is a placeholder that the tokenizer's token count replaces
    /// (tiny test shapes); when false it is the real model's row count and
    /// the token list is padded or cut to it (see [`SynthShape::fitted_to`]).
    pub vocab_from_tokenizer: bool,
    /// The llama.cpp test vocabulary (`ggml-vocab-{name}.gguf`) of this
    /// model's tokenizer, or the stand-in used until zinfer reads the real
    /// one (Gemma: `llama-spm`, as Gemma 4's `gemma4` tokenizer model is not
    /// supported yet). None: no better source than the default model's.
    pub vocab_file: Option<String>,
    /// `{arch}.context_length`.
    pub context: usize,
    /// RoPE base frequency (of the global layers, where some slide).
    pub rope_theta: f32,
    /// `{arch}.rope.freq_base_swa`: RoPE base of the sliding-window layers.
    /// None leaves llama.cpp's default for them, 10000.
    pub rope_theta_swa: Option<f32>,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// No `output.weight`: the embedding doubles as the LM head.
    pub tied_embeddings: bool,
    /// Written as the `rope_freqs.weight` tensor when set (llama only).
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// `{arch}.rope.scaling.original_context_length` (Phi-3 writes it always).
    pub rope_original_context: Option<usize>,
    /// Phi-3 long-context factors, written as tensors when set (phi3 only).
    pub long_rope: Option<LongRope>,
    /// `{arch}.attention.sliding_window`, in tokens; which layers slide is
    /// the architecture's (see [`SynthShape::is_sliding`]).
    pub sliding_window: Option<usize>,
    /// `{arch}.attn_logit_softcapping`: attention scores become
    /// `cap * tanh(score / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// `{arch}.final_logit_softcapping`: the same on the output logits.
    pub final_softcap: Option<f32>,
    /// Experts in place of the dense MLP (qwen3moe only, which needs them).
    pub moe: Option<SynthMoe>,
    /// YaRN RoPE scaling by this factor over [`SynthShape::rope_original_context`]
    /// (`rope.scaling.type = yarn`, as the converter writes Qwen's long-context configs).
    pub yarn_factor: Option<f32>,
    /// Gated DeltaNet layers and partial RoPE (qwen35 only, which needs them).
    pub hybrid: Option<SynthHybrid>,
    /// Gemma 4's per-kind heads, shared KV and per-layer embeddings (gemma4 only).
    pub gemma4: Option<super::SynthGemma4>,
}

/// gemma4-tiny's Gemma 4 parts (see [`SynthShape::preset`]).
const GEMMA4_TINY: super::SynthGemma4 = super::SynthGemma4 {
    swa_period: 3,
    swa_head_dim: 32,
    swa_kv_heads: 2,
    shared_kv_layers: 3,
    rotated_pairs: 8,
    per_layer_input: 16,
    no_v_layer: Some(1),
    double_wide_shared: true,
    moe: None,
};

/// Rows of the Qwen2/2.5/3 embedding: 151,665 tokens padded to a multiple of 128.
const QWEN_VOCAB: usize = 151_936;

impl SynthShape {
    /// The shape of a public checkpoint, from its Hugging Face `config.json`,
    /// or a tiny one per architecture for tests (`*-tiny`; their vocabulary
    /// is the tokenizer's, whatever its size).
    pub fn preset(name: &str) -> Result<Self, SynthError> {
        let base = |n_layers, hidden, n_heads, n_kv_heads, ffn, vocab| Self {
            name: name.to_string(),
            arch: Architecture::Llama,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim: hidden / n_heads,
            ffn,
            vocab,
            vocab_from_tokenizer: false,
            vocab_file: None,
            context: 8192,
            rope_theta: 100_000.0,
            rope_theta_swa: None,
            rms_eps: 1e-5,
            tied_embeddings: true,
            rope_scaling: None,
            rope_original_context: None,
            long_rope: None,
            sliding_window: None,
            attn_softcap: None,
            final_softcap: None,
            moe: None,
            yarn_factor: None,
            hybrid: None,
            gemma4: None,
        };
        let vocab_file = |n: &str| Some(n.to_string());
        // 2-6 layers, hidden 128, GQA, windows of 16 tokens: cheap to run
        // past the window. Qwen's are 64 wide: their 151,936-row embedding
        // is most of the file.
        let tiny =
            |arch, n_layers, n_heads, n_kv_heads, head_dim, vocab, file: Option<&str>| Self {
                arch,
                head_dim,
                vocab_from_tokenizer: true,
                vocab_file: file.map(String::from),
                context: 512,
                ..base(n_layers, 128, n_heads, n_kv_heads, 256, vocab)
            };
        let gemma4 = |n_layers, g| Self {
            rope_theta: 1_000_000.0,
            rms_eps: 1e-6,
            sliding_window: Some(16),
            final_softcap: Some(30.0),
            // 128 (256 where doubled) wide: a dense f32 matmul over more
            // than 256 values sums in blocks whose split depends on the row
            // count, which the row-invariance tests would see.
            ffn: 128,
            gemma4: Some(g),
            ..tiny(
                Architecture::Gemma4,
                n_layers,
                4,
                1,
                64,
                32_000,
                Some("llama-spm"),
            )
        };
        let phi3 = |context| Self {
            arch: Architecture::Phi3,
            vocab_file: vocab_file("phi-3"),
            context,
            rope_theta: 10_000.0,
            tied_embeddings: false,
            rope_original_context: Some(4096),
            ..base(32, 3072, 32, 32, 8192, 32_064)
        };
        Ok(match name {
            "smollm2-135m" => base(30, 576, 9, 3, 1536, 49_152),
            "smollm2-360m" => base(32, 960, 15, 5, 2560, 49_152),
            "tinyllama-1.1b" => Self {
                context: 2048,
                rope_theta: 10_000.0,
                tied_embeddings: false,
                vocab_file: vocab_file("llama-spm"),
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
                vocab_file: vocab_file("llama-bpe"),
                ..base(16, 2048, 32, 8, 8192, 128_256)
            },
            "qwen2.5-1.5b" => Self {
                arch: Architecture::Qwen2,
                vocab_file: vocab_file("qwen2"),
                context: 32_768,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                ..base(28, 1536, 12, 2, 8960, QWEN_VOCAB)
            },
            "qwen3-1.7b" => Self {
                arch: Architecture::Qwen3,
                head_dim: 128,
                vocab_file: vocab_file("qwen2"),
                context: 40_960,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                ..base(28, 2048, 16, 8, 6144, QWEN_VOCAB)
            },
            "qwen3-30b-a3b" => Self {
                arch: Architecture::Qwen3Moe,
                head_dim: 128,
                vocab_file: vocab_file("qwen2"),
                context: 40_960,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                tied_embeddings: false,
                moe: Some(SynthMoe {
                    experts: 128,
                    used: 8,
                    expert_ffn: 768,
                    shared_ffn: None,
                }),
                ..base(48, 2048, 32, 4, 6144, QWEN_VOCAB)
            },
            // openai/gpt-oss-20b's config.json; its o200k vocabulary has no
            // llama.cpp test file, so the default model's tokens are padded
            // to its 201,088 rows.
            "gpt-oss-20b" => Self {
                arch: Architecture::GptOss,
                head_dim: 64,
                context: 131_072,
                rope_theta: 150_000.0,
                tied_embeddings: false,
                sliding_window: Some(128),
                rope_original_context: Some(4096),
                yarn_factor: Some(32.0),
                moe: Some(SynthMoe {
                    experts: 32,
                    used: 4,
                    expert_ffn: 2880,
                    shared_ffn: None,
                }),
                ..base(24, 2880, 64, 8, 2880, 201_088)
            },
            "phi-3-mini" => phi3(4096),
            "phi-3-mini-128k" => Self {
                long_rope: Some(LongRope::stand_in(96, 131_072.0 / 4096.0)),
                ..phi3(131_072)
            },
            "gemma-2-2b" => Self {
                arch: Architecture::Gemma2,
                head_dim: 256,
                vocab_file: vocab_file("llama-spm"),
                rope_theta: 10_000.0,
                rms_eps: 1e-6,
                sliding_window: Some(4096),
                attn_softcap: Some(50.0),
                final_softcap: Some(30.0),
                ..base(26, 2304, 8, 4, 9216, 256_000)
            },
            "gemma-3-1b" => Self {
                arch: Architecture::Gemma3,
                head_dim: 256,
                vocab_file: vocab_file("llama-spm"),
                context: 32_768,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                sliding_window: Some(512),
                ..base(26, 1152, 4, 1, 6912, 262_144)
            },
            "llama-swa-tiny" => Self {
                rope_theta: 10_000.0,
                sliding_window: Some(16),
                ..tiny(Architecture::Llama, 2, 4, 2, 32, 49_152, None)
            },
            "qwen2-tiny" => Self {
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                hidden: 64,
                ..tiny(Architecture::Qwen2, 2, 2, 1, 32, QWEN_VOCAB, Some("qwen2"))
            },
            "qwen3-tiny" => Self {
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                hidden: 64,
                ..tiny(Architecture::Qwen3, 2, 4, 2, 32, QWEN_VOCAB, Some("qwen2"))
            },
            "qwen3-yarn-tiny" => Self {
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                hidden: 64,
                rope_original_context: Some(128),
                yarn_factor: Some(4.0),
                ..tiny(Architecture::Qwen3, 2, 4, 2, 32, QWEN_VOCAB, Some("qwen2"))
            },
            "qwen2moe-tiny" => Self {
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                hidden: 64,
                moe: Some(SynthMoe {
                    experts: 8,
                    used: 2,
                    expert_ffn: 64,
                    shared_ffn: Some(128),
                }),
                tied_embeddings: false,
                ..tiny(
                    Architecture::Qwen2Moe,
                    2,
                    2,
                    1,
                    32,
                    QWEN_VOCAB,
                    Some("qwen2"),
                )
            },
            "qwen3moe-tiny" => Self {
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                hidden: 64,
                moe: Some(SynthMoe {
                    experts: 8,
                    used: 2,
                    expert_ffn: 64,
                    shared_ffn: None,
                }),
                ..tiny(
                    Architecture::Qwen3Moe,
                    2,
                    4,
                    2,
                    32,
                    QWEN_VOCAB,
                    Some("qwen2"),
                )
            },
            // qwen3moe-tiny with 256-wide rows (IQ4_XS's and the K-quants'
            // blocks fit every matrix) and Qwen's vocabulary cut to 8,192.
            "qwen3moe-mini" => Self {
                name: name.to_string(),
                head_dim: 64,
                hidden: 256,
                vocab: 8192,
                vocab_from_tokenizer: false,
                moe: Some(SynthMoe {
                    experts: 8,
                    used: 2,
                    expert_ffn: 256,
                    shared_ffn: None,
                }),
                ..Self::preset("qwen3moe-tiny")?
            },
            // gpt-oss's features at test size: biases everywhere, sinks,
            // every other layer sliding (16 tokens here, 128 in the real
            // ones), YaRN (factor 32 over 4,096 there), 8 experts of which
            // 4 run (32 and 4 in gpt-oss-20b).
            "gpt-oss-tiny" => Self {
                rope_theta: 150_000.0,
                hidden: 64,
                sliding_window: Some(16),
                rope_original_context: Some(128),
                yarn_factor: Some(4.0),
                moe: Some(SynthMoe {
                    experts: 8,
                    used: 4,
                    expert_ffn: 64,
                    shared_ffn: None,
                }),
                tied_embeddings: false,
                ..tiny(Architecture::GptOss, 2, 4, 2, 32, QWEN_VOCAB, Some("qwen2"))
            },
            "phi3-tiny" => Self {
                rope_theta: 10_000.0,
                tied_embeddings: false,
                rope_original_context: Some(512),
                ..tiny(Architecture::Phi3, 2, 4, 2, 32, 32_064, Some("phi-3"))
            },
            "gemma2-tiny" => Self {
                rope_theta: 10_000.0,
                rms_eps: 1e-6,
                sliding_window: Some(16),
                attn_softcap: Some(50.0),
                final_softcap: Some(30.0),
                ..tiny(Architecture::Gemma2, 4, 4, 2, 64, 32_000, Some("llama-spm"))
            },
            "gemma3-tiny" => Self {
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                sliding_window: Some(16),
                ..tiny(Architecture::Gemma3, 6, 4, 1, 64, 32_000, Some("llama-spm"))
            },
            // Qwen3.5's parts at test size: three Gated DeltaNet layers to
            // one attention layer, value heads grouped two to a key head,
            // RoPE on half of a head in IMROPE sections that reduce to NeoX.
            "qwen35-tiny" => Self {
                rope_theta: 10_000_000.0,
                rms_eps: 1e-6,
                hidden: 64,
                tied_embeddings: false,
                hybrid: Some(SynthHybrid {
                    interval: 4,
                    rope_dims: 16,
                    sections: [3, 3, 2, 0],
                    conv_kernel: 4,
                    head_dim: 16,
                    k_heads: 2,
                    v_heads: 4,
                }),
                ..tiny(Architecture::Qwen35, 4, 4, 2, 32, QWEN_VOCAB, Some("qwen2"))
            },
            // Qwen3.5-MoE's parts at test size: qwen35-tiny's layers with 8
            // experts of which 2 run, renormalised, and a gated shared expert.
            "qwen35moe-tiny" => Self {
                name: name.to_string(),
                arch: Architecture::Qwen35Moe,
                moe: Some(SynthMoe {
                    experts: 8,
                    used: 2,
                    expert_ffn: 64,
                    shared_ffn: Some(96),
                }),
                ..Self::preset("qwen35-tiny")?
            },
            // Gemma 4 E2B's features at test size: two sliding layers to
            // one global, the sliding heads 32 wide (2 KV heads), the global
            // ones 64 wide (1 KV head) rotating a quarter of their pairs,
            // the last three layers on layers 4 and 5's KV, layer 1 without
            // attn_v, their MLPs twice as wide, 16-wide per-layer
            // embeddings, windows of 16 tokens.
            "gemma4-tiny" => gemma4(9, GEMMA4_TINY),
            // Gemma 4 26B-A4B's features at test size: the E2B-style
            // attention above without shared KV or per-layer embeddings
            // (layer 2, global, without attn_v), and 8 experts of 64 (2
            // per token, fused gate|up, per-expert output scales) beside
            // every layer's dense MLP.
            "gemma4-moe-tiny" => gemma4(
                4,
                super::SynthGemma4 {
                    shared_kv_layers: 0,
                    per_layer_input: 0,
                    no_v_layer: Some(2),
                    double_wide_shared: false,
                    moe: Some(SynthMoe {
                        experts: 8,
                        used: 2,
                        expert_ffn: 64,
                        shared_ffn: None,
                    }),
                    ..GEMMA4_TINY
                },
            ),
            other => return Err(SynthError::UnknownShape(other.to_string())),
        })
    }

    /// Width of the key (and value) projections.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of the query projection (and the attention output's input).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Whether `layer` attends over the last [`SynthShape::sliding_window`]
    /// tokens only, as llama.cpp and Hugging Face lay the layers out: Gemma 2
    /// every other layer from the first, Gemma 3 five of each six, llama
    /// every layer (Mistral's convention; llama.cpp ignores the window for
    /// llama, as it does Phi-3's).
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window.is_some()
            && match self.arch {
                Architecture::Gemma2 | Architecture::GptOss => layer.is_multiple_of(2),
                Architecture::Gemma3 => layer % 6 < 5,
                Architecture::Gemma4 => self.gemma4.is_some_and(|g| g.is_sliding(layer)),
                Architecture::Phi3 | Architecture::Qwen35 | Architecture::Qwen35Moe => false,
                Architecture::Llama
                | Architecture::Qwen2
                | Architecture::Qwen2Moe
                | Architecture::Qwen3
                | Architecture::Qwen3Moe => true,
            }
    }

    /// The shape as written with tokenizer metadata `tokenizer_src`: a
    /// [`SynthShape::vocab_from_tokenizer`] shape takes the token count of
    /// `tokenizer.ggml.tokens`; others keep theirs.
    pub fn fitted_to(&self, tokenizer_src: &HashMap<String, Value>) -> Result<Self, SynthError> {
        let mut shape = self.clone();
        if self.vocab_from_tokenizer {
            shape.vocab = match tokenizer_src.get("tokenizer.ggml.tokens") {
                Some(Value::Array(tokens)) => tokens.len(),
                _ => {
                    return Err(SynthError::Tokenizer(
                        "the source has no `tokenizer.ggml.tokens` array".into(),
                    ));
                }
            };
            shape.vocab_from_tokenizer = false;
        }
        Ok(shape)
    }

    /// Checks the relations the forward passes (llama.cpp's and candle's)
    /// rely on, and that each option is one the architecture reads.
    pub fn validate(&self) -> Result<(), SynthError> {
        let bad = |why: String| Err(SynthError::InvalidShape(why));
        if [self.n_layers, self.hidden, self.n_heads, self.n_kv_heads]
            .into_iter()
            .chain([self.head_dim, self.ffn, self.vocab, self.context])
            .any(|d| d == 0)
        {
            return bad(format!("a dimension is zero: {self:?}"));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} is odd", self.head_dim));
        }
        if heads_tile_hidden(self.arch) && self.q_dim() != self.hidden {
            return bad(format!(
                "{}: {} heads of {} do not make hidden {}",
                self.arch, self.n_heads, self.head_dim, self.hidden
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "{} heads are not a multiple of {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        let only = |set: bool, what: &str, archs: &[Architecture]| {
            if set && !archs.contains(&self.arch) {
                return bad(format!("{}: llama.cpp reads no {what} for it", self.arch));
            }
            Ok(())
        };
        only(
            self.rope_scaling.is_some(),
            "rope_freqs",
            &[Architecture::Llama],
        )?;
        only(
            self.long_rope.is_some(),
            "long-context RoPE factors",
            &[Architecture::Phi3],
        )?;
        only(
            self.yarn_factor.is_some(),
            "YaRN here (its tests cover Qwen and gpt-oss)",
            &[
                Architecture::Qwen2,
                Architecture::Qwen3,
                Architecture::Qwen3Moe,
                Architecture::GptOss,
            ],
        )?;
        if self.yarn_factor.is_some_and(|f| f.is_nan() || f <= 0.0)
            || self.yarn_factor.is_some() && self.rope_original_context.is_none()
        {
            return bad("YaRN needs a positive factor and rope_original_context".into());
        }
        only(
            self.attn_softcap.is_some(),
            "attention soft-cap",
            &[Architecture::Gemma2],
        )?;
        only(
            self.final_softcap.is_some(),
            "final soft-cap",
            &[
                Architecture::Gemma2,
                Architecture::Gemma3,
                Architecture::Gemma4,
            ],
        )?;
        match (self.arch, &self.gemma4) {
            (Architecture::Gemma4, Some(g)) => g.check(self).map_err(SynthError::InvalidShape)?,
            (Architecture::Gemma4, None) => return bad("gemma4 needs its extras".into()),
            (_, Some(_)) => return bad(format!("{}: llama.cpp reads no gemma4 extras", self.arch)),
            _ => {}
        }
        if self.arch == Architecture::Gemma4 && self.sliding_window.is_none() {
            return bad("gemma4: llama.cpp needs a sliding window".into());
        }
        let rule = crate::arch::rules(self.arch).moe;
        let has_experts = rule.is_some();
        if let (Some(r), Some(m)) = (rule, self.moe)
            && r.shared_expert != m.shared_ffn.is_some()
        {
            return bad(format!(
                "{}: llama.cpp reads a shared expert {}",
                self.arch,
                if r.shared_expert { "always" } else { "never" }
            ));
        }
        match self.moe {
            None if has_experts => {
                return bad(format!("{}: llama.cpp needs experts for it", self.arch));
            }
            Some(_) if !has_experts => {
                return bad(format!("{}: llama.cpp reads no experts for it", self.arch));
            }
            Some(m) if m.experts == 0 || m.used == 0 || m.used > m.experts || m.expert_ffn == 0 => {
                return bad(format!(
                    "experts {m:?}: need 0 < used <= experts and a width"
                ));
            }
            _ => {}
        }
        if self.arch == Architecture::Qwen2Moe && self.tied_embeddings {
            return bad("qwen2moe: llama.cpp needs output.weight; untie the embeddings".into());
        }
        if self.arch == Architecture::GptOss
            && (self.tied_embeddings || self.sliding_window.is_none())
        {
            return bad("gpt-oss: llama.cpp needs output.weight and a sliding window".into());
        }
        let hybrid_arch = matches!(self.arch, Architecture::Qwen35 | Architecture::Qwen35Moe);
        if hybrid_arch != self.hybrid.is_some() {
            return bad(format!(
                "{}: Gated DeltaNet layers are qwen35's alone, and it needs them",
                self.arch
            ));
        }
        if let Some(hy) = self.hybrid
            && (hy.interval == 0
                || hy.k_heads == 0
                || !hy.v_heads.is_multiple_of(hy.k_heads)
                || hy.rope_dims > self.head_dim
                || hy.sections.iter().sum::<usize>() * 2 != hy.rope_dims)
        {
            return bad(format!("hybrid widths {hy:?} cannot run"));
        }
        if self.arch == Architecture::Gemma2 && !self.tied_embeddings {
            return bad("gemma2: llama.cpp reads no output.weight; tie the embeddings".into());
        }
        if let Some(l) = &self.long_rope {
            let n = self.head_dim / 2;
            if l.long_factors.len() != n || l.short_factors.len() != n {
                return bad(format!(
                    "long RoPE factors: {} long and {} short, need {n} each",
                    l.long_factors.len(),
                    l.short_factors.len()
                ));
            }
            if self.rope_original_context.is_none() {
                return bad("long RoPE factors need rope_original_context".into());
            }
        }
        Ok(())
    }

    /// The attention scale llama.cpp's converter writes with long-context
    /// factors (`rope.scaling.attn_factor`): `sqrt(1 + ln(s) / ln(original))`
    /// for a context `s` times the original one. None without them.
    pub fn long_rope_attn_factor(&self) -> Option<f32> {
        self.long_rope.as_ref()?;
        let original = self.rope_original_context? as f64;
        let scale = self.context as f64 / original;
        Some(if scale > 1.0 {
            (1.0 + scale.ln() / original.ln()).sqrt() as f32
        } else {
            1.0
        })
    }

    /// Per-frequency RoPE divisors as llama.cpp's converter writes them to
    /// `rope_freqs.weight` (and as Hugging Face scales `inv_freq`): high
    /// frequencies kept, low ones divided by `factor`, a smooth blend
    /// between. None without scaling.
    pub fn rope_freq_factors(&self) -> Option<Vec<f32>> {
        let s = self.rope_scaling?;
        Some(crate::RopeScaling::llama3_freq_factors(
            self.rope_theta,
            self.head_dim,
            s.factor,
            s.low_freq_factor,
            s.high_freq_factor,
            s.original_context,
        ))
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
    /// llama.cpp's Q5_K_M mix: Q5_K, with Q6_K where Q4_K_M has it.
    Q5KM,
    /// The stacked expert matrices in a type only zinfer's kernels write
    /// (`mxfp4_experts`: MXFP4 as gpt-oss checkpoints ship them;
    /// `iq4_xs_experts`, `iq4_nl_experts`), every other tensor F32, so that
    /// a copy of an F32 file differs from it in the experts alone.
    Experts(KernelType),
    /// Every matrix but the routers in a type only zinfer's kernels write
    /// (`iq4_nl`, `iq4_xs`), as `llama-quantize --pure`; where a row does
    /// not fit its blocks, IQ4_XS falls back to IQ4_NL (as llama.cpp's
    /// quantizer does), IQ4_NL to F16.
    Kernel(KernelType),
}

/// Weight types candle does not write: zinfer's own quantizers
/// (`zinfer_kernels::quantize_*`) write them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelType {
    /// ggml type 39: E8M0 scale + 16 bytes of E2M1 nibbles per 32 values.
    Mxfp4,
    /// ggml type 20: f16 scale + 16 bytes of non-linear 4-bit indices per 32.
    Iq4Nl,
    /// ggml type 23: IQ4_NL's indices with 6-bit scales per 32, per 256.
    Iq4Xs,
}

impl KernelType {
    /// ggml's number for the type.
    pub(super) fn ggml_id(self) -> u32 {
        match self {
            Self::Mxfp4 => 39,
            Self::Iq4Nl => 20,
            Self::Iq4Xs => 23,
        }
    }

    /// `(values, bytes)` of one block.
    fn block(self) -> (usize, usize) {
        match self {
            Self::Mxfp4 => (32, 17),
            Self::Iq4Nl => (32, 18),
            Self::Iq4Xs => (256, 136),
        }
    }

    /// ggml's name for the type.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Mxfp4 => "MXFP4",
            Self::Iq4Nl => "IQ4_NL",
            Self::Iq4Xs => "IQ4_XS",
        }
    }

    /// `values` (whole rows of whole blocks) in this type.
    pub(super) fn quantize(self, values: &[f32]) -> Vec<u8> {
        match self {
            Self::Mxfp4 => zinfer_kernels::quantize_mxfp4(values),
            Self::Iq4Nl => zinfer_kernels::quantize_iq4_nl(values),
            Self::Iq4Xs => zinfer_kernels::quantize_iq4_xs(values),
        }
    }

    /// This type, or the one llama.cpp's quantizer falls back to, for rows
    /// of `cols` values; `None` where neither fits.
    fn fitting(self, cols: usize) -> Option<Self> {
        if cols.is_multiple_of(self.block().0) {
            Some(self)
        } else if self == Self::Iq4Xs {
            Self::Iq4Nl.fitting(cols)
        } else {
            None
        }
    }
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
            "q5_k_m" => return Ok(Self::Q5KM),
            "mxfp4_experts" => return Ok(Self::Experts(KernelType::Mxfp4)),
            "iq4_nl_experts" => return Ok(Self::Experts(KernelType::Iq4Nl)),
            "iq4_xs_experts" => return Ok(Self::Experts(KernelType::Iq4Xs)),
            "iq4_nl" => return Ok(Self::Kernel(KernelType::Iq4Nl)),
            "iq4_xs" => return Ok(Self::Kernel(KernelType::Iq4Xs)),
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
            Self::Q5KM => 17,
            // LLAMA_FTYPE_MOSTLY_MXFP4_MOE, _IQ4_NL and _IQ4_XS.
            Self::Experts(KernelType::Mxfp4) => 38,
            Self::Experts(KernelType::Iq4Nl) | Self::Kernel(KernelType::Iq4Nl) => 25,
            Self::Experts(KernelType::Iq4Xs) | Self::Kernel(KernelType::Iq4Xs) => 30,
            Self::Kernel(KernelType::Mxfp4) => 38,
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
    pub(super) fn matrix_type(self, role: Role, layer: usize, n_layers: usize) -> GgmlDType {
        match self {
            Self::Pure(t) => t,
            Self::Experts(_) => GgmlDType::F32,
            // Where no kernel type fits the row ([`Quant::kernel_type`]).
            Self::Kernel(_) => GgmlDType::F16,
            Self::Q4KM | Self::Q5KM => match role {
                Role::Output => GgmlDType::Q6K,
                Role::AttnV | Role::FfnDown if use_more_bits(layer, n_layers) => GgmlDType::Q6K,
                _ if self == Self::Q5KM => GgmlDType::Q5K,
                _ => GgmlDType::Q4K,
            },
        }
    }
}

impl Quant {
    /// The kernel-written type of a matrix of `role` with rows of `cols`
    /// values outside the stacked experts, if any.
    fn kernel_type(self, role: Role, cols: usize) -> Option<KernelType> {
        match self {
            Self::Kernel(k) if !matches!(role, Role::Vector | Role::Router) => k.fitting(cols),
            _ => None,
        }
    }

    /// The kernel-written type of the stacked experts, if any.
    fn experts_type(self, cols: usize) -> Option<KernelType> {
        match self {
            Self::Experts(k) | Self::Kernel(k) => k.fitting(cols),
            _ => None,
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
    /// A norm weight, a bias or RoPE factors: always f32.
    Vector,
    /// The token embedding when it is not also the LM head.
    Embedding,
    /// A MoE router (`ffn_gate_inp`): llama.cpp's quantizer leaves it f32.
    Router,
    /// `output.weight`, or the tied embedding that serves as it.
    Output,
    AttnV,
    FfnDown,
    OtherMatrix,
}

/// How a tensor's values are made.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Init {
    /// Uniform with standard deviation [`WEIGHT_STD`] (matrices, biases).
    Random,
    /// Uniform within [`NORM_SPREAD`] of 1 (norm weights): activations keep
    /// their scale, and each norm differs, so a loader that reads the wrong
    /// one gives other logits. Gemma's checkpoints store `1 + w` too.
    NearOne,
    /// These values (the RoPE factors).
    Values(Vec<f32>),
}

/// Half-width of the interval around 1 that norm weights are drawn from.
pub(super) const NORM_SPREAD: f32 = 0.1;

/// One tensor of the file: checkpoint name, candle-order dims
/// (`[rows, cols]`, reversed in the file as ggml's `ne`), type, values.
/// A stacked expert tensor `[experts, rows / experts, cols]` is written as
/// its `rows` rows end to end.
#[derive(Clone, Debug)]
pub(super) struct TensorSpec {
    pub(super) name: String,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Experts stacked in `rows`; 1 for a matrix or vector.
    pub(super) experts: usize,
    pub(super) dtype: GgmlDType,
    /// Stored in this type instead of `dtype` (which candle does not know).
    pub(super) kernel: Option<KernelType>,
    pub(super) init: Init,
    pub(super) layer: Option<usize>,
}

impl TensorSpec {
    /// A matrix or vector (not stacked experts) stored as `dtype`.
    pub(super) fn plain(
        name: String,
        (rows, cols): (usize, usize),
        dtype: GgmlDType,
        init: Init,
        layer: Option<usize>,
    ) -> Self {
        Self {
            name,
            rows,
            cols,
            experts: 1,
            dtype,
            kernel: None,
            init,
            layer,
        }
    }

    pub(super) fn is_vector(&self) -> bool {
        self.rows == 1
    }

    pub(super) fn bytes(&self) -> u64 {
        let elems = (self.rows * self.cols) as u64;
        if let Some(k) = self.kernel {
            let (values, bytes) = k.block();
            return elems / values as u64 * bytes as u64;
        }
        elems / self.dtype.block_size() as u64 * self.dtype.type_size() as u64
    }

    /// The stored type's name, for reports (`"Q4K"`, `"MXFP4"`).
    pub(super) fn type_name(&self) -> String {
        match self.kernel {
            Some(k) => k.name().to_string(),
            None => format!("{:?}", self.dtype),
        }
    }
}

/// Every tensor of the checkpoint, in file order, with its type and
/// llama.cpp's name for the shape's architecture.
pub(super) fn plan(shape: &SynthShape, quant: Quant) -> Vec<TensorSpec> {
    let n = shape.n_layers;
    // The tensors the loader's table says a block of the architecture has.
    let layout = crate::arch::rules(shape.arch).layout;
    let (h, hd, q_dim, kv_dim) = (shape.hidden, shape.head_dim, shape.q_dim(), shape.kv_dim());
    let spec = |name: String, rows, cols, role, init, layer: Option<usize>| {
        let dtype = if matches!(role, Role::Vector | Role::Router) {
            GgmlDType::F32
        } else {
            fallback(quant.matrix_type(role, layer.unwrap_or(0), n), cols)
        };
        TensorSpec {
            name,
            rows,
            cols,
            experts: 1,
            dtype,
            kernel: quant.kernel_type(role, cols),
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
        h,
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
    if let Some(l) = &shape.long_rope {
        for (name, factors) in [
            ("rope_factors_long.weight", &l.long_factors),
            ("rope_factors_short.weight", &l.short_factors),
        ] {
            out.push(vector(
                name.into(),
                factors.len(),
                Init::Values(factors.clone()),
                None,
            ));
        }
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
        let norm = |suffix: &str, len| vector(format!("blk.{i}.{suffix}"), len, Init::NearOne, l);
        let bias = |suffix: &str, len| vector(format!("blk.{i}.{suffix}"), len, Init::Random, l);
        out.push(norm("attn_norm.weight", h));
        if let Some(hy) = shape.hybrid.filter(|hy| hy.is_recurrent(i)) {
            out.extend(deltanet_tensors(shape, &hy, i, quant));
        } else if layout.fused_qkv {
            // Rows: Q, then K, then V; llama.cpp's Q4_K_M counts it as attn_v.
            out.push(m("attn_qkv.weight", q_dim + 2 * kv_dim, h, Role::AttnV));
        } else {
            // Qwen3.5's query rows hold each head's query, then its gate.
            let q_rows = if shape.hybrid.is_some() {
                2 * q_dim
            } else {
                q_dim
            };
            out.push(m("attn_q.weight", q_rows, h, Role::OtherMatrix));
            if layout.qkv_bias {
                out.push(bias("attn_q.bias", q_dim));
            }
            out.push(m("attn_k.weight", kv_dim, h, Role::OtherMatrix));
            if layout.qkv_bias {
                out.push(bias("attn_k.bias", kv_dim));
            }
            out.push(m("attn_v.weight", kv_dim, h, Role::AttnV));
            if layout.qkv_bias {
                out.push(bias("attn_v.bias", kv_dim));
            }
        }
        let attention = !shape.hybrid.is_some_and(|hy| hy.is_recurrent(i));
        if layout.qk_norm && attention {
            out.push(norm("attn_q_norm.weight", hd));
            out.push(norm("attn_k_norm.weight", hd));
        }
        if attention {
            out.push(m("attn_output.weight", h, q_dim, Role::OtherMatrix));
        }
        if layout.attn_output_bias {
            out.push(bias("attn_output.bias", h));
        }
        if layout.attn_sinks {
            // Sinks of a few nats, as trained ones are, so they matter.
            let sinks = (0..shape.n_heads).map(|h| 0.8 * h as f32 - 0.5).collect();
            out.push(vector(
                format!("blk.{i}.attn_sinks.weight"),
                shape.n_heads,
                Init::Values(sinks),
                l,
            ));
        }
        if layout.post_norms {
            out.push(norm("post_attention_norm.weight", h));
        }
        if layout.ffn_norm_after_attention {
            out.push(norm("post_attention_norm.weight", h));
        } else {
            out.push(norm("ffn_norm.weight", h));
        }
        if let Some(moe) = shape.moe {
            let (e, f) = (moe.experts, moe.expert_ffn);
            out.push(m("ffn_gate_inp.weight", e, h, Role::Router));
            let rules = crate::arch::rules(shape.arch).moe;
            if rules.is_some_and(|r| r.router_bias) {
                out.push(bias("ffn_gate_inp.bias", e));
            }
            if rules.is_some_and(|r| r.expert_bias) {
                // `[experts, width]`, as llama.cpp's loader checks them.
                let stacked_bias = |suffix: &str, width| {
                    spec(
                        format!("blk.{i}.{suffix}"),
                        e,
                        width,
                        Role::Vector,
                        Init::Random,
                        l,
                    )
                };
                out.push(stacked_bias("ffn_gate_exps.bias", f));
                out.push(stacked_bias("ffn_up_exps.bias", f));
                out.push(stacked_bias("ffn_down_exps.bias", h));
            }
            let stacked = |t: TensorSpec| TensorSpec {
                rows: t.rows * e,
                experts: e,
                kernel: quant.experts_type(t.cols),
                ..t
            };
            out.push(stacked(m("ffn_gate_exps.weight", f, h, Role::OtherMatrix)));
            out.push(stacked(m("ffn_up_exps.weight", f, h, Role::OtherMatrix)));
            out.push(stacked(m("ffn_down_exps.weight", h, f, Role::FfnDown)));
            if let Some(sf) = moe.shared_ffn {
                out.push(bias("ffn_gate_inp_shexp.weight", h));
                out.push(m("ffn_gate_shexp.weight", sf, h, Role::OtherMatrix));
                out.push(m("ffn_up_shexp.weight", sf, h, Role::OtherMatrix));
                out.push(m("ffn_down_shexp.weight", h, sf, Role::FfnDown));
            }
        } else if layout.fused_gate_up {
            // Rows: gate, then up.
            out.push(m("ffn_up.weight", 2 * shape.ffn, h, Role::OtherMatrix));
        } else {
            out.push(m("ffn_gate.weight", shape.ffn, h, Role::OtherMatrix));
            out.push(m("ffn_up.weight", shape.ffn, h, Role::OtherMatrix));
        }
        if shape.moe.is_none() {
            out.push(m("ffn_down.weight", h, shape.ffn, Role::FfnDown));
        }
        if layout.post_norms {
            out.push(norm("post_ffw_norm.weight", h));
        }
    }
    out.push(vector("output_norm.weight".into(), h, Init::NearOne, None));
    if let Some(g) = &shape.gemma4 {
        out = g.plan(shape, quant, out);
    }
    if !shape.tied_embeddings {
        out.push(spec(
            "output.weight".into(),
            shape.vocab,
            h,
            Role::Output,
            Init::Random,
            None,
        ));
    }
    out
}

/// A Gated DeltaNet layer's tensors as llama.cpp names them. The decay
/// rates `ssm_a` are negative (`-exp(A_log)`), from -0.05 to -0.5 so the
/// state remembers over a long prompt, and the convolution's taps are
/// spread over [-0.5, 0.5] so it passes its input on at full scale.
fn deltanet_tensors(
    shape: &SynthShape,
    hy: &SynthHybrid,
    i: usize,
    quant: Quant,
) -> Vec<TensorSpec> {
    let h = shape.hidden;
    let key_dim = hy.k_heads * hy.head_dim;
    let value_dim = hy.v_heads * hy.head_dim;
    let conv_dim = 2 * key_dim + value_dim;
    let l = Some(i);
    let t = |suffix: &str, rows: usize, cols: usize, dtype: GgmlDType, init: Init| {
        TensorSpec::plain(format!("blk.{i}.{suffix}"), (rows, cols), dtype, init, l)
    };
    let matrix = |suffix: &str, rows, cols| {
        let dtype = fallback(
            quant.matrix_type(Role::OtherMatrix, i, shape.n_layers),
            cols,
        );
        t(suffix, rows, cols, dtype, Init::Random)
    };
    let f32 = GgmlDType::F32;
    let taps = (0..conv_dim * hy.conv_kernel)
        .map(|k| ((k * 7919 + i * 104_729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let decay = (0..hy.v_heads)
        .map(|v| -0.05 - 0.45 * v as f32 / hy.v_heads.max(2).saturating_sub(1) as f32)
        .collect();
    vec![
        matrix("attn_qkv.weight", conv_dim, h),
        matrix("attn_gate.weight", value_dim, h),
        t(
            "ssm_conv1d.weight",
            conv_dim,
            hy.conv_kernel,
            f32,
            Init::Values(taps),
        ),
        t("ssm_dt.bias", 1, hy.v_heads, f32, Init::Random),
        t("ssm_a", 1, hy.v_heads, f32, Init::Values(decay)),
        matrix("ssm_beta.weight", hy.v_heads, h),
        matrix("ssm_alpha.weight", hy.v_heads, h),
        t("ssm_norm.weight", 1, hy.head_dim, f32, Init::NearOne),
        matrix("ssm_out.weight", h, value_dim),
    ]
}

/// A synthetic reranker's `cls.output.weight`: the "yes" and "no" rows,
/// f32, uniform with standard deviation [`super::CLS_STD`] from their own
/// stream of `seed`.
pub(super) fn cls_output(hidden: usize, seed: u64) -> TensorSpec {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x636c_732e_6f75_7470);
    let a = super::CLS_STD * 3f32.sqrt();
    TensorSpec {
        name: "cls.output.weight".into(),
        rows: 2,
        cols: hidden,
        experts: 1,
        dtype: GgmlDType::F32,
        kernel: None,
        init: Init::Values((0..2 * hidden).map(|_| rng.random_range(-a..a)).collect()),
        layer: None,
    }
}
