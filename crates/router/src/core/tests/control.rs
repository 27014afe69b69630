//! The control plane on a virtual clock: single-flight scaling, spawn
//! failures and backoff, scale-in by draining, migration, autoscaling.

use zinfer_protocol::{ModelOffer, ReadyBody, SupervisorToRouter};

use super::*;
use crate::AutoscaleConfig;

const SUPERVISOR: &str = "sup";

impl Harness {
    fn supervisor_status(&mut self, workers: &[&str]) {
        let status = SupervisorToRouter::SupervisorStatus {
            supervisor_id: "sup-1".into(),
            host: "host".into(),
            models: vec![ModelOffer {
                name: "m".into(),
                path: "/models/m.gguf".into(),
                worker_bytes: 1 << 30,
                keep_alive: None,
            }],
            devices: vec!["cpu:0".into(), "cpu:1".into()],
            memory_budget_bytes: 8 << 30,
            memory_used_bytes: 0,
            workers: workers.iter().map(|w| w.to_string()).collect(),
        };
        self.supervisor_says(&status);
    }

    fn supervisor_says(&mut self, message: &SupervisorToRouter) {
        let frame = encode(message).unwrap();
        self.core
            .handle_admin(self.now, &Addr::new(SUPERVISOR), &frame);
    }

    fn control_request(&mut self, admin: &str, message: &AdminRequest) {
        let frame = encode(message).unwrap();
        self.core.handle_admin(self.now, &Addr::new(admin), &frame);
    }

    fn ready_as(&mut self, worker: &str, import_endpoint: Option<&str>) {
        self.worker(worker, &ready_frame(worker, import_endpoint));
    }

    /// The supervisor reports `worker`'s process killed.
    fn killed(&mut self, worker: &str) {
        self.supervisor_says(&SupervisorToRouter::WorkerExited {
            worker_id: worker.into(),
            status: "signal: 9 (SIGKILL)".into(),
        });
    }

    /// Scales model `m` to one worker, kills it once it is ready, and
    /// returns (the killed worker, the spawned replacements).
    fn kill_the_only_worker(&mut self) -> (Spawned, Vec<Spawned>) {
        self.supervisor_status(&[]);
        self.control_request("admin", &scale(1));
        let started = spawns(&self.sent());
        self.ready_as(&started[0].id, None);
        self.sent();
        self.killed(&started[0].id);
        self.advance(1);
        (started[0].clone(), spawns(&self.sent()))
    }

    fn state_of(&mut self, worker: &str) -> Option<WorkerState> {
        let AdminReply::Workers { workers } = self.admin(&AdminRequest::Workers {}) else {
            panic!("expected workers");
        };
        workers.iter().find(|w| w.id == worker).map(|w| w.state)
    }
}

/// `worker`'s `ready` for model `m`; a migration target's with
/// `import_endpoint`.
fn ready_frame(worker: &str, import_endpoint: Option<&str>) -> WorkerToRouter {
    WorkerToRouter::Ready(ReadyBody {
        worker_id: worker.into(),
        protocol: PROTOCOL_VERSION,
        models: vec!["m".into()],
        device: "cpu:1".into(),
        kv_capacity: 4096,
        max_batch: 8,
        context_length: None,
        vocab_size: None,
        import_endpoint: import_endpoint.map(str::to_string),
        import_key: import_endpoint.map(|_| IMPORT_KEY.to_string()),
    })
}

fn scale(workers: u32) -> AdminRequest {
    AdminRequest::Scale {
        model: "m".into(),
        workers,
        device: None,
    }
}

/// A spawn request the router sent.
#[derive(Clone, Debug)]
struct Spawned {
    id: String,
    device: Option<String>,
    model_path: Option<String>,
    import_cache: bool,
}

/// Spawn requests among `out`.
fn spawns(out: &[Out]) -> Vec<Spawned> {
    out.iter()
        .filter_map(|o| match o {
            Out::Supervisor(RouterToSupervisor::Spawn {
                worker_id,
                device,
                model_path,
                import_cache,
                ..
            }) => Some(Spawned {
                id: worker_id.clone(),
                device: device.clone(),
                model_path: model_path.clone(),
                import_cache: *import_cache,
            }),
            _ => None,
        })
        .collect()
}

