//! Gemma 4's departures from the generic synthetic file, as llama.cpp's
//! converter writes them (`conversion/gemma.py`, `Gemma4Model`): the
//! sliding layers' own head width and KV heads (`key_length_swa`, a
//! per-layer `head_count_kv`), a bool per layer for the window pattern,
//! the last layers sharing KV (no K/V tensors of their own), a
//! `rope_freqs` of 1 for the rotated pairs of the global heads and 1e30
//! for the rest, per-layer token embeddings and a per-layer output scale.

use candle_core::quantized::gguf_file::Value;

use super::shape::{Init, Quant, Role, SynthMoe, SynthShape, TensorSpec};

/// What a Gemma 4 shape adds to [`SynthShape`], whose `head_dim` and
/// `n_kv_heads` are the global layers'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthGemma4 {
    /// Every `swa_period`-th layer is global, the others slide.
    pub swa_period: usize,
    /// Head width of the sliding layers.
    pub swa_head_dim: usize,
    /// KV heads of the sliding layers.
    pub swa_kv_heads: usize,
    /// The last this many layers read an earlier layer's KV.
    pub shared_kv_layers: usize,
    /// Pairs of each global head that rotate (the rest get factor 1e30).
    pub rotated_pairs: usize,
    /// Width of each layer's per-layer embedding (0: none).
    pub per_layer_input: usize,
    /// A layer with its own KV but no `attn_v` (V is the raw K).
    pub no_v_layer: Option<usize>,
    /// The shared-KV layers' MLPs are twice as wide (the converter's
    /// `use_double_wide_mlp`, written as a per-layer `feed_forward_length`).
    pub double_wide_shared: bool,
    /// Experts beside every layer's dense MLP (26B-A4B); `shared_ffn` unused.
    pub moe: Option<SynthMoe>,
}

impl SynthGemma4 {
    /// Inner width of `layer`'s MLP in a shape whose other layers' is `ffn`.
    pub fn ffn(&self, layer: usize, n_layers: usize, ffn: usize) -> usize {
        if self.double_wide_shared && layer >= self.first_shared(n_layers) {
            2 * ffn
        } else {
            ffn
        }
    }

    /// Whether `layer` slides.
    pub fn is_sliding(&self, layer: usize) -> bool {
        layer % self.swa_period < self.swa_period - 1
    }

    /// The first layer reading another's KV.
    fn first_shared(&self, n_layers: usize) -> usize {
        n_layers.saturating_sub(self.shared_kv_layers)
    }

    /// Why llama.cpp could not run this on `n_layers` layers, if it could not.
    pub(super) fn check(&self, shape: &SynthShape) -> Result<(), String> {
        let first = self.first_shared(shape.n_layers);
        if self.swa_period < 2 || self.swa_head_dim == 0 || self.swa_kv_heads == 0 {
            return Err(format!(
                "gemma4 extras {self:?} need a period of 2+ and widths"
            ));
        }
        if !shape.n_heads.is_multiple_of(self.swa_kv_heads)
            || self.rotated_pairs > shape.head_dim / 2
        {
            return Err(format!(
                "gemma4 extras {self:?} do not fit {} heads",
                shape.n_heads
            ));
        }
        if self.shared_kv_layers > 0
            && (first < 2 || !self.is_sliding(first - 2) || self.is_sliding(first - 1))
        {
            return Err(format!(
                "gemma4: layers {first}.. share KV, so layer {} must slide and {} be global",
                first.saturating_sub(2),
                first.saturating_sub(1)
            ));
        }
        if self.no_v_layer.is_some_and(|l| l >= first) {
            return Err("gemma4: the layer without attn_v must keep its own KV".into());
        }
        Ok(())
    }

