//! The core driven in memory with a virtual clock.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use zinfer_protocol::{
    AdminReply, AdminRequest, ChatMessage, ClientReply, ClientRequest, ErrorCode, FinishReason,
    GenerateRequest, LoadReport, PROTOCOL_VERSION, RouterToWorker, Timings, Usage, WorkerState,
    WorkerToRouter, decode, encode,
};

use super::*;
use crate::{Metrics, Policy, RouterConfig};

#[derive(Debug)]
enum Out {
    Client(Vec<u8>, ClientReply),
    Worker(Vec<u8>, RouterToWorker),
    Admin(AdminReply),
}

struct Harness {
    core: Core,
    now: Instant,
    metrics: Arc<Metrics>,
}

fn config(policy: Policy) -> RouterConfig {
    RouterConfig {
        policy,
        metrics: None,
        ..RouterConfig::default()
    }
}

impl Harness {
    fn new(config: RouterConfig) -> Self {
        let metrics = Arc::new(Metrics::new().unwrap());
        let now = Instant::now();
        Harness {
            core: Core::new(config, Arc::clone(&metrics), now),
            now,
            metrics,
        }
    }

    fn advance(&mut self, millis: u64) {
        self.now += Duration::from_millis(millis);
        self.core.tick(self.now);
    }

    fn client(&mut self, client: &str, message: &ClientRequest) {
        let frame = encode(message).unwrap();
        self.core
            .handle_client(self.now, &Addr::new(client.as_bytes()), &frame);
    }

    fn generate(&mut self, client: &str, request: GenerateRequest) {
        self.client(client, &ClientRequest::Generate(request));
    }

    fn worker(&mut self, worker: &str, message: &WorkerToRouter) {
        let frame = encode(message).unwrap();
        self.core
            .handle_worker(self.now, &Addr::new(worker.as_bytes()), &frame);
    }

    fn admin(&mut self, message: &AdminRequest) -> AdminReply {
        let frame = encode(message).unwrap();
        self.core
            .handle_admin(self.now, &Addr::new("admin"), &frame);
        let mut replies: Vec<AdminReply> = self
            .sent()
            .into_iter()
            .filter_map(|out| match out {
                Out::Admin(reply) => Some(reply),
                _ => None,
            })
            .collect();
        assert_eq!(replies.len(), 1);
        replies.remove(0)
    }

    fn ready(&mut self, worker: &str, models: &[&str], max_batch: u32) {
        self.worker(
            worker,
            &WorkerToRouter::Ready {
                worker_id: worker.into(),
                protocol: PROTOCOL_VERSION,
                models: models.iter().map(|m| m.to_string()).collect(),
                device: "cpu".into(),
                kv_capacity: 4096,
                max_batch,
            },
        );
    }

    /// Every action queued so far, decoded.
    fn sent(&mut self) -> Vec<Out> {
        let limits = zinfer_protocol::Limits::default();
        let mut out = Vec::new();
        while let Some(Action::Send { to, frame }) = self.core.poll_action() {
            out.push(match to {
                Peer::Client(addr) => Out::Client(addr.identity, decode(&frame, &limits).unwrap()),
                Peer::Worker(addr) => Out::Worker(addr.identity, decode(&frame, &limits).unwrap()),
                Peer::Admin(_) => Out::Admin(decode(&frame, &limits).unwrap()),
            });
        }
        out
    }

    /// Replies to clients only (heartbeats and the like dropped).
    fn client_replies(&mut self) -> Vec<ClientReply> {
        self.sent()
            .into_iter()
            .filter_map(|out| match out {
                Out::Client(_, reply) => Some(reply),
                _ => None,
            })
            .collect()
    }

