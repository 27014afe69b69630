//! Reliability: an idle router sleeps, worker ids do not collide, a
//! client without a router says so quickly, and faults with real
//! processes (a hung worker, a restarted router, a stalled client,
//! garbage at load) end every request once.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use zinfer_protocol::{ClientReply, ClientRequest, ErrorCode, WorkerState};

use crate::harness::{self, Cluster};

/// User plus system CPU time of process `pid` so far, from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the parenthesised command name, which may hold spaces.
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // In USER_HZ, which Linux fixes at 100 per second on every
    // architecture zinfer builds for.
    Duration::from_millis(ticks * 10)
}

#[test]
fn an_idle_router_with_a_worker_uses_almost_no_cpu() {
    let cluster = Cluster::start("cache_aware", 1);
    let pid = cluster.router_pid();
    // Let registration traffic settle, then measure a quiet stretch.
    std::thread::sleep(Duration::from_millis(500));
    let window = Duration::from_secs(5);
    let (cpu_before, start) = (cpu_time(pid), Instant::now());
    std::thread::sleep(window);
    let used = cpu_time(pid).saturating_sub(cpu_before);
    let share = used.as_secs_f64() / start.elapsed().as_secs_f64();
    eprintln!(
        "idle router: {used:?} CPU in {window:?} ({:.2}% of a core)",
        share * 100.0
    );
    assert!(
        share < 0.03,
        "an idle router used {:.1}% of a core",
        share * 100.0
    );
    // The models reply carries what the worker reported of its model.
    let client = cluster.client();
    client.send(&zinfer_protocol::ClientRequest::Models { id: None });
    match client.recv(Duration::from_secs(5)) {
        Some(zinfer_protocol::ClientReply::Models { models, .. }) => {
            assert_eq!(models[0].context_length, Some(8192), "{models:?}");
            assert_eq!(models[0].vocab_size, Some(49152), "{models:?}");
        }
        other => panic!("expected models, got {other:?}"),
    }
    // Sleeping between timers still heartbeats: the worker stays ready.
    let info = cluster.worker_info("w0").expect("worker w0 listed");
    assert_eq!(info.state, zinfer_protocol::WorkerState::Ready, "{info:?}");
    assert!(info.last_seen_s < 1.5, "{info:?}");
}

#[test]
fn generate_without_a_router_says_so_within_seconds() {
    let endpoint = format!("tcp://127.0.0.1:{}", harness::free_port());
    let start = Instant::now();
    let output = std::process::Command::new(harness::zinfer())
        .args(["generate", "--router", &endpoint, "Hello"])
        .output()
        .expect("running zinfer generate");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("no reply from {endpoint}"))
            && stderr.contains("is the router running?"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
}

