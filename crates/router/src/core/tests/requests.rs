//! Client requests: relay, terminal replies, rejections, queue, cancel, deadlines.

use super::*;
use zinfer_protocol::{ChunkBody, DoneBody, TokenLogprob, TopLogprob};

#[test]
fn ping_and_models() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.client(
        "c",
        &ClientRequest::Ping {
            id: Some("p".into()),
        },
    );
    h.client("c", &ClientRequest::Models { id: None });
    let replies = h.client_replies();
    assert_eq!(
        replies[0],
        ClientReply::Pong {
            id: Some("p".into())
        }
    );
    assert_eq!(
        replies[1],
        ClientReply::Models {
            id: None,
            models: vec![]
        }
    );
    h.ready("w1", &["small"], 4);
    h.ready("w2", &["small", "big"], 4);
    h.client("c", &ClientRequest::Models { id: None });
    let ClientReply::Models { models, .. } = &h.client_replies()[0] else {
        panic!("expected models");
    };
    let listed: Vec<(&str, u32)> = models
        .iter()
        .map(|m| (m.name.as_str(), m.workers))
        .collect();
    assert_eq!(listed, [("big", 1), ("small", 2)]);
}

#[test]
fn streams_chunks_and_done_with_client_id_and_worker() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 4);
    let mut request = prompt("req-1", "hello");
    request.namespace = Some("tenant-a".into());
    request.deadline_ms = Some(60_000);
    h.generate("c1", request);
    let dispatched = h.dispatched();
    assert_eq!(dispatched.len(), 1);
    let (worker, rid, forwarded) = &dispatched[0];
    assert_eq!(worker, "w1");
    assert_eq!(forwarded.model.as_deref(), Some("m"), "model filled in");
    assert_eq!(forwarded.namespace.as_deref(), Some("tenant-a"));
    assert_eq!(forwarded.deadline_ms, Some(60_000));
    let rid = *rid;
    h.chunk("w1", rid, 0, "Hel");
    h.advance(5);
    h.chunk("w1", rid, 1, "lo");
    h.done("w1", rid, FinishReason::Stop);
    let replies = h.client_replies();
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert_eq!(
        replies[0],
        ClientReply::Chunk {
            id: "req-1".into(),
            body: ChunkBody {
                text: "Hel".into(),
                tokens: vec![0],
                ..ChunkBody::default()
            },
        }
    );
    assert!(
        matches!(&replies[1], ClientReply::Chunk { body: ChunkBody { index: 1, text, .. }, .. } if text == "lo")
    );
    match &replies[2] {
        ClientReply::Done {
            id,
            body:
                DoneBody {
                    finish_reason,
                    worker,
                    usage,
                    ..
                },
            ..
        } => {
            assert_eq!(id, "req-1");
            assert_eq!(*finish_reason, FinishReason::Stop);
            assert_eq!(worker.as_deref(), Some("w1"));
            assert_eq!(usage.completion_tokens, 3);
        }
        other => panic!("expected done, got {other:?}"),
    }
    assert_eq!(h.core.active_requests(), 0);
    assert_eq!(h.outcome("stop"), 1);
    assert_eq!(h.metrics.relayed_chunks.get(), 2);
    assert_eq!(h.metrics.cached_tokens.get(), 4);
    assert_eq!(h.metrics.ttft.get_sample_count(), 1);
    assert_eq!(h.metrics.inter_token.get_sample_count(), 1);
}

