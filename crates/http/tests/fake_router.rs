//! The HTTP front against a scripted router: a ZeroMQ ROUTER socket in a
//! thread that answers with fixed chunks, so the whole front (axum, the I/O
//! thread, the encoders) runs without a model.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub
)]

mod event_grammars;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use event_grammars::{check_message_stream, check_response_stream, dechunk, named_events};
use serde_json::{Value, json};
use zinfer_http::{HttpConfig, HttpServer};
use zinfer_protocol::{
    ChunkBody, ClientReply, ClientRequest, DoneBody, ErrorCode, FinishReason, Limits, ModelInfo,
    Piece, Timings, Usage,
};

/// Answers `models`, and `generate` with "Hel" + "lo" then `done`; the
/// model "nope" is unknown; the prompt "hang" gets one chunk and no end.
/// Every `cancel` id goes to the returned channel.
fn fake_router() -> (String, mpsc::Receiver<String>) {
    fake_router_at("tcp://127.0.0.1:*")
}

/// [`fake_router`] bound to `endpoint`.
fn fake_router_at(endpoint: &str) -> (String, mpsc::Receiver<String>) {
    let context = zmq::Context::new();
    let socket = context.socket(zmq::ROUTER).unwrap();
    socket.bind(endpoint).unwrap();
    let endpoint = socket.get_last_endpoint().unwrap().unwrap();
    let (cancels, cancelled) = mpsc::channel();
    std::thread::spawn(move || {
        let _context = context;
        loop {
            let Ok(frames) = socket.recv_multipart(0) else {
                return;
            };
            let [peer, frame] = frames.as_slice() else {
                continue;
            };
            let send = |reply: ClientReply| {
                let bytes = zinfer_protocol::encode(&reply).unwrap();
                socket.send_multipart([peer.as_slice(), &bytes], 0).unwrap();
            };
            match zinfer_protocol::decode::<ClientRequest>(frame, &Limits::default()).unwrap() {
                ClientRequest::Models { id } => send(ClientReply::Models {
                    id,
                    models: vec![ModelInfo {
                        name: "smol".into(),
                        workers: 1,
                        context_length: Some(8192),
                        vocab_size: Some(49152),
                        state: None,
                    }],
                }),
                ClientRequest::Generate(request) => {
                    let id = request.id.clone();
                    if request.model.as_deref() == Some("nope") {
                        send(ClientReply::Error {
                            id: Some(id),
                            code: ErrorCode::UnknownModel,
                            message: "no worker serves \"nope\"".into(),
                            retryable: false,
                        });
                        continue;
                    }
                    // Rerank: model "plain" is no reranker; else a
                    // document's score is its length / 100 and its
                    // prompt tokens are its length.
                    if request.embed == Some(zinfer_protocol::Pooling::Rank) {
                        if request.model.as_deref() == Some("plain") {
                            send(ClientReply::Error {
                                id: Some(id),
                                code: ErrorCode::BadRequest,
                                message: "the model is not a reranker".into(),
                                retryable: false,
                            });
                            continue;
                        }
                        let length = request.document.as_deref().unwrap_or_default().len();
                        let score = length as f32 / 100.0;
                        send(ClientReply::Done {
                            id,
                            body: DoneBody {
                                embedding: Some(vec![score, 1.0 - score]),
                                ..DoneBody::new(
                                    FinishReason::Stop,
                                    Usage {
                                        prompt_tokens: length as u32,
                                        cached_tokens: 0,
                                        completion_tokens: 0,
                                    },
                                    Timings::default(),
                                )
                            },
                        });
                        continue;
                    }
                    assert!(request.stream, "the front always streams from the router");
                    let chunk = |index: u32, text: &str| ClientReply::Chunk {
                        id: id.clone(),
                        body: ChunkBody {
                            index,
                            text: text.into(),
                            tokens: vec![index],
                            ..ChunkBody::default()
                        },
                    };
                    if request.max_tokens == 0 {
                        // Nothing to generate: the prompt is only counted.
                        send(ClientReply::Done {
                            id,
                            body: DoneBody::new(
                                FinishReason::Length,
                                Usage {
                                    prompt_tokens: 5,
                                    cached_tokens: 0,
                                    completion_tokens: 0,
                                },
                                Timings::default(),
                            ),
                        });
                        continue;
                    }
                    let thinking = request
                        .chat_template_kwargs
                        .as_ref()
                        .is_some_and(|kwargs| kwargs.get("enable_thinking") == Some(&json!(true)));
                    if thinking {
                        send(ClientReply::Chunk {
                            id: id.clone(),
                            body: ChunkBody {
                                reasoning: "Hmm.".into(),
                                tokens: vec![9],
                                ..ChunkBody::default()
                            },
                        });
                    }
                    send(chunk(u32::from(thinking), "Hel"));
                    if request.prompt.as_deref() == Some("hang") {
                        continue;
                    }
                    send(chunk(1 + u32::from(thinking), "lo"));
                    // With tools, a call to the first; with stop strings,
                    // a stop; else the length ran out.
                    let mut finish = FinishReason::Length;
                    if let Some(tool) = request.tools.first() {
                        send(ClientReply::Chunk {
                            id: id.clone(),
                            body: ChunkBody {
                                index: 2 + u32::from(thinking),
                                tokens: vec![7],
                                tool_calls: vec![zinfer_protocol::ToolCall {
                                    id: Some("call_1".into()),
                                    kind: Some("function".into()),
                                    function: zinfer_protocol::FunctionCall {
                                        name: tool.function.name.clone(),
                                        arguments: json!("{\"city\":\"Paris\"}"),
                                    },
                                }],
                                ..ChunkBody::default()
                            },
                        });
                        finish = FinishReason::ToolCalls;
                    } else if !request.stop.is_empty() {
                        finish = FinishReason::Stop;
                    }
                    send(ClientReply::Done {
                        id,
                        body: DoneBody {
                            worker: Some("w0".into()),
                            ..DoneBody::new(
                                finish,
                                Usage {
                                    prompt_tokens: 5,
                                    cached_tokens: 3,
                                    completion_tokens: 2,
                                },
                                Timings::default(),
                            )
                        },
                    });
                }
                ClientRequest::Cancel { id } => {
                    let _ = cancels.send(id);
                }
                ClientRequest::Ping { id } => send(ClientReply::Pong { id }),
                // Byte-level text: id = byte; a model "nope" is unknown.
                ClientRequest::Tokenize(request) if request.model.as_deref() == Some("nope") => {
                    send(ClientReply::Error {
                        id: Some(request.id),
                        code: ErrorCode::UnknownModel,
                        message: "no worker serves \"nope\"".into(),
                        retryable: false,
                    });
                }
                ClientRequest::Tokenize(request) => {
                    let bytes = request.content.as_bytes();
                    let mut tokens: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
                    if request.add_special {
                        tokens.insert(0, 256);
                    }
                    let pieces = request.with_pieces.then(|| {
                        tokens
                            .iter()
                            .map(|&t| match u8::try_from(t) {
                                Ok(b) => Piece::from_bytes(vec![b]),
                                Err(_) => Piece::Text("<s>".into()),
                            })
                            .collect()
                    });
                    send(ClientReply::Tokenized {
                        id: request.id,
                        tokens,
                        pieces,
                    });
                }
                ClientRequest::Detokenize(request) => {
                    let bytes: Vec<u8> = request
                        .tokens
                        .iter()
                        .filter_map(|&t| u8::try_from(t).ok())
                        .collect();
                    send(ClientReply::Detokenized {
                        id: request.id,
                        content: String::from_utf8_lossy(&bytes).into_owned(),
                    });
                }
                ClientRequest::ApplyTemplate(request) => {
                    let mut prompt: String = request
                        .messages
                        .iter()
                        .map(|m| {
                            format!(
                                "{}: {}\n",
                                m.role,
                                m.content.as_ref().map(|c| c.text()).unwrap_or_default()
                            )
                        })
                        .collect();
                    if request.add_generation_prompt {
                        prompt.push_str("assistant:");
                    }
                    send(ClientReply::AppliedTemplate {
                        id: request.id,
                        prompt,
                    });
                }
                // The front sends embeddings as `generate` with `embed`.
                ClientRequest::Embed(request) => send(ClientReply::Error {
                    id: Some(request.id),
                    code: ErrorCode::BadRequest,
                    message: "the fake router serves no embed".into(),
                    retryable: false,
                }),
            }
        }
    });
    (endpoint, cancelled)
}

