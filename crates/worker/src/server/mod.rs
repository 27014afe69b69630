//! The worker's socket loop: talks to the router over a DEALER.
//!
//! Three threads meet here. The engine thread computes; a relay thread
//! turns engine events into protocol frames (and observes latency metrics)
//! and hands them over an inproc socket; the I/O thread owns the DEALER and
//! polls it together with that inproc socket, so it wakes at once for
//! either side and never spins.
//!
//! What the worker owes the router (registration, heartbeats, reconnects,
//! drain and stop, load reports) is decided in [`link`], without I/O;
//! `io` only moves frames and carries out its actions.

mod io;
pub mod link;
mod relay;

use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use zinfer_protocol::{Limits, PROTOCOL_VERSION, ReadyBody, WorkerToRouter};

use crate::engine::EngineHandle;
use crate::metrics::WorkerMetrics;
use crate::migration;
use crate::text::TextThread;
use io::{ImportState, Io};
use link::{LinkConfig, RouterLink};
use relay::relay_events;

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
    /// The import socket's CURVE public key (Z85), reported in `ready`;
    /// set by `run` when it binds the socket with CURVE.
    pub import_key: Option<String>,
    /// Bind a cache-import socket on this host (a migration target).
    pub import_host: Option<String>,
    /// With CURVE, the only client key the import socket admits: the
    /// worker being replaced (the router names it); `None`: any CURVE
    /// client that knows the import key.
    pub import_from: Option<zinfer_curve::PublicKey>,
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
            import_key: None,
            import_host: None,
            import_from: None,
            heartbeat: Duration::from_secs(1),
            load_interval: Duration::from_millis(100),
            grace: Duration::from_secs(10),
            limits: Limits::default(),
            curve: None,
        }
    }
}

impl ServerConfig {
    /// What the router link needs: the `ready` message and the timers.
    pub fn link_config(&self) -> LinkConfig {
        LinkConfig {
            ready: WorkerToRouter::Ready(ReadyBody {
                worker_id: self.worker_id.clone(),
                protocol: PROTOCOL_VERSION,
                models: self.models.clone(),
                device: self.device.clone(),
                kv_capacity: self.kv_capacity,
                max_batch: self.max_batch,
                context_length: self.context_length,
                vocab_size: self.vocab_size,
                import_endpoint: self.import_endpoint.clone(),
                import_key: self.import_key.clone(),
            }),
            heartbeat: self.heartbeat,
            load_interval: self.load_interval,
            grace: self.grace,
            limits: self.limits.clone(),
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
            // With CURVE, a key pair for this import alone.
            let keys = match &config.curve {
                Some(_) => Some(zinfer_curve::KeyPair::generate()?),
                None => None,
            };
            let (socket, endpoint) =
                migration::bind_import(&context, host, keys.as_ref(), config.import_from)?;
            tracing::info!(%endpoint, curve = keys.is_some(), "taking a predecessor's cache here");
            config.import_endpoint = Some(endpoint);
            config.import_key = keys.map(|keys| keys.public().to_z85());
            Some(socket)
        }
        None => None,
    };
    // Text requests are answered on a thread of their own (see `text`),
    // whose replies come back like the relay's.
    let text_endpoint = format!("{relay_endpoint}-text");
    let text_in = context
        .socket(zmq::PAIR)
        .map_err(sock("creating the text socket"))?;
    text_in
        .bind(&text_endpoint)
        .map_err(sock("binding the text socket"))?;
    let text_out = context
        .socket(zmq::PAIR)
        .map_err(sock("creating the text socket"))?;
    text_out
        .connect(&text_endpoint)
        .map_err(sock("connecting the text socket"))?;
    let text = TextThread::start(
        engine.text_codec(),
        engine.vocab_size(),
        config.limits.clone(),
        text_out,
    )?;
    let events = engine.events().clone();
    let relay_metrics = metrics.clone();
    let relay = std::thread::Builder::new()
        .name("worker-relay".into())
        .spawn(move || relay_events(events, relay_out, relay_metrics))?;

    let link = RouterLink::new(config.link_config(), Instant::now());
    let mut io = Io {
        dealer: connect(&context, &config)?,
        context,
        config,
        engine,
        metrics,
        link,
        import,
        import_state: ImportState::default(),
        export: None,
        sends_failing: false,
        text,
    };
    let result = io.serve(&relay_in, &text_in, &shutdown);
    // Stopping the engine fails what is still running; those errors still
    // reach the router before the socket closes.
    drop(io.engine);
    let _ = relay.join();
    while let Ok(frame) = relay_in.recv_bytes(zmq::DONTWAIT) {
        let _ = io.dealer.send(frame, zmq::DONTWAIT);
    }
    // Answers the text requests still queued, then ends.
    drop(io.text);
    while let Ok(frame) = text_in.recv_bytes(zmq::DONTWAIT) {
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
