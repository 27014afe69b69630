//! The socket loop's side of an engine: validation, tokenization and
//! bounded queueing on the caller's thread.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, SendTimeoutError, Sender, TrySendError};
use zinfer_protocol::GenerateRequest;

use super::{
    CacheBlock, EngineConfig, EngineError, EngineEvent, EngineStats, TextCodec, ValidRequest,
};

/// What the handle knows of the model without asking the engine thread.
pub(super) struct ModelFacts {
    pub(super) name: String,
    pub(super) vocab_size: usize,
    pub(super) kv_capacity: usize,
    /// The model's context length.
    pub(super) max_positions: usize,
    /// Layers and row width of its K/V, for cache transfers.
    pub(super) kv_shape: zinfer_model::KvShape,
}

/// A request on its way to the engine thread.
pub(super) struct Submission {
    pub(super) rid: u64,
    pub(super) request: ValidRequest,
}

/// What the handle asks of the engine thread.
pub(super) enum Command {
    Submit(Box<Submission>),
    Cancel(u64),
    FlushCache(Option<String>),
    ExportCache {
        max_tokens: usize,
        sink: Sender<CacheBlock>,
    },
    ImportCache(CacheBlock),
    Shutdown,
}

/// State both sides read: the stats snapshot, the rids in flight, and the
/// stop flag (seen even while the engine waits on a full event channel).
#[derive(Default)]
pub(super) struct Shared {
    stats: Mutex<EngineStats>,
    inflight: Mutex<HashSet<u64>>,
    stopping: AtomicBool,
    /// Import blocks queued and not yet handled by the engine.
    queued_imports: AtomicUsize,
}

