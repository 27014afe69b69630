//! Router overhead over real loopback TCP, with a trivial echo worker:
//!
//! - throughput: relayed messages (chunks + done) per second reaching the
//!   client, pipelined with many requests in flight;
//! - latency: ping-pong of one non-streamed request through the router vs
//!   the same echo worker reached directly; the difference is what the
//!   router adds. A third path goes through a forwarder with no logic at
//!   all (two ROUTER sockets copying frames), the floor for any broker
//!   hop on this machine;
//!
//! - core cost: the sans-IO core alone relaying chunks in memory, the
//!   router's own CPU time per message without sockets.
//!
//! `cargo bench -p zinfer-router --bench relay`. Knobs (environment):
//! `RELAY_ROUNDS` (5), `RELAY_REQUESTS` (20000), `RELAY_CHUNKS` (8),
//! `RELAY_WINDOW` (1000), `RELAY_PINGS` (3000), and `RELAY_TRANSPORT`
//! (`tcp`, or `ipc` for Unix sockets, as for workers on the router's host).

#[path = "../tests/support/echo.rs"]
mod echo;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use echo::EchoWorker;
use zinfer_protocol::{
    ChunkBody, ClientReply, ClientRequest, GenerateRequest, Limits, ReadyBody, RouterToWorker,
    WorkerToRouter, decode, encode,
};
use zinfer_router::{Action, Addr, Core, Metrics, Router, RouterConfig};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rounds = knob("RELAY_ROUNDS", 5);
    let requests = knob("RELAY_REQUESTS", 20_000);
    let chunks = knob("RELAY_CHUNKS", 8) as u32;
    let window = knob("RELAY_WINDOW", 1_000);
    let pings = knob("RELAY_PINGS", 3_000);
    let transport = Transport::from_env();

    let config = RouterConfig {
        clients: transport.endpoint("clients"),
        workers: transport.endpoint("workers"),
        control: transport.endpoint("control"),
        metrics: None,
        max_inflight_per_worker: Some(1_000_000),
        ..RouterConfig::default()
    };
    let router = Router::bind(config).expect("router binds");
    let endpoints = router.endpoints().clone();
    let (shutdown, receiver) = crossbeam_channel::bounded(1);
    let thread = std::thread::spawn(move || router.serve(receiver));

    let context = zmq::Context::new();
    let _worker = EchoWorker::connect(&context, &endpoints.workers, "echo-1", "m");
    let (_direct_worker, direct_endpoint) =
        EchoWorker::bind(&context, &transport.endpoint("direct"));
    let client = dealer(&context, &endpoints.clients);
    let direct = dealer(&context, &direct_endpoint);
    wait_for_worker(&client);
    let forwarder = Forwarder::start(&transport);
    let _forwarded_worker = EchoWorker::connect(&context, &forwarder.back, "echo-2", "m");
    let via_forwarder = dealer(&context, &forwarder.front);
    // The forwarder learns the worker's identity from its `ready`.
    std::thread::sleep(Duration::from_millis(300));

    println!(
        "relay bench over {}: {requests} requests x ({chunks} chunks + done), window {window}; \
         {pings} ping-pongs; {rounds} rounds",
        transport.name()
    );
    let mut core_ns = Vec::new();
    for _ in 0..rounds {
        core_ns.push(core_cost_ns(200_000));
    }
    println!(
        "core only: {:.0} ns per relayed chunk (median of {rounds})",
        median(&core_ns)
    );
    let mut rates = Vec::new();
    let mut router_p50 = Vec::new();
    let mut router_p99 = Vec::new();
    let mut direct_p50 = Vec::new();
    let mut direct_p99 = Vec::new();
    let mut forwarder_p50 = Vec::new();
    for round in 0..rounds {
        let rate = throughput(&client, requests, chunks, window, round);
        let via_router = ping_pong(pings, || {
            router_round_trip(&client);
        });
        let baseline = ping_pong(pings, || {
            direct_round_trip(&direct);
        });
        let floor = ping_pong(pings, || {
            direct_round_trip(&via_forwarder);
        });
        println!(
            "round {round}: {:>9.0} relayed msg/s | router p50 {:>6.1} us p99 {:>6.1} us | \
             direct p50 {:>6.1} us p99 {:>6.1} us | forwarder p50 {:>6.1} us | \
             added p50 {:>6.1} us",
            rate,
            via_router.0,
            via_router.1,
            baseline.0,
            baseline.1,
            floor.0,
            via_router.0 - baseline.0
        );
        forwarder_p50.push(floor.0);
        rates.push(rate);
        router_p50.push(via_router.0);
        router_p99.push(via_router.1);
        direct_p50.push(baseline.0);
        direct_p99.push(baseline.1);
    }
    let added_p50 = median(&router_p50) - median(&direct_p50);
    let added_p99 = median(&router_p99) - median(&direct_p99);
    println!(
        "median: {:.0} relayed msg/s (target >= 200000); router p50 {:.1} us, p99 {:.1} us; \
         direct p50 {:.1} us, p99 {:.1} us; added p50 {:.1} us (target <= 50), added p99 {:.1} us; \
         a no-logic forwarder adds {:.1} us at p50",
        median(&rates),
        median(&router_p50),
        median(&router_p99),
        median(&direct_p50),
        median(&direct_p99),
        added_p50,
        added_p99,
        median(&forwarder_p50) - median(&direct_p50)
    );
    drop(forwarder);
    shutdown.send(()).expect("router alive");
    thread
        .join()
        .expect("router thread")
        .expect("router ended cleanly");
}

