//! The architectures zinfer runs: one small file each, saying how the
//! architecture departs from Llama (its tensors, RoPE style, activation,
//! and the metadata only it has), and one table mapping GGUF
//! `general.architecture` names and Hugging Face `model_type`s to them.
//!
//! Everything else (dimensions, RoPE base and scaling, tensor names) is
//! read the same way for every architecture by the loaders, which then
//! call the architecture's [`Arch::finish`].

mod gemma2;
mod gemma3;
mod gemma4;
mod gpt_oss;
mod llama;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen35;
mod qwen3moe;

pub(crate) use zinfer_probe::Architecture;

use super::ModelError;
use super::meta::Meta;
use super::spec::{Activation, BlockLayout, Gating, ModelSpec, MoeSpec, RopeStyle};

/// How one architecture differs from the common reading.
pub(crate) struct Arch {
    /// Which architecture (its name is `general.architecture` in a GGUF
    /// file, and the metadata keys' prefix).
    pub(crate) architecture: Architecture,
    /// Hugging Face `model_type`s of this architecture (safetensors
    /// directories load for llama only; the others are told to convert).
    pub(crate) hf_model_types: &'static [&'static str],
    /// The block's tensors.
    pub(crate) layout: BlockLayout,
    /// RoPE pairing of the architecture's GGUF files.
    pub(crate) rope_style: RopeStyle,
    /// The MLP's activation.
    pub(crate) activation: Activation,
    /// How the router picks experts, for mixture-of-experts architectures;
    /// `None` for dense ones (a file of theirs with experts is refused).
    pub(crate) moe: Option<MoeRule>,
    /// Applies the architecture's own metadata (windows, softcaps, scales)
    /// to a spec the common reading filled in.
    pub(crate) finish: fn(&mut ModelSpec, &Meta<'_>, &RopeTensors) -> Result<(), ModelError>,
}

/// What a mixture-of-experts architecture's blocks hold besides the
/// routed experts, and how it weights them.
#[derive(Clone, Copy)]
pub(crate) struct MoeRule {
    /// How router logits become expert weights.
    pub(crate) gating: Gating,
    /// A gated shared expert beside the routed ones (`*_shexp` tensors).
    pub(crate) shared_expert: bool,
    /// The router has a bias (`ffn_gate_inp.bias`).
    pub(crate) router_bias: bool,
    /// The experts' projections have biases (`ffn_*_exps.bias`).
    pub(crate) expert_bias: bool,
}

/// The RoPE factor tensors a GGUF file may carry.
#[derive(Debug, Default)]
pub(crate) struct RopeTensors {
    /// `rope_factors_long.weight` (Phi-3 LongRoPE, contexts past the original).
    pub(crate) long: Option<Vec<f32>>,
    /// `rope_factors_short.weight` (Phi-3 LongRoPE, within the original context).
    pub(crate) short: Option<Vec<f32>>,
}

impl Arch {
    /// `general.architecture` in a GGUF file, and the metadata keys' prefix.
    pub(crate) fn name(&self) -> &'static str {
        self.architecture.name()
    }
}

/// The rules of an architecture: every one in [`Architecture::ALL`] has
/// an entry (the match says so at compile time).
pub(crate) fn rules(architecture: Architecture) -> &'static Arch {
    match architecture {
        Architecture::Llama => &llama::LLAMA,
        Architecture::Qwen2 => &qwen2::QWEN2,
        Architecture::Qwen2Moe => &qwen2moe::QWEN2MOE,
        Architecture::Qwen3 => &qwen3::QWEN3,
        Architecture::Qwen3Moe => &qwen3moe::QWEN3MOE,
        Architecture::Phi3 => &phi3::PHI3,
        Architecture::Gemma2 => &gemma2::GEMMA2,
        Architecture::Gemma3 => &gemma3::GEMMA3,
        Architecture::GptOss => &gpt_oss::GPT_OSS,
        Architecture::Qwen35 => &qwen35::QWEN35,
        Architecture::Qwen35Moe => &qwen35::QWEN35MOE,
        Architecture::Gemma4 => &gemma4::GEMMA4,
    }
}

/// Every architecture, in the order `--help` and errors list them.
fn all() -> impl Iterator<Item = &'static Arch> {
    Architecture::ALL.into_iter().map(rules)
}

/// The architecture a GGUF file names.
pub(crate) fn by_gguf_name(name: &str) -> Result<&'static Arch, ModelError> {
    name.parse::<Architecture>()
        .map(rules)
        .map_err(|_| ModelError::UnsupportedArchitecture(name.to_string()))
}

