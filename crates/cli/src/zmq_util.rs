//! Socket set-up shared by the client-side commands.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use zinfer_protocol::{ClientReply, ClientRequest, Limits};

/// A DEALER connected to `endpoint`, with a bounded linger so the command
/// exits promptly when the peer is gone.
pub(crate) fn client_socket(context: &zmq::Context, endpoint: &str) -> anyhow::Result<zmq::Socket> {
    let socket = context.socket(zmq::DEALER)?;
    socket.set_linger(200)?;
    socket.set_maxmsgsize(zinfer_protocol::Limits::default().max_frame_bytes as i64)?;
    socket
        .connect(endpoint)
        .with_context(|| format!("connecting to {endpoint}"))?;
    Ok(socket)
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
                 `zinfer serve`, or `zinfer router` plus a worker, or pass --router)",
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
