//! Test servers: a fake router speaking the zinfer protocol on a loopback
//! ROUTER socket, a fake worker for the real router, and a fake
//! OpenAI-compatible HTTP server. Each answers a
//! generation with three chunks (" a", " b", " c") and a terminal reply,
//! and fails prompts containing `FAIL` with `overloaded` / HTTP 503.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use serde_json::{Value, json};
use zinfer_protocol::{
    ChunkBody, ClientReply, ClientRequest, DoneBody, ErrorCode, FinishReason, GenerateRequest,
    Limits, ReadyBody, RouterToWorker, Timings, Usage, WorkerToRouter, decode, encode,
};

/// A fake server on a thread; [`Fake::stop`] ends it and returns what it saw.
pub(crate) struct Fake<T> {
    /// Where to reach it.
    pub(crate) url: String,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<T>,
}

impl<T> Fake<T> {
    /// Stops the server; returns the requests it received.
    pub(crate) fn stop(self) -> T {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// A ROUTER on a free loopback port answering `ping` and `generate`.
pub(crate) fn router() -> Fake<Vec<GenerateRequest>> {
    let context = zmq::Context::new();
    let socket = context.socket(zmq::ROUTER).unwrap();
    socket.set_linger(0).unwrap();
    socket.bind("tcp://127.0.0.1:*").unwrap();
    let url = socket.get_last_endpoint().unwrap().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        let _context = context;
        let mut seen = Vec::new();
        while !stopped.load(Ordering::SeqCst) {
            if socket.poll(zmq::POLLIN, 20).unwrap() == 0 {
                continue;
            }
            let frames = socket.recv_multipart(0).unwrap();
            let identity = frames[0].clone();
            let reply = |message: &ClientReply| {
                socket
                    .send_multipart([identity.clone(), encode(message).unwrap()], 0)
                    .unwrap();
            };
            match decode::<ClientRequest>(&frames[1], &Limits::default()).unwrap() {
                ClientRequest::Ping { id } => reply(&ClientReply::Pong { id }),
                ClientRequest::Generate(request) => {
                    answer(&request, reply);
                    seen.push(request);
                }
                _ => {}
            }
        }
        seen
    });
    Fake { url, stop, thread }
}

fn answer(request: &GenerateRequest, reply: impl Fn(&ClientReply)) {
    let id = request.id.clone();
    let prompt = request.prompt.clone().unwrap_or_default();
    if prompt.contains("FAIL") {
        reply(&ClientReply::Error {
            id: Some(id),
            code: ErrorCode::Overloaded,
            message: "queue full".into(),
            retryable: true,
        });
        return;
    }
    for (index, text) in [" a", " b", " c"].into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(2));
        reply(&ClientReply::Chunk {
            id: id.clone(),
            body: ChunkBody {
                index: index as u32,
                text: text.into(),
                tokens: vec![index as u32 + 10],
                ..ChunkBody::default()
            },
        });
    }
    let prompt_tokens = prompt.split_whitespace().count() as u32;
    reply(&ClientReply::Done {
        id,
        body: DoneBody {
            worker: Some("fake".into()),
            ..DoneBody::new(
                FinishReason::Length,
                Usage {
                    prompt_tokens,
                    cached_tokens: prompt_tokens / 2,
                    completion_tokens: 3,
                },
                Timings::default(),
            )
        },
    });
}

/// A worker on a DEALER connected to a real router's back socket: it
/// registers as `fake-worker` serving `smol`, heartbeats, and answers each
/// `generate` the way [`router`] does.
pub(crate) fn worker(back: &str) -> Fake<u64> {
    let context = zmq::Context::new();
    let socket = context.socket(zmq::DEALER).unwrap();
    socket.set_linger(0).unwrap();
    socket.set_identity(b"fake-worker").unwrap();
    socket.connect(back).unwrap();
    let send = move |socket: &zmq::Socket, message: &WorkerToRouter| {
        socket.send(encode(message).unwrap(), 0).unwrap();
    };
    send(
        &socket,
        &WorkerToRouter::Ready(ReadyBody {
            worker_id: "fake-worker".into(),
            protocol: zinfer_protocol::PROTOCOL_VERSION,
            models: vec!["smol".into()],
            device: "cpu".into(),
            kv_capacity: 4096,
            max_batch: 4,
            context_length: None,
            vocab_size: None,
            import_endpoint: None,
            import_key: None,
        }),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        let _context = context;
        let mut served = 0;
        let mut beat = std::time::Instant::now();
        while !stopped.load(Ordering::SeqCst) {
            if beat.elapsed() > Duration::from_millis(300) {
                send(&socket, &WorkerToRouter::Heartbeat {});
                beat = std::time::Instant::now();
            }
            if socket.poll(zmq::POLLIN, 20).unwrap() == 0 {
                continue;
            }
            let frame = socket.recv_multipart(0).unwrap().pop().unwrap();
            let Ok(RouterToWorker::Generate { rid, request }) = decode(&frame, &Limits::default())
            else {
                continue;
            };
            served += 1;
            answer(&request, |reply| {
                let message = match reply.clone() {
                    ClientReply::Chunk { body, .. } => WorkerToRouter::Chunk { rid, body },
                    ClientReply::Done { mut body, .. } => {
                        body.worker = None;
                        WorkerToRouter::Done { rid, body }
                    }
                    ClientReply::Error { code, message, .. } => {
                        WorkerToRouter::Error { rid, code, message }
                    }
                    _ => return,
                };
                send(&socket, &message);
            });
        }
        served
    });
    Fake {
        url: back.to_string(),
        stop,
        thread,
    }
}

/// An HTTP server on a free loopback port answering `GET /v1/models` and
/// streaming `POST /v1/completions`; returns the request bodies it got.
pub(crate) fn openai() -> Fake<Vec<Value>> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut handlers = Vec::new();
        while !stopped.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let seen = seen.clone();
                    handlers.push(std::thread::spawn(move || serve_http(stream, &seen)));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        for handler in handlers {
            handler.join().unwrap();
        }
        std::mem::take(&mut *seen.lock().unwrap())
    });
    Fake { url, stop, thread }
}

fn serve_http(stream: TcpStream, seen: &Mutex<Vec<Value>>) {
    stream.set_nonblocking(false).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let mut stream = stream;
    if request_line.starts_with("GET /v1/models") {
        let json = json!({"data": [{"id": "fake-model"}]}).to_string();
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
            json.len()
        )
        .unwrap();
        return;
    }
    let request: Value = serde_json::from_slice(&body).unwrap();
    let prompt = request["prompt"].as_str().unwrap_or_default().to_string();
    seen.lock().unwrap().push(request);
    if prompt.contains("FAIL") {
        let text = "overloaded";
        write!(
            stream,
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        )
        .unwrap();
        return;
    }
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    for text in [" a", " b", " c"] {
        std::thread::sleep(Duration::from_millis(2));
        let event = json!({"choices": [{"index": 0, "text": text, "finish_reason": null}]});
        write!(stream, "data: {event}\n\n").unwrap();
        stream.flush().unwrap();
    }
    let words = prompt.split_whitespace().count();
    let usage = json!({
        "choices": [],
        "usage": {"prompt_tokens": words, "completion_tokens": 3,
                  "prompt_tokens_details": {"cached_tokens": words / 4}},
    });
    write!(stream, "data: {usage}\n\ndata: [DONE]\n\n").unwrap();
}
