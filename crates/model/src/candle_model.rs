//! The forward pass as candle tensor ops, on any candle device, for every
//! architecture (read from the [`ModelSpec`], like the CPU pass).
//!
//! This is the GPU backend behind the same [`ForwardModel`] trait as the CPU
//! kernels, so the scheduler, radix cache and sampling are shared. Weights
//! stay quantized on the device and are multiplied with f32 activations
//! (see [`use_float_activations`]); the KV pool is one `[slots, kv_dim]` K and V tensor per layer,
//! written with `scatter_set` at the step's new slots and read with
//! `index_select` of each sequence's slots. Attention batches every decode
//! row of a step into one padded, masked product and runs each prefill chunk
//! as one causal block (with a sliding window, the mask also hides keys
//! before it). Only the rows the chunks ask for ([`crate::ChunkOutput`]:
//! the last row of each, unless a chunk wants all its rows' logits or
//! final hidden states) go through the final norm and, for logits, the LM
//! head, and only those outputs are copied back to the host.
//!
//! It runs on candle's CPU device too, which is how it is tested on machines
//! without a GPU (the CPU build serves with [`super::CpuModel`], which is faster
//! there).

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{D, DType, Device, Module, Tensor};

use super::classifier::Classifier;
use super::cpu::{OutputRows, StepPlan, split_outputs};
use super::gguf::{self, GgufFile, check_dims, check_len};
use super::moe;
use super::spec::{Activation, ModelSpec, RopeStyle};
use super::weights::{self, Experts, Ffn, GateUp, Mlp, Naming, Qkv, TensorSource, Weights};
use super::{ForwardModel, KvShape, LoadOptions, ModelError, SeqChunk, check_transfer};

/// Weights on the device: the embedding table dequantized (`[vocab, hidden]`
/// f32, looked up with `index_select`), matrices quantized, vectors f32.
type CandleWeights = Weights<Tensor, QMatMul, Tensor>;

/// A model whose weights and KV pool live on a candle device.
pub struct CandleModel {
    spec: ModelSpec,
    device: Device,
    w: CandleWeights,
    /// Per RoPE of the spec, cos and sin tables `[max_positions, head_dim / 2]`.
    ropes: Vec<(Tensor, Tensor)>,
    /// The layers' distinct windows (`None`: no window); a step builds
    /// one attention mask per entry and each layer uses its window's.
    windows: Vec<Option<usize>>,
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
    /// Per distinct window of the model, an additive mask
    /// `[b, 1, t, l_max]`: 0 where a row may look, -inf elsewhere.
    masks: Vec<Tensor>,
    b: usize,
    t: usize,
    l_max: usize,
}

/// Loads a GGUF file onto `device`.
pub(crate) fn load(
    path: &Path,
    options: &LoadOptions,
    device: &Device,
) -> Result<(CandleModel, Option<Classifier>), ModelError> {
    if device.is_cuda() {
        use_float_activations();
    }
    let mut file = gguf::open(path)?;
    let spec = file.spec.clone();
    if let Some(missing) = not_covered(&spec) {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{} on this device: the candle backend has no {missing}; serve it with --device cpu",
            spec.arch
        )));
    }
    let mut src = CandleSource {
        file: &mut file,
        device,
    };
    let weights = weights::read(&mut src, &spec, Naming::Gguf)?;
    let classifier = Classifier::read(&mut file)?;
    let model = CandleModel::new(spec, device.clone(), weights, options.kv_capacity)?;
    Ok((model, classifier))
}

/// What of `spec` this backend does not run (Gemma 4's parts), if anything.
fn not_covered(spec: &ModelSpec) -> Option<&'static str> {
    let l = spec.layers.iter();
    if spec.hybrid.is_some() {
        Some("Gated DeltaNet (recurrent) layers")
    } else if l.clone().any(|l| l.kv_from.is_some()) {
        Some("layers that read another layer's KV")
    } else if l
        .clone()
        .any(|l| l.head_dim != spec.head_dim || l.n_kv_heads != spec.n_kv_heads)
    {
        Some("per-layer head widths or KV head counts")
    } else if l.clone().any(|l| l.ffn != spec.ffn) {
        Some("per-layer MLP widths")
    } else if spec.per_layer_input.is_some() {
        Some("per-layer token embeddings")
    } else if spec.v_norm {
        Some("V norm")
    } else {
        None
    }
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
struct CandleSource<'a> {
    file: &'a mut GgufFile,
    device: &'a Device,
}

