//! Real processes on loopback ports: a router, workers, and DEALER clients
//! speaking the wire protocol.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zinfer_protocol::{
    AdminReply, AdminRequest, ChunkBody, ClientReply, ClientRequest, GenerateRequest, Limits,
    WorkerInfo, WorkerState,
};

/// Clusters run one at a time: each worker is a model process and the
/// machine may have only two cores.
static CLUSTER_LOCK: Mutex<()> = Mutex::new(());

/// Holds the machine for one model-running test at a time.
pub fn exclusive() -> MutexGuard<'static, ()> {
    CLUSTER_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn zinfer() -> &'static str {
    env!("CARGO_BIN_EXE_zinfer")
}

pub fn model_path() -> PathBuf {
    zinfer_fetch::test_model_path().expect("fetching the default model for the e2e tests")
}

/// The python of the test virtual environment `name` (`openai`, `k8s` or `client`,
/// see `scripts/test-venv.sh`), made on first use. Fails, never skips,
/// when it cannot be made.
pub fn venv_python(name: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/test-venv.sh");
    let dir = format!("{}/{name}-venv", env!("CARGO_TARGET_TMPDIR"));
    let output = Command::new("bash")
        .args([script, name, &dir])
        .output()
        .expect("running scripts/test-venv.sh (needs bash and python3)");
    assert!(
        output.status.success(),
        "scripts/test-venv.sh {name} could not make its venv:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A loopback port for a process the test starts, which binds it later.
///
/// Binding port 0 and passing the number on races: until the child binds
/// it, the kernel may hand the same number to another test's `bind(0)` or
/// to any outgoing connection. These ports come from below the kernel's
/// ephemeral range, which neither ever uses; each is handed out at most
/// once per test process (parallel tests never share one), from an offset
/// that depends on the pid (concurrent test processes rarely overlap);
/// one that something already holds is skipped. Each port also reserves
/// the [`PORT_STRIDE`]` - 1` after it, so one can be a
/// `--worker-metrics-port` base (worker slot i listens on base + i).
pub fn free_port() -> u16 {
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let ports = test_ports();
    let slots = u32::from(ports.end - ports.start) / PORT_STRIDE;
    let offset = std::process::id().wrapping_mul(7_919) % slots;
    for _ in 0..slots {
        let n = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        let port = u32::from(ports.start) + (offset + n) % slots * PORT_STRIDE;
        let port = u16::try_from(port).expect("test ports are below 65536");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {ports:?}");
}

/// Ports each [`free_port`] result reserves, itself included.
pub const PORT_STRIDE: u32 = 8;

/// Ports that are not ephemeral on this host: from 10,000 up to the start
/// of `ip_local_port_range` (Linux; 32,768 when it cannot be read), or
/// above its end when its start is lower than that.
fn test_ports() -> std::ops::Range<u16> {
    let ephemeral: Vec<u16> = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    match ephemeral[..] {
        [start, _] if start >= 12_000 => 10_000..start,
        [_, end] if end < 63_000 => end + 1..u16::MAX - 8,
        _ => 10_000..32_768,
    }
}

/// Fresh loopback endpoints for a router's three sockets and `/metrics`.
#[derive(Debug, Clone)]
pub struct RouterEndpoints {
    pub clients: String,
    pub workers: String,
    pub control: String,
    /// `host:port` of `/metrics`.
    pub metrics: String,
}

impl RouterEndpoints {
    pub fn fresh() -> RouterEndpoints {
        let tcp = || format!("tcp://127.0.0.1:{}", free_port());
        RouterEndpoints {
            clients: tcp(),
            workers: tcp(),
            control: tcp(),
            metrics: format!("127.0.0.1:{}", free_port()),
        }
    }

    /// The flags that put `zinfer router` (or `serve`) on them.
    pub fn args(&self) -> [&str; 8] {
        [
            "--clients",
            &self.clients,
            "--workers",
            &self.workers,
            "--control",
            &self.control,
            "--metrics",
            &self.metrics,
        ]
    }
}

/// A seeded xorshift generator: the tests' randomness replays from its seed
/// (which must not be 0).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// A child process killed when dropped.
pub struct Proc {
    pub child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Cluster {
    pub clients: String,
    pub workers_endpoint: String,
    pub control: String,
    pub router_metrics: String,
    policy: String,
    /// The router process; it lives as long as the cluster.
    router: Proc,
    pub workers: Vec<(String, Proc, String)>,
    _guard: MutexGuard<'static, ()>,
}

pub struct WorkerSpec {
    pub kv_tokens: usize,
}

impl Default for WorkerSpec {
    fn default() -> Self {
        WorkerSpec { kv_tokens: 8192 }
    }
}

impl Cluster {
    /// Starts a router with `policy` and `n` one-thread workers, and waits
    /// until every worker is ready.
    pub fn start(policy: &str, n: usize) -> Cluster {
        Cluster::start_with(policy, n, WorkerSpec::default())
    }

    pub fn start_with(policy: &str, n: usize, spec: WorkerSpec) -> Cluster {
        let guard = exclusive();
        let endpoints = RouterEndpoints::fresh();
        let router = spawn_router(&endpoints, policy);
        let mut cluster = Cluster {
            clients: endpoints.clients,
            workers_endpoint: endpoints.workers,
            control: endpoints.control,
            router_metrics: endpoints.metrics,
            policy: policy.to_string(),
            router,
            workers: Vec::new(),
            _guard: guard,
        };
        for i in 0..n {
            cluster.add_worker(&format!("w{i}"), &spec);
        }
        cluster.wait_ready(n);
        cluster
    }

    pub fn add_worker(&mut self, id: &str, spec: &WorkerSpec) {
        let metrics = format!("127.0.0.1:{}", free_port());
        let model = model_path();
        let proc = spawn(
            id,
            &[
                "worker",
                "--router",
                &self.workers_endpoint,
                "--model",
                &model.display().to_string(),
                "--id",
                id,
                "--device",
                &zinfer_probe::device::test_device(),
                "--threads",
                "1",
                "--kv-tokens",
                &spec.kv_tokens.to_string(),
                "--metrics",
                &metrics,
            ],
        );
        self.workers.push((id.to_string(), proc, metrics));
    }

    pub fn wait_ready(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = self
                .workers_info()
                .iter()
                .filter(|w| w.state == WorkerState::Ready)
                .count();
            if ready >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{n} workers did not become ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn workers_info(&self) -> Vec<WorkerInfo> {
        match admin(&self.control, &AdminRequest::Workers {}) {
            Some(AdminReply::Workers { workers }) => workers,
            _ => Vec::new(),
        }
    }

    pub fn worker_info(&self, id: &str) -> Option<WorkerInfo> {
        self.workers_info().into_iter().find(|w| w.id == id)
    }

    /// The router's process id.
    pub fn router_pid(&self) -> u32 {
        self.router.child.id()
    }

    /// Kills the router (SIGKILL, no goodbye to anyone) and starts a new
    /// one on the same endpoints.
    pub fn restart_router(&mut self) {
        let _ = self.router.child.kill();
        let _ = self.router.child.wait();
        let endpoints = RouterEndpoints {
            clients: self.clients.clone(),
            workers: self.workers_endpoint.clone(),
            control: self.control.clone(),
            metrics: self.router_metrics.clone(),
        };
        self.router = spawn_router(&endpoints, &self.policy);
    }

    /// Whether the router process has exited.
    pub fn router_exited(&mut self) -> bool {
        !matches!(self.router.child.try_wait(), Ok(None))
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.clients)
    }
}

fn spawn_router(endpoints: &RouterEndpoints, policy: &str) -> Proc {
    let mut args = vec!["router"];
    args.extend(endpoints.args());
    args.extend(["--policy", policy]);
    spawn("router", &args)
}

pub fn spawn<S: AsRef<std::ffi::OsStr>>(name: &str, args: &[S]) -> Proc {
    let child = Command::new(zinfer())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    Proc { child }
}

/// Starts `zinfer ARGS` and returns once its stderr shows `line` (the rest
/// of its stderr is passed through).
pub fn spawn_until(line: &str, args: &[&str]) -> Proc {
    use std::io::BufRead;
    let mut child = Command::new(zinfer())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting zinfer {args:?}: {e}"));
    let stderr = child.stderr.take().expect("piped stderr");
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let wanted = line.to_string();
    std::thread::spawn(move || {
        for text in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("{text}");
            if text.contains(&wanted) {
                let _ = seen_tx.send(());
            }
        }
    });
    let proc = Proc { child };
    seen_rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("zinfer {args:?} never printed {line:?}"));
    proc
}

/// `zinfer serve --http` on `model` with one thread, `kv_tokens` K/V
/// slots, free local ports and `extra` flags; returns the process and the
/// HTTP address once it is ready.
pub fn serve_http(model: &std::path::Path, kv_tokens: usize, extra: &[&str]) -> (Proc, String) {
    let endpoints = RouterEndpoints::fresh();
    let http = format!("127.0.0.1:{}", free_port());
    let worker_metrics = free_port().to_string();
    let (kv, model) = (kv_tokens.to_string(), model.display().to_string());
    let mut args = vec!["serve", "--threads", "1", "--kv-tokens", &kv];
    args.extend_from_slice(&endpoints.args());
    args.extend_from_slice(&[
        "--worker-metrics-port",
        &worker_metrics,
        "--model",
        &model,
        "--http",
        &http,
    ]);
    args.extend_from_slice(extra);
    (spawn_until("zinfer serve: ready", &args), http)
}

/// One request-reply on the control socket; `None` when nobody answers.
pub fn admin(control: &str, request: &AdminRequest) -> Option<AdminReply> {
    admin_within(control, request, Duration::from_secs(1))
}

/// [`admin`] with a reply allowed to take `timeout` (`scale` and
/// `migrate` answer once workers have loaded).
pub fn admin_within(
    control: &str,
    request: &AdminRequest,
    timeout: Duration,
) -> Option<AdminReply> {
    let context = zmq::Context::new();
    let socket = context.socket(zmq::DEALER).ok()?;
    socket.set_linger(0).ok()?;
    socket.connect(control).ok()?;
    socket
        .send(zinfer_protocol::encode(request).ok()?, 0)
        .ok()?;
    if socket.poll(zmq::POLLIN, timeout.as_millis() as i64).ok()? == 0 {
        return None;
    }
    let frame = socket.recv_bytes(0).ok()?;
    zinfer_protocol::decode(&frame, &Limits::default()).ok()
}

/// A DEALER client of the router's front socket.
pub struct Client {
    pub socket: zmq::Socket,
    _context: zmq::Context,
}

/// Everything the router sent for one request.
#[derive(Debug, Default)]
pub struct Outcome {
    pub chunks: Vec<ClientReply>,
    pub terminal: Option<ClientReply>,
}

impl Outcome {
    pub fn streamed_text(&self) -> String {
        self.chunks
            .iter()
            .map(|c| match c {
                ClientReply::Chunk {
                    body: ChunkBody { text, .. },
                    ..
                } => text.as_str(),
                _ => "",
            })
            .collect()
    }
}

impl Client {
    pub fn connect(endpoint: &str) -> Client {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::DEALER).expect("a DEALER");
        socket.set_linger(0).expect("linger");
        socket.connect(endpoint).expect("connect");
        Client {
            socket,
            _context: context,
        }
    }

    pub fn send(&self, request: &ClientRequest) {
        self.send_raw(&zinfer_protocol::encode(request).expect("encode"));
    }

    pub fn send_raw(&self, frame: &[u8]) {
        self.socket.send(frame, 0).expect("send");
    }

    /// The next reply, or `None` after `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<ClientReply> {
        if self
            .socket
            .poll(zmq::POLLIN, timeout.as_millis() as i64)
            .ok()?
            == 0
        {
            return None;
        }
        let frame = self.socket.recv_bytes(0).ok()?;
        Some(zinfer_protocol::decode(&frame, &Limits::default()).expect("a valid reply"))
    }

    /// Sends `request` and collects replies until its terminal message.
    pub fn generate(&self, request: GenerateRequest) -> Outcome {
        self.send(&ClientRequest::Generate(request));
        self.collect(Duration::from_secs(120))
    }

    /// Starts a greedy `ignore_eos` request long enough to be interrupted,
    /// and waits for its first chunk.
    pub fn start_stream(&self, id: &str, prompt: &str, max_tokens: u32) {
        let mut request = greedy(id, prompt, max_tokens);
        request.ignore_eos = true;
        self.send(&ClientRequest::Generate(request));
        let first = self.recv(Duration::from_secs(60));
        assert!(
            matches!(first, Some(ClientReply::Chunk { .. })),
            "expected a first chunk, got {first:?}"
        );
    }

    pub fn collect(&self, timeout: Duration) -> Outcome {
        let mut outcome = Outcome::default();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let Some(reply) = self.recv(deadline - Instant::now()) else {
                break;
            };
            match reply {
                ClientReply::Chunk { .. } => outcome.chunks.push(reply),
                ClientReply::Done { .. } | ClientReply::Error { .. } => {
                    outcome.terminal = Some(reply);
                    return outcome;
                }
                _ => {}
            }
        }
        outcome
    }
}

