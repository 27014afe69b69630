//! What a forward pass needs to know about a model, whatever its
//! architecture: dimensions, RoPE, each layer's window, how attention
//! scores and logits are made, and which tensors a block has.
//!
//! The loaders fill a [`ModelSpec`] from GGUF metadata (through the
//! architecture's entry in [`crate::arch`]) or a Hugging Face
//! `config.json`; both backends read only the spec, never the architecture's name.

use zinfer_kernels::ScoreRule;

/// Upper bound on [`ModelSpec::max_positions`]: a 128k-context model does
/// not spend memory on RoPE tables it will not use.
pub const MAX_POSITIONS: usize = 32_768;

/// Which pairs of a head's values RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i + 1)`: llama GGUF files, whose converter permutes Q/K rows for it.
    Interleaved,
    /// Pairs `(i, i + d/2)`: GPT-NeoX style (Qwen, Phi-3, Gemma, Hugging Face llama).
    Neox,
}

/// One RoPE: its style, base and scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// Pair layout.
    pub style: RopeStyle,
    /// Base frequency.
    pub theta: f32,
    /// How frequencies and angles are scaled for long contexts.
    pub scaling: RopeScaling,
}

/// Long-context RoPE scaling, in the four forms the supported checkpoints use.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// Per-frequency divisors (Llama 3 `rope_freqs`, Phi-3 long/short
    /// factors); empty for none.
    pub freq_factors: Vec<f32>,
    /// Positions are divided by this (linear scaling, Gemma 3's global layers).
    pub linear: f32,
    /// cos and sin are multiplied by this (Phi-3 LongRoPE's attention
    /// factor, `rope.scaling.attn_factor`).
    pub attn_factor: f32,
    /// YaRN (`rope.scaling.type = yarn`: Qwen and DeepSeek long-context files).
    pub yarn: Option<Yarn>,
}

impl Default for RopeScaling {
    fn default() -> Self {
        Self {
            freq_factors: Vec::new(),
            linear: 1.0,
            attn_factor: 1.0,
            yarn: None,
        }
    }
}

/// YaRN RoPE scaling as llama.cpp applies it: pairs rotating fewer than
/// `beta_slow` times over the original context are interpolated (their
/// frequency divided by `factor`), pairs rotating more than `beta_fast`
/// times are kept, a linear ramp blends the pairs between, and cos and sin
/// are scaled by `1 + 0.1 ln(factor)` (the attention factor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// How many times the original context the model is stretched to
    /// (`rope.scaling.factor`).
    pub factor: f32,
    /// Context the model was trained on before scaling
    /// (`rope.scaling.original_context_length`).
    pub original_context: usize,
    /// Rotations over the original context above which a pair is kept (32).
    pub beta_fast: f32,
    /// Rotations below which a pair is fully interpolated (1).
    pub beta_slow: f32,
}

