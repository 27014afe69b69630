//! The llama forward pass as candle tensor ops, on any candle device.
//!
//! This is the GPU backend behind the same [`ForwardModel`] trait as the CPU
//! kernels, so the scheduler, radix cache and sampling are shared. Weights
//! stay quantized on the device and are multiplied with f32 activations
//! (see [`use_float_activations`]); the KV pool is one `[slots, kv_dim]` K and V tensor per layer,
//! written with `scatter_set` at the step's new slots and read with
//! `index_select` of each sequence's slots. Attention batches every decode
//! row of a step into one padded, masked product and runs each prefill chunk
//! as one causal block. Only the last row of each chunk goes through the LM
//! head, and only those logits are copied back to the host.
//!
//! It runs on candle's CPU device too, which is how it is tested on machines
//! without a GPU (the CPU build serves with [`super::Llama`], which is faster
//! there).

use std::path::Path;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{D, DType, Device, Module, Tensor};

use super::gguf;
use super::llama::StepPlan;
use super::{
    ForwardModel, KvShape, LlamaConfig, LoadOptions, ModelError, ModelTokenizer, SeqChunk,
};

/// One transformer block's weights on the device.
struct Block {
    attn_norm: Tensor,
    attn_q: QMatMul,
    attn_k: QMatMul,
    attn_v: QMatMul,
    attn_output: QMatMul,
    ffn_norm: Tensor,
    ffn_gate: QMatMul,
    ffn_up: QMatMul,
    ffn_down: QMatMul,
}

/// A llama model whose weights and KV pool live on a candle device.
pub struct CandleLlama {
    cfg: LlamaConfig,
    device: Device,
    /// `[vocab, hidden]` f32, looked up with `index_select`.
    token_embd: Tensor,
    blocks: Vec<Block>,
    output_norm: Tensor,
    output: QMatMul,
    /// RoPE tables `[max_positions, head_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    /// Per layer `[capacity, kv_dim]`.
    k_pool: Vec<Tensor>,
    v_pool: Vec<Tensor>,
    capacity: usize,
}

/// Rows that attend together: `b` sequences of `t` new tokens each, keys
/// padded to the longest sequence and masked.
struct AttnGroup {
    /// Row indices on the host, to put the outputs back in row order.
    row_ids: Vec<u32>,
    /// Row indices into the step's `[n, ...]` activations, `b * t` of them.
    rows: Tensor,
    /// Slot ids, `b * l_max`: each sequence's slots, padded with its first.
    keys: Tensor,
    /// Additive mask `[b, 1, t, l_max]`: 0 where a row may look, -inf elsewhere.
    mask: Tensor,
    b: usize,
    t: usize,
    l_max: usize,
}

/// Loads a GGUF file onto `device`.
pub(crate) fn load(
    path: &Path,
    options: &LoadOptions,
    device: &Device,
) -> Result<(CandleLlama, ModelTokenizer), ModelError> {
    if device.is_cuda() {
        use_float_activations();
    }
    let mut file = gguf::open(path)?;
    let cfg = file.cfg.clone();
    cfg.validate()?;
    let mut r = TensorReader {
        file: &mut file,
        device,
    };
    let q_dim = cfg.n_heads * cfg.head_dim;
    let (h, kv, ffn) = (cfg.hidden, cfg.kv_dim(), cfg.ffn);
    let mut blocks = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = format!("blk.{i}");
        blocks.push(Block {
            attn_q: r.linear(&format!("{p}.attn_q.weight"), q_dim, h)?,
            attn_k: r.linear(&format!("{p}.attn_k.weight"), kv, h)?,
            attn_v: r.linear(&format!("{p}.attn_v.weight"), kv, h)?,
            attn_output: r.linear(&format!("{p}.attn_output.weight"), h, q_dim)?,
            ffn_gate: r.linear(&format!("{p}.ffn_gate.weight"), ffn, h)?,
            ffn_up: r.linear(&format!("{p}.ffn_up.weight"), ffn, h)?,
            ffn_down: r.linear(&format!("{p}.ffn_down.weight"), h, ffn)?,
            attn_norm: r.vector(&format!("{p}.attn_norm.weight"))?,
            ffn_norm: r.vector(&format!("{p}.ffn_norm.weight"))?,
        });
    }
    let tied = !r.file.content.tensor_infos.contains_key("output.weight");
    let embd = std::sync::Arc::new(r.qtensor("token_embd.weight")?);
    let weights = Weights {
        token_embd: embd.dequantize(device)?,
        output: if tied {
            // Tied embeddings: the table doubles as the LM head.
            QMatMul::from_arc(embd)?
        } else {
            r.linear("output.weight", cfg.vocab, cfg.hidden)?
        },
        output_norm: r.vector("output_norm.weight")?,
        blocks,
    };
    let model = CandleLlama::new(cfg, device.clone(), weights, options.kv_capacity)?;
    Ok((model, file.tokenizer))
}

