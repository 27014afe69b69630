//! Tool calls and reasoning on the fake model: a forced call streams and
//! arrives whole with `tool_calls`, and a thinking template's `<think>`
//! block comes out as `reasoning`, through the same engine path a real
//! model takes.

use zinfer_protocol::{ChunkBody, Constraint, DoneBody, Tool, ToolChoice};
use zinfer_text::ChatFeatures;

use super::*;

/// [`Bytes`] behind a template that writes `<think>` blocks.
struct Thinker;

impl TextCodec for Thinker {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        Bytes.encode(text)
    }
    fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        Bytes.decode(ids)
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TextError> {
        Bytes.render_chat(messages)
    }
    fn eos_token_ids(&self) -> &[u32] {
        &[EOS]
    }
    fn token_bytes(&self) -> Result<Vec<TokenBytes>, TextError> {
        Bytes.token_bytes()
    }
    fn chat_features(&self) -> ChatFeatures {
        ChatFeatures {
            thinks: true,
            ..ChatFeatures::default()
        }
    }
}

fn chat(max_tokens: u32, stream: bool) -> GenerateRequest {
    GenerateRequest {
        prompt: None,
        messages: Some(vec![ChatMessage::new("user", "Weather?")]),
        stream,
        ..greedy("", max_tokens)
    }
}

fn weather() -> Tool {
    Tool::function(
        "get_weather",
        serde_json::json!({"type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"]}),
    )
}

fn chunk_calls(events: &[EngineEvent]) -> Vec<ToolCall> {
    events
        .iter()
        .flat_map(|e| match e {
            EngineEvent::Chunk {
                body: ChunkBody { tool_calls, .. },
                ..
            } => tool_calls.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn a_forced_call_comes_back_as_tool_calls_streamed_or_whole() {
    let handle = engine(Mode::Script, 1024, 0, EngineConfig::default());
    let forced = |stream| GenerateRequest {
        tools: vec![weather()],
        tool_choice: ToolChoice::Required,
        parallel_tool_calls: false,
        ..chat(200, stream)
    };
    handle.submit(forced(true), 1).unwrap();
    let streamed = collect(&handle, 1);
    let calls = chunk_calls(&streamed);
    assert_eq!(calls.len(), 1, "{streamed:?}");
    assert_eq!(calls[0].function.name, "get_weather");
    let arguments: serde_json::Value =
        serde_json::from_str(calls[0].function.arguments.as_str().unwrap()).unwrap();
    assert!(
        ["celsius", "fahrenheit"].contains(&arguments["unit"].as_str().unwrap()),
        "{arguments}"
    );
    assert!(streamed_text(&streamed).trim().is_empty(), "{streamed:?}");
    assert_eq!(done(&streamed).0, FinishReason::ToolCalls);

    handle.submit(forced(false), 2).unwrap();
    let whole = collect(&handle, 2);
    let Some(EngineEvent::Done {
        body:
            DoneBody {
                finish_reason,
                tool_calls: Some(whole_calls),
                ..
            },
        ..
    }) = whole.last()
    else {
        panic!("expected done with tool calls, got {whole:?}");
    };
    assert_eq!(*finish_reason, FinishReason::ToolCalls);
    assert_eq!(whole_calls[0].function, calls[0].function);
    assert_ne!(whole_calls[0].id, calls[0].id, "every call has its own id");

    // The same tools with `none`: nothing forced, nothing parsed.
    handle
        .submit(
            GenerateRequest {
                tools: vec![weather()],
                tool_choice: ToolChoice::None,
                ..chat(5, true)
            },
            3,
        )
        .unwrap();
    let plain = collect(&handle, 3);
    assert_eq!(streamed_text(&plain), "Hello");
    assert!(chunk_calls(&plain).is_empty());
}

#[test]
fn a_think_block_comes_out_as_reasoning() {
    let model = FakeModel {
        mode: Mode::Script,
        delay: Duration::ZERO,
        kv: vec![None; 1024],
        max_positions: usize::MAX,
    };
    let handle = Engine::start_with(
        "fake".into(),
        Box::new(model),
        Arc::new(Thinker),
        EngineConfig::default(),
    );
    // The fake model cannot think: a grammar makes it.
    let thinking = |stream| GenerateRequest {
        constraint: Some(Box::new(Constraint::lark(
            r#"start: "<think>" "I should greet." "</think>" "\n\n" "Hi!""#,
        ))),
        ..chat(60, stream)
    };
    handle.submit(thinking(true), 1).unwrap();
    let events = collect(&handle, 1);
    let reasoning: String = events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Chunk {
                body: ChunkBody { reasoning, .. },
                ..
            } => Some(reasoning.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasoning, "I should greet.");
    assert_eq!(streamed_text(&events), "Hi!");

    handle.submit(thinking(false), 2).unwrap();
    let events = collect(&handle, 2);
    let Some(EngineEvent::Done {
        body: DoneBody {
            text, reasoning, ..
        },
        ..
    }) = events.last()
    else {
        panic!("expected done, got {events:?}");
    };
    assert_eq!(text.as_deref(), Some("Hi!"));
    assert_eq!(reasoning.as_deref(), Some("I should greet."));

    // A raw prompt is never parsed.
    handle
        .submit(
            GenerateRequest {
                constraint: Some(Box::new(Constraint::lark(r#"start: "<think>a</think>b""#))),
                ..greedy("x", 60)
            },
            3,
        )
        .unwrap();
    assert_eq!(streamed_text(&collect(&handle, 3)), "<think>a</think>b");
}