impl Yarn {
    /// llama.cpp's defaults for `beta_fast` and `beta_slow`.
    pub fn new(factor: f32, original_context: usize) -> Self {
        Self {
            factor,
            original_context,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }

    /// The first and last pair index of the blend, as ggml's
    /// `ggml_rope_yarn_corr_dims`: the pair that turns `beta` times over
    /// the original context, rounded outwards, within `[0, head_dim - 1]`.
    pub fn corr_dims(&self, theta: f32, head_dim: usize) -> (f64, f64) {
        let d = head_dim as f64;
        let dim = |beta: f32| {
            let turns =
                self.original_context as f64 / (f64::from(beta) * 2.0 * std::f64::consts::PI);
            d * turns.ln() / (2.0 * f64::from(theta).ln())
        };
        (
            dim(self.beta_fast).floor().max(0.0),
            dim(self.beta_slow).ceil().min(d - 1.0),
        )
    }

    /// What cos and sin are multiplied by (llama.cpp's `get_mscale`).
    fn mscale(&self) -> f64 {
        if self.factor > 1.0 {
            1.0 + 0.1 * f64::from(self.factor).ln()
        } else {
            1.0
        }
    }
}

impl RopeScaling {
    /// Llama 3's per-frequency divisors, as Hugging Face's `llama3` rope
    /// type scales `inv_freq` (and llama.cpp's converter writes
    /// `rope_freqs.weight`): wavelengths shorter than `original_context /
    /// high_freq_factor` kept, longer than `original_context /
    /// low_freq_factor` divided by `factor`, a smooth blend between.
    pub fn llama3_freq_factors(
        theta: f32,
        head_dim: usize,
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: usize,
    ) -> Vec<f32> {
        let old = original_context as f64;
        let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / f64::from(theta).powf((2 * i) as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor as f32
                } else {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect()
    }
}

impl RopeSpec {
    /// Plain RoPE of `style` at base `theta`.
    pub fn plain(style: RopeStyle, theta: f32) -> Self {
        Self {
            style,
            theta,
            scaling: RopeScaling::default(),
        }
    }

    /// cos and sin tables, `[positions, head_dim / 2]` row-major.
    pub(crate) fn tables(&self, head_dim: usize, positions: usize) -> (Vec<f32>, Vec<f32>) {
        let half = head_dim / 2;
        let s = &self.scaling;
        let blend = s.yarn.map(|y| (y, y.corr_dims(self.theta, head_dim)));
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| {
                let factor = s.freq_factors.get(i).map_or(1.0, |&f| f64::from(f));
                let kept = 1.0
                    / f64::from(self.theta).powf(2.0 * i as f64 / head_dim as f64)
                    / factor
                    / f64::from(s.linear);
                match blend {
                    None => kept,
                    Some((y, (low, high))) => {
                        // 1 at and below `low` (kept), 0 from `high` on (interpolated).
                        let ramp =
                            1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                        let interpolated = kept / f64::from(y.factor);
                        interpolated * (1.0 - ramp) + kept * ramp
                    }
                }
            })
            .collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        let mscale = f64::from(s.attn_factor) * blend.map_or(1.0, |(y, _)| y.mscale());
        for p in 0..positions {
            for &f in &inv_freq {
                let angle = p as f64 * f;
                cos.push((angle.cos() * mscale) as f32);
                sin.push((angle.sin() * mscale) as f32);
            }
        }
        (cos, sin)
    }
}

/// What one layer does differently from the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Keys a row sees, itself included, with a sliding window; `None` for all.
    pub window: Option<usize>,
    /// Index of the layer's RoPE in [`ModelSpec::ropes`].
    pub rope: usize,
    /// The layer's KV heads (Gemma 4's global layers have fewer).
    pub n_kv_heads: usize,
    /// Width of the layer's heads (Gemma 4's global layers' are wider).
    pub head_dim: usize,
    /// An earlier layer whose K and V this one attends over, writing none
    /// of its own (Gemma 4's last layers); `None`: its own.
    pub kv_from: Option<usize>,
    /// Inner width of the layer's dense MLP (Gemma 4's shared-KV layers'
    /// may be twice the others').
    pub ffn: usize,
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (Llama, Qwen, Phi-3).
    Silu,
    /// `gelu_tanh(gate) * up` (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU, `g sigmoid(1.702 g) (u + 1)` with the gate
    /// capped at 7 and up clamped to `[-7, 7]` (llama.cpp's `swiglu_oai`).
    SwigluOai,
}

/// How a router's logits become each token's experts and their weights,
/// as llama.cpp's MoE graph has them; the weighted experts' outputs are
/// summed after their down projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over every expert, the `used` most probable kept, their
    /// probabilities divided by their sum when `renormalize` (Qwen3-MoE).
    SoftmaxTopK {
        /// Whether the kept probabilities are scaled to sum to one.
        renormalize: bool,
    },
    /// The `used` highest logits kept, softmax over those alone (gpt-oss).
    TopKSoftmax,
}

