//! The documented grammars of a streamed Anthropic Messages response and
//! of a streamed OpenAI response (`/v1/responses`), as checkers shared by
//! the fake-router tests and the end-to-end suite
//! (which includes this file by path), and the HTTP/1.1 chunked body
//! decoding both need to read one.

use serde_json::{Value, json};

/// The `(event, data)` pairs of an SSE body with named events.
pub fn named_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(event) = line.strip_prefix("event: ") {
            name = event.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            let data = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
            out.push((std::mem::take(&mut name), data));
        }
    }
    out
}

/// Checks a Messages stream against Anthropic's documented grammar:
/// `message_start`; then per content block `content_block_start` (indices
/// 0, 1, ... in order), its `content_block_delta`s (of the block's kind)
/// and `content_block_stop`; then `message_delta` and `message_stop`;
/// `ping` anywhere after the start. Every event's name is its data's
/// `type`. Returns each block's type and its deltas joined, and the
/// `message_delta`.
pub fn check_message_stream(events: &[(String, Value)]) -> (Vec<(String, String)>, Value) {
    for (name, data) in events {
        assert_eq!(data["type"], name.as_str(), "{events:?}");
    }
    let mut events = events
        .iter()
        .filter(|(name, _)| name != "ping")
        .map(|(name, data)| (name.as_str(), data));
    let (first, start) = events.next().expect("no events");
    assert_eq!(first, "message_start");
    assert_eq!(start["message"]["role"], "assistant");
    assert_eq!(start["message"]["content"], json!([]));
    assert!(start["message"]["stop_reason"].is_null());
    let mut blocks = Vec::new();
    loop {
        let (name, data) = events.next().expect("the stream ended early");
        match name {
            "content_block_start" => {
                assert_eq!(data["index"], blocks.len(), "{data}");
                let kind = data["content_block"]["type"].as_str().unwrap().to_string();
                let delta_kind = match kind.as_str() {
                    "text" => "text_delta",
                    "thinking" => "thinking_delta",
                    "tool_use" => "input_json_delta",
                    other => panic!("unknown block {other}"),
                };
                let mut joined = String::new();
                loop {
                    let (name, data) = events.next().expect("a block left open");
                    assert_eq!(data["index"], blocks.len(), "{data}");
                    match name {
                        "content_block_delta" => {
                            assert_eq!(data["delta"]["type"], delta_kind, "{data}");
                            let field = match delta_kind {
                                "text_delta" => "text",
                                "thinking_delta" => "thinking",
                                _ => "partial_json",
                            };
                            joined.push_str(data["delta"][field].as_str().unwrap());
                        }
                        "content_block_stop" => break,
                        other => panic!("{other} inside a block"),
                    }
                }
                blocks.push((kind, joined));
            }
            "message_delta" => {
                let (stop, _) = events.next().expect("no message_stop");
                assert_eq!(stop, "message_stop");
                assert!(events.next().is_none(), "events after message_stop");
                return (blocks, data.clone());
            }
            other => panic!("{other} between blocks"),
        }
    }
}

/// The body of a chunked HTTP/1.1 response.
pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

/// Checks a `/v1/responses` stream against OpenAI's documented grammar:
/// `response.created`, `response.in_progress`; then per output item
/// `response.output_item.added` (indices 0, 1, ... in order), its events
/// (a message: `content_part.added`, `output_text.delta`s,
/// `output_text.done`, `content_part.done`; a function call:
/// `function_call_arguments.delta`s and `.done`; reasoning:
/// `reasoning_summary_part.added`, `reasoning_summary_text.delta`s and
/// `.done`, `reasoning_summary_part.done`), `response.output_item.done`;
/// then `response.completed` or `response.incomplete`, last.
/// `sequence_number`s count from 0 and every event's name is its `type`.
/// Returns each item's type and its deltas joined, and the final response.
pub fn check_response_stream(events: &[(String, Value)]) -> (Vec<(String, String)>, Value) {
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "{data}");
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let mut events = events.iter().map(|(name, data)| (name.as_str(), data));
    let next = |events: &mut dyn Iterator<Item = (&str, &Value)>, expected: &str| {
        let (name, data) = events.next().unwrap_or_else(|| panic!("no {expected}"));
        assert_eq!(name, expected, "{data}");
        data.clone()
    };
    let created = next(&mut events, "response.created");
    assert_eq!(created["response"]["status"], "in_progress");
    next(&mut events, "response.in_progress");
    let mut items = Vec::new();
    loop {
        let (name, data) = events.next().expect("no final event");
        match name {
            "response.output_item.added" => {
                let index = items.len();
                assert_eq!(data["output_index"], index, "{data}");
                let kind = data["item"]["type"].as_str().unwrap().to_string();
                let (open, delta, field, closing): (&[&str], &str, &str, &[&str]) =
                    match kind.as_str() {
                        "message" => (
                            &["response.content_part.added"],
                            "response.output_text.delta",
                            "delta",
                            &["response.output_text.done", "response.content_part.done"],
                        ),
                        "function_call" => (
                            &[],
                            "response.function_call_arguments.delta",
                            "delta",
                            &["response.function_call_arguments.done"],
                        ),
                        "reasoning" => (
                            &["response.reasoning_summary_part.added"],
                            "response.reasoning_summary_text.delta",
                            "delta",
                            &[
                                "response.reasoning_summary_text.done",
                                "response.reasoning_summary_part.done",
                            ],
                        ),
                        other => panic!("unknown item {other}"),
                    };
                for expected in open {
                    let data = next(&mut events, expected);
                    assert_eq!(data["output_index"], index, "{data}");
                }
                let mut joined = String::new();
                let mut pending = events.next().expect("an item left open");
                while pending.0 == delta {
                    assert_eq!(pending.1["output_index"], index, "{}", pending.1);
                    joined.push_str(pending.1[field].as_str().unwrap());
                    pending = events.next().expect("an item left open");
                }
                for (i, expected) in closing.iter().enumerate() {
                    let data = if i == 0 {
                        assert_eq!(pending.0, *expected, "{}", pending.1);
                        pending.1.clone()
                    } else {
                        next(&mut events, expected)
                    };
                    assert_eq!(data["output_index"], index, "{data}");
                }
                let done = next(&mut events, "response.output_item.done");
                assert_eq!(done["output_index"], index, "{done}");
                assert_eq!(done["item"]["type"], kind.as_str(), "{done}");
                items.push((kind, joined));
            }
            "response.completed" | "response.incomplete" => {
                assert!(events.next().is_none(), "events after {name}");
                let response = data["response"].clone();
                assert_eq!(
                    response["output"].as_array().map(Vec::len),
                    Some(items.len())
                );
                return (items, response);
            }
            other => panic!("{other} between items"),
        }
    }
}
