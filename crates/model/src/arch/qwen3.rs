//! Qwen3 (dense): Llama with a per-head RMSNorm of Q and K before RoPE,
//! NeoX RoPE, and heads wider than `hidden / heads` (`key_length`).

use super::{Arch, Architecture, no_extras};
use crate::spec::{Activation, BlockLayout, RopeStyle};

pub(super) const QWEN3: Arch = Arch {
    architecture: Architecture::Qwen3,
    hf_model_types: &["qwen3"],
    layout: BlockLayout {
        fused_qkv: false,
        qkv_bias: false,
        qk_norm: true,
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
