//! Hugging Face checkpoint directories: shapes from `config.json`, tensors
//! from the safetensors headers (read by [`zinfer_probe::safetensors`],
//! which checks every length and data offset against the file's size),
//! tokenizer from `tokenizer.json`. Only headers are read.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value;
use zinfer_probe::{KvShape, read_safetensors_header};

use super::{Report, TypeShare, by_parameters, kv_bytes};

pub(super) fn inspect_dir(dir: &Path) -> anyhow::Result<Report> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        bail!(
            "{} is a directory without config.json: not a Hugging Face model directory",
            dir.display()
        );
    }
    let config = read_json(&config_path)?;
    let files = safetensors_files(dir)?;
    let mut mix: BTreeMap<String, TypeShare> = BTreeMap::new();
    let (mut parameters, mut weight_bytes, mut tensors) = (0u64, 0u64, 0u64);
    for file in &files {
        for t in read_safetensors_header(file)?.tensors {
            let bytes = t.bytes();
            tensors += 1;
            parameters = parameters.saturating_add(t.elements);
            weight_bytes = weight_bytes.saturating_add(bytes);
            let share = mix.entry(t.dtype.clone()).or_insert_with(|| TypeShare {
                kind: t.dtype,
                tensors: 0,
                parameters: 0,
                bytes: Some(0),
            });
            share.tensors += 1;
            share.parameters = share.parameters.saturating_add(t.elements);
            share.bytes = share.bytes.map(|b| b.saturating_add(bytes));
        }
    }

    let cfg = |key: &str| config_u64(&config, key);
    let heads = cfg("num_attention_heads");
    let hidden = cfg("hidden_size");
    let kv_heads = cfg("num_key_value_heads").or(heads);
    let head_dim = cfg("head_dim").or(match (hidden, heads) {
        (Some(hidden), Some(heads)) if heads > 0 => Some(hidden / heads),
        _ => None,
    });
    let layers = cfg("num_hidden_layers");
    let kv = match (layers, kv_heads, head_dim) {
        (Some(layers), Some(kv_heads), Some(dim)) => kv_bytes(&KvShape {
            layers: layers as usize,
            kv_heads: kv_heads as usize,
            key_dim: dim as usize,
            value_dim: dim as usize,
        }),
        _ => None,
    };
    // Qwen2 configs carry a window with `use_sliding_window: false`.
    let sliding_window = match config_value(&config, "use_sliding_window") {
        Some(Value::Bool(false)) => None,
        _ => cfg("sliding_window"),
    };
    let experts = ["num_local_experts", "num_experts", "n_routed_experts"]
        .iter()
        .find_map(|key| cfg(key));
    let tokenizer = read_optional_json(&dir.join("tokenizer.json"))?;
    let tokens = tokenizer
        .as_ref()
        .and_then(token_count)
        .or(cfg("vocab_size"));
    Ok(Report {
        format: "safetensors",
        architecture: config
            .get("model_type")
            .and_then(Value::as_str)
            .map(str::to_string),
        name: config
            .get("_name_or_path")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .map(str::to_string),
        parameters,
        tensors,
        quant_mix: by_parameters(mix.into_values().collect()),
        context_length: cfg("max_position_embeddings"),
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        sliding_window,
        rope_base: config_value(&config, "rope_theta").and_then(Value::as_f64),
        expert_count: experts,
        tokenizer: tokenizer
            .as_ref()
            .and_then(|t| t.pointer("/model/type"))
            .and_then(Value::as_str)
            .map(str::to_string),
        tokens,
        chat_template: has_chat_template(dir)?,
        weight_bytes: Some(weight_bytes),
        kv_bytes_per_token: kv,
        ..Report::default()
    })
}

/// `key` from `config.json`, or from its `text_config` (multimodal
/// checkpoints such as Gemma 3 keep the language model's shape there).
fn config_value<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    config
        .get(key)
        .filter(|v| !v.is_null())
        .or_else(|| config.get("text_config")?.get(key))
        .filter(|v| !v.is_null())
}

fn config_u64(config: &Value, key: &str) -> Option<u64> {
    config_value(config, key)?.as_u64()
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn read_optional_json(path: &Path) -> anyhow::Result<Option<Value>> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

fn safetensors_files(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{} has no *.safetensors files", dir.display());
    }
    Ok(files)
}

/// Distinct token ids in `tokenizer.json`: the model's vocabulary plus
/// added tokens (which often repeat vocabulary ids).
fn token_count(tokenizer: &Value) -> Option<u64> {
    let vocab = tokenizer.pointer("/model/vocab")?;
    let mut ids: HashSet<u64> = match vocab {
        Value::Object(map) => map.values().filter_map(Value::as_u64).collect(),
        // Unigram: a list of [piece, score], ids are positions.
        Value::Array(list) => (0..list.len() as u64).collect(),
        _ => return None,
    };
    if let Some(Value::Array(added)) = tokenizer.get("added_tokens") {
        ids.extend(added.iter().filter_map(|t| t.get("id")?.as_u64()));
    }
    Some(ids.len() as u64)
}

/// `chat_template` in `tokenizer_config.json`, or a `chat_template.jinja`
/// file (where newer checkpoints keep it).
fn has_chat_template(dir: &Path) -> anyhow::Result<bool> {
    if dir.join("chat_template.jinja").is_file() {
        return Ok(true);
    }
    let config = read_optional_json(&dir.join("tokenizer_config.json"))?;
    Ok(config
        .as_ref()
        .and_then(|c| c.get("chat_template"))
        .is_some_and(|t| !t.is_null()))
}