/// Acks among `out`: (receiver, ok, message).
fn acks(out: &[Out]) -> Vec<(String, bool, String)> {
    out.iter()
        .filter_map(|o| match o {
            Out::AdminTo(to, AdminReply::Ack { ok, message }) => Some((
                String::from_utf8_lossy(to).into_owned(),
                *ok,
                message.clone(),
            )),
            Out::Admin(AdminReply::Ack { ok, message }) => {
                Some(("admin".to_string(), *ok, message.clone()))
            }
            _ => None,
        })
        .collect()
}

/// A CURVE public key in Z85 (libzmq's example key), as a migration
/// target's `ready` announces its import socket.
const IMPORT_KEY: &str = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";

#[test]
fn concurrent_scales_of_one_model_start_exactly_the_workers_needed() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&[]);
    h.ready("w0", &["m"], 8);
    h.sent();
    // 64 requests from 8 admin connections, all for 3 workers.
    for i in 0..64 {
        h.control_request(&format!("admin-{}", i % 8), &scale(3));
    }
    let out = h.sent();
    let started = spawns(&out);
    assert_eq!(
        started.len(),
        2,
        "one worker serves, two are needed: {started:?}"
    );
    assert!(
        acks(&out).is_empty(),
        "nobody is answered before the workers register"
    );
    assert_eq!(h.metrics.spawns.get(), 2);
    h.ready_as(&started[0].id, None);
    assert!(acks(&h.sent()).is_empty());
    h.ready_as(&started[1].id, None);
    let replies = acks(&h.sent());
    assert_eq!(replies.len(), 64, "every waiter gets the one outcome");
    assert!(
        replies
            .iter()
            .all(|(_, ok, m)| *ok && m.contains("3 worker(s)"))
    );
    // Asking again for what is there answers at once and spawns nothing.
    h.control_request("admin-0", &scale(3));
    let out = h.sent();
    assert!(spawns(&out).is_empty());
    assert_eq!(acks(&out).len(), 1);
    assert!(h.core.control_idle());
}

#[test]
fn a_failed_spawn_fails_every_waiter_at_once_and_backs_off() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&[]);
    for i in 0..10 {
        h.control_request(&format!("admin-{i}"), &scale(2));
    }
    let started = spawns(&h.sent());
    assert_eq!(started.len(), 2);
    h.supervisor_says(&SupervisorToRouter::WorkerExited {
        worker_id: started[0].id.clone(),
        status: "exit status: 1: reading /bad.gguf: No such file".into(),
    });
    let replies = acks(&h.sent());
    assert_eq!(replies.len(), 10);
    assert!(
        replies
            .iter()
            .all(|(_, ok, m)| !ok && m.contains("No such file")),
        "{replies:?}"
    );
    assert_eq!(h.metrics.spawn_failures.get(), 1);
    // Nothing is spawned again on its own, however long we wait.
    for _ in 0..120 {
        h.advance(1_000);
        h.supervisor_status(&[]);
    }
    assert!(spawns(&h.sent()).is_empty());
    // The other spawn of the failed operation fails too; a new scale right
    // after a failure is refused with the reason and the wait.
    h.supervisor_says(&SupervisorToRouter::SpawnFailed {
        worker_id: started[1].id.clone(),
        reason: "bad model file".into(),
    });
    h.control_request("admin-0", &scale(2));
    let out = h.sent();
    assert!(spawns(&out).is_empty());
    let replies = acks(&out);
    assert_eq!(replies.len(), 1);
    assert!(
        !replies[0].1 && replies[0].2.contains("next try is allowed in"),
        "{replies:?}"
    );
    // After the backoff, a scale tries again.
    h.advance(2_500);
    h.supervisor_status(&[]);
    h.control_request("admin-0", &scale(1));
    assert_eq!(spawns(&h.sent()).len(), 1);
}

#[test]
fn scaling_without_a_supervisor_says_how_to_get_one() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    let reply = h.admin(&scale(2));
    assert!(
        matches!(reply, AdminReply::Ack { ok: false, ref message } if message.contains("zinfer supervisor")),
        "{reply:?}"
    );
}