#[test]
fn a_request_of_several_choices_ends_with_its_last_done() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 4);
    let mut request = prompt("req-n", "hello");
    request.n = 3;
    h.generate("c1", request);
    let (_, rid, forwarded) = h.dispatched().remove(0);
    assert_eq!(forwarded.n, 3);
    let done = |choice: u32| WorkerToRouter::Done {
        rid,
        body: DoneBody {
            choice,
            ..DoneBody::new(FinishReason::Stop, Usage::default(), Timings::default())
        },
    };
    h.worker("w1", &done(2));
    h.worker("w1", &done(0));
    assert_eq!(h.core.active_requests(), 1, "one choice still runs");
    h.worker("w1", &done(1));
    assert_eq!(h.core.active_requests(), 0);
    let choices: Vec<u32> = h
        .client_replies()
        .iter()
        .map(|reply| match reply {
            ClientReply::Done {
                body: DoneBody { choice, .. },
                ..
            } => *choice,
            other => panic!("expected done, got {other:?}"),
        })
        .collect();
    assert_eq!(choices, [2, 0, 1]);
    assert_eq!(h.outcome("stop"), 1, "one request, counted once");

    // Cancelled while queued: a done for every choice.
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c1", prompt("busy", "a"));
    let mut request = prompt("req-q", "hello");
    request.n = 2;
    h.generate("c1", request);
    h.sent();
    h.client("c1", &ClientRequest::Cancel { id: "req-q".into() });
    let choices: Vec<(u32, FinishReason)> = h
        .client_replies()
        .iter()
        .filter_map(|reply| match reply {
            ClientReply::Done {
                body:
                    DoneBody {
                        choice,
                        finish_reason,
                        ..
                    },
                ..
            } => Some((*choice, *finish_reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        choices,
        [(0, FinishReason::Cancelled), (1, FinishReason::Cancelled)]
    );
}

#[test]
fn non_streamed_request_gets_only_done_with_text() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 4);
    let mut request = prompt("a", "hi");
    request.stream = false;
    h.generate("c", request);
    let rid = h.dispatched()[0].1;
    h.chunk("w1", rid, 0, "ignored");
    h.worker(
        "w1",
        &WorkerToRouter::Done {
            rid,
            body: DoneBody {
                text: Some("full text".into()),
                ..DoneBody::new(FinishReason::Length, Usage::default(), Timings::default())
            },
        },
    );
    let replies = h.client_replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert!(
        matches!(&replies[0], ClientReply::Done { body: DoneBody { text: Some(t), .. }, .. } if t == "full text")
    );
}

/// The worker's logprob entries reach the client as they were, on chunks
/// and on a non-streamed done; the request's fields reach the worker.
#[test]
fn logprobs_are_forwarded_and_relayed_unchanged() {
    let entry = |token: u32, logprob: f32| TokenLogprob {
        token,
        text: format!("t{token}"),
        logprob,
        top_logprobs: vec![TopLogprob {
            token,
            text: format!("t{token}"),
            logprob,
        }],
    };
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 4);
    let mut request = prompt("s", "hi");
    request.logprobs = true;
    request.top_logprobs = 1;
    h.generate("c", request);
    let (_, rid, forwarded) = h.dispatched().remove(0);
    assert!(forwarded.logprobs && forwarded.top_logprobs == 1);
    let entries = vec![entry(5, -0.5), entry(6, -1.25)];
    h.worker(
        "w1",
        &WorkerToRouter::Chunk {
            rid,
            body: ChunkBody {
                text: "ab".into(),
                tokens: vec![5, 6],
                logprobs: Some(entries.clone()),
                ..ChunkBody::default()
            },
        },
    );
    h.done("w1", rid, FinishReason::Stop);
    let replies = h.client_replies();
    assert!(
        matches!(&replies[0], ClientReply::Chunk { body: ChunkBody { logprobs: Some(got), .. }, .. } if *got == entries),
        "{replies:?}"
    );

    let mut request = prompt("n", "hi");
    request.logprobs = true;
    request.stream = false;
    request.max_tokens = 8;
    h.generate("c", request);
    let rid = h.dispatched()[0].1;
    h.worker(
        "w1",
        &WorkerToRouter::Done {
            rid,
            body: DoneBody {
                text: Some("ab".into()),
                logprobs: Some(entries.clone()),
                ..DoneBody::new(FinishReason::Length, Usage::default(), Timings::default())
            },
        },
    );
    let replies = h.client_replies();
    assert!(
        matches!(&replies[0], ClientReply::Done { body: DoneBody { logprobs: Some(got), .. }, .. } if *got == entries),
        "{replies:?}"
    );
}

