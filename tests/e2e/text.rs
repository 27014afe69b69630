//! `tokenize`, `detokenize` and `apply_template` against a real router and
//! worker on the default model, over ZeroMQ and over `zinfer serve --http`:
//! the ids are the ones `generate` feeds the model, the text comes back,
//! and the template is the chat path's.

use std::time::Duration;

use serde_json::{Value, json};
use zinfer_protocol::{
    ApplyTemplateRequest, ChatMessage, ClientReply, ClientRequest, DetokenizeRequest, DoneBody,
    ErrorCode, GenerateRequest, Piece, TokenizeRequest,
};

use crate::harness::{self, Client, Cluster, greedy};

const TEXT: &str = "The three primary colors are red, yellow and blüe — 三原色.";

fn tokenize(id: &str, content: &str, add_special: bool, with_pieces: bool) -> ClientRequest {
    ClientRequest::Tokenize(TokenizeRequest {
        id: id.into(),
        model: None,
        content: content.into(),
        add_special,
        parse_special: true,
        with_pieces,
    })
}

/// The one reply to `request`.
fn ask(client: &Client, request: &ClientRequest) -> ClientReply {
    client.send(request);
    client
        .recv(Duration::from_secs(60))
        .expect("a reply within 60 s")
}

fn tokens(client: &Client, content: &str, add_special: bool) -> Vec<u32> {
    match ask(client, &tokenize("t", content, add_special, false)) {
        ClientReply::Tokenized { tokens, .. } => tokens,
        other => panic!("expected tokenized, got {other:?}"),
    }
}

fn detokenize(client: &Client, tokens: Vec<u32>) -> String {
    let request = ClientRequest::Detokenize(DetokenizeRequest {
        id: "d".into(),
        model: None,
        tokens,
    });
    match ask(client, &request) {
        ClientReply::Detokenized { content, .. } => content,
        other => panic!("expected detokenized, got {other:?}"),
    }
}

fn messages() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Answer in one word."),
        ChatMessage::new("user", "What color is the sky?"),
    ]
}

fn template(client: &Client, add_generation_prompt: bool) -> String {
    let request = ClientRequest::ApplyTemplate(ApplyTemplateRequest {
        id: "a".into(),
        model: None,
        messages: messages(),
        add_generation_prompt,
    });
    match ask(client, &request) {
        ClientReply::AppliedTemplate { prompt, .. } => prompt,
        other => panic!("expected applied_template, got {other:?}"),
    }
}

/// Greedy `done`: (text, prompt tokens).
fn run(client: &Client, request: GenerateRequest) -> (String, u32) {
    let mut request = request;
    request.stream = false;
    match client.generate(request).terminal {
        Some(ClientReply::Done {
            body: DoneBody { text, usage, .. },
            ..
        }) => (text.unwrap_or_default(), usage.prompt_tokens),
        other => panic!("expected done, got {other:?}"),
    }
}

