//! Models loaded on demand, on a virtual clock: single-flight cold starts,
//! failed loads, keep-alive unloading, LRU eviction and fail-fast.

use std::time::Duration;

use zinfer_protocol::{KeepAlive, ModelInfo, ModelOffer, ModelState, SupervisorToRouter};

use super::*;

const GIB: u64 = 1 << 30;

/// A supervisor "host" offering `models` (name, bytes per worker).
struct Host {
    models: Vec<(&'static str, u64)>,
    budget: u64,
    keep_alive: Option<KeepAlive>,
}

impl Host {
    fn new(models: &[(&'static str, u64)], budget: u64) -> Self {
        Host {
            models: models.to_vec(),
            budget,
            keep_alive: None,
        }
    }
}

impl Harness {
    /// The host reports, its workers holding `used` bytes.
    fn host_status(&mut self, host: &Host, used: u64, workers: &[&str]) {
        let status = SupervisorToRouter::SupervisorStatus {
            supervisor_id: "host-sup".into(),
            host: "host".into(),
            models: host
                .models
                .iter()
                .map(|&(name, bytes)| ModelOffer {
                    name: name.into(),
                    path: format!("/models/{name}.gguf"),
                    worker_bytes: bytes,
                    keep_alive: host.keep_alive,
                })
                .collect(),
            devices: vec!["cpu".into()],
            memory_budget_bytes: host.budget,
            memory_used_bytes: used,
            workers: workers.iter().map(|w| w.to_string()).collect(),
        };
        self.host_says(&status);
    }

    fn host_says(&mut self, message: &SupervisorToRouter) {
        let frame = encode(message).unwrap();
        self.core
            .handle_admin(self.now, &Addr::new("host-sup"), &frame);
    }

    /// Lets `millis` pass in steps of at most a second, the host and
    /// `workers` reporting each step as live ones do.
    fn pass(&mut self, millis: u64, host: &Host, used: u64, workers: &[&str]) -> Vec<Out> {
        let mut out = Vec::new();
        let mut left = millis;
        while left > 0 {
            let step = left.min(1_000);
            left -= step;
            for worker in workers {
                self.worker(worker, &WorkerToRouter::Heartbeat {});
            }
            self.host_status(host, used, workers);
            self.advance(step);
            out.extend(self.sent());
        }
        out
    }

    /// Spawn requests sent so far: (worker id, model).
    fn spawned(&mut self) -> Vec<(String, String)> {
        self.sent()
            .into_iter()
            .filter_map(|out| match out {
                Out::Supervisor(RouterToSupervisor::Spawn {
                    worker_id, model, ..
                }) => Some((worker_id, model)),
                _ => None,
            })
            .collect()
    }

    /// Loads `model` through one request and finishes it; the worker's id.
    fn load(&mut self, model: &str, request: &str) -> String {
        self.generate("c", for_model(request, model));
        let spawned = self.spawned();
        assert_eq!(spawned.len(), 1, "{spawned:?}");
        let id = spawned[0].0.clone();
        self.ready(&id, &[model], 8);
        let dispatched = self.dispatched();
        assert_eq!(dispatched.len(), 1);
        self.done(&id, dispatched[0].1, FinishReason::Stop);
        self.sent();
        id
    }

    fn models(&mut self) -> Vec<ModelInfo> {
        self.client("c", &ClientRequest::Models { id: None });
        self.client_replies()
            .into_iter()
            .find_map(|reply| match reply {
                ClientReply::Models { models, .. } => Some(models),
                _ => None,
            })
            .expect("a models reply")
    }

    fn state(&mut self, model: &str) -> Option<ModelState> {
        self.models()
            .into_iter()
            .find(|info| info.name == model)
            .and_then(|info| info.state)
    }

    /// Workers told to drain among `out`.
    fn drains(out: &[Out]) -> Vec<String> {
        out.iter()
            .filter_map(|o| match o {
                Out::Worker(to, RouterToWorker::Drain {}) => {
                    Some(String::from_utf8_lossy(to).into_owned())
                }
                _ => None,
            })
            .collect()
    }

    /// The host saw `worker` exit as asked.
    fn exited(&mut self, worker: &str) {
        self.host_says(&SupervisorToRouter::WorkerExited {
            worker_id: worker.into(),
            status: "exit status: 0".into(),
        });
    }
}

fn for_model(id: &str, model: &str) -> GenerateRequest {
    GenerateRequest {
        model: Some(model.into()),
        ..prompt(id, "hello")
    }
}

fn errors(replies: &[ClientReply]) -> Vec<(ErrorCode, String)> {
    replies
        .iter()
        .filter_map(|reply| match reply {
            ClientReply::Error { code, message, .. } => Some((*code, message.clone())),
            _ => None,
        })
        .collect()
}

fn keep_alive_config(seconds: u64) -> RouterConfig {
    RouterConfig {
        keep_alive: KeepAlive::For(Duration::from_secs(seconds)),
        ..config(Policy::LeastLoad)
    }
}

#[test]
fn concurrent_first_requests_start_one_worker_and_all_run_on_it() {
    let mut h = Harness::new(config(Policy::LeastLoad));
    h.host_status(&Host::new(&[("a", GIB), ("b", GIB)], 8 * GIB), 0, &[]);
    assert_eq!(h.state("a"), Some(ModelState::Unloaded));
    for i in 0..64 {
        h.generate(
            &format!("client-{}", i % 8),
            for_model(&format!("r{i}"), "a"),
        );
    }
    let out = h.sent();
    let spawned: Vec<&Out> = out
        .iter()
        .filter(|o| matches!(o, Out::Supervisor(RouterToSupervisor::Spawn { .. })))
        .collect();
    assert_eq!(spawned.len(), 1, "one cold start for 64 requests");
    assert!(
        !out.iter()
            .any(|o| matches!(o, Out::Client(_, ClientReply::Error { .. }))),
        "nobody fails while the model loads"
    );
    assert_eq!(h.metrics.cold_starts.get(), 1);
    assert_eq!(h.state("a"), Some(ModelState::Loading));
    assert_eq!(h.state("b"), Some(ModelState::Unloaded));
    let Out::Supervisor(RouterToSupervisor::Spawn { worker_id, .. }) = spawned[0] else {
        unreachable!()
    };
    let worker_id = worker_id.clone();
    h.now += Duration::from_millis(1500);
    h.ready(&worker_id, &["a"], 64);
    let dispatched = h.dispatched();
    assert_eq!(dispatched.len(), 64, "every waiting request goes to it");
    assert!(dispatched.iter().all(|(to, _, _)| *to == worker_id));
    assert_eq!(h.state("a"), Some(ModelState::Loaded));
    assert_eq!(h.metrics.cold_start_time.get_sample_count(), 1);
    assert!((h.metrics.cold_start_time.get_sample_sum() - 1.5).abs() < 1e-9);
}

#[test]
fn a_failed_load_fails_every_waiting_request_with_its_reason() {
    let mut h = Harness::new(config(Policy::LeastLoad));
    h.host_status(&Host::new(&[("a", GIB)], 8 * GIB), 0, &[]);
    for i in 0..5 {
        h.generate("c", for_model(&format!("r{i}"), "a"));
    }
    let spawned = h.spawned();
    assert_eq!(spawned.len(), 1);
    h.host_says(&SupervisorToRouter::SpawnFailed {
        worker_id: spawned[0].0.clone(),
        reason: "unsupported architecture \"mamba\"".into(),
    });
    let failed = errors(&h.client_replies());
    assert_eq!(failed.len(), 5, "{failed:?}");
    for (code, message) in &failed {
        assert_eq!(*code, ErrorCode::Unavailable);
        assert!(
            message.contains("loading model \"a\" failed: unsupported architecture"),
            "{message}"
        );
    }
    assert_eq!(h.state("a"), Some(ModelState::Unloaded));
    // Within the backoff a new request fails at once, saying why.
    h.generate("c", for_model("again", "a"));
    let failed = errors(&h.client_replies());
    assert_eq!(failed.len(), 1);
    assert!(failed[0].1.contains("failed"), "{}", failed[0].1);
    assert!(h.spawned().is_empty());
    // After it, the next request tries again.
    h.advance(1100);
    h.host_status(&Host::new(&[("a", GIB)], 8 * GIB), 0, &[]);
    h.generate("c", for_model("later", "a"));
    assert_eq!(h.spawned().len(), 1);
}

#[test]
fn an_idle_model_unloads_after_its_keep_alive_and_loads_again() {
    let mut h = Harness::new(keep_alive_config(10));
    let host = Host::new(&[("a", GIB)], 8 * GIB);
    h.host_status(&host, 0, &[]);
    let worker = h.load("a", "first");
    let out = h.pass(9_900, &host, GIB, &[&worker]);
    assert!(Harness::drains(&out).is_empty(), "not before 10 s");
    let out = h.pass(200, &host, GIB, &[&worker]);
    assert_eq!(Harness::drains(&out), std::slice::from_ref(&worker));
    assert!(
        out.iter().any(|o| matches!(
            o,
            Out::Supervisor(RouterToSupervisor::Stop { worker_id, .. }) if *worker_id == worker
        )),
        "the idle worker is stopped: {out:?}"
    );
    assert_eq!(h.metrics.unloads.with_label_values(&["idle"]).get(), 1);
    h.exited(&worker);
    h.host_status(&host, 0, &[]);
    assert_eq!(h.state("a"), Some(ModelState::Unloaded));
    // The next request loads it again.
    h.generate("c", for_model("second", "a"));
    assert_eq!(h.spawned().len(), 1);
    assert_eq!(h.metrics.cold_starts.get(), 2);
}

#[test]
fn a_request_sets_the_keep_alive_zero_unloads_and_negative_keeps() {
    let mut h = Harness::new(keep_alive_config(300));
    let host = Host::new(&[("a", GIB)], 8 * GIB);
    h.host_status(&host, 0, &[]);
    h.generate(
        "c",
        GenerateRequest {
            keep_alive: Some(KeepAlive::Forever),
            ..for_model("keep", "a")
        },
    );
    let worker = h.spawned()[0].0.clone();
    h.ready(&worker, &["a"], 8);
    let rid = h.dispatched()[0].1;
    h.done(&worker, rid, FinishReason::Stop);
    let out = h.pass(900_000, &host, GIB, &[&worker]);
    assert!(Harness::drains(&out).is_empty(), "-1 keeps it loaded");

    h.generate(
        "c",
        GenerateRequest {
            keep_alive: Some(KeepAlive::For(Duration::ZERO)),
            ..for_model("drop", "a")
        },
    );
    let rid = h.dispatched()[0].1;
    h.advance(1);
    assert!(
        Harness::drains(&h.sent()).is_empty(),
        "not while its request runs"
    );
    h.done(&worker, rid, FinishReason::Stop);
    h.advance(2);
    assert_eq!(Harness::drains(&h.sent()), [worker]);
}

#[test]
fn the_offer_gives_the_default_keep_alive() {
    let mut h = Harness::new(keep_alive_config(300));
    let mut host = Host::new(&[("a", GIB)], 8 * GIB);
    host.keep_alive = Some(KeepAlive::For(Duration::from_secs(2)));
    h.host_status(&host, 0, &[]);
    let worker = h.load("a", "r");
    let out = h.pass(1_900, &host, GIB, &[&worker]);
    assert!(Harness::drains(&out).is_empty());
    let out = h.pass(200, &host, GIB, &[&worker]);
    assert_eq!(Harness::drains(&out), [worker]);
}

#[test]
fn short_memory_evicts_the_least_recently_used_idle_model() {
    let mut h = Harness::new(keep_alive_config(300));
    let host = Host::new(&[("a", GIB), ("b", GIB), ("c", GIB)], 2 * GIB);
    h.host_status(&host, 0, &[]);
    let a = h.load("a", "a1");
    h.host_status(&host, GIB, &[&a]);
    h.advance(10);
    // No status since `b` started: the router counts it on its own.
    let b = h.load("b", "b1");
    // `a` is used again, so `b` is the least recently used.
    h.advance(10);
    h.generate("c", for_model("a2", "a"));
    let rid = h.dispatched()[0].1;
    h.done(&a, rid, FinishReason::Stop);
    h.sent();

    h.generate("c", for_model("c1", "c"));
    let out = h.sent();
    assert_eq!(
        Harness::drains(&out),
        std::slice::from_ref(&b),
        "b goes, a stays"
    );
    assert!(
        errors(
            &out.iter()
                .filter_map(|o| match o {
                    Out::Client(_, reply) => Some(reply.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        )
        .is_empty()
    );
    assert_eq!(h.metrics.unloads.with_label_values(&["evicted"]).get(), 1);
    assert_eq!(h.state("c"), Some(ModelState::Loading));
    // Nothing starts before the host says the memory is free.
    h.exited(&b);
    assert!(h.spawned().is_empty());
    h.host_status(&host, GIB, &[&a]);
    let spawned = h.spawned();
    assert_eq!(spawned.len(), 1);
    assert_eq!(spawned[0].1, "c");
    h.ready(&spawned[0].0, &["c"], 8);
    assert_eq!(h.dispatched().len(), 1, "the waiting request runs");
    assert_eq!(h.state("a"), Some(ModelState::Loaded));
    assert_eq!(h.state("b"), Some(ModelState::Unloaded));
}

#[test]
fn when_nothing_idle_can_make_room_the_request_fails_at_once_saying_why() {
    let mut h = Harness::new(keep_alive_config(300));
    let host = Host::new(&[("a", GIB), ("big", 3 * GIB / 2)], 2 * GIB);
    h.host_status(&host, 0, &[]);
    // No status since `a` started: the router counts it on its own.
    let a = h.load("a", "a1");
    // `a` is busy: it cannot be evicted.
    h.generate("c", for_model("a2", "a"));
    assert_eq!(h.dispatched().len(), 1);
    h.generate("c", for_model("big1", "big"));
    let out = h.sent();
    assert!(Harness::drains(&out).is_empty());
    let failed: Vec<(ErrorCode, String)> = out
        .iter()
        .filter_map(|o| match o {
            Out::Client(_, ClientReply::Error { code, message, .. }) => {
                Some((*code, message.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{out:?}");
    let (code, message) = &failed[0];
    assert_eq!(*code, ErrorCode::Overloaded);
    for part in [
        "model \"big\" needs about 1.50 GiB",
        "1.00 GiB free of its 2.00 GiB budget",
        &format!("held by a ({a}, about 1.00 GiB, busy)"),
        "--memory-budget",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    assert_eq!(h.state("big"), Some(ModelState::Unloaded));
    assert!(h.spawned().is_empty());
}

#[test]
fn a_scaled_model_is_pinned_and_never_unloaded_for_idleness() {
    let mut h = Harness::new(keep_alive_config(5));
    let host = Host::new(&[("a", GIB)], 8 * GIB);
    h.host_status(&host, 0, &[]);
    let worker = h.load("a", "r");
    let reply = h.admin(&AdminRequest::Scale {
        model: "a".into(),
        workers: 1,
        device: None,
    });
    assert!(
        matches!(reply, AdminReply::Ack { ok: true, .. }),
        "{reply:?}"
    );
    let out = h.pass(20_000, &host, GIB, &[&worker]);
    assert!(Harness::drains(&out).is_empty());
    assert_eq!(h.metrics.unloads.with_label_values(&["idle"]).get(), 0);
}

#[test]
fn without_a_model_the_only_offered_one_is_used_and_several_need_a_name() {
    let mut h = Harness::new(config(Policy::LeastLoad));
    h.host_status(&Host::new(&[("a", GIB)], 8 * GIB), 0, &[]);
    h.generate("c", prompt("r", "hello"));
    let spawned = h.spawned();
    assert_eq!(spawned.len(), 1);
    assert_eq!(spawned[0].1, "a");

    let mut h = Harness::new(config(Policy::LeastLoad));
    h.host_status(&Host::new(&[("a", GIB), ("b", GIB)], 8 * GIB), 0, &[]);
    h.generate("c", prompt("r", "hello"));
    let failed = errors(&h.client_replies());
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, ErrorCode::BadRequest);
    assert!(
        failed[0].1.contains("\"model\" is required"),
        "{}",
        failed[0].1
    );
    h.generate("c", for_model("r2", "nope"));
    let failed = errors(&h.client_replies());
    assert_eq!(failed[0].0, ErrorCode::UnknownModel);
    assert!(failed[0].1.contains("[\"a\", \"b\"]"), "{}", failed[0].1);
}

#[test]
fn a_cold_start_waiting_for_memory_fails_when_its_supervisor_goes() {
    let mut h = Harness::new(keep_alive_config(300));
    let host = Host::new(&[("a", GIB), ("b", GIB)], GIB);
    h.host_status(&host, 0, &[]);
    let a = h.load("a", "a1");
    h.generate("c", for_model("b1", "b"));
    assert_eq!(Harness::drains(&h.sent()), std::slice::from_ref(&a));
    // The host falls silent before the memory is free.
    h.advance(3_500);
    let failed = errors(&h.client_replies());
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].1.contains("no connected supervisor"),
        "{}",
        failed[0].1
    );
}

#[test]
fn the_autoscalers_minimum_keeps_idle_models_loaded() {
    let mut h = Harness::new(RouterConfig {
        autoscale: Some(crate::AutoscaleConfig {
            min_workers: 1,
            ..crate::AutoscaleConfig::default()
        }),
        ..keep_alive_config(2)
    });
    let host = Host::new(&[("a", GIB)], 8 * GIB);
    h.host_status(&host, 0, &[]);
    let out = h.pass(1_000, &host, 0, &[]);
    let spawned: Vec<&Out> = out
        .iter()
        .filter(|o| matches!(o, Out::Supervisor(RouterToSupervisor::Spawn { .. })))
        .collect();
    assert_eq!(spawned.len(), 1, "the minimum loads the offered model");
    let Out::Supervisor(RouterToSupervisor::Spawn { worker_id, .. }) = spawned[0] else {
        unreachable!()
    };
    let worker = worker_id.clone();
    h.ready(&worker, &["a"], 8);
    let out = h.pass(10_000, &host, GIB, &[&worker]);
    assert!(
        Harness::drains(&out).is_empty(),
        "no keep-alive unload under a minimum"
    );
}
