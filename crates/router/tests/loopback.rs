//! The router over real ZeroMQ sockets on loopback: `Router` serving on a
//! thread, fake workers (DEALER) and clients (DEALER, REQ).

#[path = "support/echo.rs"]
mod echo;
#[path = "support/http.rs"]
mod http;

use std::{
    io::Write,
    process::{Command, Stdio},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crossbeam_channel::Sender;
use echo::EchoWorker;
use http::http_get;
use zinfer_protocol::{
    ChunkBody, ClientReply, ClientRequest, DoneBody, ErrorCode, FinishReason, GenerateRequest,
    Limits, PROTOCOL_VERSION, ReadyBody, RouterToWorker, WorkerToRouter, decode, encode,
};
use zinfer_router::{Endpoints, Policy, Router, RouterConfig, RouterError};

struct Running {
    endpoints: Endpoints,
    shutdown: Sender<()>,
    thread: JoinHandle<Result<(), RouterError>>,
}

fn start(config: RouterConfig) -> Running {
    let config = RouterConfig {
        clients: "tcp://127.0.0.1:*".into(),
        workers: "tcp://127.0.0.1:*".into(),
        control: "tcp://127.0.0.1:*".into(),
        metrics: Some("127.0.0.1:0".parse().expect("address")),
        ..config
    };
    let router = Router::bind(config).expect("router binds");
    let endpoints = router.endpoints().clone();
    let (shutdown, receiver) = crossbeam_channel::bounded(1);
    let thread = std::thread::spawn(move || router.serve(receiver));
    Running {
        endpoints,
        shutdown,
        thread,
    }
}

impl Running {
    fn stop(self) {
        self.shutdown.send(()).expect("router thread alive");
        self.thread
            .join()
            .expect("router thread did not panic")
            .expect("router ended cleanly");
    }
}

fn dealer(context: &zmq::Context, endpoint: &str, identity: Option<&str>) -> zmq::Socket {
    let socket = context.socket(zmq::DEALER).expect("dealer");
    if let Some(identity) = identity {
        socket.set_identity(identity.as_bytes()).expect("identity");
    }
    socket.set_rcvtimeo(5_000).expect("timeout");
    socket.set_linger(0).expect("linger");
    socket.connect(endpoint).expect("connect");
    socket
}

fn send(socket: &zmq::Socket, message: &ClientRequest) {
    socket
        .send(encode(message).expect("encode"), 0)
        .expect("send");
}

fn recv(socket: &zmq::Socket) -> ClientReply {
    let frame = socket.recv_bytes(0).expect("a reply within 5 s");
    decode(&frame, &Limits::default()).expect("a valid reply")
}

/// Asks for `models` until `workers` workers serve `model`.
fn wait_for_workers(client: &zmq::Socket, model: &str, workers: u32) {
    let start = Instant::now();
    loop {
        send(client, &ClientRequest::Models { id: None });
        if let ClientReply::Models { models, .. } = recv(client)
            && models
                .iter()
                .any(|info| info.name == model && info.workers == workers)
        {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "workers never registered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn generate(id: &str, tokens: u32, stream: bool) -> ClientRequest {
    let mut request = GenerateRequest::from_prompt(id, "echo this");
    request.max_tokens = tokens;
    request.stream = stream;
    ClientRequest::Generate(request)
}

#[test]
fn streams_chunks_and_done_through_real_sockets() {
    let router = start(RouterConfig::default());
    let context = zmq::Context::new();
    let _worker = EchoWorker::connect(&context, &router.endpoints.workers, "echo-1", "m");
    let client = dealer(&context, &router.endpoints.clients, None);
    wait_for_workers(&client, "m", 1);

    send(&client, &generate("s1", 3, true));
    for index in 0..3 {
        match recv(&client) {
            ClientReply::Chunk {
                id,
                body: ChunkBody {
                    index: got, text, ..
                },
                ..
            } => {
                assert_eq!((id.as_str(), got), ("s1", index));
                assert_eq!(text, format!("tok{index} "));
            }
            other => panic!("expected chunk {index}, got {other:?}"),
        }
    }
    match recv(&client) {
        ClientReply::Done {
            id,
            body:
                DoneBody {
                    finish_reason,
                    worker,
                    usage,
                    ..
                },
            ..
        } => {
            assert_eq!(id, "s1");
            assert_eq!(finish_reason, FinishReason::Length);
            assert_eq!(worker.as_deref(), Some("echo-1"));
            assert_eq!(usage.completion_tokens, 3);
        }
        other => panic!("expected done, got {other:?}"),
    }

    send(&client, &generate("n1", 2, false));
    match recv(&client) {
        ClientReply::Done {
            id,
            body: DoneBody { text, .. },
            ..
        } => {
            assert_eq!(id, "n1");
            assert_eq!(text.as_deref(), Some("tok0 tok1 "));
        }
        other => panic!("expected done, got {other:?}"),
    }

    let metrics = http_get(router.endpoints.metrics.expect("metrics on"), "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("zinfer_router_requests_total{outcome=\"length\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("zinfer_router_relayed_chunks_total 3"),
        "{metrics}"
    );
    let body = metrics
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .expect("an HTTP body");
    promtool_accepts(&body);
    router.stop();
}

/// Fails unless `promtool check metrics` accepts `text`.
fn promtool_accepts(text: &str) {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => panic!(
            "promtool is needed to check the metrics text ({err}); install it with \
             `apt-get install -y prometheus`"
        ),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool ran");
    assert!(
        output.status.success(),
        "promtool rejected the metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn req_clients_garbage_and_extra_frames_get_answers() {
    let router = start(RouterConfig::default());
    let context = zmq::Context::new();

    let req = context.socket(zmq::REQ).expect("req");
    req.set_rcvtimeo(5_000).expect("timeout");
    req.set_linger(0).expect("linger");
    req.connect(&router.endpoints.clients).expect("connect");
    send(
        &req,
        &ClientRequest::Ping {
            id: Some("p".into()),
        },
    );
    assert_eq!(
        recv(&req),
        ClientReply::Pong {
            id: Some("p".into())
        }
    );

    let client = dealer(&context, &router.endpoints.clients, None);
    client.send(&b"\x93not a map"[..], 0).expect("send");
    match recv(&client) {
        ClientReply::Error { id, code, .. } => {
            assert_eq!((id, code), (None, ErrorCode::BadRequest));
        }
        other => panic!("expected bad_request, got {other:?}"),
    }
    let ping = encode(&ClientRequest::Ping { id: None }).expect("encode");
    client
        .send_multipart([&b"a"[..], b"b", b"c", &ping[..]], 0)
        .expect("send");
    match recv(&client) {
        ClientReply::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::BadRequest);
            assert!(message.contains("frames"), "{message}");
        }
        other => panic!("expected bad_request, got {other:?}"),
    }
    send(&client, &generate("x", 1, true));
    match recv(&client) {
        ClientReply::Error { id, code, .. } => {
            assert_eq!((id.as_deref(), code), (Some("x"), ErrorCode::Unavailable));
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    router.stop();
}

/// A worker that registers and then never answers.
fn silent_worker(context: &zmq::Context, endpoint: &str, id: &str) -> zmq::Socket {
    let worker = dealer(context, endpoint, Some(id));
    let ready = WorkerToRouter::Ready(ReadyBody {
        worker_id: id.into(),
        protocol: PROTOCOL_VERSION,
        models: vec!["m".into()],
        device: "cpu".into(),
        kv_capacity: 1024,
        max_batch: 4,
        context_length: None,
        vocab_size: None,
        import_endpoint: None,
        import_key: None,
    });
    worker
        .send(encode(&ready).expect("encode"), 0)
        .expect("send");
    worker
}

/// Receives router -> worker messages until a `generate` arrives.
fn recv_generate(worker: &zmq::Socket) -> u64 {
    loop {
        let frame = worker.recv_bytes(0).expect("a generate within 5 s");
        if let Ok(RouterToWorker::Generate { rid, .. }) = decode(&frame, &Limits::default()) {
            return rid;
        }
    }
}

#[test]
fn shutdown_fails_in_flight_requests() {
    let router = start(RouterConfig::default());
    let context = zmq::Context::new();
    let worker = silent_worker(&context, &router.endpoints.workers, "mute");
    let client = dealer(&context, &router.endpoints.clients, None);
    wait_for_workers(&client, "m", 1);
    send(&client, &generate("pending", 4, true));
    recv_generate(&worker);
    router.stop();
    match recv(&client) {
        ClientReply::Error {
            id,
            code,
            retryable,
            ..
        } => {
            assert_eq!(id.as_deref(), Some("pending"));
            assert_eq!(code, ErrorCode::Unavailable);
            assert!(retryable);
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[test]
fn silent_worker_expires_and_request_is_retried_elsewhere() {
    let router = start(RouterConfig {
        policy: Policy::RoundRobin,
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_expiry: Duration::from_millis(400),
        ..RouterConfig::default()
    });
    let context = zmq::Context::new();
    let client = dealer(&context, &router.endpoints.clients, None);
    let mute = silent_worker(&context, &router.endpoints.workers, "mute");
    wait_for_workers(&client, "m", 1);
    let heartbeat = encode(&WorkerToRouter::Heartbeat {}).expect("encode");
    mute.send(&heartbeat[..], 0).expect("send");
    let _echo = EchoWorker::connect(&context, &router.endpoints.workers, "echo-1", "m");
    wait_for_workers(&client, "m", 2);
    mute.send(&heartbeat[..], 0).expect("send");
    send(&client, &generate("r1", 1, false));
    recv_generate(&mute);
    match recv(&client) {
        ClientReply::Done {
            id,
            body: DoneBody { worker, .. },
            ..
        } => {
            assert_eq!(id, "r1");
            assert_eq!(
                worker.as_deref(),
                Some("echo-1"),
                "re-sent to the live worker"
            );
        }
        other => panic!("expected done, got {other:?}"),
    }
    router.stop();
}