/// Makes candle's CUDA quantized matmuls dequantize weights and multiply
/// f32 activations (a mat-vec kernel for one row, cuBLAS above) instead of
/// rounding activations to 8 bits (MMVQ for up to 8 rows, MMQ above).
///
/// With 8-bit activations a row's logits depend on how many rows share its
/// matmul: a last-bit change flips roundings that grow over the layers (on
/// the H100, greedy tokens of a prompt decoded in a batch of 8 and alone
/// parted after 15 tokens, and a seeded sample changed when the prompt came
/// from the prefix cache). f32 activations make batching and caching change
/// nothing but summation order. `ZINFER_CUDA_INT8_ACTIVATIONS=1` keeps
/// candle's 8-bit path. The setting is process-wide in candle; a worker
/// process runs one model.
fn use_float_activations() {
    #[cfg(feature = "cuda")]
    candle_core::quantized::cuda::set_force_dmmv(
        std::env::var("ZINFER_CUDA_INT8_ACTIVATIONS").map_or(true, |v| v != "1"),
    );
}

/// Reads named tensors of a GGUF file straight onto the device.
struct TensorReader<'a> {
    file: &'a mut gguf::GgufFile,
    device: &'a Device,
}

impl TensorReader<'_> {
    fn qtensor(&mut self, name: &str) -> Result<QTensor, ModelError> {
        if !self.file.content.tensor_infos.contains_key(name) {
            return Err(ModelError::Format(format!(
                "GGUF file has no tensor `{name}`"
            )));
        }
        self.file
            .content
            .tensor(&mut self.file.reader, name, self.device)
            .map_err(|e| ModelError::Format(format!("reading tensor `{name}`: {e}")))
    }

    fn linear(&mut self, name: &str, rows: usize, cols: usize) -> Result<QMatMul, ModelError> {
        let qt = self.qtensor(name)?;
        let dims = qt.shape().dims2()?;
        if dims != (rows, cols) {
            return Err(ModelError::Format(format!(
                "`{name}` is {}x{}, the config needs {rows}x{cols}",
                dims.0, dims.1
            )));
        }
        Ok(QMatMul::from_qtensor(qt)?)
    }

    fn vector(&mut self, name: &str) -> Result<Tensor, ModelError> {
        Ok(self.qtensor(name)?.dequantize(self.device)?.flatten_all()?)
    }
}

/// Every weight of the model, as the loader hands them over.
struct Weights {
    token_embd: Tensor,
    blocks: Vec<Block>,
    output_norm: Tensor,
    output: QMatMul,
}