#[test]
fn terminal_reply_is_sent_exactly_once() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 4);
    h.generate("c", prompt("a", "hi"));
    let rid = h.dispatched()[0].1;
    h.done("w1", rid, FinishReason::Stop);
    h.done("w1", rid, FinishReason::Stop);
    h.worker(
        "w1",
        &WorkerToRouter::Error {
            rid,
            code: ErrorCode::Internal,
            message: "late".into(),
        },
    );
    h.chunk("w1", rid, 9, "late");
    h.advance(10_000);
    let replies = h.client_replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert!(matches!(replies[0], ClientReply::Done { .. }));
}

#[test]
fn worker_error_is_relayed_with_retryable_flag() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 4);
    h.generate("c", prompt("a", "hi"));
    let rid = h.dispatched()[0].1;
    h.worker(
        "w1",
        &WorkerToRouter::Error {
            rid,
            code: ErrorCode::PromptTooLong,
            message: "too long".into(),
        },
    );
    let replies = h.client_replies();
    assert!(matches!(
        &replies[0],
        ClientReply::Error { id: Some(id), code: ErrorCode::PromptTooLong, retryable: false, .. }
            if id == "a"
    ));
}

#[test]
fn duplicate_id_in_flight_is_bad_request() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 4);
    h.generate("c", prompt("same", "one"));
    h.generate("c", prompt("same", "two"));
    h.generate("other-client", prompt("same", "three"));
    let sent = h.sent();
    let errors: Vec<_> = sent
        .iter()
        .filter_map(|out| match out {
            Out::Client(to, reply) => Some((to.clone(), error_code(reply))),
            _ => None,
        })
        .collect();
    assert_eq!(
        errors,
        [(b"c".to_vec(), (Some("same"), ErrorCode::BadRequest))]
    );
    assert_eq!(h.core.active_requests(), 2);
    let rid = sent
        .iter()
        .find_map(|out| match out {
            Out::Worker(_, RouterToWorker::Generate { rid, request })
                if request.prompt.as_deref() == Some("one") =>
            {
                Some(*rid)
            }
            _ => None,
        })
        .unwrap();
    h.done("w1", rid, FinishReason::Stop);
    h.generate("c", prompt("same", "again"));
    assert_eq!(h.dispatched().len(), 1, "the id is free again");
}

#[test]
fn garbage_gets_bad_request_and_changes_nothing() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 4);
    let client = Addr::new("c");
    h.core.handle_client(h.now, &client, b"\xff\x00garbage");
    let unknown = encode(&serde_json_like_map("teleport", "t1")).unwrap();
    h.core.handle_client(h.now, &client, &unknown);
    let mut bad = prompt("hot", "x");
    bad.temperature = -1.0;
    let frame = encode(&ClientRequest::Generate(bad)).unwrap();
    h.core.handle_client(h.now, &client, &frame);
    h.core
        .reject_client_envelope(&client, "message of 5 frames exceeds the limit of 4");
    let replies = h.client_replies();
    let codes: Vec<_> = replies.iter().map(error_code).collect();
    assert_eq!(
        codes,
        [
            (None, ErrorCode::BadRequest),
            (Some("t1"), ErrorCode::BadRequest),
            (Some("hot"), ErrorCode::BadRequest),
            (None, ErrorCode::BadRequest),
        ]
    );
    let ClientReply::Error { message, .. } = &replies[2] else {
        unreachable!()
    };
    assert!(message.contains("temperature"), "{message}");
    assert_eq!(h.core.active_requests(), 0);
    assert!(h.dispatched().is_empty());
    assert_eq!(h.outcome("bad_request"), 4);
}

