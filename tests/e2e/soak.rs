//! The soak: many clients streaming, cancelling and racing deadlines
//! through `zinfer serve` while a chaos loop SIGKILLs its workers and the
//! control plane replaces them. Every request sent must end exactly once.
//!
//! `make test` runs a short version (600 requests). The full one from the
//! issue is `ZINFER_SOAK_REQUESTS=10000 cargo test -p zinfer-cli --test e2e
//! soak -- --nocapture`; `ZINFER_SOAK_CLIENTS` and `ZINFER_SOAK_SEED` change
//! the rest.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use zinfer_protocol::{
    AdminReply, AdminRequest, ChunkBody, ClientReply, ClientRequest, DoneBody, ErrorCode,
    FinishReason, Limits, WorkerState,
};

use crate::harness::{self, Proc, Rng};

/// Workers `zinfer serve` keeps running (one thread each).
const WORKERS: usize = 2;
/// Nothing at all arriving for this long while requests are open means
/// they are lost.
const STALL: Duration = Duration::from_secs(60);

struct Settings {
    requests: usize,
    clients: usize,
    seed: u64,
}

impl Settings {
    fn from_env() -> Settings {
        let var = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .map(|v| {
                    v.parse()
                        .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
                })
                .unwrap_or(default)
        };
        Settings {
            requests: var("ZINFER_SOAK_REQUESTS", 600) as usize,
            clients: var("ZINFER_SOAK_CLIENTS", 32) as usize,
            seed: var("ZINFER_SOAK_SEED", 7),
        }
    }
}

/// What one request does besides asking for tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Whole,
    Streamed,
    /// Streamed, cancelled after its first chunk.
    CancelAfterFirst,
    /// Not streamed, cancelled a few milliseconds after it is sent.
    CancelSoon,
    /// A `deadline_ms` short enough to pass now and then.
    Deadline,
}

impl Kind {
    fn pick(rng: &mut Rng) -> Kind {
        match rng.below(10) {
            0..=2 => Kind::Whole,
            3..=5 => Kind::Streamed,
            6 => Kind::CancelAfterFirst,
            7 => Kind::CancelSoon,
            _ => Kind::Deadline,
        }
    }
}

/// One request as the client saw it.
struct Record {
    kind: Kind,
    sent: Instant,
    first_output: Option<Instant>,
    /// Next chunk index expected.
    next_index: u32,
    terminals: usize,
    /// Replies for this id after its terminal one.
    after_terminal: usize,
    /// Chunks whose index was not the next one.
    out_of_order: usize,
    cancel_at: Option<Instant>,
    outcome: Option<String>,
}

/// A DEALER client with at most one request open at a time.
struct SoakClient {
    socket: zmq::Socket,
    open: Option<String>,
    sent: usize,
}

const PREFIXES: [&str; 4] = [
    "You are a helpful assistant who answers in one short sentence.",
    "You are a careful teacher. Explain the idea simply, then give an example.",
    "Answer as a ship's captain would, briefly and with confidence.",
    "You write haiku. Every answer is a poem of three lines.",
];

const QUESTIONS: [&str; 6] = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "What is two plus two?",
    "Where does rain come from?",
];

fn request(rng: &mut Rng, id: &str, kind: Kind) -> ClientRequest {
    let prompt = format!(
        "{} {}",
        PREFIXES[rng.below(PREFIXES.len() as u64)],
        QUESTIONS[rng.below(QUESTIONS.len() as u64)]
    );
    let mut request = harness::greedy(id, &prompt, 1 + rng.below(16) as u32);
    request.temperature = if rng.below(2) == 0 { 0.0 } else { 0.8 };
    request.seed = Some(rng.next());
    request.ignore_eos = rng.below(2) == 0;
    request.stream = matches!(kind, Kind::Streamed | Kind::CancelAfterFirst);
    if kind == Kind::Deadline {
        request.stream = rng.below(2) == 0;
        request.deadline_ms = Some(20 + rng.below(400) as u64);
    }
    ClientRequest::Generate(request)
}

