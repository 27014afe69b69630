//! Worker lifecycle: registration, heartbeats, loss, retry once, send failures.

use super::*;

#[test]
fn lost_worker_request_is_retried_once_then_worker_lost() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("quiet", "a"));
    let (first, rid, _) = h.dispatched().remove(0);
    h.ready("w2", &["m"], 8);
    let second = if first == "w1" { "w2" } else { "w1" };
    for _ in 0..4 {
        h.worker(second, &WorkerToRouter::Heartbeat {});
        h.advance(1_000);
    }
    let sent = h.sent();
    let resent: Vec<_> = sent
        .iter()
        .filter_map(|out| match out {
            Out::Worker(to, RouterToWorker::Generate { rid: r, .. }) => Some((to.clone(), *r)),
            _ => None,
        })
        .collect();
    assert_eq!(
        resent,
        [(second.as_bytes().to_vec(), rid)],
        "re-sent to the other worker"
    );
    assert!(!sent.iter().any(|out| matches!(out, Out::Client(..))));
    assert_eq!(h.metrics.retries.get(), 1);
    h.advance(4_000);
    let replies = h.client_replies();
    assert_eq!(
        error_code(&replies[0]),
        (Some("quiet"), ErrorCode::WorkerLost)
    );
    let ClientReply::Error { retryable, .. } = replies[0] else {
        unreachable!()
    };
    assert!(retryable);
}

#[test]
fn retry_happens_once_even_with_workers_left() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    let (first, rid, _) = h.dispatched().remove(0);
    h.ready("w2", &["m"], 8);
    h.ready("w3", &["m"], 8);
    let lose = |h: &mut Harness, worker: &str| {
        h.core.handle_send_failure(
            h.now,
            &Peer::Worker(Addr::new(worker.as_bytes())),
            SendFailure::Unreachable,
        );
    };
    lose(&mut h, &first);
    let (second, again, _) = h.dispatched().remove(0);
    assert_eq!(again, rid);
    lose(&mut h, &second);
    let sent = h.sent();
    assert!(
        !sent
            .iter()
            .any(|o| matches!(o, Out::Worker(_, RouterToWorker::Generate { .. }))),
        "no second retry: {sent:?}"
    );
    let errors: Vec<_> = sent
        .iter()
        .filter_map(|o| match o {
            Out::Client(_, reply) => Some(error_code(reply)),
            _ => None,
        })
        .collect();
    assert_eq!(errors, [(Some("a"), ErrorCode::WorkerLost)]);
}

#[test]
fn lost_worker_with_streamed_output_fails_at_once() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("talky", "a"));
    let rid = h.dispatched()[0].1;
    h.chunk("w1", rid, 0, "tok");
    h.ready("w2", &["m"], 8);
    for _ in 0..4 {
        h.worker("w2", &WorkerToRouter::Heartbeat {});
        h.advance(1_000);
    }
    let sent = h.sent();
    assert!(
        !sent
            .iter()
            .any(|out| matches!(out, Out::Worker(_, RouterToWorker::Generate { .. })))
    );
    let errors: Vec<_> = sent
        .iter()
        .filter_map(|out| match out {
            Out::Client(_, reply @ ClientReply::Error { .. }) => Some(error_code(reply)),
            _ => None,
        })
        .collect();
    assert_eq!(errors, [(Some("talky"), ErrorCode::WorkerLost)]);
    let reply = h.admin(&AdminRequest::Workers {});
    let AdminReply::Workers { workers } = reply else {
        panic!("expected workers");
    };
    let states: Vec<_> = workers.iter().map(|w| (w.id.as_str(), w.state)).collect();
    assert_eq!(
        states,
        [("w1", WorkerState::Lost), ("w2", WorkerState::Ready)]
    );
    assert_eq!(h.metrics.workers.with_label_values(&["lost"]).get(), 1);
}

#[test]
fn lost_only_worker_leaves_queue_unavailable() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("running", "a"));
    h.generate("c", prompt("waiting", "b"));
    h.advance(3_500);
    let codes: Vec<_> = h
        .client_replies()
        .iter()
        .map(|r| {
            let (id, code) = error_code(r);
            (id.map(str::to_string), code)
        })
        .collect();
    assert!(
        codes.contains(&(Some("waiting".into()), ErrorCode::Unavailable)),
        "{codes:?}"
    );
    assert!(
        codes.contains(&(Some("running".into()), ErrorCode::WorkerLost)),
        "{codes:?}"
    );
    assert_eq!(h.core.active_requests(), 0);
}

#[test]
fn a_repeated_ready_from_a_live_connection_changes_nothing() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    let rid = h.dispatched()[0].1;
    h.chunk("w1", rid, 0, "Hel");
    assert_eq!(h.client_replies().len(), 1);
    h.ready("w1", &["m"], 8);
    assert!(
        h.sent().is_empty(),
        "not sent again, no error: nothing restarted"
    );
    h.done("w1", rid, FinishReason::Stop);
    let replies = h.client_replies();
    assert!(
        matches!(&replies[..], [ClientReply::Done { .. }]),
        "the stream goes on: {replies:?}"
    );
    assert_eq!(h.core.active_requests(), 0);
}