/// A mixture-of-experts MLP in place of the dense one: a router
/// (`ffn_gate_inp`) scores `experts` expert MLPs per token and the
/// `used` best run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeSpec {
    /// Experts per layer (`{arch}.expert_count`).
    pub experts: usize,
    /// Experts each token runs (`{arch}.expert_used_count`).
    pub used: usize,
    /// Inner width of one expert's MLP (`{arch}.expert_feed_forward_length`).
    pub expert_ffn: usize,
    /// How router logits become expert weights.
    pub gating: Gating,
    /// The router has a bias (`ffn_gate_inp.bias`).
    pub router_bias: bool,
    /// Each expert's gate, up and down projections have biases
    /// (`ffn_{gate,up,down}_exps.bias`, `[experts, width]`: gpt-oss).
    pub expert_bias: bool,
    /// The chosen weights are multiplied by this (1 for none).
    pub weights_scale: f32,
    /// Inner width of a shared expert every token runs beside its routed
    /// ones, its output scaled by `sigmoid(x . ffn_gate_inp_shexp)`
    /// (Qwen2-MoE); `None` without one.
    pub shared_ffn: Option<usize>,
}

/// Which tensors a block has beyond the Llama set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockLayout {
    /// One `attn_qkv` matrix (Q, K and V rows stacked) instead of three.
    pub fused_qkv: bool,
    /// Biases on Q, K and V (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and MLP outputs before they join the
    /// residual (Gemma 2 and 3).
    pub post_norms: bool,
    /// One `ffn_up` matrix holding the gate rows then the up rows (Phi-3).
    pub fused_gate_up: bool,
    /// A bias on the attention output projection (`attn_output.bias`: gpt-oss).
    pub attn_output_bias: bool,
    /// A learned logit per query head that joins every softmax's
    /// denominator (`attn_sinks.weight`: gpt-oss).
    pub attn_sinks: bool,
    /// The MLP's input norm is named `post_attention_norm` (gpt-oss), not
    /// `ffn_norm`; it is the same norm, before the MLP.
    pub ffn_norm_after_attention: bool,
}

/// A model's shape and hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// The architecture's name (`general.architecture`).
    pub arch: &'static str,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (fewer than `n_heads` with grouped-query attention).
    pub n_kv_heads: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of one attention head (not always `hidden / n_heads`).
    pub head_dim: usize,
    /// Inner width of the MLP.
    pub ffn: usize,
    /// Token vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// Longest sequence the RoPE tables cover: the model's context, capped
    /// at [`MAX_POSITIONS`].
    pub max_positions: usize,
    /// The model's RoPEs; layers pick one (Gemma 3's local layers use their own base).
    pub ropes: Vec<RopeSpec>,
    /// Per layer: window and RoPE.
    pub layers: Vec<LayerSpec>,
    /// How attention scores are made.
    pub attn: ScoreRule,
    /// The MLP's activation.
    pub activation: Activation,
    /// The embedding rows are multiplied by this (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// Logits become `c * tanh(logit / c)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The block's tensors.
    pub layout: BlockLayout,
    /// A mixture of experts in place of every layer's dense MLP; `None`
    /// for dense models.
    pub moe: Option<MoeSpec>,
    /// Gated DeltaNet layers among the attention ones, with partial RoPE
    /// and gated attention output (Qwen3.5); `None` for pure transformers.
    pub hybrid: Option<crate::deltanet::HybridSpec>,
    /// Width of each layer's slice of the per-layer token embeddings
    /// (Gemma 4 E2B/E4B, [`crate::ple`]); `None` without them.
    pub per_layer_input: Option<usize>,
    /// V is RMS-normed per head without a weight after its projection (Gemma 4).
    pub v_norm: bool,
    /// [`ModelSpec::moe`]'s experts run beside each layer's dense MLP
    /// rather than in its place (Gemma 4 26B-A4B).
    pub dense_beside_moe: bool,
}

