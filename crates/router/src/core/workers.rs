//! Frames from workers: registration, liveness, load, and the replies
//! relayed to clients.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use zinfer_protocol::{
    ChunkBody, ClientReply, ControlOp, DoneBody, ErrorCode, LoadReport, PROTOCOL_VERSION,
    ReadyBody, RouterToWorker, TextResult, WorkerInfo, WorkerState, WorkerToRouter, decode,
};

use super::{Addr, Core, Peer, Progress, Stage, seconds};
use crate::index::PrefixIndex;

/// A registered worker as the router sees it.
pub(crate) struct Worker {
    pub(super) addr: Addr,
    pub(super) id: String,
    pub(super) models: Vec<String>,
    pub(super) device: String,
    kv_capacity: u64,
    pub(super) context_length: Option<u32>,
    pub(super) vocab_size: Option<u32>,
    pub(super) state: WorkerState,
    pub(super) last_seen: Instant,
    pub(super) lost_at: Option<Instant>,
    load: LoadReport,
    pub(super) inflight: HashSet<u64>,
    max_inflight: u32,
    pub(super) index: PrefixIndex,
    /// Its CURVE public key (Z85), from its `ready`'s `User-Id`; `None`
    /// without CURVE.
    pub(super) curve_key: Option<String>,
}

impl Worker {
    /// Registered and not lost.
    pub(super) fn is_live(&self) -> bool {
        self.state != WorkerState::Lost
    }

    /// Takes new requests (a migrating worker keeps serving on its old device).
    pub(super) fn routable(&self) -> bool {
        matches!(self.state, WorkerState::Ready | WorkerState::Migrating)
    }

    pub(super) fn has_room(&self) -> bool {
        self.inflight.len() < self.max_inflight as usize
    }

    /// Room past `max_inflight` for a request that outranks work in
    /// flight here: the worker preempts for it (its scheduler puts higher
    /// priorities first), so it should reach the worker rather than wait
    /// in the router behind the work it outranks.
    pub(super) fn has_room_to_preempt(&self) -> bool {
        self.inflight.len() < self.max_inflight as usize + PRIORITY_HEADROOM
    }

    pub(super) fn serves(&self, model: &str) -> bool {
        self.models.iter().any(|name| name == model)
    }

    /// The worker's last load report.
    pub(super) fn load_report(&self) -> LoadReport {
        self.load
    }

    /// Requests in flight here plus those the worker reported waiting.
    pub(super) fn load(&self) -> u64 {
        self.inflight.len() as u64 + u64::from(self.load.waiting)
    }

    fn info(&self, now: Instant) -> WorkerInfo {
        WorkerInfo {
            id: self.id.clone(),
            device: self.device.clone(),
            models: self.models.clone(),
            state: self.state,
            inflight: u32::try_from(self.inflight.len()).unwrap_or(u32::MAX),
            kv_capacity: self.kv_capacity,
            load: self.load,
            last_seen_s: seconds(self.last_seen, now),
        }
    }
}

impl Core {
    /// A frame from a worker on the back socket.
    pub fn handle_worker(&mut self, now: Instant, from: &Addr, frame: &[u8]) {
        self.handle_worker_as(now, from, None, frame);
    }

