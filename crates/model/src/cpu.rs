//! The forward pass on zinfer's CPU kernels over the shared token KV pool,
//! for every architecture: what differs between them is read from the
//! [`ModelSpec`] and the optional parts of each block's weights.
//!
//! One step runs every token of the batch (prefill chunks and decode tokens
//! alike) through the projections and MLP as a single `[n_tokens, hidden]`
//! matrix (a mixture of experts runs each routed expert on the rows routed
//! to it, gathered into one matrix); only attention looks at sequences
//! separately: each chunk's keys
//! are packed from its own sequence's slots in the pool and its rows attend
//! to them block by block ([`flash`]). The final norm and the LM head run
//! only on the rows the chunks ask for ([`crate::ChunkOutput`]): the last
//! row of each chunk, unless a chunk wants the logits or final hidden
//! states of all its rows. Activations are plain f32 buffers; the matmuls and
//! attention run on [`super::kernels`].

use std::sync::Mutex;

use zinfer_kernels::{self as kernels, KvElem, ScoreRule};

use super::attention::{HeadShape, attend};
use super::flash::{self, ChunkRows, FlashScratch};
use super::kv::{KvPool, LayerView};
use super::linear::{Embedding, Linear, Workspace};
use super::moe;
use super::ple::{self, PleScratch};
use super::spec::{Activation, ModelSpec, RopeStyle};
use super::weights::{Experts, Ffn, GateUp, Mlp, Qkv, Weights};
use super::{
    AttentionDtype, ChunkOutput, ForwardModel, KvShape, LoadOptions, ModelError, SeqChunk,
    check_transfer,
};

/// Chunks of at least this many rows run on the blocked attention kernel
/// ([`flash`]). One: decode tokens too, because a row's result must not
/// depend on how its sequence was chunked (a prefix served from the cache
/// or imported from another worker gives the same tokens as a cold run),
/// and the two kernels round differently. The per-row kernel remains for
/// head shapes the blocked one does not take.
const BLOCKED_MIN_ROWS: usize = 1;

/// The CPU kernels' weights: quantized or dense matrices, f32 vectors.
pub(crate) type CpuWeights = Weights<Embedding, Linear, Vec<f32>>;

/// A model of any supported architecture on zinfer's CPU kernels, with its KV pool.
#[derive(Debug)]
pub struct CpuModel {
    spec: ModelSpec,
    w: CpuWeights,
    /// Per RoPE of the spec, cos and sin tables `[max_positions, head_dim / 2]`.
    ropes: Vec<(Vec<f32>, Vec<f32>)>,
    kv: KvPool,
    ws: Workspace,
    flash: FlashScratch,
    /// The blocked attention's build (f32 or bf16, [`AttentionDtype`]).
    unit: kernels::FlashUnit,
    bufs: StepBuffers,
    /// Per-layer embeddings' buffers (Gemma 4 E2B/E4B).
    ple: PleScratch,
}

/// A step's activations, kept between steps: once the batch sizes have
/// been seen, a step allocates only its plan and the logits it returns.
#[derive(Debug, Default)]
struct StepBuffers {
    /// The residual stream `[rows, hidden]`.
    x: Vec<f32>,
    /// Normed input of the next matmul `[rows, hidden]`.
    h: Vec<f32>,
    /// A matmul's output before it joins the residual `[rows, hidden]`.
    tmp: Vec<f32>,
    q: Vec<f32>,
    attn: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// A fused matmul's output (`[rows, q|k|v]` or `[rows, gate|up]`)
    /// before it is split; empty for models without fused matrices.
    fused: Vec<f32>,
    /// Router logits `[rows, experts]`; empty for dense models.
    router: Vec<f32>,
    /// One expert's rows gathered `[rows, hidden]`, and its output.
    expert_in: Vec<f32>,
    expert_out: Vec<f32>,
    /// Experts beside a dense MLP ([`Mlp::DenseAndMoe`]): their input, the
    /// router's input and their output, `[rows, hidden]`; empty otherwise.
    beside: [Vec<f32>; 3],
}

