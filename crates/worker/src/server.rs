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

use crate::engine::{EngineEvent, EngineHandle};
use crate::metrics::WorkerMetrics;

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
    /// Heartbeat period; 3 periods of router silence trigger a reconnect.
    pub heartbeat: Duration,
    /// Least time between two `load` reports.
    pub load_interval: Duration,
    /// Time in-flight requests get to finish after a shutdown request.
    pub grace: Duration,
    /// Limits on frames from the router.
    pub limits: Limits,
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
            heartbeat: Duration::from_secs(1),
            load_interval: Duration::from_millis(100),
            grace: Duration::from_secs(10),
            limits: Limits::default(),
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
    config: ServerConfig,
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
        draining: false,
        stop_at: None,
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
    draining: bool,
    stop_at: Option<Instant>,
}

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
            let (dealer_ready, relay_ready) = {
                let mut items = [
                    self.dealer.as_poll_item(zmq::POLLIN),
                    relay.as_poll_item(zmq::POLLIN),
                ];
                match zmq::poll(&mut items, timeout.as_millis() as i64) {
                    Ok(_) => (items[0].is_readable(), items[1].is_readable()),
                    // A signal (Ctrl-C) interrupted the wait; the loop checks for it.
                    Err(zmq::Error::EINTR) => (false, false),
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
                // Also how a refused registration (a duplicate id, another
                // protocol version) is explained, so it must be visible.
                tracing::warn!(%reason, "router asked us to register again");
                self.register();
            }
            RouterToWorker::Drain {} => {
                self.draining = true;
                self.control_reply(ControlOp::Drain, true, "draining".into());
            }
            RouterToWorker::Migrate { device } => self.control_reply(
                ControlOp::Migrate,
                false,
                format!(
                    "cannot migrate to {device:?}: live migration is not built yet; start a worker on the target device (zinfer worker --device ...) and drain this one"
                ),
            ),
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

    fn timers(&mut self) {
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
        };
        self.last_load = None;
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
        if let Err(error) = self.dealer.send(frame, zmq::DONTWAIT) {
            self.metrics.dropped_sends.inc();
            tracing::warn!(%error, "dropped a message to the router");
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
                }
            }
            EngineEvent::Done {
                rid,
                finish_reason,
                text,
                usage,
                timings,
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
