//! Llama 2/3.x, Mistral, SmolLM, TinyLlama: the common reading, plus a
//! sliding window on every layer when the file declares one (Mistral v0.1).

use super::{Arch, Architecture, Meta, ModelSpec, RopeTensors};
use crate::ModelError;
use crate::spec::{Activation, BlockLayout, RopeStyle};

pub(super) const LLAMA: Arch = Arch {
    architecture: Architecture::Llama,
    hf_model_types: &["llama", "mistral"],
    layout: BlockLayout {
        fused_qkv: false,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        fused_gate_up: false,
        attn_output_bias: false,
        attn_sinks: false,
        ffn_norm_after_attention: false,
    },
    rope_style: RopeStyle::Interleaved,
    activation: Activation::Silu,
    moe: None,
    finish,
};

fn finish(spec: &mut ModelSpec, meta: &Meta<'_>, _: &RopeTensors) -> Result<(), ModelError> {
    if let Some(window) = meta.opt_usize("attention.sliding_window")? {
        spec.layers.iter_mut().for_each(|l| l.window = Some(window));
    }
    Ok(())
}
