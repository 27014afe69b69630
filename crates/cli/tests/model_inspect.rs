//! `zinfer model inspect` as a user runs it: the built binary on the default
//! model, on small GGUF files and Hugging Face directories written here byte
//! by byte, and on files that are not models.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn zinfer(args: &[&str], path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zinfer"))
        .env_remove("ZINFER_JSON")
        .args(["model", "inspect"])
        .args(args)
        .arg(path)
        .output()
        .unwrap()
}

/// The `--json` report; fails the test when the command fails.
fn report(path: &Path) -> Value {
    let out = zinfer(&["--json"], path);
    assert!(
        out.status.success(),
        "inspect {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The error a failing inspect prints; fails the test when it succeeds.
fn failure(path: &Path) -> String {
    let out = zinfer(&[], path);
    assert_eq!(out.status.code(), Some(1), "inspect {}", path.display());
    assert!(out.stdout.is_empty());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn share<'a>(report: &'a Value, kind: &str) -> &'a Value {
    report["quant_mix"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {}", report["quant_mix"]))
}

#[test]
fn the_default_model() {
    let path = zinfer_fetch::test_model_path().unwrap();
    let r = report(&path);
    assert_eq!(r["format"], "gguf");
    assert_eq!(r["architecture"], "llama");
    assert_eq!(r["parameters"], 134_515_008);
    assert_eq!(r["tensors"], 272);
    assert_eq!(r["layers"], 30);
    assert_eq!(r["hidden"], 576);
    assert_eq!(r["heads"], 9);
    assert_eq!(r["kv_heads"], 3);
    assert_eq!(r["head_dim"], 64);
    assert_eq!(r["context_length"], 8192);
    assert_eq!(r["rope_base"], 100_000.0);
    assert_eq!(r["sliding_window"], Value::Null);
    assert_eq!(r["file_type"], json!({"id": 3, "name": "MOSTLY_Q4_1"}));
    assert_eq!(
        share(&r, "Q4_1"),
        &json!({"type": "Q4_1", "tensors": 210, "parameters": 106_168_320, "bytes": 66_355_200})
    );
    assert_eq!(share(&r, "Q8_0")["tensors"], 1);
    assert_eq!(share(&r, "F32")["tensors"], 61);
    assert_eq!(r["quant_mix"][0]["type"], "Q4_1");
    assert_eq!(r["weight_bytes"], 96_576_768);
    assert_eq!(r["tokenizer"], "gpt2");
    assert_eq!(r["tokenizer_pre"], "smollm");
    assert_eq!(r["tokens"], 49152);
    assert_eq!(r["chat_template"], true);
    assert_eq!(r["kv_bytes_per_token"], json!({"f32": 46080, "f16": 23040}));
    assert_eq!(r["loadable"], true);

    let out = zinfer(&[], &path);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "architecture:   llama",
        "parameters:     134.5M (134515008 in 272 tensors)",
        "KV heads:       3",
        "weights:        92.1 MiB",
        "KV per token:   45.0 KiB (f32), 22.5 KiB (f16)",
        "loadable:       yes",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
}

/// GGUF bytes: metadata, tensor table, padding to 32 and `data` zero bytes.
struct Gguf {
    kvs: Vec<u8>,
    kv_count: u64,
    tensors: Vec<u8>,
    tensor_count: u64,
}

impl Gguf {
    fn new(arch: &str) -> Self {
        let g = Self {
            kvs: Vec::new(),
            kv_count: 0,
            tensors: Vec::new(),
            tensor_count: 0,
        };
        g.str("general.architecture", arch)
    }

    fn key(mut self, key: &str, kind: u32) -> Self {
        self.kv_count += 1;
        self.kvs.extend((key.len() as u64).to_le_bytes());
        self.kvs.extend(key.as_bytes());
        self.kvs.extend(kind.to_le_bytes());
        self
    }

    fn u32(self, key: &str, v: u32) -> Self {
        let mut g = self.key(key, 4);
        g.kvs.extend(v.to_le_bytes());
        g
    }

    fn f32(self, key: &str, v: f32) -> Self {
        let mut g = self.key(key, 6);
        g.kvs.extend(v.to_le_bytes());
        g
    }

    fn str(self, key: &str, v: &str) -> Self {
        let mut g = self.key(key, 8);
        g.kvs.extend((v.len() as u64).to_le_bytes());
        g.kvs.extend(v.as_bytes());
        g
    }

    fn strings(self, key: &str, values: &[&str]) -> Self {
        let mut g = self.key(key, 9);
        g.kvs.extend(8u32.to_le_bytes());
        g.kvs.extend((values.len() as u64).to_le_bytes());
        for v in values {
            g.kvs.extend((v.len() as u64).to_le_bytes());
            g.kvs.extend(v.as_bytes());
        }
        g
    }

    fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> Self {
        self.tensor_count += 1;
        self.tensors.extend((name.len() as u64).to_le_bytes());
        self.tensors.extend(name.as_bytes());
        self.tensors.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.tensors.extend(d.to_le_bytes());
        }
        self.tensors.extend(ggml_type.to_le_bytes());
        self.tensors.extend(offset.to_le_bytes());
        self
    }

    fn bytes(&self, data: usize) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.tensor_count.to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(&self.kvs);
        out.extend(&self.tensors);
        out.resize(out.len().div_ceil(32) * 32 + data, 0);
        out
    }
}