fn serde_json_like_map(kind: &str, id: &str) -> std::collections::BTreeMap<String, String> {
    [
        ("type".to_string(), kind.to_string()),
        ("id".to_string(), id.to_string()),
    ]
    .into_iter()
    .collect()
}

#[test]
fn no_worker_means_unavailable_and_unknown_model_lists_models() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.generate("c", prompt("a", "hi"));
    assert_eq!(
        error_code(&h.client_replies()[0]),
        (Some("a"), ErrorCode::Unavailable)
    );
    h.ready("w1", &["alpha", "beta"], 4);
    let mut request = prompt("b", "hi");
    request.model = Some("gamma".into());
    h.generate("c", request);
    let replies = h.client_replies();
    assert_eq!(
        error_code(&replies[0]),
        (Some("b"), ErrorCode::UnknownModel)
    );
    let ClientReply::Error {
        message, retryable, ..
    } = &replies[0]
    else {
        unreachable!()
    };
    assert!(
        message.contains("alpha") && message.contains("beta"),
        "{message}"
    );
    assert!(!retryable);
}

#[test]
fn absent_model_goes_to_the_most_served_model() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["zeta"], 4);
    h.ready("w2", &["zeta"], 4);
    h.ready("w3", &["alpha"], 4);
    h.generate("c", prompt("a", "hi"));
    let dispatched = h.dispatched();
    assert_eq!(dispatched[0].2.model.as_deref(), Some("zeta"));
    let mut request = prompt("b", "hi");
    request.model = Some("alpha".into());
    h.generate("c", request);
    assert_eq!(h.dispatched()[0].0, "w3");
}

#[test]
fn full_worker_queues_then_full_queue_is_overloaded() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        queue_capacity: 1,
        ..config(Policy::LeastLoad)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("1", "a"));
    h.generate("c", prompt("2", "b"));
    h.generate("c", prompt("3", "c"));
    let sent = h.sent();
    let generates: Vec<u64> = sent
        .iter()
        .filter_map(|out| match out {
            Out::Worker(_, RouterToWorker::Generate { rid, .. }) => Some(*rid),
            _ => None,
        })
        .collect();
    assert_eq!(generates.len(), 1);
    let errors: Vec<_> = sent
        .iter()
        .filter_map(|out| match out {
            Out::Client(_, reply) => Some(error_code(reply)),
            _ => None,
        })
        .collect();
    assert_eq!(errors, [(Some("3"), ErrorCode::Overloaded)]);
    assert_eq!(h.core.queued_requests(), 1);
    assert_eq!(h.metrics.queue_depth.get(), 1);
    h.done("w1", generates[0], FinishReason::Stop);
    let dispatched = h.dispatched();
    assert_eq!(dispatched.len(), 1);
    assert_eq!(dispatched[0].2.id, "2", "the queued request runs next");
    assert_eq!(h.core.queued_requests(), 0);
}

#[test]
fn queue_serves_higher_priority_first() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    let mut running = prompt("running", "a");
    running.priority = 9;
    h.generate("c", running);
    h.generate("c", prompt("low", "b"));
    let mut urgent = prompt("urgent", "c");
    urgent.priority = 5;
    h.generate("c", urgent);
    let rid = h.dispatched()[0].1;
    h.done("w1", rid, FinishReason::Stop);
    assert_eq!(h.dispatched()[0].2.id, "urgent");
}

#[test]
fn a_request_that_outranks_work_in_flight_goes_past_the_cap() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("running", "a"));
    h.generate("c", prompt("low", "b"));
    let mut urgent = prompt("urgent", "c");
    urgent.priority = 5;
    h.generate("c", urgent);
    // The worker preempts for it; waiting in the router would not.
    let ids: Vec<String> = h.dispatched().into_iter().map(|d| d.2.id).collect();
    assert_eq!(ids, ["running", "urgent"]);
    assert_eq!(h.core.queued_requests(), 1, "equal priority still waits");
    // The headroom is bounded: 8 past the cap of 1, so seven more urgent
    // ones go and the rest wait.
    for i in 0..9 {
        let mut more = prompt(&format!("u{i}"), "d");
        more.priority = 5;
        h.generate("c", more);
    }
    assert_eq!(h.dispatched().len(), 7);
    assert_eq!(h.core.queued_requests(), 3);
}

