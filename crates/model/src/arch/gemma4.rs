//! Gemma 4 (text, dense layouts), as llama.cpp's `gemma4` graph runs it:
//! Gemma 3's block (Q/K norms, norms after attention and MLP, GELU) with
//! attention scale 1, V RMS-normed without a weight (and equal to the raw
//! K projection in a layer without `attn_v`), sliding layers picked by
//! `attention.sliding_window_pattern` whose heads are
//! `attention.key_length_swa` wide, global layers `attention.key_length`
//! wide that rotate only the pairs `rope_freqs` leaves near 1, KV heads per
//! layer (`attention.head_count_kv` may be an array), and the last
//! `attention.shared_kv_layers` layers reading the KV of the last earlier
//! layer of their kind. E2B/E4B add per-layer token embeddings
//! (`embedding_length_per_layer_input`, [`crate::ple`]).

use super::gemma3::GEMMA3;
use super::{Arch, Architecture, Meta, ModelSpec, RopeTensors};
use crate::ModelError;
use crate::spec::{Activation, Gating, MoeSpec, RopeSpec, RopeStyle};

pub(super) const GEMMA4: Arch = Arch {
    architecture: Architecture::Gemma4,
    hf_model_types: &["gemma4", "gemma4_text"],
    layout: GEMMA3.layout,
    rope_style: RopeStyle::Neox,
    activation: Activation::GeluTanh,
    moe: None,
    finish,
};

/// llama.cpp's base for the sliding layers' RoPE without `rope.freq_base_swa`.
const SWA_THETA: f32 = 10_000.0;

fn finish(spec: &mut ModelSpec, meta: &Meta<'_>, _: &RopeTensors) -> Result<(), ModelError> {
    let n = spec.n_layers;
    let unsupported = |what: String| {
        Err(ModelError::UnsupportedArchitecture(format!(
            "gemma4 {what}"
        )))
    };
    spec.embed_scale = Some((spec.hidden as f32).sqrt());
    spec.attn.scale = 1.0;
    spec.v_norm = true;
    spec.final_softcap = meta
        .opt_f32("final_logit_softcapping")?
        .filter(|&c| c > 0.0);
    spec.per_layer_input = meta
        .opt_usize("embedding_length_per_layer_input")?
        .filter(|&w| w > 0);
    let pattern_key = "attention.sliding_window_pattern";
    if !meta.has(pattern_key) {
        return Err(ModelError::MissingKey(meta.key(pattern_key)));
    }
    let sliding = meta.swa_pattern(n, 0)?;
    let window = meta.usize("attention.sliding_window")?;
    let swa_dim = meta
        .opt_usize("attention.key_length_swa")?
        .unwrap_or(spec.head_dim);
    if let Some(v) = meta.opt_usize("attention.value_length_swa")?
        && v != swa_dim
    {
        return unsupported(format!(
            "with sliding value heads of {v} and key heads of {swa_dim}"
        ));
    }
    if let Some(rot) = meta.opt_usize("rope.dimension_count_swa")?
        && rot != swa_dim
    {
        return unsupported(format!(
            "with partial RoPE on sliding layers ({rot} of {swa_dim} dims)"
        ));
    }
    let kv_heads = meta
        .opt_per_layer("attention.head_count_kv", n)?
        .unwrap_or_else(|| vec![spec.n_heads; n]);
    let theta = meta.opt_f32("rope.freq_base_swa")?.unwrap_or(SWA_THETA);
    spec.ropes.push(RopeSpec::plain(spec.ropes[0].style, theta));
    let local = spec.ropes.len() - 1;
    for ((layer, &slides), &kv) in spec.layers.iter_mut().zip(&sliding).zip(&kv_heads) {
        layer.n_kv_heads = kv;
        if slides {
            layer.window = Some(window);
            layer.rope = local;
            layer.head_dim = swa_dim;
        }
    }
    // As llama.cpp maps them: a shared sliding layer reads the KV of the
    // second-last layer with KV, a shared global layer the last one's.
    let shared = meta.opt_usize("attention.shared_kv_layers")?.unwrap_or(0);
    let first_shared = n.saturating_sub(shared);
    if shared > 0 && first_shared < 2 {
        return unsupported(format!(
            "with {shared} of {n} layers sharing KV (at least 2 must keep their own)"
        ));
    }
    for i in first_shared..n {
        let from = first_shared - if sliding[i] { 2 } else { 1 };
        if sliding[from] != sliding[i] {
            return unsupported(format!(
                "layer {i} shares the KV of layer {from}, of the other attention kind"
            ));
        }
        spec.layers[i].kv_from = Some(from);
    }
    spec.n_kv_heads = kv_heads.iter().copied().max().unwrap_or(spec.n_heads);
    spec.moe = experts(meta)?;
    spec.dense_beside_moe = spec.moe.is_some();
    Ok(())
}

/// The 26B-A4B's experts, beside every layer's dense MLP: a softmax over
/// all of them, the `expert_used_count` best kept and renormalised (as
/// llama.cpp's gemma4 graph calls its MoE), `expert_feed_forward_length` wide.
fn experts(meta: &Meta<'_>) -> Result<Option<MoeSpec>, ModelError> {
    if meta.opt_usize("expert_count")?.unwrap_or(0) == 0 {
        return Ok(None);
    }
    Ok(Some(MoeSpec {
        experts: meta.usize("expert_count")?,
        used: meta.usize("expert_used_count")?,
        expert_ffn: meta.usize("expert_feed_forward_length")?,
        gating: Gating::SoftmaxTopK { renormalize: true },
        router_bias: false,
        expert_bias: false,
        weights_scale: 1.0,
        shared_ffn: None,
    }))
}
