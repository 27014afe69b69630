//! zinfer router: the gateway between clients and workers.
//!
//! Clients send requests to the front ROUTER socket; the router picks a
//! worker (round robin, least load, or cache aware), forwards the request
//! on the back socket, and relays the worker's chunks and terminal reply.
//! Workers register themselves; admins use the control socket.
//!
//! The logic lives in [`Core`], a state machine without I/O; [`Router`]
//! owns the sockets and drives it. [`run`] is what the CLI calls.
//!
//! # Rules a client or worker can rely on
//!
//! - Every accepted `generate` ends in exactly one `done` or `error`.
//!   Rejections (`bad_request`, `unknown_model`, `unavailable`,
//!   `overloaded`) are that terminal reply.
//! - No `model`: the model served by the most live workers; ties go to the
//!   first by name. A named model no live worker serves is
//!   `unknown_model` (the message lists the models served); no worker at
//!   all, or only draining ones, is `unavailable`.
//! - A worker takes at most `max_inflight_per_worker` requests (default
//!   twice its `max_batch`); beyond that requests wait in the router queue
//!   (highest `priority` first, then oldest), and when the queue is full
//!   the answer is `overloaded` at once. Optional per-client limits
//!   (requests in flight, generated tokens per second, keyed by the
//!   client's connection, or with CURVE by the tenant of its key) answer
//!   `overloaded` too, counted in
//!   `zinfer_router_client_limited_total{limit}`. `deadline_ms` counts from arrival
//!   at the router: a queued request past it gets `deadline`, and a worker
//!   is sent what is left of it.
//! - Load, for `least_load` and `cache_aware`, is the requests the router
//!   has in flight on a worker plus the `waiting` of its last load report.
//! - A worker silent for `heartbeat_expiry` (3 s) is lost. Its requests
//!   that showed the client nothing yet (no chunk relayed; non-streamed
//!   requests always qualify) are re-sent once to another worker; the
//!   rest end with `worker_lost` (retryable). A `ready` again on a
//!   worker's own connection means it restarted: same treatment.
//! - Worker ids are unique among live workers: a `ready` naming the id of
//!   a live worker on another connection is refused with `disconnect`
//!   (never handed over), and the live one is probed with a heartbeat, so
//!   a crashed worker's successor gets in once the old connection is gone.
//! - `cancel` of a queued request answers `done`/`cancelled` at once; of a
//!   running one, it is forwarded and the worker's `done` is relayed; of an
//!   unknown or finished id, it is ignored (it raced the terminal reply).
//! - Messages from unregistered or lost workers get `disconnect`, so they
//!   register again. A refused `ready` (another protocol version, no
//!   model, a bad id) gets `disconnect` saying why, and further `ready`s
//!   from that worker are ignored for a heartbeat interval, so a worker
//!   that re-registers at once cannot spin the router.
//! - REQ clients work for `ping`, `models` and non-streamed `generate`
//!   (one reply per request); streaming needs a DEALER.
//! - With CURVE ([`CurveConfig`]) every socket checks keys against its
//!   allow-list; a refused peer gets no message at all (ZeroMQ drops it in
//!   the handshake), counted in `zinfer_router_auth_refusals_total`. A
//!   client's requests run in the cache namespace of its key's tenant
//!   (`tenant:HEX`, then `/` and its own `namespace`).

mod auth;
mod config;
mod core;
mod index;
mod metrics;
mod server;

pub use crate::auth::CurveConfig;
pub use crate::config::{
    AutoscaleConfig, DEFAULT_CARRY_TOKENS, ParsePolicyError, Policy, RouterConfig,
};
pub use crate::core::{Action, Addr, Core, Peer, SendFailure};
pub use crate::metrics::{Metrics, MetricsError, MetricsServer};
pub use crate::server::{Endpoints, Router};

/// Why the router could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The linked libzmq is older than 4.3.4.
    #[error(
        "libzmq {found} is too old; zinfer needs 4.3.4 or newer \
         (install libzmq3-dev 4.3.4+ and rebuild)"
    )]
    ZmqTooOld {
        /// The version found, as `major.minor.patch`.
        found: String,
    },
    /// A socket could not be created or configured.
    #[error("setting up the {socket} socket failed: {source}")]
    Socket {
        /// Which socket.
        socket: &'static str,
        /// What libzmq said.
        source: zmq::Error,
    },
    /// A socket could not bind its endpoint.
    #[error("cannot bind the {socket} socket to {endpoint}: {source}; is another router running?")]
    Bind {
        /// Which socket.
        socket: &'static str,
        /// The endpoint asked for.
        endpoint: String,
        /// What libzmq said.
        source: zmq::Error,
    },
    /// The control socket would listen off this host with no
    /// authentication.
    #[error(
        "the control socket {endpoint} is not on loopback and CURVE is off: anyone who \
         reaches it could stop workers; bind it to tcp://127.0.0.1:PORT, or turn CURVE on \
         with --curve-key ROUTER.key and --admin-keys (see `zinfer keys generate`)"
    )]
    ControlExposed {
        /// The endpoint asked for.
        endpoint: String,
    },
    /// CURVE could not be set up on a socket.
    #[error("CURVE on the {socket} socket: {source}")]
    Curve {
        /// Which socket.
        socket: &'static str,
        /// What went wrong.
        source: zinfer_curve::CurveError,
    },
    /// The ZAP handler thread could not start.
    #[error("cannot start the CURVE authentication thread: {0}")]
    Thread(std::io::Error),
    /// Polling the sockets failed.
    #[error("polling sockets failed: {0}")]
    Poll(zmq::Error),
    /// Metrics could not be set up.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
}

/// The oldest libzmq zinfer runs on: earlier versions have ROUTER and
/// MAXMSGSIZE bugs the router depends on being fixed.
pub const MIN_ZMQ_VERSION: (i32, i32, i32) = (4, 3, 4);

/// Checks that the linked libzmq is at least 4.3.4.
pub fn check_zmq_version() -> Result<(), RouterError> {
    let found = zmq::version();
    if found < MIN_ZMQ_VERSION {
        let (major, minor, patch) = found;
        return Err(RouterError::ZmqTooOld {
            found: format!("{major}.{minor}.{patch}"),
        });
    }
    Ok(())
}

/// Binds the router's sockets and serves until `shutdown` fires (a message
/// or all senders dropped). In-flight requests then end with a retryable
/// `unavailable` error; workers are told nothing.
pub fn run(
    config: RouterConfig,
    shutdown: crossbeam_channel::Receiver<()>,
) -> Result<(), RouterError> {
    Router::bind(config)?.serve(shutdown)
}