impl ModelSpec {
    /// The KV pool's shape: layers, KV heads, key and value widths. When
    /// layers differ in width or some read another layer's KV, the pool is
    /// described as one layer whose row is every owning layer's row end to
    /// end: the bytes per token and a transfer's length are the same.
    pub fn kv_shape(&self) -> zinfer_probe::KvShape {
        let uniform = self.layers.iter().all(|l| {
            l.kv_from.is_none() && l.n_kv_heads == self.n_kv_heads && l.head_dim == self.head_dim
        });
        if uniform {
            return zinfer_probe::KvShape {
                layers: self.n_layers,
                kv_heads: self.n_kv_heads,
                key_dim: self.head_dim,
                value_dim: self.head_dim,
            };
        }
        let width = self.kv_layer_dims().iter().sum();
        zinfer_probe::KvShape {
            layers: 1,
            kv_heads: 1,
            key_dim: width,
            value_dim: width,
        }
    }

    /// Whether `layer` keeps K and V rows of its own: not one that reads
    /// another layer's KV, nor a recurrent layer of a hybrid model (its
    /// state is per sequence, not per token).
    pub fn owns_kv(&self, layer: usize) -> bool {
        let recurrent = self
            .hybrid
            .as_ref()
            .is_some_and(|h| h.recurrent.get(layer).copied().unwrap_or(false));
        self.layers[layer].kv_from.is_none() && !recurrent
    }

