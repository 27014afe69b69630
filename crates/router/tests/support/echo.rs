//! A trivial worker for router tests and benchmarks: it answers each
//! `generate` at once with `max_tokens` chunks (`tok0`, `tok1`, ...) and a
//! `done`, without a model. Shared by `tests/loopback.rs` and
//! `benches/relay.rs` through `#[path]`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use zinfer_protocol::{
    ChunkBody, DoneBody, FinishReason, Limits, PROTOCOL_VERSION, ReadyBody, RouterToWorker,
    Timings, Usage, WorkerToRouter, decode, encode,
};

/// An echo worker on its own thread; stops when dropped.
pub(crate) struct EchoWorker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoWorker {
    /// Connects a DEALER with identity `id` to a router's back socket and
    /// registers serving `model`.
    pub(crate) fn connect(context: &zmq::Context, endpoint: &str, id: &str, model: &str) -> Self {
        let socket = context.socket(zmq::DEALER).expect("dealer socket");
        socket.set_identity(id.as_bytes()).expect("identity");
        socket.set_linger(0).expect("linger");
        socket.set_sndhwm(100_000).expect("hwm");
        socket.set_rcvhwm(100_000).expect("hwm");
        socket.connect(endpoint).expect("connect to the router");
        let ready = WorkerToRouter::Ready(ReadyBody {
            worker_id: id.to_string(),
            protocol: PROTOCOL_VERSION,
            models: vec![model.to_string()],
            device: "cpu".into(),
            kv_capacity: 1 << 20,
            max_batch: 64,
            context_length: None,
            vocab_size: None,
            import_endpoint: None,
            import_key: None,
        });
        Self::spawn(socket, false, Some(encode(&ready).expect("encode ready")))
    }

    /// Binds a ROUTER at `endpoint` that clients talk to directly, as if
    /// it were the router (the baseline of the latency benchmark).
    #[allow(dead_code, reason = "used by benches/relay.rs, not by every test")]
    pub(crate) fn bind(context: &zmq::Context, endpoint: &str) -> (Self, String) {
        let socket = context.socket(zmq::ROUTER).expect("router socket");
        socket.set_linger(0).expect("linger");
        socket.set_sndhwm(100_000).expect("hwm");
        socket.set_rcvhwm(100_000).expect("hwm");
        socket.bind(endpoint).expect("bind");
        let bound = socket
            .get_last_endpoint()
            .expect("endpoint")
            .expect("utf-8 endpoint");
        (Self::spawn(socket, true, None), bound)
    }

    fn spawn(socket: zmq::Socket, routed: bool, ready: Option<Vec<u8>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || serve(&socket, routed, ready, &flag));
        EchoWorker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EchoWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(socket: &zmq::Socket, routed: bool, ready: Option<Vec<u8>>, stop: &AtomicBool) {
    let limits = Limits::default();
    if let Some(ready) = &ready {
        socket.send(&ready[..], 0).expect("send ready");
    }
    let heartbeat = encode(&WorkerToRouter::Heartbeat {}).expect("encode heartbeat");
    let mut last_heartbeat = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if ready.is_some() && last_heartbeat.elapsed() > Duration::from_millis(300) {
            let _ = socket.send(&heartbeat[..], zmq::DONTWAIT);
            last_heartbeat = Instant::now();
        }
        if socket.poll(zmq::POLLIN, 50).unwrap_or(0) == 0 {
            continue;
        }
        while let Ok(mut parts) = socket.recv_multipart(zmq::DONTWAIT) {
            let Some(payload) = parts.pop() else {
                continue;
            };
            let identity = routed.then(|| parts.swap_remove(0));
            let reply = |message: &WorkerToRouter| {
                let frame = encode(message).expect("encode reply");
                if let Some(identity) = &identity {
                    let _ = socket.send(&identity[..], zmq::SNDMORE);
                }
                let _ = socket.send(frame, 0);
            };
            match decode::<RouterToWorker>(&payload, &limits) {
                Ok(RouterToWorker::Generate { rid, request }) => {
                    let n = request.max_tokens;
                    let mut text = String::new();
                    for index in 0..n {
                        let piece = format!("tok{index} ");
                        text.push_str(&piece);
                        if request.stream {
                            reply(&WorkerToRouter::Chunk {
                                rid,
                                body: ChunkBody {
                                    index,
                                    text: piece,
                                    tokens: vec![index],
                                    ..ChunkBody::default()
                                },
                            });
                        }
                    }
                    reply(&WorkerToRouter::Done {
                        rid,
                        body: DoneBody {
                            text: (!request.stream).then_some(text),
                            ..DoneBody::new(
                                FinishReason::Length,
                                Usage {
                                    prompt_tokens: 1,
                                    cached_tokens: 0,
                                    completion_tokens: n,
                                },
                                Timings::default(),
                            )
                        },
                    });
                }
                Ok(RouterToWorker::Disconnect { .. }) => {
                    if let Some(ready) = &ready {
                        let _ = socket.send(&ready[..], 0);
                    }
                }
                Ok(_) | Err(_) => {}
            }
        }
    }
}