    /// The metadata keys the converter adds for Gemma 4 (the global
    /// layers' widths are the common `key_length` and `head_count_kv`'s).
    pub(super) fn metadata(&self, shape: &SynthShape, kv: &mut dyn FnMut(&str, Value)) {
        let u = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
        let layers = 0..shape.n_layers;
        kv(
            "attention.head_count_kv",
            Value::Array(
                layers
                    .clone()
                    .map(|l| {
                        u(if self.is_sliding(l) {
                            self.swa_kv_heads
                        } else {
                            shape.n_kv_heads
                        })
                    })
                    .collect(),
            ),
        );
        kv(
            "attention.sliding_window_pattern",
            Value::Array(layers.map(|l| Value::Bool(self.is_sliding(l))).collect()),
        );
        if self.double_wide_shared {
            let n = shape.n_layers;
            let widths = (0..n).map(|l| u(self.ffn(l, n, shape.ffn))).collect();
            kv("feed_forward_length", Value::Array(widths));
        }
        if let Some(m) = self.moe {
            kv("expert_count", u(m.experts));
            kv("expert_used_count", u(m.used));
            kv("expert_feed_forward_length", u(m.expert_ffn));
        }
        kv("attention.key_length_swa", u(self.swa_head_dim));
        kv("attention.value_length_swa", u(self.swa_head_dim));
        kv("rope.dimension_count", u(shape.head_dim));
        kv("rope.dimension_count_swa", u(self.swa_head_dim));
        kv("attention.shared_kv_layers", u(self.shared_kv_layers));
        kv("embedding_length_per_layer_input", u(self.per_layer_input));
    }