impl TensorSource for CandleSource<'_> {
    type Embedding = Tensor;
    type Matrix = QMatMul;
    type Vector = Tensor;

    fn has_own_head(&self, name: &str) -> bool {
        self.file.has(name)
    }

    fn has(&self, name: &str) -> bool {
        self.file.has(name)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<QMatMul, ModelError> {
        let qt = self.file.qtensor(name, self.device)?;
        check_dims(name, qt.shape().dims2()?, (rows, cols))?;
        Ok(QMatMul::from_qtensor(qt)?)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor, ModelError> {
        let qt = self.file.qtensor(name, self.device)?;
        let v = qt.dequantize(self.device)?.flatten_all()?;
        check_len(name, v.dim(0)?, len)?;
        Ok(v)
    }

    fn concat(&mut self, parts: Vec<Tensor>) -> Result<Tensor, ModelError> {
        Ok(Tensor::cat(&parts, 0)?)
    }

    fn experts(
        &mut self,
        name: &str,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<QMatMul>, ModelError> {
        let parts = self
            .file
            .expert_qtensors(name, experts, (rows, cols), self.device)?;
        parts
            .into_iter()
            .map(|qt| Ok(QMatMul::from_qtensor(qt)?))
            .collect()
    }

    fn embedding(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        tied: bool,
    ) -> Result<(Tensor, Option<QMatMul>), ModelError> {
        let qt = Arc::new(self.file.qtensor(name, self.device)?);
        check_dims(name, qt.shape().dims2()?, (rows, cols))?;
        let table = qt.dequantize(self.device)?;
        // Tied embeddings: the quantized table doubles as the LM head.
        let head = if tied {
            Some(QMatMul::from_arc(qt)?)
        } else {
            None
        };
        Ok((table, head))
    }
}

impl CandleModel {
    fn new(
        spec: ModelSpec,
        device: Device,
        w: CandleWeights,
        capacity: usize,
    ) -> Result<Self, ModelError> {
        spec.validate()?;
        let half = spec.head_dim / 2;
        let mut ropes = Vec::with_capacity(spec.ropes.len());
        for r in &spec.ropes {
            let (cos, sin) = r.tables(spec.head_dim, spec.max_positions);
            ropes.push((
                Tensor::from_vec(cos, (spec.max_positions, half), &device)?,
                Tensor::from_vec(sin, (spec.max_positions, half), &device)?,
            ));
        }
        let mut windows = Vec::new();
        for l in &spec.layers {
            if !windows.contains(&l.window) {
                windows.push(l.window);
            }
        }
        let mut k_pool = Vec::with_capacity(spec.n_layers);
        let mut v_pool = Vec::with_capacity(spec.n_layers);
        for _ in 0..spec.n_layers {
            k_pool.push(Tensor::zeros(
                (capacity, spec.kv_dim()),
                DType::F32,
                &device,
            )?);
            v_pool.push(Tensor::zeros(
                (capacity, spec.kv_dim()),
                DType::F32,
                &device,
            )?);
        }
        Ok(Self {
            spec,
            device,
            w,
            ropes,
            windows,
            k_pool,
            v_pool,
            capacity,
        })
    }

    /// The model's shape.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
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
        for seq in seqs {
            let pad = seq.first().copied().unwrap_or(0);
            keys.extend_from_slice(seq);
            keys.extend(std::iter::repeat_n(pad, l_max - seq.len()));
        }
        let mut masks = Vec::with_capacity(self.windows.len());
        for window in &self.windows {
            let mut mask = Vec::with_capacity(b * t * l_max);
            for seq in seqs {
                let start = seq.len() - t;
                for i in 0..t {
                    let pos = start + i;
                    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    mask.extend((0..l_max).map(|j| {
                        if (lo..=pos).contains(&j) {
                            0.0f32
                        } else {
                            f32::NEG_INFINITY
                        }
                    }));
                }
            }
            masks.push(Tensor::from_vec(mask, (b, 1, t, l_max), &self.device)?);
        }
        Ok(AttnGroup {
            row_ids: rows.to_vec(),
            rows: Tensor::new(rows, &self.device)?,
            keys: Tensor::from_vec(keys, b * l_max, &self.device)?,
            masks,
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
        sinks: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let (h, kvh, d) = (self.spec.n_heads, self.spec.n_kv_heads, self.spec.head_dim);
        let g = h / kvh;
        let scale = f64::from(self.spec.attn.scale);
        let window = self.spec.layers[layer].window;
        let mask_at = self.windows.iter().position(|w| *w == window).unwrap_or(0);
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
            let mut scores = (qg * scale)?.matmul(&k.t()?)?;
            if let Some(cap) = self.spec.attn.softcap {
                scores = ((scores / f64::from(cap))?.tanh()? * f64::from(cap))?;
            }
            let scores = scores
                .reshape((b, kvh, g, t, l))?
                .broadcast_add(&grp.masks[mask_at].unsqueeze(1)?)?;
            let probs = match sinks {
                // The sink as one more score per head, dropped after the softmax.
                Some(sinks) => {
                    let col = sinks
                        .reshape((1, kvh, g, 1, 1))?
                        .broadcast_as((b, kvh, g, t, 1))?;
                    let with = Tensor::cat(&[&scores, &col.contiguous()?], 4)?;
                    candle_nn::ops::softmax_last_dim(&with)?
                        .narrow(4, 0, l)?
                        .contiguous()?
                }
                None => candle_nn::ops::softmax_last_dim(&scores)?,
            };
            let probs = probs.reshape((b, kvh, g * t, l))?;
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

    fn rope(
        &self,
        x: &Tensor,
        rope: usize,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor, ModelError> {
        Ok(match self.spec.ropes[rope].style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
            RopeStyle::Neox => candle_nn::rotary_emb::rope(x, cos, sin)?,
        })
    }
}

/// RMSNorm over the last dimension.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor, ModelError> {
    Ok(candle_nn::ops::rms_norm(x, w, eps)?)
}

/// `down(act(gate(x) + bg) * (up(x) + bu)) + bd`, the biases (one
/// expert's gate, up and down) only when given.
fn ffn(
    f: &Ffn<QMatMul>,
    bias: Option<[Tensor; 3]>,
    act: Activation,
    x: &Tensor,
) -> Result<Tensor, ModelError> {
    let (mut gate, mut up) = match &f.gate_up {
        GateUp::Separate { gate, up } => (gate.forward(x)?, up.forward(x)?),
        GateUp::Fused(w) => {
            let gu = w.forward(x)?;
            let width = gu.dim(1)? / 2;
            (gu.narrow(1, 0, width)?, gu.narrow(1, width, width)?)
        }
    };
    if let Some([bg, bu, _]) = &bias {
        gate = gate.broadcast_add(bg)?;
        up = up.broadcast_add(bu)?;
    }
    let gated = activate(act, &gate, &up)?;
    let mut out = f.down.forward(&gated)?;
    if let Some([_, _, bd]) = &bias {
        out = out.broadcast_add(bd)?;
    }
    Ok(out)
}

/// `act(gate) * up`, elementwise.
fn activate(act: Activation, gate: &Tensor, up: &Tensor) -> Result<Tensor, ModelError> {
    Ok(match act {
        Activation::Silu => (candle_nn::ops::silu(gate)? * up)?,
        Activation::GeluTanh => (gate.gelu()? * up)?,
        Activation::SwigluOai => {
            let (alpha, limit) = (
                f64::from(zinfer_kernels::SWIGLU_OAI_ALPHA),
                f64::from(zinfer_kernels::SWIGLU_OAI_LIMIT),
            );
            let x = gate.minimum(limit)?;
            let y = (up.clamp(-limit, limit)? + 1.0)?;
            let sig = candle_nn::ops::sigmoid(&(&x * alpha)?)?;
            ((x * sig)? * y)?
        }
    })
}

/// Each row's experts' outputs, weighted and summed: the router's logits
/// come to the host, where [`moe::route`] groups the rows by expert (as on
/// the CPU backend); each routed expert runs on its rows, picked with
/// `index_select`, and adds its weighted output back with `index_add`.
/// Simple rather than fast: one host round trip and a few launches per
/// routed expert and layer.
fn moe_forward(
    m: &Experts<QMatMul, Tensor>,
    act: Activation,
    x: &Tensor,
) -> Result<Tensor, ModelError> {
    let dev = x.device();
    let mut logits = m.router.forward(x)?;
    if let Some(b) = &m.router_bias {
        logits = logits.broadcast_add(b)?;
    }
    let host = logits.flatten_all()?.to_vec1::<f32>()?;
    let mut out = x.zeros_like()?;
    for (e, (expert, rows)) in m.experts.iter().zip(moe::route(&m.spec, &host)).enumerate() {
        if rows.is_empty() {
            continue;
        }
        let (ids, weights): (Vec<u32>, Vec<f32>) = rows.iter().map(|&(r, w)| (r as u32, w)).unzip();
        let ids = Tensor::new(ids.as_slice(), dev)?;
        let weights = Tensor::new(weights.as_slice(), dev)?.reshape((rows.len(), 1))?;
        let bias = match &m.biases {
            Some(b) => {
                let (f, h) = (m.spec.expert_ffn, x.dim(1)?);
                Some([
                    b.gate.narrow(0, e * f, f)?,
                    b.up.narrow(0, e * f, f)?,
                    b.down.narrow(0, e * h, h)?,
                ])
            }
            None => None,
        };
        let ys = ffn(expert, bias, act, &x.index_select(&ids, 0)?)?.broadcast_mul(&weights)?;
        out = out.index_add(&ids, &ys, 0)?;
    }
    if let Some((shared, gate)) = &m.shared {
        let g = candle_nn::ops::sigmoid(&x.matmul(&gate.unsqueeze(1)?)?)?;
        out = (out + ffn(shared, None, act, x)?.broadcast_mul(&g)?)?;
    }
    Ok(out)
}

impl ForwardModel for CandleModel {
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // candle runs its own attention: every row keeps its key list.
        let spec = &self.spec;
        let plan = StepPlan::build(batch, spec, self.capacity, usize::MAX)?;
        let n = plan.ids.len();
        let (h, kvh, d) = (spec.n_heads, spec.n_kv_heads, spec.head_dim);
        let (q_dim, kv_dim, eps) = (spec.q_dim(), spec.kv_dim(), spec.norm_eps);
        let dev = &self.device;

        let ids = Tensor::new(plan.ids.as_slice(), dev)?;
        let positions: Vec<u32> = plan.positions.iter().map(|&p| p as u32).collect();
        let positions = Tensor::new(positions.as_slice(), dev)?;
        let mut step_ropes = Vec::with_capacity(self.ropes.len());
        for (cos, sin) in &self.ropes {
            step_ropes.push((
                cos.index_select(&positions, 0)?.reshape((n, 1, d / 2))?,
                sin.index_select(&positions, 0)?.reshape((n, 1, d / 2))?,
            ));
        }
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

        let mut x = self.w.token_embd.index_select(&ids, 0)?;
        if let Some(s) = spec.embed_scale {
            x = (x * f64::from(s))?;
        }
        for (layer, b) in self.w.blocks.iter().enumerate() {
            let rope = spec.layers[layer].rope;
            let (cos, sin) = &step_ropes[rope];
            let hs = rms_norm(&x, &b.attn_norm, eps)?;
            let (mut q, mut k, mut v) = match &b.qkv {
                Qkv::Separate { q, k, v } => (q.forward(&hs)?, k.forward(&hs)?, v.forward(&hs)?),
                Qkv::Fused(w) => {
                    let qkv = w.forward(&hs)?;
                    (
                        qkv.narrow(1, 0, q_dim)?,
                        qkv.narrow(1, q_dim, kv_dim)?,
                        qkv.narrow(1, q_dim + kv_dim, kv_dim)?,
                    )
                }
                // Refused at load ([`not_covered`]).
                Qkv::KeyAsValue { .. } | Qkv::QueryOnly(_) => {
                    return Err(ModelError::UnsupportedArchitecture(format!(
                        "{} on this device",
                        spec.arch
                    )));
                }
            };
            if let Some(bias) = &b.qkv_bias {
                q = q.broadcast_add(&bias.narrow(0, 0, q_dim)?)?;
                k = k.broadcast_add(&bias.narrow(0, q_dim, kv_dim)?)?;
                v = v.broadcast_add(&bias.narrow(0, q_dim + kv_dim, kv_dim)?)?;
            }
            let mut q = q.reshape((n, h, 1, d))?;
            let mut k = k.reshape((n, kvh, 1, d))?;
            if let Some((q_norm, k_norm)) = &b.qk_norm {
                q = rms_norm(&q.contiguous()?, q_norm, eps)?;
                k = rms_norm(&k.contiguous()?, k_norm, eps)?;
            }
            let v = v.contiguous()?;
            let q = self
                .rope(&q.contiguous()?, rope, cos, sin)?
                .reshape((n, h, d))?;
            let k = self
                .rope(&k.contiguous()?, rope, cos, sin)?
                .reshape((n, kv_dim))?;
            self.k_pool[layer].scatter_set(&new_slots, &k, 0)?;
            self.v_pool[layer].scatter_set(&new_slots, &v, 0)?;
            let attn = self.attend(layer, &q, &groups, order.as_ref(), b.sinks.as_ref())?;
            let mut out = b.attn_output.forward(&attn)?;
            if let Some(bias) = &b.attn_output_bias {
                out = out.broadcast_add(bias)?;
            }
            if let Some(w) = &b.post_attn_norm {
                out = rms_norm(&out, w, eps)?;
            }
            x = (x + out)?;

            let hs = rms_norm(&x, &b.ffn_norm, eps)?;
            let mut out = match &b.mlp {
                Mlp::Dense(f) => ffn(f, None, spec.activation, &hs)?,
                Mlp::Moe(experts) => moe_forward(experts, spec.activation, &hs)?,
                // Refused at load ([`not_covered`]).
                Mlp::DenseAndMoe(_) => {
                    return Err(ModelError::UnsupportedArchitecture(format!(
                        "{} on this device",
                        spec.arch
                    )));
                }
            };
            if let Some(w) = &b.post_ffn_norm {
                out = rms_norm(&out, w, eps)?;
            }
            x = (x + out)?;
        }
        // The rows each chunk asks for go through the final norm: first
        // those the LM head takes, in batch order, then the hidden ones (as
        // on the CPU backend). A batch of `LastLogits` chunks selects its
        // last rows and nothing else, and copies back only their logits.
        let head_rows = OutputRows::Head.count(batch);
        let hidden_rows = OutputRows::Hidden.count(batch);
        let mut picked: Vec<u32> = Vec::with_capacity(head_rows + hidden_rows);
        for which in [OutputRows::Head, OutputRows::Hidden] {
            for (c, &last) in batch.iter().zip(&plan.last_rows) {
                if let Some(rows) = which.rows(c, last) {
                    picked.extend(rows.map(|r| r as u32));
                }
            }
        }
        let picked = x.index_select(&Tensor::new(picked.as_slice(), dev)?, 0)?;
        let normed = rms_norm(&picked, &self.w.output_norm, eps)?;
        let logits = if head_rows == 0 {
            None
        } else {
            let head_in = if hidden_rows == 0 {
                normed.clone()
            } else {
                normed.narrow(0, 0, head_rows)?
            };
            let mut logits = self.w.output.forward(&head_in)?.to_dtype(DType::F32)?;
            if let Some(cap) = spec.final_softcap {
                logits = ((logits / f64::from(cap))?.tanh()? * f64::from(cap))?;
            }
            let logits = logits.to_device(&Device::Cpu)?;
            debug_assert_eq!(logits.dim(D::Minus1)?, spec.vocab);
            Some(logits)
        };
        match logits {
            // One row of logits per chunk: every chunk's output is its row.
            Some(logits) if hidden_rows == 0 && head_rows == batch.len() => {
                Ok(logits.to_vec2::<f32>()?)
            }
            logits => {
                let logits = match logits {
                    Some(l) => l.flatten_all()?.to_vec1::<f32>()?,
                    None => Vec::new(),
                };
                let hidden = if hidden_rows == 0 {
                    Vec::new()
                } else {
                    normed
                        .narrow(0, head_rows, hidden_rows)?
                        .to_device(&Device::Cpu)?
                        .flatten_all()?
                        .to_vec1::<f32>()?
                };
                Ok(split_outputs(
                    batch,
                    &logits,
                    &hidden,
                    spec.vocab,
                    spec.hidden,
                ))
            }
        }
    }

    fn vocab_size(&self) -> usize {
        self.spec.vocab
    }

    fn hidden_size(&self) -> usize {
        self.spec.hidden
    }

    fn kv_capacity(&self) -> usize {
        self.capacity
    }

    fn max_positions(&self) -> usize {
        self.spec.max_positions
    }

    fn kv_shape(&self) -> KvShape {
        self.spec.kv_shape()
    }

    /// One `index_select` per layer and pool, then one copy to the host.
    fn read_kv(&self, slots: &[u32]) -> Result<Vec<f32>, ModelError> {
        let shape = self.kv_shape();
        check_transfer(&shape, slots, self.capacity, None)?;
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
        check_transfer(&shape, slots, self.capacity, Some(data.len()))?;
        if slots.is_empty() {
            return Ok(());
        }
        let (n, d) = (slots.len(), shape.kv_dim());
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

    /// gpt-oss's clamped SwiGLU on the candle backend is the CPU kernel's,
    /// past both clamps (gates and ups from -12 to 12).
    #[test]
    fn swiglu_oai_matches_the_cpu_kernel() {
        let g: Vec<f32> = (0..400).map(|i| i as f32 * 0.06 - 12.0).collect();
        let u: Vec<f32> = g.iter().rev().copied().collect();
        let t = |v: &[f32]| Tensor::new(v, &Device::Cpu).unwrap();
        let got = activate(Activation::SwigluOai, &t(&g), &t(&u))
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mut want = g.clone();
        zinfer_kernels::swiglu_oai_mul(&mut want, &u);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

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
