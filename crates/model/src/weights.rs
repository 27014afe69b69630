//! A model's weights as both backends hold them: one [`Block`] type with
//! the optional parts the architectures need, and one reading of every
//! tensor, by name, from any [`TensorSource`] (a GGUF file for the CPU
//! kernels or a candle device, a safetensors directory).
//!
//! Fused matrices (Phi-3's `attn_qkv` and `ffn_up`) stay fused: one
//! matmul instead of three or two.

use super::ModelError;
use super::spec::{ModelSpec, MoeSpec};

/// Q, K and V projections.
#[derive(Debug)]
pub(crate) enum Qkv<M> {
    /// Three matrices.
    Separate {
        /// `[q_dim, hidden]`.
        q: M,
        /// `[kv_dim, hidden]`.
        k: M,
        /// `[kv_dim, hidden]`.
        v: M,
    },
    /// One `[q_dim + 2 kv_dim, hidden]` matrix: Q rows, then K, then V.
    Fused(M),
    /// Q and K; V is the K projection before K's norm and RoPE (a Gemma 4
    /// layer without `attn_v`).
    KeyAsValue {
        /// `[q_dim, hidden]`.
        q: M,
        /// `[kv_dim, hidden]`.
        k: M,
    },
    /// Q alone: the layer reads another layer's KV ([`crate::spec::LayerSpec::kv_from`]).
    QueryOnly(M),
}

/// The MLP's gate and up projections.
#[derive(Debug)]
pub(crate) enum GateUp<M> {
    /// Two `[ffn, hidden]` matrices.
    Separate {
        /// Goes through the activation.
        gate: M,
        /// Multiplies the activated gate.
        up: M,
    },
    /// One `[2 ffn, hidden]` matrix: the gate rows, then the up rows.
    Fused(M),
}

/// A dense MLP: gate and up projections, then down.
#[derive(Debug)]
pub(crate) struct Ffn<M> {
    pub(crate) gate_up: GateUp<M>,
    /// `[hidden, ffn]`.
    pub(crate) down: M,
}

/// A block's MLP: one dense MLP, or a router over expert MLPs.
#[derive(Debug)]
pub(crate) enum Mlp<M, V> {
    Dense(Ffn<M>),
    Moe(Experts<M, V>),
    /// A dense MLP and a mixture of experts side by side (Gemma 4 26B-A4B).
    DenseAndMoe(Box<DenseAndMoe<M, V>>),
}

/// Gemma 4's MoE block: the dense MLP's output (its input the block's
/// `ffn_norm`) normed by `post_norm_1`, plus the experts' output (their
/// input normed by `pre_norm_2`, the router's the residual RMS-normed,
/// divided by `sqrt(hidden)` and scaled by `router_scale`) normed by
/// `post_norm_2`; the block's `post_ffn_norm` then norms the sum.
#[derive(Debug)]
pub(crate) struct DenseAndMoe<M, V> {
    pub(crate) dense: Ffn<M>,
    pub(crate) post_norm_1: V,
    pub(crate) pre_norm_2: V,
    pub(crate) post_norm_2: V,
    /// `ffn_gate_inp.scale`: `[hidden]` (the CPU model folds the router's
    /// `1 / sqrt(hidden)` into it at load).
    pub(crate) router_scale: V,
    /// Experts with fused gate|up matrices.
    pub(crate) experts: Experts<M, V>,
    /// `ffn_down_exps.scale`: each expert's output is multiplied by its value.
    pub(crate) down_scales: Option<V>,
}

/// A mixture of experts ([`crate::spec::MoeSpec`]): each expert's matrices
/// apart, split from the checkpoint's stacked `[experts, rows, cols]`
/// tensors, so a backend runs only the experts a step routes to.
#[derive(Debug)]
pub(crate) struct Experts<M, V> {
    /// How many experts, how many a token runs, and how they are weighted.
    pub(crate) spec: MoeSpec,
    /// `[experts, hidden]`: one logit per expert.
    pub(crate) router: M,
    pub(crate) router_bias: Option<V>,
    /// `[expert_ffn, hidden]` gate and up, `[hidden, expert_ffn]` down.
    pub(crate) experts: Vec<Ffn<M>>,
    /// The shared expert every row runs, and its gate's `[hidden]` weights.
    pub(crate) shared: Option<(Ffn<M>, V)>,
    /// The experts' biases, stacked as in the checkpoint.
    pub(crate) biases: Option<ExpertBiases<V>>,
}

