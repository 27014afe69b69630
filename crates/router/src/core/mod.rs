//! The router's state machine, free of I/O (quinn-proto style).
//!
//! The I/O loop feeds it frames with `handle_client`, `handle_worker` and
//! `handle_admin`, calls `tick` on a timer, and sends whatever
//! `poll_action` yields. Time is passed in, so tests drive it with a
//! virtual clock and in-memory queues instead of sockets.
//!
//! Invariant: every accepted `generate` ends in exactly one terminal reply
//! (`done` or `error`) to its client. A request leaves the table only
//! through `take`, and only its taker sends the terminal reply.

mod admin;
mod autoscale;
mod client;
mod control;
mod on_demand;
mod quota;
mod routing;
mod text;
mod workers;

#[cfg(test)]
mod invariants;
#[cfg(test)]
mod tests;

use std::{
    cmp::Reverse,
    collections::{BTreeSet, HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use serde::Serialize;
use zinfer_protocol::{ClientReply, ErrorCode, GenerateRequest, WorkerState, encode};

use crate::{RouterConfig, metrics::Metrics};
use workers::Worker;

/// A peer's ZeroMQ routing identity and the envelope shape it used, so a
/// reply goes back in the same shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Addr {
    /// Routing identity the ROUTER socket assigned or the peer set.
    pub identity: Vec<u8>,
    /// Whether the peer sent an empty delimiter frame (REQ style).
    pub delimited: bool,
}

impl Addr {
    /// A DEALER-style address (no delimiter frame).
    pub fn new(identity: impl Into<Vec<u8>>) -> Self {
        Addr {
            identity: identity.into(),
            delimited: false,
        }
    }
}

/// Which socket a frame goes out on, and to whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Front socket.
    Client(Addr),
    /// Back socket.
    Worker(Addr),
    /// Control socket.
    Admin(Addr),
}

impl Peer {
    /// The peer's address.
    pub fn addr(&self) -> &Addr {
        match self {
            Peer::Client(addr) | Peer::Worker(addr) | Peer::Admin(addr) => addr,
        }
    }
}

/// What the core asks the I/O loop to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send one encoded message.
    Send {
        /// Destination.
        to: Peer,
        /// MessagePack payload.
        frame: Vec<u8>,
    },
}

/// Why the I/O loop could not send to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// No such peer is connected (EHOSTUNREACH).
    Unreachable,
    /// The peer's queue is at its high-water mark (EAGAIN).
    Full,
}

/// One request the router accepted and has not yet ended.
struct Request {
    client: Addr,
    /// What per-client limits count under: the tenant with CURVE on, else
    /// the connection's routing id.
    quota_key: Vec<u8>,
    id: String,
    /// The request as forwarded, `model` filled in.
    request: GenerateRequest,
    /// Bytes matched by cache-aware routing (empty for other policies).
    key: Vec<u8>,
    /// Namespace of `key` in the workers' prefix indexes.
    index_namespace: String,
    arrived: Instant,
    deadline: Option<Instant>,
    /// Queued or running, and what losing its worker would mean.
    stage: Stage,
    last_chunk: Option<Instant>,
    /// `done`s still to come: one per choice (`n`); the last ends it.
    choices_left: u32,
    /// The client sent `embed`: its `done` goes back as `embedding`.
    embedding: bool,
    /// Span carrying `rid` and the client's `id` for this request's logs.
    span: tracing::Span,
}

/// Where an accepted request stands. Each variant answers what a lost
/// worker, a cancel or a `done` means for it, so no combination of flags
/// can contradict another.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    /// In the queue, never sent to a worker.
    Queued,
    /// Back in the queue after its first worker was lost before any
    /// output; losing a second worker ends it.
    Requeued,
    /// On `worker`.
    Running {
        worker: Vec<u8>,
        /// This is its second worker: losing it ends the request.
        retried: bool,
        progress: Progress,
    },
}

/// How far a running request got, which decides its fate if its worker
/// is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Nothing reached the client yet: it can be re-sent elsewhere once.
    Silent,
    /// A chunk reached the client, so a retry would repeat output.
    Streamed,
    /// The client cancelled and the worker was told; the request ends as
    /// cancelled whether the worker answers or is lost.
    Cancelling,
}

impl Stage {
    /// The worker running the request, if it runs.
    fn worker(&self) -> Option<&[u8]> {
        match self {
            Stage::Running { worker, .. } => Some(worker),
            Stage::Queued | Stage::Requeued => None,
        }
    }

    /// Whether it already lost one worker and was re-sent.
    fn retried(&self) -> bool {
        match self {
            Stage::Queued => false,
            Stage::Requeued => true,
            Stage::Running { retried, .. } => *retried,
        }
    }

    /// Whether it ever left the queue for a worker.
    fn dispatched(&self) -> bool {
        !matches!(self, Stage::Queued)
    }
}

