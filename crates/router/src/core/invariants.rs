//! Seeded random event sequences against the core, checking that every
//! `generate` ends in exactly one terminal reply and nothing follows it.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use proptest::prelude::*;
use zinfer_protocol::{
    AdminRequest, ChunkBody, ClientReply, ClientRequest, DoneBody, ErrorCode, FinishReason,
    GenerateRequest, Limits, PROTOCOL_VERSION, ReadyBody, RouterToWorker, Timings, Usage,
    WorkerToRouter, decode, encode,
};

use super::{Action, Addr, Core, Peer, SendFailure};
use crate::{Metrics, Policy, RouterConfig};

const WORKERS: [&str; 3] = ["w0", "w1", "w2"];
const CLIENTS: [&str; 2] = ["c0", "c1"];

#[derive(Debug, Clone)]
enum Op {
    Register(usize),
    Generate {
        client: usize,
        stream: bool,
        known_model: bool,
        deadline_ms: Option<u64>,
    },
    Chunk(usize),
    Done(usize),
    Fail(usize),
    /// A reply for a dispatched request, sent by a worker not running it.
    Spoof(usize, usize),
    Cancel(usize),
    Heartbeat(usize),
    Advance(u64),
    Drain(usize),
    Garbage(usize),
    Unreachable(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize).prop_map(Op::Register),
        (
            0..2usize,
            any::<bool>(),
            prop::bool::weighted(0.9),
            prop::option::of(0..3000u64)
        )
            .prop_map(|(client, stream, known_model, deadline_ms)| Op::Generate {
                client,
                stream,
                known_model,
                deadline_ms,
            }),
        (0..64usize).prop_map(Op::Chunk),
        (0..64usize).prop_map(Op::Done),
        (0..64usize).prop_map(Op::Fail),
        (0..64usize, 0..3usize).prop_map(|(k, w)| Op::Spoof(k, w)),
        (0..64usize).prop_map(Op::Cancel),
        (0..3usize).prop_map(Op::Heartbeat),
        (0..2500u64).prop_map(Op::Advance),
        (0..3usize).prop_map(Op::Drain),
        (0..2usize).prop_map(Op::Garbage),
        (0..3usize).prop_map(Op::Unreachable),
    ]
}

#[derive(Default)]
struct Ledger {
    /// Terminal replies per (client, id).
    terminals: HashMap<(Vec<u8>, String), u32>,
    /// Replies that arrived after a terminal one.
    after_terminal: Vec<String>,
    /// Generates seen by workers: (worker identity, rid).
    dispatched: Vec<(Vec<u8>, u64)>,
    generated: Vec<(usize, String)>,
}

impl Ledger {
    fn drain(&mut self, core: &mut Core) {
        let limits = Limits::default();
        while let Some(Action::Send { to, frame }) = core.poll_action() {
            match to {
                Peer::Client(addr) => {
                    let reply: ClientReply = decode(&frame, &limits).expect("valid reply");
                    let (id, terminal) = match &reply {
                        ClientReply::Chunk { id, .. } => (Some(id.clone()), false),
                        ClientReply::Done { id, .. } => (Some(id.clone()), true),
                        ClientReply::Error { id, .. } => (id.clone(), true),
                        ClientReply::Models { .. } | ClientReply::Pong { .. } => (None, false),
                        ClientReply::Tokenized { id, .. }
                        | ClientReply::Detokenized { id, .. }
                        | ClientReply::AppliedTemplate { id, .. }
                        | ClientReply::Embedding { id, .. } => (Some(id.clone()), true),
                    };
                    let Some(id) = id else { continue };
                    let key = (addr.identity, id.clone());
                    let seen = self.terminals.get(&key).copied().unwrap_or(0);
                    if seen > 0 {
                        self.after_terminal.push(format!("{id}: {reply:?}"));
                    }
                    if terminal {
                        self.terminals.insert(key, seen + 1);
                    }
                }
                Peer::Worker(addr) => {
                    if let Ok(RouterToWorker::Generate { rid, .. }) = decode(&frame, &limits) {
                        self.dispatched.push((addr.identity, rid));
                    }
                }
                Peer::Admin(_) => {}
            }
        }
    }
}

fn worker_message(core: &mut Core, now: Instant, identity: &[u8], message: &WorkerToRouter) {
    let frame = encode(message).expect("encode");
    core.handle_worker(now, &Addr::new(identity), &frame);
}