#[test]
fn scale_in_drains_the_least_loaded_worker_and_never_kills() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&["w1", "w2"]);
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    h.generate("c", prompt("b", "x"));
    h.generate("c", prompt("c", "x"));
    let dispatched = h.dispatched();
    let on_w1: Vec<u64> = dispatched
        .iter()
        .filter(|d| d.0 == "w1")
        .map(|d| d.1)
        .collect();
    assert_eq!(on_w1.len(), 2);
    let w2_rid = dispatched.iter().find(|d| d.0 == "w2").unwrap().1;
    h.control_request("admin", &scale(1));
    let out = h.sent();
    assert!(
        out.iter()
            .any(|o| matches!(o, Out::Worker(to, RouterToWorker::Drain {}) if to == b"w2"))
    );
    assert!(
        !out.iter()
            .any(|o| matches!(o, Out::Worker(_, RouterToWorker::Shutdown { .. }))),
        "w2 has a request in flight: drained, not stopped"
    );
    assert_eq!(acks(&out).len(), 1, "answered once one worker is routable");
    h.done("w2", w2_rid, FinishReason::Stop);
    let out = h.sent();
    assert!(out.iter().any(|o| matches!(
        o,
        Out::Worker(to, RouterToWorker::Shutdown { .. }) if to == b"w2"
    )));
    assert!(out.iter().any(|o| matches!(
        o,
        Out::Supervisor(RouterToSupervisor::Stop { worker_id, .. }) if worker_id == "w2"
    )));
    h.supervisor_says(&SupervisorToRouter::WorkerExited {
        worker_id: "w2".into(),
        status: "exit status: 0".into(),
    });
    assert_eq!(
        h.state_of("w2"),
        None,
        "a stopped worker is forgotten, not lost"
    );
    assert_eq!(h.metrics.drain_time.get_sample_count(), 1);
    // The lost count metric stays at zero.
    assert_eq!(
        h.metrics.workers.with_label_values(&["lost"]).get(),
        0,
        "stopping is not losing"
    );
}

#[test]
fn park_and_resume() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    let reply = h.admin(&AdminRequest::Drain {
        worker: "w1".into(),
        park: true,
    });
    assert!(matches!(reply, AdminReply::Ack { ok: true, .. }));
    assert_eq!(h.state_of("w1"), Some(WorkerState::Parked));
    h.generate("c", prompt("a", "x"));
    assert_eq!(
        error_code(&h.client_replies()[0]),
        (Some("a"), ErrorCode::Unavailable)
    );
    let reply = h.admin(&AdminRequest::Resume {
        worker: "w1".into(),
    });
    assert!(
        matches!(reply, AdminReply::Ack { ok: true, .. }),
        "{reply:?}"
    );
    assert_eq!(h.state_of("w1"), Some(WorkerState::Ready));
    h.generate("c", prompt("b", "x"));
    assert_eq!(h.dispatched().len(), 1);
}

#[test]
fn a_lost_worker_of_a_scaled_model_is_replaced() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    let (killed, again) = h.kill_the_only_worker();
    assert_eq!(again.len(), 1, "the count is kept");
    assert_ne!(again[0].id, killed.id, "a fresh id");
}

#[test]
fn requests_wait_for_a_replacement_instead_of_failing() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    let (_, replacement) = h.kill_the_only_worker();
    assert_eq!(replacement.len(), 1);

    h.generate("c", prompt("held", "x"));
    let out = h.sent();
    assert!(
        !out.iter()
            .any(|o| matches!(o, Out::Client(_, ClientReply::Error { .. }))),
        "no error while the replacement loads: {out:?}"
    );
    h.ready_as(&replacement[0].id, None);
    let dispatched = h.dispatched();
    assert_eq!(
        dispatched.len(),
        1,
        "the held request goes to the replacement"
    );
    assert_eq!(dispatched[0].0, replacement[0].id);

    // With the replacement gone too and nothing starting, a held request
    // fails (retryable) rather than waiting for the backoff.
    h.killed(&replacement[0].id);
    h.advance(1);
    let next = spawns(&h.sent());
    h.generate("c", prompt("held-2", "x"));
    h.killed(&next[0].id);
    let errors: Vec<ErrorCode> = h
        .sent()
        .into_iter()
        .filter_map(|o| match o {
            Out::Client(_, ClientReply::Error { code, .. }) => Some(code),
            _ => None,
        })
        .collect();
    assert!(
        errors.contains(&ErrorCode::Unavailable),
        "the held request fails once no worker is starting: {errors:?}"
    );
}