impl Request {
    fn queue_key(&self, rid: u64) -> (Reverse<i32>, u64) {
        (Reverse(self.request.priority), rid)
    }
}

/// The router's state: workers, requests, queue, and outgoing actions.
pub struct Core {
    config: RouterConfig,
    metrics: Arc<Metrics>,
    workers: HashMap<Vec<u8>, Worker>,
    /// Worker identities in registration order (round robin, listings).
    order: Vec<Vec<u8>>,
    requests: HashMap<u64, Request>,
    by_client: HashMap<(Vec<u8>, String), u64>,
    /// Queued requests, highest priority first, then oldest first.
    queue: BTreeSet<(Reverse<i32>, u64)>,
    next_rid: u64,
    rr_cursor: usize,
    next_heartbeat: Instant,
    /// When `tick` next has work: the earliest of the heartbeat, a worker
    /// expiry, a lost worker's retention, a refusal's end and a queued
    /// request's deadline. Events that add an earlier timer lower it.
    next_wake: Instant,
    actions: VecDeque<Action>,
    /// Workers whose `ready` was refused, and when: further `ready`s from
    /// them are ignored for a heartbeat interval, so a worker that
    /// re-registers at once on `disconnect` cannot start a tight loop.
    refused: HashMap<Vec<u8>, Instant>,
    /// Per-client usage, for the per-client limits; only clients with
    /// something in flight or a bucket still refilling.
    quotas: HashMap<Vec<u8>, quota::ClientQuota>,
    /// Supervisors, scaling, drains and migrations.
    control: control::ControlPlane,
    /// Models loaded on demand: cold starts, keep-alive, eviction.
    on_demand: on_demand::OnDemand,
    /// Text requests (`tokenize`, ...) on workers, by rid.
    texts: HashMap<u64, text::TextOp>,
    /// The same, by (client identity, client id).
    text_ids: HashMap<(Vec<u8>, String), u64>,
}

impl Core {
    /// Makes `first` the next request id handed out (1 by default).
    pub fn start_rids_at(&mut self, first: u64) {
        self.next_rid = first;
    }

    /// A router with no workers and no requests.
    pub fn new(config: RouterConfig, metrics: Arc<Metrics>, now: Instant) -> Self {
        Core {
            next_heartbeat: now + config.heartbeat_interval,
            next_wake: now + config.heartbeat_interval,
            config,
            metrics,
            workers: HashMap::new(),
            order: Vec::new(),
            requests: HashMap::new(),
            by_client: HashMap::new(),
            queue: BTreeSet::new(),
            next_rid: 1,
            rr_cursor: 0,
            actions: VecDeque::new(),
            refused: HashMap::new(),
            quotas: HashMap::new(),
            control: control::ControlPlane::default(),
            on_demand: on_demand::OnDemand::default(),
            texts: HashMap::new(),
            text_ids: HashMap::new(),
        }
    }

    /// The next action for the I/O loop, if any.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When the I/O loop must call `tick` next, if nothing arrives before.
    /// Between timers the core needs no tick, so an idle router sleeps
    /// until its next heartbeat.
    #[must_use]
    pub fn poll_timeout(&self) -> Instant {
        self.next_wake
    }

    /// Requests accepted and not yet ended (queued or running).
    pub fn active_requests(&self) -> usize {
        self.requests.len()
    }

    /// Requests waiting in the router queue.
    pub fn queued_requests(&self) -> usize {
        self.queue.len()
    }