impl CandleLlama {
    fn new(
        cfg: LlamaConfig,
        device: Device,
        w: Weights,
        capacity: usize,
    ) -> Result<Self, ModelError> {
        let embd = w.token_embd.dims2()?;
        if embd != (cfg.vocab, cfg.hidden) {
            return Err(ModelError::Format(format!(
                "`token_embd` is {}x{}, the config needs {}x{}",
                embd.0, embd.1, cfg.vocab, cfg.hidden
            )));
        }
        let half = cfg.head_dim / 2;
        let (cos, sin) = cfg.rope_tables();
        let cos = Tensor::from_vec(cos, (cfg.max_positions, half), &device)?;
        let sin = Tensor::from_vec(sin, (cfg.max_positions, half), &device)?;
        let mut k_pool = Vec::with_capacity(cfg.n_layers);
        let mut v_pool = Vec::with_capacity(cfg.n_layers);
        for _ in 0..cfg.n_layers {
            k_pool.push(Tensor::zeros(
                (capacity, cfg.kv_dim()),
                DType::F32,
                &device,
            )?);
            v_pool.push(Tensor::zeros(
                (capacity, cfg.kv_dim()),
                DType::F32,
                &device,
            )?);
        }
        Ok(Self {
            cfg,
            device,
            token_embd: w.token_embd,
            blocks: w.blocks,
            output_norm: w.output_norm,
            output: w.output,
            cos,
            sin,
            k_pool,
            v_pool,
            capacity,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Splits a step's rows into attention groups: all single-token rows
    /// (decode) together, each longer chunk on its own.
    fn attention_groups(&self, plan: &StepPlan<'_>) -> Result<Vec<AttnGroup>, ModelError> {
        let mut decode: Vec<(usize, &[u32])> = Vec::new();
        let mut groups = Vec::new();
        let mut first = 0;
        for &last in &plan.last_rows {
            let keys = plan.keys[last];
            if last == first {
                decode.push((last, keys));
            } else {
                let rows: Vec<u32> = (first..=last).map(|r| r as u32).collect();
                groups.push(self.group(&rows, &[keys], last + 1 - first)?);
            }
            first = last + 1;
        }
        if !decode.is_empty() {
            let rows: Vec<u32> = decode.iter().map(|&(r, _)| r as u32).collect();
            let keys: Vec<&[u32]> = decode.iter().map(|&(_, k)| k).collect();
            groups.push(self.group(&rows, &keys, 1)?);
        }
        Ok(groups)
    }

    /// One group of `seqs.len()` sequences with `t` new rows each; row `i`
    /// of sequence `s` sees its keys up to position `len(s) - t + i`.
    fn group(&self, rows: &[u32], seqs: &[&[u32]], t: usize) -> Result<AttnGroup, ModelError> {
        let b = seqs.len();
        let l_max = seqs.iter().map(|k| k.len()).max().unwrap_or(0);
        let mut keys = Vec::with_capacity(b * l_max);
        let mut mask = Vec::with_capacity(b * t * l_max);
        for seq in seqs {
            let pad = seq.first().copied().unwrap_or(0);
            keys.extend_from_slice(seq);
            keys.extend(std::iter::repeat_n(pad, l_max - seq.len()));
            let start = seq.len() - t;
            for i in 0..t {
                mask.extend((0..l_max).map(|j| {
                    if j <= start + i {
                        0.0f32
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
            }
        }
        Ok(AttnGroup {
            row_ids: rows.to_vec(),
            rows: Tensor::new(rows, &self.device)?,
            keys: Tensor::from_vec(keys, b * l_max, &self.device)?,
            mask: Tensor::from_vec(mask, (b, 1, t, l_max), &self.device)?,
            b,
            t,
            l_max,
        })
    }

    /// Attention of every row in `q` (`[n, n_heads, head_dim]`) over its
    /// sequence's slots in `layer`, as `[n, n_heads * head_dim]` in row order
    /// (`order`: where each row's output is among the groups' outputs;
    /// `None` when they are already in row order).
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        groups: &[AttnGroup],
        order: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let (h, kvh, d) = (self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim);
        let g = h / kvh;
        let scale = 1.0 / (d as f64).sqrt();
        let mut outs = Vec::with_capacity(groups.len());
        for grp in groups {
            let (b, t, l) = (grp.b, grp.t, grp.l_max);
            // [b*t, h, d] -> [b, kvh, g*t, d]: the query heads sharing a KV head side by side.
            let qg = q
                .index_select(&grp.rows, 0)?
                .reshape((b, t, kvh, g, d))?
                .permute((0, 2, 3, 1, 4))?
                .contiguous()?
                .reshape((b, kvh, g * t, d))?;
            let gather = |pool: &Tensor| -> Result<Tensor, ModelError> {
                Ok(pool
                    .index_select(&grp.keys, 0)?
                    .reshape((b, l, kvh, d))?
                    .transpose(1, 2)?
                    .contiguous()?)
            };
            let k = gather(&self.k_pool[layer])?;
            let v = gather(&self.v_pool[layer])?;
            let scores = (qg * scale)?
                .matmul(&k.t()?)?
                .reshape((b, kvh, g, t, l))?
                .broadcast_add(&grp.mask.unsqueeze(1)?)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?.reshape((b, kvh, g * t, l))?;
            let out = probs
                .matmul(&v)?
                .reshape((b, kvh, g, t, d))?
                .permute((0, 3, 1, 2, 4))?
                .contiguous()?
                .reshape((b * t, h * d))?;
            outs.push(out);
        }
        let all = if outs.len() == 1 {
            outs.remove(0)
        } else {
            Tensor::cat(&outs, 0)?
        };
        Ok(match order {
            Some(order) => all.index_select(order, 0)?,
            None => all,
        })
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, ModelError> {
        Ok(if self.cfg.rope_interleaved {
            candle_nn::rotary_emb::rope_i(x, cos, sin)?
        } else {
            candle_nn::rotary_emb::rope(x, cos, sin)?
        })
    }
}

impl ForwardModel for CandleLlama {
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // candle runs its own attention: every row keeps its key list.
        let plan = StepPlan::build(batch, &self.cfg, self.capacity, usize::MAX)?;
        let n = plan.ids.len();
        let (h, kvh, d) = (self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim);
        let (kv_dim, eps) = (self.cfg.kv_dim(), self.cfg.rms_eps);
        let dev = &self.device;

        let ids = Tensor::new(plan.ids.as_slice(), dev)?;
        let positions: Vec<u32> = plan.positions.iter().map(|&p| p as u32).collect();
        let positions = Tensor::new(positions.as_slice(), dev)?;
        let cos = self
            .cos
            .index_select(&positions, 0)?
            .reshape((n, 1, d / 2))?;
        let sin = self
            .sin
            .index_select(&positions, 0)?
            .reshape((n, 1, d / 2))?;
        let new_slots = Tensor::new(plan.new_slots.as_slice(), dev)?
            .reshape((n, 1))?
            .broadcast_as((n, kv_dim))?
            .contiguous()?;
        let groups = self.attention_groups(&plan)?;
        let mut order = vec![0u32; n];
        let mut at = 0u32;
        for grp in &groups {
            for &r in &grp.row_ids {
                order[r as usize] = at;
                at += 1;
            }
        }
        // Outputs come back group by group; `order` puts them back in row order.
        let in_order = order.iter().enumerate().all(|(i, &o)| o as usize == i);
        let order = if in_order {
            None
        } else {
            Some(Tensor::new(order.as_slice(), dev)?)
        };

        let mut x = self.token_embd.index_select(&ids, 0)?;
        for (layer, b) in self.blocks.iter().enumerate() {
            let hs = candle_nn::ops::rms_norm(&x, &b.attn_norm, eps)?;
            let q = b.attn_q.forward(&hs)?.reshape((n, h, 1, d))?;
            let k = b.attn_k.forward(&hs)?.reshape((n, kvh, 1, d))?;
            let v = b.attn_v.forward(&hs)?.contiguous()?;
            let q = self.rope(&q, &cos, &sin)?.reshape((n, h, d))?;
            let k = self.rope(&k, &cos, &sin)?.reshape((n, kv_dim))?;
            self.k_pool[layer].scatter_set(&new_slots, &k, 0)?;
            self.v_pool[layer].scatter_set(&new_slots, &v, 0)?;
            let attn = self.attend(layer, &q, &groups, order.as_ref())?;
            x = (x + b.attn_output.forward(&attn)?)?;

            let hs = candle_nn::ops::rms_norm(&x, &b.ffn_norm, eps)?;
            let gate = candle_nn::ops::silu(&b.ffn_gate.forward(&hs)?)?;
            let up = b.ffn_up.forward(&hs)?;
            x = (x + b.ffn_down.forward(&(gate * up)?)?)?;
        }
        let last: Vec<u32> = plan.last_rows.iter().map(|&r| r as u32).collect();
        let last = x.index_select(&Tensor::new(last.as_slice(), dev)?, 0)?;
        let normed = candle_nn::ops::rms_norm(&last, &self.output_norm, eps)?;
        let logits = self
            .output
            .forward(&normed)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?;
        debug_assert_eq!(logits.dim(D::Minus1)?, self.cfg.vocab);
        Ok(logits.to_vec2::<f32>()?)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab
    }

    fn kv_capacity(&self) -> usize {
        self.capacity
    }

    fn max_positions(&self) -> usize {
        self.cfg.max_positions
    }

    fn kv_shape(&self) -> KvShape {
        KvShape {
            layers: self.k_pool.len(),
            kv_dim: self.cfg.kv_dim(),
        }
    }

    /// One `index_select` per layer and pool, then one copy to the host.
    fn read_kv(&self, slots: &[u32]) -> Result<Vec<f32>, ModelError> {
        let shape = self.kv_shape();
        shape.check(slots, self.capacity, None)?;
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        let index = Tensor::new(slots, &self.device)?;
        let mut parts = Vec::with_capacity(2 * shape.layers);
        for (k, v) in self.k_pool.iter().zip(&self.v_pool) {
            parts.push(k.index_select(&index, 0)?);
            parts.push(v.index_select(&index, 0)?);
        }
        Ok(Tensor::cat(&parts, 0)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }

    /// One host-to-device copy, then a `scatter_set` per layer and pool,
    /// as the forward pass writes new K/V.
    fn write_kv(&mut self, slots: &[u32], data: &[f32]) -> Result<(), ModelError> {
        let shape = self.kv_shape();
        shape.check(slots, self.capacity, Some(data.len()))?;
        if slots.is_empty() {
            return Ok(());
        }
        let (n, d) = (slots.len(), shape.kv_dim);
        let index = Tensor::new(slots, &self.device)?
            .reshape((n, 1))?
            .broadcast_as((n, d))?
            .contiguous()?;
        let all = Tensor::from_slice(data, (shape.layers, 2, n, d), &self.device)?;
        for (layer, (k_pool, v_pool)) in self.k_pool.iter_mut().zip(&mut self.v_pool).enumerate() {
            let rows = all.get(layer)?;
            k_pool.scatter_set(&index, &rows.get(0)?.contiguous()?, 0)?;
            v_pool.scatter_set(&index, &rows.get(1)?.contiguous()?, 0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// softmax and the two batched products that attention is built from,
    /// against plain loops, for every key count around SIMD widths.
    #[test]
    fn attention_ops_match_plain_loops() {
        let dev = Device::Cpu;
        for l in 1..20usize {
            let (b, h, t, d) = (2usize, 3usize, 2usize, 4usize);
            let q = Tensor::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();
            let k = Tensor::randn(0f32, 1.0, (b, h, l, d), &dev).unwrap();
            let v = Tensor::randn(0f32, 1.0, (b, h, l, d), &dev).unwrap();
            let scores = q.matmul(&k.t().unwrap()).unwrap();
            let probs = candle_nn::ops::softmax_last_dim(&scores).unwrap();
            let out = probs.matmul(&v).unwrap();
            let (qv, kv, vv) = (
                q.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                k.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                v.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            let got = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for bh in 0..b * h {
                for i in 0..t {
                    let s: Vec<f32> = (0..l)
                        .map(|j| {
                            (0..d)
                                .map(|x| qv[(bh * t + i) * d + x] * kv[(bh * l + j) * d + x])
                                .sum()
                        })
                        .collect();
                    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for x in 0..d {
                        let want: f32 = (0..l).map(|j| e[j] / z * vv[(bh * l + j) * d + x]).sum();
                        let have = got[(bh * t + i) * d + x];
                        assert!(
                            (want - have).abs() < 1e-4,
                            "l={l} bh={bh} i={i}: {want} vs {have}"
                        );
                    }
                }
            }
        }
    }
}