fn qwen3() -> Gguf {
    Gguf::new("qwen3")
        .str("general.name", "tiny qwen3")
        .u32("general.file_type", 7)
        .u32("qwen3.block_count", 2)
        .u32("qwen3.context_length", 4096)
        .u32("qwen3.embedding_length", 256)
        .u32("qwen3.attention.head_count", 4)
        .u32("qwen3.attention.head_count_kv", 2)
        .u32("qwen3.attention.key_length", 128)
        .u32("qwen3.attention.value_length", 128)
        .u32("qwen3.attention.sliding_window", 512)
        .f32("qwen3.rope.freq_base", 1e6)
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "qwen2")
        .strings("tokenizer.ggml.tokens", &["a", "b", "<|im_end|>"])
        .str("tokenizer.chat_template", "{{ messages }}")
}

#[test]
fn a_small_hand_written_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    // 1024 bytes of F32, then 2 * 8 Q8_0 blocks of 34 bytes.
    let gguf = qwen3().tensor("output_norm.weight", &[256], 0, 0).tensor(
        "output.weight",
        &[256, 2],
        8,
        1024,
    );
    std::fs::write(&path, gguf.bytes(1024 + 544)).unwrap();
    let r = report(&path);
    assert_eq!(r["architecture"], "qwen3");
    assert_eq!(r["name"], "tiny qwen3");
    assert_eq!(r["parameters"], 768);
    assert_eq!(r["weight_bytes"], 1024 + 544);
    assert_eq!(share(&r, "Q8_0")["bytes"], 544);
    assert_eq!(r["quant_mix"][0]["type"], "Q8_0");
    assert_eq!(r["file_type"]["name"], "MOSTLY_Q8_0");
    // key_length, not embedding_length / head_count (64).
    assert_eq!(r["head_dim"], 128);
    assert_eq!(r["sliding_window"], 512);
    assert_eq!(r["rope_base"], 1e6);
    assert_eq!(r["tokens"], 3);
    assert_eq!(r["tokenizer_pre"], "qwen2");
    assert_eq!(r["chat_template"], true);
    assert_eq!(
        r["kv_bytes_per_token"],
        json!({"f32": 2 * 2 * 256 * 4, "f16": 2 * 2 * 256 * 2})
    );
    // The load's own checks: a header that inspects fine is no model.
    assert_eq!(r["loadable"], false);
    let reason = r["unsupported_reason"].as_str().unwrap();
    assert!(
        reason.contains("`tokenizer.ggml.merges`: missing"),
        "{reason}"
    );

    // Cut one byte short, the last tensor runs past the end.
    let bytes = gguf.bytes(1024 + 544);
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let err = failure(&path);
    assert!(
        err.contains("`output.weight`") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn unsupported_models_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    let gguf = qwen3()
        .u32("qwen3.expert_count", 8)
        .tensor("a", &[32], 0, 0)
        .tensor("b", &[32, 4], 99, 128);
    std::fs::write(&path, gguf.bytes(128 + 72)).unwrap();
    let r = report(&path);
    assert_eq!(r["loadable"], false);
    assert_eq!(r["expert_count"], 8);
    let reason = r["unsupported_reason"].as_str().unwrap();
    assert!(
        reason.contains("mixture-of-experts (8 experts)"),
        "{reason}"
    );
    assert_eq!(share(&r, "unknown type 99")["bytes"], Value::Null);
    assert_eq!(r["weight_bytes"], Value::Null);
    assert_eq!(r["parameters"], 32 + 128);

    let path = dir.path().join("mamba.gguf");
    std::fs::write(&path, Gguf::new("mamba").bytes(0)).unwrap();
    let r = report(&path);
    assert_eq!(r["loadable"], false);
    let reason = r["unsupported_reason"].as_str().unwrap();
    assert!(
        reason.contains("`mamba` is not supported by this build"),
        "{reason}"
    );
    assert_eq!(r["kv_bytes_per_token"], Value::Null);
    let text = String::from_utf8(zinfer(&[], &path).stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("loadable:") && l.contains("no: architecture `mamba`")),
        "{text}"
    );
}

