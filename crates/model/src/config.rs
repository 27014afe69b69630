//! Shape and hyper-parameters of a llama-architecture model.

use super::ModelError;

/// What the forward pass needs to know about a llama model, read from GGUF
/// metadata or a Hugging Face `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (fewer than `n_heads` with grouped-query attention).
    pub n_kv_heads: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Inner width of the MLP.
    pub ffn: usize,
    /// Token vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Longest sequence the RoPE tables cover: the model's context, capped at
    /// [`MAX_POSITIONS`] so a 128k-context model does not spend memory on
    /// tables it will not use.
    pub max_positions: usize,
    /// Per-frequency RoPE divisors (GGUF `rope_freqs.weight`, Llama 3.1 style
    /// long-context scaling); empty for plain RoPE.
    pub rope_freq_factors: Vec<f32>,
    /// GGUF files store Q/K rows permuted for interleaved RoPE; Hugging Face
    /// checkpoints rotate the two halves of each head instead.
    pub rope_interleaved: bool,
}

/// Upper bound on [`LlamaConfig::max_positions`].
pub const MAX_POSITIONS: usize = 32_768;

impl LlamaConfig {
    /// Width of the key (and value) projection output.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// RoPE cos and sin tables, `[max_positions, head_dim / 2]` row-major.
    pub(crate) fn rope_tables(&self) -> (Vec<f32>, Vec<f32>) {
        let half = self.head_dim / 2;
        let mut cos = Vec::with_capacity(self.max_positions * half);
        let mut sin = Vec::with_capacity(self.max_positions * half);
        for p in 0..self.max_positions {
            for i in 0..half {
                let factor = self.rope_freq_factors.get(i).map_or(1.0, |&f| f64::from(f));
                let inv_freq = 1.0
                    / f64::from(self.rope_theta).powf(2.0 * i as f64 / self.head_dim as f64)
                    / factor;
                let angle = p as f64 * inv_freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        (cos, sin)
    }

    /// Checks the relations the forward pass relies on.
    pub(crate) fn validate(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::Format(why));
        if self.n_layers == 0 || self.n_heads == 0 || self.n_kv_heads == 0 || self.vocab == 0 {
            return bad(format!("model config has a zero dimension: {self:?}"));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) || self.head_dim * self.n_heads != self.hidden {
            return bad(format!(
                "head_dim {} x {} heads does not match hidden size {}",
                self.head_dim, self.n_heads, self.hidden
            ));
        }
        if self.max_positions == 0 {
            return bad("model config has no context length".to_string());
        }
        if !self.rope_freq_factors.is_empty() && self.rope_freq_factors.len() != self.head_dim / 2 {
            return bad(format!(
                "rope_freqs has {} factors, expected {}",
                self.rope_freq_factors.len(),
                self.head_dim / 2
            ));
        }
        Ok(())
    }
}
