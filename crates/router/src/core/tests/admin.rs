//! Control socket: drain, migrate, scale.

use super::*;

#[test]
fn drain_stops_routing_and_is_forwarded() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    let reply = h.admin(&AdminRequest::Drain {
        worker: "w1".into(),
    });
    assert!(
        matches!(reply, AdminReply::Ack { ok: true, .. }),
        "{reply:?}"
    );
    assert!(h.sent().is_empty());
    let frame = encode(&AdminRequest::Drain {
        worker: "w1".into(),
    })
    .unwrap();
    h.core.handle_admin(h.now, &Addr::new("admin"), &frame);
    let forwarded = h.sent();
    assert!(
        forwarded
            .iter()
            .any(|o| matches!(o, Out::Worker(to, RouterToWorker::Drain {}) if to == b"w1"))
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
    assert_eq!(workers[1].inflight, 3);
    h.client("c", &ClientRequest::Models { id: None });
    let ClientReply::Models { models, .. } = &h.client_replies()[0] else {
        panic!("expected models");
    };
    assert_eq!(models[0].workers, 1, "draining workers are not listed");
    let missing = h.admin(&AdminRequest::Drain {
        worker: "nope".into(),
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
    });
    h.generate("c", prompt("a", "x"));
    assert_eq!(
        error_code(&h.client_replies()[0]),
        (Some("a"), ErrorCode::Unavailable)
    );
}

#[test]
fn migrate_is_forwarded_and_scale_explains() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    let frame = encode(&AdminRequest::Migrate {
        worker: "w1".into(),
        device: "cuda:1".into(),
    })
    .unwrap();
    h.core.handle_admin(h.now, &Addr::new("admin"), &frame);
    let sent = h.sent();
    assert!(sent.iter().any(
        |o| matches!(o, Out::Worker(_, RouterToWorker::Migrate { device }) if device == "cuda:1")
    ));
    assert!(
        sent.iter()
            .any(|o| matches!(o, Out::Admin(AdminReply::Ack { ok: true, .. })))
    );
    h.generate("c", prompt("a", "x"));
    assert_eq!(h.dispatched().len(), 1, "a migrating worker keeps serving");
    h.worker(
        "w1",
        &WorkerToRouter::ControlReply {
            op: zinfer_protocol::ControlOp::Migrate,
            ok: true,
            message: "on cuda:1".into(),
        },
    );
    let AdminReply::Workers { workers } = h.admin(&AdminRequest::Workers {}) else {
        panic!("expected workers");
    };
    assert_eq!(workers[0].state, WorkerState::Ready);
    let reply = h.admin(&AdminRequest::Scale {
        model: "m".into(),
        workers: 3,
    });
    assert!(
        matches!(reply, AdminReply::Ack { ok: false, ref message } if message.contains("zinfer worker"))
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
