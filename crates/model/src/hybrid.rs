//! Hybrid models (Qwen3.5) on zinfer's CPU kernels: Gated DeltaNet layers
//! ([`crate::deltanet`]) among full-attention layers whose query
//! projection also holds an output gate (`attn_q` rows: each head's query,
//! then its gate) and whose RoPE turns only a head's leading dimensions.
//! Every block norms its input, mixes (DeltaNet or attention), adds the
//! residual, norms again (`post_attention_norm`), runs a SwiGLU MLP and
//! adds the residual.
//!
//! The attention layers keep K/V in the shared token pool like any model.
//! A DeltaNet layer keeps a fixed-size state per sequence instead: the
//! model holds it, keyed by the sequence's first KV slot (distinct among
//! running sequences), with the number of positions it has consumed. A
//! chunk at position 0 starts a fresh state; any other chunk must continue
//! exactly where its sequence's state stopped, or the step is refused: a
//! prefix served from the KV cache alone, a rolled-back draft or a moved
//! sequence cannot silently run on a wrong state.

use std::collections::HashMap;

use zinfer_kernels::{self as kernels, ScoreRule};

use crate::cpu::{
    self, Attention, Head, MlpScratch, MoeScratch, StepPlan, add, attention, rms_norm,
    rms_norm_in_place, rope_rows,
};
use crate::deltanet::{self, DeltaNetWeights, HybridSpec, LayerState, RowInputs};
use crate::flash::{self, FlashScratch};
use crate::kv::{KvPool, LayerView};
use crate::linear::{Embedding, Linear, Workspace};
use crate::spec::{Activation, ModelSpec, RopeStyle};
use crate::weights::{self, Mlp, Naming, Part, TensorSource};
use crate::{ForwardModel, LoadOptions, ModelError, SeqChunk};

/// A full-attention layer with an output gate.
#[derive(Debug)]
pub(crate) struct GatedAttention<M, V> {
    /// `[2 q_dim, hidden]`: per head, its query rows then its gate rows.
    q_gate: M,
    k: M,
    v: M,
    q_norm: V,
    k_norm: V,
    output: M,
}

/// What mixes a block's rows.
#[derive(Debug)]
pub(crate) enum Mixer<M, V> {
    DeltaNet(DeltaNetWeights<M, V>),
    Attention(GatedAttention<M, V>),
}

/// One block of a hybrid model.
#[derive(Debug)]
pub(crate) struct HybridBlock<M, V> {
    attn_norm: V,
    mixer: Mixer<M, V>,
    /// The MLP's input norm (`post_attention_norm`).
    ffn_norm: V,
    mlp: Mlp<M, V>,
}

/// Every weight of a hybrid model.
#[derive(Debug)]
pub(crate) struct HybridWeights<E, M, V> {
    token_embd: E,
    blocks: Vec<HybridBlock<M, V>>,
    output_norm: V,
    output: M,
}

/// The weights a [`TensorSource`] reads, in its types.
pub(crate) type SourceHybridWeights<S> = HybridWeights<
    <S as TensorSource>::Embedding,
    <S as TensorSource>::Matrix,
    <S as TensorSource>::Vector,
>;