impl StepBuffers {
    /// Sizes every buffer for `n` rows; kernels overwrite every element.
    fn resize(&mut self, n: usize, spec: &ModelSpec) {
        let (q_dim, kv_dim) = spec.max_q_kv_dims();
        let fused = match (spec.layout.fused_qkv, spec.layout.fused_gate_up) {
            (false, false) => 0,
            (qkv, gate_up) => {
                let qkv = if qkv { q_dim + 2 * kv_dim } else { 0 };
                qkv.max(if gate_up { 2 * spec.ffn } else { 0 })
            }
        };
        // Fused gate|up experts.
        let (fused, beside) = match spec.moe {
            Some(m) if spec.dense_beside_moe => (fused.max(2 * m.expert_ffn), spec.hidden),
            _ => (fused, 0),
        };
        let [b_in, b_router, b_out] = &mut self.beside;
        let (experts, expert_rows) = spec.moe.map_or((0, 0), |m| (m.experts, spec.hidden));
        for (buf, width) in [
            (&mut self.x, spec.hidden),
            (&mut self.h, spec.hidden),
            (&mut self.tmp, spec.hidden),
            (&mut self.q, q_dim),
            (&mut self.attn, q_dim),
            (&mut self.k, kv_dim),
            (&mut self.v, kv_dim),
            (&mut self.gate, spec.mlp_width()),
            (&mut self.up, spec.mlp_width()),
            (&mut self.fused, fused),
            (&mut self.router, experts),
            (&mut self.expert_in, expert_rows),
            (&mut self.expert_out, expert_rows),
            (b_in, beside),
            (b_router, beside),
            (b_out, beside),
        ] {
            buf.resize(n * width, 0.0);
        }
    }
}

/// Row bookkeeping for one step, built from the batch before any compute.
pub(crate) struct StepPlan<'a> {
    pub(crate) ids: Vec<u32>,
    pub(crate) positions: Vec<usize>,
    pub(crate) new_slots: Vec<u32>,
    /// For each row, the slots it attends to (its sequence up to itself);
    /// empty for rows of `blocked` chunks.
    pub(crate) keys: Vec<&'a [u32]>,
    /// Chunks of several rows whose attention runs on the blocked kernel.
    pub(crate) blocked: Vec<ChunkRows<'a>>,
    /// One-row chunks (decode tokens) on the blocked kernel, attended
    /// together in one parallel region.
    pub(crate) blocked_rows: Vec<ChunkRows<'a>>,
    /// Index of each chunk's last row.
    pub(crate) last_rows: Vec<usize>,
}

impl<'a> StepPlan<'a> {
    /// Validates a batch against the model and lays out its rows.
    pub(crate) fn build(
        batch: &[SeqChunk<'a>],
        cfg: &ModelSpec,
        kv_capacity: usize,
        blocked_min_rows: usize,
    ) -> Result<Self, ModelError> {
        let n: usize = batch.iter().map(|c| c.tokens.len()).sum();
        let mut plan = Self {
            ids: Vec::with_capacity(n),
            positions: Vec::with_capacity(n),
            new_slots: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            blocked: Vec::new(),
            blocked_rows: Vec::new(),
            last_rows: Vec::with_capacity(batch.len()),
        };
        for (i, c) in batch.iter().enumerate() {
            let end = c.start_pos + c.tokens.len();
            let bad = |what: String| Err(ModelError::InvalidBatch(format!("chunk {i}: {what}")));
            if c.tokens.is_empty() || c.slots.len() != end {
                return bad(format!(
                    "{} tokens at start_pos {} need {end} slots, got {}",
                    c.tokens.len(),
                    c.start_pos,
                    c.slots.len()
                ));
            }
            if end > cfg.max_positions {
                return bad(format!(
                    "{end} positions exceed the model's {}",
                    cfg.max_positions
                ));
            }
            if let Some(t) = c.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
                return bad(format!(
                    "token {t} is outside the vocabulary of {}",
                    cfg.vocab
                ));
            }
            if let Some(s) = c.slots.iter().find(|&&s| s as usize >= kv_capacity) {
                return bad(format!(
                    "slot {s} is outside the KV pool of {}",
                    kv_capacity
                ));
            }
            let blocked = c.tokens.len() >= blocked_min_rows;
            if blocked {
                let rows = ChunkRows {
                    first_row: plan.ids.len(),
                    len: c.tokens.len(),
                    start_pos: c.start_pos,
                    slots: &c.slots[..end],
                };
                if rows.len == 1 {
                    plan.blocked_rows.push(rows);
                } else {
                    plan.blocked.push(rows);
                }
            }
            for (j, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + j;
                plan.ids.push(t);
                plan.positions.push(pos);
                plan.new_slots.push(c.slots[pos]);
                plan.keys.push(if blocked { &[] } else { &c.slots[..=pos] });
            }
            plan.last_rows.push(plan.ids.len() - 1);
        }
        Ok(plan)
    }
}