/// Every expert's gate, up and down biases, expert after expert:
/// `[experts * expert_ffn]`, `[experts * expert_ffn]`, `[experts * hidden]`.
#[derive(Debug)]
pub(crate) struct ExpertBiases<V> {
    pub(crate) gate: V,
    pub(crate) up: V,
    pub(crate) down: V,
}

/// One transformer block. `M` is a matrix, `V` a vector, in the backend's types.
#[derive(Debug)]
pub(crate) struct Block<M, V> {
    pub(crate) attn_norm: V,
    pub(crate) qkv: Qkv<M>,
    /// Q, K and V biases end to end (`q_dim + 2 kv_dim`).
    pub(crate) qkv_bias: Option<V>,
    /// Per-head RMSNorm weights of Q and K (`head_dim` each).
    pub(crate) qk_norm: Option<(V, V)>,
    pub(crate) attn_output: M,
    /// Bias of the attention output projection (`hidden`).
    pub(crate) attn_output_bias: Option<V>,
    /// Per query head, a logit in every softmax's denominator (`n_heads`).
    pub(crate) sinks: Option<V>,
    /// RMSNorm of the attention output before the residual add.
    pub(crate) post_attn_norm: Option<V>,
    pub(crate) ffn_norm: V,
    pub(crate) mlp: Mlp<M, V>,
    /// RMSNorm of the MLP output before the residual add.
    pub(crate) post_ffn_norm: Option<V>,
    /// The block's output is multiplied by this one value (Gemma 4's
    /// `layer_output_scale`).
    pub(crate) out_scale: Option<V>,
}

/// Every weight of a model. `E` is the embedding table's type.
#[derive(Debug)]
pub(crate) struct Weights<E, M, V> {
    pub(crate) token_embd: E,
    pub(crate) blocks: Vec<Block<M, V>>,
    pub(crate) output_norm: V,
    /// The LM head (the embedding's storage when the checkpoint ties them).
    pub(crate) output: M,
    /// Per-layer token embeddings (Gemma 4 E2B/E4B).
    pub(crate) ple: Option<crate::ple::PerLayerInputs<E, M, V>>,
}

/// One tensor of a checkpoint, named by its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    TokenEmbd,
    Output,
    OutputNorm,
    AttnNorm,
    Q,
    K,
    V,
    Qkv,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    AttnOutput,
    AttnOutputBias,
    AttnSinks,
    PostAttnNorm,
    FfnNorm,
    Gate,
    Up,
    GateUp,
    Down,
    PostFfnNorm,
    Router,
    RouterBias,
    GateExps,
    UpExps,
    DownExps,
    GateExpsBias,
    UpExpsBias,
    DownExpsBias,
    SharedGateInp,
    SharedGate,
    SharedUp,
    SharedDown,
}

/// How a checkpoint format names its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Naming {
    /// llama.cpp's names (`blk.N.attn_q.weight`).
    Gguf,
    /// Hugging Face llama names (`model.layers.N.self_attn.q_proj.weight`);
    /// only llama directories load, so the other parts' names are unused
    /// (Gemma's MLP norm, for one, is `pre_feedforward_layernorm` there).
    HuggingFace,
}

