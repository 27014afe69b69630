//! The core driven in memory with a virtual clock: a harness that plays
//! clients, workers and admins, and decodes what the core sends.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use zinfer_protocol::{
    AdminReply, AdminRequest, ChatMessage, ChunkBody, ClientReply, ClientRequest, DoneBody,
    ErrorCode, FinishReason, GenerateRequest, LoadReport, PROTOCOL_VERSION, ReadyBody,
    RouterToSupervisor, RouterToWorker, Timings, Usage, WorkerState, WorkerToRouter, decode,
    encode,
};

use super::{Action, Addr, Core, Peer, SendFailure};
use crate::{Metrics, Policy, RouterConfig};

mod admin;
mod control;
mod on_demand;
mod policies;
mod quota;
mod requests;
mod tenancy;
mod text;
mod timers;
mod workers;

#[derive(Debug)]
enum Out {
    Client(Vec<u8>, ClientReply),
    Worker(Vec<u8>, RouterToWorker),
    Admin(AdminReply),
    /// A reply on the control socket, with its receiver.
    AdminTo(Vec<u8>, AdminReply),
    Supervisor(RouterToSupervisor),
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
            &WorkerToRouter::Ready(ReadyBody {
                worker_id: worker.into(),
                protocol: PROTOCOL_VERSION,
                models: models.iter().map(|m| m.to_string()).collect(),
                device: "cpu".into(),
                kv_capacity: 4096,
                max_batch,
                context_length: None,
                vocab_size: None,
                import_endpoint: None,
                import_key: None,
            }),
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
                Peer::Admin(addr) if addr.identity == b"admin" => {
                    Out::Admin(decode(&frame, &limits).unwrap())
                }
                Peer::Admin(addr) => match decode::<AdminReply>(&frame, &limits) {
                    Ok(reply) => Out::AdminTo(addr.identity, reply),
                    Err(_) => Out::Supervisor(decode(&frame, &limits).unwrap()),
                },
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
                body: DoneBody::new(
                    reason,
                    Usage {
                        prompt_tokens: 10,
                        cached_tokens: 4,
                        completion_tokens: 3,
                    },
                    Timings::default(),
                ),
            },
        );
    }

    fn chunk(&mut self, worker: &str, rid: u64, index: u32, text: &str) {
        self.worker(
            worker,
            &WorkerToRouter::Chunk {
                rid,
                body: ChunkBody {
                    index,
                    text: text.into(),
                    tokens: vec![index],
                    ..ChunkBody::default()
                },
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
