//! Gemma 2: GELU-tanh MLP, embeddings scaled by `sqrt(hidden)`, RMSNorm of
//! the attention and MLP outputs, attention and final logit softcapping,
//! and a sliding window (4096 by default) on every other layer, the first included.

use super::{Arch, Architecture, Meta, ModelSpec, RopeTensors, gemma_common};
use crate::ModelError;
use crate::spec::{Activation, BlockLayout, RopeStyle};

pub(super) const GEMMA2: Arch = Arch {
    architecture: Architecture::Gemma2,
    hf_model_types: &["gemma2"],
    layout: BlockLayout {
        fused_qkv: false,
        qkv_bias: false,
        qk_norm: false,
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
    spec.attn.softcap = Some(meta.opt_f32("attn_logit_softcapping")?.unwrap_or(50.0));
    spec.final_softcap = Some(meta.opt_f32("final_logit_softcapping")?.unwrap_or(30.0));
    let window = meta.opt_usize("attention.sliding_window")?.unwrap_or(4096);
    let theta = spec.ropes[0].theta;
    gemma_common(spec, meta, Some(window), 2, theta, 46)
}