impl Naming {
    /// The name of `part` in `layer` (ignored for the model-wide parts).
    pub(crate) fn name(self, part: Part, layer: usize) -> String {
        use Part::*;
        let (gguf, hf) = match part {
            TokenEmbd => return self.global("token_embd.weight", "model.embed_tokens.weight"),
            Output => return self.global("output.weight", "lm_head.weight"),
            OutputNorm => return self.global("output_norm.weight", "model.norm.weight"),
            AttnNorm => ("attn_norm.weight", "input_layernorm.weight"),
            Q => ("attn_q.weight", "self_attn.q_proj.weight"),
            K => ("attn_k.weight", "self_attn.k_proj.weight"),
            V => ("attn_v.weight", "self_attn.v_proj.weight"),
            Qkv => ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
            QBias => ("attn_q.bias", "self_attn.q_proj.bias"),
            KBias => ("attn_k.bias", "self_attn.k_proj.bias"),
            VBias => ("attn_v.bias", "self_attn.v_proj.bias"),
            QNorm => ("attn_q_norm.weight", "self_attn.q_norm.weight"),
            KNorm => ("attn_k_norm.weight", "self_attn.k_norm.weight"),
            AttnOutput => ("attn_output.weight", "self_attn.o_proj.weight"),
            AttnOutputBias => ("attn_output.bias", "self_attn.o_proj.bias"),
            AttnSinks => ("attn_sinks.weight", "self_attn.sinks"),
            PostAttnNorm => (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight",
            ),
            FfnNorm => ("ffn_norm.weight", "post_attention_layernorm.weight"),
            Gate => ("ffn_gate.weight", "mlp.gate_proj.weight"),
            Up => ("ffn_up.weight", "mlp.up_proj.weight"),
            GateUp => ("ffn_up.weight", "mlp.gate_up_proj.weight"),
            Down => ("ffn_down.weight", "mlp.down_proj.weight"),
            PostFfnNorm => ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
            // Hugging Face keeps experts apart (`mlp.experts.N.gate_proj`);
            // only llama directories load, so these names are unused.
            Router => ("ffn_gate_inp.weight", "mlp.gate.weight"),
            RouterBias => ("ffn_gate_inp.bias", "mlp.gate.bias"),
            GateExps => ("ffn_gate_exps.weight", "mlp.experts.gate_proj.weight"),
            UpExps => ("ffn_up_exps.weight", "mlp.experts.up_proj.weight"),
            DownExps => ("ffn_down_exps.weight", "mlp.experts.down_proj.weight"),
            GateExpsBias => ("ffn_gate_exps.bias", "mlp.experts.gate_proj.bias"),
            UpExpsBias => ("ffn_up_exps.bias", "mlp.experts.up_proj.bias"),
            DownExpsBias => ("ffn_down_exps.bias", "mlp.experts.down_proj.bias"),
            SharedGateInp => ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
            SharedGate => (
                "ffn_gate_shexp.weight",
                "mlp.shared_expert.gate_proj.weight",
            ),
            SharedUp => ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
            SharedDown => (
                "ffn_down_shexp.weight",
                "mlp.shared_expert.down_proj.weight",
            ),
        };
        match self {
            Self::Gguf => format!("blk.{layer}.{gguf}"),
            Self::HuggingFace => format!("model.layers.{layer}.{hf}"),
        }
    }

    fn global(self, gguf: &str, hf: &str) -> String {
        match self {
            Self::Gguf => gguf.to_string(),
            Self::HuggingFace => hf.to_string(),
        }
    }
}

/// Where a backend reads tensors from, in its own types.
pub(crate) trait TensorSource {
    /// The embedding table.
    type Embedding;
    /// A weight matrix applied as `x @ W^T`.
    type Matrix;
    /// A norm weight or bias.
    type Vector;

