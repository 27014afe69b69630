//! End-to-end tests: the real `zinfer` binary as router and worker
//! processes on loopback ports, the real default model, and DEALER clients.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub
)]

mod architectures;
mod clients;
mod constraint;
mod control;
mod deploy;
mod harmony;
mod harness;
mod http;
mod http_abuse;
mod http_clients;
mod multihost;
mod on_demand;
mod params;
mod reliability;
mod rerank;
mod security;
mod soak;
mod text;
mod tools;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use harness::{Client, Cluster, WorkerSpec, greedy, scrape};
use zinfer_protocol::{ChunkBody, ClientReply, ClientRequest, DoneBody, ErrorCode, FinishReason};

const SHORT: &str = "The three primary colors are";

#[test]
fn streaming_and_non_streaming_generate() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();

    let streamed = client.generate(greedy("s1", SHORT, 12));
    let Some(ClientReply::Done {
        id,
        body:
            DoneBody {
                finish_reason,
                text,
                usage,
                worker,
                ..
            },
        ..
    }) = streamed.terminal.clone()
    else {
        panic!("no done: {streamed:?}");
    };
    assert_eq!(id, "s1");
    assert_eq!(finish_reason, FinishReason::Length);
    assert_eq!(text, None, "streamed requests carry text in chunks");
    assert_eq!(usage.completion_tokens, 12);
    assert!(usage.prompt_tokens > 3);
    assert_eq!(worker.as_deref(), Some("w0"));
    assert!(!streamed.chunks.is_empty());
    for (i, chunk) in streamed.chunks.iter().enumerate() {
        let ClientReply::Chunk {
            id,
            body: ChunkBody { index, .. },
            ..
        } = chunk
        else {
            unreachable!()
        };
        assert_eq!(id, "s1");
        assert_eq!(*index as usize, i, "chunk indices count from 0");
    }
    let streamed_text = streamed.streamed_text();
    assert!(!streamed_text.trim().is_empty());

    let mut request = greedy("n1", SHORT, 12);
    request.stream = false;
    let whole = client.generate(request);
    assert!(whole.chunks.is_empty(), "no chunks when stream=false");
    let Some(ClientReply::Done {
        body: DoneBody { text, .. },
        ..
    }) = whole.terminal
    else {
        panic!("no done: {whole:?}");
    };
    assert_eq!(
        text.as_deref(),
        Some(streamed_text.as_str()),
        "greedy output is the same streamed or not"
    );
}

#[test]
fn ignore_eos_generates_exactly_max_tokens() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();
    let mut request = greedy("e1", "", 64);
    request.prompt = None;
    request.messages = Some(vec![
        zinfer_protocol::ChatMessage::new("system", "Answer in one short sentence."),
        zinfer_protocol::ChatMessage::new("user", "What is the capital of France?"),
    ]);
    let natural = client.generate(request.clone());
    let Some(ClientReply::Done {
        body: DoneBody { usage, .. },
        ..
    }) = natural.terminal
    else {
        panic!("no done: {natural:?}");
    };
    assert!(
        usage.completion_tokens < 64,
        "the model stops by itself here, so the test can see ignore_eos matter: {natural:?}"
    );
    request.id = "e2".into();
    request.ignore_eos = true;
    let forced = client.generate(request);
    match forced.terminal {
        Some(ClientReply::Done {
            body:
                DoneBody {
                    finish_reason,
                    usage,
                    ..
                },
            ..
        }) => {
            assert_eq!(finish_reason, FinishReason::Length);
            assert_eq!(usage.completion_tokens, 64);
        }
        other => panic!("expected done, got {other:?}"),
    }
}

#[test]
fn concurrent_clients_each_get_one_terminal_message() {
    let cluster = Cluster::start("least_load", 1);
    let clients: Vec<Client> = (0..32).map(|_| cluster.client()).collect();
    for (i, client) in clients.iter().enumerate() {
        let mut request = greedy("same-id", &format!("Count to {i}:"), 6);
        request.temperature = 0.8;
        request.seed = Some(i as u64);
        client.send(&ClientRequest::Generate(request));
    }
    for client in &clients {
        let outcome = client.collect(Duration::from_secs(180));
        match outcome.terminal {
            Some(ClientReply::Done { id, .. }) => assert_eq!(id, "same-id"),
            other => panic!("expected done, got {other:?}"),
        }
        assert!(
            client.recv(Duration::from_millis(50)).is_none(),
            "exactly one terminal message"
        );
    }
}

