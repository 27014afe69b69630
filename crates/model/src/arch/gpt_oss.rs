//! gpt-oss (gpt-oss-20b, gpt-oss-120b), as llama.cpp's `gpt-oss` graph
//! runs it: Q/K/V and output biases; a learned sink logit per query head in
//! every attention softmax; a sliding window (`attention.sliding_window`,
//! 128) on the even layers and full attention on the odd ones (llama.cpp's
//! pattern of period 2, or `attention.sliding_window_pattern`), all layers
//! with the same RoPE (NeoX, YaRN) unless `rope.freq_base_swa` gives the
//! sliding ones their own base; the MLP's input norm named
//! `post_attention_norm`; and a mixture of experts whose router has a bias,
//! whose top-k logits are soft-maxed among themselves, and whose experts
//! have biases and the clamped SwiGLU.

use super::qwen2::QWEN2;
use super::{Arch, Architecture, MoeRule, RopeTensors};
use crate::ModelError;
use crate::meta::Meta;
use crate::spec::{Activation, BlockLayout, Gating, ModelSpec, RopeSpec, RopeStyle};

pub(super) const GPT_OSS: Arch = Arch {
    architecture: Architecture::GptOss,
    hf_model_types: &["gpt_oss"],
    // Qwen2's separate Q/K/V with biases, and gpt-oss's own parts.
    layout: BlockLayout {
        attn_output_bias: true,
        attn_sinks: true,
        ffn_norm_after_attention: true,
        ..QWEN2.layout
    },
    rope_style: RopeStyle::Neox,
    activation: Activation::SwigluOai,
    moe: Some(MoeRule {
        gating: Gating::TopKSoftmax,
        shared_expert: false,
        router_bias: true,
        expert_bias: true,
    }),
    finish,
};

/// The window on the layers llama.cpp's pattern of period 2 picks; their
/// RoPE is the global one with `rope.freq_base_swa`'s base when given.
fn finish(spec: &mut ModelSpec, meta: &Meta<'_>, _: &RopeTensors) -> Result<(), ModelError> {
    let window = meta.usize("attention.sliding_window")?;
    let pattern = meta.swa_pattern(spec.n_layers, 2)?;
    let local = match meta.opt_f32("rope.freq_base_swa")? {
        Some(theta) if theta != spec.ropes[0].theta => {
            spec.ropes.push(RopeSpec {
                theta,
                ..spec.ropes[0].clone()
            });
            spec.ropes.len() - 1
        }
        _ => 0,
    };
    for (layer, sliding) in spec.layers.iter_mut().zip(pattern) {
        if sliding {
            layer.window = Some(window);
            layer.rope = local;
        }
    }
    Ok(())
}
