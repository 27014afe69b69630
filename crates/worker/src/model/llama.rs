//! The llama forward pass over the shared token KV pool.
//!
//! One step runs every token of the batch (prefill chunks and decode tokens
//! alike) through the projections and MLP as a single `[n_tokens, hidden]`
//! matrix; only attention looks at sequences separately, each row reading
//! its own sequence's slots from the pool. The LM head runs only on the last
//! row of each chunk.

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::rms_norm;
use candle_nn::rotary_emb::{rope, rope_i};

use super::attention::{HeadShape, attend};
use super::kv::KvPool;
use super::linear::Linear;
use super::{ForwardModel, LlamaConfig, ModelError, SeqChunk};

/// Token embedding table; quantized tables are dequantized one row at a time.
#[derive(Debug)]
pub(crate) enum Embedding {
    /// Quantized `[vocab, hidden]` (possibly shared with a tied LM head).
    Quant(Arc<QTensor>),
    /// Dense f32 `[vocab, hidden]`.
    Dense(Tensor),
}

impl Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor, ModelError> {
        Ok(match self {
            Self::Quant(t) => t.embedding(ids)?,
            Self::Dense(t) => t.index_select(ids, 0)?,
        })
    }
}

/// One transformer block's weights, by their GGUF names.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) attn_norm: Tensor,
    pub(crate) attn_q: Linear,
    pub(crate) attn_k: Linear,
    pub(crate) attn_v: Linear,
    pub(crate) attn_output: Linear,
    pub(crate) ffn_norm: Tensor,
    pub(crate) ffn_gate: Linear,
    pub(crate) ffn_up: Linear,
    pub(crate) ffn_down: Linear,
}

/// Every weight of a llama model, as the loaders hand them over.
#[derive(Debug)]
pub(crate) struct Weights {
    pub(crate) token_embd: Embedding,
    pub(crate) blocks: Vec<Block>,
    pub(crate) output_norm: Tensor,
    pub(crate) output: Linear,
}

/// A llama model with its KV pool.
#[derive(Debug)]
pub struct Llama {
    cfg: LlamaConfig,
    w: Weights,
    /// RoPE tables `[max_positions, head_dim / 2]`, computed once at load.
    cos: Tensor,
    sin: Tensor,
    kv: KvPool,
    device: Device,
}

/// Row bookkeeping for one step, built from the batch before any tensor op.
struct StepPlan<'a> {
    ids: Vec<u32>,
    positions: Vec<u32>,
    new_slots: Vec<u32>,
    /// For each row, the slots it attends to (its sequence up to itself).
    keys: Vec<&'a [u32]>,
    /// Index of each chunk's last row.
    last_rows: Vec<u32>,
}