/// Starts the front on a runtime of its own thread; returns its address.
fn start_front(api_key: Option<&str>) -> (SocketAddr, mpsc::Receiver<String>) {
    let (router, cancelled) = fake_router();
    let config = HttpConfig {
        router,
        listen: "127.0.0.1:0".parse().unwrap(),
        api_key: api_key.map(str::to_string),
        served_model_name: Some("alias".into()),
        reply_timeout: Duration::from_secs(10),
        header_timeout: Duration::from_secs(15),
        curve: None,
    };
    (serve(config), cancelled)
}

/// Runs a front with `config` on a runtime of its own thread; returns its address.
fn serve(config: HttpConfig) -> SocketAddr {
    let (addr_tx, addr_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let server = HttpServer::bind(config).await.unwrap();
            addr_tx.send(server.local_addr().unwrap()).unwrap();
            server.run(std::future::pending()).await.unwrap();
        });
    });
    addr_rx.recv().unwrap()
}

/// One HTTP/1.1 request; returns (status, body).
fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    key: Option<&str>,
) -> (u16, String) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth
        .iter()
        .map(|auth| ("Authorization", auth.as_str()))
        .collect();
    let (status, _, body) = call_with(addr, method, path, body, &headers);
    (status, body)
}

/// One HTTP/1.1 request with extra `headers`; returns (status, the
/// response's headers lower-cased, body).
fn call_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, head.to_ascii_lowercase(), body)
}