    /// A frame from a worker whose CURVE handshake named it by `key` (its
    /// public key, Z85): a migration's replacement admits only its
    /// predecessor's key on its import socket.
    pub fn handle_worker_as(&mut self, now: Instant, from: &Addr, key: Option<&str>, frame: &[u8]) {
        let message = match decode::<WorkerToRouter>(frame, &self.config.limits) {
            Ok(message) => message,
            Err(err) => {
                tracing::warn!(%err, "undecodable frame from a worker; ignored");
                return;
            }
        };
        if let WorkerToRouter::Ready(ready) = message {
            self.register(now, from, ready, key.map(str::to_string));
            return;
        }
        let Some(worker) = self
            .workers
            .get_mut(&from.identity)
            .filter(|worker| worker.is_live())
        else {
            let reason = "this router does not know you (expired or restarted); \
                          register again with ready";
            self.send(
                Peer::Worker(from.clone()),
                &RouterToWorker::Disconnect {
                    reason: reason.into(),
                },
            );
            return;
        };
        worker.last_seen = now;
        match message {
            WorkerToRouter::Ready(_) | WorkerToRouter::Heartbeat {} => {}
            WorkerToRouter::Load(report) => {
                worker.load = report;
                self.refresh_load_gauges();
            }
            WorkerToRouter::ControlReply { op, ok, message } => {
                tracing::info!(worker = %worker.id, ?op, ok, message, "control reply");
                if op == ControlOp::ExportCache && !ok {
                    self.export_failed(now, &from.identity, &message);
                }
            }
            WorkerToRouter::CacheImported {
                tokens,
                skipped_tokens,
                bytes,
                seconds,
            } => {
                tracing::info!(worker = %worker.id, tokens, skipped_tokens, bytes, seconds, "cache imported");
                self.cache_imported(now, &from.identity, tokens, seconds);
            }
            WorkerToRouter::Chunk { rid, body } => self.relay_chunk(now, from, rid, body),
            WorkerToRouter::Done { rid, body } => self.relay_done(now, from, rid, body),
            WorkerToRouter::Error { rid, code, message } => {
                if self.texts.contains_key(&rid) {
                    self.text_failed(from, rid, code, message);
                } else {
                    self.relay_error(now, from, rid, code, message);
                }
            }
            WorkerToRouter::Tokenized {
                rid,
                tokens,
                pieces,
            } => self.text_answered(from, rid, TextResult::Tokenized { tokens, pieces }),
            WorkerToRouter::Detokenized { rid, content } => {
                self.text_answered(from, rid, TextResult::Detokenized { content });
            }
            WorkerToRouter::AppliedTemplate { rid, prompt } => {
                self.text_answered(from, rid, TextResult::AppliedTemplate { prompt });
            }
        }
    }

    /// Registers the worker that sent `ready`; `curve_key` is its CURVE
    /// public key, when it connected with CURVE.
    fn register(&mut self, now: Instant, from: &Addr, ready: ReadyBody, curve_key: Option<String>) {
        if self.refused.contains_key(&from.identity) {
            return;
        }
        if let Some((reason, label)) = self.registration_problem(from, &ready) {
            tracing::warn!(worker = %ready.worker_id, reason, "registration refused");
            self.metrics.refused.with_label_values(&[label]).inc();
            self.refused.insert(from.identity.clone(), now);
            self.wake_by(now + self.config.heartbeat_interval);
            self.send(
                Peer::Worker(from.clone()),
                &RouterToWorker::Disconnect { reason },
            );
            return;
        }
        if let Some(worker) = self.workers.get_mut(&from.identity)
            && worker.is_live()
        {
            // The same live connection says `ready` again with the same
            // id, models and device: a resent `ready`, not a restart (a
            // restarted process connects with a new routing id). Its
            // requests stand; only its capacity is taken again.
            if worker.id == ready.worker_id
                && worker.models == ready.models
                && worker.device == ready.device
            {
                tracing::debug!(worker = %worker.id, "repeated ready from a live connection; kept");
                worker.last_seen = now;
                worker.kv_capacity = ready.kv_capacity;
                worker.context_length = ready.context_length;
                worker.vocab_size = ready.vocab_size;
                self.refresh_gauges();
                return;
            }
            self.mark_lost(now, &from.identity, "it registered again as another worker");
        }
        // A lost worker of the same id (a previous process of a restarted
        // worker) is superseded: one row per id in listings and admin commands.
        let superseded: Vec<Vec<u8>> = self
            .workers
            .iter()
            .filter(|(identity, w)| **identity != from.identity && w.id == ready.worker_id)
            .map(|(identity, _)| identity.clone())
            .collect();
        for identity in &superseded {
            self.workers.remove(identity);
        }
        self.order
            .retain(|identity| *identity != from.identity && !superseded.contains(identity));
        let max_inflight = self
            .config
            .max_inflight_per_worker
            .unwrap_or_else(|| ready.max_batch.saturating_mul(2))
            .max(1);
        tracing::info!(
            worker = %ready.worker_id, models = ?ready.models, device = %ready.device,
            max_inflight, "worker registered"
        );
        // A migration target takes its predecessor's cache before routing
        // switches to it.
        let state = if self.control.is_migration_target(&ready.worker_id) {
            WorkerState::Warming
        } else {
            WorkerState::Ready
        };
        let worker = Worker {
            addr: from.clone(),
            id: ready.worker_id,
            models: ready.models,
            device: ready.device,
            kv_capacity: ready.kv_capacity,
            context_length: ready.context_length,
            vocab_size: ready.vocab_size,
            state,
            last_seen: now,
            lost_at: None,
            load: LoadReport::default(),
            inflight: HashSet::new(),
            max_inflight,
            index: PrefixIndex::new(self.config.index_bytes_per_worker),
            curve_key,
        };
        self.workers.insert(from.identity.clone(), worker);
        self.order.push(from.identity.clone());
        self.wake_by(now + self.config.heartbeat_expiry + Duration::from_millis(1));
        self.refresh_gauges();
        self.on_registered(now, &from.identity, ready.import_endpoint, ready.import_key);
        self.drain_queue(now);
        self.fail_orphans(now);
    }

