//! Constrained decoding over the protocol, against a real router and a
//! worker running the default model: each kind of constraint shapes the
//! output, bad ones are refused, `max_tokens` inside a structure ends with
//! `length`, and a Python DEALER client uses `constraint` too.

use std::process::Command;

use zinfer_protocol::{
    ChatMessage, ClientReply, Constraint, DoneBody, ErrorCode, FinishReason, GenerateRequest,
};

use crate::harness::{Client, Cluster, Outcome, venv_python};

fn chat(id: &str, question: &str, max_tokens: u32, constraint: Constraint) -> GenerateRequest {
    let mut request = crate::harness::greedy(id, "", max_tokens);
    request.prompt = None;
    request.messages = Some(vec![ChatMessage::new("user", question)]);
    request.constraint = Some(Box::new(constraint));
    request
}

/// The text and finish reason of a request that must end with `done`.
fn finished(client: &Client, request: GenerateRequest) -> (String, FinishReason) {
    let id = request.id.clone();
    let outcome: Outcome = client.generate(request);
    match &outcome.terminal {
        Some(ClientReply::Done {
            body: DoneBody { finish_reason, .. },
            ..
        }) => {
            let text = outcome.streamed_text();
            eprintln!("{id}: {finish_reason:?} {text:?}");
            (text, *finish_reason)
        }
        other => panic!("expected done, got {other:?}"),
    }
}

fn refused(client: &Client, request: GenerateRequest) -> String {
    match client.generate(request).terminal {
        Some(ClientReply::Error { code, message, .. }) => {
            assert_eq!(code, ErrorCode::BadRequest, "{message}");
            message
        }
        other => panic!("expected bad_request, got {other:?}"),
    }
}

/// Nested object, an enum and a bounded array.
fn person_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 20},
            "color": {"enum": ["red", "green", "blue"]},
            "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                       "minItems": 1, "maxItems": 3},
            "address": {"type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 20},
                                       "zip": {"type": "integer", "minimum": 0, "maximum": 99999}},
                        "required": ["city", "zip"], "additionalProperties": false}
        },
        "required": ["name", "color", "scores", "address"],
        "additionalProperties": false
    })
}

/// What `person_schema` asks, checked by hand.
fn assert_person(value: &serde_json::Value) {
    let object = value.as_object().expect("an object");
    assert_eq!(object.len(), 4, "{value}");
    let name = object["name"].as_str().expect("name is a string");
    assert!((1..=20).contains(&name.chars().count()), "{value}");
    assert!(
        ["red", "green", "blue"].contains(&object["color"].as_str().expect("color")),
        "{value}"
    );
    let scores = object["scores"].as_array().expect("scores");
    assert!((1..=3).contains(&scores.len()), "{value}");
    assert!(
        scores.iter().all(|s| s.as_u64().is_some_and(|s| s <= 100)),
        "{value}"
    );
    let address = object["address"].as_object().expect("address");
    assert_eq!(address.len(), 2, "{value}");
    assert!(
        address["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 20)
    );
    assert!(
        address["zip"].as_u64().is_some_and(|z| z <= 99999),
        "{value}"
    );
}

/// The Python DEALER client: a regex constraint, its output checked with
/// Python's own `re.fullmatch`.
const PYTHON_CLIENT: &str = r#"
import json, re, sys, uuid
import msgpack, zmq

sock = zmq.Context.instance().socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(sys.argv[1])
regex = r"[0-9]{3}-[0-9]{4}"
rid = uuid.uuid4().hex
sock.send(msgpack.packb({"type": "generate", "id": rid, "max_tokens": 20, "temperature": 0,
                         "messages": [{"role": "user", "content": "Give me a phone number."}],
                         "constraint": {"regex": regex}}))
text = ""
while True:
    if not sock.poll(120_000):
        raise TimeoutError("no reply")
    reply = msgpack.unpackb(sock.recv(), raw=False)
    if reply["type"] == "chunk":
        text += reply["text"]
    elif reply["type"] in ("done", "error"):
        break
sock.send(msgpack.packb({"type": "generate", "id": "g", "prompt": "x",
                         "constraint": {"gbnf": "root ::= \"a\""}}))
refusal = msgpack.unpackb(sock.recv(), raw=False) if sock.poll(30_000) else None
print(json.dumps({"text": text, "reply": reply["type"],
                  "finish": reply.get("finish_reason"),
                  "matches": re.fullmatch(regex, text) is not None,
                  "refusal": [refusal["code"], refusal["message"]] if refusal else None}))
"#;

#[test]
fn constrained_requests_over_the_protocol_and_from_python() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();

    // regex: the whole output matches.
    let (text, reason) = finished(
        &client,
        chat(
            "re",
            "What is a phone number I can call?",
            30,
            Constraint::regex("\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}"),
        ),
    );
    assert_eq!(reason, FinishReason::Stop, "{text:?}");
    let bytes = text.as_bytes();
    assert_eq!(bytes.len(), 14, "{text:?}");
    let digits = [1, 2, 3, 6, 7, 8, 10, 11, 12, 13];
    assert!(
        digits.iter().all(|&i| bytes[i].is_ascii_digit()),
        "{text:?}"
    );
    assert_eq!(
        (bytes[0], bytes[4], bytes[5], bytes[9]),
        (b'(', b')', b' ', b'-'),
        "{text:?}"
    );

    // lark: a sum of small numbers, then "=" and a number.
    let lark = r#"
start: sum " = " NUMBER
sum: NUMBER (" + " NUMBER)+
NUMBER: /[0-9]{1,3}/
"#;
    let (text, reason) = finished(
        &client,
        chat("lark", "Write an addition.", 40, Constraint::lark(lark)),
    );
    assert_eq!(reason, FinishReason::Stop, "{text:?}");
    let (sum, total) = text.split_once(" = ").expect("an = sign");
    let number = |n: &str| !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit());
    assert!(number(total), "{text:?}");
    let terms: Vec<&str> = sum.split(" + ").collect();
    assert!(
        terms.len() >= 2 && terms.iter().all(|t| number(t)),
        "{text:?}"
    );

    // json_schema: parses and validates.
    let question = "Describe a person as JSON: name, favourite color, test scores, address.";
    let (text, reason) = finished(
        &client,
        chat(
            "js",
            question,
            150,
            Constraint::json_schema(person_schema()),
        ),
    );
    assert_eq!(reason, FinishReason::Stop, "{text:?}");
    let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_person(&value);

    // json_object: any object.
    let (text, reason) = finished(
        &client,
        chat(
            "jo",
            "Give me a JSON object about cats.",
            80,
            Constraint::json_object(),
        ),
    );
    if reason == FinishReason::Stop {
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert!(value.is_object(), "{text:?}");
    } else {
        assert!(text.starts_with('{'), "{text:?}");
    }

    // max_tokens inside the structure: length, and a prefix.
    let (text, reason) = finished(
        &client,
        chat(
            "short",
            question,
            6,
            Constraint::json_schema(person_schema()),
        ),
    );
    assert_eq!(reason, FinishReason::Length, "{text:?}");
    assert!(text.starts_with("{\""), "{text:?}");
    assert!(serde_json::from_str::<serde_json::Value>(&text).is_err());

    // Refusals: a schema that does not compile (from the worker), GBNF and
    // two keys (from the router's validation).
    let bad = serde_json::json!({"type": "object", "properties": {"a": {"type": "nope"}}});
    let message = refused(&client, chat("bad", "x", 4, Constraint::json_schema(bad)));
    assert!(message.contains("does not compile"), "{message}");
    let mut two = Constraint::regex("a");
    two.lark = Some("start: \"a\"".into());
    let message = refused(&client, chat("two", "x", 4, two));
    assert!(message.contains("exactly one"), "{message}");

    // The worker keeps serving unconstrained requests.
    let outcome = client.generate(crate::harness::greedy("plain", "Hello", 3));
    assert!(matches!(outcome.terminal, Some(ClientReply::Done { .. })));

    let python = venv_python("client");
    let output = Command::new(&python)
        .args(["-c", PYTHON_CLIENT, &cluster.clients])
        .output()
        .expect("running the client venv's python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("python: {stdout}");
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON line");
    assert_eq!(result["reply"], "done", "{result}");
    assert_eq!(result["finish"], "stop", "{result}");
    assert_eq!(result["matches"], true, "{result}");
    assert_eq!(result["refusal"][0], "bad_request", "{result}");
    assert!(
        result["refusal"][1]
            .as_str()
            .is_some_and(|m| m.contains("GBNF is not supported; use lark")),
        "{result}"
    );
}

