//! Socket set-up shared by the client-side commands.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use zinfer_curve::{ClientCurve, DropWatch};
use zinfer_protocol::{ClientReply, ClientRequest, Limits};

/// CURVE flags of every process that connects to a router (worker,
/// supervisor, `generate`, `ctl`, `bench`, `http`). Both off: plain TCP.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct CurveArgs {
    /// The router's public key file (ROUTER.pub from `zinfer keys
    /// generate`, or its .key): connect with CURVE encryption, to that
    /// router only. Needed when the router runs with --curve-key.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "ZINFER_CURVE_SERVER_KEY"
    )]
    pub(crate) curve_server_key: Option<PathBuf>,
    /// This process's key pair file (NAME.key from `zinfer keys generate`),
    /// whose public key the router must have on the socket's allow-list
    /// (--client-keys, --worker-keys, --admin-keys). Left out with
    /// --curve-server-key: a throwaway key pair, accepted only by a router
    /// without a client allow-list.
    #[arg(long, global = true, value_name = "FILE", env = "ZINFER_CURVE_KEY")]
    pub(crate) curve_key: Option<PathBuf>,
}

impl CurveArgs {
    /// The keys these flags name, read and checked; `None` when CURVE is off.
    pub(crate) fn load(&self) -> anyhow::Result<Option<ClientCurve>> {
        Ok(ClientCurve::from_flags(
            self.curve_server_key.as_deref(),
            self.curve_key.as_deref(),
        )?)
    }
}

/// A DEALER connected to `endpoint`, with a bounded linger so the command
/// exits promptly when the peer is gone, and CURVE when `curve` is given.
pub(crate) fn client_socket(
    context: &zmq::Context,
    endpoint: &str,
    curve: Option<&ClientCurve>,
) -> anyhow::Result<zmq::Socket> {
    Ok(watched_client_socket(context, endpoint, curve)?.0)
}

/// [`client_socket`] with a watch that reports when its connection drops.
pub(crate) fn watched_client_socket(
    context: &zmq::Context,
    endpoint: &str,
    curve: Option<&ClientCurve>,
) -> anyhow::Result<(zmq::Socket, DropWatch)> {
    let socket = context.socket(zmq::DEALER)?;
    socket.set_linger(200)?;
    socket.set_maxmsgsize(zinfer_protocol::Limits::default().max_frame_bytes as i64)?;
    zinfer_curve::apply_client(&socket, curve)?;
    let watch = DropWatch::new(context, &socket)?;
    socket
        .connect(endpoint)
        .with_context(|| format!("connecting to {endpoint}"))?;
    Ok((socket, watch))
}

/// Sends `ping` and waits up to `timeout` for the `pong`, so a command
/// with no router to talk to says so in seconds instead of waiting out its
/// whole request timeout.
pub(crate) fn ping(socket: &zmq::Socket, endpoint: &str, timeout: Duration) -> anyhow::Result<()> {
    const PING_ID: &str = "zinfer-cli-ping";
    let frame = zinfer_protocol::encode(&ClientRequest::Ping {
        id: Some(PING_ID.into()),
    })?;
    socket
        .send(frame, zmq::DONTWAIT)
        .with_context(|| format!("sending a ping to {endpoint}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || socket.poll(zmq::POLLIN, poll_millis(left))? == 0 {
            bail!(
                "no reply from {endpoint} within {:.1} s (is the router running? start \
                 `zinfer serve`, or `zinfer router` plus a worker, or pass --router; a router \
                 with CURVE answers nothing to a client without --curve-server-key, or whose \
                 --curve-key is not on its --client-keys list)",
                timeout.as_secs_f64()
            );
        }
        let reply = socket.recv_bytes(0)?;
        // Anything else is a stray reply; only our pong counts.
        if let Ok(ClientReply::Pong { id }) = zinfer_protocol::decode(&reply, &Limits::default())
            && id.as_deref() == Some(PING_ID)
        {
            return Ok(());
        }
    }
}

/// `timeout` in whole milliseconds for `zmq::poll`, rounded up.
fn poll_millis(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}
