//! The control plane with real processes: a router, `zinfer supervisor`
//! starting real workers on the default model, clients streaming through
//! scaling, draining and live migration.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zinfer_protocol::{
    AdminReply, AdminRequest, ClientReply, ClientRequest, DoneBody, GenerateRequest, Limits,
    WorkerInfo, WorkerState,
};

use crate::harness::{self, Client, Proc, RouterEndpoints};

/// A router and one supervisor, on fresh loopback ports.
pub(crate) struct ControlPlane {
    pub(crate) clients: String,
    pub(crate) control: String,
    pub(crate) metrics: String,
    _router: Proc,
    _supervisor: Proc,
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl ControlPlane {
    /// `router_args` and `supervisor_args` are added to the defaults (one
    /// thread and a small KV pool per worker).
    pub(crate) fn start(router_args: &[&str], supervisor_args: &[&str]) -> ControlPlane {
        let guard = harness::exclusive();
        let endpoints = RouterEndpoints::fresh();
        let mut args = vec!["router"];
        args.extend(endpoints.args());
        args.extend_from_slice(router_args);
        let router = harness::spawn("router", &args);
        let model = harness::model_path().display().to_string();
        let mut args = vec![
            "supervisor",
            "--control",
            &endpoints.control,
            "--router",
            &endpoints.workers,
        ];
        args.extend_from_slice(supervisor_args);
        // With --models-dir the models come from there alone.
        let model_flag = if supervisor_args.contains(&"--models-dir") {
            "--models-dir"
        } else {
            "--model"
        };
        for (flag, value) in [
            (model_flag, model.as_str()),
            ("--threads", "1"),
            ("--kv-tokens", "8192"),
            ("--max-batch", "8"),
        ] {
            if !supervisor_args.contains(&flag) {
                args.extend_from_slice(&[flag, value]);
            }
        }
        let supervisor = harness::spawn("supervisor", &args);
        let plane = ControlPlane {
            clients: endpoints.clients.clone(),
            control: endpoints.control.clone(),
            metrics: endpoints.metrics.clone(),
            _router: router,
            _supervisor: supervisor,
            _guard: guard,
        };
        plane.wait_for_supervisor();
        plane
    }

    /// Waits until the supervisor has registered with the router.
    pub(crate) fn wait_for_supervisor(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.try_metric("zinfer_router_supervisors").unwrap_or(0.0) < 1.0 {
            assert!(Instant::now() < deadline, "the supervisor did not register");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn call(&self, request: &AdminRequest) -> AdminReply {
        call(&self.control, request, Duration::from_secs(180))
    }

    /// Scales `model`, retrying while the supervisor has not registered yet.
    pub(crate) fn scale(&self, model: &str, workers: u32) -> (bool, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let reply = self.call(&AdminRequest::Scale {
                model: model.into(),
                workers,
                device: None,
            });
            match reply {
                AdminReply::Ack { ok: false, message }
                    if message.contains("no supervisor") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                AdminReply::Ack { ok, message } => return (ok, message),
                other => panic!("scale answered {other:?}"),
            }
        }
    }

    pub(crate) fn workers(&self) -> Vec<WorkerInfo> {
        match self.call(&AdminRequest::Workers {}) {
            AdminReply::Workers { workers } => workers,
            other => panic!("workers answered {other:?}"),
        }
    }

    pub(crate) fn serving(&self) -> Vec<WorkerInfo> {
        self.workers()
            .into_iter()
            .filter(|w| w.state == WorkerState::Ready)
            .collect()
    }

    pub(crate) fn metric(&self, name: &str) -> f64 {
        self.try_metric(name)
            .unwrap_or_else(|| panic!("no metric {name} at {}", self.metrics))
    }

    /// A sample's value, or `None` when the endpoint is not up (yet) or
    /// has no such sample.
    pub(crate) fn try_metric(&self, name: &str) -> Option<f64> {
        harness::try_scrape(&self.metrics)?
            .lines()
            .find(|line| line.starts_with(name) && !line.starts_with('#'))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
    }
}

/// One request and its reply on a fresh control connection.
fn call(control: &str, request: &AdminRequest, timeout: Duration) -> AdminReply {
    harness::admin_within(control, request, timeout)
        .unwrap_or_else(|| panic!("no reply to {request:?} within {timeout:?}"))
}

fn model_name() -> String {
    zinfer_probe::model_name(&harness::model_path())
}

/// Clients that stream greedy requests in a loop until stopped, and count
/// what they sent and what ended them.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<LoadReport>>,
}

#[derive(Debug, Default)]
struct LoadReport {
    sent: usize,
    done: usize,
    errors: Vec<String>,
    /// Ids answered more than once, or answered without being sent.
    duplicates: usize,
}

impl Load {
    fn start(clients: &str, n: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let (clients, stop) = (clients.to_string(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let client = Client::connect(&clients);
                    let mut report = LoadReport::default();
                    let mut ended = HashSet::new();
                    while !stop.load(Ordering::Relaxed) {
                        let id = format!("load-{i}-{}", report.sent);
                        let mut request =
                            harness::greedy(&id, "Write one short line about the sea.", 12);
                        request.stream = true;
                        client.send(&ClientRequest::Generate(request));
                        report.sent += 1;
                        let outcome = client.collect(Duration::from_secs(120));
                        match outcome.terminal {
                            Some(ClientReply::Done { id: done_id, .. }) => {
                                report.done += 1;
                                if done_id != id || !ended.insert(done_id) {
                                    report.duplicates += 1;
                                }
                            }
                            Some(ClientReply::Error { code, message, .. }) => {
                                report.errors.push(format!("{code}: {message}"));
                            }
                            other => report.errors.push(format!("no terminal reply: {other:?}")),
                        }
                    }
                    // Nothing more may arrive for a request that ended.
                    if client.recv(Duration::from_millis(300)).is_some() {
                        report.duplicates += 1;
                    }
                    report
                })
            })
            .collect();
        Load { stop, threads }
    }

    fn finish(self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = LoadReport::default();
        for thread in self.threads {
            let report = thread.join().expect("a load thread");
            total.sent += report.sent;
            total.done += report.done;
            total.errors.extend(report.errors);
            total.duplicates += report.duplicates;
        }
        total
    }
}