#[test]
fn the_same_connection_registering_as_another_worker_is_a_restart() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    let rid = h.dispatched()[0].1;
    h.worker(
        "w1",
        &WorkerToRouter::Ready(ReadyBody {
            worker_id: "w1".into(),
            protocol: PROTOCOL_VERSION,
            models: vec!["m".into(), "other".into()],
            device: "cpu".into(),
            kv_capacity: 4096,
            max_batch: 8,
            context_length: None,
            vocab_size: None,
            import_endpoint: None,
            import_key: None,
        }),
    );
    // Lost before any output: the request is retried on the new worker.
    let dispatched = h.dispatched();
    assert_eq!(dispatched.len(), 1);
    assert_eq!((dispatched[0].0.as_str(), dispatched[0].1), ("w1", rid));
    assert!(h.client_replies().is_empty());
}

#[test]
fn unknown_worker_and_bad_protocol_get_disconnect() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.worker("ghost", &WorkerToRouter::Heartbeat {});
    let sent = h.sent();
    assert!(
        matches!(&sent[0], Out::Worker(to, RouterToWorker::Disconnect { .. }) if to == b"ghost")
    );
    let future = WorkerToRouter::Ready(ReadyBody {
        worker_id: "old".into(),
        protocol: PROTOCOL_VERSION + 1,
        models: vec!["m".into()],
        device: "cpu".into(),
        kv_capacity: 1,
        max_batch: 1,
        context_length: None,
        vocab_size: None,
        import_endpoint: None,
        import_key: None,
    });
    h.worker("old", &future);
    let sent = h.sent();
    assert!(
        matches!(&sent[0], Out::Worker(_, RouterToWorker::Disconnect { reason }) if reason.contains("protocol version"))
    );
    h.worker("old", &future);
    assert!(
        h.sent().is_empty(),
        "a refused worker is not answered again at once"
    );
    let AdminReply::Workers { workers } = h.admin(&AdminRequest::Workers {}) else {
        panic!("expected workers");
    };
    assert!(workers.is_empty());
    h.advance(1_100);
    h.sent();
    h.ready("old", &["m"], 1);
    h.client("c", &ClientRequest::Models { id: None });
    let ClientReply::Models { models, .. } = &h.client_replies()[0] else {
        panic!("expected models");
    };
    assert_eq!(models.len(), 1, "a fixed worker registers after the pause");
}

#[test]
fn router_heartbeats_workers_every_interval() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.advance(500);
    assert!(h.sent().is_empty());
    h.advance(600);
    let sent = h.sent();
    assert!(matches!(&sent[..], [Out::Worker(to, RouterToWorker::Heartbeat {})] if to == b"w1"));
}

#[test]
fn vanished_client_gets_its_requests_cancelled() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("gone", prompt("a", "x"));
    let rid = h.dispatched()[0].1;
    h.core.handle_send_failure(
        h.now,
        &Peer::Client(Addr::new("gone")),
        SendFailure::Unreachable,
    );
    let sent = h.sent();
    assert!(matches!(&sent[..], [Out::Worker(_, RouterToWorker::Cancel { rid: r })] if *r == rid));
}

#[test]
fn unreachable_worker_is_lost_and_its_request_retried() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    let (first, rid, _) = h.dispatched().remove(0);
    h.core.handle_send_failure(
        h.now,
        &Peer::Worker(Addr::new(first.as_bytes())),
        SendFailure::Unreachable,
    );
    let dispatched = h.dispatched();
    assert_eq!(dispatched.len(), 1);
    assert_ne!(dispatched[0].0, first);
    assert_eq!(dispatched[0].1, rid);
}

#[test]
fn chunk_from_a_worker_not_running_the_request_is_dropped() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    let (owner, rid, _) = h.dispatched().remove(0);
    let other = if owner == "w1" { "w2" } else { "w1" };
    h.chunk(other, rid, 0, "spoofed");
    h.done(other, rid, FinishReason::Stop);
    assert!(h.client_replies().is_empty());
    assert_eq!(h.core.active_requests(), 1);
}

impl Harness {
    /// A `ready` for worker id `id` arriving on connection `identity`.
    fn ready_on(&mut self, identity: &str, id: &str) {
        self.worker(
            identity,
            &WorkerToRouter::Ready(ReadyBody {
                worker_id: id.into(),
                protocol: PROTOCOL_VERSION,
                models: vec!["m".into()],
                device: "cpu".into(),
                kv_capacity: 4096,
                max_batch: 8,
                context_length: None,
                vocab_size: None,
                import_endpoint: None,
                import_key: None,
            }),
        );
    }

    fn listed_ids(&mut self) -> Vec<(String, WorkerState)> {
        let AdminReply::Workers { workers } = self.admin(&AdminRequest::Workers {}) else {
            panic!("expected workers");
        };
        workers.into_iter().map(|w| (w.id, w.state)).collect()
    }
}