impl Llama {
    pub(crate) fn new(
        cfg: LlamaConfig,
        w: Weights,
        kv_capacity: usize,
    ) -> Result<Self, ModelError> {
        cfg.validate().map_err(ModelError::Format)?;
        if w.blocks.len() != cfg.n_layers {
            return Err(ModelError::Format(format!(
                "config says {} layers, checkpoint has {}",
                cfg.n_layers,
                w.blocks.len()
            )));
        }
        let device = Device::Cpu;
        let half = cfg.head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / cfg.head_dim as f32))
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), &device)?;
        let pos = Tensor::arange(0u32, cfg.max_positions as u32, &device)?
            .to_dtype(DType::F32)?
            .reshape((cfg.max_positions, 1))?;
        let freqs = pos.broadcast_mul(&inv_freq)?;
        let cos = freqs.cos()?.contiguous()?;
        let sin = freqs.sin()?.contiguous()?;
        let kv = KvPool::new(cfg.n_layers, kv_capacity, cfg.kv_dim())?;
        Ok(Self {
            cfg,
            w,
            cos,
            sin,
            kv,
            device,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    fn plan<'a>(&self, batch: &[SeqChunk<'a>]) -> Result<StepPlan<'a>, ModelError> {
        let n: usize = batch.iter().map(|c| c.tokens.len()).sum();
        let mut plan = StepPlan {
            ids: Vec::with_capacity(n),
            positions: Vec::with_capacity(n),
            new_slots: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            last_rows: Vec::with_capacity(batch.len()),
        };
        for (i, c) in batch.iter().enumerate() {
            let end = c.start_pos + c.tokens.len();
            if c.tokens.is_empty() || c.slots.len() != end {
                return Err(ModelError::InvalidBatch(format!(
                    "chunk {i}: {} tokens at start_pos {} need {end} slots, got {}",
                    c.tokens.len(),
                    c.start_pos,
                    c.slots.len()
                )));
            }
            if end > self.cfg.max_positions {
                return Err(ModelError::InvalidBatch(format!(
                    "chunk {i}: sequence of {end} tokens exceeds the model's {} positions",
                    self.cfg.max_positions
                )));
            }
            if let Some(&bad) = c.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
                return Err(ModelError::InvalidBatch(format!(
                    "chunk {i}: token {bad} is outside the vocabulary of {}",
                    self.cfg.vocab
                )));
            }
            if let Some(&bad) = c.slots.iter().find(|&&s| s as usize >= self.kv.capacity()) {
                return Err(ModelError::InvalidBatch(format!(
                    "chunk {i}: slot {bad} is outside the KV pool of {}",
                    self.kv.capacity()
                )));
            }
            for (j, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + j;
                plan.ids.push(t);
                plan.positions.push(pos as u32);
                plan.new_slots.push(c.slots[pos]);
                plan.keys.push(&c.slots[..=pos]);
            }
            plan.last_rows.push(plan.ids.len() as u32 - 1);
        }
        Ok(plan)
    }

    fn rotate(
        &self,
        x: &Tensor,
        heads: usize,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let n = x.dim(0)?;
        let x = x.reshape((n, heads, 1, self.cfg.head_dim))?;
        let x = if self.cfg.rope_interleaved {
            rope_i(&x, cos, sin)?
        } else {
            rope(&x, cos, sin)?
        };
        Ok(x.reshape((n, heads * self.cfg.head_dim))?)
    }
}

impl ForwardModel for Llama {
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let plan = self.plan(batch)?;
        let n = plan.ids.len();
        let cfg = &self.cfg;
        let (eps, q_dim) = (cfg.rms_eps, cfg.n_heads * cfg.head_dim);
        let shape = HeadShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
        };

        let ids = Tensor::from_slice(&plan.ids, n, &self.device)?;
        let positions = Tensor::from_slice(&plan.positions, n, &self.device)?;
        let rope_shape = (n, 1, cfg.head_dim / 2);
        let cos = self.cos.index_select(&positions, 0)?.reshape(rope_shape)?;
        let sin = self.sin.index_select(&positions, 0)?.reshape(rope_shape)?;

        let mut x = self.w.token_embd.forward(&ids)?;
        let mut attn_out = vec![0f32; n * q_dim];
        for (layer, b) in self.w.blocks.iter().enumerate() {
            let h = rms_norm(&x, &b.attn_norm, eps)?;
            let q = self.rotate(&b.attn_q.forward(&h)?, cfg.n_heads, &cos, &sin)?;
            let k = self.rotate(&b.attn_k.forward(&h)?, cfg.n_kv_heads, &cos, &sin)?;
            let v = b.attn_v.forward(&h)?;
            let (k, v) = (
                k.flatten_all()?.to_vec1::<f32>()?,
                v.flatten_all()?.to_vec1::<f32>()?,
            );
            self.kv.write(layer, &plan.new_slots, &k, &v);

            let q = q.flatten_all()?.to_vec1::<f32>()?;
            let (k_pool, v_pool) = self.kv.layer(layer);
            attend(&q, k_pool, v_pool, &plan.keys, shape, &mut attn_out);
            let attn = Tensor::from_slice(&attn_out, (n, q_dim), &self.device)?;
            x = (x + b.attn_output.forward(&attn)?)?;

            let h = rms_norm(&x, &b.ffn_norm, eps)?;
            let gate = candle_nn::ops::silu(&b.ffn_gate.forward(&h)?)?;
            let mlp = (gate * b.ffn_up.forward(&h)?)?;
            x = (x + b.ffn_down.forward(&mlp)?)?;
        }
        let last = Tensor::from_slice(&plan.last_rows, batch.len(), &self.device)?;
        let x = rms_norm(&x.index_select(&last, 0)?, &self.w.output_norm, eps)?;
        Ok(self.w.output.forward(&x)?.to_vec2::<f32>()?)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab
    }

    fn kv_capacity(&self) -> usize {
        self.kv.capacity()
    }
}
