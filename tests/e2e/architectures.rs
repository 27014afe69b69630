//! Every supported architecture, as a tiny synthetic checkpoint with a
//! real vocabulary, loads through `zinfer serve` and answers a chat
//! request on the OpenAI HTTP front.

use candle_core::quantized::gguf_file::Content;
use zinfer_model::synthetic::{Architecture, SynthShape, SynthSpec, generate, tiny_presets};

use crate::harness::{exclusive, http_post, serve_http};

/// Writes `preset` at Q8_0 with its own vocabulary (llama.cpp's test
/// file), or the default model's for llama shapes.
fn checkpoint(dir: &std::path::Path, preset: &str) -> std::path::PathBuf {
    let shape = SynthShape::preset(preset).unwrap();
    let vocab = match (&shape.vocab_file, shape.arch) {
        (Some(name), arch) if arch != Architecture::Llama => {
            zinfer_fetch::vocab_file(name).unwrap()
        }
        _ => zinfer_fetch::test_model_path().unwrap(),
    };
    let mut f = std::fs::File::open(&vocab).unwrap();
    let tokenizer = Content::read(&mut f).unwrap().metadata;
    let spec = SynthSpec {
        shape: shape.fitted_to(&tokenizer).unwrap(),
        quant: "q8_0".parse().unwrap(),
        seed: 1,
        threads: 2,
    };
    let path = dir.join(format!("{preset}.gguf"));
    generate(&path, &spec, &tokenizer, |_| {}).unwrap();
    path
}

#[test]
fn every_architecture_answers_a_chat_request_through_serve() {
    let _guard = exclusive();
    let dir = tempfile::tempdir().unwrap();
    for preset in tiny_presets() {
        let model = checkpoint(dir.path(), preset);
        let (_serve, http) = serve_http(&model, 512, &[]);
        let body = serde_json::json!({
            "model": preset,
            "messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": 6,
            "temperature": 0,
        });
        let (status, reply) = http_post(&http, "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{preset}: {reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        let usage = &reply["usage"];
        let completion = usage["completion_tokens"].as_u64().unwrap_or(0);
        assert!(
            (1..=6).contains(&completion) && usage["prompt_tokens"].as_u64() > Some(3),
            "{preset}: {reply}"
        );
        assert!(
            reply["choices"][0]["message"]["content"].is_string(),
            "{preset}: {reply}"
        );
    }
}
