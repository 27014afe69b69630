//! The llama forward pass over the shared token KV pool.
//!
//! One step runs every token of the batch (prefill chunks and decode tokens
//! alike) through the projections and MLP as a single `[n_tokens, hidden]`
//! matrix; only attention looks at sequences separately: each chunk's keys
//! are packed from its own sequence's slots in the pool and its rows attend
//! to them block by block ([`flash`]). The LM head runs only on the last
//! row of each chunk. Activations are plain f32 buffers; the matmuls and
//! attention run on [`super::kernels`].

use zinfer_kernels::{self as kernels, KvElem};

use super::attention::{HeadShape, attend};
use super::flash::{self, ChunkRows, FlashScratch};
use super::kv::{KvPool, LayerView};
use super::linear::{Embedding, Linear, Workspace};
use super::{ForwardModel, KvShape, LlamaConfig, LoadOptions, ModelError, SeqChunk};

/// Chunks of at least this many rows run on the blocked attention kernel
/// ([`flash`]). One: decode tokens too, because a row's result must not
/// depend on how its sequence was chunked (a prefix served from the cache
/// or imported from another worker gives the same tokens as a cold run),
/// and the two kernels round differently. The per-row kernel remains for
/// head shapes the blocked one does not take.
const BLOCKED_MIN_ROWS: usize = 1;

/// One transformer block's weights, by their GGUF names.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) attn_q: Linear,
    pub(crate) attn_k: Linear,
    pub(crate) attn_v: Linear,
    pub(crate) attn_output: Linear,
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) ffn_gate: Linear,
    pub(crate) ffn_up: Linear,
    pub(crate) ffn_down: Linear,
}

/// Every weight of a llama model, as the loaders hand them over.
#[derive(Debug)]
pub(crate) struct Weights {
    pub(crate) token_embd: Embedding,
    pub(crate) blocks: Vec<Block>,
    pub(crate) output_norm: Vec<f32>,
    pub(crate) output: Linear,
}

/// A llama model with its KV pool.
#[derive(Debug)]
pub struct Llama {
    cfg: LlamaConfig,
    w: Weights,
    /// RoPE tables `[max_positions, head_dim / 2]`, computed once at load.
    cos: Vec<f32>,
    sin: Vec<f32>,
    kv: KvPool,
    ws: Workspace,
    flash: FlashScratch,
    bufs: StepBuffers,
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
}

