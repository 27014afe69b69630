//! Anthropic's documented grammar of a streamed Messages response, as a
//! checker shared by the fake-router tests and the end-to-end suite
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