/// The value of header `name` (lower case) in a lower-cased head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn chat_non_streaming_and_streaming() {
    let (addr, _) = start_front(None);
    let request = json!({"model": "alias", "messages": [{"role": "user", "content": "Hi"}]});
    let (status, body) = call(addr, "POST", "/v1/chat/completions", Some(&request), None);
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "alias");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 3);

    let mut request = request;
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true});
    let (status, body) = call(addr, "POST", "/v1/chat/completions", Some(&request), None);
    assert_eq!(status, 200, "{body}");
    let events = events(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    let parsed: Vec<Value> = events[..events.len() - 1].iter().map(|e| json(e)).collect();
    let text: String = parsed
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello");
    assert_eq!(parsed[parsed.len() - 1]["usage"]["completion_tokens"], 2);
}

#[test]
fn completions_models_health_ready() {
    let (addr, _) = start_front(None);
    let (status, body) = call(
        addr,
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "x"})),
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["choices"][0]["text"], "Hello");
    let (status, body) = call(addr, "GET", "/v1/models", None, None);
    assert_eq!(status, 200, "{body}");
    let ids: Vec<_> = json(&body)["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["alias", "smol"]);
    assert_eq!(call(addr, "GET", "/health", None, None).0, 200);
    let (status, body) = call(addr, "GET", "/ready", None, None);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn errors_are_openai_shaped() {
    let (addr, _) = start_front(None);
    let bad = json!({"messages": [{"role": "user", "content": "x"}], "n": 17});
    let (status, body) = call(addr, "POST", "/v1/chat/completions", Some(&bad), None);
    assert_eq!(status, 400, "{body}");
    assert_eq!(json(&body)["error"]["param"], "n");
    let unknown =
        json!({"model": "nope", "messages": [{"role": "user", "content": "x"}], "stream": true});
    let (status, body) = call(addr, "POST", "/v1/chat/completions", Some(&unknown), None);
    assert_eq!(status, 404, "{body}");
    assert_eq!(json(&body)["error"]["code"], "model_not_found");
    let (status, body) = call(addr, "GET", "/v2/nothing", None, None);
    assert_eq!(status, 404, "{body}");
    assert!(json(&body)["error"]["message"].is_string());
}

#[test]
fn no_router_is_a_fast_503() {
    // An IPC path nobody binds: a free TCP port could be taken by another
    // test's router between choosing it and the front's connect.
    let nobody = std::env::temp_dir().join(format!("zinfer-no-router-{}", std::process::id()));
    let addr = serve(HttpConfig {
        router: format!("ipc://{}", nobody.display()),
        listen: "127.0.0.1:0".parse().unwrap(),
        api_key: None,
        served_model_name: None,
        reply_timeout: Duration::from_secs(60),
        header_timeout: Duration::from_secs(15),
        curve: None,
    });
    let started = std::time::Instant::now();
    let request = json!({"messages": [{"role": "user", "content": "x"}]});
    let (status, body) = call(addr, "POST", "/v1/chat/completions", Some(&request), None);
    assert_eq!(status, 503, "{body}");
    assert_eq!(json(&body)["error"]["code"], "unavailable");
    assert_eq!(call(addr, "GET", "/ready", None, None).0, 503);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A front whose router comes up a moment after it (or whose DEALER has not
/// connected yet) waits for the connection instead of answering 503: model
/// listings and generation alike.
#[test]
fn a_router_that_starts_after_the_front_still_answers() {
    // IPC, so no other test's router can take the endpoint in the 300 ms
    // before this one binds it.
    let path = std::env::temp_dir().join(format!("zinfer-late-router-{}", std::process::id()));
    let router = format!("ipc://{}", path.display());
    let addr = serve(HttpConfig {
        router: router.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        api_key: None,
        served_model_name: None,
        reply_timeout: Duration::from_secs(10),
        header_timeout: Duration::from_secs(15),
        curve: None,
    });
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let (_endpoint, cancelled) = fake_router_at(&router);
        // Keep the router's cancel channel open for the test's duration.
        std::thread::sleep(Duration::from_secs(30));
        drop(cancelled);
    });
    let (status, body) = call(addr, "GET", "/v1/models", None, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["data"][0]["id"], "smol");
    let request = json!({"messages": [{"role": "user", "content": "x"}]});
    let (status, body) = call(addr, "POST", "/v1/chat/completions", Some(&request), None);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn the_api_key_guards_v1_only() {
    let (addr, _) = start_front(Some("sekrit"));
    let (status, body) = call(addr, "GET", "/v1/models", None, None);
    assert_eq!(status, 401, "{body}");
    assert_eq!(json(&body)["error"]["code"], "invalid_api_key");
    assert_eq!(call(addr, "GET", "/v1/models", None, Some("wrong")).0, 401);
    assert_eq!(call(addr, "GET", "/v1/models", None, Some("sekrit")).0, 200);
    assert_eq!(call(addr, "GET", "/health", None, None).0, 200);
}

#[test]
fn a_client_that_goes_away_cancels_its_request() {
    let (addr, cancelled) = start_front(None);
    for stream in [true, false] {
        let mut socket = TcpStream::connect(addr).unwrap();
        let body = json!({"prompt": "hang", "max_tokens": 50, "stream": stream}).to_string();
        write!(
            socket,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        if stream {
            // Wait for the headers and the first event, then hang up.
            let mut buf = [0u8; 512];
            let n = socket.read(&mut buf).unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        } else {
            std::thread::sleep(Duration::from_millis(300));
        }
        drop(socket);
        let id = cancelled
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no cancel reached the router (stream: {stream})"));
        assert!(id.starts_with("h-"), "{id}");
    }
}

#[test]
fn tokenize_detokenize_and_apply_template_in_llama_servers_shapes() {
    let (addr, _) = start_front(Some("k"));
    let key = Some("k");
    let (status, body) = call(
        addr,
        "POST",
        "/tokenize",
        Some(&serde_json::json!({"content": "h\u{e9}"})),
        key,
    );
    assert_eq!(status, 200, "{body}");
    // llama-server's default: no BOS.
    assert_eq!(json(&body), serde_json::json!({"tokens": [104, 195, 169]}));
    let (status, body) = call(
        addr,
        "POST",
        "/tokenize",
        Some(&serde_json::json!({"content": "h\u{e9}", "add_special": true, "with_pieces": true})),
        key,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"tokens": [
            {"id": 256, "piece": "<s>"},
            {"id": 104, "piece": "h"},
            {"id": 195, "piece": [195]},
            {"id": 169, "piece": [169]},
        ]})
    );
    let (status, body) = call(
        addr,
        "POST",
        "/detokenize",
        Some(&serde_json::json!({"tokens": [104, 105]})),
        key,
    );
    assert_eq!(
        (status, json(&body)),
        (200, serde_json::json!({"content": "hi"}))
    );
    let (status, body) = call(
        addr,
        "POST",
        "/apply-template",
        Some(&serde_json::json!({"messages": [{"role": "user", "content": "Hi"}]})),
        key,
    );
    assert_eq!(
        (status, json(&body)),
        (200, serde_json::json!({"prompt": "user: Hi\nassistant:"}))
    );
    // Errors in the OpenAI shape: a router error, a bad body, the API key.
    let (status, body) = call(
        addr,
        "POST",
        "/tokenize",
        Some(&serde_json::json!({"content": "x", "model": "nope"})),
        key,
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(json(&body)["error"]["code"], "model_not_found");
    let (status, body) = call(
        addr,
        "POST",
        "/tokenize",
        Some(&serde_json::json!({"content": 5})),
        key,
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(json(&body)["error"]["type"], "invalid_request_error");
    let (status, _) = call(
        addr,
        "POST",
        "/tokenize",
        Some(&serde_json::json!({"content": "x"})),
        None,
    );
    assert_eq!(status, 401);
}

#[test]
fn every_response_names_its_request() {
    let (addr, _) = start_front(Some("k"));
    let auth = [("Authorization", "Bearer k")];
    let request = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let (status, head, _) = call_with(addr, "POST", "/v1/chat/completions", Some(&request), &auth);
    assert_eq!(status, 200);
    let own = header(&head, "x-request-id").unwrap();
    assert!(own.starts_with("h-"), "{head}");
    let (_, head, _) = call_with(addr, "GET", "/v1/models", None, &auth);
    let other = header(&head, "x-request-id").unwrap();
    assert_ne!(own, other, "each request its own id");
    // The client's own id comes back, on errors too (no key: 401; no route).
    for (path, status) in [("/v1/models", 401), ("/v9/x", 404), ("/health", 200)] {
        let (got, head, _) = call_with(addr, "GET", path, None, &[("X-Request-Id", "trace-42")]);
        assert_eq!(got, status, "{path}");
        assert_eq!(header(&head, "x-request-id"), Some("trace-42"), "{path}");
    }
}

#[test]
fn a_model_is_retrieved_by_id_and_an_unknown_one_is_openais_404() {
    let (addr, _) = start_front(None);
    for id in ["smol", "alias"] {
        let (status, body) = call(addr, "GET", &format!("/v1/models/{id}"), None, None);
        assert_eq!(status, 200, "{body}");
        let body = json(&body);
        assert_eq!(
            (body["id"].as_str(), body["object"].as_str()),
            (Some(id), Some("model"))
        );
        assert_eq!(body["owned_by"], "zinfer");
    }
    let (status, body) = call(addr, "GET", "/v1/models/org/gpt-x", None, None);
    assert_eq!(status, 404, "{body}");
    let error = &json(&body)["error"];
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["type"], "invalid_request_error");
    assert!(
        error["message"].as_str().unwrap().contains("org/gpt-x"),
        "{error}"
    );
}

#[test]
fn the_404_lists_every_route() {
    let (addr, _) = start_front(None);
    let (status, body) = call(addr, "GET", "/v2/nothing", None, None);
    assert_eq!(status, 404);
    let message = json(&body)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    for route in zinfer_http::server::ROUTES {
        assert!(message.contains(route), "{route} missing from {message}");
        let (method, path) = route.split_once(' ').unwrap();
        let path = path.replace("{id}", "smol");
        let body = (method == "POST").then(|| json!({}));
        let (status, text) = call(addr, method, &path, body.as_ref(), None);
        // A stored response that is not there is a 404 of its own.
        let unrouted = status == 404 && text.contains("no route for");
        assert!(!unrouted, "{route} is listed but not served: {text}");
    }
    assert!(message.contains("/v1/embeddings"));
}

/// `/v1/rerank`, `/rerank` and `/v1/score`: one rank request per
/// document with the query; results sorted by score (the fake router's is
/// the document's length / 100), cut to `top_n`, documents echoed when
/// asked; a model that is no reranker is a 400 that says so.
#[test]
fn rerank_sorts_documents_by_their_scores() {
    let (addr, _) = start_front(None);
    let request = json!({
        "model": "smol",
        "query": "what is it?",
        "documents": ["a bb", {"text": "a much longer document"}, "mid length"],
        "top_n": 2,
        "return_documents": true
    });
    for route in ["/v1/rerank", "/rerank", "/v1/score"] {
        let (status, body) = call(addr, "POST", route, Some(&request), None);
        assert_eq!(status, 200, "{route}: {body}");
        let body = json(&body);
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 2, "{body}");
        assert_eq!(results[0]["index"], 1);
        assert_eq!(results[0]["document"]["text"], "a much longer document");
        assert!((results[0]["relevance_score"].as_f64().unwrap() - 0.22).abs() < 1e-6);
        assert_eq!(results[1]["index"], 2);
        assert_eq!(body["usage"]["prompt_tokens"], 4 + 22 + 10);
        assert_eq!(body["model"], "smol");
    }
    let plain = json!({"model": "plain", "query": "q", "documents": ["d"]});
    let (status, body) = call(addr, "POST", "/v1/rerank", Some(&plain), None);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not a reranker"), "{body}");
    let (status, body) = call(
        addr,
        "POST",
        "/v1/rerank",
        Some(&json!({"query": "q"})),
        None,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("documents"), "{body}");
}

/// lm-eval and batch clients send a list of prompts (text or token ids):
/// one choice per prompt, numbered in order, the usage summed; token-id
/// prompts are echoed as their text.
#[test]
fn completions_take_a_list_of_prompts_and_echo_token_ids() {
    let (addr, _) = start_front(None);
    let request = json!({"prompt": ["a", [104, 105], "c"], "echo": true});
    let (status, body) = call(addr, "POST", "/v1/completions", Some(&request), None);
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    let choices = body["choices"].as_array().unwrap();
    let texts: Vec<_> = choices
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["aHello", "hiHello", "cHello"]);
    let indices: Vec<_> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2]);
    assert_eq!(
        body["usage"]["prompt_tokens"], 15,
        "each prompt counted once"
    );
    assert_eq!(body["usage"]["completion_tokens"], 6);

    let request = json!({"prompt": [[1], [2]], "stream": true,
        "stream_options": {"include_usage": true}});
    let (status, body) = call(addr, "POST", "/v1/completions", Some(&request), None);
    assert_eq!(status, 200, "{body}");
    let events = events(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    let parsed: Vec<Value> = events[..events.len() - 1].iter().map(|e| json(e)).collect();
    for index in 0..2 {
        let text: String = parsed
            .iter()
            .filter_map(|e| e["choices"].as_array()?.first().cloned())
            .filter(|c| c["index"] == index)
            .filter_map(|c| c["text"].as_str().map(str::to_string))
            .collect();
        assert_eq!(text, "Hello", "choice {index}");
    }
    let finishes = parsed
        .iter()
        .filter(|e| !e["choices"][0]["finish_reason"].is_null())
        .count();
    assert_eq!(finishes, 2);
    assert_eq!(parsed.last().unwrap()["usage"]["prompt_tokens"], 10);
    // One prompt unknown to the router fails the whole request.
    let request = json!({"model": "nope", "prompt": ["a", "b"]});
    let (status, _) = call(addr, "POST", "/v1/completions", Some(&request), None);
    assert_eq!(status, 404);
}