impl CpuModel {
    /// A model with a KV pool of `options.kv_capacity` slots of `options.kv_dtype`.
    pub(crate) fn new(
        spec: ModelSpec,
        mut w: CpuWeights,
        options: &LoadOptions,
    ) -> Result<Self, ModelError> {
        spec.validate()?;
        if w.blocks.len() != spec.n_layers {
            return Err(ModelError::BlockCount {
                config: spec.n_layers,
                checkpoint: w.blocks.len(),
            });
        }
        // Gemma 4's router reads rmsnorm(x) / sqrt(hidden) * router_scale:
        // the division is folded into the scale once, not per step.
        let inv = 1.0 / (spec.hidden as f32).sqrt();
        for b in &mut w.blocks {
            if let Mlp::DenseAndMoe(g) = &mut b.mlp {
                g.router_scale.iter_mut().for_each(|s| *s *= inv);
            }
        }
        // Each RoPE as wide as the heads of the layers that use it.
        let ropes = spec
            .ropes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let d = spec.layers.iter().find(|l| l.rope == i);
                r.tables(d.map_or(spec.head_dim, |l| l.head_dim), spec.max_positions)
            })
            .collect();
        let (kv, unit) = kv_and_unit(&spec, options)?;
        Ok(Self {
            spec,
            w,
            ropes,
            kv,
            ws: Workspace::new(options.threads),
            flash: FlashScratch::default(),
            unit,
            bufs: StepBuffers::default(),
            ple: PleScratch::default(),
        })
    }

    /// The model's shape.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }
}

impl ForwardModel for CpuModel {
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let spec = &self.spec;
        let all_supported = (0..spec.n_layers).all(|l| flash::supports(spec.layer_heads(l)));
        let blocked_min_rows = if all_supported {
            BLOCKED_MIN_ROWS
        } else {
            usize::MAX
        };
        let plan = StepPlan::build(batch, spec, self.kv.capacity(), blocked_min_rows)?;
        let n = plan.ids.len();
        let eps = spec.norm_eps;

