//! The link driven with a virtual clock: an `Instant` base plus offsets.

use std::cell::Cell;
use std::time::{Duration, Instant};

use zinfer_protocol::{
    ControlOp, ErrorCode, GenerateRequest, Limits, LoadReport, ReadyBody, RouterToWorker,
    WorkerToRouter,
};

use super::{Action, EngineProbe, LinkConfig, RouterLink};

const HEARTBEAT: Duration = Duration::from_secs(1);
const LOAD_INTERVAL: Duration = Duration::from_millis(100);
const GRACE: Duration = Duration::from_secs(10);

/// A fake engine: settable load and idleness, counting load reads.
#[derive(Default)]
struct Engine {
    busy: Cell<bool>,
    running: Cell<u32>,
    load_reads: Cell<u32>,
}

impl EngineProbe for Engine {
    fn idle(&self) -> bool {
        !self.busy.get()
    }

    fn load(&self) -> LoadReport {
        self.load_reads.set(self.load_reads.get() + 1);
        LoadReport {
            running: self.running.get(),
            ..LoadReport::default()
        }
    }
}

fn ready() -> WorkerToRouter {
    WorkerToRouter::Ready(ReadyBody {
        worker_id: "w0".into(),
        protocol: zinfer_protocol::PROTOCOL_VERSION,
        models: vec!["m".into()],
        device: "cpu".into(),
        kv_capacity: 1024,
        max_batch: 8,
        context_length: None,
        vocab_size: None,
        import_endpoint: None,
        import_key: None,
    })
}

/// The link, its engine and the clock's base.
struct Harness {
    link: RouterLink,
    engine: Engine,
    t0: Instant,
}

impl Harness {
    /// A link whose first `ready` the socket took.
    fn registered() -> Self {
        let t0 = Instant::now();
        let config = LinkConfig {
            ready: ready(),
            heartbeat: HEARTBEAT,
            load_interval: LOAD_INTERVAL,
            grace: GRACE,
            limits: Limits::default(),
        };
        let mut link = RouterLink::new(config, t0);
        assert_eq!(link.poll_action(), Some(Action::Register(ready())));
        assert_eq!(link.poll_action(), None);
        link.handle_register_sent(true);
        Harness {
            link,
            engine: Engine::default(),
            t0,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn tick(&mut self, ms: u64) -> Vec<Action> {
        let now = self.at(ms);
        self.link.handle_tick(now, &self.engine);
        self.actions()
    }

    fn frame(&mut self, ms: u64, message: &RouterToWorker) -> Vec<Action> {
        let frame = zinfer_protocol::encode(message).expect("encodable");
        self.link.handle_frame(self.at(ms), &frame);
        self.actions()
    }

    fn actions(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.link.poll_action()).collect()
    }
}

fn heartbeats(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Send(WorkerToRouter::Heartbeat {})))
        .count()
}

fn loads(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Send(WorkerToRouter::Load(_))))
        .count()
}

#[test]
fn heartbeats_while_the_router_talks_and_reconnects_after_three_silent_periods() {
    let mut h = Harness::registered();
    // The router heard at 0; heartbeats at 1 s, 2 s, 3 s still go out.
    for second in 1..=3 {
        let actions = h.tick(second * 1000);
        assert_eq!(heartbeats(&actions), 1, "at {second} s: {actions:?}");
        assert!(!actions.contains(&Action::Reconnect));
    }
    // Silent for more than 3 periods at the 4 s heartbeat.
    let actions = h.tick(4001);
    assert!(actions.contains(&Action::Reconnect), "{actions:?}");
    assert_eq!(heartbeats(&actions), 0);
}

#[test]
fn a_frame_from_the_router_even_undecodable_postpones_the_reconnect() {
    let mut h = Harness::registered();
    h.link.handle_frame(h.at(2500), b"\xc1 not msgpack");
    assert!(h.actions().is_empty());
    assert_eq!(heartbeats(&h.tick(3000)), 1);
    let actions = h.tick(4000);
    assert!(!actions.contains(&Action::Reconnect), "{actions:?}");
    // Exactly 3 periods after the frame is not yet silence.
    let actions = h.tick(5500);
    assert!(!actions.contains(&Action::Reconnect), "{actions:?}");
    let actions = h.tick(6501);
    assert!(actions.contains(&Action::Reconnect), "{actions:?}");
}

