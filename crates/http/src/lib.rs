//! zinfer's OpenAI-compatible HTTP front.
//!
//! An axum server that speaks OpenAI's `/v1/completions`,
//! `/v1/chat/completions`, `/v1/responses` and `/v1/models`, and Anthropic's
//! `/v1/messages`, to HTTP clients and the zinfer
//! client protocol (MessagePack over a ZeroMQ DEALER) to the router, like
//! any other client. The crate is split so that the request and response
//! translation is pure and unit-tested, and the sockets sit at the edge:
//!
//! | module | job |
//! |---|---|
//! | [`translate`] | OpenAI request bodies to protocol `generate` requests (pure) |
//! | [`responses`] | OpenAI Responses bodies to chat requests, replies to response objects and events (pure) |
//! | [`anthropic`] | Anthropic Messages bodies to chat requests, replies to Messages bodies and events (pure) |
//! | [`respond`] | protocol replies to OpenAI bodies and SSE events (pure) |
//! | [`error`] | one error enum, OpenAI-shaped bodies and statuses |
//! | [`backend`] | the I/O thread owning the DEALER, requests multiplexed by id |
//! | [`embeddings`] | `/v1/embeddings` bodies to protocol `generate` with `embed`, and the vectors back (pure) |
//! | [`rerank`] | `/v1/rerank` bodies to protocol `generate` with `embed` `rank` per document, and the sorted results back (pure) |
//! | [`text`] | llama-server's `/tokenize`, `/detokenize`, `/apply-template` bodies to and from protocol text requests (pure) |
//! | [`store`] | the bounded in-memory store of `/v1/responses` results |
//! | [`server`] | routes, API key, handlers |

pub mod anthropic;
pub mod backend;
pub mod embeddings;
pub mod error;
pub mod rerank;
pub mod respond;
pub mod responses;
pub mod server;
pub mod store;
pub mod text;
pub mod translate;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use backend::{ConnectError, RouterClient};
pub use error::ApiError;
pub use server::{AppState, app};

/// Settings of the HTTP front.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The router's client endpoint, e.g. `tcp://127.0.0.1:5555`.
    pub router: String,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// When set, `/v1/*` requires `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// A model name that means the router's default model; listed first by
    /// `/v1/models`.
    pub served_model_name: Option<String>,
    /// Longest wait for the router's next reply to a request.
    pub reply_timeout: Duration,
    /// Longest a client may take to send a request's headers; then its
    /// connection is closed, so slow senders (slowloris) hold nothing.
    pub header_timeout: Duration,
    /// CURVE to the router's client socket; `None`: plain.
    pub curve: Option<zinfer_curve::ClientCurve>,
}

/// Why the HTTP front could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The router connection could not be set up.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Listening or serving failed.
    #[error("HTTP server on {addr}: {source}")]
    Io {
        /// The listen address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// A bound, not yet running HTTP front.
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    client: RouterClient,
    state: AppState,
    header_timeout: Duration,
}

impl HttpServer {
    /// Connects to the router and binds the listen address. Call inside a
    /// tokio runtime.
    pub async fn bind(config: HttpConfig) -> Result<HttpServer, HttpError> {
        let client = RouterClient::connect_with(&config.router, config.curve.as_ref())?;
        let listener = listen(config.listen).map_err(|source| HttpError::Io {
            addr: config.listen,
            source,
        })?;
        let state = AppState {
            client: client.clone(),
            alias: config.served_model_name,
            api_key: config.api_key,
            reply_timeout: config.reply_timeout,
            limits: Arc::new(zinfer_protocol::Limits::default()),
            responses: Arc::new(std::sync::Mutex::new(store::ResponseStore::new(
                store::StoreLimits::default(),
            ))),
        };
        Ok(HttpServer {
            listener,
            client,
            state,
            header_timeout: config.header_timeout,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` completes, then lets open responses finish
    /// and stops the router I/O thread.
    ///
    /// Each connection is HTTP/1.1 with Nagle off (every SSE event leaves
    /// at once) and a header read timeout, so a client that trickles its
    /// headers is cut off instead of holding a connection for ever.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HttpError> {
        let app = server::app(self.state);
        let (closing, closed) = tokio::sync::watch::channel(false);
        let mut connections = tokio::task::JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(error) => {
                            // Out of descriptors, say: let some close.
                            tracing::warn!(%error, "accepting a connection failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_connection(
                        stream,
                        app.clone(),
                        self.header_timeout,
                        closed.clone(),
                    ));
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        let _ = closing.send(true);
        while connections.join_next().await.is_some() {}
        self.client.shutdown();
        Ok(())
    }
}

/// Connections the kernel may hold for `accept`: enough for a thousand
/// clients arriving at once (the kernel caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket on `addr` with [`LISTEN_BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves one connection until it closes, or finishes its open response
/// and closes once `closing` turns true.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    app: axum::Router,
    header_timeout: Duration,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout);
    let service = hyper_util::service::TowerToHyperService::new(app);
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended");
            }
        }
        () = async { closing.wait_for(|closing| *closing).await.map_or((), |_| ()) } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
