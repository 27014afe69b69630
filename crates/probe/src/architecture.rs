//! The architectures this build's loader runs, listed once: `zinfer model
//! inspect`, the supervisor, the loader's table and the synthetic
//! generator all read [`Architecture::ALL`].

/// A model family this build's loader runs: the one list of them, kept
/// here (the lowest crate) so that `zinfer model inspect`, the supervisor,
/// the loader's table and the synthetic generator read the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, TinyLlama, Mistral.
    Llama,
    /// Qwen2 and Qwen2.5: llama with Q/K/V biases.
    Qwen2,
    /// Qwen2-MoE: Qwen2's attention with a mixture of experts and a shared expert.
    Qwen2Moe,
    /// Qwen3: llama with per-head RMSNorm of Q and K, and a head width of its own.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention with a mixture of experts for the MLP.
    Qwen3Moe,
    /// Phi-3: fused QKV and gate|up matrices.
    Phi3,
    /// Gemma 2: norms after attention and MLP too, GELU, soft-capped
    /// logits, every other layer sliding-window.
    Gemma2,
    /// Gemma 3: Gemma 2 with Q/K norms instead of attention soft-capping,
    /// five sliding-window layers to one global.
    Gemma3,
    /// gpt-oss: biased attention with learned sinks, every other layer
    /// sliding-window, and a mixture of biased experts with a clamped SwiGLU.
    GptOss,
    /// Qwen3.5 (dense): three Gated DeltaNet (linear attention) layers to
    /// one full-attention layer with an output gate and partial RoPE.
    Qwen35,
    /// Qwen3.5-MoE: Qwen3.5's layers with a mixture of experts and a gated
    /// shared expert for the MLP.
    Qwen35Moe,
    /// Gemma 4: per-kind head widths and KV heads, later layers reading an
    /// earlier layer's KV, per-layer token embeddings.
    Gemma4,
}

impl Architecture {
    /// Every architecture, in the order `--help` and errors list them.
    pub const ALL: [Self; 12] = [
        Self::Llama,
        Self::Qwen2,
        Self::Qwen2Moe,
        Self::Qwen3,
        Self::Qwen3Moe,
        Self::Phi3,
        Self::Gemma2,
        Self::Gemma3,
        Self::GptOss,
        Self::Qwen35,
        Self::Qwen35Moe,
        Self::Gemma4,
    ];

    /// Whether the architecture's MLPs are mixtures of experts (its files
    /// must declare `{arch}.expert_count`; a dense architecture's file that
    /// declares experts is refused).
    pub const fn has_experts(self) -> bool {
        matches!(
            self,
            Self::Qwen2Moe | Self::Qwen3Moe | Self::GptOss | Self::Qwen35Moe
        )
    }

    /// Whether files of the architecture may or may not have experts
    /// (Gemma 4: the 26B-A4B has them beside its dense MLPs, the others none).
    pub const fn experts_optional(self) -> bool {
        matches!(self, Self::Gemma4)
    }

    /// GGUF `general.architecture`, and the prefix of the model's metadata
    /// keys (`qwen2.block_count`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen2Moe => "qwen2moe",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Phi3 => "phi3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
            Self::GptOss => "gpt-oss",
            Self::Qwen35 => "qwen35",
            Self::Qwen35Moe => "qwen35moe",
            Self::Gemma4 => "gemma4",
        }
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `general.architecture` this build does not run.
#[derive(Debug, thiserror::Error)]
#[error("unknown architecture `{0}`")]
pub struct UnknownArchitecture(pub String);

impl std::str::FromStr for Architecture {
    type Err = UnknownArchitecture;

    fn from_str(s: &str) -> Result<Self, UnknownArchitecture> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownArchitecture(s.to_string()))
    }
}

/// [`Architecture::ALL`]'s names.
const ARCHITECTURE_NAMES: [&str; Architecture::ALL.len()] = {
    let mut names = [""; Architecture::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Architecture::ALL[i].name();
        i += 1;
    }
    names
};

/// The names (GGUF `general.architecture`) of the architectures this
/// build's loader runs, in [`Architecture::ALL`]'s order.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &ARCHITECTURE_NAMES;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_names_parse_back() {
        assert_eq!(
            SUPPORTED_ARCHITECTURES,
            [
                "llama",
                "qwen2",
                "qwen2moe",
                "qwen3",
                "qwen3moe",
                "phi3",
                "gemma2",
                "gemma3",
                "gpt-oss",
                "qwen35",
                "qwen35moe",
                "gemma4"
            ]
        );
        for a in Architecture::ALL {
            assert_eq!(a.name().parse::<Architecture>().ok(), Some(a));
            assert_eq!(a.to_string(), a.name());
        }
        let err = "mamba".parse::<Architecture>().unwrap_err();
        assert_eq!(err.to_string(), "unknown architecture `mamba`");
    }
}