fn assert_nothing_lost(report: &LoadReport) {
    assert!(report.sent > 0, "no load was sent");
    assert!(
        report.errors.is_empty(),
        "errors under load: {:?}",
        report.errors
    );
    assert_eq!(
        report.done, report.sent,
        "every request ends once: {report:?}"
    );
    assert_eq!(report.duplicates, 0, "{report:?}");
}

#[test]
fn concurrent_scales_start_exactly_the_workers_needed() {
    let plane = ControlPlane::start(&[], &[]);
    let model = model_name();
    let replies: Arc<Mutex<Vec<AdminReply>>> = Arc::default();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (control, model, replies) =
                (plane.control.clone(), model.clone(), Arc::clone(&replies));
            std::thread::spawn(move || {
                let context = zmq::Context::new();
                let socket = context.socket(zmq::DEALER).unwrap();
                socket.set_linger(0).unwrap();
                socket.connect(&control).unwrap();
                let request = AdminRequest::Scale {
                    model,
                    workers: 2,
                    device: None,
                };
                for _ in 0..8 {
                    socket
                        .send(zinfer_protocol::encode(&request).unwrap(), 0)
                        .unwrap();
                }
                for _ in 0..8 {
                    assert!(
                        socket.poll(zmq::POLLIN, 180_000).unwrap() > 0,
                        "a scale waited forever"
                    );
                    let reply =
                        zinfer_protocol::decode(&socket.recv_bytes(0).unwrap(), &Limits::default())
                            .unwrap();
                    replies.lock().unwrap().push(reply);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let replies = replies.lock().unwrap();
    assert_eq!(replies.len(), 64);
    assert!(
        replies
            .iter()
            .all(|r| matches!(r, AdminReply::Ack { ok: true, .. })),
        "{replies:?}"
    );
    assert_eq!(plane.serving().len(), 2);
    assert_eq!(plane.metric("zinfer_router_spawns_total"), 2.0);
    let outcome = Client::connect(&plane.clients).generate(harness::greedy("after", "Hello", 4));
    assert!(
        matches!(outcome.terminal, Some(ClientReply::Done { .. })),
        "{outcome:?}"
    );
}

#[test]
fn a_bad_model_fails_every_waiter_at_once_and_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.gguf");
    std::fs::write(&broken, b"GGUF but not really a model file").unwrap();
    let broken = broken.display().to_string();
    let plane = ControlPlane::start(&[], &["--model", &broken]);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let control = plane.control.clone();
            std::thread::spawn(move || {
                call(
                    &control,
                    &AdminRequest::Scale {
                        model: "broken".into(),
                        workers: 2,
                        device: None,
                    },
                    Duration::from_secs(120),
                )
            })
        })
        .collect();
    let replies: Vec<AdminReply> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for reply in &replies {
        let AdminReply::Ack { ok: false, message } = reply else {
            panic!("expected a failure, got {reply:?}");
        };
        assert!(message.contains("exited before registering"), "{message}");
    }
    let spawned = plane.metric("zinfer_router_spawns_total");
    assert!(spawned <= 2.0, "{spawned} spawns");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        plane.metric("zinfer_router_spawns_total"),
        spawned,
        "nothing spawned again on its own"
    );
    assert!(plane.metric("zinfer_router_spawn_failures_total") >= 1.0);
    assert!(plane.workers().is_empty());
}