/// OpenAI's `response_format` through `zinfer http`, driven by the
/// official `openai` package: `json_schema` (strict) output validates,
/// `json_object` output is an object, a schema that does not compile is a
/// 400.
const OPENAI_CHECK: &str = r#"
import json, sys
import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
schema = json.loads(sys.argv[2])
ask = [{"role": "user", "content": "Describe a person as JSON."}]
out = {}
reply = client.chat.completions.create(
    model="smol", messages=ask, max_tokens=150, temperature=0,
    response_format={"type": "json_schema",
                     "json_schema": {"name": "person", "strict": True, "schema": schema}})
out["schema_text"] = reply.choices[0].message.content
out["schema_finish"] = reply.choices[0].finish_reason
stream = client.chat.completions.create(
    model="smol", messages=[{"role": "user", "content": "A JSON object about dogs."}],
    max_tokens=80, temperature=0, stream=True, response_format={"type": "json_object"})
out["object_text"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
try:
    client.chat.completions.create(
        model="smol", messages=ask, max_tokens=5,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "bad", "schema": {"type": "nope"}}})
    out["bad"] = None
except openai.BadRequestError as e:
    out["bad"] = [e.status_code, str(e)]
print(json.dumps(out))
"#;

#[test]
fn openai_response_format_through_the_http_front() {
    let python = venv_python("openai");
    let cluster = Cluster::start("cache_aware", 1);
    let front = crate::harness::http_front(&cluster);
    let base = front.base_url();
    let output = Command::new(&python)
        .args(["-c", OPENAI_CHECK, &base, &person_schema().to_string()])
        .output()
        .expect("running the openai venv's python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("openai: {stdout}");
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON line");
    assert_eq!(result["schema_finish"], "stop", "{result}");
    let text = result["schema_text"].as_str().expect("text");
    assert_person(&serde_json::from_str(text).expect("JSON"));
    let text = result["object_text"].as_str().expect("text");
    assert!(text.starts_with('{'), "{result}");
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
        assert!(value.is_object(), "{result}");
    }
    assert_eq!(result["bad"][0], 400, "{result}");
    assert!(
        result["bad"][1]
            .as_str()
            .is_some_and(|m| m.contains("does not compile")),
        "{result}"
    );
}
