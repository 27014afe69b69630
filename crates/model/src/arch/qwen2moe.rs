//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (Q/K/V
//! biases) with a mixture of experts in place of every MLP: softmax over
//! all experts, the top ones kept without renormalising (as llama.cpp's
//! `qwen2moe` graph), and a shared expert every token runs, scaled by a
//! sigmoid gate.

use super::qwen2::QWEN2;
use super::{Arch, Architecture, MoeRule, no_extras};
use crate::spec::Gating;

pub(super) const QWEN2MOE: Arch = Arch {
    architecture: Architecture::Qwen2Moe,
    hf_model_types: &["qwen2_moe"],
    layout: QWEN2.layout,
    rope_style: QWEN2.rope_style,
    activation: QWEN2.activation,
    moe: Some(MoeRule {
        gating: Gating::SoftmaxTopK { renormalize: false },
        shared_expert: true,
        router_bias: false,
        expert_bias: false,
    }),
    finish: no_extras,
};