    /// Timers: heartbeats to workers, worker expiry, queued deadlines.
    pub fn tick(&mut self, now: Instant) {
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.config.heartbeat_interval;
            self.heartbeat_workers();
        }
        self.expire_workers(now);
        let interval = self.config.heartbeat_interval;
        self.refused
            .retain(|_, at| now.saturating_duration_since(*at) < interval);
        let expired: Vec<u64> = self
            .queue
            .iter()
            .map(|&(_, rid)| rid)
            .filter(|rid| {
                self.requests
                    .get(rid)
                    .and_then(|r| r.deadline)
                    .is_some_and(|deadline| deadline <= now)
            })
            .collect();
        for rid in expired {
            self.fail(
                now,
                rid,
                ErrorCode::Deadline,
                "deadline_ms passed while the request waited for a free worker; \
                 raise deadline_ms or add workers",
            );
        }
        self.forget_idle_quotas(now);
        self.control_tick(now);
        self.settle_drains(now);
        self.refresh_gauges();
        self.next_wake = self.earliest_timer(now);
    }

    /// The earliest instant at which `tick` has something to do, never
    /// earlier than a millisecond from `now` (so a timer that does not fire
    /// cannot spin the loop).
    fn earliest_timer(&self, now: Instant) -> Instant {
        // Expiry and retention fire strictly after their period.
        let after = |at: Instant, period: Duration| at + period + Duration::from_millis(1);
        let workers = self.workers.values().map(|worker| match worker.lost_at {
            Some(lost) => after(lost, self.config.lost_retention),
            None => after(worker.last_seen, self.config.heartbeat_expiry),
        });
        let refusals = self
            .refused
            .values()
            .map(|&at| at + self.config.heartbeat_interval);
        let deadlines = self
            .queue
            .iter()
            .filter_map(|(_, rid)| self.requests.get(rid).and_then(|r| r.deadline));
        workers
            .chain(refusals)
            .chain(deadlines)
            .chain(self.control.next_timer(&self.config, now))
            .chain(self.next_unload())
            .fold(self.next_heartbeat, Instant::min)
            .max(now + Duration::from_millis(1))
    }

    /// Makes the next `tick` come no later than `at`.
    fn wake_by(&mut self, at: Instant) {
        self.next_wake = self.next_wake.min(at);
    }

    /// Ends every request with a retryable `unavailable`, for shutdown.
    pub fn shutdown(&mut self, now: Instant) {
        let rids: Vec<u64> = self.requests.keys().copied().collect();
        for rid in rids {
            self.fail(
                now,
                rid,
                ErrorCode::Unavailable,
                "the router is shutting down; retry shortly",
            );
        }
    }

    /// Tells the core a send failed, so it can react: a vanished client's
    /// requests are cancelled, an unreachable or stuck worker is lost.
    pub fn handle_send_failure(&mut self, now: Instant, to: &Peer, failure: SendFailure) {
        match (to, failure) {
            (Peer::Worker(addr), _) => {
                if self
                    .workers
                    .get(&addr.identity)
                    .is_some_and(Worker::is_live)
                {
                    let reason = match failure {
                        SendFailure::Unreachable => "its connection is gone",
                        SendFailure::Full => "its send queue is full",
                    };
                    self.lose_worker(now, &addr.identity, reason);
                }
            }
            (Peer::Client(addr), SendFailure::Unreachable) => self.client_gone(now, addr),
            (Peer::Client(_), SendFailure::Full) | (Peer::Admin(_), _) => {}
        }
    }

    fn send<T: Serialize>(&mut self, to: Peer, message: &T) {
        match encode(message) {
            Ok(frame) => self.actions.push_back(Action::Send { to, frame }),
            Err(err) => tracing::error!(%err, "cannot encode a reply; dropped"),
        }
    }

    fn reply_error(&mut self, client: &Addr, id: Option<String>, code: ErrorCode, message: String) {
        self.metrics
            .requests
            .with_label_values(&[code.as_str()])
            .inc();
        let reply = ClientReply::Error {
            id,
            code,
            message,
            retryable: code.retryable(),
        };
        self.send(Peer::Client(client.clone()), &reply);
    }

    /// Removes a request from every table; its caller owes the client the
    /// terminal reply.
    fn take(&mut self, now: Instant, rid: u64) -> Option<Request> {
        let request = self.requests.remove(&rid)?;
        self.quota_ended(&request.quota_key);
        self.by_client
            .remove(&(request.client.identity.clone(), request.id.clone()));
        if self.queue.remove(&request.queue_key(rid)) {
            self.metrics.queue_depth.set(self.queue.len() as i64);
        }
        if let Some(identity) = request.stage.worker()
            && let Some(worker) = self.workers.get_mut(identity)
            && worker.inflight.remove(&rid)
        {
            self.metrics.inflight.dec();
        }
        self.metrics
            .e2e
            .observe(now.saturating_duration_since(request.arrived).as_secs_f64());
        if let Some(model) = &request.request.model {
            self.model_used(now, model, request.request.keep_alive);
        }
        Some(request)
    }

    /// Ends a request with an error reply.
    fn fail(&mut self, now: Instant, rid: u64, code: ErrorCode, message: &str) {
        if let Some(request) = self.take(now, rid) {
            request
                .span
                .in_scope(|| tracing::debug!(%code, message, "request failed"));
            self.reply_error(&request.client, Some(request.id), code, message.to_string());
        }
    }

    fn refresh_gauges(&self) {
        for state in WorkerState::ALL {
            let count = self.workers.values().filter(|w| w.state == state).count();
            self.metrics
                .workers
                .with_label_values(&[state.as_str()])
                .set(count as i64);
        }
        self.metrics.queue_depth.set(self.queue.len() as i64);
        let listed = self.served_models();
        for state in [
            zinfer_protocol::ModelState::Loaded,
            zinfer_protocol::ModelState::Loading,
            zinfer_protocol::ModelState::Unloaded,
        ] {
            let count = listed.iter().filter(|m| m.state == Some(state)).count();
            self.metrics
                .models
                .with_label_values(&[state.as_str()])
                .set(count as i64);
        }
    }
}

fn remaining_ms(deadline: Instant, now: Instant) -> u64 {
    let left = deadline.saturating_duration_since(now);
    u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
}

fn seconds(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