    /// Why a `ready` is refused, with the metrics label, or `None`.
    ///
    /// Worker ids are unique among live workers. A `ready` naming the id of
    /// a live worker on another connection is refused, not handed over: it
    /// is either a second worker given the same `--id` (which would
    /// otherwise steal the first one's requests) or a restarted worker
    /// whose old connection the router has not seen close yet. The live
    /// worker is sent a heartbeat at once: if its connection is gone the
    /// send fails, it is lost, and the restarted worker's next `ready`
    /// (after the refusal pause) succeeds.
    fn registration_problem(
        &mut self,
        from: &Addr,
        ready: &ReadyBody,
    ) -> Option<(String, &'static str)> {
        if ready.protocol != PROTOCOL_VERSION {
            return Some((
                format!(
                    "protocol version {} is not supported; this router speaks version \
                     {PROTOCOL_VERSION}: run matching zinfer versions",
                    ready.protocol
                ),
                "protocol",
            ));
        }
        if ready.worker_id.is_empty() || ready.worker_id.len() > self.config.limits.max_name_bytes {
            return Some((
                "worker_id must be 1 to max_name_bytes bytes long".into(),
                "worker_id",
            ));
        }
        if ready.models.is_empty() {
            return Some(("a worker must serve at least one model".into(), "no_model"));
        }
        let holder = self
            .workers
            .values()
            .find(|w| w.is_live() && w.id == ready.worker_id && w.addr.identity != from.identity)
            .map(|w| w.addr.clone())?;
        self.send(Peer::Worker(holder), &RouterToWorker::Heartbeat {});
        Some((
            format!(
                "worker id {:?} is already registered by another live connection; give \
                 every worker a unique --id (or leave it out for a generated one). A \
                 restarted worker is accepted once its old connection is gone",
                ready.worker_id
            ),
            "duplicate_id",
        ))
    }

    /// Loses a worker (see `mark_lost`) and settles the queue.
    pub(super) fn lose_worker(&mut self, now: Instant, identity: &[u8], reason: &str) {
        self.mark_lost(now, identity, reason);
        self.drain_queue(now);
        self.fail_orphans(now);
    }

    /// Marks a worker lost. Its requests that showed the client nothing
    /// are re-sent once elsewhere; the others end with `worker_lost`.
    fn mark_lost(&mut self, now: Instant, identity: &[u8], reason: &str) {
        self.fail_texts_on(identity, reason);
        let Some(worker) = self.workers.get_mut(identity) else {
            return;
        };
        if worker.state == WorkerState::Stopping {
            // It was drained and told to exit: gone as asked, not lost.
            self.forget_worker(identity);
            self.refresh_gauges();
            return;
        }
        tracing::warn!(worker = %worker.id, reason, "worker lost");
        worker.state = WorkerState::Lost;
        worker.lost_at = Some(now);
        let rids: Vec<u64> = worker.inflight.drain().collect();
        self.wake_by(now + self.config.lost_retention + Duration::from_millis(1));
        self.metrics.inflight.sub(rids.len() as i64);
        for rid in rids {
            let Some(request) = self.requests.get_mut(&rid) else {
                continue;
            };
            let Stage::Running {
                retried, progress, ..
            } = request.stage
            else {
                continue;
            };
            match (progress, retried) {
                (Progress::Cancelling, _) => self.finish_cancelled(now, rid),
                (Progress::Streamed, _) | (Progress::Silent, true) => {
                    let message = format!(
                        "the worker running this request was lost ({reason}) after output \
                         was sent; retry the request"
                    );
                    self.fail(now, rid, ErrorCode::WorkerLost, &message);
                }
                (Progress::Silent, false) => {
                    request.stage = Stage::Requeued;
                    self.metrics.retries.inc();
                    if !self.try_dispatch(now, rid) {
                        self.enqueue(rid);
                    }
                }
            }
        }
        self.refresh_gauges();
        self.refresh_load_gauges();
    }