#[test]
fn anthropic_messages_whole_and_streamed() {
    let (addr, _) = start_front(Some("k"));
    let key = [("x-api-key", "k")];
    let request = json!({"model": "alias", "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "Hi"}]});
    let (status, _, body) = call_with(addr, "POST", "/v1/messages", Some(&request), &key);
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["model"], "alias");
    assert!(body["id"].as_str().unwrap().starts_with("msg_"), "{body}");
    assert_eq!(body["content"], json!([{"type": "text", "text": "Hello"}]));
    assert_eq!(body["stop_reason"], "max_tokens");
    assert!(body["stop_sequence"].is_null());
    assert_eq!(body["usage"]["input_tokens"], 2, "uncached prompt tokens");
    assert_eq!(body["usage"]["cache_read_input_tokens"], 3);
    assert_eq!(body["usage"]["output_tokens"], 2);

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, head, body) = call_with(addr, "POST", "/v1/messages", Some(&streamed), &key);
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("text/event-stream"), "{head}");
    let events = named_events(&body);
    assert!(events.iter().any(|(name, _)| name == "ping"));
    let (blocks, delta) = check_message_stream(&events);
    assert_eq!(blocks, [("text".to_string(), "Hello".to_string())]);
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 2);

    // A stop sequence, thinking, tools with a forced choice.
    let tools = json!([{"name": "get_weather", "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let request = json!({"model": "alias", "max_tokens": 64, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": tools, "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let (status, _, body) = call_with(addr, "POST", "/v1/messages", Some(&request), &key);
    assert_eq!(status, 200, "{body}");
    let (blocks, delta) = check_message_stream(&named_events(&body));
    let kinds: Vec<&str> = blocks.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"], "{blocks:?}");
    assert_eq!(blocks[0].1, "Hmm.");
    assert_eq!(json(&blocks[2].1), json!({"city": "Paris"}));
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    let mut whole = request.clone();
    whole["stream"] = json!(false);
    let (status, _, body) = call_with(addr, "POST", "/v1/messages", Some(&whole), &key);
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(
        body["content"][0],
        json!({"type": "thinking", "thinking": "Hmm.", "signature": ""})
    );
    assert_eq!(
        body["content"][2],
        json!({"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}})
    );
    let request = json!({"model": "alias", "max_tokens": 64, "stop_sequences": ["\n\nHuman:"],
        "messages": [{"role": "user", "content": "Hi"}]});
    let (status, _, body) = call_with(addr, "POST", "/v1/messages", Some(&request), &key);
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["stop_reason"], "stop_sequence");
    assert_eq!(body["stop_sequence"], "\n\nHuman:");
}

#[test]
fn anthropic_history_tools_and_errors() {
    let (addr, _) = start_front(Some("k"));
    let key = [("x-api-key", "k")];
    // A whole tool round trip in the history.
    let request = json!({"model": "alias", "max_tokens": 16, "metadata": {"user_id": "u-1"},
        "tool_choice": {"type": "auto"}, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Call f."}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should.", "signature": "x"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                {"type": "text", "text": "And now?"}]}]});
    let (status, _, body) = call_with(addr, "POST", "/v1/messages", Some(&request), &key);
    assert_eq!(status, 200, "{body}");
    // Errors in Anthropic's shape: a missing max_tokens, an image, a
    // server tool, a bad key, an unknown model.
    let user = json!([{"role": "user", "content": "Hi"}]);
    for (body, status, kind, words) in [
        (
            json!({"messages": user}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}),
            400,
            "invalid_request_error",
            "image",
        ),
        (
            json!({"max_tokens": 5, "messages": user,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            400,
            "invalid_request_error",
            "web_search_20250305",
        ),
        (
            json!({"max_tokens": 5, "messages": user, "model": "nope"}),
            404,
            "not_found_error",
            "nope",
        ),
    ] {
        let (got, _, text) = call_with(addr, "POST", "/v1/messages", Some(&body), &key);
        assert_eq!(got, status, "{text}");
        let error = json(&text);
        assert_eq!(error["type"], "error", "{text}");
        assert_eq!(error["error"]["type"], kind, "{text}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(words),
            "{text}"
        );
    }
    let (status, _, text) = call_with(
        addr,
        "POST",
        "/v1/messages",
        Some(&json!({"max_tokens": 5, "messages": user})),
        &[("x-api-key", "wrong")],
    );
    assert_eq!(status, 401);
    assert_eq!(json(&text)["error"]["type"], "authentication_error");
    // The bearer token works too; count_tokens needs no max_tokens.
    let (status, _, text) = call_with(
        addr,
        "POST",
        "/v1/messages/count_tokens",
        Some(&json!({"messages": user})),
        &[("Authorization", "Bearer k")],
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(json(&text), json!({"input_tokens": 5}));
}

#[test]
fn openai_responses_whole_and_streamed() {
    let (addr, _) = start_front(None);
    let request = json!({"model": "alias", "input": "Hi", "instructions": "Be brief.",
        "max_output_tokens": 64, "store": false, "truncation": "disabled",
        "include": ["reasoning.encrypted_content"]});
    let (status, body) = call(addr, "POST", "/v1/responses", Some(&request), None);
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["object"], "response");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"), "{body}");
    assert_eq!(
        body["status"], "incomplete",
        "the fake router's length ran out"
    );
    assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
    let message = &body["output"][0];
    assert_eq!(message["type"], "message");
    assert_eq!(
        message["content"][0],
        json!({"type": "output_text", "text": "Hello", "annotations": []})
    );
    assert_eq!(body["usage"]["input_tokens"], 5);
    assert_eq!(body["usage"]["input_tokens_details"]["cached_tokens"], 3);
    assert_eq!(body["usage"]["total_tokens"], 7);

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, body) = call(addr, "POST", "/v1/responses", Some(&streamed), None);
    assert_eq!(status, 200, "{body}");
    let (items, response) = check_response_stream(&named_events(&body));
    assert_eq!(items, [("message".to_string(), "Hello".to_string())]);
    assert_eq!(response["status"], "incomplete");

    // History with a call and its output; reasoning and a forced function.
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let input = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny"},
        {"type": "message", "role": "user", "content": "And Paris?"}]);
    let request = json!({"model": "alias", "input": input, "tools": tools, "stream": true,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "reasoning": {"effort": "low", "summary": "auto"},
        "text": {"format": {"type": "text"}}});
    let (status, body) = call(addr, "POST", "/v1/responses", Some(&request), None);
    assert_eq!(status, 200, "{body}");
    let (items, response) = check_response_stream(&named_events(&body));
    let kinds: Vec<&str> = items.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(kinds, ["message", "function_call"], "{items:?}");
    assert_eq!(json(&items[1].1), json!({"city": "Paris"}));
    assert_eq!(response["status"], "completed");
    let call_item = &response["output"][1];
    assert_eq!(call_item["call_id"], "call_1");
    assert_eq!(call_item["name"], "get_weather");
    let mut whole = request.clone();
    whole["stream"] = json!(false);
    let (status, body) = call(addr, "POST", "/v1/responses", Some(&whole), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json(&body)["output"][1]["arguments"],
        "{\"city\":\"Paris\"}"
    );

    // Refused by name: built-in tools, stored state, images.
    for (body, param) in [
        (
            json!({"input": "x", "tools": [{"type": "web_search_preview"}]}),
            "tools[0]",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0]",
        ),
        (json!({"input": "x", "background": true}), "background"),
    ] {
        let (status, text) = call(addr, "POST", "/v1/responses", Some(&body), None);
        assert_eq!(status, 400, "{text}");
        assert_eq!(json(&text)["error"]["param"], param, "{text}");
    }
    // An unknown response: a 404 to fetch or to continue.
    let (status, text) = call(addr, "GET", "/v1/responses/resp_1", None, None);
    assert_eq!(status, 404, "{text}");
    assert!(
        json(&text)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is stored")
    );
    let continued = json!({"input": "x", "previous_response_id": "resp_1"});
    let (status, text) = call(addr, "POST", "/v1/responses", Some(&continued), None);
    assert_eq!(status, 404, "{text}");
}

