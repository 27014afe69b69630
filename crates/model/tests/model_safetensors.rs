//! A Hugging Face checkpoint directory (config.json, tokenizer.json,
//! safetensors) made from the default GGUF runs the same as the GGUF.
//!
//! The test converts the first few layers of the default model both ways,
//! with f16 weights: a GGUF with F16 tensors (interleaved RoPE rows, as
//! llama.cpp stores them) and a safetensors directory with Hugging Face names
//! and Q/K rows permuted back to the half-split RoPE layout.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};
use tokenizers::{AddedToken, Tokenizer};
use zinfer_fetch::test_model_path;
use zinfer_model::{LoadOptions, load};
use zinfer_text::ModelTokenizer;

mod support;
use support::one_shot;

const LAYERS: usize = 4;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zinfer-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// GGUF (interleaved) Q/K rows back to Hugging Face's half-split order.
fn unpermute(w: &Tensor, heads: usize) -> Tensor {
    let (out, inp) = w.dims2().unwrap();
    w.reshape((heads, out / heads / 2, 2, inp))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((out, inp))
        .unwrap()
}

fn hf_name(gguf: &str) -> Option<String> {
    let fixed = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
    ];
    if let Some((_, hf)) = fixed.iter().find(|(g, _)| *g == gguf) {
        return Some(hf.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, name) = rest.split_once('.')?;
    let hf = match name {
        "attn_norm.weight" => "input_layernorm",
        "attn_q.weight" => "self_attn.q_proj",
        "attn_k.weight" => "self_attn.k_proj",
        "attn_v.weight" => "self_attn.v_proj",
        "attn_output.weight" => "self_attn.o_proj",
        "ffn_norm.weight" => "post_attention_layernorm",
        "ffn_gate.weight" => "mlp.gate_proj",
        "ffn_up.weight" => "mlp.up_proj",
        "ffn_down.weight" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.weight"))
}

fn keep(name: &str) -> bool {
    match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        Some((layer, _)) => layer.parse::<usize>().unwrap() < LAYERS,
        None => true,
    }
}

/// The default model's tokenizer as Hugging Face ships SmolLM2's
/// `tokenizer.json`: byte-level BPE over its vocabulary and merges, digits
/// split one by one, control tokens special.
fn hf_tokenizer(md: &HashMap<String, gguf_file::Value>) -> Tokenizer {
    use tokenizers::models::bpe::{BPE, Vocab};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;

    assert_eq!(md["tokenizer.ggml.pre"].to_string().unwrap(), "smollm");
    let strings = |key: &str| -> Vec<String> {
        md[key]
            .to_vec()
            .unwrap()
            .iter()
            .map(|v| v.to_string().unwrap().clone())
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens");
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = strings("tokenizer.ggml.merges")
        .iter()
        .map(|m| {
            let (a, b) = m.split_once(' ').unwrap();
            (a.to_string(), b.to_string())
        })
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
        Digits::new(true).into(),
        ByteLevel::new(false, true, true).into(),
    ])));
    tokenizer.with_decoder(Some(ByteLevel::new(false, true, true)));
    let types = md["tokenizer.ggml.token_type"].to_vec().unwrap();
    let specials = tokens
        .iter()
        .zip(types)
        .filter(|(_, t)| matches!(t.to_i32().unwrap(), 3 | 4))
        .map(|(tok, _)| AddedToken::from(tok.clone(), true));
    tokenizer.add_special_tokens(specials).unwrap();
    tokenizer
}