        self.bufs.resize(n, spec);
        let StepBuffers {
            x,
            h,
            tmp,
            q,
            attn,
            k,
            v,
            gate,
            up,
            fused,
            router,
            expert_in,
            expert_out,
            beside,
        } = &mut self.bufs;
        self.w.token_embd.lookup(&plan.ids, x)?;
        if let Some(s) = spec.embed_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        let ws = &mut self.ws;
        if let Some(p) = &self.w.ple {
            p.prepare(&plan.ids, x, eps, &mut self.ple, ws)?;
        }
        for (layer, b) in self.w.blocks.iter().enumerate() {
            let ls = spec.layers[layer];
            let shape = spec.layer_heads(layer);
            let (q_dim, kv_dim) = (spec.n_heads * ls.head_dim, ls.n_kv_heads * ls.head_dim);
            let (q, attn) = (&mut q[..n * q_dim], &mut attn[..n * q_dim]);
            let (k, v) = (&mut k[..n * kv_dim], &mut v[..n * kv_dim]);
            rms_norm(x, &b.attn_norm, eps, h);
            match &b.qkv {
                Qkv::Separate {
                    q: wq,
                    k: wk,
                    v: wv,
                } => Linear::forward_shared(
                    &[wq, wk, wv],
                    &mut [&mut q[..], &mut k[..], &mut v[..]],
                    h,
                    n,
                    ws,
                )?,
                Qkv::Fused(w) => fused_forward(
                    w,
                    h,
                    n,
                    fused,
                    &mut [&mut q[..], &mut k[..], &mut v[..]],
                    ws,
                )?,
                Qkv::KeyAsValue { q: wq, k: wk } => {
                    Linear::forward_shared(&[wq, wk], &mut [&mut q[..], &mut k[..]], h, n, ws)?;
                    v.copy_from_slice(k);
                }
                Qkv::QueryOnly(wq) => wq.forward(h, n, q, ws)?,
            }
            let own_kv = ls.kv_from.is_none();
            if let Some(bias) = &b.qkv_bias {
                add_bias(q, &bias[..q_dim]);
                add_bias(k, &bias[q_dim..q_dim + kv_dim]);
                add_bias(v, &bias[q_dim + kv_dim..]);
            }
            if let Some((q_norm, k_norm)) = &b.qk_norm {
                rms_norm_in_place(q, q_norm, eps);
                if own_kv {
                    rms_norm_in_place(k, k_norm, eps);
                }
            }
            if spec.v_norm && own_kv {
                v.chunks_exact_mut(ls.head_dim)
                    .for_each(|head| ple::rms_norm(head, None, eps));
            }
            let rope = &spec.ropes[ls.rope];
            let (cos, sin) = &self.ropes[ls.rope];
            // Every dimension of a head rotates (Gemma 4's partial rotation
            // is in its frequencies).
            let dims = (ls.head_dim, ls.head_dim);
            rope_rows(rope.style, dims, cos, sin, q, &plan.positions);
            let pool_layer = spec.kv_pool_layer(layer);
            if own_kv {
                rope_rows(rope.style, dims, cos, sin, k, &plan.positions);
                self.kv.write(pool_layer, &plan.new_slots, k, v);
            }
            let how = Attention {
                shape,
                window: ls.window,
                rule: spec.attn,
                sinks: b.sinks.as_deref(),
                unit: self.unit,
            };
            match self.kv.layer(pool_layer) {
                LayerView::F32(kp, vp) => {
                    attention(q, kp, vp, &plan, how, attn, &mut self.flash, ws)
                }
                LayerView::F16(kp, vp) => {
                    attention(q, kp, vp, &plan, how, attn, &mut self.flash, ws)
                }
            }
            b.attn_output.forward(attn, n, tmp, ws)?;
            if let Some(bias) = &b.attn_output_bias {
                add_bias(tmp, bias);
            }
            if let Some(w) = &b.post_attn_norm {
                rms_norm_in_place(tmp, w, eps);
            }
            add(x, tmp);

            rms_norm(x, &b.ffn_norm, eps, h);
            let mut mlp = MlpScratch { gate, up, fused };
            match &b.mlp {
                Mlp::Dense(f) => mlp.run(f, None, spec.activation, h, n, tmp, ws)?,
                Mlp::Moe(experts) => {
                    let scratch = MoeScratch {
                        router,
                        rows_in: expert_in,
                        rows_out: expert_out,
                    };
                    let rows = Rows {
                        x: h,
                        router_in: h,
                        n,
                    };
                    moe_forward(
                        experts,
                        None,
                        spec.activation,
                        rows,
                        scratch,
                        &mut mlp,
                        tmp,
                        ws,
                    )?
                }
                Mlp::DenseAndMoe(g) => {
                    mlp.run(&g.dense, None, spec.activation, h, n, tmp, ws)?;
                    rms_norm_in_place(tmp, &g.post_norm_1, eps);
                    let [moe_in, router_in, moe_out] = beside;
                    rms_norm(x, &g.pre_norm_2, eps, moe_in);
                    // router_scale holds 1 / sqrt(hidden) already (Self::new).
                    rms_norm(x, &g.router_scale, eps, router_in);
                    let scratch = MoeScratch {
                        router,
                        rows_in: expert_in,
                        rows_out: expert_out,
                    };
                    let rows = Rows {
                        x: moe_in,
                        router_in,
                        n,
                    };
                    let scales = g.down_scales.as_deref();
                    let e = &g.experts;
                    moe_forward(
                        e,
                        scales,
                        spec.activation,
                        rows,
                        scratch,
                        &mut mlp,
                        moe_out,
                        ws,
                    )?;
                    rms_norm_in_place(moe_out, &g.post_norm_2, eps);
                    add(tmp, moe_out);
                }
            }
            if let Some(w) = &b.post_ffn_norm {
                rms_norm_in_place(tmp, w, eps);
            }
            add(x, tmp);
            if let Some(p) = &self.w.ple {
                p.apply(layer, x, eps, &mut self.ple, ws)?;
            }
            if let Some(&[scale]) = b.out_scale.as_deref() {
                x.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let head = Head {
            norm: &self.w.output_norm,
            output: &self.w.output,
        };
        head.outputs(spec, batch, &plan.last_rows, x, ws)
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

    fn kv_shape(&self) -> KvShape {
        self.spec.kv_shape()
    }

    fn read_kv(&self, slots: &[u32]) -> Result<Vec<f32>, ModelError> {
        let shape = self.kv_shape();
        check_transfer(&shape, slots, self.kv.capacity(), None)?;
        let mut out = Vec::with_capacity(shape.floats_for(slots.len()).unwrap_or(0));
        for layer in 0..self.kv.layers() {
            self.kv.read_f32(layer, slots, &mut out);
        }
        Ok(out)
    }

    fn write_kv(&mut self, slots: &[u32], data: &[f32]) -> Result<(), ModelError> {
        let shape = self.kv_shape();
        check_transfer(&shape, slots, self.kv.capacity(), Some(data.len()))?;
        // Layer after layer, each its K rows then its V rows ([`KvPool::read_f32`]).
        let mut at = 0;
        for layer in 0..self.kv.layers() {
            let n = slots.len() * self.kv.dim(layer);
            let (k, v) = data[at..at + 2 * n].split_at(n);
            self.kv.write(layer, slots, k, v);
            at += 2 * n;
        }
        Ok(())
    }
}

/// The final norm and LM head, run on the rows each chunk asks for.
pub(crate) struct Head<'a> {
    pub(crate) norm: &'a [f32],
    pub(crate) output: &'a Linear,
}

impl Head<'_> {
    /// Each chunk's output from the step's residual stream `x`, whose
    /// chunks end at `last_rows`.
    pub(crate) fn outputs(
        &self,
        spec: &ModelSpec,
        batch: &[SeqChunk<'_>],
        last_rows: &[usize],
        x: &[f32],
        ws: &mut Workspace,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let (hidden, eps) = (spec.hidden, spec.norm_eps);
        // The rows each chunk asks for go through the final norm: first
        // those the LM head takes, in batch order, then the hidden ones, so
        // the head reads one contiguous prefix. A batch of `LastLogits`
        // chunks selects its last rows and nothing else.
        let head_rows = OutputRows::Head.count(batch);
        let hidden_rows = OutputRows::Hidden.count(batch);
        let mut picked = Vec::with_capacity((head_rows + hidden_rows) * hidden);
        for which in [OutputRows::Head, OutputRows::Hidden] {
            for (c, &last) in batch.iter().zip(last_rows) {
                if let Some(rows) = which.rows(c, last) {
                    picked.extend_from_slice(&x[rows.start * hidden..rows.end * hidden]);
                }
            }
        }
        let mut normed = vec![0f32; picked.len()];
        rms_norm(&picked, self.norm, eps, &mut normed);
        let vocab = spec.vocab;
        let mut logits = vec![0f32; head_rows * vocab];
        if head_rows > 0 {
            let head_in = &normed[..head_rows * hidden];
            self.output.forward(head_in, head_rows, &mut logits, ws)?;
        }
        if let Some(cap) = spec.final_softcap {
            logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
        }
        Ok(split_outputs(
            batch,
            &logits,
            &normed[head_rows * hidden..],
            vocab,
            hidden,
        ))
    }
}

/// The KV pool `options` size for `spec`, and the attention unit they ask for.
pub(crate) fn kv_and_unit(
    spec: &ModelSpec,
    options: &LoadOptions,
) -> Result<(KvPool, kernels::FlashUnit), ModelError> {
    let kv = KvPool::new(&spec.kv_layer_dims(), options.kv_capacity, options.kv_dtype)?;
    let unit = match options.attention {
        AttentionDtype::F32 => kernels::flash_unit(),
        AttentionDtype::Bf16 => kernels::flash_unit_bf16().ok_or(ModelError::NoBf16Attention)?,
        AttentionDtype::Auto => kernels::flash_unit_bf16().unwrap_or_else(kernels::flash_unit),
    };
    Ok((kv, unit))
}

/// The two kinds of rows a step's outputs come from.
#[derive(Clone, Copy)]
pub(crate) enum OutputRows {
    /// Rows the LM head runs on.
    Head,
    /// Rows returned as final hidden states.
    Hidden,
}

impl OutputRows {
    /// The rows of chunk `c`, whose last row is `last`, of this kind.
    pub(crate) fn rows(self, c: &SeqChunk<'_>, last: usize) -> Option<std::ops::Range<usize>> {
        let all = last + 1 - c.tokens.len()..last + 1;
        match (self, c.output) {
            (Self::Head, ChunkOutput::LastLogits) => Some(last..last + 1),
            (Self::Head, ChunkOutput::AllLogits) | (Self::Hidden, ChunkOutput::AllHidden) => {
                Some(all)
            }
            _ => None,
        }
    }