fn error_code(reply: ClientReply) -> ErrorCode {
    match reply {
        ClientReply::Error { code, .. } => code,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn tokenize_detokenize_and_apply_template_over_zmq() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();

    // The ids are the ones generate feeds the model: same count.
    let ids = tokens(&client, TEXT, true);
    let (_, prompt_tokens) = run(&client, greedy("g1", TEXT, 1));
    assert_eq!(ids.len(), prompt_tokens as usize);
    // SmolLM2's file asks for no BOS, so add_special changes nothing here
    // (the CLI test shows BOS coming and going on a vocabulary that has one).
    assert_eq!(tokens(&client, TEXT, false), ids);

    // Round trip, and pieces that join to the text (the non-ASCII
    // characters span byte-level tokens, some not UTF-8 alone).
    assert_eq!(detokenize(&client, ids.clone()), TEXT);
    let ClientReply::Tokenized {
        tokens: with_ids,
        pieces: Some(pieces),
        ..
    } = ask(&client, &tokenize("p", TEXT, false, true))
    else {
        panic!("expected tokenized with pieces");
    };
    assert_eq!(with_ids, ids);
    assert_eq!(pieces.len(), ids.len());
    let joined: Vec<u8> = pieces.iter().flat_map(|p| p.as_bytes().to_vec()).collect();
    assert_eq!(joined, TEXT.as_bytes());
    // Special tokens are written out, and parsed back into one id.
    let im_start = tokens(&client, "<|im_start|>", false);
    assert_eq!(im_start.len(), 1);
    assert_eq!(detokenize(&client, im_start), "<|im_start|>");

    // The template is what the chat path feeds the model: the rendered
    // prompt as plain text gives the same prompt tokens and greedy output.
    let prompt = template(&client, true);
    assert!(prompt.contains("What color is the sky?"), "{prompt}");
    let mut chat = greedy("g2", "", 8);
    chat.prompt = None;
    chat.messages = Some(messages());
    let (chat_text, chat_tokens) = run(&client, chat);
    let (text, plain_tokens) = run(&client, greedy("g3", &prompt, 8));
    assert_eq!((text, plain_tokens), (chat_text, chat_tokens));
    assert_eq!(tokens(&client, &prompt, true).len(), chat_tokens as usize);
    let bare = template(&client, false);
    assert!(prompt.starts_with(&bare) && prompt.len() > bare.len());

    // Errors carry the id and the existing codes.
    let mut unknown = TokenizeRequest {
        id: "u".into(),
        model: Some("nope".into()),
        content: "x".into(),
        add_special: true,
        parse_special: true,
        with_pieces: false,
    };
    let reply = ask(&client, &ClientRequest::Tokenize(unknown.clone()));
    assert_eq!(error_code(reply), ErrorCode::UnknownModel);
    unknown.model = None;
    unknown.content = "y".repeat(600 * 1024);
    let reply = ask(&client, &ClientRequest::Tokenize(unknown));
    assert_eq!(error_code(reply), ErrorCode::BadRequest);
    let reply = ask(
        &client,
        &ClientRequest::Detokenize(DetokenizeRequest {
            id: "v".into(),
            model: None,
            tokens: vec![1, 4_000_000],
        }),
    );
    assert_eq!(error_code(reply), ErrorCode::BadRequest);
    // The worker is fine afterwards.
    assert_eq!(detokenize(&client, ids), TEXT);
}

#[test]
fn text_endpoints_over_serve_http() {
    let _guard = harness::exclusive();
    let ports: Vec<String> = (0..6).map(|_| harness::free_port().to_string()).collect();
    let clients = format!("tcp://127.0.0.1:{}", ports[0]);
    let http = format!("127.0.0.1:{}", ports[5]);
    let _serve = harness::spawn_until(
        "zinfer serve: ready",
        &[
            "serve",
            "--threads",
            "1",
            "--kv-tokens",
            "4096",
            "--clients",
            &clients,
            "--workers",
            &format!("tcp://127.0.0.1:{}", ports[1]),
            "--control",
            &format!("tcp://127.0.0.1:{}", ports[2]),
            "--metrics",
            &format!("127.0.0.1:{}", ports[3]),
            "--worker-metrics-port",
            &ports[4],
            "--http",
            &http,
            "--model",
            &harness::model_path().display().to_string(),
        ],
    );
    let post = |path: &str, body: Value| {
        let (status, body) = harness::http_post(&http, path, &body.to_string());
        let value: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"));
        (status, value)
    };
    let client = Client::connect(&clients);

    let (status, body) = post("/tokenize", json!({"content": TEXT}));
    assert_eq!(status, 200, "{body}");
    let ids: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap();
    assert_eq!(
        ids,
        tokens(&client, TEXT, false),
        "the same ids as over ZeroMQ"
    );

    let (status, body) = post("/tokenize", json!({"content": TEXT, "with_pieces": true}));
    assert_eq!(status, 200, "{body}");
    let entries = body["tokens"].as_array().unwrap();
    assert_eq!(entries.len(), ids.len());
    let mut joined = Vec::new();
    for (entry, id) in entries.iter().zip(&ids) {
        assert_eq!(entry["id"], json!(id));
        match &entry["piece"] {
            Value::String(text) => joined.extend_from_slice(text.as_bytes()),
            Value::Array(bytes) => {
                joined.extend(bytes.iter().map(|b| b.as_u64().unwrap() as u8));
            }
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(joined, TEXT.as_bytes());
    assert!(
        entries.iter().any(|e| e["piece"].is_array()),
        "some piece is part of a character: {body}"
    );
    // The protocol's pieces say the same.
    let ClientReply::Tokenized {
        pieces: Some(pieces),
        ..
    } = ask(&client, &tokenize("p", TEXT, false, true))
    else {
        panic!("expected pieces");
    };
    assert!(pieces.iter().any(|p| matches!(p, Piece::Bytes(_))));

    let (status, body) = post("/detokenize", json!({"tokens": ids}));
    assert_eq!((status, body), (200, json!({"content": TEXT})));

    let chat = json!({"messages": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What color is the sky?"}
    ]});
    let (status, body) = post("/apply-template", chat.clone());
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["prompt"], json!(template(&client, true)));
    // What a chat completion feeds the model is that prompt: same usage.
    let prompt = body["prompt"].as_str().unwrap().to_string();
    let (_, prompt_tokens) = run(&client, greedy("g", &prompt, 1));
    let mut completion = chat;
    completion["max_tokens"] = json!(1);
    let (status, body) = post("/v1/chat/completions", completion);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], json!(prompt_tokens));

    // Errors in the front's OpenAI shape.
    let (status, body) = post("/tokenize", json!({"content": "x", "model": "nope"}));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found");
    let (status, body) = post("/detokenize", json!({"tokens": [4_000_000]}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let (status, body) = post("/tokenize", json!({"content": ["x"]}));
    assert_eq!(status, 400, "{body}");
}

/// A tokenize of a text at the 512 KiB limit runs beside a streaming
/// request without ending it, and a reply too large for one frame is an
/// error, not a dropped worker connection.
#[test]
fn a_huge_tokenize_beside_a_stream() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();
    client.start_stream("s", "Once upon a time", 48);
    let huge: String = TEXT.repeat(512 * 1024 / TEXT.len());
    client.send(&tokenize("big", &huge, true, false));
    client.send(&tokenize("bigger", &huge, true, true));
    let (mut big, mut bigger, mut done) = (None, None, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while (big.is_none() || bigger.is_none() || done.is_none())
        && std::time::Instant::now() < deadline
    {
        let Some(reply) = client.recv(Duration::from_secs(60)) else {
            break;
        };
        match &reply {
            ClientReply::Tokenized { id, tokens, .. } if id == "big" => big = Some(tokens.len()),
            ClientReply::Tokenized { id, .. } | ClientReply::Error { id: Some(id), .. }
                if id == "bigger" =>
            {
                bigger = Some(reply.clone());
            }
            ClientReply::Done {
                id,
                body: DoneBody { usage, .. },
                ..
            } if id == "s" => {
                done = Some(usage.completion_tokens);
            }
            ClientReply::Chunk { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(big.is_some_and(|n| n > 10_000), "{big:?}");
    assert_eq!(done, Some(48), "the stream ran to its end");
    match bigger {
        Some(ClientReply::Error { code, message, .. }) => {
            assert_eq!(code, ErrorCode::BadRequest);
            assert!(message.contains("frame limit"), "{message}");
        }
        Some(ClientReply::Tokenized { .. }) => {}
        other => panic!("no answer to the tokenize with pieces: {other:?}"),
    }
    // The worker kept its connection and still answers.
    assert_eq!(detokenize(&client, tokens(&client, TEXT, true)), TEXT);
}
