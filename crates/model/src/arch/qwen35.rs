//! Qwen3.5 (dense), as llama.cpp's `qwen35` graph runs it: Gated DeltaNet
//! layers ([`crate::deltanet`]) with a full-attention layer every
//! `full_attention_interval` (4) layers, or as
//! `attention.recurrent_layers` flags them. The attention layers are
//! Qwen3's (Q/K norms, NeoX pairs) with an output gate in `attn_q` and
//! RoPE on the first `rope.dimension_count` dimensions of a head; the MLP's
//! input norm is named `post_attention_norm`.
//!
//! llama.cpp runs that RoPE as interleaved multi-section RoPE (IMROPE) with
//! the text position in its first three sections and 0 in the fourth, so
//! it is plain NeoX RoPE when every rotated pair falls in the first three;
//! a file whose `rope.dimension_sections` leave a pair to the fourth is
//! refused.

use super::qwen3::QWEN3;
use super::{Arch, Architecture, MoeRule, RopeTensors};
use crate::ModelError;
use crate::deltanet::HybridSpec;
use crate::meta::Meta;
use crate::spec::{BlockLayout, Gating, ModelSpec};
use crate::validate::{MAX_HEAD_DIM, MAX_HEADS};

pub(super) const QWEN35: Arch = Arch {
    architecture: Architecture::Qwen35,
    hf_model_types: &["qwen3_5", "qwen3_5_text"],
    layout: BlockLayout {
        ffn_norm_after_attention: true,
        ..QWEN3.layout
    },
    rope_style: QWEN3.rope_style,
    activation: QWEN3.activation,
    moe: None,
    finish,
};

/// Qwen3.5-MoE (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B): Qwen3.5's layers with a
/// mixture of experts in place of every MLP, as llama.cpp's `qwen35moe`
/// graph: softmax over all experts, the top ones renormalised, and a
/// shared expert every token runs, scaled by `sigmoid(x . ffn_gate_inp_shexp)`.
pub(super) const QWEN35MOE: Arch = Arch {
    architecture: Architecture::Qwen35Moe,
    hf_model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
    moe: Some(MoeRule {
        gating: Gating::SoftmaxTopK { renormalize: true },
        shared_expert: true,
        router_bias: false,
        expert_bias: false,
    }),
    ..QWEN35
};

/// The hybrid part: which layers recur, their widths, and the partial RoPE.
fn finish(spec: &mut ModelSpec, meta: &Meta<'_>, _: &RopeTensors) -> Result<(), ModelError> {
    let n = spec.n_layers;
    let recurrent = match meta.opt_bools("attention.recurrent_layers")? {
        Some(flags) if flags.len() != n => {
            return Err(ModelError::PerLayerLength {
                key: meta.key("attention.recurrent_layers"),
                got: flags.len(),
                layers: n,
            });
        }
        Some(flags) => flags,
        None => {
            let interval = meta.opt_usize("full_attention_interval")?.unwrap_or(4);
            if interval == 0 {
                return Err(invalid(meta, "full_attention_interval", 0, "is at least 1"));
            }
            (0..n).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    let head_dim = meta.usize("ssm.state_size")?;
    let v_heads = meta.usize("ssm.time_step_rank")?;
    // Bounded before anything is sized by them: a sequence's state is
    // `v_heads x state_size^2` floats per layer.
    let bounds = [
        ("ssm.state_size", head_dim, MAX_HEAD_DIM),
        ("ssm.time_step_rank", v_heads, MAX_HEADS),
        ("ssm.group_count", meta.usize("ssm.group_count")?, MAX_HEADS),
        (
            "ssm.conv_kernel",
            meta.usize("ssm.conv_kernel")?,
            MAX_CONV_KERNEL,
        ),
    ];
    for (key, value, max) in bounds {
        if value > max {
            return Err(invalid(meta, key, value, &format!("is at most {max}")));
        }
    }
    if v_heads.saturating_mul(head_dim).saturating_mul(head_dim) > MAX_STATE_FLOATS {
        return Err(invalid(
            meta,
            "ssm.state_size",
            head_dim,
            &format!(
                "makes a state of at most {MAX_STATE_FLOATS} floats per layer with ssm.time_step_rank"
            ),
        ));
    }
    let inner = meta.usize("ssm.inner_size")?;
    if inner != head_dim * v_heads {
        return Err(invalid(
            meta,
            "ssm.inner_size",
            inner,
            "is ssm.state_size x ssm.time_step_rank (value heads as wide as key heads)",
        ));
    }
    let hy = HybridSpec {
        recurrent,
        rope_dims: meta
            .opt_usize("rope.dimension_count")?
            .unwrap_or(spec.head_dim),
        conv_kernel: meta.usize("ssm.conv_kernel")?,
        k_heads: meta.usize("ssm.group_count")?,
        v_heads,
        head_dim,
    };
    if !hy.valid() || hy.rope_dims > spec.head_dim {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{} with Gated DeltaNet widths {hy:?}",
            spec.arch
        )));
    }
    if let Some(sections) = meta.opt_ints("rope.dimension_sections")? {
        check_sections(meta, &sections, hy.rope_dims)?;
    }
    spec.hybrid = Some(hy);
    Ok(())
}

/// Most taps of the causal convolution a file may declare (Qwen3.5 has 4).
const MAX_CONV_KERNEL: usize = 64;

/// Most floats of one sequence's state matrices in one layer (Qwen3.5-27B:
/// 48 heads of 128 x 128, 786,432).
const MAX_STATE_FLOATS: usize = 1 << 26;

/// Every rotated pair of IMROPE must take the text position (a section of
/// the first three), as ggml's `ggml_mrope_cache_init` assigns them.
fn check_sections(meta: &Meta<'_>, sections: &[i64], rope_dims: usize) -> Result<(), ModelError> {
    let s: Vec<usize> = sections
        .iter()
        .map(|&v| usize::try_from(v).unwrap_or(0))
        .collect();
    let total: usize = s.iter().sum();
    let text = |sector: usize| match sector % 3 {
        0 => sector < 3 * s.first().copied().unwrap_or(0),
        1 => sector < 3 * s.get(1).copied().unwrap_or(0),
        _ => sector < 3 * s.get(2).copied().unwrap_or(0),
    };
    if total == 0 || !(0..rope_dims / 2).all(|pair| text(pair % total)) {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{} with rope sections {sections:?}: a rotated pair falls outside the text sections",
            meta.key("rope.dimension_sections")
        )));
    }
    Ok(())
}

fn invalid(meta: &Meta<'_>, key: &str, value: usize, want: &str) -> ModelError {
    ModelError::Invalid {
        what: meta.key(key),
        value: value.to_string(),
        want: want.to_string(),
    }
}