fn run(policy: Policy, ops: &[Op]) -> Result<(), TestCaseError> {
    let config = RouterConfig {
        policy,
        metrics: None,
        max_inflight_per_worker: Some(2),
        queue_capacity: 3,
        ..RouterConfig::default()
    };
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let mut now = Instant::now();
    let mut core = Core::new(config, Arc::clone(&metrics), now);
    let mut ledger = Ledger::default();
    let mut next_id = 0u32;
    for op in ops {
        match op.clone() {
            Op::Register(w) => worker_message(
                &mut core,
                now,
                WORKERS[w].as_bytes(),
                &WorkerToRouter::Ready(ReadyBody {
                    worker_id: WORKERS[w].into(),
                    protocol: PROTOCOL_VERSION,
                    models: vec!["m".into()],
                    device: "cpu".into(),
                    kv_capacity: 100,
                    max_batch: 1,
                    context_length: None,
                    vocab_size: None,
                    import_endpoint: None,
                    import_key: None,
                }),
            ),
            Op::Generate {
                client,
                stream,
                known_model,
                deadline_ms,
            } => {
                let id = format!("r{next_id}");
                next_id += 1;
                let mut request = GenerateRequest::from_prompt(id.clone(), "shared prefix");
                request.stream = stream;
                request.deadline_ms = deadline_ms;
                if !known_model {
                    request.model = Some("other".into());
                }
                let frame = encode(&ClientRequest::Generate(request)).expect("encode");
                core.handle_client(now, &Addr::new(CLIENTS[client]), &frame);
                ledger.generated.push((client, id));
            }
            Op::Chunk(k) | Op::Done(k) | Op::Fail(k) if !ledger.dispatched.is_empty() => {
                let (worker, rid) = ledger.dispatched[k % ledger.dispatched.len()].clone();
                let message = match op {
                    Op::Chunk(_) => WorkerToRouter::Chunk {
                        rid,
                        body: ChunkBody {
                            text: "t".into(),
                            tokens: vec![1],
                            ..ChunkBody::default()
                        },
                    },
                    Op::Done(_) => WorkerToRouter::Done {
                        rid,
                        body: DoneBody::new(
                            FinishReason::Stop,
                            Usage::default(),
                            Timings::default(),
                        ),
                    },
                    _ => WorkerToRouter::Error {
                        rid,
                        code: ErrorCode::Internal,
                        message: "boom".into(),
                    },
                };
                worker_message(&mut core, now, &worker, &message);
            }
            Op::Spoof(k, w) if !ledger.dispatched.is_empty() => {
                let (_, rid) = ledger.dispatched[k % ledger.dispatched.len()];
                let message = WorkerToRouter::Done {
                    rid,
                    body: DoneBody::new(FinishReason::Stop, Usage::default(), Timings::default()),
                };
                worker_message(&mut core, now, WORKERS[w].as_bytes(), &message);
            }
            Op::Cancel(k) if !ledger.generated.is_empty() => {
                let (client, id) = ledger.generated[k % ledger.generated.len()].clone();
                let frame = encode(&ClientRequest::Cancel { id }).expect("encode");
                core.handle_client(now, &Addr::new(CLIENTS[client]), &frame);
            }
            Op::Heartbeat(w) => worker_message(
                &mut core,
                now,
                WORKERS[w].as_bytes(),
                &WorkerToRouter::Heartbeat {},
            ),
            Op::Advance(ms) => {
                now += Duration::from_millis(ms);
                core.tick(now);
            }
            Op::Drain(w) => {
                let frame = encode(&AdminRequest::Drain {
                    worker: WORKERS[w].into(),
                    park: false,
                })
                .expect("encode");
                core.handle_admin(now, &Addr::new("admin"), &frame);
            }
            Op::Garbage(client) => {
                core.handle_client(now, &Addr::new(CLIENTS[client]), b"\xc1garbage");
            }
            Op::Unreachable(w) => core.handle_send_failure(
                now,
                &Peer::Worker(Addr::new(WORKERS[w])),
                SendFailure::Full,
            ),
            Op::Chunk(_) | Op::Done(_) | Op::Fail(_) | Op::Spoof(..) | Op::Cancel(_) => {}
        }
        ledger.drain(&mut core);
        prop_assert!(
            ledger.after_terminal.is_empty(),
            "replies after a terminal one: {:?}",
            ledger.after_terminal
        );
    }
    core.shutdown(now);
    ledger.drain(&mut core);
    prop_assert!(
        ledger.after_terminal.is_empty(),
        "{:?}",
        ledger.after_terminal
    );
    for (client, id) in &ledger.generated {
        let key = (CLIENTS[*client].as_bytes().to_vec(), id.clone());
        prop_assert_eq!(
            ledger.terminals.get(&key).copied(),
            Some(1),
            "request {} must end exactly once",
            id
        );
    }
    prop_assert_eq!(core.active_requests(), 0);
    prop_assert_eq!(metrics.inflight.get(), 0);
    prop_assert_eq!(metrics.queue_depth.get(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_generate_ends_exactly_once_cache_aware(ops in prop::collection::vec(op(), 1..80)) {
        run(Policy::CacheAware, &ops)?;
    }

    #[test]
    fn every_generate_ends_exactly_once_round_robin(ops in prop::collection::vec(op(), 1..80)) {
        run(Policy::RoundRobin, &ops)?;
    }
}