    /// Width of one K (or V) row of each layer that keeps its own KV, in
    /// layer order: the KV pool's layers.
    pub fn kv_layer_dims(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| self.owns_kv(l))
            .map(|l| self.layers[l].n_kv_heads * self.layers[l].head_dim)
            .collect()
    }

    /// The KV pool layer `layer` reads and writes (its own, or the one of
    /// the layer it shares).
    pub fn kv_pool_layer(&self, layer: usize) -> usize {
        let owner = self.layers[layer].kv_from.unwrap_or(layer);
        (0..owner).filter(|&l| self.owns_kv(l)).count()
    }

    /// Query, KV heads and head width of `layer`'s attention.
    pub fn layer_heads(&self, layer: usize) -> zinfer_kernels::HeadShape {
        let l = &self.layers[layer];
        zinfer_kernels::HeadShape {
            n_heads: self.n_heads,
            n_kv_heads: l.n_kv_heads,
            head_dim: l.head_dim,
        }
    }

    /// Widest query and K rows over the layers.
    pub fn max_q_kv_dims(&self) -> (usize, usize) {
        self.layers.iter().fold((0, 0), |(q, kv), l| {
            (
                q.max(self.n_heads * l.head_dim),
                kv.max(l.n_kv_heads * l.head_dim),
            )
        })
    }

    /// Width of one K (or V) row: KV heads times head width.
    pub fn kv_dim(&self) -> usize {
        self.kv_shape().kv_dim()
    }

    /// Width of the query projection output.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Widest MLP inner width a layer runs: the dense MLP's, or one expert's.
    pub fn mlp_width(&self) -> usize {
        let dense = self.layers.iter().map(|l| l.ffn).fold(self.ffn, usize::max);
        let beside = if self.dense_beside_moe { dense } else { 0 };
        self.moe.map_or(dense, |m| {
            m.expert_ffn.max(m.shared_ffn.unwrap_or(0)).max(beside)
        })
    }

    /// Leading dimensions of a head that RoPE rotates (all of them but
    /// with [`Self::hybrid`]'s partial RoPE).
    pub fn rotary_dims(&self) -> usize {
        self.hybrid.as_ref().map_or(self.head_dim, |h| h.rope_dims)
    }

    /// Every layer with the same window, heads and the first RoPE.
    pub(crate) fn uniform_layers(
        n_layers: usize,
        window: Option<usize>,
        n_kv_heads: usize,
        head_dim: usize,
        ffn: usize,
    ) -> Vec<LayerSpec> {
        let layer = LayerSpec {
            window,
            rope: 0,
            n_kv_heads,
            head_dim,
            kv_from: None,
            ffn,
        };
        vec![layer; n_layers]
    }

    /// Checks the relations the forward passes rely on.
    pub(crate) fn validate(&self) -> Result<(), SpecError> {
        if [self.n_layers, self.n_heads, self.n_kv_heads, self.hidden]
            .into_iter()
            .chain([self.head_dim, self.ffn, self.vocab])
            .any(|d| d == 0)
        {
            return Err(SpecError::ZeroDimension(format!("{self:?}")));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(SpecError::HeadGroups {
                heads: self.n_heads,
                kv_heads: self.n_kv_heads,
            });
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(SpecError::OddHeadDim(self.head_dim));
        }
        if self.max_positions == 0 {
            return Err(SpecError::NoContext);
        }
        if self.layers.len() != self.n_layers {
            return Err(SpecError::LayerSpecs {
                specs: self.layers.len(),
                layers: self.n_layers,
            });
        }
        for (i, l) in self.layers.iter().enumerate() {
            let shared_ok = l.kv_from.is_none_or(|from| {
                from < i
                    && self.layers[from].kv_from.is_none()
                    && self.layers[from].n_kv_heads == l.n_kv_heads
                    && self.layers[from].head_dim == l.head_dim
            });
            if l.rope >= self.ropes.len()
                || l.window == Some(0)
                || l.n_kv_heads == 0
                || !self.n_heads.is_multiple_of(l.n_kv_heads)
                || l.head_dim == 0
                || !l.head_dim.is_multiple_of(2)
                || l.ffn == 0
                || !shared_ok
            {
                return Err(SpecError::Layer {
                    index: i,
                    spec: format!("{l:?}"),
                });
            }
            let n = self.ropes[l.rope].scaling.freq_factors.len();
            if n != 0 && n != l.head_dim / 2 {
                return Err(SpecError::FreqFactors {
                    got: n,
                    want: l.head_dim / 2,
                });
            }
        }
        for r in &self.ropes {
            let yarn_ok = r.scaling.yarn.is_none_or(|y| {
                y.factor > 0.0 && y.original_context > 0 && y.beta_fast > 0.0 && y.beta_slow > 0.0
            });
            if !(r.theta > 0.0 && r.scaling.linear > 0.0 && yarn_ok) {
                return Err(SpecError::RopeNotPositive(format!("{r:?}")));
            }
        }
        if let Some(m) = &self.moe
            && (m.experts == 0
                || m.used == 0
                || m.used > m.experts
                || m.expert_ffn == 0
                || m.shared_ffn == Some(0)
                || !(m.weights_scale.is_finite() && m.weights_scale > 0.0))
        {
            return Err(SpecError::Experts(format!("{m:?}")));
        }
        let caps = [self.attn.softcap, self.final_softcap];
        if caps.into_iter().flatten().any(|c| c.is_nan() || c <= 0.0) {
            return Err(SpecError::Softcap);
        }
        Ok(())
    }
}

