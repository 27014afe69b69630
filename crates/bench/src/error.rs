//! Why a benchmark could not run. Each message says what to change; none
//! wraps another error's chain, so printed with `{}` it is complete.

use std::time::Duration;

use zinfer_protocol::ErrorCode;

/// Why `zinfer bench` could not run (a failed request is a result, not
/// an error: it is counted in the report).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The flags do not describe a benchmark that can run.
    #[error("{0}")]
    Flags(String),
    /// The prompt file of `--workload file` is unreadable or malformed.
    #[error("{0}")]
    PromptFile(String),
    /// A ZeroMQ call on the router socket failed.
    #[error("{what}: {error}")]
    Socket {
        /// What the bench was doing.
        what: String,
        /// What libzmq said.
        error: zmq::Error,
    },
    /// The CURVE keys could not be applied to the socket.
    #[error("{0}")]
    Curve(#[from] zinfer_curve::CurveError),
    /// A request could not be encoded (a bug: the bench builds them).
    #[error("encoding a request: {0}")]
    Encode(#[from] zinfer_protocol::EncodeError),
    /// The router answered the ping with an error.
    #[error("the router at {endpoint} refused a ping: {code}: {message}")]
    PingRefused {
        /// The router's client endpoint.
        endpoint: String,
        /// Its error code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// Nothing answered the ping.
    #[error(
        "no answer from a router at {endpoint} within {wait:?}: start one \
         (`zinfer serve`) or point --router at it (a router with CURVE answers nothing \
         without the right --curve-server-key and --curve-key)"
    )]
    NoRouter {
        /// The endpoint pinged.
        endpoint: String,
        /// How long the bench waited.
        wait: Duration,
    },
    /// A thread for a blocking HTTP request could not start.
    #[error("starting an HTTP request thread: {0}")]
    Thread(std::io::Error),
    /// A run against one server failed part-way.
    #[error("benchmarking {url}: {error}")]
    Run {
        /// The server's URL or endpoint.
        url: String,
        /// What went wrong.
        error: Box<BenchError>,
    },
    /// The report could not be written as JSON.
    #[error("writing the report as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl BenchError {
    /// A failed socket call, and what it was for.
    pub(crate) fn socket(what: impl Into<String>) -> impl FnOnce(zmq::Error) -> BenchError {
        let what = what.into();
        move |error| BenchError::Socket { what, error }
    }
}