#[test]
fn cancel_mid_stream_frees_the_sequence() {
    let cluster = Cluster::start("cache_aware", 1);
    let idle_running = cluster.worker_info("w0").unwrap().load.running;
    assert_eq!(idle_running, 0);
    let client = cluster.client();
    client.start_stream("c1", "1, 2, 3, 4, 5, 6, 7, 8,", 2000);
    client.send(&ClientRequest::Cancel { id: "c1".into() });
    let outcome = client.collect(Duration::from_secs(30));
    match outcome.terminal {
        Some(ClientReply::Done {
            body: DoneBody { finish_reason, .. },
            ..
        }) => {
            assert_eq!(finish_reason, FinishReason::Cancelled)
        }
        other => panic!("expected done/cancelled, got {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let load = cluster.worker_info("w0").unwrap().load;
        if load.running == 0 && load.waiting == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sequence still running: {load:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cache_aware_keeps_a_shared_prefix_on_one_worker_round_robin_spreads() {
    let system = "You are a meticulous assistant for a shipping company. \
        Answer questions about parcels, customs forms, tracking numbers and delivery windows. \
        Always be concise, polite and accurate, and never invent tracking data. "
        .repeat(4);
    let questions = [
        "Where is my parcel?",
        "How do I fill a customs form?",
        "What is a delivery window?",
        "Can I change the address?",
    ];
    let run = |policy: &str| -> (HashMap<String, usize>, u32) {
        let cluster = Cluster::start(policy, 2);
        let client = cluster.client();
        let mut per_worker = HashMap::new();
        let mut cached = 0;
        for (i, q) in questions.iter().enumerate() {
            let outcome = client.generate(greedy(&format!("q{i}"), &format!("{system}{q}"), 2));
            let Some(ClientReply::Done {
                body: DoneBody { worker, usage, .. },
                ..
            }) = outcome.terminal
            else {
                panic!("no done: {outcome:?}");
            };
            *per_worker.entry(worker.unwrap_or_default()).or_insert(0) += 1;
            cached += usage.cached_tokens;
        }
        (per_worker, cached)
    };
    let (sticky, cached) = run("cache_aware");
    assert_eq!(sticky.len(), 1, "cache_aware used {sticky:?}");
    assert!(cached > 0, "later requests reuse the cached system prompt");
    let (spread, _) = run("round_robin");
    assert_eq!(spread.len(), 2, "round_robin used {spread:?}");
}

#[test]
fn killing_a_worker_mid_stream_gives_worker_lost_and_the_router_keeps_serving() {
    let mut cluster = Cluster::start("least_load", 1);
    let client = cluster.client();
    client.start_stream("k1", "1, 2, 3, 4, 5, 6, 7, 8,", 4000);
    let killed_at = Instant::now();
    let (_, mut proc, _) = cluster.workers.remove(0);
    proc.child.kill().unwrap();
    let outcome = client.collect(Duration::from_secs(10));
    match outcome.terminal {
        Some(ClientReply::Error {
            id,
            code,
            retryable,
            ..
        }) => {
            assert_eq!(id.as_deref(), Some("k1"));
            assert_eq!(code, ErrorCode::WorkerLost);
            assert!(retryable);
        }
        other => panic!("expected worker_lost, got {other:?}"),
    }
    assert!(killed_at.elapsed() < Duration::from_secs(5));

    client.send(&ClientRequest::Ping {
        id: Some("p".into()),
    });
    assert!(matches!(
        client.recv(Duration::from_secs(2)),
        Some(ClientReply::Pong { .. })
    ));
    cluster.add_worker("w1", &WorkerSpec::default());
    cluster.wait_ready(1);
    let outcome = client.generate(greedy("k2", SHORT, 3));
    assert!(
        matches!(outcome.terminal, Some(ClientReply::Done { body: DoneBody { ref worker, .. }, .. }) if worker.as_deref() == Some("w1")),
        "{outcome:?}"
    );
}

#[test]
fn malformed_frames_get_bad_request_and_the_router_keeps_serving() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();
    for garbage in [
        &b"\xc1\xff not msgpack"[..],
        &b"\x81\xa4type\xa7explode"[..],
        &b"\x80"[..],
    ] {
        client.send_raw(garbage);
        match client.recv(Duration::from_secs(2)) {
            Some(ClientReply::Error { code, message, .. }) => {
                assert_eq!(code, ErrorCode::BadRequest);
                assert!(!message.is_empty());
            }
            other => panic!("expected bad_request, got {other:?}"),
        }
    }
    let outcome = client.generate(greedy("ok", SHORT, 2));
    assert!(
        matches!(outcome.terminal, Some(ClientReply::Done { .. })),
        "{outcome:?}"
    );
}

#[test]
fn prompt_longer_than_the_pool_is_rejected_clearly() {
    let cluster = Cluster::start_with("cache_aware", 1, WorkerSpec { kv_tokens: 256 });
    let client = cluster.client();
    let outcome = client.generate(greedy("long", &"word ".repeat(600), 4));
    match outcome.terminal {
        Some(ClientReply::Error { code, message, .. }) => {
            assert_eq!(code, ErrorCode::PromptTooLong, "{message}");
        }
        other => panic!("expected prompt_too_long, got {other:?}"),
    }
    let outcome = client.generate(greedy("short", SHORT, 2));
    assert!(matches!(outcome.terminal, Some(ClientReply::Done { .. })));
}

#[test]
fn metrics_endpoints_pass_promtool() {
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();
    let outcome = client.generate(greedy("m1", SHORT, 4));
    assert!(matches!(outcome.terminal, Some(ClientReply::Done { .. })));
    std::thread::sleep(Duration::from_millis(300));
    let worker_metrics = &cluster.workers[0].2;
    for (who, addr) in [
        ("router", cluster.router_metrics.as_str()),
        ("worker", worker_metrics.as_str()),
    ] {
        let text = scrape(addr);
        assert!(
            text.contains(&format!("zinfer_{who}_requests_total")),
            "{who} metrics:\n{text}"
        );
        promtool(&["check", "metrics"], &text);
    }
    let worker_text = scrape(worker_metrics);
    assert!(worker_text.contains("zinfer_worker_time_to_first_token_seconds_count 1"));
    let worker = &cluster.workers_info()[0];
    let info = format!(
        "zinfer_worker_info{{device=\"{}\",model=\"{}\"}} 1",
        worker.device, worker.models[0]
    );
    assert!(
        worker_text.contains(&info),
        "{info} missing:\n{worker_text}"
    );
    for (who, addr) in [
        ("router", cluster.router_metrics.as_str()),
        ("worker", worker_metrics.as_str()),
    ] {
        let text = scrape(addr);
        for family in [
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
        ] {
            assert!(
                text.contains(&format!("\n{family} ")),
                "{who}: no {family}:\n{text}"
            );
        }
    }
}

/// Runs `promtool ARGS`, feeding `stdin`, and fails the test with its output
/// unless it succeeds.
fn promtool(args: &[&str], stdin: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool not found: run scripts/setup.sh or apt-get install prometheus");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn python_client_example_streams_from_a_real_router() {
    let cluster = Cluster::start("cache_aware", 1);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/python/client.py"
    );
    let python = harness::venv_python("client");
    let output = std::process::Command::new(&python)
        .args([
            script,
            "--router",
            &cluster.clients,
            "--max-tokens",
            "8",
            "--temperature",
            "0",
            "Name a fruit:",
        ])
        .output()
        .unwrap_or_else(|e| panic!("running {python}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "client failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("finish_reason=length") && stderr.contains("completion_tokens=8"),
        "client summary missing:\n{stderr}"
    );
    assert!(!stdout.trim().is_empty(), "streamed text missing");
}

#[test]
fn deploy_prometheus_config_passes_promtool() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/prometheus.yml");
    promtool(&["check", "config", config], "");
}

#[test]
fn sigterm_lets_a_worker_finish_in_flight_requests_then_exit() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let mut cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();
    client.start_stream("t1", "Once upon a time", 200);
    let worker = &mut cluster.workers[0].1.child;
    kill(Pid::from_raw(worker.id() as i32), Signal::SIGTERM).unwrap();
    let outcome = client.collect(Duration::from_secs(30));
    match outcome.terminal {
        Some(ClientReply::Done {
            body:
                DoneBody {
                    finish_reason,
                    usage,
                    ..
                },
            ..
        }) => {
            assert_eq!(finish_reason, FinishReason::Length);
            assert_eq!(usage.completion_tokens, 200);
        }
        other => panic!("expected the request to finish, got {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = worker.try_wait().unwrap() {
            assert!(status.success(), "worker exit status {status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "worker still running after its grace"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_replaces_a_worker_that_dies_and_stops_cleanly_on_sigterm() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let _guard = harness::exclusive();
    let ports: Vec<String> = (0..5).map(|_| harness::free_port().to_string()).collect();
    let clients = format!("tcp://127.0.0.1:{}", ports[0]);
    let control = format!("tcp://127.0.0.1:{}", ports[2]);
    let mut serve = harness::spawn_until(
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
            &ports[4],
            "--model",
            &harness::model_path().display().to_string(),
        ],
    );
    let serve_pid = serve.child.id();
    // Workers are children of serve's supervisor thread: look at every task.
    let children = || -> Vec<i32> {
        let tasks = std::fs::read_dir(format!("/proc/{serve_pid}/task"))
            .into_iter()
            .flatten();
        tasks
            .filter_map(Result::ok)
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .flat_map(|list| {
                list.split_whitespace()
                    .filter_map(|pid| pid.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    };
    let generate_once = |id: &str| {
        let outcome = Client::connect(&clients).generate(greedy(id, SHORT, 3));
        assert!(
            matches!(outcome.terminal, Some(ClientReply::Done { .. })),
            "{outcome:?}"
        );
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let ready_workers =
        || match harness::admin(&control, &zinfer_protocol::AdminRequest::Workers {}) {
            Some(zinfer_protocol::AdminReply::Workers { workers }) => workers
                .iter()
                // The killed worker is reported lost by its supervisor at
                // once; its replacement is a new id, ready.
                .filter(|w| w.state == zinfer_protocol::WorkerState::Ready)
                .count(),
            _ => 0,
        };

    generate_once("before");
    let first = children();
    assert_eq!(first.len(), 1, "one worker process: {first:?}");
    kill(Pid::from_raw(first[0]), Signal::SIGKILL).unwrap();
    wait_for("a replacement worker", &|| {
        let now = children();
        now.len() == 1 && now != first && ready_workers() == 1
    });
    generate_once("after");

    kill(Pid::from_raw(serve_pid as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = serve.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "serve exit status {status}");
}