/// Writes the truncated model as an F16 GGUF and as a safetensors directory.
fn convert(src: &Path) -> (PathBuf, PathBuf) {
    let mut f = std::fs::File::open(src).unwrap();
    let ct = gguf_file::Content::read(&mut f).unwrap();
    let mut names: Vec<String> = ct
        .tensor_infos
        .keys()
        .filter(|n| keep(n))
        .cloned()
        .collect();
    names.sort();
    let mut gguf_tensors = Vec::new();
    let mut hf_tensors = HashMap::new();
    for name in &names {
        let t = ct.tensor(&mut f, name, &Device::Cpu).unwrap();
        let dense = t.dequantize(&Device::Cpu).unwrap();
        let stored = if t.dtype() == GgmlDType::F32 {
            t
        } else {
            QTensor::quantize(&dense, GgmlDType::F16).unwrap()
        };
        gguf_tensors.push((name.clone(), stored));
        let hf = if name.ends_with("attn_q.weight") {
            unpermute(&dense, HEADS)
        } else if name.ends_with("attn_k.weight") {
            unpermute(&dense, KV_HEADS)
        } else {
            dense
        };
        hf_tensors.insert(hf_name(name).unwrap(), hf.to_dtype(DType::F16).unwrap());
    }

    let dir = scratch_dir("hf");
    let gguf_path = dir.join("model.gguf");
    let mut md: HashMap<String, gguf_file::Value> = ct.metadata.clone();
    md.insert(
        "llama.block_count".to_string(),
        gguf_file::Value::U32(LAYERS as u32),
    );
    let md_refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = gguf_tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(
        &mut std::fs::File::create(&gguf_path).unwrap(),
        &md_refs,
        &t_refs,
    )
    .unwrap();

    let hf_dir = dir.join("hf");
    std::fs::create_dir_all(&hf_dir).unwrap();
    candle_core::safetensors::save(&hf_tensors, hf_dir.join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS, "vocab_size": 49152,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": true, "eos_token_id": 2, "bos_token_id": 1,
    });
    std::fs::write(hf_dir.join("config.json"), config.to_string()).unwrap();
    hf_tokenizer(&ct.metadata)
        .save(hf_dir.join("tokenizer.json"), false)
        .unwrap();
    let template = match ct.metadata.get("tokenizer.chat_template") {
        Some(gguf_file::Value::String(s)) => s.clone(),
        _ => panic!("the default model has a chat template"),
    };
    let tok_config = serde_json::json!({
        "chat_template": template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
    });
    std::fs::write(hf_dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
    (gguf_path, hf_dir)
}

#[test]
fn safetensors_directory_matches_the_gguf() {
    let options = LoadOptions {
        kv_capacity: 128,
        ..LoadOptions::default()
    };
    let original = ModelTokenizer::open(&test_model_path().unwrap()).unwrap();
    let (gguf_path, hf_dir) = convert(&test_model_path().unwrap());
    let mut from_gguf = load(&gguf_path, &options).unwrap();
    let mut from_hf = load(&hf_dir, &options).unwrap();
    let hf_tokenizer = ModelTokenizer::open(&hf_dir).unwrap();
    // A chat_template.jinja beside the checkpoint wins over the template of
    // tokenizer_config.json (Python string methods included).
    std::fs::write(
        hf_dir.join("chat_template.jinja"),
        "{% for m in messages %}\n<{{ m['role'] }}>{{ m['content'].strip().upper() }}\n{% endfor %}",
    )
    .unwrap();
    let with_jinja = ModelTokenizer::open(&hf_dir).unwrap();
    let _ = std::fs::remove_dir_all(gguf_path.parent().unwrap());
    let padded = [zinfer_protocol::ChatMessage::new(
        "user",
        "  Name three colours. ",
    )];
    assert_eq!(
        with_jinja.apply_chat_template(&padded).unwrap(),
        "<user>NAME THREE COLOURS.\n"
    );

    let messages = [zinfer_protocol::ChatMessage::new(
        "user",
        "Name three colours.",
    )];
    let prompt = hf_tokenizer.apply_chat_template(&messages).unwrap();
    assert_eq!(prompt, original.apply_chat_template(&messages).unwrap());
    let ids = hf_tokenizer.encode(&prompt).unwrap();
    assert_eq!(ids, original.encode(&prompt).unwrap());
    assert!(hf_tokenizer.eos_token_ids().contains(&2));

    let a = one_shot(&mut from_gguf, &ids);
    let b = one_shot(&mut from_hf, &ids);
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-3, "max |gguf - safetensors| = {diff}");
}