#[test]
fn what_is_not_a_model_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello, not a model\n").unwrap();
    assert!(failure(&text).contains("not a GGUF file"));
    let missing = dir.path().join("missing.gguf");
    assert!(failure(&missing).contains("missing.gguf"));
    let mut hostile = Gguf::new("llama").bytes(0);
    hostile[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&text, hostile).unwrap();
    assert!(failure(&text).contains("count of tensors"));
    assert!(failure(dir.path()).contains("without config.json"));
}

/// A safetensors file: the JSON header, then `data` zero bytes.
fn safetensors(header: &Value, data: usize) -> Vec<u8> {
    let json = serde_json::to_vec(header).unwrap();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    out.resize(out.len() + data, 0);
    out
}

#[test]
fn a_hugging_face_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = json!({
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "vocab_size": 3,
    });
    std::fs::write(d.join("config.json"), config.to_string()).unwrap();
    let header = json!({
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [8, 64], "data_offsets": [0, 1024]},
        "model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [1024, 1280]},
    });
    std::fs::write(d.join("model.safetensors"), safetensors(&header, 1280)).unwrap();
    let tokenizer = json!({
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}},
        "added_tokens": [{"id": 1, "content": "b"}, {"id": 2, "content": "<|eot|>"}],
    });
    std::fs::write(d.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        d.join("tokenizer_config.json"),
        json!({"chat_template": "{{ messages }}"}).to_string(),
    )
    .unwrap();

    let r = report(d);
    assert_eq!(r["format"], "safetensors");
    assert_eq!(r["architecture"], "llama");
    assert_eq!(r["parameters"], 512 + 64);
    assert_eq!(r["tensors"], 2);
    assert_eq!(
        share(&r, "BF16"),
        &json!({"type": "BF16", "tensors": 1, "parameters": 512, "bytes": 1024})
    );
    assert_eq!(r["weight_bytes"], 1280);
    assert_eq!(r["head_dim"], 16);
    assert_eq!(r["kv_heads"], 2);
    assert_eq!(r["context_length"], 2048);
    assert_eq!(r["tokenizer"], "BPE");
    assert_eq!(r["tokens"], 3);
    assert_eq!(r["chat_template"], true);
    assert_eq!(r["kv_bytes_per_token"]["f32"], 2 * 2 * 32 * 4);
    assert_eq!(r["loadable"], true);

    // Data offsets past the end of the file: truncated.
    std::fs::write(d.join("model.safetensors"), safetensors(&header, 1000)).unwrap();
    let err = failure(d);
    assert!(err.contains("truncated"), "{err}");
    // A shape that does not match its bytes.
    let header = json!({"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, 128]}});
    std::fs::write(d.join("model.safetensors"), safetensors(&header, 128)).unwrap();
    let err = failure(d);
    assert!(err.contains("spans 128 bytes"), "{err}");
    // A header length beyond the file.
    std::fs::write(d.join("model.safetensors"), u64::MAX.to_le_bytes()).unwrap();
    let err = failure(d);
    assert!(err.contains("runs past the end"), "{err}");
}

/// A qwen3moe file's report counts the parameters one token reads: the
/// stacked experts' a quarter of theirs with 1 of 4 used. (The file has no
/// tokenizer or attention, so it is not loadable, but not for its experts.)
#[test]
fn a_mixture_of_experts_reports_experts_and_active_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    // A [4, 256] f32 router (4096 bytes), then 4 experts of [8, 256] f32.
    let gguf = Gguf::new("qwen3moe")
        .u32("qwen3moe.block_count", 1)
        .u32("qwen3moe.embedding_length", 256)
        .u32("qwen3moe.attention.head_count", 4)
        .u32("qwen3moe.expert_count", 4)
        .u32("qwen3moe.expert_used_count", 1)
        .tensor("blk.0.ffn_gate_inp.weight", &[256, 4], 0, 0)
        .tensor("blk.0.ffn_up_exps.weight", &[256, 8, 4], 0, 4096);
    std::fs::write(&path, gguf.bytes(4096 + 32_768)).unwrap();
    let r = report(&path);
    assert_eq!(r["loadable"], false, "{r}");
    let reason = r["unsupported_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("tokenizer:"), "{r}");
    assert_eq!(
        (r["expert_count"].clone(), r["experts_used"].clone()),
        (json!(4), json!(1))
    );
    assert_eq!(r["parameters"], 1024 + 8192);
    assert_eq!(r["active_parameters"], 1024 + 8192 / 4);
    let text = String::from_utf8(zinfer(&[], &path).stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("experts:") && l.ends_with("4 (1 per token)")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("active params:") && l.contains("3.1K (3072) per token")),
        "{text}"
    );
}