#[test]
fn a_spawn_over_the_memory_budget_is_refused_with_the_numbers() {
    let plane = ControlPlane::start(&[], &["--memory-budget", "64MiB"]);
    let (ok, message) = plane.scale(&model_name(), 1);
    assert!(!ok);
    assert!(message.contains("needs about"), "{message}");
    assert!(message.contains("free (budget 64 MiB"), "{message}");
    assert!(message.contains("--memory-budget"), "{message}");
    assert!(plane.workers().is_empty());
}

#[test]
fn scaling_up_and_down_under_load_loses_nothing() {
    let plane = ControlPlane::start(&[], &[]);
    let model = model_name();
    assert!(plane.scale(&model, 1).0);
    let load = Load::start(&plane.clients, 3);
    std::thread::sleep(Duration::from_secs(2));
    let (ok, message) = plane.scale(&model, 3);
    assert!(ok, "{message}");
    assert_eq!(plane.serving().len(), 3);
    std::thread::sleep(Duration::from_secs(3));
    let (ok, message) = plane.scale(&model, 1);
    assert!(ok, "{message}");
    std::thread::sleep(Duration::from_secs(3));
    let report = load.finish();
    assert_nothing_lost(&report);
    let deadline = Instant::now() + Duration::from_secs(30);
    while plane.workers().len() > 1 {
        assert!(
            Instant::now() < deadline,
            "drained workers did not stop: {:?}",
            plane.workers()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(plane.serving().len(), 1);
    assert!(plane.metric("zinfer_router_drain_seconds_count") >= 2.0);
}

/// Prompts that share nothing with each other: each is a long document.
fn documents(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let words: Vec<String> = (0..60)
                .map(|w| format!("item{}x{}", i * 97 + w, w % 7))
                .collect();
            format!("Document {i}: {}.", words.join(" "))
        })
        .collect()
}

/// Sends one greedy request per document (with `suffix`), and returns the
/// share of prompt tokens served from the cache.
fn hit_ratio(clients: &str, docs: &[String], suffix: &str) -> f64 {
    let client = Client::connect(clients);
    let (mut cached, mut prompt) = (0u64, 0u64);
    for (i, doc) in docs.iter().enumerate() {
        let request: GenerateRequest =
            harness::greedy(&format!("{suffix}-{i}"), &format!("{doc} {suffix}"), 2);
        match client.generate(request).terminal {
            Some(ClientReply::Done {
                body: DoneBody { usage, .. },
                ..
            }) => {
                cached += u64::from(usage.cached_tokens);
                prompt += u64::from(usage.prompt_tokens);
            }
            other => panic!("request failed: {other:?}"),
        }
    }
    cached as f64 / prompt.max(1) as f64
}