    /// Rewrites the generic plan's tensors into Gemma 4's: sliding layers'
    /// attention at their width, no K/V where a layer shares KV or has no
    /// `attn_v`, and the tensors only Gemma 4 has.
    pub(super) fn plan(
        &self,
        shape: &SynthShape,
        quant: Quant,
        tensors: Vec<TensorSpec>,
    ) -> Vec<TensorSpec> {
        let (n, h, w) = (shape.n_layers, shape.hidden, self.per_layer_input);
        let first_shared = self.first_shared(n);
        let matrix = |name: String, rows, cols, role, layer: Option<usize>| TensorSpec {
            name,
            rows,
            cols,
            experts: 1,
            dtype: super::fallback(quant.matrix_type(role, layer.unwrap_or(0), n), cols),
            kernel: None,
            init: Init::Random,
            layer,
        };
        let vector = |name: String, len, init, layer| TensorSpec {
            dtype: candle_core::quantized::GgmlDType::F32,
            init,
            ..matrix(name, 1, len, Role::Vector, layer)
        };
        let mut out = Vec::with_capacity(tensors.len() + 4 * n + 4);
        for mut t in tensors {
            let Some(layer) = t.layer else {
                let embedding = t.name == "token_embd.weight";
                out.push(t);
                if embedding {
                    if w > 0 {
                        out.push(matrix(
                            "per_layer_token_embd.weight".into(),
                            shape.vocab,
                            n * w,
                            Role::Embedding,
                            None,
                        ));
                        out.push(matrix(
                            "per_layer_model_proj.weight".into(),
                            n * w,
                            h,
                            Role::OtherMatrix,
                            None,
                        ));
                        out.push(vector(
                            "per_layer_proj_norm.weight".into(),
                            w,
                            Init::NearOne,
                            None,
                        ));
                    }
                    let half = shape.head_dim / 2;
                    let factors = (0..half)
                        .map(|i| if i < self.rotated_pairs { 1.0 } else { 1e30 })
                        .collect();
                    out.push(vector(
                        "rope_freqs.weight".into(),
                        half,
                        Init::Values(factors),
                        None,
                    ));
                }
                continue;
            };
            let part = t
                .name
                .rsplit_once(&format!("blk.{layer}.")[..])
                .map_or("", |(_, p)| p)
                .to_string();
            let shares = layer >= first_shared;
            let drop_kv = shares
                && matches!(
                    part.as_str(),
                    "attn_k.weight" | "attn_v.weight" | "attn_k_norm.weight"
                );
            if drop_kv || (self.no_v_layer == Some(layer) && part == "attn_v.weight") {
                continue;
            }
            let ffn = self.ffn(layer, n, shape.ffn);
            match part.as_str() {
                "ffn_gate.weight" | "ffn_up.weight" => t.rows = ffn,
                "ffn_down.weight" => {
                    t.cols = ffn;
                    t.dtype = super::fallback(t.dtype, t.cols);
                }
                _ => {}
            }
            if self.is_sliding(layer) {
                let (d, kvh) = (self.swa_head_dim, self.swa_kv_heads);
                match part.as_str() {
                    "attn_q.weight" => t.rows = shape.n_heads * d,
                    "attn_k.weight" | "attn_v.weight" => t.rows = kvh * d,
                    "attn_q_norm.weight" | "attn_k_norm.weight" => t.cols = d,
                    "attn_output.weight" => {
                        t.cols = shape.n_heads * d;
                        t.dtype = super::fallback(t.dtype, t.cols);
                    }
                    _ => {}
                }
            }
            if matches!(part.as_str(), "attn_q_norm.weight" | "attn_k_norm.weight") {
                t.init = Init::Values(qk_norm_weights(t.cols, layer));
            }
            let last = part == "post_ffw_norm.weight";
            out.push(t);
            if last {
                let l = Some(layer);
                if w > 0 {
                    out.push(matrix(
                        format!("blk.{layer}.inp_gate.weight"),
                        w,
                        h,
                        Role::OtherMatrix,
                        l,
                    ));
                    out.push(matrix(
                        format!("blk.{layer}.proj.weight"),
                        h,
                        w,
                        Role::OtherMatrix,
                        l,
                    ));
                    out.push(vector(
                        format!("blk.{layer}.post_norm.weight"),
                        h,
                        Init::NearOne,
                        l,
                    ));
                }
                if let Some(m) = self.moe {
                    let (e, f) = (m.experts, m.expert_ffn);
                    let name = |s: &str| format!("blk.{layer}.{s}");
                    out.push(TensorSpec {
                        dtype: candle_core::quantized::GgmlDType::F32,
                        ..matrix(name("ffn_gate_inp.weight"), e, h, Role::Router, l)
                    });
                    // About 100: router logits spread by ~2 (their input is
                    // normed and divided by sqrt(hidden), the weights small),
                    // so rows pick their experts decisively, as trained
                    // routers do; near-uniform logits would make every
                    // choice a near-tie that rounding flips.
                    let scale = (0..h).map(|i| 90.0 + (i % 21) as f32).collect();
                    out.push(vector(
                        name("ffn_gate_inp.scale"),
                        h,
                        Init::Values(scale),
                        l,
                    ));
                    for norm in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
                        out.push(vector(name(&format!("{norm}.weight")), h, Init::NearOne, l));
                    }
                    let stacked = |t: TensorSpec| TensorSpec {
                        rows: t.rows * e,
                        experts: e,
                        ..t
                    };
                    let gate_up = matrix(
                        name("ffn_gate_up_exps.weight"),
                        2 * f,
                        h,
                        Role::OtherMatrix,
                        l,
                    );
                    out.push(stacked(gate_up));
                    out.push(stacked(matrix(
                        name("ffn_down_exps.weight"),
                        h,
                        f,
                        Role::FfnDown,
                        l,
                    )));
                    let scales = (0..e).map(|i| 0.5 + 0.125 * i as f32).collect();
                    out.push(vector(
                        name("ffn_down_exps.scale"),
                        e,
                        Init::Values(scales),
                        l,
                    ));
                }
                // Scales near the trained ones' order, each its own.
                let scale = 0.6 + 0.05 * layer as f32;
                out.push(vector(
                    format!("blk.{layer}.layer_output_scale.weight"),
                    1,
                    Init::Values(vec![scale]),
                    l,
                ));
            }
        }
        out
    }
}

/// Q and K norm weights around `d^-1/4`, each its own: with attention
/// scale 1 a score is the product of the normed Q and K, so these give it
/// the `1 / sqrt(d)` spread of trained models' (weights near 1 would make
/// scores of +-d, a softmax so sharp that f32 rounding moves the logits).
fn qk_norm_weights(d: usize, layer: usize) -> Vec<f32> {
    let base = (d as f32).powf(-0.25);
    (0..d)
        .map(|i| base * (0.9 + 0.2 * (((i * 7 + layer * 3) % 11) as f32 / 10.0)))
        .collect()
}