/// Why a [`ModelSpec`]'s dimensions cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A dimension is zero (the spec, printed).
    #[error("model config has a zero dimension: {0}")]
    ZeroDimension(String),
    /// Query heads do not split evenly over KV heads.
    #[error("{heads} query heads are not a multiple of {kv_heads} KV heads")]
    HeadGroups {
        /// Query heads.
        heads: usize,
        /// KV heads.
        kv_heads: usize,
    },
    /// RoPE rotates pairs, so a head needs an even width.
    #[error("head_dim {0} is odd")]
    OddHeadDim(usize),
    /// No context length.
    #[error("model config has no context length")]
    NoContext,
    /// Per-layer specs for another number of layers.
    #[error("{specs} layer specs for {layers} layers")]
    LayerSpecs {
        /// Layer specs given.
        specs: usize,
        /// Layers of the model.
        layers: usize,
    },
    /// A layer names a RoPE that is not there, or a zero window.
    #[error("layer {index} has an invalid spec {spec}")]
    Layer {
        /// The layer.
        index: usize,
        /// Its spec, printed.
        spec: String,
    },
    /// RoPE frequency factors of another count than half a head.
    #[error("RoPE has {got} frequency factors, expected {want}")]
    FreqFactors {
        /// Factors given.
        got: usize,
        /// Half the head width.
        want: usize,
    },
    /// A RoPE base or scale that is not positive (the RoPE, printed).
    #[error("RoPE base and scale must be positive: {0}")]
    RopeNotPositive(String),
    /// A softcap that is not positive.
    #[error("softcaps must be positive")]
    Softcap,
    /// Experts that cannot run: none, more used than there are, no width,
    /// or a weight scale that is not positive (the MoE spec, printed).
    #[error("invalid mixture of experts: {0}")]
    Experts(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YaRN's tables against llama.cpp's formulas re-derived independently
    /// in float64 Python: `python3 scripts/llamacpp-reference/yarn_rope.py`
    /// printed the correction dims, the scale and these (position, pair,
    /// cos, sin) for a Qwen3-like head (128 wide, base 1e6, factor 4 over
    /// 32,768 tokens, attention factor 1.25). Pairs 0-23 kept, 40 on
    /// interpolated, 30 on the ramp.
    #[test]
    fn yarn_matches_llama_cpps_formula() {
        let yarn = Yarn::new(4.0, 32_768);
        assert_eq!(yarn.corr_dims(1e6, 128), (23.0, 40.0));
        let rope = RopeSpec {
            style: RopeStyle::Neox,
            theta: 1e6,
            scaling: RopeScaling {
                attn_factor: 1.25,
                yarn: Some(yarn),
                ..RopeScaling::default()
            },
        };
        let (cos, sin) = rope.tables(128, 30_001);
        let want = [
            (1, 0, 0.7690051, 1.1976545),
            (1, 10, 1.4138074, 0.1639935),
            (1, 23, 1.4232521, 0.0099320),
            (1, 30, 1.423286, 0.0015149),
            (1, 40, 1.4232868, 0.0000633),
            (1, 63, 1.4232868, 0.0000004),
            (1000, 0, 0.8004267, 1.1768867),
            (1000, 10, -1.0309337, 0.9812853),
            (1000, 23, 1.0930508, 0.9115839),
            (1000, 30, 0.6903839, 1.2446346),
            (1000, 40, 1.4218805, 0.0632542),
            (1000, 63, 1.4232867, 0.0004416),
            (30000, 0, -0.8488903, -1.1424231),
            (30000, 10, -0.9597613, 1.0510012),
            (30000, 23, -0.5975462, 1.2917754),
            (30000, 30, 1.2387442, 0.7008981),
            (30000, 40, 0.3342901, 1.3834722),
            (30000, 63, 1.4232252, 0.0132464),
        ];
        for (pos, pair, c, s) in want {
            let at = pos * 64 + pair;
            assert!(
                (cos[at] - c).abs() < 2e-6,
                "cos {pos} {pair}: {} vs {c}",
                cos[at]
            );
            assert!(
                (sin[at] - s).abs() < 2e-6,
                "sin {pos} {pair}: {} vs {s}",
                sin[at]
            );
        }
        // Without YaRN the same head rotates pair 63 four times faster.
        let plain = RopeSpec::plain(RopeStyle::Neox, 1e6).tables(128, 30_001);
        assert!((plain.1[30000 * 64 + 63] - 0.0132464 * 4.0 / 1.4232868).abs() < 1e-4);
    }
}