/// Reads every weight of a hybrid model from `src` (llama.cpp's names),
/// checking each shape.
pub(crate) fn read<S: TensorSource>(
    src: &mut S,
    spec: &ModelSpec,
    hy: &HybridSpec,
) -> Result<SourceHybridWeights<S>, ModelError> {
    let naming = Naming::Gguf;
    let (h, q, kv, d) = (spec.hidden, spec.q_dim(), spec.kv_dim(), spec.head_dim);
    let (token_embd, output) = weights::embedding_and_head(src, spec, naming)?;
    let mut blocks = Vec::with_capacity(spec.n_layers);
    for (i, &recurrent) in hy.recurrent.iter().enumerate() {
        let name = |part| naming.name(part, i);
        let own = |suffix: &str| format!("blk.{i}.{suffix}");
        let mixer = if recurrent {
            let (conv, value) = (hy.conv_dim(), hy.value_dim());
            Mixer::DeltaNet(DeltaNetWeights {
                qkv: src.matrix(&name(Part::Qkv), conv, h)?,
                gate: src.matrix(&own("attn_gate.weight"), value, h)?,
                beta: src.matrix(&own("ssm_beta.weight"), hy.v_heads, h)?,
                alpha: src.matrix(&own("ssm_alpha.weight"), hy.v_heads, h)?,
                conv: src.vector(&own("ssm_conv1d.weight"), conv * hy.conv_kernel)?,
                dt_bias: src.vector(&own("ssm_dt.bias"), hy.v_heads)?,
                a: src.vector(&own("ssm_a"), hy.v_heads)?,
                norm: src.vector(&own("ssm_norm.weight"), hy.head_dim)?,
                out: src.matrix(&own("ssm_out.weight"), h, value)?,
            })
        } else {
            Mixer::Attention(GatedAttention {
                q_gate: src.matrix(&name(Part::Q), 2 * q, h)?,
                k: src.matrix(&name(Part::K), kv, h)?,
                v: src.matrix(&name(Part::V), kv, h)?,
                q_norm: src.vector(&name(Part::QNorm), d)?,
                k_norm: src.vector(&name(Part::KNorm), d)?,
                output: src.matrix(&name(Part::AttnOutput), h, q)?,
            })
        };
        blocks.push(HybridBlock {
            attn_norm: src.vector(&name(Part::AttnNorm), h)?,
            mixer,
            ffn_norm: src.vector(&name(Part::PostAttnNorm), h)?,
            mlp: weights::read_mlp(src, spec, naming, i)?,
        });
    }
    Ok(HybridWeights {
        token_embd,
        blocks,
        output_norm: src.vector(&naming.name(Part::OutputNorm, 0), h)?,
        output,
    })
}

/// One sequence's recurrent state: every DeltaNet layer's, and how many
/// positions it has consumed.
#[derive(Debug)]
struct SeqState {
    pos: usize,
    layers: Vec<LayerState>,
}

/// A hybrid model on the CPU kernels, with its KV pool and the recurrent
/// states of the sequences it runs.
#[derive(Debug)]
pub struct HybridModel {
    spec: ModelSpec,
    hy: HybridSpec,
    w: HybridWeights<Embedding, Linear, Vec<f32>>,
    /// cos and sin tables `[max_positions, rotary_dims / 2]`.
    rope: (Vec<f32>, Vec<f32>),
    kv: KvPool,
    ws: Workspace,
    flash: FlashScratch,
    unit: kernels::FlashUnit,
    /// Recurrent states by the first KV slot of their sequence.
    states: HashMap<u32, SeqState>,
}

impl HybridModel {
    /// A model with a KV pool of `options.kv_capacity` slots.
    pub(crate) fn new(
        spec: ModelSpec,
        w: HybridWeights<Embedding, Linear, Vec<f32>>,
        options: &LoadOptions,
    ) -> Result<Self, ModelError> {
        spec.validate()?;
        let hy = spec.hybrid.clone().ok_or_else(|| {
            ModelError::UnsupportedArchitecture(format!("{} (not hybrid)", spec.arch))
        })?;
        let rope = spec.ropes[0].tables(spec.rotary_dims(), spec.max_positions);
        let (kv, unit) = cpu::kv_and_unit(&spec, options)?;
        Ok(Self {
            spec,
            hy,
            w,
            rope,
            kv,
            ws: Workspace::new(options.threads),
            flash: FlashScratch::default(),
            unit,
            states: HashMap::new(),
        })
    }

