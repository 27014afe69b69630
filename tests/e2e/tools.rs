//! Tool calls against a real router and a worker running the default model
//! (ChatML, so tools go through the Hermes fallback): over the protocol, a
//! forced call streams and arrives whole with `finish_reason: tool_calls`;
//! through the HTTP front, the official `openai` package gets strict JSON
//! schemas and tool calls that `jsonschema` validates.

use zinfer_protocol::{
    ChatMessage, ChunkBody, ClientReply, DoneBody, FinishReason, Tool, ToolCall, ToolChoice,
};

use crate::harness::Cluster;

fn weather_tool() -> Tool {
    Tool::function(
        "get_weather",
        serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": false,
        }),
    )
}

fn assert_weather_call(call: &ToolCall) {
    assert_eq!(call.function.name, "get_weather", "{call:?}");
    assert_eq!(call.id.as_ref().map(String::len), Some(9), "{call:?}");
    let arguments = call
        .function
        .arguments
        .as_str()
        .expect("arguments are JSON text");
    let value: serde_json::Value = serde_json::from_str(arguments).expect("arguments parse");
    assert!(value["city"].is_string(), "{arguments}");
    let days = value["days"].as_i64().expect("days is an integer");
    assert!((1..=7).contains(&days), "{arguments}");
}

#[test]
fn forced_tool_calls_over_the_protocol() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();
    let request = |id: &str, stream: bool| {
        let mut request = crate::harness::greedy(id, "", 120);
        request.prompt = None;
        request.messages = Some(vec![ChatMessage::new(
            "user",
            "What will the weather be in Paris over the next three days?",
        )]);
        request.tools = vec![weather_tool()];
        request.tool_choice = ToolChoice::Function("get_weather".into());
        request.parallel_tool_calls = false;
        request.stream = stream;
        request
    };

    let whole = client.generate(request("whole", false));
    let Some(ClientReply::Done {
        body:
            DoneBody {
                finish_reason,
                text,
                tool_calls,
                ..
            },
        ..
    }) = &whole.terminal
    else {
        panic!("expected done, got {:?}", whole.terminal);
    };
    assert_eq!(*finish_reason, FinishReason::ToolCalls, "{text:?}");
    assert_eq!(text.as_deref().map(str::trim), Some(""), "{text:?}");
    let calls = tool_calls.as_ref().expect("tool_calls on done");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_weather_call(&calls[0]);

    let streamed = client.generate(request("streamed", true));
    let chunk_calls: Vec<&ToolCall> = streamed
        .chunks
        .iter()
        .flat_map(|c| match c {
            ClientReply::Chunk {
                body: ChunkBody { tool_calls, .. },
                ..
            } => tool_calls.iter().collect(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(chunk_calls.len(), 1, "{:?}", streamed.chunks);
    assert_eq!(
        chunk_calls[0].function, calls[0].function,
        "same call, streamed"
    );
    assert!(
        matches!(
            streamed.terminal,
            Some(ClientReply::Done {
                body: DoneBody {
                    finish_reason: FinishReason::ToolCalls,
                    ..
                },
                ..
            })
        ),
        "{:?}",
        streamed.terminal
    );
    assert!(streamed.streamed_text().trim().is_empty());

    // `none`: the tools are shown, no call is parsed or forced.
    let mut plain = request("none", false);
    plain.tool_choice = ToolChoice::None;
    plain.max_tokens = 12;
    let outcome = client.generate(plain);
    let Some(ClientReply::Done {
        body: DoneBody {
            finish_reason,
            tool_calls,
            ..
        },
        ..
    }) = &outcome.terminal
    else {
        panic!("expected done, got {:?}", outcome.terminal);
    };
    assert_ne!(*finish_reason, FinishReason::ToolCalls);
    assert!(tool_calls.is_none());
}

#[test]
fn openai_structured_output_and_tools_through_the_http_front() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = crate::harness::http_front(&cluster);
    let base = front.base_url();
    crate::harness::openai_script(
        "openai_tools.py",
        &[&base, "smol"],
        "openai tools checks passed",
    );
}