#[test]
fn a_reconnect_registers_again_and_retries_until_the_socket_takes_ready() {
    let mut h = Harness::registered();
    assert!(h.tick(4001).contains(&Action::Reconnect));
    h.link.handle_reconnected(h.at(4002));
    // What came on the old connection is orphaned: cancel it, then register.
    assert_eq!(
        h.actions(),
        vec![Action::CancelAll, Action::Register(ready())]
    );
    // The new connection is not up yet: the socket refused `ready`.
    h.link.handle_register_sent(false);
    assert!(h.link.poll_timeout() <= h.at(4012));
    assert!(h.tick(4012).contains(&Action::Register(ready())));
    h.link.handle_register_sent(true);
    // Registered and heard: no retry, and no reconnect for 3 periods.
    let actions = h.tick(4100);
    assert!(!actions.contains(&Action::Register(ready())), "{actions:?}");
    let actions = h.tick(7000);
    assert!(!actions.contains(&Action::Reconnect), "{actions:?}");
}

#[test]
fn disconnect_cancels_orphans_and_registers_once_per_heartbeat() {
    let mut h = Harness::registered();
    let disconnect = RouterToWorker::Disconnect {
        reason: "unknown worker".into(),
    };
    // Just registered at 0: the router's reply to an early message.
    assert!(h.frame(500, &disconnect).is_empty());
    let actions = h.frame(1500, &disconnect);
    assert_eq!(actions, vec![Action::CancelAll, Action::Register(ready())]);
    h.link.handle_register_sent(true);
    assert!(h.frame(1600, &disconnect).is_empty());
}

#[test]
fn load_reports_go_out_at_most_once_per_interval_and_only_on_change() {
    let mut h = Harness::registered();
    let mut sent = 0;
    // Ticks every 10 ms for one second: 10 load checks at most.
    for ms in (0..=1000).step_by(10) {
        h.engine.running.set(u32::try_from(ms).expect("small"));
        sent += loads(&h.tick(ms));
    }
    assert_eq!(h.engine.load_reads.get(), 10);
    assert_eq!(sent, 10);
    // An unchanged load is read but not sent.
    assert_eq!(loads(&h.tick(1100)), 0);
    assert_eq!(h.engine.load_reads.get(), 11);
    // A new registration sends the load again.
    h.link.handle_reconnected(h.at(1150));
    assert_eq!(
        h.actions(),
        vec![Action::CancelAll, Action::Register(ready())]
    );
    h.link.handle_register_sent(true);
    assert_eq!(loads(&h.tick(1200)), 1);
}

#[test]
fn poll_timeout_names_the_next_timer() {
    let mut h = Harness::registered();
    assert_eq!(h.link.poll_timeout(), h.at(100));
    h.tick(100);
    assert_eq!(h.link.poll_timeout(), h.at(200));
    h.link.handle_shutdown(h.at(150));
    h.engine.busy.set(true);
    h.tick(150);
    assert_eq!(h.link.poll_timeout(), h.at(200));
}

#[test]
fn shutdown_with_requests_in_flight_waits_for_them_to_finish() {
    let mut h = Harness::registered();
    h.engine.busy.set(true);
    let actions = h.frame(1000, &RouterToWorker::Shutdown { grace_ms: 5000 });
    assert_eq!(
        actions,
        vec![Action::Send(WorkerToRouter::ControlReply {
            op: ControlOp::Shutdown,
            ok: true,
            message: "shutting down".into(),
        })]
    );
    assert!(!h.tick(3000).contains(&Action::Stop));
    h.engine.busy.set(false);
    assert_eq!(h.tick(3001), vec![Action::Stop]);
    // Stop is said once.
    assert!(h.tick(3002).is_empty());
}

#[test]
fn shutdown_stops_when_the_grace_runs_out_even_with_requests_in_flight() {
    let mut h = Harness::registered();
    h.engine.busy.set(true);
    h.link.handle_shutdown(h.at(1000));
    assert!(h.link.poll_timeout() <= h.at(1000) + GRACE);
    assert!(!h.tick(10_999).contains(&Action::Stop));
    assert_eq!(h.tick(11_000), vec![Action::Stop]);
}

