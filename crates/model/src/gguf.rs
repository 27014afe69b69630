//! Loading llama-architecture GGUF files.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, Value};

use super::config::MAX_POSITIONS;
use super::linear::{Embedding, Linear};
use super::llama::{Block, Weights};
use super::{Llama, LlamaConfig, LoadOptions, ModelError, ModelTokenizer};

/// Reads the model, its tokenizer and chat template from one GGUF file.
pub(crate) fn load(
    path: &Path,
    options: &LoadOptions,
) -> Result<(Llama, ModelTokenizer), ModelError> {
    let mut file = open(path)?;
    let mut gguf = Gguf {
        content: &file.content,
        reader: &mut file.reader,
    };
    let weights = weights(&mut gguf, &file.cfg)?;
    let model = Llama::new(file.cfg, weights, options)?;
    Ok((model, file.tokenizer))
}

/// A GGUF file with its metadata read: what both backends start from.
pub(crate) struct GgufFile {
    pub(crate) content: Content,
    pub(crate) reader: BufReader<File>,
    pub(crate) cfg: LlamaConfig,
    pub(crate) tokenizer: ModelTokenizer,
}

/// Reads a GGUF file's header, model config and tokenizer (not the weights).
pub(crate) fn open(path: &Path) -> Result<GgufFile, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(io)?);
    let content = Content::read(&mut reader).map_err(|e| {
        ModelError::Format(format!(
            "{} is not a readable GGUF file: {e}",
            path.display()
        ))
    })?;
    let mut cfg = config(&content)?;
    let tokenizer = ModelTokenizer::from_gguf(&content)?;
    if content.tensor_infos.contains_key("rope_freqs.weight") {
        let mut gguf = Gguf {
            content: &content,
            reader: &mut reader,
        };
        cfg.rope_freq_factors = gguf.vector("rope_freqs.weight")?;
    }
    Ok(GgufFile {
        content,
        reader,
        cfg,
        tokenizer,
    })
}

struct Gguf<'a, R> {
    content: &'a Content,
    reader: &'a mut R,
}

impl<R: std::io::Read + std::io::Seek> Gguf<'_, R> {
    fn qtensor(&mut self, name: &str) -> Result<QTensor, ModelError> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(ModelError::Format(format!(
                "GGUF file has no tensor `{name}`"
            )));
        }
        self.content
            .tensor(self.reader, name, &Device::Cpu)
            .map_err(|e| ModelError::Format(format!("reading tensor `{name}`: {e}")))
    }

    fn linear(&mut self, name: &str) -> Result<Linear, ModelError> {
        let qt = self.qtensor(name)?;
        Linear::from_qtensor(name, qt)
    }

    fn vector(&mut self, name: &str) -> Result<Vec<f32>, ModelError> {
        let qt = self.qtensor(name)?;
        Ok(qt
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }
}

fn weights<R: std::io::Read + std::io::Seek>(
    g: &mut Gguf<'_, R>,
    cfg: &LlamaConfig,
) -> Result<Weights, ModelError> {
    let embd = g.qtensor("token_embd.weight")?;
    let (token_embd, output) = if g.content.tensor_infos.contains_key("output.weight") {
        (
            Embedding::from_qtensor("token_embd.weight", embd)?,
            g.linear("output.weight")?,
        )
    } else {
        // Tied embeddings: the table doubles as the LM head.
        Embedding::with_tied_head("token_embd.weight", embd)?
    };
    let mut blocks = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = format!("blk.{i}");
        blocks.push(Block {
            attn_norm: g.vector(&format!("{p}.attn_norm.weight"))?,
            attn_q: g.linear(&format!("{p}.attn_q.weight"))?,
            attn_k: g.linear(&format!("{p}.attn_k.weight"))?,
            attn_v: g.linear(&format!("{p}.attn_v.weight"))?,
            attn_output: g.linear(&format!("{p}.attn_output.weight"))?,
            ffn_norm: g.vector(&format!("{p}.ffn_norm.weight"))?,
            ffn_gate: g.linear(&format!("{p}.ffn_gate.weight"))?,
            ffn_up: g.linear(&format!("{p}.ffn_up.weight"))?,
            ffn_down: g.linear(&format!("{p}.ffn_down.weight"))?,
        });
    }
    Ok(Weights {
        token_embd,
        blocks,
        output_norm: g.vector("output_norm.weight")?,
        output,
    })
}

fn config(ct: &Content) -> Result<LlamaConfig, ModelError> {
    let md = &ct.metadata;
    let arch = md
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or_else(|| {
            ModelError::Format("GGUF metadata has no general.architecture".to_string())
        })?;
    if arch != "llama" {
        return Err(ModelError::UnsupportedArchitecture(arch.clone()));
    }
    if get_usize(md, "llama.expert_count").unwrap_or(0) > 0 {
        return Err(ModelError::UnsupportedArchitecture(
            "llama with mixture-of-experts".to_string(),
        ));
    }
    let n_heads = get_usize(md, "llama.attention.head_count")?;
    let hidden = get_usize(md, "llama.embedding_length")?;
    let head_dim = hidden / n_heads.max(1);
    if let Ok(rope_dim) = get_usize(md, "llama.rope.dimension_count")
        && rope_dim != head_dim
    {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "llama with partial RoPE ({rope_dim} of {head_dim} dims)"
        )));
    }
    let vocab = ct
        .tensor_infos
        .get("token_embd.weight")
        .and_then(|t| t.shape.dims().first().copied())
        .ok_or_else(|| {
            ModelError::Format("GGUF file has no usable tensor `token_embd.weight`".to_string())
        })?;
    Ok(LlamaConfig {
        n_layers: get_usize(md, "llama.block_count")?,
        n_heads,
        n_kv_heads: get_usize(md, "llama.attention.head_count_kv").unwrap_or(n_heads),
        hidden,
        head_dim,
        ffn: get_usize(md, "llama.feed_forward_length")?,
        vocab,
        rope_theta: get_f32(md, "llama.rope.freq_base").unwrap_or(10_000.0),
        rms_eps: get_f32(md, "llama.attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        max_positions: get_usize(md, "llama.context_length")
            .unwrap_or(4096)
            .min(MAX_POSITIONS),
        rope_freq_factors: Vec::new(),
        rope_interleaved: true,
    })
}

fn get_usize(md: &HashMap<String, Value>, key: &str) -> Result<usize, ModelError> {
    let v = md
        .get(key)
        .ok_or_else(|| ModelError::Format(format!("GGUF metadata has no `{key}`")))?;
    value_usize(v, key)
}

fn get_f32(md: &HashMap<String, Value>, key: &str) -> Result<f32, ModelError> {
    match md.get(key) {
        Some(Value::F32(v)) => Ok(*v),
        Some(Value::F64(v)) => Ok(*v as f32),
        Some(other) => Err(ModelError::Format(format!(
            "`{key}` is not a float: {other:?}"
        ))),
        None => Err(ModelError::Format(format!("GGUF metadata has no `{key}`"))),
    }
}

/// Any GGUF integer as a usize (metadata writers disagree on widths).
pub(crate) fn value_usize(v: &Value, key: &str) -> Result<usize, ModelError> {
    let n: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        other => {
            return Err(ModelError::Format(format!(
                "`{key}` is not an integer: {other:?}"
            )));
        }
    };
    usize::try_from(n).map_err(|_| ModelError::Format(format!("`{key}` = {n} is out of range")))
}
