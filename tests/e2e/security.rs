//! CURVE end to end: keys made by `zinfer keys generate`, a router with
//! allow-lists on every socket, real workers, `zinfer ctl`, `zinfer
//! generate`, the Python client, and tenancy taken from the client's key.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use zinfer_curve::{ClientCurve, KeyPair, read_public_key};
use zinfer_protocol::{
    AdminReply, AdminRequest, ClientReply, ClientRequest, DoneBody, Limits, Timings, Usage,
    WorkerState,
};

use crate::harness::{
    Proc, RouterEndpoints, exclusive, free_port, greedy, model_path, scrape, spawn, venv_python,
    zinfer,
};

/// Runs `zinfer keys generate` for each name into `dir`.
fn generate_keys(dir: &Path, names: &[&str]) {
    for name in names {
        let output = Command::new(zinfer())
            .args(["keys", "generate", "--out"])
            .arg(dir)
            .args(["--name", name])
            .output()
            .expect("running zinfer keys generate");
        assert!(
            output.status.success(),
            "keys generate {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A DEALER on `endpoint`, with CURVE as `own` (from a key pair file)
/// when given.
fn dealer(
    context: &zmq::Context,
    endpoint: &str,
    server: &Path,
    own: Option<&Path>,
) -> zmq::Socket {
    let socket = context.socket(zmq::DEALER).expect("a DEALER");
    socket.set_linger(0).expect("linger");
    if let Some(own) = own {
        let curve = ClientCurve::from_files(server, Some(own)).expect("key files");
        zinfer_curve::apply_client(&socket, Some(&curve)).expect("CURVE client");
    }
    socket.connect(endpoint).expect("connect");
    socket
}

fn recv<T: zinfer_protocol::WireMessage>(socket: &zmq::Socket, timeout: Duration) -> Option<T> {
    if socket.poll(zmq::POLLIN, timeout.as_millis() as i64).ok()? == 0 {
        return None;
    }
    let frame = socket.recv_bytes(0).ok()?;
    Some(zinfer_protocol::decode(&frame, &Limits::default()).expect("a valid reply"))
}

fn send(socket: &zmq::Socket, message: &impl zinfer_protocol::WireMessage) {
    socket
        .send(zinfer_protocol::encode(message).expect("encode"), 0)
        .expect("send");
}

/// A request's `done`: its usage and timings, and whether any chunk came.
fn generate(
    socket: &zmq::Socket,
    request: zinfer_protocol::GenerateRequest,
) -> (Usage, Timings, bool) {
    let id = request.id.clone();
    send(socket, &ClientRequest::Generate(request));
    let mut chunks = false;
    loop {
        match recv::<ClientReply>(socket, Duration::from_secs(120)) {
            Some(ClientReply::Chunk { .. }) => chunks = true,
            Some(ClientReply::Done {
                id: done_id,
                body: DoneBody { usage, timings, .. },
                ..
            }) if done_id == id => return (usage, timings, chunks),
            Some(ClientReply::Error { message, .. }) => panic!("{id}: error {message}"),
            Some(_) => {}
            None => panic!("{id}: no done within 120 s"),
        }
    }
}

fn refusals(metrics: &str, socket: &str) -> f64 {
    let series = format!("zinfer_router_auth_refusals_total{{socket=\"{socket}\"}} ");
    scrape(metrics)
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} on the router's /metrics"))
}

fn ctl_workers(control: &str, keys: &[(&str, &Path)]) -> (bool, String, String) {
    let mut command = Command::new(zinfer());
    command.args(["ctl", "--control", control, "workers"]);
    for (flag, path) in keys {
        command.arg(flag).arg(path);
    }
    let output = command.output().expect("running zinfer ctl");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn spawn_worker(id: &str, router: &str, server: &Path, key: &Path) -> Proc {
    spawn(
        id,
        &[
            "worker",
            "--router",
            router,
            "--model",
            &model_path().display().to_string(),
            "--id",
            id,
            "--device",
            &zinfer_probe::device::test_device(),
            "--threads",
            "1",
            "--kv-tokens",
            "8192",
            "--curve-server-key",
            &server.display().to_string(),
            "--curve-key",
            &key.display().to_string(),
        ],
    )
}

/// Ready workers by id, asked over CURVE with the admin key.
fn ready_workers(
    context: &zmq::Context,
    control: &str,
    server: &Path,
    admin: &Path,
) -> Vec<String> {
    let socket = dealer(context, control, server, Some(admin));
    send(&socket, &AdminRequest::Workers {});
    match recv::<AdminReply>(&socket, Duration::from_secs(2)) {
        Some(AdminReply::Workers { workers }) => workers
            .into_iter()
            .filter(|w| w.state == WorkerState::Ready)
            .map(|w| w.id)
            .collect(),
        _ => Vec::new(),
    }
}

/// A prompt of a few hundred tokens, so a cached prefix shows in TTFT.
fn long_prompt() -> String {
    (0..40)
        .map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog number {i}."))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn curve_allow_lists_and_tenancy_from_client_keys() {
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("a temp dir");
    let keys = dir.path();
    generate_keys(
        keys,
        &["router", "worker", "admin", "alice", "bob", "stranger"],
    );
    let path = |name: &str| -> PathBuf { keys.join(name) };

    // The key files: a secret file of mode 0600 holding both halves, the
    // public one alone in .pub, and no overwrite without --force.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path("alice.key"))
            .expect("alice.key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let pair = KeyPair::read(&path("alice.key")).expect("a key pair file");
        assert_eq!(
            read_public_key(&path("alice.pub")).expect(".pub"),
            pair.public()
        );
        let again = Command::new(zinfer())
            .args(["keys", "generate", "--out"])
            .arg(keys)
            .args(["--name", "alice"])
            .output()
            .expect("running zinfer keys generate");
        assert!(!again.status.success(), "overwrote alice.key");
        assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
        assert_eq!(
            KeyPair::read(&path("alice.key"))
                .expect("unchanged")
                .public(),
            pair.public()
        );
    }
    // Clients: a directory of .pub files; workers and admins: one file each.
    let client_dir = keys.join("clients");
    std::fs::create_dir(&client_dir).expect("mkdir");
    for name in ["alice.pub", "bob.pub"] {
        std::fs::copy(path(name), client_dir.join(name)).expect("copy");
    }

    let RouterEndpoints {
        clients,
        workers,
        control,
        metrics,
    } = RouterEndpoints::fresh();
    let _router = spawn(
        "router",
        &[
            "router",
            "--clients",
            &clients,
            "--workers",
            &workers,
            "--control",
            &control,
            "--metrics",
            &metrics,
            "--curve-key",
            &path("router.key").display().to_string(),
            "--client-keys",
            &client_dir.display().to_string(),
            "--worker-keys",
            &path("worker.pub").display().to_string(),
            "--admin-keys",
            &path("admin.pub").display().to_string(),
        ],
    );
    let server = path("router.pub");
    let context = zmq::Context::new();

    // An allowed worker registers.
    let _worker = spawn_worker("w-ok", &workers, &server, &path("worker.key"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while ready_workers(&context, &control, &server, &path("admin.key")) != ["w-ok"] {
        assert!(
            Instant::now() < deadline,
            "the allowed worker never registered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // An allowed client is served.
    let alice = dealer(&context, &clients, &server, Some(&path("alice.key")));
    let (usage, _, chunks) = generate(&alice, greedy("warm", "Hello there, how are you?", 4));
    assert!(chunks && usage.completion_tokens == 4, "{usage:?}");

    // An unknown key and a plaintext client get nothing, and are counted.
    let before = refusals(&metrics, "clients");
    let stranger = dealer(&context, &clients, &server, Some(&path("stranger.key")));
    send(&stranger, &ClientRequest::Generate(greedy("s", "Hi", 2)));
    assert!(recv::<ClientReply>(&stranger, Duration::from_secs(2)).is_none());
    let plain = context.socket(zmq::DEALER).expect("a DEALER");
    plain.set_linger(0).expect("linger");
    plain.connect(&clients).expect("connect");
    send(&plain, &ClientRequest::Ping { id: None });
    assert!(recv::<ClientReply>(&plain, Duration::from_secs(2)).is_none());
    drop((stranger, plain));
    let after = refusals(&metrics, "clients");
    assert!(after >= before + 2.0, "refusals {before} -> {after}");

    // A worker with an unknown key never registers.
    let workers_refused = refusals(&metrics, "workers");
    let rogue = spawn_worker("w-rogue", &workers, &server, &path("stranger.key"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while refusals(&metrics, "workers") <= workers_refused {
        assert!(
            Instant::now() < deadline,
            "the rogue worker's refusal was not counted"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        ready_workers(&context, &control, &server, &path("admin.key")),
        ["w-ok"]
    );
    drop(rogue);

    // `zinfer ctl`: nothing without the admin key, a table with it.
    let (ok, stdout, stderr) = ctl_workers(&control, &[]);
    assert!(!ok, "ctl without keys was answered:\n{stdout}");
    assert!(stderr.contains("--curve-server-key"), "{stderr}");
    let (ok, _, _) = ctl_workers(
        &control,
        &[
            ("--curve-server-key", &server),
            ("--curve-key", &path("alice.key")),
        ],
    );
    assert!(!ok, "a client key was let onto the control socket");
    let (ok, stdout, stderr) = ctl_workers(
        &control,
        &[
            ("--curve-server-key", &server),
            ("--curve-key", &path("admin.key")),
        ],
    );
    assert!(ok && stdout.contains("w-ok"), "{stdout}\n{stderr}");

    // `zinfer generate` with a client key.
    let output = Command::new(zinfer())
        .args([
            "generate",
            "--router",
            &clients,
            "--max-tokens",
            "3",
            "--temperature",
            "0",
        ])
        .arg("--curve-server-key")
        .arg(&server)
        .arg("--curve-key")
        .arg(path("bob.key"))
        .arg("The capital of France is")
        .output()
        .expect("running zinfer generate");
    assert!(
        output.status.success() && !output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Tenancy: alice's second identical prompt hits her cache...
    let prompt = long_prompt();
    let (cold, cold_timings, _) = generate(&alice, greedy("a1", &prompt, 1));
    assert!(cold.prompt_tokens > 300, "{cold:?}");
    let (warm, warm_timings, _) = generate(&alice, greedy("a2", &prompt, 1));
    assert!(
        warm.cached_tokens > cold.prompt_tokens / 2,
        "alice's repeat was not cached: {warm:?}"
    );
    // ...bob's identical prompt does not, even naming alice's tenant as
    // his namespace (or an empty one).
    let bob = dealer(&context, &clients, &server, Some(&path("bob.key")));
    let alice_tenant = KeyPair::read(&path("alice.key"))
        .expect("alice")
        .public()
        .tenant();
    let mut spoof = greedy("b1", &prompt, 1);
    spoof.namespace = Some(alice_tenant);
    let (stolen, bob_timings, _) = generate(&bob, spoof);
    assert_eq!(
        stolen.cached_tokens, 0,
        "bob read alice's cache: {stolen:?}"
    );
    let mut empty = greedy("b2", &prompt, 1);
    empty.namespace = Some(String::new());
    let (own, _, _) = generate(&bob, empty);
    assert_eq!(
        own.cached_tokens, 0,
        "bob's own tenant has no entry yet: {own:?}"
    );
    // TTFT agrees: bob paid for a cold prefill (a hit would be many times
    // faster), while alice's hit was faster than her cold run.
    assert!(
        bob_timings.ttft_s >= 0.5 * cold_timings.ttft_s,
        "bob {:.3} s vs cold {:.3} s",
        bob_timings.ttft_s,
        cold_timings.ttft_s
    );
    assert!(
        warm_timings.prefill_s < cold_timings.prefill_s,
        "warm prefill {:.3} s vs cold {:.3} s",
        warm_timings.prefill_s,
        cold_timings.prefill_s
    );

    // The Python client over CURVE: served with alice's key, refused (and
    // told so by the handshake's failure, not left to time out) with an
    // unknown one.
    let python = venv_python("client");
    let script = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
from zinfer_client import Client, ZinferRefused, load_key_pair, load_public_key
server = load_public_key(sys.argv[3])
out = {}
public, secret = load_key_pair(sys.argv[4])
with Client(sys.argv[2], timeout=120, curve_server_key=server,
            curve_public_key=public, curve_secret_key=secret) as client:
    done = client.generate("The capital of France is", max_tokens=3, temperature=0)
    out["completion_tokens"] = done.usage["completion_tokens"]
public, secret = load_key_pair(sys.argv[5])
try:
    Client(sys.argv[2], connect_timeout=1, curve_server_key=server,
           curve_public_key=public, curve_secret_key=secret).models()
except ZinferRefused as e:
    out["stranger"] = [e.code, e.retryable]
print(json.dumps(out))
"#;
    let output = Command::new(&python)
        .args(["-c", script])
        .arg(format!(
            "{}/../../clients/python",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(&clients)
        .arg(&server)
        .arg(path("alice.key"))
        .arg(path("stranger.key"))
        .output()
        .expect("running the client venv's python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python client:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(out["completion_tokens"], 3, "{out}");
    assert_eq!(
        out["stranger"],
        serde_json::json!(["refused", false]),
        "a stranger's key is refused at once, and says so: {out}"
    );
}

#[test]
fn the_router_refuses_an_open_control_socket_and_incomplete_curve_flags() {
    let dir = tempfile::tempdir().expect("a temp dir");
    generate_keys(dir.path(), &["router", "worker"]);
    let router = |extra: &[&str]| {
        let port = |_| format!("tcp://127.0.0.1:{}", free_port());
        let (clients, workers) = (port(0), port(1));
        let output = Command::new(zinfer())
            .args([
                "router",
                "--no-metrics",
                "--clients",
                &clients,
                "--workers",
                &workers,
            ])
            .args(extra)
            .output()
            .expect("running zinfer router");
        assert!(
            !output.status.success(),
            "the router started with {extra:?}"
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let open = format!("tcp://0.0.0.0:{}", free_port());
    let stderr = router(&["--control", &open]);
    assert!(
        stderr.contains("not on loopback") && stderr.contains("--admin-keys"),
        "{stderr}"
    );
    let key = dir.path().join("router.key").display().to_string();
    let stderr = router(&["--curve-key", &key]);
    assert!(stderr.contains("--worker-keys"), "{stderr}");
    let workers = dir.path().join("worker.pub").display().to_string();
    let stderr = router(&["--curve-key", &key, "--worker-keys", &workers]);
    assert!(stderr.contains("--admin-keys"), "{stderr}");
    let public = dir.path().join("router.pub").display().to_string();
    let stderr = router(&[
        "--curve-key",
        &public,
        "--worker-keys",
        &workers,
        "--admin-keys",
        &workers,
    ]);
    assert!(
        stderr.contains("router.pub") && stderr.contains("secret:"),
        "a .pub given as the key pair: {stderr}"
    );
    let stderr = router(&["--client-keys", &workers]);
    assert!(stderr.contains("--curve-key"), "{stderr}");
}

#[test]
fn serve_with_curve_lets_its_own_workers_and_http_front_in() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("a temp dir");
    let keys = dir.path();
    generate_keys(keys, &["router", "admin", "alice"]);
    let path = |name: &str| keys.join(name).display().to_string();
    let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
    let clients = format!("tcp://127.0.0.1:{}", ports[0]);
    // Off loopback: allowed, because CURVE guards it.
    let control = format!("tcp://0.0.0.0:{}", ports[2]);
    let http = format!("127.0.0.1:{}", ports[5]);
    let mut serve = crate::harness::spawn_until(
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
            &control,
            "--metrics",
            &format!("127.0.0.1:{}", ports[3]),
            "--worker-metrics-port",
            &ports[4].to_string(),
            "--model",
            &model_path().display().to_string(),
            "--http",
            &http,
            "--curve-key",
            &path("router.key"),
            "--client-keys",
            &path("alice.pub"),
            "--admin-keys",
            &path("admin.pub"),
        ],
    );
    let serve_pid = serve.child.id();
    let key_dirs = || -> Vec<PathBuf> {
        std::fs::read_dir(std::env::temp_dir())
            .expect("temp dir")
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("zinfer-serve-{serve_pid}-")))
            })
            .collect()
    };
    assert_eq!(
        key_dirs().len(),
        1,
        "serve keeps its workers' keys in one private dir"
    );

    // Its workers registered over CURVE (serve printed `ready`); a client
    // on the list is served, and the admin key lists the worker.
    let context = zmq::Context::new();
    let server = keys.join("router.pub");
    let alice = dealer(&context, &clients, &server, Some(&keys.join("alice.key")));
    let (usage, _, chunks) = generate(&alice, greedy("a", "Hello there", 3));
    assert!(chunks && usage.completion_tokens == 3, "{usage:?}");
    let local_control = format!("tcp://127.0.0.1:{}", ports[2]);
    let (ok, stdout, stderr) = ctl_workers(
        &local_control,
        &[
            ("--curve-server-key", &server),
            ("--curve-key", &keys.join("admin.key")),
        ],
    );
    assert!(ok && stdout.contains("cpu"), "{stdout}\n{stderr}");

    // The in-process HTTP front reaches the router too.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        use std::io::{Read, Write};
        let mut response = String::new();
        if let Ok(mut stream) = std::net::TcpStream::connect(&http) {
            let _ = write!(
                stream,
                "GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            );
            let _ = stream.read_to_string(&mut response);
        }
        if response.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the HTTP front never got ready: {response}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    kill(Pid::from_raw(serve_pid as i32), Signal::SIGTERM).expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(60);
    while serve.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(key_dirs().is_empty(), "serve left its key dir behind");
}

#[test]
fn a_supervisor_with_keys_starts_workers_that_get_in_and_any_curve_client_is_served() {
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("a temp dir");
    let keys = dir.path();
    generate_keys(keys, &["router", "admin", "worker"]);
    let path = |name: &str| keys.join(name).display().to_string();
    let RouterEndpoints {
        clients,
        workers,
        control,
        metrics,
    } = RouterEndpoints::fresh();
    // No --client-keys: any CURVE client.
    let _router = spawn(
        "router",
        &[
            "router",
            "--clients",
            &clients,
            "--workers",
            &workers,
            "--control",
            &control,
            "--metrics",
            &metrics,
            "--curve-key",
            &path("router.key"),
            "--worker-keys",
            &path("worker.pub"),
            "--admin-keys",
            &path("admin.pub"),
        ],
    );
    let model = model_path();
    let model_arg = model.display().to_string();
    let supervisor_args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "supervisor",
            "--control",
            &control,
            "--router",
            &workers,
            "--model",
            &model_arg,
            "--threads",
            "1",
            "--kv-tokens",
            "8192",
            "--curve-server-key",
            &path("router.pub"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };

    // Without a key for its workers it stops at once, saying which flag.
    let output = Command::new(zinfer())
        .args(supervisor_args(&[]))
        .output()
        .expect("running zinfer supervisor");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--worker-curve-key"), "{stderr}");

    let args = supervisor_args(&[
        "--curve-key",
        &path("admin.key"),
        "--worker-curve-key",
        &path("worker.key"),
        "--device",
        "cpu:0",
        "--device",
        "cpu:1",
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _supervisor = spawn("supervisor", &args);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !scrape(&metrics)
        .lines()
        .any(|line| line == "zinfer_router_supervisors 1")
    {
        assert!(
            Instant::now() < deadline,
            "the supervisor never registered over CURVE"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // `ctl scale` (admin key) has it start a worker, which gets in with
    // the worker key the supervisor handed it.
    let name = model
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a model file name")
        .to_string();
    let output = Command::new(zinfer())
        .args(["ctl", "--control", &control, "scale", &name, "1"])
        .args([
            "--curve-server-key",
            &path("router.pub"),
            "--curve-key",
            &path("admin.key"),
        ])
        .output()
        .expect("running zinfer ctl scale");
    assert!(
        output.status.success(),
        "scale failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // A client with a throwaway key (no --curve-key) is served: the router
    // has no client allow-list.
    let output = Command::new(zinfer())
        .args([
            "generate",
            "--router",
            &clients,
            "--max-tokens",
            "3",
            "--temperature",
            "0",
        ])
        .args(["--curve-server-key", &path("router.pub")])
        .arg("The capital of France is")
        .output()
        .expect("running zinfer generate");
    assert!(
        output.status.success() && !output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // A migration carries the cache over CURVE too: the replacement's
    // import socket is a CURVE server whose key its `ready` announces, and
    // the old worker sends the K/V to that key alone.
    let context = zmq::Context::new();
    let server = keys.join("router.pub");
    let client = dealer(&context, &clients, &server, Some(&keys.join("admin.key")));
    let (usage, _, _) = generate(&client, greedy("warm", &long_prompt(), 2));
    assert!(usage.prompt_tokens > 100, "{usage:?}");
    let admin = dealer(&context, &control, &server, Some(&keys.join("admin.key")));
    send(&admin, &AdminRequest::Workers {});
    let Some(AdminReply::Workers { workers }) = recv::<AdminReply>(&admin, Duration::from_secs(5))
    else {
        panic!("no worker list");
    };
    let worker = workers
        .into_iter()
        .find(|w| w.state == WorkerState::Ready)
        .expect("a ready worker");
    let target = if worker.device == "cpu:0" {
        "cpu:1"
    } else {
        "cpu:0"
    };
    send(
        &admin,
        &AdminRequest::Migrate {
            worker: worker.id.clone(),
            device: target.into(),
            carry_tokens: None,
        },
    );
    let reply = recv::<AdminReply>(&admin, Duration::from_secs(180));
    let Some(AdminReply::Ack { ok: true, message }) = reply else {
        panic!("the migration failed: {reply:?}");
    };
    let carried: u64 = message
        .split("carried ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(carried > 100, "{message}");
    let (usage, _, _) = generate(&client, greedy("after", &long_prompt(), 2));
    assert!(
        usage.cached_tokens > 100,
        "the carried cache serves: {usage:?}"
    );
}