    /// How many rows of this kind `batch` (checked: no empty chunk) asks for.
    pub(crate) fn count(self, batch: &[SeqChunk<'_>]) -> usize {
        batch
            .iter()
            .filter_map(|c| self.rows(c, c.tokens.len().saturating_sub(1)))
            .map(|rows| rows.len())
            .sum()
    }
}

/// Each chunk's output, in batch order, from the step's `logits` (the head
/// rows, `[rows, vocab]`) and `hidden` (the hidden rows, `[rows, hidden]`),
/// both laid out chunk by chunk in batch order.
pub(crate) fn split_outputs(
    batch: &[SeqChunk<'_>],
    logits: &[f32],
    hidden: &[f32],
    vocab: usize,
    hidden_size: usize,
) -> Vec<Vec<f32>> {
    let (mut at_logits, mut at_hidden) = (0, 0);
    let take = |from: &[f32], at: &mut usize, len: usize| {
        let out = from[*at..*at + len].to_vec();
        *at += len;
        out
    };
    batch
        .iter()
        .map(|c| match c.output {
            ChunkOutput::LastLogits => take(logits, &mut at_logits, vocab),
            ChunkOutput::AllLogits => take(logits, &mut at_logits, c.tokens.len() * vocab),
            ChunkOutput::AllHidden => take(hidden, &mut at_hidden, c.tokens.len() * hidden_size),
        })
        .collect()
}

pub(crate) fn shape(spec: &ModelSpec) -> HeadShape {
    HeadShape {
        n_heads: spec.n_heads,
        n_kv_heads: spec.n_kv_heads,
        head_dim: spec.head_dim,
    }
}

/// What one layer's attention computes: its heads, how far back rows see,
/// how scores are made.
#[derive(Clone, Copy)]
pub(crate) struct Attention<'a> {
    pub(crate) shape: HeadShape,
    pub(crate) window: Option<usize>,
    pub(crate) rule: ScoreRule,
    /// Per query head, a logit in the softmax's denominator (gpt-oss).
    pub(crate) sinks: Option<&'a [f32]>,
    /// The blocked unit's build.
    pub(crate) unit: kernels::FlashUnit,
}

/// Attention of every row of the step: blocked chunks on [`flash`], the
/// other rows (short chunks of head widths the blocked kernel does not
/// take) on the per-row kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    plan: &StepPlan<'_>,
    how: Attention<'_>,
    out: &mut [f32],
    scratch: &mut FlashScratch,
    ws: &Workspace,
) {
    let Attention {
        shape,
        window,
        rule,
        sinks,
        unit,
    } = how;
    let unit = flash::unit_for(unit, shape);
    let keys = flash::Keys {
        window,
        rule,
        sinks,
    };
    if !plan.blocked_rows.is_empty() {
        let rows = &plan.blocked_rows;
        flash::attend_rows(q, k_pool, v_pool, rows, shape, keys, out, ws.parallel, unit);
    }
    for &chunk in &plan.blocked {
        flash::attend_chunk(
            q,
            k_pool,
            v_pool,
            chunk,
            shape,
            keys,
            out,
            scratch,
            ws.parallel,
            unit,
        );
    }
    if plan.blocked.len() + plan.blocked_rows.len() < plan.last_rows.len() {
        let windowed: Vec<&[u32]>;
        let row_keys = match window {
            Some(w) => {
                windowed = plan
                    .keys
                    .iter()
                    .map(|k| &k[k.len().saturating_sub(w)..])
                    .collect();
                &windowed
            }
            None => &plan.keys,
        };
        attend(
            q,
            k_pool,
            v_pool,
            row_keys,
            shape,
            rule,
            sinks,
            out,
            ws.parallel,
        );
    }
}

/// Rotates the first `rotary` dimensions of each `d`-wide head of each
/// row of `x` by its row's position.
pub(crate) fn rope_rows(
    style: RopeStyle,
    (d, rotary): (usize, usize),
    cos: &[f32],
    sin: &[f32],
    x: &mut [f32],
    positions: &[usize],
) {
    let half = rotary / 2;
    // Pair i is (stride * i, stride * i + offset).
    let (stride, offset) = match style {
        RopeStyle::Interleaved => (2, 1),
        RopeStyle::Neox => (1, half),
    };
    let rows = x.chunks_exact_mut(x.len() / positions.len().max(1));
    for (row, &p) in rows.zip(positions) {
        let (cos, sin) = (
            &cos[p * half..(p + 1) * half],
            &sin[p * half..(p + 1) * half],
        );
        for h in row.chunks_exact_mut(d) {
            for i in 0..half {
                let (a, b) = (stride * i, stride * i + offset);
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * cos[i] - x1 * sin[i];
                h[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

/// Runs a fused matrix over `n` rows of `x` and copies each output row's
/// parts (end to end in the matrix's rows) into the parts' own buffers,
/// each `[n, width]`.
fn fused_forward(
    w: &Linear,
    x: &[f32],
    n: usize,
    fused: &mut [f32],
    parts: &mut [&mut [f32]],
    ws: &mut Workspace,
) -> Result<(), ModelError> {
    let width = w.rows();
    let fused = &mut fused[..n * width];
    w.forward(x, n, fused, ws)?;
    for (r, row) in fused.chunks_exact(width).enumerate() {
        let mut at = 0;
        for part in parts.iter_mut() {
            let pw = part.len() / n;
            part[r * pw..(r + 1) * pw].copy_from_slice(&row[at..at + pw]);
            at += pw;
        }
    }
    Ok(())
}

/// The buffers an MLP pass writes: gate and up outputs, and a fused
/// gate|up output before it is split.
pub(crate) struct MlpScratch<'a> {
    pub(crate) gate: &'a mut [f32],
    pub(crate) up: &'a mut [f32],
    pub(crate) fused: &'a mut [f32],
}

impl MlpScratch<'_> {
    /// `out = down(act(gate(x)) * up(x))` for `n` rows of `x`, with the
    /// gate, up and down biases added after their matmuls when given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &mut self,
        f: &Ffn<Linear>,
        bias: Option<FfnBias<'_>>,
        act: Activation,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        ws: &mut Workspace,
    ) -> Result<(), ModelError> {
        let width = f.down.cols();
        let (gate, up) = (&mut self.gate[..n * width], &mut self.up[..n * width]);
        match &f.gate_up {
            GateUp::Separate { gate: wg, up: wu } => {
                Linear::forward_shared(&[wg, wu], &mut [&mut gate[..], &mut up[..]], x, n, ws)?
            }
            GateUp::Fused(w) => {
                fused_forward(w, x, n, self.fused, &mut [&mut gate[..], &mut up[..]], ws)?
            }
        }
        if let Some(b) = bias {
            add_bias(gate, b.gate);
            add_bias(up, b.up);
        }
        activation_mul(act, gate, up, ws);
        f.down.forward(gate, n, &mut out[..n * f.down.rows()], ws)?;
        if let Some(b) = bias {
            add_bias(&mut out[..n * f.down.rows()], b.down);
        }
        Ok(())
    }
}

/// One expert's gate, up and down biases.
#[derive(Clone, Copy)]
pub(crate) struct FfnBias<'a> {
    gate: &'a [f32],
    up: &'a [f32],
    down: &'a [f32],
}

/// A mixture of experts' input rows, the router's (the same rows but for
/// Gemma 4's), and how many.
pub(crate) struct Rows<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) router_in: &'a [f32],
    pub(crate) n: usize,
}

