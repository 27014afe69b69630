//! `zinfer http`: the OpenAI-compatible HTTP front, connected to a router
//! as a client. `zinfer serve --http ADDR` runs the same front in-process.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use zinfer_http::{HttpConfig, HttpServer};

/// How long open responses get to finish once a stop is asked for.
const GRACE: Duration = Duration::from_secs(10);

/// Flags of `zinfer http`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HttpArgs {
    /// Router client endpoint to connect to.
    #[arg(long, default_value = "tcp://127.0.0.1:5555", env = "ZINFER_ROUTER")]
    router: String,
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:8000", env = "ZINFER_HTTP_LISTEN")]
    listen: SocketAddr,
    #[command(flatten)]
    curve: crate::zmq_util::CurveArgs,
    #[command(flatten)]
    options: HttpOptions,
}

/// Flags the HTTP front shares between `zinfer http` and `zinfer serve`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HttpOptions {
    /// Require `Authorization: Bearer KEY` on /v1/* (/health and /ready stay
    /// open for probes).
    #[arg(long, env = "ZINFER_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// A model name that stands for the router's default model; /v1/models
    /// lists it first.
    #[arg(long, env = "ZINFER_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Seconds the HTTP front waits for the router's next reply to a
    /// request before answering 504.
    #[arg(long, default_value_t = 600, env = "ZINFER_HTTP_TIMEOUT")]
    http_timeout: u64,
    /// Seconds a client may take to send a request's headers (and an idle
    /// keep-alive connection may wait for its next request) before its
    /// connection is closed: slow senders hold no connection for long.
    #[arg(long, default_value_t = 15, env = "ZINFER_HEADER_TIMEOUT")]
    header_timeout: u64,
}

impl HttpOptions {
    /// The library configuration for a front on `listen` talking to `router`.
    pub(crate) fn config(&self, router: &str, listen: SocketAddr) -> HttpConfig {
        HttpConfig {
            router: router.to_string(),
            listen,
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
            served_model_name: self.served_model_name.clone().filter(|n| !n.is_empty()),
            reply_timeout: Duration::from_secs(self.http_timeout.max(1)),
            header_timeout: Duration::from_secs(self.header_timeout.max(1)),
            curve: None,
        }
    }
}

/// A front running on its own thread; [`Front::stop`] ends it.
pub(crate) struct Front {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl Front {
    /// Binds and starts serving; returns once the address is bound.
    pub(crate) fn start(config: HttpConfig) -> anyhow::Result<(Front, SocketAddr)> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name("http".into()).spawn(
            move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("http-worker")
                    .enable_all()
                    .build()
                    .context("starting the HTTP runtime")?;
                runtime.block_on(async move {
                    let server = match HttpServer::bind(config).await {
                        Ok(server) => server,
                        Err(error) => {
                            let message = error.to_string();
                            let _ = bound_tx.send(Err(error));
                            bail!(message);
                        }
                    };
                    let addr = server.local_addr();
                    let _ = bound_tx.send(Ok(addr));
                    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
                    let task = tokio::spawn(server.run(async {
                        let _ = drain_rx.await;
                    }));
                    let _ = stopped.await;
                    let _ = drain_tx.send(());
                    match tokio::time::timeout(GRACE, task).await {
                        Ok(Ok(result)) => result.map_err(Into::into),
                        Ok(Err(join)) => bail!("the HTTP server task failed: {join}"),
                        Err(_) => {
                            tracing::warn!(
                                "open HTTP responses did not finish in {GRACE:?}; closing them"
                            );
                            Ok(())
                        }
                    }
                })
            },
        )?;
        match bound_rx.recv() {
            Ok(Ok(Some(addr))) => Ok((Front { stop, thread }, addr)),
            Ok(Ok(None)) => bail!("the HTTP listener has no local address"),
            Ok(Err(error)) => Err(error.into()),
            Err(_) => match thread.join() {
                Ok(result) => Err(result
                    .err()
                    .unwrap_or_else(|| anyhow::anyhow!("the HTTP thread stopped"))),
                Err(_) => bail!("the HTTP thread panicked"),
            },
        }
    }

    /// Stops accepting, lets open responses finish (up to a grace period)
    /// and waits for the thread.
    pub(crate) fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        match self.thread.join() {
            Ok(result) => result,
            Err(_) => bail!("the HTTP thread panicked"),
        }
    }
}

/// Runs the front until Ctrl-C or SIGTERM.
pub(crate) fn run(args: &HttpArgs) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .context("installing the Ctrl-C handler")?;
    let config = zinfer_http::HttpConfig {
        curve: args.curve.load()?,
        ..args.options.config(&args.router, args.listen)
    };
    let (front, addr) = Front::start(config)?;
    eprintln!(
        "zinfer http: listening on http://{addr} (OpenAI API under /v1), router {}",
        args.router
    );
    let _ = stop_rx.recv();
    eprintln!("zinfer http: shutting down");
    front.stop()
}