#[test]
fn cancel_of_queued_request_answers_directly() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("1", "a"));
    h.generate("c", prompt("2", "b"));
    h.sent();
    h.client("c", &ClientRequest::Cancel { id: "2".into() });
    let sent = h.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(matches!(
        &sent[0],
        Out::Client(_, ClientReply::Done { id, body: DoneBody { finish_reason: FinishReason::Cancelled, .. }, .. }) if id == "2"
    ));
    assert_eq!(h.core.queued_requests(), 0);
    h.client("c", &ClientRequest::Cancel { id: "2".into() });
    assert!(h.sent().is_empty(), "cancel of an ended request is a no-op");
}

#[test]
fn cancel_in_flight_is_forwarded_and_done_relayed() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("1", "a"));
    let rid = h.dispatched()[0].1;
    h.client("c", &ClientRequest::Cancel { id: "1".into() });
    h.client("c", &ClientRequest::Cancel { id: "1".into() });
    let sent = h.sent();
    assert_eq!(sent.len(), 1, "cancel forwarded once: {sent:?}");
    assert!(
        matches!(&sent[0], Out::Worker(to, RouterToWorker::Cancel { rid: r }) if to == b"w1" && *r == rid)
    );
    h.done("w1", rid, FinishReason::Cancelled);
    let replies = h.client_replies();
    assert!(matches!(
        &replies[0],
        ClientReply::Done { body: DoneBody { finish_reason: FinishReason::Cancelled, worker, .. }, .. } if worker.as_deref() == Some("w1")
    ));
    assert_eq!(h.outcome("cancelled"), 1);
}

#[test]
fn queued_request_past_deadline_fails() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("1", "a"));
    let mut late = prompt("2", "b");
    late.deadline_ms = Some(500);
    h.generate("c", late);
    h.sent();
    h.advance(400);
    assert!(h.client_replies().is_empty());
    h.worker("w1", &WorkerToRouter::Heartbeat {});
    h.advance(200);
    let replies = h.client_replies();
    assert_eq!(error_code(&replies[0]), (Some("2"), ErrorCode::Deadline));
    assert_eq!(h.core.queued_requests(), 0);
}

#[test]
fn forwarded_deadline_is_what_is_left() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("1", "a"));
    let mut request = prompt("2", "b");
    request.deadline_ms = Some(1_000);
    h.generate("c", request);
    let rid = h.dispatched()[0].1;
    h.advance(300);
    h.done("w1", rid, FinishReason::Stop);
    let dispatched = h.dispatched();
    assert_eq!(dispatched[0].2.deadline_ms, Some(700));
}

#[test]
fn shutdown_fails_every_request_once() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("running", "a"));
    h.generate("c", prompt("queued", "b"));
    h.sent();
    h.core.shutdown(h.now);
    let replies = h.client_replies();
    assert_eq!(replies.len(), 2);
    for reply in &replies {
        assert_eq!(error_code(reply).1, ErrorCode::Unavailable);
    }
    assert_eq!(h.core.active_requests(), 0);
}

#[test]
fn req_style_envelope_is_kept_on_replies() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    let from = Addr {
        identity: b"req".to_vec(),
        delimited: true,
    };
    let frame = encode(&ClientRequest::Ping { id: None }).unwrap();
    h.core.handle_client(h.now, &from, &frame);
    let Some(Action::Send { to, .. }) = h.core.poll_action() else {
        panic!("expected a reply");
    };
    assert_eq!(to, Peer::Client(from));
}
