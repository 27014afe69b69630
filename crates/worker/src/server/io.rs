//! The I/O thread: owns the DEALER (and a migration target's import
//! socket), drives the [`RouterLink`] and carries out its actions.

use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use zinfer_protocol::{LoadReport, WorkerToRouter};

use super::link::{Action, EngineProbe, RouterLink};
use super::{ServerConfig, ServerError, connect};
use crate::engine::{CacheBlock, EngineError, EngineHandle};
use crate::metrics::WorkerMetrics;
use crate::migration::{self, ExportOutcome};
use crate::text::{TextJob, TextThread};

pub(super) struct Io {
    pub(super) context: zmq::Context,
    pub(super) dealer: zmq::Socket,
    pub(super) config: ServerConfig,
    pub(super) engine: EngineHandle,
    pub(super) metrics: WorkerMetrics,
    pub(super) link: RouterLink,
    /// The cache-import socket of a migration target, until the import ended.
    pub(super) import: Option<zmq::Socket>,
    pub(super) import_state: ImportState,
    /// The running cache export's outcome, when one runs.
    pub(super) export: Option<Receiver<ExportOutcome>>,
    /// Sends are failing (no router connection): logged once, not per
    /// message, until one gets through.
    pub(super) sends_failing: bool,
    /// Answers text requests beside the engine.
    pub(super) text: TextThread,
}

/// Progress of taking a predecessor's cache.
#[derive(Default)]
pub(super) struct ImportState {
    started: Option<Instant>,
    bytes: u64,
    /// Spans handed to the engine.
    handed: u64,
    /// Span tokens not even handed over (undecodable, another shape).
    refused: u64,
    /// A block the engine's full queue refused, to hand over again.
    pending: Option<CacheBlock>,
    /// When `cache_end` arrived.
    ended: Option<Instant>,
}

/// How long a finished import may wait for the engine to take its blocks.
const IMPORT_SETTLE: Duration = Duration::from_secs(30);

/// The engine as the link sees it; a load check also refreshes the gauges
/// from the same stats snapshot.
struct Probe<'a> {
    engine: &'a EngineHandle,
    metrics: &'a WorkerMetrics,
}

impl EngineProbe for Probe<'_> {
    fn idle(&self) -> bool {
        let stats = self.engine.stats();
        stats.running == 0 && stats.waiting == 0
    }

    fn load(&self) -> LoadReport {
        let stats = self.engine.stats();
        let load = LoadReport {
            running: stats.running as u32,
            waiting: stats.waiting as u32,
            kv_used: stats.kv_used as u64,
            kv_free: stats.kv_free as u64,
            cache_hit_tokens: stats.cache_hit_tokens,
            cache_query_tokens: stats.cache_query_tokens,
            // Whole MiB: a report goes out only when the load changes, and
            // RSS moves by pages all the time.
            rss_bytes: zinfer_probe::procfs::resident_bytes(None).map_or(0, |b| b >> 20 << 20),
        };
        self.metrics.observe_engine(&stats);
        load
    }
}

