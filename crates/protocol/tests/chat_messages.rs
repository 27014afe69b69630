//! Chat turns on the wire: OpenAI's message fields (null content, text
//! parts, name, tool calls, tool results, reasoning) decode from what a
//! stock msgpack client sends, old `{role, content}` turns are unchanged,
//! and values the templates cannot take are refused by validation.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use zinfer_protocol::{
    ChatMessage, ClientRequest, ContentPart, DecodeError, FunctionCall, GenerateRequest, Limits,
    MessageContent, ToolCall, decode, encode,
};

/// A `generate` frame with these messages, as a msgpack client writes it.
fn frame(messages: Value) -> Vec<u8> {
    let request = json!({"type": "generate", "id": "r", "messages": messages});
    rmp_serde::to_vec_named(&request).unwrap()
}

fn messages_of(frame: &[u8]) -> Result<Vec<ChatMessage>, DecodeError> {
    match decode::<ClientRequest>(frame, &Limits::default())? {
        ClientRequest::Generate(request) => Ok(request.messages.unwrap()),
        other => panic!("not a generate: {other:?}"),
    }
}

#[test]
fn old_role_and_content_turns_decode_and_encode_as_before() {
    let messages = messages_of(&frame(json!([{"role": "user", "content": "Hi"}]))).unwrap();
    assert_eq!(messages, [ChatMessage::new("user", "Hi")]);
    // No new key appears on the wire for a plain turn.
    let mut request = GenerateRequest::from_prompt("r", "");
    request.prompt = None;
    request.messages = Some(messages);
    let value = rmpv::decode::read_value(&mut &encode(&request).unwrap()[..]).unwrap();
    let turn = value
        .as_map()
        .unwrap()
        .iter()
        .find(|(k, _)| k.as_str() == Some("messages"))
        .unwrap()
        .1
        .as_array()
        .unwrap()[0]
        .clone();
    let keys: Vec<_> = turn
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, _)| k.as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, ["role", "content"]);
}

#[test]
fn openai_fields_decode_and_round_trip() {
    let messages = messages_of(&frame(json!([
        {"role": "user", "name": "alice", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"function": {"name": "g", "arguments": {"y": [1, 2]}}}
        ]},
        {"role": "tool", "tool_call_id": "call1", "content": "42"},
        {"role": "assistant", "reasoning_content": "because", "content": "done"}
    ])))
    .unwrap();
    let parts = MessageContent::Parts(vec![
        ContentPart {
            kind: "text".into(),
            text: Some("a".into()),
        },
        ContentPart {
            kind: "text".into(),
            text: Some("b".into()),
        },
    ]);
    assert_eq!(parts.text(), "a\nb");
    let expected = vec![
        ChatMessage {
            name: Some("alice".into()),
            content: Some(parts),
            ..ChatMessage::new("user", "")
        },
        ChatMessage {
            role: "assistant".into(),
            tool_calls: Some(vec![
                ToolCall {
                    id: Some("call1".into()),
                    kind: Some("function".into()),
                    function: FunctionCall {
                        name: "f".into(),
                        arguments: json!("{\"x\": 1}"),
                    },
                },
                ToolCall {
                    id: None,
                    kind: None,
                    function: FunctionCall {
                        name: "g".into(),
                        arguments: json!({"y": [1, 2]}),
                    },
                },
            ]),
            ..ChatMessage::default()
        },
        ChatMessage {
            tool_call_id: Some("call1".into()),
            ..ChatMessage::new("tool", "42")
        },
        ChatMessage {
            reasoning_content: Some("because".into()),
            ..ChatMessage::new("assistant", "done")
        },
    ];
    assert_eq!(messages, expected);

    let mut request = GenerateRequest::from_prompt("r", "");
    request.prompt = None;
    request.messages = Some(expected.clone());
    let back = messages_of(&encode(&ClientRequest::Generate(request)).unwrap()).unwrap();
    assert_eq!(back, expected);
}

#[test]
fn turns_templates_cannot_take_are_refused_with_a_reason() {
    let cases = [
        (
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
            "content part type \"image_url\" is not supported",
        ),
        (
            json!([{"role": "user", "content": [{"type": "text"}]}]),
            "needs \"text\"",
        ),
        (
            json!([{"role": "user", "content": null}]),
            "\"content\" is required for a \"user\" turn",
        ),
        (json!([{"role": "tool"}]), "is required for a \"tool\" turn"),
        (
            json!([{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f", "arguments": "{}"}}]}]),
            "tool call type \"code\" is not supported",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]),
            "must be a JSON string or a map",
        ),
    ];
    for (messages, why) in cases {
        let err = messages_of(&frame(messages.clone()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{messages}: {err}");
    }
    let err = messages_of(&frame(json!([{"role": "user", "content": 7}])))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a string or an array of content parts"),
        "{err}"
    );
}