/// The buffers a mixture of experts adds: router logits, and one expert's
/// gathered rows and their output.
pub(crate) struct MoeScratch<'a> {
    pub(crate) router: &'a mut [f32],
    pub(crate) rows_in: &'a mut [f32],
    pub(crate) rows_out: &'a mut [f32],
}

/// `out` = each row's experts' outputs, weighted and summed. The rows are
/// grouped by expert: an expert's rows are gathered and run through its
/// matrices as one matmul of that many rows (on the same kernels as a
/// dense MLP), and an expert no row picked is not read. A row's sum runs
/// over its experts in index order, whatever else is in the step; a
/// shared expert runs on every row and adds its output scaled by its gate.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_forward(
    m: &Experts<Linear, Vec<f32>>,
    expert_scales: Option<&[f32]>,
    act: Activation,
    rows: Rows<'_>,
    s: MoeScratch<'_>,
    mlp: &mut MlpScratch<'_>,
    out: &mut [f32],
    ws: &mut Workspace,
) -> Result<(), ModelError> {
    let Rows { x, router_in, n } = rows;
    let hidden = m.router.cols();
    let logits = &mut s.router[..n * m.spec.experts];
    m.router.forward(router_in, n, logits, ws)?;
    if let Some(b) = &m.router_bias {
        add_bias(logits, b);
    }
    let routes = moe::route_parallel(&m.spec, logits, ws.parallel);
    out[..n * hidden].fill(0.0);
    let f = m.spec.expert_ffn;
    for (e, (expert, rows)) in m.experts.iter().zip(&routes).enumerate() {
        if rows.is_empty() {
            continue;
        }
        let bias = m.biases.as_ref().map(|b| FfnBias {
            gate: &b.gate[e * f..(e + 1) * f],
            up: &b.up[e * f..(e + 1) * f],
            down: &b.down[e * hidden..(e + 1) * hidden],
        });
        let k = rows.len();
        let xs = &mut s.rows_in[..k * hidden];
        for (dst, &(r, _)) in xs.chunks_exact_mut(hidden).zip(rows) {
            dst.copy_from_slice(&x[r * hidden..(r + 1) * hidden]);
        }
        let ys = &mut s.rows_out[..k * hidden];
        mlp.run(expert, bias, act, xs, k, ys, ws)?;
        let scale = expert_scales.map_or(1.0, |s| s[e]);
        for (y, &(r, w)) in ys.chunks_exact(hidden).zip(rows) {
            let w = w * scale;
            for (o, &v) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(y) {
                *o += w * v;
            }
        }
    }
    if let Some((shared, gate)) = &m.shared {
        let ys = &mut s.rows_out[..n * hidden];
        mlp.run(shared, None, act, x, n, ys, ws)?;
        for ((o, y), xr) in out
            .chunks_exact_mut(hidden)
            .zip(ys.chunks_exact(hidden))
            .zip(x.chunks_exact(hidden))
        {
            let g = xr.iter().zip(gate).map(|(a, b)| a * b).sum::<f32>();
            let g = 1.0 / (1.0 + (-g).exp());
            o.iter_mut().zip(y).for_each(|(o, &v)| *o += g * v);
        }
    }
    Ok(())
}