impl Io {
    pub(super) fn serve(
        &mut self,
        relay: &zmq::Socket,
        text_replies: &zmq::Socket,
        shutdown: &Receiver<()>,
    ) -> Result<(), ServerError> {
        loop {
            let now = Instant::now();
            if shutdown.try_recv().is_ok() {
                self.link.handle_shutdown(now);
            }
            self.transfers();
            let probe = Probe {
                engine: &self.engine,
                metrics: &self.metrics,
            };
            self.link.handle_tick(now, &probe);
            if self.run_actions(relay) {
                return Ok(());
            }
            let timeout = self
                .link
                .poll_timeout()
                .saturating_duration_since(Instant::now());
            // Rounded up, so a wait shorter than a millisecond does not spin.
            let timeout_ms = i64::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i64::MAX);
            // The import socket is read only while the engine takes blocks.
            let import = self
                .import
                .as_ref()
                .filter(|_| self.import_state.pending.is_none());
            let (dealer_ready, relay_ready, text_ready, import_ready) = {
                let mut items = vec![
                    self.dealer.as_poll_item(zmq::POLLIN),
                    relay.as_poll_item(zmq::POLLIN),
                    text_replies.as_poll_item(zmq::POLLIN),
                ];
                items.extend(import.map(|socket| socket.as_poll_item(zmq::POLLIN)));
                match zmq::poll(&mut items, timeout_ms) {
                    Ok(_) => (
                        items[0].is_readable(),
                        items[1].is_readable(),
                        items[2].is_readable(),
                        items.get(3).is_some_and(zmq::PollItem::is_readable),
                    ),
                    // A signal (Ctrl-C) interrupted the wait; the loop checks for it.
                    Err(zmq::Error::EINTR) => (false, false, false, false),
                    Err(source) => {
                        return Err(ServerError::Socket {
                            context: "polling sockets",
                            source,
                        });
                    }
                }
            };
            if dealer_ready {
                while let Ok(frame) = self.dealer.recv_bytes(zmq::DONTWAIT) {
                    self.link.handle_frame(Instant::now(), &frame);
                }
            }
            if relay_ready {
                self.flush_relay(relay);
            }
            if text_ready {
                self.flush_relay(text_replies);
            }
            if import_ready {
                self.read_import();
            }
        }
    }

    /// Carries out the link's actions; true once it says to stop.
    fn run_actions(&mut self, relay: &zmq::Socket) -> bool {
        while let Some(action) = self.link.poll_action() {
            match action {
                Action::Send(message) => self.send(&message),
                Action::Register(ready) => {
                    // With ZMQ_IMMEDIATE a send fails until the connection is
                    // up; the link tries again rather than counting a drop.
                    let sent = match zinfer_protocol::encode(&ready) {
                        Ok(frame) => self.dealer.send(frame, zmq::DONTWAIT).is_ok(),
                        Err(error) => {
                            tracing::error!(%error, "cannot encode ready");
                            false
                        }
                    };
                    self.link.handle_register_sent(sent);
                }
                Action::Reconnect => match connect(&self.context, &self.config) {
                    Ok(dealer) => {
                        self.dealer = dealer;
                        self.link.handle_reconnected(Instant::now());
                    }
                    Err(error) => tracing::error!(%error, "reconnecting to the router failed"),
                },
                Action::Submit { rid, request } => {
                    let span = tracing::info_span!("request", rid, id = %request.id);
                    let _enter = span.enter();
                    if let Err(error) = self.engine.submit(*request, rid) {
                        tracing::warn!(%error, "engine refused the request");
                        self.link
                            .handle_refused(rid, error.code(), error.client_message());
                    }
                }
                Action::Text { rid, request } => {
                    if let Err(error) = self.text.submit(TextJob { rid, request }) {
                        self.link.handle_refused(rid, error.code, error.message);
                    }
                }
                Action::Cancel(rid) => self.engine.cancel(rid),
                Action::CancelAll => {
                    let orphaned = self.engine.cancel_all();
                    if orphaned > 0 {
                        tracing::warn!(orphaned, "cancelled requests the router no longer knows");
                    }
                }
                Action::FlushCache(namespace) => self.engine.flush_cache(namespace),
                Action::StartExport {
                    endpoint,
                    max_tokens,
                    key,
                } => {
                    let max_tokens = usize::try_from(max_tokens).unwrap_or(usize::MAX);
                    let curve =
                        migration::ExportCurve::new(self.config.curve.as_ref(), key.as_deref());
                    match curve.and_then(|curve| {
                        migration::start_export(
                            &self.context,
                            &self.engine,
                            &endpoint,
                            max_tokens,
                            curve.as_ref(),
                        )
                    }) {
                        Ok(outcome) => {
                            tracing::info!(%endpoint, max_tokens, "exporting the prefix cache");
                            self.export = Some(outcome);
                        }
                        Err(error) => self.link.handle_export_ended(false, error.to_string()),
                    }
                }
                Action::Stop => {
                    self.flush_relay(relay);
                    return true;
                }
            }
        }
        false
    }

    /// Hands the import socket's blocks to the engine until it is empty
    /// or the engine's queue is full (then the socket waits, and so does
    /// the sender).
    fn read_import(&mut self) {
        let shape = self.engine.kv_shape();
        while self.import_state.pending.is_none() {
            let Some(socket) = &self.import else { return };
            let Ok(frame) = socket.recv_bytes(zmq::DONTWAIT) else {
                return;
            };
            let state = &mut self.import_state;
            state.started.get_or_insert_with(Instant::now);
            state.bytes += frame.len() as u64;
            match migration::from_frame(&frame, shape) {
                Ok(CacheBlock::End { .. }) => state.ended = Some(Instant::now()),
                Ok(block) => {
                    state.handed += 1;
                    self.offer_import(block);
                }
                Err(reason) => {
                    tracing::warn!(%reason, "cache span refused");
                    state.refused += 1;
                }
            }
        }
    }

    /// Queues a block for the engine; a full queue keeps it for the next
    /// timer (the copy is cheap next to moving it over the network).
    fn offer_import(&mut self, block: CacheBlock) {
        match self.engine.import_cache(block.clone()) {
            Ok(()) => {}
            Err(EngineError::Overloaded(_)) => {
                tracing::debug!("engine queue full; import paused");
                self.import_state.pending = Some(block);
            }
            Err(error) => tracing::warn!(%error, "the engine refused a cache span"),
        }
    }

    pub(super) fn flush_relay(&mut self, relay: &zmq::Socket) {
        while let Ok(frame) = relay.recv_bytes(zmq::DONTWAIT) {
            self.send_frame(frame);
        }
    }

    /// Reports a finished export, and a finished import once the engine
    /// has taken every block.
    fn transfers(&mut self) {
        if let Some(block) = self.import_state.pending.take() {
            self.offer_import(block);
        }
        if let Some(outcome) = &self.export {
            let result = match outcome.try_recv() {
                Ok(outcome) => Some(outcome),
                Err(crossbeam_channel::TryRecvError::Empty) => None,
                Err(crossbeam_channel::TryRecvError::Disconnected) => Some(ExportOutcome {
                    ok: false,
                    message: "the exporter thread ended without a result".into(),
                }),
            };
            if let Some(outcome) = result {
                tracing::info!(ok = outcome.ok, message = %outcome.message, "cache export ended");
                self.export = None;
                self.link.handle_export_ended(outcome.ok, outcome.message);
            }
        }
        let Some(ended) = self.import_state.ended else {
            return;
        };
        if self.import_state.pending.is_some() {
            return;
        }
        let stats = self.engine.stats();
        if stats.cache_import_spans < self.import_state.handed && ended.elapsed() < IMPORT_SETTLE {
            return;
        }
        let state = std::mem::take(&mut self.import_state);
        self.import = None;
        let seconds = state
            .started
            .map_or(0.0, |started| ended.duration_since(started).as_secs_f64());
        tracing::info!(
            tokens = stats.cache_imported_tokens,
            skipped = stats.cache_import_skipped_tokens,
            refused_spans = state.refused,
            bytes = state.bytes,
            seconds,
            "took the predecessor's cache"
        );
        self.link.send(WorkerToRouter::CacheImported {
            tokens: stats.cache_imported_tokens,
            skipped_tokens: stats.cache_import_skipped_tokens,
            bytes: state.bytes,
            seconds,
        });
    }

    fn send(&mut self, message: &WorkerToRouter) {
        match zinfer_protocol::encode(message) {
            Ok(frame) => self.send_frame(frame),
            Err(error) => tracing::error!(%error, "cannot encode a message for the router"),
        }
    }

    pub(super) fn send_frame(&mut self, frame: Vec<u8>) {
        match self.dealer.send(frame, zmq::DONTWAIT) {
            Ok(()) => self.sends_failing = false,
            Err(error) => {
                self.metrics.dropped_sends.inc();
                if self.sends_failing {
                    tracing::debug!(%error, "dropped a message to the router");
                } else {
                    self.sends_failing = true;
                    // A router refusing our CURVE key looks exactly like no router.
                    let hint = if self.config.curve.is_some() {
                        " With CURVE, also check that the router's --worker-keys lists this \
                         worker's key and that --curve-server-key is the router's."
                    } else {
                        ""
                    };
                    tracing::warn!(
                        %error,
                        "dropped a message to the router: is it reachable?{hint} Further \
                         drops are logged at debug level until a send succeeds."
                    );
                }
            }
        }
    }
}
