//! Control socket: drain and bad frames (scaling and migration are in
//! `control`).

use super::*;

#[test]
fn drain_stops_routing_and_stops_the_worker_after_its_last_request() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    h.generate("c", prompt("busy", "x"));
    let (first, busy_rid, _) = h.dispatched().remove(0);
    assert_eq!(first, "w1");
    let frame = encode(&AdminRequest::Drain {
        worker: "w1".into(),
        park: false,
    })
    .unwrap();
    h.core.handle_admin(h.now, &Addr::new("admin"), &frame);
    let sent = h.sent();
    assert!(
        sent.iter()
            .any(|o| matches!(o, Out::Worker(to, RouterToWorker::Drain {}) if to == b"w1"))
    );
    assert!(
        sent.iter()
            .any(|o| matches!(o, Out::Admin(AdminReply::Ack { ok: true, .. })))
    );
    for i in 0..3 {
        h.generate("c", prompt(&i.to_string(), "x"));
    }
    let workers: Vec<String> = h.dispatched().into_iter().map(|d| d.0).collect();
    assert_eq!(workers, ["w2", "w2", "w2"]);
    let AdminReply::Workers { workers } = h.admin(&AdminRequest::Workers {}) else {
        panic!("expected workers");
    };
    assert_eq!(workers[0].state, WorkerState::Draining);
    assert_eq!(workers[0].inflight, 1, "its running request goes on");
    assert_eq!(workers[1].inflight, 3);
    h.client("c", &ClientRequest::Models { id: None });
    let ClientReply::Models { models, .. } = &h.client_replies()[0] else {
        panic!("expected models");
    };
    assert_eq!(models[0].workers, 1, "draining workers are not listed");
    h.done("w1", busy_rid, FinishReason::Stop);
    let sent = h.sent();
    assert!(sent.iter().any(|o| matches!(
        o,
        Out::Worker(to, RouterToWorker::Shutdown { .. }) if to == b"w1"
    )));
    let AdminReply::Workers { workers } = h.admin(&AdminRequest::Workers {}) else {
        panic!("expected workers");
    };
    assert_eq!(workers[0].state, WorkerState::Stopping);
    // It exits: its silence is not a loss, and it leaves the listing.
    for _ in 0..4 {
        h.advance(1_000);
        h.worker("w2", &WorkerToRouter::Heartbeat {});
    }
    let AdminReply::Workers { workers } = h.admin(&AdminRequest::Workers {}) else {
        panic!("expected workers");
    };
    let listed: Vec<(&str, WorkerState)> =
        workers.iter().map(|w| (w.id.as_str(), w.state)).collect();
    assert_eq!(listed, [("w2", WorkerState::Ready)]);
    let missing = h.admin(&AdminRequest::Drain {
        worker: "nope".into(),
        park: false,
    });
    assert!(
        matches!(missing, AdminReply::Ack { ok: false, ref message } if message.contains("w2"))
    );
}

#[test]
fn draining_every_worker_makes_new_requests_unavailable() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.admin(&AdminRequest::Drain {
        worker: "w1".into(),
        park: false,
    });
    h.generate("c", prompt("a", "x"));
    assert_eq!(
        error_code(&h.client_replies()[0]),
        (Some("a"), ErrorCode::Unavailable)
    );
}

#[test]
fn garbage_on_control_socket_is_an_error_reply() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.core.handle_admin(h.now, &Addr::new("admin"), b"nonsense");
    let sent = h.sent();
    assert!(matches!(
        &sent[..],
        [Out::Admin(AdminReply::Error {
            code: ErrorCode::BadRequest,
            ..
        })]
    ));
}
