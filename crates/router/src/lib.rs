//! zinfer router: the gateway between clients and workers.
//!
//! Clients send requests to the front ROUTER socket; the router picks a
//! worker (round robin, least load, or cache aware), forwards the request
//! on the back socket, and relays the worker's chunks and terminal reply.
//! Workers register themselves; admins use the control socket.
//!
//! The logic lives in [`Core`], a state machine without I/O; [`Router`]
//! owns the sockets and drives it. [`run`] is what the CLI calls.

mod config;
mod core;
mod index;
mod metrics;
mod server;

pub use crate::config::{ParsePolicyError, Policy, RouterConfig};
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