impl StepBuffers {
    /// Sizes every buffer for `n` rows; kernels overwrite every element.
    fn resize(&mut self, n: usize, cfg: &LlamaConfig) {
        let q_dim = cfg.n_heads * cfg.head_dim;
        for (buf, width) in [
            (&mut self.x, cfg.hidden),
            (&mut self.h, cfg.hidden),
            (&mut self.tmp, cfg.hidden),
            (&mut self.q, q_dim),
            (&mut self.attn, q_dim),
            (&mut self.k, cfg.kv_dim()),
            (&mut self.v, cfg.kv_dim()),
            (&mut self.gate, cfg.ffn),
            (&mut self.up, cfg.ffn),
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
        cfg: &LlamaConfig,
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

impl Llama {
    /// A model with a KV pool of `options.kv_capacity` slots of `options.kv_dtype`.
    pub(crate) fn new(
        cfg: LlamaConfig,
        w: Weights,
        options: &LoadOptions,
    ) -> Result<Self, ModelError> {
        cfg.validate()?;
        check_shapes(&cfg, &w)?;
        let (cos, sin) = cfg.rope_tables();
        let kv = KvPool::new(
            cfg.n_layers,
            options.kv_capacity,
            cfg.kv_dim(),
            options.kv_dtype,
        )?;
        Ok(Self {
            cfg,
            w,
            cos,
            sin,
            kv,
            ws: Workspace::new(options.threads),
            flash: FlashScratch::default(),
            bufs: StepBuffers::default(),
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }
}

impl ForwardModel for Llama {
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let blocked_min_rows = if flash::supports(shape(&self.cfg)) {
            BLOCKED_MIN_ROWS
        } else {
            usize::MAX
        };
        let plan = StepPlan::build(batch, &self.cfg, self.kv.capacity(), blocked_min_rows)?;
        let n = plan.ids.len();
        let hidden = self.cfg.hidden;
        let shape = shape(&self.cfg);
        let eps = self.cfg.rms_eps;

        self.bufs.resize(n, &self.cfg);
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
        } = &mut self.bufs;
        self.w.token_embd.lookup(&plan.ids, x)?;
        let ws = &mut self.ws;
        for (layer, b) in self.w.blocks.iter().enumerate() {
            rms_norm(x, &b.attn_norm, eps, h);
            let qkv = [&b.attn_q, &b.attn_k, &b.attn_v];
            Linear::forward_shared(&qkv, &mut [&mut q[..], &mut k[..], &mut v[..]], h, n, ws)?;
            rope_rows(
                &self.cfg,
                &self.cos,
                &self.sin,
                q,
                self.cfg.n_heads,
                &plan.positions,
            );
            rope_rows(
                &self.cfg,
                &self.cos,
                &self.sin,
                k,
                self.cfg.n_kv_heads,
                &plan.positions,
            );
            self.kv.write(layer, &plan.new_slots, k, v);
            match self.kv.layer(layer) {
                LayerView::F32(kp, vp) => {
                    attention(q, kp, vp, &plan, shape, attn, &mut self.flash, ws)
                }
                LayerView::F16(kp, vp) => {
                    attention(q, kp, vp, &plan, shape, attn, &mut self.flash, ws)
                }
            }
            b.attn_output.forward(attn, n, tmp, ws)?;
            add(x, tmp);

            rms_norm(x, &b.ffn_norm, eps, h);
            Linear::forward_shared(
                &[&b.ffn_gate, &b.ffn_up],
                &mut [&mut gate[..], &mut up[..]],
                h,
                n,
                ws,
            )?;
            kernels::silu_mul(gate, up);
            b.ffn_down.forward(gate, n, tmp, ws)?;
            add(x, tmp);
        }
        let rows = plan.last_rows.len();
        let mut last = Vec::with_capacity(rows * hidden);
        for &r in &plan.last_rows {
            last.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
        }
        let mut normed = vec![0f32; rows * hidden];
        rms_norm(&last, &self.w.output_norm, eps, &mut normed);
        let vocab = self.cfg.vocab;
        let mut logits = vec![0f32; rows * vocab];
        self.w.output.forward(&normed, rows, &mut logits, ws)?;
        Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab
    }

    fn kv_capacity(&self) -> usize {
        self.kv.capacity()
    }

    fn max_positions(&self) -> usize {
        self.cfg.max_positions
    }

    fn kv_shape(&self) -> KvShape {
        KvShape {
            layers: self.kv.n_layers(),
            kv_dim: self.kv.kv_dim(),
        }
    }

    fn read_kv(&self, slots: &[u32]) -> Result<Vec<f32>, ModelError> {
        let shape = self.kv_shape();
        shape.check(slots, self.kv.capacity(), None)?;
        let mut out = Vec::with_capacity(shape.floats_for(slots.len()).unwrap_or(0));
        for layer in 0..shape.layers {
            self.kv.read_f32(layer, slots, &mut out);
        }
        Ok(out)
    }

    fn write_kv(&mut self, slots: &[u32], data: &[f32]) -> Result<(), ModelError> {
        let shape = self.kv_shape();
        shape.check(slots, self.kv.capacity(), Some(data.len()))?;
        let n = slots.len() * shape.kv_dim;
        for (layer, block) in data.chunks_exact(2 * n.max(1)).enumerate() {
            let (k, v) = block.split_at(n);
            self.kv.write(layer, slots, k, v);
        }
        Ok(())
    }
}

fn shape(cfg: &LlamaConfig) -> HeadShape {
    HeadShape {
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim,
    }
}

/// Attention of every row of the step: blocked chunks on [`flash`], the
/// other rows (decode tokens, short chunks) on the per-row kernel.
#[allow(clippy::too_many_arguments)]
fn attention<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    plan: &StepPlan<'_>,
    shape: HeadShape,
    out: &mut [f32],
    scratch: &mut FlashScratch,
    ws: &Workspace,
) {
    let unit = kernels::flash_unit();
    if !plan.blocked_rows.is_empty() {
        let rows = &plan.blocked_rows;
        flash::attend_rows(q, k_pool, v_pool, rows, shape, out, ws.parallel, unit);
    }
    for &chunk in &plan.blocked {
        flash::attend_chunk(
            q,
            k_pool,
            v_pool,
            chunk,
            shape,
            out,
            scratch,
            ws.parallel,
            unit,
        );
    }
    if plan.blocked.len() + plan.blocked_rows.len() < plan.last_rows.len() {
        attend(q, k_pool, v_pool, &plan.keys, shape, out, ws.parallel);
    }
}

/// Rotates each head of each row of `x` by its row's position.
fn rope_rows(
    cfg: &LlamaConfig,
    cos: &[f32],
    sin: &[f32],
    x: &mut [f32],
    heads: usize,
    positions: &[usize],
) {
    let d = cfg.head_dim;
    let half = d / 2;
    for (row, &p) in x.chunks_exact_mut(heads * d).zip(positions) {
        let (cos, sin) = (
            &cos[p * half..(p + 1) * half],
            &sin[p * half..(p + 1) * half],
        );
        for h in row.chunks_exact_mut(d) {
            for i in 0..half {
                // GGUF stores Q/K for pairs (2i, 2i+1); Hugging Face rotates (i, i + d/2).
                let (a, b) = if cfg.rope_interleaved {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + half)
                };
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * cos[i] - x1 * sin[i];
                h[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean_sq = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn check_shapes(cfg: &LlamaConfig, w: &Weights) -> Result<(), ModelError> {
    if w.blocks.len() != cfg.n_layers {
        return Err(ModelError::Format(format!(
            "config says {} layers, checkpoint has {}",
            cfg.n_layers,
            w.blocks.len()
        )));
    }
    let embd = w.token_embd.shape()?;
    if embd != (cfg.vocab, cfg.hidden) {
        return Err(ModelError::Format(format!(
            "`token_embd` is {}x{}, the config needs {}x{}",
            embd.0, embd.1, cfg.vocab, cfg.hidden
        )));
    }
    let q_dim = cfg.n_heads * cfg.head_dim;
    let mut expect = vec![("output", &w.output, cfg.vocab, cfg.hidden)];
    for b in &w.blocks {
        expect.extend([
            ("attn_q", &b.attn_q, q_dim, cfg.hidden),
            ("attn_k", &b.attn_k, cfg.kv_dim(), cfg.hidden),
            ("attn_v", &b.attn_v, cfg.kv_dim(), cfg.hidden),
            ("attn_output", &b.attn_output, cfg.hidden, q_dim),
            ("ffn_gate", &b.ffn_gate, cfg.ffn, cfg.hidden),
            ("ffn_up", &b.ffn_up, cfg.ffn, cfg.hidden),
            ("ffn_down", &b.ffn_down, cfg.hidden, cfg.ffn),
        ]);
    }
    for (name, lin, rows, cols) in expect {
        if lin.rows() != rows || lin.cols() != cols {
            return Err(ModelError::Format(format!(
                "`{name}` is {}x{}, the config needs {rows}x{cols}",
                lin.rows(),
                lin.cols()
            )));
        }
    }
    let norms = w
        .blocks
        .iter()
        .flat_map(|b| [&b.attn_norm, &b.ffn_norm])
        .chain([&w.output_norm]);
    if norms.into_iter().any(|n| n.len() != cfg.hidden) {
        return Err(ModelError::Format(format!(
            "a norm weight is not {} wide",
            cfg.hidden
        )));
    }
    Ok(())
}