#[test]
fn a_replacement_killed_while_it_loads_is_retried_after_the_backoff() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    let (_, replacement) = h.kill_the_only_worker();
    assert_eq!(replacement.len(), 1);
    // The replacement dies before it registers: a failed spawn, with no
    // scale operation waiting on it.
    h.killed(&replacement[0].id);
    h.advance(500);
    h.supervisor_status(&[]);
    assert!(spawns(&h.sent()).is_empty(), "the backoff holds the retry");
    let retry_at = h.core.poll_timeout();
    assert!(
        retry_at <= h.now + Duration::from_millis(501),
        "the core wakes for the end of the backoff"
    );
    h.advance(600);
    let again = spawns(&h.sent());
    assert_eq!(again.len(), 1, "the target of one worker is kept");
    h.ready_as(&again[0].id, None);
    assert_eq!(h.state_of(&again[0].id), Some(WorkerState::Ready));
}

#[test]
fn a_spawn_that_never_registers_times_out() {
    let mut h = Harness::new(RouterConfig {
        spawn_timeout: Duration::from_secs(5),
        ..config(Policy::RoundRobin)
    });
    h.supervisor_status(&[]);
    h.control_request("admin", &scale(1));
    let started = spawns(&h.sent());
    for _ in 0..6 {
        h.advance(1_000);
        h.supervisor_status(&[]);
    }
    let out = h.sent();
    assert!(out.iter().any(|o| matches!(
        o,
        Out::Supervisor(RouterToSupervisor::Stop { worker_id, .. }) if *worker_id == started[0].id
    )));
    let replies = acks(&out);
    assert!(
        replies.len() == 1 && !replies[0].1 && replies[0].2.contains("did not register"),
        "{replies:?}"
    );
}

#[test]
fn migration_carries_the_cache_then_switches_routing_in_one_step() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.supervisor_status(&["old"]);
    h.ready("old", &["m"], 8);
    h.generate("c", prompt("r1", "a shared prefix"));
    let r1 = h.dispatched()[0].1;
    h.control_request(
        "admin",
        &AdminRequest::Migrate {
            worker: "old".into(),
            device: "cpu:1".into(),
            carry_tokens: Some(4096),
        },
    );
    let started = spawns(&h.sent());
    assert_eq!(started.len(), 1);
    let new = started[0].id.clone();
    assert_eq!(started[0].device.as_deref(), Some("cpu:1"));
    assert!(started[0].import_cache);
    assert_eq!(h.state_of("old"), Some(WorkerState::Migrating));
    // The old worker keeps serving while the new one loads.
    h.generate("c", prompt("r2", "a shared prefix"));
    let r2 = h.dispatched()[0].1;
    h.ready_as(&new, Some("tcp://127.0.0.1:40000"));
    let out = h.sent();
    assert!(out.iter().any(|o| matches!(
        o,
        Out::Worker(to, RouterToWorker::ExportCache { endpoint, max_tokens: 4096, key })
            if to == b"old" && endpoint == "tcp://127.0.0.1:40000"
                && key.as_deref() == Some(IMPORT_KEY)
    )));
    assert_eq!(h.state_of(&new), Some(WorkerState::Warming));
    // Not routed to while warming.
    h.generate("c", prompt("r3", "a shared prefix"));
    let (to, r3, _) = h.dispatched().remove(0);
    assert_eq!(to, "old");
    h.worker(
        &new,
        &WorkerToRouter::CacheImported {
            tokens: 900,
            skipped_tokens: 0,
            bytes: 900 * 46_080,
            seconds: 0.2,
        },
    );
    let out = h.sent();
    let replies = acks(&out);
    assert_eq!(replies.len(), 1);
    assert!(
        replies[0].1 && replies[0].2.contains("carried 900"),
        "{replies:?}"
    );
    assert_eq!(h.state_of(&new), Some(WorkerState::Ready));
    assert_eq!(h.state_of("old"), Some(WorkerState::Draining));
    h.generate("c", prompt("r4", "a shared prefix"));
    assert_eq!(h.dispatched()[0].0, new, "routing switched");
    // The old worker's requests finish there; then it stops.
    h.done("old", r1, FinishReason::Stop);
    h.done("old", r2, FinishReason::Stop);
    h.sent();
    h.done("old", r3, FinishReason::Stop);
    assert!(h.sent().iter().any(|o| matches!(
        o,
        Out::Worker(to, RouterToWorker::Shutdown { .. }) if to == b"old"
    )));
    assert_eq!(h.metrics.migration_kv_tokens.get(), 900);
    assert_eq!(h.metrics.migrations.with_label_values(&["ok"]).get(), 1);
    assert_eq!(h.outcome("stop"), 3);
}