    /// Generate messages sent to workers: (worker, rid, request).
    fn dispatched(&mut self) -> Vec<(String, u64, GenerateRequest)> {
        self.sent()
            .into_iter()
            .filter_map(|out| match out {
                Out::Worker(to, RouterToWorker::Generate { rid, request }) => {
                    Some((String::from_utf8(to).unwrap(), rid, request))
                }
                _ => None,
            })
            .collect()
    }

    fn done(&mut self, worker: &str, rid: u64, reason: FinishReason) {
        self.worker(
            worker,
            &WorkerToRouter::Done {
                rid,
                finish_reason: reason,
                text: None,
                usage: Usage {
                    prompt_tokens: 10,
                    cached_tokens: 4,
                    completion_tokens: 3,
                },
                timings: Timings::default(),
            },
        );
    }

    fn chunk(&mut self, worker: &str, rid: u64, index: u32, text: &str) {
        self.worker(
            worker,
            &WorkerToRouter::Chunk {
                rid,
                index,
                text: text.into(),
                tokens: vec![index],
            },
        );
    }

    fn outcome(&self, outcome: &str) -> u64 {
        self.metrics.requests.with_label_values(&[outcome]).get()
    }

    fn decisions(&self, outcome: &str) -> u64 {
        self.metrics.routing.with_label_values(&[outcome]).get()
    }
}

fn prompt(id: &str, text: &str) -> GenerateRequest {
    GenerateRequest::from_prompt(id, text)
}

fn error_code(reply: &ClientReply) -> (Option<&str>, ErrorCode) {
    match reply {
        ClientReply::Error { id, code, .. } => (id.as_deref(), *code),
        other => panic!("expected an error, got {other:?}"),
    }
}

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
            index: 0,
            text: "Hel".into(),
            tokens: vec![0]
        }
    );
    assert!(matches!(&replies[1], ClientReply::Chunk { index: 1, text, .. } if text == "lo"));
    match &replies[2] {
        ClientReply::Done {
            id,
            finish_reason,
            worker,
            usage,
            ..
        } => {
            assert_eq!(id, "req-1");
            assert_eq!(*finish_reason, FinishReason::Stop);
            assert_eq!(worker, "w1");
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
            finish_reason: FinishReason::Length,
            text: Some("full text".into()),
            usage: Usage::default(),
            timings: Timings::default(),
        },
    );
    let replies = h.client_replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert!(matches!(&replies[0], ClientReply::Done { text: Some(t), .. } if t == "full text"));
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
    h.generate("c", prompt("running", "a"));
    h.generate("c", prompt("low", "b"));
    let mut urgent = prompt("urgent", "c");
    urgent.priority = 5;
    h.generate("c", urgent);
    let rid = h.dispatched()[0].1;
    h.done("w1", rid, FinishReason::Stop);
    assert_eq!(h.dispatched()[0].2.id, "urgent");
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
        Out::Client(_, ClientReply::Done { id, finish_reason: FinishReason::Cancelled, .. }) if id == "2"
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
        ClientReply::Done { finish_reason: FinishReason::Cancelled, worker, .. } if worker == "w1"
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
fn restarted_worker_registering_again_gets_its_requests_back() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("a", "x"));
    let rid = h.dispatched()[0].1;
    h.ready("w1", &["m"], 8);
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
    h.worker(
        "old",
        &WorkerToRouter::Ready {
            worker_id: "old".into(),
            protocol: PROTOCOL_VERSION + 1,
            models: vec!["m".into()],
            device: "cpu".into(),
            kv_capacity: 1,
            max_batch: 1,
        },
    );
    let sent = h.sent();
    assert!(
        matches!(&sent[0], Out::Worker(_, RouterToWorker::Disconnect { reason }) if reason.contains("protocol version"))
    );
    let AdminReply::Workers { workers } = h.admin(&AdminRequest::Workers {}) else {
        panic!("expected workers");
    };
    assert!(workers.is_empty());
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
fn round_robin_spreads_requests() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    for worker in ["w1", "w2", "w3"] {
        h.ready(worker, &["m"], 8);
    }
    for i in 0..6 {
        h.generate("c", prompt(&i.to_string(), "same prompt"));
    }
    let workers: Vec<String> = h.dispatched().into_iter().map(|d| d.0).collect();
    assert_eq!(workers, ["w1", "w2", "w3", "w1", "w2", "w3"]);
    assert_eq!(h.decisions("round_robin"), 6);
}