    /// Each chunk's state, taken out of the map: fresh for a chunk at
    /// position 0, else the one its sequence left at exactly its start.
    /// Nothing is taken when a chunk is refused.
    fn take_states(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<SeqState>, ModelError> {
        let mut keys = Vec::with_capacity(batch.len());
        for (i, c) in batch.iter().enumerate() {
            let key = c.slots.first().copied().unwrap_or(0);
            if keys.contains(&key) {
                return Err(ModelError::InvalidBatch(format!(
                    "chunk {i}: two chunks of one sequence (first slot {key}) in a step"
                )));
            }
            keys.push(key);
            let at = self.states.get(&key).map(|s| s.pos);
            if c.start_pos > 0 && at != Some(c.start_pos) {
                return Err(ModelError::InvalidBatch(format!(
                    "chunk {i}: starts at position {} but its sequence's recurrent state is {}; \
                     a hybrid model resumes a sequence only where it stopped",
                    c.start_pos,
                    at.map_or("missing".to_string(), |p| format!("at position {p}"))
                )));
            }
        }
        let recurrent = self.hy.recurrent.iter().filter(|&&r| r).count();
        Ok(batch
            .iter()
            .zip(keys)
            .map(|(c, key)| match self.states.remove(&key) {
                Some(s) if c.start_pos > 0 => s,
                _ => SeqState {
                    pos: 0,
                    layers: vec![LayerState::new(&self.hy); recurrent],
                },
            })
            .collect())
    }
}

impl ForwardModel for HybridModel {
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let shape = cpu::shape(&self.spec);
        let blocked_min_rows = if flash::supports(shape) {
            1
        } else {
            usize::MAX
        };
        let plan = StepPlan::build(batch, &self.spec, self.kv.capacity(), blocked_min_rows)?;
        let mut states = self.take_states(batch)?;
        let (spec, hy) = (&self.spec, &self.hy);
        let n = plan.ids.len();
        let (hidden, eps) = (spec.hidden, spec.norm_eps);
        let (q_dim, kv_dim, d) = (spec.q_dim(), spec.kv_dim(), spec.head_dim);
        let zeros = |w: usize| vec![0f32; n * w];
        let (mut x, mut h, mut tmp) = (zeros(hidden), zeros(hidden), zeros(hidden));
        let (mut gate, mut up) = (zeros(spec.mlp_width()), zeros(spec.mlp_width()));
        let experts = spec.moe.map_or(0, |m| m.experts);
        let (mut router, mut rows_in, mut rows_out) =
            (zeros(experts), zeros(hidden), zeros(hidden));
        // Each layer's buffers, made once per step: every layer of a kind
        // overwrites them whole.
        let (conv_dim, value_dim) = (hy.conv_dim(), hy.value_dim());
        let (mut qkv, mut z, mut core) = (zeros(conv_dim), zeros(value_dim), zeros(value_dim));
        let (mut beta, mut alpha) = (zeros(hy.v_heads), zeros(hy.v_heads));
        let mut g = vec![0f32; hy.v_heads];
        let (mut q_gate, mut k, mut v) = (zeros(2 * q_dim), zeros(kv_dim), zeros(kv_dim));
        let (mut q, mut attn_gate, mut attn) = (zeros(q_dim), zeros(q_dim), zeros(q_dim));
        let mut fused = Vec::new();
        let ws = &mut self.ws;
        self.w.token_embd.lookup(&plan.ids, &mut x)?;
        let mut recurrent_layer = 0;
        for (layer, b) in self.w.blocks.iter().enumerate() {
            rms_norm(&x, &b.attn_norm, eps, &mut h);
            match &b.mixer {
                Mixer::DeltaNet(w) => {
                    Linear::forward_shared(
                        &[&w.qkv, &w.gate, &w.beta, &w.alpha],
                        &mut [&mut qkv, &mut z, &mut beta, &mut alpha],
                        &h,
                        n,
                        ws,
                    )?;
                    let mut row = 0;
                    for (c, state) in batch.iter().zip(&mut states) {
                        let st = &mut state.layers[recurrent_layer];
                        for r in row..row + c.tokens.len() {
                            let qkv_r = &mut qkv[r * conv_dim..(r + 1) * conv_dim];
                            deltanet::conv_row(hy, &w.conv, st, qkv_r);
                            let beta_r = &mut beta[r * hy.v_heads..(r + 1) * hy.v_heads];
                            beta_r.iter_mut().for_each(|v| *v = deltanet::sigmoid(*v));
                            let alpha_r = &alpha[r * hy.v_heads..(r + 1) * hy.v_heads];
                            for (((g, &al), &dt), &a) in
                                g.iter_mut().zip(alpha_r).zip(&w.dt_bias).zip(&w.a)
                            {
                                *g = deltanet::softplus(al + dt) * a;
                            }
                            let out = &mut core[r * value_dim..(r + 1) * value_dim];
                            let input = RowInputs {
                                qkv: qkv_r,
                                beta: beta_r,
                                g: &g,
                            };
                            deltanet::recur_row(hy, st, input, eps, out);
                            let z_r = &z[r * value_dim..(r + 1) * value_dim];
                            deltanet::gated_norm_row(out, z_r, &w.norm, eps);
                        }
                        row += c.tokens.len();
                    }
                    w.out.forward(&core, n, &mut tmp, ws)?;
                    recurrent_layer += 1;
                }
                Mixer::Attention(w) => {
                    Linear::forward_shared(
                        &[&w.q_gate, &w.k, &w.v],
                        &mut [&mut q_gate, &mut k, &mut v],
                        &h,
                        n,
                        ws,
                    )?;
                    // Per head: its query, then its gate.
                    for ((pair, qh), gh) in q_gate
                        .chunks_exact(2 * d)
                        .zip(q.chunks_exact_mut(d))
                        .zip(attn_gate.chunks_exact_mut(d))
                    {
                        qh.copy_from_slice(&pair[..d]);
                        gh.copy_from_slice(&pair[d..]);
                    }
                    rms_norm_in_place(&mut q, &w.q_norm, eps);
                    rms_norm_in_place(&mut k, &w.k_norm, eps);
                    let dims = (d, spec.rotary_dims());
                    let (cos, sin) = &self.rope;
                    rope_rows(RopeStyle::Neox, dims, cos, sin, &mut q, &plan.positions);
                    rope_rows(RopeStyle::Neox, dims, cos, sin, &mut k, &plan.positions);
                    let pool_layer = spec.kv_pool_layer(layer);
                    self.kv.write(pool_layer, &plan.new_slots, &k, &v);
                    let how = Attention {
                        shape,
                        window: None,
                        rule: ScoreRule::standard(d),
                        sinks: None,
                        unit: self.unit,
                    };
                    match self.kv.layer(pool_layer) {
                        LayerView::F32(kp, vp) => {
                            attention(&q, kp, vp, &plan, how, &mut attn, &mut self.flash, ws)
                        }
                        LayerView::F16(kp, vp) => {
                            attention(&q, kp, vp, &plan, how, &mut attn, &mut self.flash, ws)
                        }
                    }
                    for (a, &g) in attn.iter_mut().zip(&attn_gate) {
                        *a *= deltanet::sigmoid(g);
                    }
                    w.output.forward(&attn, n, &mut tmp, ws)?;
                }
            }
            add(&mut x, &tmp);
            rms_norm(&x, &b.ffn_norm, eps, &mut h);
            let mut mlp = MlpScratch {
                gate: &mut gate,
                up: &mut up,
                fused: &mut fused,
            };
            match &b.mlp {
                Mlp::Dense(f) => mlp.run(f, None, Activation::Silu, &h, n, &mut tmp, ws)?,
                Mlp::Moe(experts) => {
                    let scratch = MoeScratch {
                        router: &mut router,
                        rows_in: &mut rows_in,
                        rows_out: &mut rows_out,
                    };
                    let act = Activation::Silu;
                    let rows = cpu::Rows {
                        x: &h,
                        router_in: &h,
                        n,
                    };
                    cpu::moe_forward(experts, None, act, rows, scratch, &mut mlp, &mut tmp, ws)?
                }
                Mlp::DenseAndMoe(_) => {
                    return Err(ModelError::UnsupportedArchitecture(
                        "a dense MLP beside experts in a hybrid model".into(),
                    ));
                }
            }
            add(&mut x, &tmp);
        }
        for ((c, mut state), key) in batch
            .iter()
            .zip(states)
            .zip(batch.iter().map(|c| c.slots[0]))
        {
            state.pos = c.start_pos + c.tokens.len();
            self.states.insert(key, state);
        }
        let head = Head {
            norm: &self.w.output_norm,
            output: &self.w.output,
        };
        head.outputs(spec, batch, &plan.last_rows, &x, ws)
    }

    fn vocab_size(&self) -> usize {
        self.spec.vocab
    }

    fn hidden_size(&self) -> usize {
        self.spec.hidden
    }

    fn kv_capacity(&self) -> usize {
        self.kv.capacity()
    }

    fn max_positions(&self) -> usize {
        self.spec.max_positions
    }

    fn recurrent(&self) -> bool {
        true
    }

    fn state_slots(&self) -> usize {
        let layers = self.hy.recurrent.iter().filter(|&&r| r).count();
        let state_bytes = layers * self.hy.state_floats() * std::mem::size_of::<f32>();
        state_bytes.div_ceil(self.kv.slot_bytes().max(1))
    }

    fn release_states(&mut self, first_slots: &[u32]) {
        for slot in first_slots {
            self.states.remove(slot);
        }
    }
}