#[test]
fn a_failed_migration_leaves_the_old_worker_serving() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&["old"]);
    h.ready("old", &["m"], 8);
    h.control_request(
        "admin",
        &AdminRequest::Migrate {
            worker: "old".into(),
            device: "cuda:7".into(),
            carry_tokens: None,
        },
    );
    let started = spawns(&h.sent());
    h.supervisor_says(&SupervisorToRouter::SpawnFailed {
        worker_id: started[0].id.clone(),
        reason: "device cuda:7: not built with CUDA".into(),
    });
    let replies = acks(&h.sent());
    assert_eq!(replies.len(), 1);
    assert!(
        !replies[0].1 && replies[0].2.contains("old keeps serving"),
        "{replies:?}"
    );
    assert_eq!(h.state_of("old"), Some(WorkerState::Ready));
    h.generate("c", prompt("a", "x"));
    assert_eq!(h.dispatched()[0].0, "old");
    assert_eq!(h.metrics.migrations.with_label_values(&["failed"]).get(), 1);
    // The model itself is not paused: a scale right after spawns.
    h.control_request("admin", &scale(2));
    assert_eq!(spawns(&h.sent()).len(), 1);
}

#[test]
fn a_migration_without_carry_switches_when_the_replacement_registers() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&["old"]);
    h.ready("old", &["m"], 8);
    h.control_request(
        "admin",
        &AdminRequest::Migrate {
            worker: "old".into(),
            device: "cpu:1".into(),
            carry_tokens: Some(0),
        },
    );
    let started = spawns(&h.sent());
    assert!(!started[0].import_cache, "no cache import asked");
    h.ready_as(&started[0].id, None);
    let out = h.sent();
    assert!(
        !out.iter()
            .any(|o| matches!(o, Out::Worker(_, RouterToWorker::ExportCache { .. })))
    );
    assert!(acks(&out)[0].1);
    assert_eq!(h.state_of("old"), Some(WorkerState::Stopping));
}