#[test]
fn least_load_counts_inflight_and_reported_waiting() {
    let mut h = Harness::new(config(Policy::LeastLoad));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    h.worker(
        "w1",
        &WorkerToRouter::Load(LoadReport {
            waiting: 3,
            ..LoadReport::default()
        }),
    );
    for i in 0..3 {
        h.generate("c", prompt(&i.to_string(), "p"));
    }
    let workers: Vec<String> = h.dispatched().into_iter().map(|d| d.0).collect();
    assert_eq!(workers, ["w2", "w2", "w2"]);
    h.generate("c", prompt("4", "p"));
    assert_eq!(h.dispatched()[0].0, "w1", "ties go to the first registered");
    assert_eq!(h.metrics.waiting.get(), 3);
}

#[test]
fn cache_aware_sticks_to_the_worker_holding_the_prefix() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    let system = "You are a helpful assistant. Answer briefly and cite sources. ";
    h.generate("c", prompt("a", &format!("{system}What is Rust?")));
    let first = h.dispatched()[0].0.clone();
    h.generate(
        "c",
        prompt("b", "Completely different prompt about cooking"),
    );
    let other = h.dispatched()[0].0.clone();
    assert_ne!(first, other, "a miss goes to the least loaded worker");
    for i in 0..4 {
        h.generate(
            "c",
            prompt(&format!("q{i}"), &format!("{system}Question {i}?")),
        );
        assert_eq!(h.dispatched()[0].0, first, "shared prefix sticks");
    }
    assert_eq!(h.decisions("cache_hit"), 4);
    assert_eq!(h.decisions("cache_miss"), 2);
}

#[test]
fn cache_aware_matches_chat_messages_and_separates_namespaces() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    let chat = |id: &str, question: &str, namespace: Option<&str>| {
        let mut request = prompt(id, "");
        request.prompt = None;
        request.namespace = namespace.map(str::to_string);
        request.messages = Some(vec![
            ChatMessage {
                role: "system".into(),
                content: "A long shared system prompt that dominates the key.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: question.into(),
            },
        ]);
        request
    };
    h.generate("c", chat("1", "hi", Some("t1")));
    let first = h.dispatched()[0].0.clone();
    h.generate("c", chat("2", "hello", Some("t1")));
    assert_eq!(h.dispatched()[0].0, first);
    h.generate("c", chat("3", "hello", Some("t2")));
    assert_ne!(
        h.dispatched()[0].0,
        first,
        "other namespace: no match, least loaded"
    );
}

#[test]
fn cache_aware_falls_back_to_least_load_when_imbalanced() {
    let mut h = Harness::new(RouterConfig {
        balance_abs: 2,
        balance_rel: 1.5,
        ..config(Policy::CacheAware)
    });
    h.ready("w1", &["m"], 16);
    h.ready("w2", &["m"], 16);
    let shared = "shared prefix shared prefix shared prefix ";
    h.generate("c", prompt("0", &format!("{shared}0")));
    let hot = h.dispatched()[0].0.clone();
    let mut routed = Vec::new();
    for i in 1..6 {
        h.generate("c", prompt(&i.to_string(), &format!("{shared}{i}")));
        routed.push(h.dispatched()[0].0.clone());
    }
    // Loads: the hot worker takes requests until it leads by more than 2.
    assert_eq!(routed[..2], [hot.clone(), hot.clone()]);
    assert_ne!(routed[2], hot, "imbalance sends to the least loaded");
    assert!(h.decisions("balance") >= 1);
}

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