#[test]
fn migration_carries_the_hot_cache_and_loses_nothing() {
    let plane = ControlPlane::start(&[], &["--device", "cpu:0,cpu:1"]);
    let model = model_name();
    assert!(plane.scale(&model, 1).0);
    let first = plane.serving().remove(0);
    let docs = documents(16);
    hit_ratio(&plane.clients, &docs, "Summarize.");
    let before = hit_ratio(&plane.clients, &docs, "Translate.");
    assert!(before > 0.5, "warm cache hit ratio {before}");

    // Migrate under load, to the other core group, carrying the cache.
    let target = if first.device == "cpu:0" {
        "cpu:1"
    } else {
        "cpu:0"
    };
    let load = Load::start(&plane.clients, 2);
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let reply = plane.call(&AdminRequest::Migrate {
        worker: first.id.clone(),
        device: target.into(),
        carry_tokens: None,
    });
    let took = started.elapsed();
    let AdminReply::Ack { ok: true, message } = reply else {
        panic!("migration failed: {reply:?}");
    };
    std::thread::sleep(Duration::from_secs(1));
    let report = load.finish();
    assert_nothing_lost(&report);
    eprintln!("migration: {message} ({took:?} at the client)");
    assert!(message.contains("carried"), "{message}");
    let serving = plane.serving();
    assert_eq!(serving.len(), 1);
    assert_ne!(serving[0].id, first.id);
    assert_eq!(serving[0].device, target);
    let after = hit_ratio(&plane.clients, &docs, "Explain.");
    eprintln!("hit ratio before {before:.3}, after a carrying migration {after:.3}");
    assert!(
        after >= 0.8 * before,
        "before {before:.3}, after {after:.3}"
    );
    assert!(plane.metric("zinfer_router_migration_kv_tokens_total") > 0.0);

    // The control: migrating back without the cache loses the hits.
    let reply = plane.call(&AdminRequest::Migrate {
        worker: serving[0].id.clone(),
        device: first.device.clone(),
        carry_tokens: Some(0),
    });
    assert!(
        matches!(reply, AdminReply::Ack { ok: true, .. }),
        "{reply:?}"
    );
    let cold = hit_ratio(&plane.clients, &docs, "Rewrite.");
    eprintln!("hit ratio after a migration without the cache {cold:.3}");
    assert!(cold < 0.2 * before, "before {before:.3}, cold {cold:.3}");

    // A migration that cannot happen leaves the service as it was, and
    // `zinfer ctl` says why with a failing exit status.
    let current = plane.serving().remove(0);
    let output = std::process::Command::new(harness::zinfer())
        .args([
            "ctl",
            "--control",
            &plane.control,
            "migrate",
            &current.id,
            "cuda:0",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("keeps serving"), "{stderr}");
    assert_eq!(plane.serving().remove(0).id, current.id);
    let outcome = Client::connect(&plane.clients).generate(harness::greedy("still", "Hi", 3));
    assert!(
        matches!(outcome.terminal, Some(ClientReply::Done { .. })),
        "{outcome:?}"
    );
}

#[test]
fn the_autoscaler_follows_a_burst_and_an_idle_period() {
    let plane = ControlPlane::start(
        &[
            "--autoscale-max",
            "2",
            "--autoscale-min",
            "1",
            "--autoscale-queue",
            "1",
            "--autoscale-up-window",
            "2",
            "--autoscale-idle-window",
            "4",
        ],
        &["--max-batch", "2"],
    );
    // The autoscaler brings the model to its minimum on its own.
    let deadline = Instant::now() + Duration::from_secs(60);
    while plane.serving().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no worker started for the minimum"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A burst: 24 requests at once for a worker that takes 4.
    let client = Client::connect(&plane.clients);
    for i in 0..24 {
        let mut request = harness::greedy(&format!("burst-{i}"), "Count to twenty.", 40);
        request.ignore_eos = true;
        client.send(&ClientRequest::Generate(request));
    }
    let mut peak = 1;
    let mut ended = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while ended < 24 {
        assert!(Instant::now() < deadline, "the burst did not finish");
        if let Some(reply) = client.recv(Duration::from_millis(200)) {
            match reply {
                ClientReply::Done { .. } => ended += 1,
                ClientReply::Error { message, .. } => panic!("burst request failed: {message}"),
                _ => {}
            }
        }
        peak = peak.max(plane.serving().len());
    }
    assert_eq!(peak, 2, "the burst added a worker");
    // Idle: back to the minimum.
    let deadline = Instant::now() + Duration::from_secs(60);
    while plane.serving().len() > 1 {
        assert!(Instant::now() < deadline, "the idle worker was not removed");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(plane.metric("zinfer_router_autoscale_decisions_total{direction=\"up\"}") >= 1.0);
    assert!(plane.metric("zinfer_router_autoscale_decisions_total{direction=\"down\"}") >= 1.0);
}