#[test]
fn a_local_stop_twice_keeps_the_first_deadline() {
    let mut h = Harness::registered();
    h.engine.busy.set(true);
    h.link.handle_shutdown(h.at(0));
    h.link.handle_shutdown(h.at(5000));
    assert_eq!(h.tick(10_000), vec![Action::Stop]);
}

#[test]
fn draining_refuses_new_requests_until_resumed() {
    let mut h = Harness::registered();
    let generate = |rid| RouterToWorker::Generate {
        rid,
        request: GenerateRequest::from_prompt(format!("r{rid}"), "hello"),
    };
    assert_eq!(
        h.frame(0, &generate(1)),
        vec![Action::Submit {
            rid: 1,
            request: Box::new(GenerateRequest::from_prompt("r1", "hello")),
        }]
    );
    let actions = h.frame(10, &RouterToWorker::Drain {});
    assert_eq!(
        actions,
        vec![Action::Send(WorkerToRouter::ControlReply {
            op: ControlOp::Drain,
            ok: true,
            message: "draining".into(),
        })]
    );
    assert!(h.link.draining());
    match h.frame(20, &generate(2)).as_slice() {
        [Action::Send(WorkerToRouter::Error { rid: 2, code, .. })] => {
            assert_eq!(*code, ErrorCode::Unavailable);
        }
        other => panic!("expected an unavailable error, got {other:?}"),
    }
    assert!(h.frame(30, &RouterToWorker::Resume {}).is_empty());
    assert!(matches!(
        h.frame(40, &generate(3)).as_slice(),
        [Action::Submit { rid: 3, .. }]
    ));
}

#[test]
fn resume_does_not_undo_a_stop() {
    let mut h = Harness::registered();
    h.link.handle_shutdown(h.at(0));
    assert!(h.frame(10, &RouterToWorker::Resume {}).is_empty());
    assert!(h.link.draining());
    // Nor does a router that forgot us make a stopping worker register.
    let disconnect = RouterToWorker::Disconnect {
        reason: "unknown worker".into(),
    };
    assert!(h.frame(5000, &disconnect).is_empty());
}

#[test]
fn cancel_and_engine_refusals_are_passed_on() {
    let mut h = Harness::registered();
    assert_eq!(
        h.frame(0, &RouterToWorker::Cancel { rid: 7 }),
        vec![Action::Cancel(7)]
    );
    h.link
        .handle_refused(8, ErrorCode::Overloaded, "engine is full".into());
    assert_eq!(
        h.actions(),
        vec![Action::Send(WorkerToRouter::Error {
            rid: 8,
            code: ErrorCode::Overloaded,
            message: "engine is full".into(),
        })]
    );
}

#[test]
fn one_export_at_a_time() {
    let mut h = Harness::registered();
    let export = RouterToWorker::ExportCache {
        endpoint: "tcp://127.0.0.1:1".into(),
        max_tokens: 100,
        key: None,
    };
    assert_eq!(
        h.frame(0, &export),
        vec![Action::StartExport {
            endpoint: "tcp://127.0.0.1:1".into(),
            max_tokens: 100,
            key: None,
        }]
    );
    match h.frame(10, &export).as_slice() {
        [Action::Send(WorkerToRouter::ControlReply { ok: false, op, .. })] => {
            assert_eq!(*op, ControlOp::ExportCache);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    h.link.handle_export_ended(true, "sent".into());
    assert_eq!(
        h.actions(),
        vec![Action::Send(WorkerToRouter::ControlReply {
            op: ControlOp::ExportCache,
            ok: true,
            message: "sent".into(),
        })]
    );
    assert!(matches!(
        h.frame(20, &export).as_slice(),
        [Action::StartExport { .. }]
    ));
}

#[test]
fn flush_cache_flushes_then_replies() {
    let mut h = Harness::registered();
    let actions = h.frame(
        0,
        &RouterToWorker::FlushCache {
            namespace: Some("a".into()),
        },
    );
    assert_eq!(actions.len(), 2);
    assert_eq!(actions[0], Action::FlushCache(Some("a".into())));
    assert!(matches!(
        actions[1],
        Action::Send(WorkerToRouter::ControlReply {
            op: ControlOp::FlushCache,
            ok: true,
            ..
        })
    ));
}
