//! Socket set-up shared by the client-side commands.

use anyhow::{Context, bail};

/// The oldest libzmq without known CVEs (CVE-2019-13132, CVE-2020-15166).
const MIN_ZMQ: (i32, i32, i32) = (4, 3, 4);

/// Refuses to run on a libzmq with known vulnerabilities.
pub(crate) fn check_zmq_version() -> anyhow::Result<()> {
    let version = zmq::version();
    if version < MIN_ZMQ {
        bail!(
            "libzmq {}.{}.{} is too old: zinfer needs >= 4.3.4 (older versions carry CVE-2019-13132 and CVE-2020-15166). \
             On Debian/Ubuntu install libzmq3-dev from a current release.",
            version.0,
            version.1,
            version.2
        );
    }
    Ok(())
}

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