    /// Fails queued requests whose model no worker takes any more.
    pub(super) fn fail_orphans(&mut self, now: Instant) {
        let orphans: Vec<(u64, bool)> = self
            .queue
            .iter()
            .filter_map(|&(_, rid)| self.requests.get(&rid).map(|r| (rid, r)))
            .filter(|(_, r)| !self.any_routable(r.request.model.as_deref().unwrap_or("")))
            .map(|(rid, r)| (rid, r.stage.retried()))
            .collect();
        for (rid, retried) in orphans {
            if retried {
                self.fail(
                    now,
                    rid,
                    ErrorCode::WorkerLost,
                    "the worker running the request was lost and no other worker serves \
                     its model; retry later",
                );
            } else {
                self.fail(
                    now,
                    rid,
                    ErrorCode::Unavailable,
                    "no worker takes requests for this model any more; retry later",
                );
            }
        }
    }

    pub(super) fn heartbeat_workers(&mut self) {
        let live: Vec<Addr> = self
            .workers
            .values()
            .filter(|worker| worker.is_live())
            .map(|worker| worker.addr.clone())
            .collect();
        for addr in live {
            self.send(Peer::Worker(addr), &RouterToWorker::Heartbeat {});
        }
    }

    /// Loses workers silent for longer than the expiry; forgets lost ones
    /// after the retention period.
    pub(super) fn expire_workers(&mut self, now: Instant) {
        let expiry = self.config.heartbeat_expiry;
        let silent: Vec<Vec<u8>> = self
            .workers
            .iter()
            .filter(|(_, w)| w.is_live() && now.saturating_duration_since(w.last_seen) > expiry)
            .map(|(identity, _)| identity.clone())
            .collect();
        for identity in silent {
            self.lose_worker(now, &identity, "missed heartbeats");
        }
        let retention = self.config.lost_retention;
        let forgotten: Vec<Vec<u8>> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                w.lost_at
                    .is_some_and(|at| now.saturating_duration_since(at) > retention)
            })
            .map(|(identity, _)| identity.clone())
            .collect();
        for identity in forgotten {
            self.workers.remove(&identity);
            self.order.retain(|known| *known != identity);
        }
    }

    /// Every known worker, in registration order.
    pub(super) fn worker_infos(&self, now: Instant) -> Vec<WorkerInfo> {
        self.order
            .iter()
            .filter_map(|identity| self.workers.get(identity))
            .map(|worker| worker.info(now))
            .collect()
    }

    fn refresh_load_gauges(&self) {
        let (running, waiting) = self
            .workers
            .values()
            .filter(|worker| worker.is_live())
            .fold((0i64, 0i64), |(r, w), worker| {
                (
                    r + i64::from(worker.load.running),
                    w + i64::from(worker.load.waiting),
                )
            });
        self.metrics.running.set(running);
        self.metrics.waiting.set(waiting);
    }

    fn relay_chunk(&mut self, now: Instant, from: &Addr, rid: u64, body: ChunkBody) {
        let tokens = body.tokens.len();
        let Some(request) = self.requests.get_mut(&rid) else {
            tracing::debug!(rid, "chunk for an ended request; dropped");
            return;
        };
        if request.stage.worker() != Some(from.identity.as_slice()) {
            tracing::debug!(rid, "chunk from a worker not running the request; dropped");
            return;
        }
        match request.last_chunk {
            None => self.metrics.ttft.observe(seconds(request.arrived, now)),
            Some(previous) => {
                let per_token = seconds(previous, now) / tokens.max(1) as f64;
                for _ in 0..tokens.max(1) {
                    self.metrics.inter_token.observe(per_token);
                }
            }
        }
        request.last_chunk = Some(now);
        let stream = request.request.stream;
        // Only a token-rate limit needs the client here; no clone otherwise.
        if self.config.max_tokens_per_second_per_client.is_some() {
            let client = request.quota_key.clone();
            self.quota_charge(now, &client, tokens);
        }
        if !stream {
            return;
        }
        let Some(request) = self.requests.get_mut(&rid) else {
            return;
        };
        if let Stage::Running { progress, .. } = &mut request.stage
            && *progress == Progress::Silent
        {
            *progress = Progress::Streamed;
        }
        let reply = ClientReply::Chunk {
            id: request.id.clone(),
            body,
        };
        let to = Peer::Client(request.client.clone());
        self.metrics.relayed_chunks.inc();
        self.send(to, &reply);
    }

    fn relay_done(&mut self, now: Instant, from: &Addr, rid: u64, mut body: DoneBody) {
        if !self.runs_on(rid, from) {
            tracing::debug!(rid, "done for a request not running there; dropped");
            return;
        }
        let worker_id = self
            .workers
            .get(&from.identity)
            .map(|worker| worker.id.clone())
            .unwrap_or_default();
        let usage = body.usage;
        self.metrics
            .generated_tokens
            .inc_by(u64::from(usage.completion_tokens));
        // A choice of several ended: pass its `done` on; the request goes
        // on until its last choice's. Output has now reached the client,
        // so losing the worker can no longer mean a silent retry.
        if let Some(request) = self.requests.get_mut(&rid)
            && request.choices_left > 1
        {
            request.choices_left -= 1;
            if let Stage::Running { progress, .. } = &mut request.stage {
                *progress = Progress::Streamed;
            }
            body.worker = Some(worker_id);
            let reply = ClientReply::Done {
                id: request.id.clone(),
                body,
            };
            let to = Peer::Client(request.client.clone());
            self.send(to, &reply);
            return;
        }
        let Some(request) = self.take(now, rid) else {
            return;
        };
        let finish_reason = body.finish_reason;
        request
            .span
            .in_scope(|| tracing::debug!(?finish_reason, worker = %worker_id, "done"));
        self.metrics
            .requests
            .with_label_values(&[finish_reason.as_str()])
            .inc();
        self.metrics
            .prompt_tokens
            .inc_by(u64::from(usage.prompt_tokens));
        self.metrics
            .cached_tokens
            .inc_by(u64::from(usage.cached_tokens));
        // An `embed` gets its vector as `embedding`; ended before its
        // input was computed (cancelled, deadline) it gets the `done`.
        let reply = match body.embedding.take() {
            Some(embedding) if request.embedding => ClientReply::Embedding {
                id: request.id,
                embedding,
                usage,
                worker: worker_id,
            },
            embedding => {
                body.embedding = embedding;
                body.worker = Some(worker_id);
                ClientReply::Done {
                    id: request.id,
                    body,
                }
            }
        };
        self.send(Peer::Client(request.client), &reply);
        self.settle_drains(now);
        self.drain_queue(now);
    }

    fn relay_error(
        &mut self,
        now: Instant,
        from: &Addr,
        rid: u64,
        code: ErrorCode,
        message: String,
    ) {
        if !self.runs_on(rid, from) {
            tracing::debug!(rid, "error for a request not running there; dropped");
            return;
        }
        if let Some(request) = self.take(now, rid) {
            self.reply_error(&request.client, Some(request.id), code, message);
        }
        self.settle_drains(now);
        self.drain_queue(now);
    }

    fn runs_on(&self, rid: u64, from: &Addr) -> bool {
        self.requests
            .get(&rid)
            .is_some_and(|request| request.stage.worker() == Some(from.identity.as_slice()))
    }
}

/// How many requests past its `max_inflight` a worker takes when each
/// outranks something in flight there.
const PRIORITY_HEADROOM: usize = 8;