/// Responses are stored: `GET` returns one, `previous_response_id`
/// continues it, `DELETE` forgets it; `store: false` keeps nothing.
#[test]
fn stored_responses_continue_and_can_be_fetched_and_deleted() {
    let (addr, _) = start_front(None);
    let first = json!({"model": "alias", "input": "Hi", "instructions": "Be brief."});
    let (status, body) = call(addr, "POST", "/v1/responses", Some(&first), None);
    assert_eq!(status, 200, "{body}");
    let created = json(&body);
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["store"], true);
    let (status, body) = call(addr, "GET", &format!("/v1/responses/{id}"), None, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body), created);
    let next = json!({"model": "alias", "input": "More", "previous_response_id": id,
        "stream": true});
    let (status, body) = call(addr, "POST", "/v1/responses", Some(&next), None);
    assert_eq!(status, 200, "{body}");
    let (_, response) = check_response_stream(&named_events(&body));
    assert_eq!(response["previous_response_id"], id.as_str());
    let streamed_id = response["id"].as_str().unwrap().to_string();
    let (status, _) = call(
        addr,
        "GET",
        &format!("/v1/responses/{streamed_id}"),
        None,
        None,
    );
    assert_eq!(status, 200, "a streamed response is stored too");
    let (status, body) = call(addr, "DELETE", &format!("/v1/responses/{id}"), None, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["deleted"], true);
    let (status, _) = call(addr, "GET", &format!("/v1/responses/{id}"), None, None);
    assert_eq!(status, 404);
    let (status, body) = call(addr, "POST", "/v1/responses", Some(&next), None);
    assert_eq!(
        status, 404,
        "a deleted response cannot be continued: {body}"
    );
    let unstored = json!({"model": "alias", "input": "Hi", "store": false});
    let (_, body) = call(addr, "POST", "/v1/responses", Some(&unstored), None);
    let id = json(&body)["id"].as_str().unwrap().to_string();
    let (status, _) = call(addr, "GET", &format!("/v1/responses/{id}"), None, None);
    assert_eq!(status, 404);
}