/// Adds `bias` to every row of `x`.
pub(crate) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add(row, bias);
    }
}

/// RMSNorm of every `w.len()`-wide piece of `x` (rows, or heads of rows) in place.
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let mean_sq = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean_sq = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// `gate = act(gate) * up`, split over the kernels' pool for chunks of
/// many rows (an exponential per value: 3% of a 50-row chunk's time on
/// one thread while the other waited). Each value is computed alone, so
/// the split changes no bits.
fn activation_mul(act: Activation, gate: &mut [f32], up: &[f32], ws: &Workspace) {
    /// Values per unit of work.
    const CHUNK: usize = 8192;
    /// Rough cost of one value in multiply-adds, for the pool's threshold.
    const COST: usize = 16;
    let f = match act {
        Activation::Silu => kernels::silu_mul,
        Activation::GeluTanh => kernels::gelu_mul,
        Activation::SwigluOai => kernels::swiglu_oai_mul,
    };
    let values = gate.len();
    let parts: Vec<Mutex<(&mut [f32], &[f32])>> = gate
        .chunks_mut(CHUNK)
        .zip(up.chunks(CHUNK))
        .map(Mutex::new)
        .collect();
    kernels::run_units(parts.len(), values * COST, ws.parallel, |range| {
        for part in &parts[range] {
            // Each part is handed to exactly one unit: the lock is uncontended.
            let mut part = part.lock().unwrap_or_else(|e| e.into_inner());
            let (g, u) = &mut *part;
            f(g, u);
        }
    });
}

pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