fn dealer(context: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let socket = context.socket(zmq::DEALER).expect("dealer");
    socket.set_sndhwm(1_000_000).expect("hwm");
    socket.set_rcvhwm(1_000_000).expect("hwm");
    socket.set_rcvtimeo(10_000).expect("timeout");
    socket.set_linger(0).expect("linger");
    socket.connect(endpoint).expect("connect");
    socket
}

fn wait_for_worker(client: &zmq::Socket) {
    let limits = Limits::default();
    loop {
        let ping = encode(&ClientRequest::Models { id: None }).expect("encode");
        client.send(ping, 0).expect("send");
        let frame = client.recv_bytes(0).expect("models reply");
        if let Ok(ClientReply::Models { models, .. }) = decode(&frame, &limits)
            && !models.is_empty()
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn request(id: String, tokens: u32, stream: bool) -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt(id, "benchmark prompt");
    request.max_tokens = tokens;
    request.stream = stream;
    request
}

/// Relayed messages per second with `window` requests in flight.
fn throughput(
    client: &zmq::Socket,
    requests: usize,
    chunks: u32,
    window: usize,
    round: usize,
) -> f64 {
    let limits = Limits::default();
    let frames: Vec<Vec<u8>> = (0..requests)
        .map(|i| {
            let generate = ClientRequest::Generate(request(format!("t{round}-{i}"), chunks, true));
            encode(&generate).expect("encode")
        })
        .collect();
    let start = Instant::now();
    let (mut sent, mut done, mut messages) = (0usize, 0usize, 0usize);
    while done < requests {
        while sent < requests && sent - done < window {
            client.send(&frames[sent][..], 0).expect("send");
            sent += 1;
        }
        let frame = client.recv_bytes(0).expect("reply within 10 s");
        messages += 1;
        match decode::<ClientReply>(&frame, &limits) {
            Ok(ClientReply::Done { .. }) => done += 1,
            Ok(ClientReply::Chunk { .. }) => {}
            other => panic!("unexpected reply {other:?}"),
        }
    }
    messages as f64 / start.elapsed().as_secs_f64()
}

/// (p50, p99) in microseconds of `count` calls of `round_trip`.
fn ping_pong(count: usize, mut round_trip: impl FnMut()) -> (f64, f64) {
    for _ in 0..count / 10 {
        round_trip();
    }
    let mut samples: Vec<f64> = (0..count)
        .map(|_| {
            let start = Instant::now();
            round_trip();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

fn router_round_trip(client: &zmq::Socket) {
    let frame = encode(&ClientRequest::Generate(request("ping".into(), 1, false))).expect("encode");
    client.send(frame, 0).expect("send");
    let reply = client.recv_bytes(0).expect("reply");
    match decode::<ClientReply>(&reply, &Limits::default()) {
        Ok(ClientReply::Done { .. }) => {}
        other => panic!("unexpected reply {other:?}"),
    }
}

/// One `generate` straight to an echo worker (or through the forwarder),
/// skipping the worker's heartbeats.
fn direct_round_trip(direct: &zmq::Socket) {
    let generate = RouterToWorker::Generate {
        rid: 1,
        request: request("ping".into(), 1, false),
    };
    direct
        .send(encode(&generate).expect("encode"), 0)
        .expect("send");
    loop {
        let reply = direct.recv_bytes(0).expect("reply");
        match decode::<WorkerToRouter>(&reply, &Limits::default()) {
            Ok(WorkerToRouter::Done { .. }) => return,
            Ok(WorkerToRouter::Heartbeat {} | WorkerToRouter::Ready(_)) => {}
            other => panic!("unexpected reply {other:?}"),
        }
    }
}

/// Two ROUTER sockets copying frames between one client and one worker,
/// with no decoding: what any broker hop costs here. Like the router, it
/// has its own context, so its own I/O thread.
struct Forwarder {
    _context: zmq::Context,
    front: String,
    back: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    fn start(transport: &Transport) -> Self {
        let context = zmq::Context::new();
        let bind = |endpoint: &str| {
            let socket = context.socket(zmq::ROUTER).expect("router");
            socket.set_linger(0).expect("linger");
            socket.bind(endpoint).expect("bind");
            let bound = socket
                .get_last_endpoint()
                .expect("endpoint")
                .expect("utf-8");
            (socket, bound)
        };
        let (front, front_endpoint) = bind(&transport.endpoint("forwarder-front"));
        let (back, back_endpoint) = bind(&transport.endpoint("forwarder-back"));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut client, mut worker): (Option<Vec<u8>>, Option<Vec<u8>>) = (None, None);
            while !flag.load(Ordering::Relaxed) {
                let mut items = [
                    front.as_poll_item(zmq::POLLIN),
                    back.as_poll_item(zmq::POLLIN),
                ];
                if zmq::poll(&mut items, 10).unwrap_or(0) == 0 {
                    continue;
                }
                while let Ok(parts) = front.recv_multipart(zmq::DONTWAIT) {
                    client = Some(parts[0].clone());
                    if let Some(worker) = &worker {
                        let _ = back.send_multipart([&worker[..], &parts[1][..]], zmq::DONTWAIT);
                    }
                }
                while let Ok(parts) = back.recv_multipart(zmq::DONTWAIT) {
                    worker = Some(parts[0].clone());
                    if let Some(client) = &client {
                        let _ = front.send_multipart([&client[..], &parts[1][..]], zmq::DONTWAIT);
                    }
                }
            }
        });
        Forwarder {
            _context: context,
            front: front_endpoint,
            back: back_endpoint,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How the bench's sockets reach each other.
enum Transport {
    Tcp,
    /// Unix sockets under a directory removed at exit.
    Ipc(tempfile::TempDir),
}

impl Transport {
    fn from_env() -> Self {
        match std::env::var("RELAY_TRANSPORT").as_deref() {
            Ok("ipc") => Transport::Ipc(tempfile::tempdir().expect("a temporary directory")),
            Ok("tcp") | Err(_) => Transport::Tcp,
            Ok(other) => panic!("RELAY_TRANSPORT={other}: use tcp or ipc"),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Transport::Tcp => "loopback TCP",
            Transport::Ipc(_) => "ipc (Unix sockets)",
        }
    }

    /// A bindable endpoint for the socket called `name`.
    fn endpoint(&self, name: &str) -> String {
        match self {
            Transport::Tcp => "tcp://127.0.0.1:*".into(),
            Transport::Ipc(dir) => format!("ipc://{}/{name}", dir.path().display()),
        }
    }
}

/// Nanoseconds the core spends per chunk relayed (decode, rewrite, encode).
fn core_cost_ns(chunks: u32) -> f64 {
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let now = Instant::now();
    let mut core = Core::new(RouterConfig::default(), metrics, now);
    let worker = Addr::new("w");
    let client = Addr::new("c");
    let ready = WorkerToRouter::Ready(ReadyBody {
        worker_id: "w".into(),
        protocol: zinfer_protocol::PROTOCOL_VERSION,
        models: vec!["m".into()],
        device: "cpu".into(),
        kv_capacity: 1,
        max_batch: 8,
        context_length: None,
        vocab_size: None,
        import_endpoint: None,
        import_key: None,
    });
    core.handle_worker(now, &worker, &encode(&ready).expect("encode"));
    let generate = ClientRequest::Generate(request("r".into(), 128, true));
    core.handle_client(now, &client, &encode(&generate).expect("encode"));
    let mut rid = None;
    while let Some(Action::Send { frame, .. }) = core.poll_action() {
        if let Ok(RouterToWorker::Generate { rid: r, .. }) = decode(&frame, &Limits::default()) {
            rid = Some(r);
        }
    }
    let rid = rid.expect("dispatched");
    let frames: Vec<Vec<u8>> = (0..chunks)
        .map(|index| {
            let chunk = WorkerToRouter::Chunk {
                rid,
                body: ChunkBody {
                    index,
                    text: " token".into(),
                    tokens: vec![index],
                    ..ChunkBody::default()
                },
            };
            encode(&chunk).expect("encode")
        })
        .collect();
    let start = Instant::now();
    let mut relayed = 0u64;
    for frame in &frames {
        core.handle_worker(now, &worker, frame);
        while let Some(Action::Send { frame, .. }) = core.poll_action() {
            relayed += u64::from(!frame.is_empty());
        }
    }
    assert_eq!(relayed, u64::from(chunks));
    start.elapsed().as_nanos() as f64 / f64::from(chunks)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}