/// A greedy request for `prompt`.
pub fn greedy(id: &str, prompt: &str, max_tokens: u32) -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt(id, prompt);
    request.temperature = 0.0;
    request.max_tokens = max_tokens;
    request
}

/// Fetches `http://addr/metrics`.
pub fn scrape(addr: &str) -> String {
    try_scrape(addr).unwrap_or_else(|| panic!("no 200 answer from http://{addr}/metrics"))
}

/// `POST path` with a JSON `body` on `addr`; returns the status and body.
pub fn http_post(addr: &str, path: &str, body: &str) -> (u16, String) {
    http_post_bytes(addr, path, body.as_bytes(), Duration::from_secs(600))
}

/// `POST path` with raw `body` bytes, waiting up to `timeout` for each
/// read; the status and the body. Tolerates the server answering (and
/// closing) before the body is all sent; status 0 and why when nothing
/// came back.
pub fn http_post_bytes(addr: &str, path: &str, body: &[u8], timeout: Duration) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connecting to the HTTP front");
    stream
        .set_read_timeout(Some(timeout))
        .expect("a read timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let sent = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body));
    let mut response = Vec::new();
    let read = stream.read_to_end(&mut response);
    if response.is_empty() {
        return (0, format!("no answer (send: {sent:?}, read: {read:?})"));
    }
    let response = String::from_utf8_lossy(&response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The `/metrics` body, or `None` while the endpoint is not up (or not
/// answering 200).
pub fn try_scrape(addr: &str) -> Option<String> {
    http_get(addr, "/metrics")
}

/// The body of `GET path` on `addr`, or `None` unless it answers 200.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    if !response.starts_with("HTTP/1.1 200") {
        return None;
    }
    response.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

#[test]
fn free_ports_are_distinct_spaced_and_not_ephemeral() {
    let ports = test_ports();
    let handed: Vec<u16> = (0..64).map(|_| free_port()).collect();
    let mut sorted = handed.clone();
    sorted.sort_unstable();
    for pair in sorted.windows(2) {
        assert!(
            u32::from(pair[1] - pair[0]) >= PORT_STRIDE,
            "ports closer than the stride: {pair:?}"
        );
    }
    for port in handed {
        assert!(ports.contains(&port), "{port} outside {ports:?}");
        // The kernel never picks it for bind(0) or connect().
        TcpListener::bind(("127.0.0.1", port)).expect("a handed-out port is free");
    }
}

/// `zinfer http` running in front of a test cluster's router.
pub struct HttpFront {
    _process: Proc,
    /// Where it listens, `127.0.0.1:PORT`.
    pub addr: String,
}

impl HttpFront {
    /// The process id of `zinfer http`.
    pub fn pid(&self) -> u32 {
        self._process.child.id()
    }

    /// The OpenAI base URL, `http://ADDR/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

/// `zinfer http` in front of `cluster`'s router, serving the default model
/// as `smol`.
pub fn http_front(cluster: &Cluster) -> HttpFront {
    http_front_for(&cluster.clients, &["--served-model-name", "smol"])
}

/// `zinfer http` in front of the router at `clients`, with `args` added.
pub fn http_front_for(clients: &str, args: &[&str]) -> HttpFront {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut all = vec!["http", "--router", clients, "--listen", &addr];
    all.extend_from_slice(args);
    let process = spawn_until("listening on", &all);
    HttpFront {
        _process: process,
        addr,
    }
}

/// Runs `tests/e2e/SCRIPT` with the openai venv's python and `args`, and
/// asserts it succeeded and printed `passed` (its last line says so).
pub fn openai_script(script: &str, args: &[&str], passed: &str) {
    venv_script("openai", script, args, passed);
}

/// Runs `tests/e2e/SCRIPT` with the python of `scripts/test-venv.sh VENV`
/// and `args`, and asserts it succeeded and printed `passed`.
pub fn venv_script(venv: &str, script: &str, args: &[&str], passed: &str) {
    let python = venv_python(venv);
    let path = format!("{}/../../tests/e2e/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(&python)
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(
        output.status.success() && stdout.contains(passed),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
