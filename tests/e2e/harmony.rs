//! gpt-oss's harmony format through `zinfer serve --http`: a tiny synthetic
//! gpt-oss file carrying the real gpt-oss chat template and harmony's
//! control tokens, asked to call a tool with `tool_choice` naming it. The
//! weights are random, so only the forcing grammar makes the model write
//! harmony; the reply must hold the call, its arguments valid under the
//! schema, and no harmony markup in the content.

use candle_core::quantized::gguf_file::{Content, Value};
use zinfer_model::synthetic::{SynthShape, SynthSpec, generate};

use crate::harness::{exclusive, http_post, serve_http};

/// Harmony's control tokens, added to the synthetic file's vocabulary as
/// gpt-oss's has them (control tokens; the loader renders the first five
/// as text and ends generation at the last two, as llama.cpp does).
const HARMONY_TOKENS: [&str; 7] = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
];
/// llama.cpp's token type for control tokens.
const CONTROL: i32 = 3;

/// `gpt-oss-tiny` at Q8_0 with Qwen2's test vocabulary plus harmony's
/// tokens, and llama.cpp's copy of the gpt-oss chat template.
fn gpt_oss_checkpoint(dir: &std::path::Path) -> std::path::PathBuf {
    let shape = SynthShape::preset("gpt-oss-tiny").unwrap();
    let name = shape.vocab_file.clone().unwrap();
    let vocab = zinfer_fetch::vocab_file(&name).unwrap();
    let mut f = std::fs::File::open(&vocab).unwrap();
    let mut tokenizer = Content::read(&mut f).unwrap().metadata;
    let Some(Value::Array(tokens)) = tokenizer.get_mut("tokenizer.ggml.tokens") else {
        panic!("no token list in {}", vocab.display());
    };
    tokens.extend(HARMONY_TOKENS.map(|t| Value::String(t.into())));
    let count = tokens.len();
    let Some(Value::Array(types)) = tokenizer.get_mut("tokenizer.ggml.token_type") else {
        panic!("no token types in {}", vocab.display());
    };
    types.resize(count - HARMONY_TOKENS.len(), Value::I32(1));
    types.extend(HARMONY_TOKENS.map(|_| Value::I32(CONTROL)));
    let template = zinfer_fetch::chat_templates_dir()
        .unwrap()
        .join("openai-gpt-oss-120b.jinja");
    let template = std::fs::read_to_string(&template).unwrap();
    tokenizer.insert("tokenizer.chat_template".into(), Value::String(template));
    let spec = SynthSpec {
        shape: shape.fitted_to(&tokenizer).unwrap(),
        quant: "q8_0".parse().unwrap(),
        seed: 1,
        threads: 2,
    };
    let path = dir.join("gpt-oss-harmony.gguf");
    generate(&path, &spec, &tokenizer, |_| {}).unwrap();
    path
}

fn weather_request(stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "gpt-oss-harmony",
        "messages": [{"role": "user", "content": "Weather in Paris for three days?"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather",
            "description": "The forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20},
                               "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"],
            },
        }}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 120,
        "temperature": 0,
        "stream": stream,
        "logprobs": !stream,
    })
}

/// The call's arguments follow the schema.
fn check_arguments(arguments: &str) {
    let value: serde_json::Value = serde_json::from_str(arguments).unwrap();
    let map = value.as_object().unwrap();
    assert!(map["city"].is_string(), "{arguments}");
    let days = map["days"].as_i64().unwrap();
    assert!((1..=7).contains(&days), "{arguments}");
    assert!(
        map.keys().all(|k| k == "city" || k == "days"),
        "{arguments}"
    );
}

#[test]
fn forced_harmony_tool_call_through_serve() {
    let _guard = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let model = gpt_oss_checkpoint(dir.path());
    // As llama.cpp's vocabulary sets them: `<|return|>` and `<|call|>` end
    // generation, `<|end|>` (followed by the next message) does not.
    let tokenizer = zinfer_text::ModelTokenizer::open(&model).unwrap();
    let first = tokenizer.vocab_size() - HARMONY_TOKENS.len();
    for (i, token) in HARMONY_TOKENS.iter().enumerate() {
        let ends = tokenizer.eos_token_ids().contains(&((first + i) as u32));
        assert_eq!(ends, ["<|return|>", "<|call|>"].contains(token), "{token}");
    }
    let (_serve, http) = serve_http(&model, 512, &[]);

    let (status, reply) = http_post(
        &http,
        "/v1/chat/completions",
        &weather_request(false).to_string(),
    );
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let message = &choice["message"];
    let content = message["content"].as_str().unwrap_or("");
    assert!(content.trim().is_empty(), "{reply}");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{reply}");
    assert_eq!(calls[0]["function"]["name"], "get_weather", "{reply}");
    let arguments = calls[0]["function"]["arguments"].as_str().unwrap();
    check_arguments(arguments);
    // The header's control tokens were written as the tokens themselves.
    let tokens: Vec<&str> = choice["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["token"].as_str())
        .collect();
    assert_eq!(tokens.first(), Some(&"<|channel|>"), "{tokens:?}");
    assert!(tokens.contains(&"<|constrain|>"), "{tokens:?}");
    assert!(tokens.contains(&"<|message|>"), "{tokens:?}");

    // Streamed: the same call in the deltas, no markup in any content.
    let (status, events) = http_post(
        &http,
        "/v1/chat/completions",
        &weather_request(true).to_string(),
    );
    assert_eq!(status, 200, "{events}");
    let mut streamed_calls = Vec::new();
    for line in events.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            continue;
        }
        let event: serde_json::Value = serde_json::from_str(data).unwrap();
        let delta = &event["choices"][0]["delta"];
        for field in ["content", "reasoning_content"] {
            let text = delta[field].as_str().unwrap_or("");
            assert!(!text.contains("<|"), "{field}: {events}");
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            streamed_calls.extend(calls.iter().cloned());
        }
    }
    assert_eq!(streamed_calls.len(), 1, "{events}");
    assert_eq!(streamed_calls[0]["function"]["name"], "get_weather");
    let streamed_arguments = streamed_calls[0]["function"]["arguments"].as_str().unwrap();
    assert_eq!(streamed_arguments, arguments, "greedy: the same call");
}
