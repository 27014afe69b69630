//! Gemma 3 (text): Gemma 2's layout with a per-head RMSNorm of Q and K,
//! no attention softcap, and five sliding-window layers to one global
//! layer; the local layers' RoPE base is 10,000, the global layers' the
//! file's (with its linear scaling, 8x for the 4B and larger models).

use super::{Arch, Architecture, Meta, ModelSpec, RopeTensors, gemma_common};
use crate::ModelError;
use crate::spec::{Activation, BlockLayout, RopeStyle};

pub(super) const GEMMA3: Arch = Arch {
    architecture: Architecture::Gemma3,
    hf_model_types: &["gemma3", "gemma3_text"],
    layout: BlockLayout {
        fused_qkv: false,
        qkv_bias: false,
        qk_norm: true,
        post_norms: true,
        fused_gate_up: false,
        attn_output_bias: false,
        attn_sinks: false,
        ffn_norm_after_attention: false,
    },
    rope_style: RopeStyle::Neox,
    activation: Activation::GeluTanh,
    moe: None,
    finish,
};

fn finish(spec: &mut ModelSpec, meta: &Meta<'_>, _: &RopeTensors) -> Result<(), ModelError> {
    spec.final_softcap = meta
        .opt_f32("final_logit_softcapping")?
        .filter(|&c| c > 0.0);
    let window = meta
        .opt_usize("attention.sliding_window")?
        .filter(|&w| w > 0);
    gemma_common(spec, meta, window, 6, 10_000.0, 62)
}
