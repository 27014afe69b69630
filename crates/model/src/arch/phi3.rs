//! Phi-3, Phi-3.5 and Phi-4-mini: fused QKV and gate|up matrices, NeoX
//! RoPE, and LongRoPE factors for the long-context variants.
//!
//! As llama.cpp does, a declared sliding window is not applied (the
//! converted files' window does not match the trained one), and the long
//! factors are used when the context zinfer runs is longer than the
//! original one (`rope.scaling.original_context_length`), the short ones otherwise.

use super::{Arch, Architecture, Meta, ModelSpec, RopeTensors};
use crate::ModelError;
use crate::spec::{Activation, BlockLayout, RopeStyle};

pub(super) const PHI3: Arch = Arch {
    architecture: Architecture::Phi3,
    hf_model_types: &["phi3"],
    layout: BlockLayout {
        fused_qkv: true,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        fused_gate_up: true,
        attn_output_bias: false,
        attn_sinks: false,
        ffn_norm_after_attention: false,
    },
    rope_style: RopeStyle::Neox,
    activation: Activation::Silu,
    moe: None,
    finish,
};

fn finish(spec: &mut ModelSpec, meta: &Meta<'_>, rope: &RopeTensors) -> Result<(), ModelError> {
    let original = meta.opt_usize("rope.scaling.original_context_length")?;
    let long = original.is_some_and(|o| spec.max_positions > o);
    let factors = if long { &rope.long } else { &rope.short };
    if let Some(f) = factors {
        spec.ropes[0].scaling.freq_factors = f.clone();
    }
    if let Some(a) = meta.opt_f32("rope.scaling.attn_factor")? {
        spec.ropes[0].scaling.attn_factor = a;
    }
    Ok(())
}
