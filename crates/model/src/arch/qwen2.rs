//! Qwen2 and Qwen2.5 (and DeepSeek-R1-Distill-Qwen): Llama with biases on
//! Q, K and V, and NeoX RoPE.

use super::{Arch, Architecture, no_extras};
use crate::spec::{Activation, BlockLayout, RopeStyle};

pub(super) const QWEN2: Arch = Arch {
    architecture: Architecture::Qwen2,
    hf_model_types: &["qwen2"],
    layout: BlockLayout {
        fused_qkv: false,
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
        fused_gate_up: false,
        attn_output_bias: false,
        attn_sinks: false,
        ffn_norm_after_attention: false,
    },
    rope_style: RopeStyle::Neox,
    activation: Activation::Silu,
    moe: None,
    finish: no_extras,
};