/// The architecture of a Hugging Face `model_type`.
pub(crate) fn by_hf_model_type(model_type: &str) -> Result<&'static Arch, ModelError> {
    all()
        .find(|a| a.hf_model_types.contains(&model_type))
        .ok_or_else(|| ModelError::UnsupportedArchitecture(model_type.to_string()))
}

/// The supported architectures' names, comma-separated, for messages.
pub fn supported() -> String {
    zinfer_probe::SUPPORTED_ARCHITECTURES.join(", ")
}

/// The mixture of experts a file of `arch` declares, read the same way for
/// every MoE architecture: `expert_count`, `expert_used_count` and
/// `expert_feed_forward_length` (else, as llama.cpp,
/// `feed_forward_length / expert_used_count`), and a shared expert's
/// `expert_shared_feed_forward_length` (else `feed_forward_length`). Experts in a file of a dense
/// architecture are refused rather than ignored.
pub(crate) fn moe_spec(
    arch: &Arch,
    meta: &Meta<'_>,
    ffn: usize,
) -> Result<Option<MoeSpec>, ModelError> {
    let experts = meta.opt_usize("expert_count")?.unwrap_or(0);
    let Some(rule) = arch.moe else {
        // Gemma 4's experts sit beside its dense MLP: its finish reads them.
        if experts > 0 && !arch.architecture.experts_optional() {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "{} with mixture-of-experts",
                arch.name()
            )));
        }
        return Ok(None);
    };
    let experts = meta.usize("expert_count")?;
    let used = meta.usize("expert_used_count")?;
    let expert_ffn = match meta.opt_usize("expert_feed_forward_length")? {
        Some(f) => f,
        None => ffn / used.max(1),
    };
    let shared_ffn = if rule.shared_expert {
        Some(
            meta.opt_usize("expert_shared_feed_forward_length")?
                .unwrap_or(ffn),
        )
    } else {
        None
    };
    Ok(Some(MoeSpec {
        experts,
        used,
        expert_ffn,
        gating: rule.gating,
        router_bias: rule.router_bias,
        expert_bias: rule.expert_bias,
        weights_scale: 1.0,
        shared_ffn,
    }))
}

/// Nothing beyond the common reading.
fn no_extras(_: &mut ModelSpec, _: &Meta<'_>, _: &RopeTensors) -> Result<(), ModelError> {
    Ok(())
}

/// Gemma's shared rules: embeddings scaled by `sqrt(hidden)`, and a
/// sliding window on the layers a pattern of `period` picks (every layer
/// but the last of each period, or as `attention.sliding_window_pattern`
/// says), whose RoPE base is `local_theta` (or `rope.freq_base_swa`) without scaling.
fn gemma_common(
    spec: &mut ModelSpec,
    meta: &Meta<'_>,
    window: Option<usize>,
    period: usize,
    local_theta: f32,
    big_layers: usize,
) -> Result<(), ModelError> {
    spec.embed_scale = Some((spec.hidden as f32).sqrt());
    // Gemma's 27B models scale queries by hidden / heads, not the head width.
    if spec.n_layers == big_layers {
        spec.attn.scale = 1.0 / ((spec.hidden / spec.n_heads) as f32).sqrt();
    }
    let Some(window) = window else {
        return Ok(());
    };
    let pattern = meta.swa_pattern(spec.n_layers, period)?;
    let theta = meta.opt_f32("rope.freq_base_swa")?.unwrap_or(local_theta);
    let rope = super::spec::RopeSpec::plain(spec.ropes[0].style, theta);
    let local = match spec.ropes.iter().position(|r| *r == rope) {
        Some(i) => i,
        None => {
            spec.ropes.push(rope);
            spec.ropes.len() - 1
        }
    };
    for (layer, sliding) in spec.layers.iter_mut().zip(pattern) {
        if sliding {
            layer.window = Some(window);
            layer.rope = local;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_listed() {
        for a in Architecture::ALL {
            let entry = rules(a);
            assert_eq!(entry.architecture, a);
            assert_eq!(
                entry.moe.is_some(),
                a.has_experts(),
                "{a}: the probe (inspect, the supervisor) and the loader agree on experts"
            );
            assert!(supported().contains(entry.name()));
            assert_eq!(
                by_gguf_name(a.name()).map(|b| b.name()).ok(),
                Some(a.name())
            );
        }
        let names: Vec<&str> = all().map(Arch::name).collect();
        assert_eq!(
            names,
            zinfer_probe::SUPPORTED_ARCHITECTURES,
            "the probe's list (zinfer model inspect, the supervisor) is this table's"
        );
        assert!(matches!(
            by_gguf_name("mamba"),
            Err(ModelError::UnsupportedArchitecture(n)) if n == "mamba"
        ));
    }
}
