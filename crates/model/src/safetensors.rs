//! Loading Hugging Face llama checkpoints: a directory with `config.json`,
//! `tokenizer.json` and one or more `*.safetensors` files.
//!
//! Weights (f32, f16 or bf16 on disk) are kept as dense f32 matrices, which
//! is exact and simple but takes four bytes per parameter; GGUF is the
//! compact, fast format.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use super::config::MAX_POSITIONS;
use super::linear::{Embedding, Linear};
use super::llama::{Block, Weights};
use super::{Llama, LlamaConfig, LoadOptions, ModelError, ModelTokenizer};

/// The fields of `config.json` the llama forward pass uses.
#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

fn default_eps() -> f32 {
    1e-5
}
fn default_theta() -> f32 {
    10_000.0
}
fn default_positions() -> usize {
    4096
}

/// Reads the model and tokenizer from a checkpoint directory.
pub(crate) fn load(
    dir: &Path,
    options: &LoadOptions,
) -> Result<(Llama, ModelTokenizer), ModelError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
        path: config_path.clone(),
        source,
    })?;
    let hf: HfConfig = serde_json::from_str(&text)
        .map_err(|e| ModelError::Format(format!("{}: {e}", config_path.display())))?;
    if hf.model_type != "llama" {
        return Err(ModelError::UnsupportedArchitecture(hf.model_type));
    }
    if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ModelError::UnsupportedArchitecture(
            "llama with rope_scaling".to_string(),
        ));
    }
    let cfg = LlamaConfig {
        n_layers: hf.num_hidden_layers,
        n_heads: hf.num_attention_heads,
        n_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        hidden: hf.hidden_size,
        head_dim: hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1)),
        ffn: hf.intermediate_size,
        vocab: hf.vocab_size,
        rope_theta: hf.rope_theta,
        rms_eps: hf.rms_norm_eps,
        max_positions: hf.max_position_embeddings.min(MAX_POSITIONS),
        rope_freq_factors: Vec::new(),
        rope_interleaved: false,
    };
    let eos: Vec<u32> = match &hf.eos_token_id {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|v| vec![v as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64())
            .map(|v| v as u32)
            .collect(),
        _ => Vec::new(),
    };
    let tokenizer = ModelTokenizer::from_hf_dir(dir, &eos)?;
    let mut tensors = read_tensors(dir)?;
    let weights = weights(&mut tensors, &cfg, hf.tie_word_embeddings)?;
    Ok((Llama::new(cfg, weights, options)?, tokenizer))
}

fn read_tensors(dir: &Path) -> Result<HashMap<String, Tensor>, ModelError> {
    let io = |source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::Format(format!(
            "{} has no *.safetensors files",
            dir.display()
        )));
    }
    let mut all = HashMap::new();
    for file in files {
        let tensors = candle_core::safetensors::load(&file, &Device::Cpu)
            .map_err(|e| ModelError::Format(format!("{}: {e}", file.display())))?;
        all.extend(tensors);
    }
    Ok(all)
}

fn take(t: &mut HashMap<String, Tensor>, name: &str) -> Result<Tensor, ModelError> {
    let w = t
        .remove(name)
        .ok_or_else(|| ModelError::Format(format!("checkpoint has no tensor `{name}`")))?;
    match w.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(w.to_dtype(DType::F32)?),
        other => Err(ModelError::UnsupportedQuant {
            tensor: name.to_string(),
            dtype: format!("{other:?}"),
        }),
    }
}

fn vector(t: &mut HashMap<String, Tensor>, name: &str) -> Result<Vec<f32>, ModelError> {
    Ok(take(t, name)?.flatten_all()?.to_vec1::<f32>()?)
}

fn weights(
    t: &mut HashMap<String, Tensor>,
    cfg: &LlamaConfig,
    tied: bool,
) -> Result<Weights, ModelError> {
    let embed = Linear::dense(&take(t, "model.embed_tokens.weight")?)?;
    let token_embd = match &embed {
        Linear::Dense { w, cols, .. } => Embedding::Dense {
            w: w.clone(),
            cols: *cols,
        },
        _ => {
            return Err(ModelError::Format(
                "embedding table is not dense".to_string(),
            ));
        }
    };
    let output = if tied {
        embed
    } else {
        Linear::dense(&take(t, "lm_head.weight")?)?
    };
    let mut blocks = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = format!("model.layers.{i}");
        let mut lin = |name: &str| Linear::dense(&take(t, &format!("{p}.{name}.weight"))?);
        blocks.push(Block {
            attn_q: lin("self_attn.q_proj")?,
            attn_k: lin("self_attn.k_proj")?,
            attn_v: lin("self_attn.v_proj")?,
            attn_output: lin("self_attn.o_proj")?,
            ffn_gate: lin("mlp.gate_proj")?,
            ffn_up: lin("mlp.up_proj")?,
            ffn_down: lin("mlp.down_proj")?,
            attn_norm: vector(t, &format!("{p}.input_layernorm.weight"))?,
            ffn_norm: vector(t, &format!("{p}.post_attention_layernorm.weight"))?,
        });
    }
    Ok(Weights {
        token_embd,
        blocks,
        output_norm: vector(t, "model.norm.weight")?,
        output,
    })
}
