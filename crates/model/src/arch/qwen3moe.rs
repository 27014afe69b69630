//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with a
//! mixture of experts in place of every MLP. The router's softmax is taken
//! over all experts and the kept probabilities renormalised, as llama.cpp
//! does for every `qwen3moe` file (Qwen3-MoE checkpoints ship
//! `norm_topk_prob: true`).

use super::{Arch, Architecture, no_extras};
use crate::spec::{Activation, BlockLayout, Gating, RopeStyle};

pub(super) const QWEN3MOE: Arch = Arch {
    architecture: Architecture::Qwen3Moe,
    hf_model_types: &["qwen3_moe"],
    layout: BlockLayout {
        fused_qkv: false,
        qkv_bias: false,
        qk_norm: true,
        post_norms: false,
        fused_gate_up: false,
    },
    rope_style: RopeStyle::Neox,
    activation: Activation::Silu,
    moe: Some(Gating::SoftmaxTopK { renormalize: true }),
    finish: no_extras,
};