impl Shared {
    /// The latest stats, even if a panicking thread poisoned the lock.
    pub(super) fn stats(&self) -> MutexGuard<'_, EngineStats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the handle asked the engine to stop.
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(super) fn inflight(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place for one import block; false when all are taken.
    fn reserve_import(&self) -> bool {
        self.queued_imports
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_QUEUED_IMPORTS).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back the place of an import block the engine has handled (or
    /// that was never queued).
    pub(super) fn release_import(&self) {
        // Never below zero, even if called once too often.
        let _ = self
            .queued_imports
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// Most import blocks queued for the engine at once. The command queue is
/// bounded by count, sized for small commands; a span of the default model
/// carries up to 11 MiB of K/V, so imports get their own, smaller bound
/// (here about 180 MiB) and a transport that forwards faster than the
/// engine imports is told `Overloaded` instead of filling memory.
const MAX_QUEUED_IMPORTS: usize = 16;

/// How often [`EngineHandle::import_cache_timeout`] looks for a free place.
const IMPORT_POLL: Duration = Duration::from_millis(1);

/// The socket loop's side of an engine. Dropping it stops the engine and
/// fails what is still running.
pub struct EngineHandle {
    pub(super) commands: Sender<Command>,
    pub(super) events: Receiver<EngineEvent>,
    pub(super) shared: Arc<Shared>,
    pub(super) text: Arc<dyn TextCodec>,
    /// Compiles requests' constraints (cached), on the caller's thread.
    pub(super) grammars: Arc<crate::constraint::Grammars>,
    pub(super) info: ModelFacts,
    pub(super) config: EngineConfig,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Checks and tokenizes a request against this engine's limits, model
    /// and clock: the one place a request is validated.
    pub fn validate(&self, request: GenerateRequest) -> Result<ValidRequest, EngineError> {
        if request.embed == Some(zinfer_protocol::Pooling::Rank) && self.config.classifier.is_none()
        {
            return Err(EngineError::BadRequest(
                "the model is not a reranker: its file has no rank pooling \
                 (`{arch}.pooling_type` 4) and classification head"
                    .into(),
            ));
        }
        let arrival = self.config.clock.now();
        ValidRequest::new(
            request,
            arrival,
            &self.config.limits,
            self.text.as_ref(),
            &self.info,
            &self.grammars,
        )
    }

    /// Validates, tokenizes and queues a request. On `Ok` exactly one
    /// terminal event for `rid` follows; on `Err` none does.
    pub fn submit(&self, request: GenerateRequest, rid: u64) -> Result<(), EngineError> {
        self.submit_valid(self.validate(request)?, rid)
    }

    /// Queues a validated request; as [`Self::submit`] otherwise.
    pub fn submit_valid(&self, request: ValidRequest, rid: u64) -> Result<(), EngineError> {
        {
            let mut inflight = self.shared.inflight();
            if inflight.contains(&rid) {
                return Err(EngineError::DuplicateRid(rid));
            }
            if inflight.len() >= self.config.max_requests {
                return Err(EngineError::Overloaded(inflight.len()));
            }
            inflight.insert(rid);
        }
        let submission = Box::new(Submission { rid, request });
        match self.commands.try_send(Command::Submit(submission)) {
            Ok(()) => Ok(()),
            Err(error) => {
                self.shared.inflight().remove(&rid);
                match error {
                    TrySendError::Full(_) => Err(EngineError::Overloaded(self.commands.len())),
                    TrySendError::Disconnected(_) => Err(EngineError::Stopped),
                }
            }
        }
    }

    /// Cancels a request; it ends with `done` (cancelled). Unknown or
    /// finished rids are ignored.
    pub fn cancel(&self, rid: u64) {
        // A full queue delays nothing important: the rid is still in flight
        // and the deadline, if any, still applies.
        if self.commands.try_send(Command::Cancel(rid)).is_err() {
            tracing::warn!(rid, "engine queue full; cancel dropped");
        }
    }

    /// Cancels every request in flight, as [`EngineHandle::cancel`] does
    /// one; returns how many.
    pub fn cancel_all(&self) -> usize {
        let rids: Vec<u64> = self.shared.inflight().iter().copied().collect();
        for &rid in &rids {
            self.cancel(rid);
        }
        rids.len()
    }

    /// Drops cached prefixes: of one namespace, or all of them.
    pub fn flush_cache(&self, namespace: Option<String>) {
        if self
            .commands
            .try_send(Command::FlushCache(namespace))
            .is_err()
        {
            tracing::warn!("engine queue full; flush_cache dropped");
        }
    }

    /// Starts sending the hottest prefix-cache K/V, about `max_tokens`
    /// tokens of it, to `sink` as [`CacheBlock`]s (spans parent before
    /// child, then `End`), for a replacement worker to import.
    ///
    /// The engine selects the spans once, then copies them between
    /// scheduling steps, a bounded amount per step while requests run and
    /// everything at once when idle, so serving continues. A span evicted
    /// since the selection is left out with its descendants. A full `sink`
    /// delays the export, never serving; a dropped receiver ends it.
    /// Returns once the command is queued.
    pub fn export_cache(
        &self,
        max_tokens: usize,
        sink: Sender<CacheBlock>,
    ) -> Result<(), EngineError> {
        self.queue(Command::ExportCache { max_tokens, sink })
    }

    /// Queues one exported block for the prefix cache (`End` is accepted
    /// and ignored). The engine imports it into free slots only, never
    /// evicting or preempting; a block whose prefix is not cached, whose
    /// K/V has another shape, or that does not fit is skipped and counted
    /// in [`EngineStats::cache_import_skipped_tokens`]. Imports do not
    /// count as cache queries or hits.
    ///
    /// A full queue (16 import blocks, or the command queue) answers
    /// [`EngineError::Overloaded`] at once and the block is dropped: the
    /// caller backs off and resends, or uses
    /// [`Self::import_cache_timeout`], which waits for room instead.
    pub fn import_cache(&self, block: CacheBlock) -> Result<(), EngineError> {
        if !self.shared.reserve_import() {
            return Err(EngineError::Overloaded(MAX_QUEUED_IMPORTS));
        }
        let queued = self.queue(Command::ImportCache(block));
        if queued.is_err() {
            self.shared.release_import();
        }
        queued
    }

    /// [`Self::import_cache`], waiting up to `timeout` for room in the
    /// command queue before answering [`EngineError::Overloaded`]; lets a
    /// transport apply backpressure without keeping a copy to resend.
    pub fn import_cache_timeout(
        &self,
        block: CacheBlock,
        timeout: Duration,
    ) -> Result<(), EngineError> {
        let deadline = Instant::now() + timeout;
        while !self.shared.reserve_import() {
            if Instant::now() >= deadline {
                return Err(EngineError::Overloaded(MAX_QUEUED_IMPORTS));
            }
            if self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
                return Err(EngineError::Stopped);
            }
            std::thread::sleep(IMPORT_POLL);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let sent = self
            .commands
            .send_timeout(Command::ImportCache(block), left);
        if sent.is_err() {
            self.shared.release_import();
        }
        match sent {
            Ok(()) => Ok(()),
            Err(SendTimeoutError::Timeout(_)) => Err(EngineError::Overloaded(self.commands.len())),
            Err(SendTimeoutError::Disconnected(_)) => Err(EngineError::Stopped),
        }
    }

    /// Queues a command, answering `Overloaded` on a full queue.
    fn queue(&self, command: Command) -> Result<(), EngineError> {
        match self.commands.try_send(command) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(EngineError::Overloaded(self.commands.len())),
            Err(TrySendError::Disconnected(_)) => Err(EngineError::Stopped),
        }
    }

    /// Events of every request, in order per request.
    pub fn events(&self) -> &Receiver<EngineEvent> {
        &self.events
    }

    /// The latest measures (refreshed after every step; never blocks on a
    /// forward pass).
    pub fn stats(&self) -> EngineStats {
        let mut stats = *self.shared.stats();
        stats.waiting += self.commands.len();
        stats
    }

    /// The model's tokenizer and chat template, for work beside the engine
    /// (`tokenize`, `detokenize`, `apply_template`).
    pub fn text_codec(&self) -> Arc<dyn TextCodec> {
        Arc::clone(&self.text)
    }

    /// Model name, as given at load.
    pub fn model_name(&self) -> &str {
        &self.info.name
    }

    /// KV pool capacity in tokens.
    pub fn kv_capacity(&self) -> usize {
        self.info.kv_capacity
    }

    /// The model's context length in tokens (prompt plus output).
    pub fn context_length(&self) -> usize {
        self.info.max_positions
    }

    /// The model's vocabulary size; token ids are below it.
    pub fn vocab_size(&self) -> usize {
        self.info.vocab_size
    }

    /// The K/V layout of the model, as cache transfers carry it.
    pub fn kv_shape(&self) -> zinfer_model::KvShape {
        self.info.kv_shape
    }

    /// Most sequences decoded together.
    pub fn max_batch(&self) -> usize {
        self.config.scheduler.max_batch
    }

    /// Stops the engine: running requests end with an `unavailable` error.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::Release);
        // Wakes an idle engine; a busy one (full queue) sees the flag.
        let _ = self.commands.try_send(Command::Shutdown);
        if thread.join().is_err() {
            tracing::error!("the engine thread panicked");
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