    /// Whether the checkpoint has its own LM head `name`; without one the
    /// embedding table doubles as the head (tied embeddings).
    fn has_own_head(&self, name: &str) -> bool;
    /// Whether the checkpoint has tensor `name` (for optional ones).
    fn has(&self, name: &str) -> bool;
    /// The `[rows, cols]` matrix `name`; fails on another shape.
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Self::Matrix, ModelError>;
    /// The vector `name` of `len` values; fails on another length.
    fn vector(&mut self, name: &str, len: usize) -> Result<Self::Vector, ModelError>;
    /// The stacked `[experts, rows, cols]` tensor `name`, one `[rows, cols]`
    /// matrix per expert; fails on another shape.
    fn experts(
        &mut self,
        name: &str,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Self::Matrix>, ModelError>;
    /// Vectors end to end.
    fn concat(&mut self, parts: Vec<Self::Vector>) -> Result<Self::Vector, ModelError>;
    /// The `[rows, cols]` embedding table, and, when `tied`, an LM head over
    /// the same storage.
    fn embedding(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        tied: bool,
    ) -> Result<(Self::Embedding, Option<Self::Matrix>), ModelError>;
}

/// The weights a [`TensorSource`] reads, in its types.
pub(crate) type SourceWeights<S> = Weights<
    <S as TensorSource>::Embedding,
    <S as TensorSource>::Matrix,
    <S as TensorSource>::Vector,
>;

/// The embedding table and the LM head (the table's storage when the
/// checkpoint has no head of its own).
pub(crate) fn embedding_and_head<S: TensorSource>(
    src: &mut S,
    spec: &ModelSpec,
    naming: Naming,
) -> Result<(S::Embedding, S::Matrix), ModelError> {
    let h = spec.hidden;
    let output_name = naming.name(Part::Output, 0);
    let tied = !src.has_own_head(&output_name);
    let (token_embd, tied_head) =
        src.embedding(&naming.name(Part::TokenEmbd, 0), spec.vocab, h, tied)?;
    let output = match tied_head {
        Some(head) => head,
        None => src.matrix(&output_name, spec.vocab, h)?,
    };
    Ok((token_embd, output))
}

/// Reads every weight `spec` calls for from `src`, checking each shape.
pub(crate) fn read<S: TensorSource>(
    src: &mut S,
    spec: &ModelSpec,
    naming: Naming,
) -> Result<SourceWeights<S>, ModelError> {
    let h = spec.hidden;
    let l = spec.layout;
    let (token_embd, output) = embedding_and_head(src, spec, naming)?;
    let mut blocks = Vec::with_capacity(spec.n_layers);
    for i in 0..spec.n_layers {
        let name = |part| naming.name(part, i);
        let ls = spec.layers[i];
        let (q, kv, d) = (
            spec.n_heads * ls.head_dim,
            ls.n_kv_heads * ls.head_dim,
            ls.head_dim,
        );
        let own_kv = ls.kv_from.is_none();
        let qkv = if l.fused_qkv {
            Qkv::Fused(src.matrix(&name(Part::Qkv), q + 2 * kv, h)?)
        } else if !own_kv {
            Qkv::QueryOnly(src.matrix(&name(Part::Q), q, h)?)
        } else if spec.v_norm && !src.has(&name(Part::V)) {
            Qkv::KeyAsValue {
                q: src.matrix(&name(Part::Q), q, h)?,
                k: src.matrix(&name(Part::K), kv, h)?,
            }
        } else {
            Qkv::Separate {
                q: src.matrix(&name(Part::Q), q, h)?,
                k: src.matrix(&name(Part::K), kv, h)?,
                v: src.matrix(&name(Part::V), kv, h)?,
            }
        };
        let qkv_bias = if l.qkv_bias {
            let parts = vec![
                src.vector(&name(Part::QBias), q)?,
                src.vector(&name(Part::KBias), kv)?,
                src.vector(&name(Part::VBias), kv)?,
            ];
            Some(src.concat(parts)?)
        } else {
            None
        };
        let qk_norm = if l.qk_norm {
            // A layer reading another's KV has no K (its norm is unused).
            let k_norm = if own_kv {
                src.vector(&name(Part::KNorm), d)?
            } else {
                src.vector(&name(Part::QNorm), d)?
            };
            Some((src.vector(&name(Part::QNorm), d)?, k_norm))
        } else {
            None
        };
        let mlp = read_mlp(src, spec, naming, i)?;
        let optional = |src: &mut S, has, part, len| -> Result<Option<S::Vector>, ModelError> {
            if has {
                Ok(Some(src.vector(&name(part), len)?))
            } else {
                Ok(None)
            }
        };
        let post = |src: &mut S, part| optional(src, l.post_norms, part, h);
        let ffn_norm = if l.ffn_norm_after_attention {
            Part::PostAttnNorm
        } else {
            Part::FfnNorm
        };
        blocks.push(Block {
            attn_norm: src.vector(&name(Part::AttnNorm), h)?,
            qkv,
            qkv_bias,
            qk_norm,
            attn_output: src.matrix(&name(Part::AttnOutput), h, q)?,
            attn_output_bias: optional(src, l.attn_output_bias, Part::AttnOutputBias, h)?,
            sinks: optional(src, l.attn_sinks, Part::AttnSinks, spec.n_heads)?,
            post_attn_norm: post(src, Part::PostAttnNorm)?,
            ffn_norm: src.vector(&name(ffn_norm), h)?,
            mlp,
            post_ffn_norm: post(src, Part::PostFfnNorm)?,
            out_scale: {
                let scale = format!("blk.{i}.layer_output_scale.weight");
                if src.has(&scale) {
                    Some(src.vector(&scale, 1)?)
                } else {
                    None
                }
            },
        });
    }
    Ok(Weights {
        token_embd,
        blocks,
        output_norm: src.vector(&naming.name(Part::OutputNorm, 0), h)?,
        output,
        ple: crate::ple::read(src, spec)?,
    })
}

/// Layer `i`'s MLP: the dense one, the experts `spec.moe` declares, or
/// both side by side (`spec.dense_beside_moe`).
pub(crate) fn read_mlp<S: TensorSource>(
    src: &mut S,
    spec: &ModelSpec,
    naming: Naming,
    i: usize,
) -> Result<Mlp<S::Matrix, S::Vector>, ModelError> {
    let (h, ffn, l) = (spec.hidden, spec.layers[i].ffn, spec.layout);
    let name = |part| naming.name(part, i);
    Ok(match &spec.moe {
        Some(moe) if spec.dense_beside_moe => {
            let (e, f) = (moe.experts, moe.expert_ffn);
            let blk = |suffix: &str| format!("blk.{i}.{suffix}");
            let dense = Ffn {
                gate_up: GateUp::Separate {
                    gate: src.matrix(&name(Part::Gate), ffn, h)?,
                    up: src.matrix(&name(Part::Up), ffn, h)?,
                },
                down: src.matrix(&name(Part::Down), h, ffn)?,
            };
            let gate_ups = src.experts(&blk("ffn_gate_up_exps.weight"), e, 2 * f, h)?;
            let downs = src.experts(&name(Part::DownExps), e, h, f)?;
            let experts = gate_ups
                .into_iter()
                .zip(downs)
                .map(|(gate_up, down)| Ffn {
                    gate_up: GateUp::Fused(gate_up),
                    down,
                })
                .collect();
            let down_scales = blk("ffn_down_exps.scale");
            let down_scales = if src.has(&down_scales) {
                Some(src.vector(&down_scales, e)?)
            } else {
                None
            };
            Mlp::DenseAndMoe(Box::new(DenseAndMoe {
                dense,
                post_norm_1: src.vector(&blk("post_ffw_norm_1.weight"), h)?,
                pre_norm_2: src.vector(&blk("pre_ffw_norm_2.weight"), h)?,
                post_norm_2: src.vector(&blk("post_ffw_norm_2.weight"), h)?,
                router_scale: src.vector(&blk("ffn_gate_inp.scale"), h)?,
                experts: Experts {
                    spec: *moe,
                    router: src.matrix(&name(Part::Router), e, h)?,
                    router_bias: None,
                    experts,
                    shared: None,
                    biases: None,
                },
                down_scales,
            }))
        }
        None => {
            let gate_up = if l.fused_gate_up {
                GateUp::Fused(src.matrix(&name(Part::GateUp), 2 * ffn, h)?)
            } else {
                GateUp::Separate {
                    gate: src.matrix(&name(Part::Gate), ffn, h)?,
                    up: src.matrix(&name(Part::Up), ffn, h)?,
                }
            };
            let down = src.matrix(&name(Part::Down), h, ffn)?;
            Mlp::Dense(Ffn { gate_up, down })
        }
        Some(moe) => {
            let (e, f) = (moe.experts, moe.expert_ffn);
            let router = src.matrix(&name(Part::Router), e, h)?;
            let router_bias = if moe.router_bias {
                Some(src.vector(&name(Part::RouterBias), e)?)
            } else {
                None
            };
            let gates = src.experts(&name(Part::GateExps), e, f, h)?;
            let ups = src.experts(&name(Part::UpExps), e, f, h)?;
            let downs = src.experts(&name(Part::DownExps), e, h, f)?;
            let experts = gates
                .into_iter()
                .zip(ups)
                .zip(downs)
                .map(|((gate, up), down)| Ffn {
                    gate_up: GateUp::Separate { gate, up },
                    down,
                })
                .collect();
            let shared = match moe.shared_ffn {
                Some(sf) => {
                    let ffn = Ffn {
                        gate_up: GateUp::Separate {
                            gate: src.matrix(&name(Part::SharedGate), sf, h)?,
                            up: src.matrix(&name(Part::SharedUp), sf, h)?,
                        },
                        down: src.matrix(&name(Part::SharedDown), h, sf)?,
                    };
                    Some((ffn, src.vector(&name(Part::SharedGateInp), h)?))
                }
                None => None,
            };
            let biases = if moe.expert_bias {
                Some(ExpertBiases {
                    gate: src.vector(&name(Part::GateExpsBias), e * f)?,
                    up: src.vector(&name(Part::UpExpsBias), e * f)?,
                    down: src.vector(&name(Part::DownExpsBias), e * h)?,
                })
            } else {
                None
            };
            Mlp::Moe(Experts {
                spec: *moe,
                router,
                router_bias,
                experts,
                shared,
                biases,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_each_format() {
        assert_eq!(Naming::Gguf.name(Part::Q, 3), "blk.3.attn_q.weight");
        assert_eq!(Naming::Gguf.name(Part::GateUp, 0), "blk.0.ffn_up.weight");
        assert_eq!(Naming::Gguf.name(Part::TokenEmbd, 9), "token_embd.weight");
        assert_eq!(
            Naming::Gguf.name(Part::DownExps, 1),
            "blk.1.ffn_down_exps.weight"
        );
        assert_eq!(
            Naming::Gguf.name(Part::Router, 0),
            "blk.0.ffn_gate_inp.weight"
        );
        assert_eq!(
            Naming::HuggingFace.name(Part::FfnNorm, 2),
            "model.layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(Naming::HuggingFace.name(Part::Output, 0), "lm_head.weight");
    }
}