#[test]
fn the_autoscaler_adds_a_worker_under_a_burst_and_removes_it_when_idle() {
    let mut h = Harness::new(RouterConfig {
        autoscale: Some(AutoscaleConfig {
            min_workers: 1,
            max_workers: 2,
            queue_per_worker: 2.0,
            up_window: Duration::from_secs(3),
            idle_window: Duration::from_secs(5),
        }),
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.supervisor_status(&["w1"]);
    h.ready("w1", &["m"], 1);
    for i in 0..6 {
        h.generate("c", prompt(&i.to_string(), "x"));
    }
    let first = h.dispatched();
    assert_eq!(first.len(), 1, "one in flight, five queued");
    let mut added = Vec::new();
    for _ in 0..5 {
        h.advance(1_000);
        h.supervisor_status(&["w1"]);
        h.worker("w1", &WorkerToRouter::Heartbeat {});
        added.extend(spawns(&h.sent()));
    }
    assert_eq!(added.len(), 1, "{added:?}");
    assert_eq!(h.metrics.autoscale.with_label_values(&["up"]).get(), 1);
    h.ready_as(&added[0].id, None);
    // Finish everything; then idle for the window: back to one worker.
    let mut pending = first;
    pending.extend(h.dispatched());
    while let Some((worker, rid, _)) = pending.pop() {
        h.done(&worker, rid, FinishReason::Stop);
        pending.extend(h.dispatched());
    }
    let mut drained = false;
    for _ in 0..8 {
        h.advance(1_000);
        h.supervisor_status(&["w1", &added[0].id]);
        h.worker("w1", &WorkerToRouter::Heartbeat {});
        h.worker(&added[0].id, &WorkerToRouter::Heartbeat {});
        drained |= h
            .sent()
            .iter()
            .any(|o| matches!(o, Out::Worker(_, RouterToWorker::Shutdown { .. })));
    }
    assert!(drained, "an idle worker was drained and stopped");
    assert_eq!(h.metrics.autoscale.with_label_values(&["down"]).get(), 1);
    assert_eq!(h.outcome("stop"), 6);
}

#[test]
fn reload_starts_a_replacement_on_the_same_device_without_the_cache() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&["old"]);
    h.ready("old", &["m"], 8);
    h.control_request(
        "admin",
        &AdminRequest::Reload {
            worker: "old".into(),
            model_path: Some("/models/m-v2.gguf".into()),
        },
    );
    let spawn = spawns(&h.sent()).pop().expect("a spawn");
    assert_eq!(spawn.model_path.as_deref(), Some("/models/m-v2.gguf"));
    assert_eq!(
        spawn.device.as_deref(),
        Some("cpu"),
        "the old worker's device"
    );
    assert!(
        !spawn.import_cache,
        "other weights make other K/V: nothing carried"
    );
    let new = spawn.id;
    h.ready_as(&new, None);
    let replies = acks(&h.sent());
    assert!(
        replies.len() == 1 && replies[0].1 && replies[0].2.starts_with("reloaded old"),
        "{replies:?}"
    );
    assert_eq!(h.state_of(&new), Some(WorkerState::Ready));
    assert_eq!(h.state_of("old"), Some(WorkerState::Stopping));
}

#[test]
fn a_drained_worker_of_a_scaled_model_is_not_replaced() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&[]);
    h.control_request("admin", &scale(2));
    for spawned in spawns(&h.sent()) {
        h.ready_as(&spawned.id, None);
    }
    assert!(acks(&h.sent())[0].1, "scaled to 2");
    let AdminReply::Workers { workers } = h.admin(&AdminRequest::Workers {}) else {
        panic!("expected workers");
    };
    assert_eq!(workers.len(), 2);
    let reply = h.admin(&AdminRequest::Drain {
        worker: workers[0].id.clone(),
        park: false,
    });
    assert!(matches!(reply, AdminReply::Ack { ok: true, .. }));
    for _ in 0..3 {
        h.advance(1_000);
        h.supervisor_status(&[]);
        h.worker(&workers[1].id, &WorkerToRouter::Heartbeat {});
    }
    assert!(spawns(&h.sent()).is_empty(), "the drain lowered the target");
}

#[test]
fn a_migration_target_admits_only_its_predecessors_curve_key() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.supervisor_status(&["old"]);
    let frame = encode(&ready_frame("old", None)).unwrap();
    h.core
        .handle_worker_as(h.now, &Addr::new("old"), Some(IMPORT_KEY), &frame);
    h.sent();
    let migrate = |carry_tokens| AdminRequest::Migrate {
        worker: "old".into(),
        device: "cpu:1".into(),
        carry_tokens: Some(carry_tokens),
    };
    h.control_request("admin", &migrate(4096));
    let exporter_keys: Vec<Option<String>> = h
        .sent()
        .into_iter()
        .filter_map(|o| match o {
            Out::Supervisor(RouterToSupervisor::Spawn {
                import_cache: true,
                exporter_key,
                ..
            }) => Some(exporter_key),
            _ => None,
        })
        .collect();
    assert_eq!(exporter_keys, [Some(IMPORT_KEY.to_string())]);
}