#[test]
fn a_second_live_worker_with_the_same_id_is_refused_not_handed_over() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready_on("host-a", "w");
    h.generate("c", prompt("1", "x"));
    let (first, rid, _) = h.dispatched().remove(0);
    assert_eq!(first, "host-a");
    h.ready_on("host-b", "w");
    let sent = h.sent();
    assert!(
        sent.iter().any(|out| matches!(out,
            Out::Worker(to, RouterToWorker::Disconnect { reason })
                if to == b"host-b" && reason.contains("already registered"))),
        "{sent:?}"
    );
    // The live holder is probed, and keeps its id and its request.
    assert!(
        sent.iter().any(
            |out| matches!(out, Out::Worker(to, RouterToWorker::Heartbeat {}) if to == b"host-a")
        ),
        "{sent:?}"
    );
    assert_eq!(h.listed_ids(), vec![("w".to_string(), WorkerState::Ready)]);
    h.done("host-a", rid, FinishReason::Stop);
    assert!(matches!(
        &h.client_replies()[..],
        [ClientReply::Done { .. }]
    ));
    assert_eq!(
        h.metrics.refused.with_label_values(&["duplicate_id"]).get(),
        1
    );
    // While both stay alive, the duplicate keeps being refused.
    h.worker("host-a", &WorkerToRouter::Heartbeat {});
    h.advance(1_100);
    h.sent();
    h.ready_on("host-b", "w");
    assert!(h.sent().iter().any(|out| matches!(out,
        Out::Worker(to, RouterToWorker::Disconnect { .. }) if to == b"host-b")));
    h.generate("c", prompt("2", "y"));
    assert_eq!(h.dispatched()[0].0, "host-a");
}

#[test]
fn a_restarted_worker_on_a_new_connection_takes_over_once_the_old_one_is_gone() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready_on("old-conn", "w");
    // The old process died; its successor registers before the router
    // noticed. The probe heartbeat to the old connection fails.
    h.ready_on("new-conn", "w");
    h.sent();
    h.core.handle_send_failure(
        h.now,
        &Peer::Worker(Addr::new("old-conn")),
        SendFailure::Unreachable,
    );
    // The successor's ready is answered after the refusal pause.
    h.advance(1_100);
    h.sent();
    h.ready_on("new-conn", "w");
    assert!(h.sent().is_empty(), "registered without a disconnect");
    h.generate("c", prompt("1", "x"));
    assert_eq!(h.dispatched()[0].0, "new-conn");
    assert_eq!(
        h.listed_ids(),
        vec![("w".to_string(), WorkerState::Ready)],
        "the lost predecessor is no longer listed"
    );
}

#[test]
fn models_reply_carries_the_smallest_context_and_the_vocabulary() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    for (identity, context) in [("a", Some(8192)), ("b", Some(4096)), ("c", None)] {
        h.worker(
            identity,
            &WorkerToRouter::Ready(ReadyBody {
                worker_id: identity.into(),
                protocol: PROTOCOL_VERSION,
                models: vec!["m".into()],
                device: "cpu".into(),
                kv_capacity: 4096,
                max_batch: 8,
                context_length: context,
                vocab_size: context.map(|_| 49152),
                import_endpoint: None,
                import_key: None,
            }),
        );
    }
    h.client("c", &ClientRequest::Models { id: None });
    let ClientReply::Models { models, .. } = &h.client_replies()[0] else {
        panic!("expected models");
    };
    assert_eq!(models[0].workers, 3);
    assert_eq!(models[0].context_length, Some(4096));
    assert_eq!(models[0].vocab_size, Some(49152));
}

#[test]
fn cancelled_request_whose_worker_is_lost_ends_cancelled_not_lost() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    let (first, rid, _) = h.dispatched().remove(0);
    h.chunk(&first, rid, 0, "Hel");
    h.client("c", &ClientRequest::Cancel { id: "a".into() });
    // A chunk still in flight from the worker reaches the client.
    h.chunk(&first, rid, 1, "lo");
    h.client("c", &ClientRequest::Cancel { id: "a".into() });
    let cancels = h
        .sent()
        .into_iter()
        .filter(|out| matches!(out, Out::Worker(_, RouterToWorker::Cancel { .. })))
        .count();
    assert_eq!(cancels, 1, "cancel forwarded once");
    h.core.handle_send_failure(
        h.now,
        &Peer::Worker(Addr::new(first.as_bytes())),
        SendFailure::Unreachable,
    );
    let sent = h.sent();
    assert!(
        !sent
            .iter()
            .any(|o| matches!(o, Out::Worker(_, RouterToWorker::Generate { .. }))),
        "a cancelled request is not retried: {sent:?}"
    );
    let terminal: Vec<_> = sent
        .into_iter()
        .filter_map(|out| match out {
            Out::Client(
                _,
                ClientReply::Done {
                    body: DoneBody { finish_reason, .. },
                    ..
                },
            ) => Some(finish_reason),
            Out::Client(_, other) => panic!("expected done, got {other:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(terminal, [FinishReason::Cancelled]);
    assert_eq!(h.outcome("cancelled"), 1);
}