/// Every reply `client` gets within `timeout`, grouped by request id,
/// returning once each of `ids` has a terminal reply and a further
/// `linger` has passed without anything new (so duplicates show up).
fn replies_by_id(
    client: &harness::Client,
    ids: &[&str],
    timeout: Duration,
    linger: Duration,
) -> HashMap<String, Vec<ClientReply>> {
    let mut by_id: HashMap<String, Vec<ClientReply>> = HashMap::new();
    let deadline = Instant::now() + timeout;
    let all_ended = |by_id: &HashMap<String, Vec<ClientReply>>| {
        ids.iter()
            .all(|id| by_id.get(*id).is_some_and(|r| r.iter().any(is_terminal)))
    };
    loop {
        let wait = if all_ended(&by_id) {
            linger
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        let Some(reply) = client.recv(wait) else {
            return by_id;
        };
        let id = match &reply {
            ClientReply::Chunk { id, .. } | ClientReply::Done { id, .. } => id.to_string(),
            ClientReply::Error { id, .. } => id.as_deref().unwrap_or("").to_string(),
            _ => String::new(),
        };
        by_id.entry(id).or_default().push(reply);
    }
}

fn is_terminal(reply: &ClientReply) -> bool {
    matches!(reply, ClientReply::Done { .. } | ClientReply::Error { .. })
}

fn terminals(replies: &[ClientReply]) -> Vec<&ClientReply> {
    replies.iter().filter(|r| is_terminal(r)).collect()
}

fn long_request(id: &str, max_tokens: u32, stream: bool) -> ClientRequest {
    let mut request = harness::greedy(id, "1, 2, 3, 4, 5, 6, 7, 8,", max_tokens);
    request.ignore_eos = true;
    request.stream = stream;
    ClientRequest::Generate(request)
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

#[test]
fn a_hung_worker_is_expired_its_requests_end_once_and_it_comes_back() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let cluster = Cluster::start("round_robin", 2);
    let client = cluster.client();
    // A streamed request that has shown output lands on the victim...
    client.start_stream("s1", "1, 2, 3, 4, 5, 6, 7, 8,", 4000);
    let victim = cluster
        .workers_info()
        .into_iter()
        .find(|w| w.inflight == 1)
        .expect("a worker running s1")
        .id;
    let survivor = if victim == "w0" { "w1" } else { "w0" }.to_string();
    // ...a short one goes round to the survivor, and a non-streamed one
    // (never shown anything) back to the victim.
    let outcome = client.generate(harness::greedy("f1", "Hello", 2));
    assert!(
        matches!(&outcome.terminal, Some(ClientReply::Done { worker, .. }) if *worker == survivor),
        "{outcome:?}"
    );
    client.send(&long_request("n1", 24, false));
    wait_until("n1 in flight on the victim", Duration::from_secs(5), || {
        cluster
            .worker_info(&victim)
            .is_some_and(|w| w.inflight == 2)
    });
    let pid = cluster
        .workers
        .iter()
        .find(|(id, ..)| *id == victim)
        .map(|(_, proc, _)| Pid::from_raw(proc.child.id() as i32))
        .unwrap();
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped_at = Instant::now();

    // s1 ends with worker_lost, once, within heartbeat expiry plus slack.
    let by_id = replies_by_id(&client, &["s1"], Duration::from_secs(8), Duration::ZERO);
    let detected = stopped_at.elapsed();
    let s1 = terminals(by_id.get("s1").map(Vec::as_slice).unwrap_or(&[]))
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert!(
        matches!(
            s1.as_slice(),
            [ClientReply::Error {
                code: ErrorCode::WorkerLost,
                retryable: true,
                ..
            }]
        ),
        "s1 after {detected:?}: {s1:?}"
    );
    assert!(
        detected < Duration::from_secs(5),
        "s1 ended after {detected:?}"
    );
    eprintln!("hung worker detected after {detected:?}");

    // A new request goes to the survivor, while the victim is still stopped.
    client.send(&ClientRequest::Generate(harness::greedy("g1", "Hello", 2)));
    // n1 is retried on the survivor: one done, from there, nothing else.
    let by_id = replies_by_id(
        &client,
        &["n1", "g1"],
        Duration::from_secs(60),
        Duration::from_millis(500),
    );
    for id in ["n1", "g1"] {
        let replies = by_id.get(id).cloned().unwrap_or_default();
        assert!(
            matches!(
                terminals(&replies).as_slice(),
                [ClientReply::Done { worker, .. }] if *worker == survivor
            ),
            "{id}: {replies:?}"
        );
    }
    assert!(
        !cluster
            .worker_info(&victim)
            .is_some_and(|w| w.state == WorkerState::Ready),
        "a stopped worker still listed ready"
    );

    // SIGCONT: the victim registers again, its stale work shows the
    // client nothing, and it serves.
    kill(pid, Signal::SIGCONT).unwrap();
    let back = wait_until("the victim ready again", Duration::from_secs(15), || {
        cluster
            .worker_info(&victim)
            .is_some_and(|w| w.state == WorkerState::Ready)
    });
    eprintln!("resumed worker ready again after {back:?}");
    let late = replies_by_id(&client, &[], Duration::ZERO, Duration::from_secs(2));
    assert!(late.is_empty(), "replies after the terminal ones: {late:?}");
    client.send(&ClientRequest::Generate(harness::greedy("r1", "Hello", 2)));
    client.send(&ClientRequest::Generate(harness::greedy("r2", "Hello", 2)));
    let by_id = replies_by_id(
        &client,
        &["r1", "r2"],
        Duration::from_secs(60),
        Duration::ZERO,
    );
    let served: HashSet<String> = ["r1", "r2"]
        .iter()
        .filter_map(|id| match terminals(by_id.get(*id)?).as_slice() {
            [ClientReply::Done { worker, .. }] => Some(worker.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        served,
        HashSet::from([victim.clone(), survivor.clone()]),
        "{by_id:?}"
    );
}

#[test]
fn workers_re_register_with_a_restarted_router_on_their_own() {
    let mut cluster = Cluster::start("least_load", 2);
    let client = cluster.client();
    client.start_stream("lost", "1, 2, 3, 4, 5, 6, 7, 8,", 4000);
    cluster.restart_router();
    let restarted = Instant::now();
    let took = wait_until(
        "both workers registered again",
        Duration::from_secs(10),
        || {
            cluster
                .workers_info()
                .iter()
                .filter(|w| w.state == WorkerState::Ready)
                .count()
                == 2
        },
    );
    eprintln!("workers re-registered {took:?} after the router restart");
    // The old client's socket reconnects too, and a new request succeeds.
    let outcome = client.generate(harness::greedy("ok", "Hello", 2));
    assert!(
        matches!(outcome.terminal, Some(ClientReply::Done { .. })),
        "{outcome:?}"
    );
    let outcome = cluster
        .client()
        .generate(harness::greedy("ok2", "Hello", 2));
    assert!(
        matches!(outcome.terminal, Some(ClientReply::Done { .. })),
        "{outcome:?}"
    );
    eprintln!("served again {:?} after the restart", restarted.elapsed());
    assert!(!cluster.router_exited());
}
