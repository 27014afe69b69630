//! The worker's socket loop: talks to the router over a DEALER.
//!
//! Three threads meet here. The engine thread computes; a relay thread
//! turns engine events into protocol frames (and observes latency metrics)
//! and hands them over an inproc socket; the I/O thread owns the DEALER and
//! polls it together with that inproc socket, so it wakes at once for
//! either side and never spins.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use zinfer_protocol::{
    ControlOp, ErrorCode, Limits, LoadReport, PROTOCOL_VERSION, RouterToWorker, WorkerToRouter,
};

use crate::engine::{CacheBlock, EngineError, EngineEvent, EngineHandle};
use crate::metrics::WorkerMetrics;
use crate::migration::{self, ExportOutcome};

/// Why the socket loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A socket could not be created, configured or connected.
    #[error("worker socket error while {context}: {source}")]
    Socket {
        /// What was being done.
        context: &'static str,
        /// What libzmq said.
        source: zmq::Error,
    },
    /// The relay thread could not be started.
    #[error("cannot start the relay thread: {0}")]
    Thread(#[from] std::io::Error),
    /// CURVE could not be set up on the DEALER.
    #[error("CURVE to the router: {0}")]
    Curve(#[from] zinfer_curve::CurveError),
    /// The cache-import socket could not be set up.
    #[error(transparent)]
    Transfer(#[from] migration::TransferError),
}

/// Settings of the socket loop.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The router's worker endpoint, e.g. `tcp://127.0.0.1:5556`.
    pub router: String,
    /// Worker id, unique among the router's live workers.
    pub worker_id: String,
    /// The DEALER's routing id: the worker id and a random suffix, fixed
    /// for this process. Distinct per process, so the router can tell a
    /// second worker given the same id from a reconnect of this one.
    pub routing_id: Vec<u8>,
    /// Device the engine runs on, reported in `ready`.
    pub device: String,
    /// Model names served, reported in `ready`.
    pub models: Vec<String>,
    /// KV pool capacity in tokens, reported in `ready`.
    pub kv_capacity: u64,
    /// Most sequences per decode step, reported in `ready`.
    pub max_batch: u32,
    /// The model's context length, reported in `ready` when known.
    pub context_length: Option<u32>,
    /// The model's vocabulary size, reported in `ready` when known.
    pub vocab_size: Option<u32>,
    /// Where this worker takes a predecessor's cache, reported in `ready`
    /// (a migration target only); set by `run` when `import_host` is.
    pub import_endpoint: Option<String>,
    /// Bind a cache-import socket on this host (a migration target).
    pub import_host: Option<String>,
    /// Heartbeat period; 3 periods of router silence trigger a reconnect.
    pub heartbeat: Duration,
    /// Least time between two `load` reports.
    pub load_interval: Duration,
    /// Time in-flight requests get to finish after a shutdown request.
    pub grace: Duration,
    /// Limits on frames from the router.
    pub limits: Limits,
    /// CURVE to the router (its public key, our key pair); `None`: plain.
    pub curve: Option<zinfer_curve::ClientCurve>,
}

impl ServerConfig {
    /// Defaults for everything but identity and capacity.
    pub fn new(router: impl Into<String>, worker_id: impl Into<String>) -> Self {
        let worker_id = worker_id.into();
        ServerConfig {
            router: router.into(),
            routing_id: routing_id(&worker_id, rand::random()),
            worker_id,
            device: "cpu".into(),
            models: Vec::new(),
            kv_capacity: 0,
            max_batch: 1,
            context_length: None,
            vocab_size: None,
            import_endpoint: None,
            import_host: None,
            heartbeat: Duration::from_secs(1),
            load_interval: Duration::from_millis(100),
            grace: Duration::from_secs(10),
            limits: Limits::default(),
            curve: None,
        }
    }
}

/// `worker_id` + `/` + 8 hex digits of `nonce`, within ZeroMQ's 255-byte
/// limit on routing ids (a long id is cut short; the router keys on the
/// whole routing id and names the worker by `worker_id`).
fn routing_id(worker_id: &str, nonce: u32) -> Vec<u8> {
    let suffix = format!("/{nonce:08x}");
    let keep = worker_id.len().min(255 - suffix.len());
    let mut id = worker_id.as_bytes()[..keep].to_vec();
    id.extend_from_slice(suffix.as_bytes());
    id
}

/// Numbers the inproc relay endpoints, so several servers can share a process (tests).
static RELAY_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Serves the router until `shutdown` fires (or the router sends
/// `shutdown`), then lets in-flight requests finish within the grace period.
pub fn run(
    mut config: ServerConfig,
    engine: EngineHandle,
    metrics: WorkerMetrics,
    shutdown: Receiver<()>,
) -> Result<(), ServerError> {
    let context = zmq::Context::new();
    let relay_endpoint = format!(
        "inproc://zinfer-worker-relay-{}",
        RELAY_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let relay_in = context
        .socket(zmq::PAIR)
        .map_err(sock("creating the relay socket"))?;
    relay_in
        .bind(&relay_endpoint)
        .map_err(sock("binding the relay socket"))?;
    let relay_out = context
        .socket(zmq::PAIR)
        .map_err(sock("creating the relay socket"))?;
    relay_out
        .connect(&relay_endpoint)
        .map_err(sock("connecting the relay socket"))?;
    let import = match &config.import_host {
        Some(host) => {
            let (socket, endpoint) = migration::bind_import(&context, host)?;
            tracing::info!(%endpoint, "taking a predecessor's cache here");
            config.import_endpoint = Some(endpoint);
            Some(socket)
        }
        None => None,
    };
    let events = engine.events().clone();
    let relay_metrics = metrics.clone();
    let relay = std::thread::Builder::new()
        .name("worker-relay".into())
        .spawn(move || relay_events(events, relay_out, relay_metrics))?;

    let mut io = Io {
        dealer: connect(&context, &config)?,
        context,
        config,
        engine,
        metrics,
        last_heard: Instant::now(),
        last_heartbeat: Instant::now(),
        last_load_check: Instant::now(),
        last_load: None,
        registered: false,
        last_register: None,
        draining: false,
        stop_at: None,
        import,
        import_state: ImportState::default(),
        export: None,
        sends_failing: false,
    };
    io.register();
    let result = io.serve(&relay_in, &shutdown);
    // Stopping the engine fails what is still running; those errors still
    // reach the router before the socket closes.
    drop(io.engine);
    let _ = relay.join();
    while let Ok(frame) = relay_in.recv_bytes(zmq::DONTWAIT) {
        let _ = io.dealer.send(frame, zmq::DONTWAIT);
    }
    result
}

fn sock(context: &'static str) -> impl Fn(zmq::Error) -> ServerError {
    move |source| ServerError::Socket { context, source }
}

/// A DEALER with this process's routing id; a reconnect of the same
/// process takes over its old connection at the router (ROUTER_HANDOVER).
fn connect(context: &zmq::Context, config: &ServerConfig) -> Result<zmq::Socket, ServerError> {
    let dealer = context
        .socket(zmq::DEALER)
        .map_err(sock("creating the DEALER"))?;
    dealer
        .set_identity(&config.routing_id)
        .map_err(sock("setting the routing id"))?;
    dealer
        .set_immediate(true)
        .map_err(sock("setting ZMQ_IMMEDIATE"))?;
    dealer
        .set_linger(1000)
        .map_err(sock("setting ZMQ_LINGER"))?;
    dealer
        .set_maxmsgsize(config.limits.max_frame_bytes as i64)
        .map_err(sock("setting ZMQ_MAXMSGSIZE"))?;
    dealer
        .set_sndhwm(100_000)
        .map_err(sock("setting ZMQ_SNDHWM"))?;
    zinfer_curve::apply_client(&dealer, config.curve.as_ref())?;
    dealer
        .connect(&config.router)
        .map_err(sock("connecting to the router"))?;
    Ok(dealer)
}

struct Io {
    context: zmq::Context,
    dealer: zmq::Socket,
    config: ServerConfig,
    engine: EngineHandle,
    metrics: WorkerMetrics,
    last_heard: Instant,
    last_heartbeat: Instant,
    last_load_check: Instant,
    last_load: Option<LoadReport>,
    /// Whether `ready` has been handed to the socket since the last (re)connect.
    registered: bool,
    /// When `ready` was last tried.
    last_register: Option<Instant>,
    draining: bool,
    stop_at: Option<Instant>,
    /// The cache-import socket of a migration target, until the import ended.
    import: Option<zmq::Socket>,
    import_state: ImportState,
    /// The running cache export's outcome, when one runs.
    export: Option<Receiver<ExportOutcome>>,
    /// Sends are failing (no router connection): logged once, not per
    /// message, until one gets through.
    sends_failing: bool,
}

/// Progress of taking a predecessor's cache.
#[derive(Default)]
struct ImportState {
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

impl Io {
    fn serve(&mut self, relay: &zmq::Socket, shutdown: &Receiver<()>) -> Result<(), ServerError> {
        loop {
            if self.stop_at.is_none() && shutdown.try_recv().is_ok() {
                self.begin_stop(self.config.grace);
            }
            if let Some(stop_at) = self.stop_at {
                let stats = self.engine.stats();
                let idle = stats.running == 0 && stats.waiting == 0;
                if idle || Instant::now() >= stop_at {
                    self.flush_relay(relay);
                    return Ok(());
                }
            }
            let timeout = if self.registered {
                self.config.load_interval.min(self.config.heartbeat)
            } else {
                Duration::from_millis(10)
            };
            // The import socket is read only while the engine takes blocks.
            let import = self
                .import
                .as_ref()
                .filter(|_| self.import_state.pending.is_none());
            let (dealer_ready, relay_ready, import_ready) = {
                let mut items = vec![
                    self.dealer.as_poll_item(zmq::POLLIN),
                    relay.as_poll_item(zmq::POLLIN),
                ];
                items.extend(import.map(|socket| socket.as_poll_item(zmq::POLLIN)));
                match zmq::poll(&mut items, timeout.as_millis() as i64) {
                    Ok(_) => (
                        items[0].is_readable(),
                        items[1].is_readable(),
                        items.get(2).is_some_and(zmq::PollItem::is_readable),
                    ),
                    // A signal (Ctrl-C) interrupted the wait; the loop checks for it.
                    Err(zmq::Error::EINTR) => (false, false, false),
                    Err(source) => {
                        return Err(ServerError::Socket {
                            context: "polling sockets",
                            source,
                        });
                    }
                }
            };
            if dealer_ready {
                self.drain_router();
            }
            if relay_ready {
                self.flush_relay(relay);
            }
            if import_ready {
                self.read_import();
            }
            self.timers();
        }
    }

    fn drain_router(&mut self) {
        while let Ok(frame) = self.dealer.recv_bytes(zmq::DONTWAIT) {
            self.last_heard = Instant::now();
            match zinfer_protocol::decode::<RouterToWorker>(&frame, &self.config.limits) {
                Ok(message) => self.handle(message),
                Err(error) => tracing::warn!(%error, "undecodable frame from the router"),
            }
        }
    }

    fn handle(&mut self, message: RouterToWorker) {
        match message {
            RouterToWorker::Generate { rid, request } => {
                let span = tracing::info_span!("request", rid, id = %request.id);
                let _enter = span.enter();
                if self.draining {
                    self.send(&WorkerToRouter::Error {
                        rid,
                        code: ErrorCode::Unavailable,
                        message: "worker is draining and takes no new requests".into(),
                    });
                    return;
                }
                if let Err(error) = self.engine.submit(request, rid) {
                    tracing::warn!(%error, "engine refused the request");
                    self.send(&WorkerToRouter::Error {
                        rid,
                        code: error.code(),
                        message: error.to_string(),
                    });
                }
            }
            RouterToWorker::Cancel { rid } => self.engine.cancel(rid),
            RouterToWorker::Heartbeat {} => {}
            RouterToWorker::Disconnect { reason } => {
                if self.stop_at.is_some() {
                    // Stopping: registering again would only make the
                    // router list a worker about to exit.
                    tracing::debug!(%reason, "router forgot us while stopping");
                    return;
                }
                // Every message sent before our `ready` reached a router
                // that does not know us earns one of these; answering each
                // would register again and again, and the router takes a
                // second `ready` for a restart and loses what it just gave
                // us. Once per heartbeat is enough: if the router still
                // does not know us, our next heartbeat brings another.
                if self
                    .last_register
                    .is_some_and(|at| at.elapsed() < self.config.heartbeat)
                {
                    tracing::debug!(%reason, "router forgot us again; registered just now");
                    return;
                }
                // Also how a refused registration (a duplicate id, another
                // protocol version) is explained, so it must be visible.
                tracing::warn!(%reason, "router asked us to register again");
                // A router that does not know us does not know our
                // requests either (it ended or retried them, or it
                // restarted): nobody waits for their output.
                let orphaned = self.engine.cancel_all();
                if orphaned > 0 {
                    tracing::warn!(orphaned, "cancelled requests the router no longer knows");
                }
                self.register();
            }
            RouterToWorker::Drain {} => {
                self.draining = true;
                self.control_reply(ControlOp::Drain, true, "draining".into());
            }
            RouterToWorker::Resume {} => {
                if self.stop_at.is_none() {
                    self.draining = false;
                }
            }
            RouterToWorker::ExportCache {
                endpoint,
                max_tokens,
            } => {
                if self.export.is_some() {
                    let message = "an export is already running".to_string();
                    self.control_reply(ControlOp::ExportCache, false, message);
                    return;
                }
                let max_tokens = usize::try_from(max_tokens).unwrap_or(usize::MAX);
                match migration::start_export(&self.context, &self.engine, &endpoint, max_tokens) {
                    Ok(outcome) => {
                        tracing::info!(%endpoint, max_tokens, "exporting the prefix cache");
                        self.export = Some(outcome);
                    }
                    Err(error) => {
                        self.control_reply(ControlOp::ExportCache, false, error.to_string());
                    }
                }
            }
            RouterToWorker::Shutdown { grace_ms } => {
                self.control_reply(ControlOp::Shutdown, true, "shutting down".into());
                self.begin_stop(Duration::from_millis(grace_ms));
            }
            RouterToWorker::FlushCache { namespace } => {
                self.engine.flush_cache(namespace);
                self.control_reply(ControlOp::FlushCache, true, "prefix cache flushed".into());
            }
        }
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

    fn begin_stop(&mut self, grace: Duration) {
        tracing::info!(?grace, "stopping: finishing in-flight requests");
        self.draining = true;
        self.stop_at = Some(Instant::now() + grace);
    }

    fn control_reply(&mut self, op: ControlOp, ok: bool, message: String) {
        self.send(&WorkerToRouter::ControlReply { op, ok, message });
    }

    fn flush_relay(&mut self, relay: &zmq::Socket) {
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
                self.control_reply(ControlOp::ExportCache, outcome.ok, outcome.message);
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
        self.send(&WorkerToRouter::CacheImported {
            tokens: stats.cache_imported_tokens,
            skipped_tokens: stats.cache_import_skipped_tokens,
            bytes: state.bytes,
            seconds,
        });
    }

    fn timers(&mut self) {
        self.transfers();
        let now = Instant::now();
        if !self.registered {
            self.register();
        }
        if now.duration_since(self.last_heartbeat) >= self.config.heartbeat {
            self.last_heartbeat = now;
            if now.duration_since(self.last_heard) > self.config.heartbeat * 3 {
                tracing::warn!("router silent for 3 heartbeats; reconnecting");
                self.reconnect();
            } else {
                self.send(&WorkerToRouter::Heartbeat {});
            }
        }
        if now.duration_since(self.last_load_check) >= self.config.load_interval {
            self.last_load_check = now;
            let stats = self.engine.stats();
            let load = LoadReport {
                running: stats.running as u32,
                waiting: stats.waiting as u32,
                kv_used: stats.kv_used as u64,
                kv_free: stats.kv_free as u64,
                cache_hit_tokens: stats.cache_hit_tokens,
                cache_query_tokens: stats.cache_query_tokens,
                // Whole MiB: a report goes out only when the load changes,
                // and RSS moves by pages all the time.
                rss_bytes: crate::procfs::resident_bytes(None).map_or(0, |b| b >> 20 << 20),
            };
            self.metrics.running.set(i64::from(load.running));
            self.metrics.waiting.set(i64::from(load.waiting));
            let kv_total = (load.kv_used + load.kv_free).max(1);
            self.metrics
                .kv_usage
                .set(load.kv_used as f64 / kv_total as f64);
            if load.cache_query_tokens > 0 {
                self.metrics
                    .prefix_hit_ratio
                    .set(load.cache_hit_tokens as f64 / load.cache_query_tokens as f64);
            }
            let preempted = stats.preemptions;
            let seen = self.metrics.preemptions.get();
            if preempted > seen {
                self.metrics.preemptions.inc_by(preempted - seen);
            }
            if self.last_load != Some(load) {
                self.last_load = Some(load);
                self.send(&WorkerToRouter::Load(load));
            }
        }
    }

    fn reconnect(&mut self) {
        match connect(&self.context, &self.config) {
            Ok(dealer) => {
                self.dealer = dealer;
                self.last_heard = Instant::now();
                self.register();
            }
            Err(error) => tracing::error!(%error, "reconnecting to the router failed"),
        }
    }

    fn register(&mut self) {
        let ready = WorkerToRouter::Ready {
            worker_id: self.config.worker_id.clone(),
            protocol: PROTOCOL_VERSION,
            models: self.config.models.clone(),
            device: self.config.device.clone(),
            kv_capacity: self.config.kv_capacity,
            max_batch: self.config.max_batch,
            context_length: self.config.context_length,
            vocab_size: self.config.vocab_size,
            import_endpoint: self.config.import_endpoint.clone(),
        };
        self.last_load = None;
        self.last_register = Some(Instant::now());
        // With ZMQ_IMMEDIATE a send fails until the connection is up; the
        // timer tries again rather than counting it as a drop.
        self.registered = match zinfer_protocol::encode(&ready) {
            Ok(frame) => self.dealer.send(frame, zmq::DONTWAIT).is_ok(),
            Err(error) => {
                tracing::error!(%error, "cannot encode ready");
                false
            }
        };
    }

    fn send(&mut self, message: &WorkerToRouter) {
        match zinfer_protocol::encode(message) {
            Ok(frame) => self.send_frame(frame),
            Err(error) => tracing::error!(%error, "cannot encode a message for the router"),
        }
    }

    fn send_frame(&mut self, frame: Vec<u8>) {
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

/// Per-request timing the relay needs for inter-token latency.
struct Stream {
    last_chunk: Instant,
}

/// Turns engine events into frames for the I/O thread, observing latency
/// metrics on the way. Ends when the engine drops its event sender.
fn relay_events(events: Receiver<EngineEvent>, out: zmq::Socket, metrics: WorkerMetrics) {
    let mut streams: HashMap<u64, Stream> = HashMap::new();
    for event in events {
        let message = match event {
            EngineEvent::Chunk {
                rid,
                index,
                text,
                tokens,
                logprobs,
            } => {
                let now = Instant::now();
                if let Some(stream) = streams.get_mut(&rid) {
                    metrics
                        .inter_token
                        .observe(now.duration_since(stream.last_chunk).as_secs_f64());
                    stream.last_chunk = now;
                } else {
                    streams.insert(rid, Stream { last_chunk: now });
                }
                WorkerToRouter::Chunk {
                    rid,
                    index,
                    text,
                    tokens,
                    logprobs,
                }
            }
            EngineEvent::Done {
                rid,
                finish_reason,
                text,
                usage,
                timings,
                logprobs,
            } => {
                streams.remove(&rid);
                let outcome = finish_reason.as_str();
                metrics.requests.with_label_values(&[outcome]).inc();
                metrics.ttft.observe(timings.ttft_s);
                metrics.queue_time.observe(timings.queue_s);
                metrics.e2e.observe(timings.ttft_s + timings.decode_s);
                metrics.prompt_tokens.inc_by(u64::from(usage.prompt_tokens));
                metrics
                    .generation_tokens
                    .inc_by(u64::from(usage.completion_tokens));
                metrics.cached_tokens.inc_by(u64::from(usage.cached_tokens));
                WorkerToRouter::Done {
                    rid,
                    finish_reason,
                    text,
                    usage,
                    timings,
                    logprobs,
                }
            }
            EngineEvent::Error { rid, code, message } => {
                streams.remove(&rid);
                metrics.requests.with_label_values(&[code.as_str()]).inc();
                WorkerToRouter::Error { rid, code, message }
            }
        };
        match zinfer_protocol::encode(&message) {
            Ok(frame) => {
                if out.send(frame, 0).is_err() {
                    return;
                }
            }
            Err(error) => tracing::error!(%error, "cannot encode an engine event"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::routing_id;

    #[test]
    fn routing_ids_differ_per_process_and_fit_zeromq() {
        assert_eq!(routing_id("w-cpu-0", 0xab), b"w-cpu-0/000000ab".to_vec());
        assert_ne!(routing_id("w", 1), routing_id("w", 2));
        let long = "x".repeat(256);
        let id = routing_id(&long, u32::MAX);
        assert_eq!(id.len(), 255);
        assert!(id.ends_with(b"/ffffffff"));
    }
}