/// `zinfer serve` on `endpoints` with [`WORKERS`] one-thread workers of
/// the default model, and `extra` flags.
fn serve_args(endpoints: &harness::RouterEndpoints, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["serve"].into_iter().map(String::from).collect();
    args.extend(endpoints.args().map(String::from));
    let model = harness::model_path().display().to_string();
    let metrics_base = harness::free_port().to_string();
    for (flag, value) in [
        ("--model", model.as_str()),
        ("--threads", "1"),
        ("--kv-tokens", "4096"),
        ("--max-batch", "16"),
        ("--worker-metrics-port", metrics_base.as_str()),
    ] {
        args.extend([flag.to_string(), value.to_string()]);
    }
    for _ in 0..WORKERS {
        args.extend(["--device".to_string(), "cpu".to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The workers `zinfer serve` (process `serve`) has started: its children.
fn worker_pids(serve: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let after_name = stat.rsplit_once(')')?.1;
                    after_name.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(serve)
        })
        .collect()
}

/// SIGKILLs one of `serve`'s workers every 2-5 s until `stop`; returns the
/// number killed.
fn chaos(serve: u32, seed: u64, stop: Arc<AtomicBool>, kills: Arc<AtomicUsize>) {
    let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
    while !stop.load(Ordering::Relaxed) {
        let pause = Instant::now() + Duration::from_millis(2000 + rng.below(3000) as u64);
        while Instant::now() < pause && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let pids = worker_pids(serve);
        if pids.is_empty() {
            continue;
        }
        let victim = pids[rng.below(pids.len() as u64)];
        if kill(Pid::from_raw(victim), Signal::SIGKILL).is_ok() {
            kills.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn reply_id(reply: &ClientReply) -> Option<&str> {
    match reply {
        ClientReply::Chunk { id, .. } | ClientReply::Done { id, .. } => Some(id.as_str()),
        ClientReply::Error { id, .. } => id.as_deref(),
        _ => None,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ready_workers(control: &str) -> usize {
    match harness::admin(control, &AdminRequest::Workers {}) {
        Some(AdminReply::Workers { workers }) => workers
            .iter()
            .filter(|w| w.state == WorkerState::Ready)
            .count(),
        _ => 0,
    }
}

fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_soak_with_chaos_ends_every_request_exactly_once() {
    let settings = Settings::from_env();
    let _guard = harness::exclusive();
    let endpoints = harness::RouterEndpoints::fresh();
    let (clients_ep, control, metrics) = (
        endpoints.clients.clone(),
        endpoints.control.clone(),
        endpoints.metrics.clone(),
    );
    let serve: Proc = harness::spawn("serve", &serve_args(&endpoints, &[]));
    let serve_pid = serve.child.id();
    let started = Instant::now();
    while ready_workers(&control) < WORKERS {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "zinfer serve did not start {WORKERS} workers"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let chaos_thread = {
        let (stop, kills) = (Arc::clone(&stop), Arc::clone(&kills));
        let seed = settings.seed;
        std::thread::spawn(move || chaos(serve_pid, seed, stop, kills))
    };

    let context = zmq::Context::new();
    let mut clients: Vec<SoakClient> = (0..settings.clients)
        .map(|_| {
            let socket = context.socket(zmq::DEALER).expect("a DEALER");
            socket.set_linger(0).expect("linger");
            socket.connect(&clients_ep).expect("connect");
            SoakClient {
                socket,
                open: None,
                sent: 0,
            }
        })
        .collect();
    let per_client = settings.requests.div_ceil(settings.clients);
    let mut rng = Rng(settings.seed);
    let mut records: HashMap<String, Record> = HashMap::new();
    let mut stray = 0usize;
    let mut last_reply = Instant::now();
    let load_started = Instant::now();

    loop {
        let now = Instant::now();
        for (c, client) in clients.iter_mut().enumerate() {
            if client.open.is_none()
                && client.sent < per_client
                && records.len() < settings.requests
            {
                let id = format!("c{c}-r{}", client.sent);
                let kind = Kind::pick(&mut rng);
                let frame = zinfer_protocol::encode(&request(&mut rng, &id, kind)).expect("encode");
                client.socket.send(frame, 0).expect("send");
                let cancel_at = (kind == Kind::CancelSoon)
                    .then(|| now + Duration::from_millis(rng.below(30) as u64));
                records.insert(
                    id.clone(),
                    Record {
                        kind,
                        sent: now,
                        first_output: None,
                        next_index: 0,
                        terminals: 0,
                        after_terminal: 0,
                        out_of_order: 0,
                        cancel_at,
                        outcome: None,
                    },
                );
                client.open = Some(id);
                client.sent += 1;
            }
            if let Some(id) = &client.open {
                let record = records.get_mut(id).expect("an open request has a record");
                if record.cancel_at.is_some_and(|at| at <= now) {
                    record.cancel_at = None;
                    let cancel = ClientRequest::Cancel { id: id.clone() };
                    let frame = zinfer_protocol::encode(&cancel).expect("encode");
                    client.socket.send(frame, 0).expect("send");
                }
            }
        }
        let open = clients.iter().filter(|c| c.open.is_some()).count();
        if open == 0 && records.len() >= settings.requests {
            break;
        }
        if last_reply.elapsed() > STALL {
            break;
        }

        let mut items: Vec<zmq::PollItem> = clients
            .iter()
            .map(|c| c.socket.as_poll_item(zmq::POLLIN))
            .collect();
        zmq::poll(&mut items, 5).expect("poll");
        let readable: Vec<bool> = items.iter().map(|i| i.is_readable()).collect();
        for (client, readable) in clients.iter_mut().zip(readable) {
            if !readable {
                continue;
            }
            while let Ok(frame) = client.socket.recv_bytes(zmq::DONTWAIT) {
                last_reply = Instant::now();
                let reply: ClientReply = zinfer_protocol::decode(&frame, &Limits::default())
                    .expect("the router sends valid replies");
                let Some(record) = reply_id(&reply).and_then(|id| records.get_mut(id)) else {
                    stray += 1;
                    continue;
                };
                if record.terminals > 0 {
                    record.after_terminal += 1;
                    continue;
                }
                match &reply {
                    ClientReply::Chunk {
                        body: ChunkBody { index, .. },
                        ..
                    } => {
                        if *index != record.next_index {
                            record.out_of_order += 1;
                        }
                        record.next_index = index + 1;
                        if record.first_output.is_none() {
                            record.first_output = Some(Instant::now());
                            if record.kind == Kind::CancelAfterFirst {
                                record.cancel_at = Some(Instant::now());
                            }
                        }
                    }
                    ClientReply::Done {
                        body:
                            DoneBody {
                                finish_reason,
                                usage,
                                ..
                            },
                        ..
                    } => {
                        record.terminals += 1;
                        if record.first_output.is_none() && usage.completion_tokens > 0 {
                            record.first_output = Some(Instant::now());
                        }
                        record.outcome = Some(format!("done:{}", finish_label(*finish_reason)));
                    }
                    ClientReply::Error { code, message, .. } => {
                        record.terminals += 1;
                        assert!(
                            !message.to_lowercase().contains("panic"),
                            "a client saw a panic: {message}"
                        );
                        record.outcome = Some(format!("error:{}", code.as_str()));
                    }
                    _ => {}
                }
                if record.terminals > 0 {
                    client.open = None;
                }
            }
        }
    }
    let load_time = load_started.elapsed();
    // Late duplicates show up within a moment of the last terminal.
    std::thread::sleep(Duration::from_millis(500));
    for client in &clients {
        while let Ok(frame) = client.socket.recv_bytes(zmq::DONTWAIT) {
            let reply: ClientReply =
                zinfer_protocol::decode(&frame, &Limits::default()).expect("valid replies");
            match reply_id(&reply).and_then(|id| records.get_mut(id)) {
                Some(record) if record.terminals > 0 => record.after_terminal += 1,
                _ => stray += 1,
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    chaos_thread.join().expect("the chaos loop");
    let kills = kills.load(Ordering::Relaxed);

    let healed = Instant::now();
    while ready_workers(&control) < WORKERS {
        assert!(
            healed.elapsed() < Duration::from_secs(60),
            "the control plane did not bring back {WORKERS} workers after the chaos"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let page = harness::scrape(&metrics);

    let sent = records.len();
    let terminal: usize = records.values().filter(|r| r.terminals > 0).count();
    let lost: Vec<&String> = records
        .iter()
        .filter(|(_, r)| r.terminals == 0)
        .map(|(id, _)| id)
        .collect();
    let duplicated = records
        .values()
        .filter(|r| r.terminals > 1 || r.after_terminal > 0)
        .count();
    let out_of_order: usize = records.values().map(|r| r.out_of_order).sum();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for record in records.values() {
        let label = record.outcome.clone().unwrap_or_else(|| "lost".into());
        *outcomes.entry(label).or_default() += 1;
    }
    let mut ttft: Vec<f64> = records
        .values()
        .filter_map(|r| Some(r.first_output?.duration_since(r.sent).as_secs_f64()))
        .collect();
    ttft.sort_by(f64::total_cmp);
    let plain: Vec<&Record> = records
        .values()
        .filter(|r| matches!(r.kind, Kind::Whole | Kind::Streamed))
        .collect();
    let completed = plain
        .iter()
        .filter(|r| {
            matches!(
                r.outcome.as_deref(),
                Some("done:stop") | Some("done:length")
            )
        })
        .count();

    eprintln!(
        "soak: {sent} requests from {} clients in {:.1} s, {kills} workers killed",
        settings.clients,
        load_time.as_secs_f64()
    );
    eprintln!(
        "soak: terminal {terminal}, lost {}, duplicated {duplicated}, out-of-order chunks {out_of_order}, stray replies {stray}",
        lost.len()
    );
    eprintln!(
        "soak: outcomes {outcomes:?}; {completed} of {} requests without a cancel or deadline completed",
        plain.len()
    );
    eprintln!(
        "soak: router retries {}, workers spawned {}; TTFT p50 {:.3} s, p99 {:.3} s",
        metric(&page, "zinfer_router_retries_total"),
        metric(&page, "zinfer_router_spawns_total"),
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.99)
    );

    assert_eq!(sent, settings.requests, "every planned request was sent");
    assert!(
        lost.is_empty(),
        "{} requests never ended: {lost:?}",
        lost.len()
    );
    assert_eq!(terminal, sent);
    assert_eq!(duplicated, 0, "requests with more than one ending");
    assert_eq!(out_of_order, 0, "chunks skipped or repeated an index");
    assert_eq!(stray, 0, "replies for ids never sent");
    for bad in [ErrorCode::Internal, ErrorCode::BadRequest] {
        let label = format!("error:{}", bad.as_str());
        assert!(
            !outcomes.contains_key(&label),
            "{label} under chaos: {outcomes:?}"
        );
    }
    assert!(kills >= 1, "the chaos loop killed no worker");
    assert!(
        completed * 2 >= plain.len(),
        "fewer than half the requests without a cancel or deadline completed \
         ({completed} of {}): {outcomes:?}",
        plain.len()
    );
    drop(serve);
}

fn finish_label(reason: FinishReason) -> &'static str {
    reason.as_str()
}

/// What one HTTP request of the soak does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HttpKind {
    /// One JSON body.
    Whole,
    /// An SSE stream read to its end.
    Streamed,
    /// An SSE stream whose client hangs up after the first event.
    HangUp,
}

/// How one HTTP request ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum HttpEnd {
    /// Status and body complete (`[DONE]` ends a stream; an error event
    /// before it is an error).
    Answered { status: u16, error: bool },
    /// The client hung up on purpose.
    HungUp,
    /// No complete answer: a lost request.
    Lost(String),
}

/// Sends one chat request over a fresh connection and reads its answer.
fn http_request(addr: &str, rng: &mut Rng, kind: HttpKind) -> HttpEnd {
    use std::io::{Read, Write};
    let body = serde_json::json!({
        "model": "smol",
        "messages": [{"role": "user", "content": QUESTIONS[rng.below(QUESTIONS.len() as u64)]}],
        "max_tokens": 1 + rng.below(16),
        "temperature": if rng.below(2) == 0 { 0.0 } else { 0.8 },
        "seed": rng.below(1 << 30),
        "stream": kind != HttpKind::Whole,
    })
    .to_string();
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return HttpEnd::Lost("cannot connect".into());
    };
    let _ = stream.set_read_timeout(Some(STALL));
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(head.as_bytes()).is_err() {
        return HttpEnd::Lost("the front closed before the request was sent".into());
    }
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buffer[..n]),
            Err(error) => return HttpEnd::Lost(format!("read: {error}")),
        }
        if kind == HttpKind::HangUp && seen.windows(6).any(|w| w == b"data: ") {
            return HttpEnd::HungUp;
        }
    }
    let text = String::from_utf8_lossy(&seen);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let Some((_, body)) = text.split_once("\r\n\r\n") else {
        return HttpEnd::Lost(format!("no complete head: {text}"));
    };
    let streamed = text.contains("text/event-stream");
    if streamed {
        // Exactly one `[DONE]`, and no event after it.
        let ends = body.matches("data: [DONE]").count();
        let last_event = body.rfind("data: ").unwrap_or(0);
        if ends != 1 || !body[last_event..].starts_with("data: [DONE]") {
            return HttpEnd::Lost(format!("{ends} [DONE] in {body}"));
        }
        return HttpEnd::Answered {
            status,
            error: body.contains("\"error\""),
        };
    }
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(value) => HttpEnd::Answered {
            status,
            error: value.get("error").is_some(),
        },
        Err(error) => HttpEnd::Lost(format!("{status}, body not JSON ({error}): {body}")),
    }
}

/// The soak through `zinfer serve --http`: HTTP clients whole, streamed and
/// hanging up mid-stream while workers are killed. Every request gets one
/// complete answer (or was hung up on), and the router ended exactly as
/// many requests as the front was sent. `ZINFER_HTTP_SOAK_REQUESTS`
/// (default 300) and `ZINFER_HTTP_SOAK_CLIENTS` (16) size it.
#[test]
fn a_soak_through_the_http_front_answers_every_request_once() {
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let requests = var("ZINFER_HTTP_SOAK_REQUESTS", 300);
    let clients = var("ZINFER_HTTP_SOAK_CLIENTS", 16);
    let _guard = harness::exclusive();
    let endpoints = harness::RouterEndpoints::fresh();
    let http = format!("127.0.0.1:{}", harness::free_port());
    let serve: Proc = harness::spawn(
        "serve",
        &serve_args(
            &endpoints,
            &["--http", &http, "--served-model-name", "smol"],
        ),
    );
    let serve_pid = serve.child.id();
    let started = Instant::now();
    while ready_workers(&endpoints.control) < WORKERS
        || harness::http_get(&http, "/health").is_none()
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "zinfer serve did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ended_before = metric(
        &harness::scrape(&endpoints.metrics),
        "zinfer_router_requests_total",
    );

    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let chaos_thread = {
        let (stop, kills) = (Arc::clone(&stop), Arc::clone(&kills));
        std::thread::spawn(move || chaos(serve_pid, 11, stop, kills))
    };
    let load_started = Instant::now();
    let ends: Vec<(HttpKind, HttpEnd)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let http = http.clone();
                scope.spawn(move || {
                    let mut rng = Rng(0x5eed + c as u64);
                    (0..requests.div_ceil(clients))
                        .map(|_| {
                            let kind = match rng.below(10) {
                                0..=3 => HttpKind::Whole,
                                4..=7 => HttpKind::Streamed,
                                _ => HttpKind::HangUp,
                            };
                            (kind, http_request(&http, &mut rng, kind))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a soak client"))
            .collect()
    });
    let load_time = load_started.elapsed();
    stop.store(true, Ordering::Relaxed);
    chaos_thread.join().expect("the chaos loop");
    let kills = kills.load(Ordering::Relaxed);

    // Hung-up requests end in the router once it notices; give it a moment.
    let sent = ends.len();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        let page = harness::scrape(&endpoints.metrics);
        let ended = metric(&page, "zinfer_router_requests_total") - ended_before;
        let active = metric(&page, "zinfer_router_queue_depth");
        if (ended >= sent as f64 && active == 0.0) || Instant::now() > deadline {
            break ended;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for (kind, end) in &ends {
        let label = match end {
            HttpEnd::Answered { status, error } => {
                format!("{kind:?}:{status}{}", if *error { ":error" } else { "" })
            }
            HttpEnd::HungUp => format!("{kind:?}:hung_up"),
            HttpEnd::Lost(_) => format!("{kind:?}:lost"),
        };
        *outcomes.entry(label).or_default() += 1;
    }
    eprintln!(
        "http soak: {sent} requests from {clients} clients in {:.1} s, {kills} workers killed; \
         the router ended {ended}; outcomes {outcomes:?}",
        load_time.as_secs_f64()
    );
    let lost: Vec<&HttpEnd> = ends
        .iter()
        .map(|(_, end)| end)
        .filter(|end| matches!(end, HttpEnd::Lost(_)))
        .collect();
    assert!(lost.is_empty(), "{} lost: {:?}", lost.len(), lost.first());
    assert_eq!(
        ended, sent as f64,
        "the router ended as many requests as were sent, none twice"
    );
    for (kind, end) in &ends {
        if let HttpEnd::Answered { status, error } = end {
            assert!(
                *status == 200 || (*error && [429, 502, 503, 504].contains(status)),
                "{kind:?}: status {status}"
            );
        }
    }
    assert!(kills >= 1, "the chaos loop killed no worker");
    let good = ends
        .iter()
        .filter(|(_, end)| {
            matches!(
                end,
                HttpEnd::Answered {
                    status: 200,
                    error: false
                }
            )
        })
        .count();
    assert!(good * 2 >= sent, "fewer than half answered: {outcomes:?}");
    drop(serve);
}
