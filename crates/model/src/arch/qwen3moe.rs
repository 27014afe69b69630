//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with a
//! mixture of experts in place of every MLP. The router's softmax is taken
//! over all experts and the kept probabilities renormalised, as llama.cpp
//! does for every `qwen3moe` file (Qwen3-MoE checkpoints ship
//! `norm_topk_prob: true`).

use super::qwen3::QWEN3;
use super::{Arch, Architecture, MoeRule, no_extras};
use crate::spec::Gating;

pub(super) const QWEN3MOE: Arch = Arch {
    architecture: Architecture::Qwen3Moe,
    hf_model_types: &["qwen3_moe"],
    layout: QWEN3.layout,
    rope_style: QWEN3.rope_style,
    activation: QWEN3.activation,
    moe: Some(MoeRule {
        gating: Gating::SoftmaxTopK { renormalize: true },
        shared_expert: false,
        router_bias: false,
        expert_bias: false,
    }),
    finish: no_extras,
};
