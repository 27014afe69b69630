//! The small HTTP server every zinfer process runs next to its sockets:
//! `GET /metrics` (Prometheus text format), and the probes `GET /health`
//! (the process is up) and `GET /ready` (it can take requests; what that
//! means is the process's own answer). Any other path is a 404.
//!
//! The router and the worker define their own metrics; this crate only
//! exposes them, so both answer probes and scrapes the same way and fail
//! to start with the same error.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

/// How often the server thread looks at its stop flag while idle.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Failure to set up a process's metrics or their endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A metric could not be registered (a bug: names clash).
    #[error("registering metric failed: {0}")]
    Register(#[from] prometheus::Error),
    /// The HTTP listener could not bind (or its thread could not start).
    #[error(
        "cannot serve /metrics on {addr}: {reason}; pick a free address with --metrics or turn metrics off"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        reason: String,
    },
}

/// `/ready`'s 503: the process cannot take requests now; the message,
/// which says why, is the response body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

/// What a process exports: its metrics, and whether it is ready.
pub trait Exporter: Send + Sync + 'static {
    /// Every metric in the Prometheus text exposition format.
    fn render(&self) -> String;

    /// The `/ready` answer: `Ok(body)` is a 200, `Err` a 503 (for load
    /// balancers and Kubernetes readiness probes).
    fn ready(&self) -> Result<String, NotReady>;
}

/// One `GET` of `path` from a server at `addr`, as a probe sends it: the
/// whole response, status line and headers included.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// Serves an [`Exporter`] on its own thread until dropped.
pub struct MetricsServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` and answers from `exporter` on a thread named `name`.
    pub fn start<E: Exporter>(
        addr: SocketAddr,
        name: &str,
        exporter: Arc<E>,
    ) -> Result<Self, MetricsError> {
        let bind_error = |reason: String| MetricsError::Bind { addr, reason };
        let server = tiny_http::Server::http(addr).map_err(|err| bind_error(err.to_string()))?;
        let bound = server.server_addr().to_ip().unwrap_or(addr);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || serve(&server, exporter.as_ref(), &flag))
            .map_err(|err| bind_error(err.to_string()))?;
        Ok(MetricsServer {
            stop,
            thread: Some(thread),
            addr: bound,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("metrics thread panicked");
        }
    }
}

fn serve(server: &tiny_http::Server, exporter: &dyn Exporter, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let request = match server.recv_timeout(STOP_POLL) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(err) => {
                tracing::warn!(%err, "metrics listener failed");
                continue;
            }
        };
        let response = respond(request.url(), exporter);
        if let Err(err) = request.respond(response) {
            tracing::debug!(%err, "metrics client went away");
        }
    }
}

fn respond(url: &str, exporter: &dyn Exporter) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    match url {
        "/metrics" => {
            let content_type = tiny_http::Header::from_bytes(
                &b"Content-Type"[..],
                &b"text/plain; version=0.0.4; charset=utf-8"[..],
            );
            let response = tiny_http::Response::from_string(exporter.render());
            match content_type {
                Ok(header) => response.with_header(header),
                Err(()) => response,
            }
        }
        "/health" => tiny_http::Response::from_string("ok\n"),
        "/ready" => match exporter.ready() {
            Ok(body) => tiny_http::Response::from_string(body),
            Err(NotReady(body)) => tiny_http::Response::from_string(body).with_status_code(503),
        },
        _ => tiny_http::Response::from_string("not found; try /metrics, /health or /ready\n")
            .with_status_code(404),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Ready once `ready` is non-zero; renders one counter.
    struct Fake {
        scrapes: AtomicU64,
        ready: AtomicU64,
    }

    impl Exporter for Fake {
        fn render(&self) -> String {
            let n = self.scrapes.fetch_add(1, Ordering::Relaxed) + 1;
            format!("# TYPE fake_scrapes_total counter\nfake_scrapes_total {n}\n")
        }

        fn ready(&self) -> Result<String, NotReady> {
            match self.ready.load(Ordering::Relaxed) {
                0 => Err(NotReady("not ready\n".into())),
                n => Ok(format!("ready: {n}\n")),
            }
        }
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        super::get(addr, path).unwrap()
    }

    fn fake() -> Arc<Fake> {
        Arc::new(Fake {
            scrapes: AtomicU64::new(0),
            ready: AtomicU64::new(0),
        })
    }

    #[test]
    fn serves_metrics_health_and_ready_over_http() {
        let exporter = fake();
        let server = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            "test-metrics",
            Arc::clone(&exporter),
        )
        .unwrap();
        assert_ne!(server.addr().port(), 0, "the bound port is reported");
        let metrics = get(server.addr(), "/metrics");
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("Content-Type: text/plain; version=0.0.4"),
            "{metrics}"
        );
        assert!(metrics.contains("fake_scrapes_total 1"), "{metrics}");
        assert!(get(server.addr(), "/metrics").contains("fake_scrapes_total 2"));
        assert!(get(server.addr(), "/health").starts_with("HTTP/1.1 200"));
        let ready = get(server.addr(), "/ready");
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(ready.ends_with("not ready\n"), "{ready}");
        exporter.ready.store(3, Ordering::Relaxed);
        let ready = get(server.addr(), "/ready");
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
        assert!(ready.ends_with("ready: 3\n"), "{ready}");
        assert!(get(server.addr(), "/nope").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_taken_address_names_itself_in_the_error() {
        let first =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), "test-metrics", fake()).unwrap();
        let err = MetricsServer::start(first.addr(), "test-metrics", fake())
            .err()
            .unwrap();
        assert!(matches!(err, MetricsError::Bind { addr, .. } if addr == first.addr()));
        assert!(err.to_string().contains("--metrics"), "{err}");
    }
}
