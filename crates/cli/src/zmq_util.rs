//! Socket set-up shared by the client-side commands.

use anyhow::Context;

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
