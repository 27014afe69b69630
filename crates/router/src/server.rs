//! The I/O edge: one thread owning the three ROUTER sockets, feeding
//! frames to the core and sending its actions without ever blocking.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::{
    RouterConfig, RouterError,
    auth::{self, AuthThread, Authenticator},
    core::{Action, Addr, Core, Peer, SendFailure},
    metrics::{Metrics, MetricsServer},
};

/// Most messages read from one socket before looking at the others.
const BATCH: usize = 512;

/// A router with its sockets bound, ready to serve.
pub struct Router {
    config: RouterConfig,
    metrics: Arc<Metrics>,
    metrics_server: Option<MetricsServer>,
    _context: zmq::Context,
    /// The ZAP handler, with CURVE on; stopped (joined) when dropped.
    _auth: Option<AuthThread>,
    front: zmq::Socket,
    back: zmq::Socket,
    control: zmq::Socket,
    endpoints: Endpoints,
}

/// The endpoints actually bound (wildcard ports resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// Front socket, for clients.
    pub clients: String,
    /// Back socket, for workers.
    pub workers: String,
    /// Control socket, for admins.
    pub control: String,
    /// `/metrics` address, when served.
    pub metrics: Option<std::net::SocketAddr>,
}

impl Router {
    /// Checks libzmq, starts `/metrics` and binds the three sockets.
    pub fn bind(config: RouterConfig) -> Result<Self, RouterError> {
        crate::check_zmq_version()?;
        if config.curve.is_none() && !auth::is_loopback(&config.control) {
            return Err(RouterError::ControlExposed {
                endpoint: config.control.clone(),
            });
        }
        if config.curve.is_some() {
            zinfer_curve::check_available().map_err(|source| RouterError::Curve {
                socket: "clients",
                source,
            })?;
        }
        let metrics = Arc::new(Metrics::new()?);
        let metrics_server = match config.metrics {
            Some(addr) => Some(MetricsServer::start(
                addr,
                "router-metrics",
                Arc::clone(&metrics),
            )?),
            None => None,
        };
        let context = zmq::Context::new();
        // The ZAP handler binds before any CURVE socket: without one,
        // libzmq would accept every key.
        let pending_auth = match &config.curve {
            Some(curve) => Some(AuthThread::bind(
                &context,
                Authenticator::new(curve),
                Arc::clone(&metrics),
            )?),
            None => None,
        };
        let front = router_socket(&context, &config, auth::CLIENTS, &config.clients, false)?;
        let back = router_socket(&context, &config, auth::WORKERS, &config.workers, true)?;
        let control = router_socket(&context, &config, auth::CONTROL, &config.control, false)?;
        let auth = match pending_auth {
            Some(pending) => Some(pending.start(&[auth::CLIENTS, auth::WORKERS, auth::CONTROL])?),
            None => None,
        };
        let endpoints = Endpoints {
            clients: last_endpoint(&front, &config.clients),
            workers: last_endpoint(&back, &config.workers),
            control: last_endpoint(&control, &config.control),
            metrics: metrics_server.as_ref().map(MetricsServer::addr),
        };
        tracing::info!(
            ?endpoints,
            policy = %config.policy,
            curve = config.curve.is_some(),
            "router listening"
        );
        Ok(Router {
            config,
            metrics,
            metrics_server,
            _context: context,
            _auth: auth,
            front,
            back,
            control,
            endpoints,
        })
    }

    /// Where the router listens.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// Serves until `shutdown` receives a message or every sender is
    /// dropped, then ends in-flight requests with a retryable error.
    pub fn serve(self, shutdown: Receiver<()>) -> Result<(), RouterError> {
        let mut core = Core::new(
            self.config.clone(),
            Arc::clone(&self.metrics),
            Instant::now(),
        );
        // Workers outlive a router: one restarted on the same endpoints
        // must not hand out the rids its predecessor left running there
        // (the worker would refuse them as already in flight). The wall
        // clock in nanoseconds moves faster than any router hands out rids.
        let epoch_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(1));
        core.start_rids_at(epoch_ns.max(1));
        loop {
            match shutdown.try_recv() {
                Ok(()) | Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => {}
            }
            // Sleep until the core's next timer, but wake at least every
            // poll_interval to notice `shutdown`.
            let timeout = core
                .poll_timeout()
                .saturating_duration_since(Instant::now())
                .min(self.config.poll_interval);
            let readable = self.wait(timeout)?;
            for (socket, ready) in [Side::Front, Side::Back, Side::Control]
                .into_iter()
                .zip(readable)
            {
                if ready {
                    self.read(&mut core, socket);
                }
            }
            let now = Instant::now();
            if now >= core.poll_timeout() {
                core.tick(now);
            }
            self.flush(&mut core);
        }
        tracing::info!(
            active = core.active_requests(),
            "router shutting down; failing in-flight requests"
        );
        core.shutdown(Instant::now());
        self.flush(&mut core);
        drop(self.metrics_server);
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<[bool; 3], RouterError> {
        let mut items = [
            self.front.as_poll_item(zmq::POLLIN),
            self.back.as_poll_item(zmq::POLLIN),
            self.control.as_poll_item(zmq::POLLIN),
        ];
        match zmq::poll(&mut items, poll_millis(timeout)) {
            Ok(_) => Ok([
                items[0].is_readable(),
                items[1].is_readable(),
                items[2].is_readable(),
            ]),
            Err(zmq::Error::EINTR) => Ok([false; 3]),
            Err(err) => Err(RouterError::Poll(err)),
        }
    }

    fn read(&self, core: &mut Core, side: Side) {
        let socket = self.socket(side);
        let curve = self.config.curve.is_some();
        for _ in 0..BATCH {
            let (parts, user_id) = match recv_parts(socket, curve) {
                Ok(received) => received,
                Err(zmq::Error::EAGAIN) => return,
                Err(err) => {
                    tracing::warn!(%err, socket = side.name(), "receive failed");
                    return;
                }
            };
            let now = Instant::now();
            match split_envelope(parts, self.config.limits.max_frames) {
                Ok((from, payload)) => match side {
                    Side::Front => {
                        let tenant = user_id.as_deref().and_then(auth::tenant_of);
                        core.handle_client_as(now, &from, tenant.as_deref(), &payload);
                    }
                    Side::Back => core.handle_worker_as(now, &from, user_id.as_deref(), &payload),
                    Side::Control => core.handle_admin(now, &from, &payload),
                },
                Err(EnvelopeError { from, detail }) => {
                    tracing::debug!(socket = side.name(), detail, "bad envelope");
                    match (side, from) {
                        (Side::Front, Some(from)) => core.reject_client_envelope(&from, &detail),
                        (Side::Control, Some(from)) => core.reject_admin_envelope(&from, &detail),
                        _ => {}
                    }
                }
            }
            if side == Side::Back {
                // Relay promptly: a worker's chunk should not wait for the batch.
                self.flush(core);
            }
        }
    }

    fn flush(&self, core: &mut Core) {
        while let Some(Action::Send { to, frame }) = core.poll_action() {
            let side = match &to {
                Peer::Client(_) => Side::Front,
                Peer::Worker(_) => Side::Back,
                Peer::Admin(_) => Side::Control,
            };
            if let Err(failure) = send(self.socket(side), to.addr(), frame) {
                self.metrics.count_drop(side.name());
                tracing::debug!(socket = side.name(), ?failure, "send dropped");
                core.handle_send_failure(Instant::now(), &to, failure);
            }
        }
    }

    fn socket(&self, side: Side) -> &zmq::Socket {
        match side {
            Side::Front => &self.front,
            Side::Back => &self.back,
            Side::Control => &self.control,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Front,
    Back,
    Control,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Front => "clients",
            Side::Back => "workers",
            Side::Control => "control",
        }
    }
}

/// One whole message and, when `curve`, the ZAP `User-Id` it carries
/// (the sender's Z85 public key). `recv_multipart` would drop the
/// metadata, so frames are read one by one.
fn recv_parts(
    socket: &zmq::Socket,
    curve: bool,
) -> Result<(Vec<Vec<u8>>, Option<String>), zmq::Error> {
    let mut parts = Vec::with_capacity(3);
    let mut user_id = None;
    let mut flags = zmq::DONTWAIT;
    loop {
        let mut message = socket.recv_msg(flags)?;
        if curve && user_id.is_none() {
            user_id = message.gets("User-Id").map(str::to_string);
        }
        let more = message.get_more();
        parts.push(message.to_vec());
        if !more {
            return Ok((parts, user_id));
        }
        // The rest of a message is already there once its first frame is.
        flags = 0;
    }
}

/// `timeout` in whole milliseconds for `zmq::poll`, rounded up: rounding
/// down would turn the last fraction of a millisecond before a timer into
/// `poll(0)` calls in a busy loop.
fn poll_millis(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

fn router_socket(
    context: &zmq::Context,
    config: &RouterConfig,
    name: &'static str,
    endpoint: &str,
    handover: bool,
) -> Result<zmq::Socket, RouterError> {
    let setup = |source| RouterError::Socket {
        socket: name,
        source,
    };
    let socket = context.socket(zmq::ROUTER).map_err(setup)?;
    if let Some(curve) = &config.curve {
        zinfer_curve::apply_server(&socket, &curve.keys, name).map_err(|source| {
            RouterError::Curve {
                socket: name,
                source,
            }
        })?;
        socket
            .monitor(&auth::monitor_endpoint(name), auth::monitored_events())
            .map_err(setup)?;
    }
    socket.set_router_mandatory(true).map_err(setup)?;
    if handover {
        socket.set_router_handover(true).map_err(setup)?;
    }
    let max = i64::try_from(config.limits.max_frame_bytes).unwrap_or(i64::MAX);
    socket.set_maxmsgsize(max).map_err(setup)?;
    socket.set_sndhwm(config.hwm).map_err(setup)?;
    socket.set_rcvhwm(config.hwm).map_err(setup)?;
    socket.set_linger(500).map_err(setup)?;
    socket.bind(endpoint).map_err(|source| RouterError::Bind {
        socket: name,
        endpoint: endpoint.to_string(),
        source,
    })?;
    Ok(socket)
}

fn last_endpoint(socket: &zmq::Socket, fallback: &str) -> String {
    match socket.get_last_endpoint() {
        Ok(Ok(endpoint)) => endpoint,
        _ => fallback.to_string(),
    }
}

/// A message whose frames are not `[identity, payload]` or
/// `[identity, "", payload]`.
#[derive(Debug)]
pub(crate) struct EnvelopeError {
    /// Who sent it, when known, for the error reply.
    pub(crate) from: Option<Addr>,
    pub(crate) detail: String,
}

/// Splits a ROUTER message into the sender and its one payload frame.
pub(crate) fn split_envelope(
    mut parts: Vec<Vec<u8>>,
    max_frames: usize,
) -> Result<(Addr, Vec<u8>), EnvelopeError> {
    if parts.is_empty() {
        return Err(EnvelopeError {
            from: None,
            detail: "empty message".into(),
        });
    }
    let identity = parts.remove(0);
    let delimited = parts.first().is_some_and(|part| part.is_empty()) && parts.len() > 1;
    let from = Addr {
        identity,
        delimited,
    };
    if parts.len() + 1 > max_frames {
        return Err(EnvelopeError {
            from: Some(from),
            detail: format!(
                "message of {} frames exceeds the limit of {max_frames}",
                parts.len() + 1
            ),
        });
    }
    match (parts.len(), delimited) {
        (1, false) => Ok((from, parts.swap_remove(0))),
        (2, true) => Ok((from, parts.swap_remove(1))),
        _ => Err(EnvelopeError {
            from: Some(from),
            detail: format!("expected one payload frame, got {} frames", parts.len()),
        }),
    }
}

fn send(socket: &zmq::Socket, to: &Addr, frame: Vec<u8>) -> Result<(), SendFailure> {
    let failure = |err| match err {
        zmq::Error::EHOSTUNREACH => SendFailure::Unreachable,
        _ => SendFailure::Full,
    };
    socket
        .send(&to.identity[..], zmq::SNDMORE | zmq::DONTWAIT)
        .map_err(failure)?;
    if to.delimited {
        socket
            .send(&b""[..], zmq::SNDMORE | zmq::DONTWAIT)
            .map_err(failure)?;
    }
    socket.send(frame, zmq::DONTWAIT).map_err(failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(frames: &[&[u8]]) -> Vec<Vec<u8>> {
        frames.iter().map(|frame| frame.to_vec()).collect()
    }

    #[test]
    fn poll_timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(poll_millis(Duration::ZERO), 0);
        assert_eq!(poll_millis(Duration::from_nanos(1)), 1);
        assert_eq!(poll_millis(Duration::from_micros(999)), 1);
        assert_eq!(poll_millis(Duration::from_millis(10)), 10);
        assert_eq!(poll_millis(Duration::from_micros(10_001)), 11);
        assert_eq!(poll_millis(Duration::MAX), i64::MAX);
    }

    #[test]
    fn envelopes_dealer_and_req_style() {
        let (from, payload) = split_envelope(parts(&[b"c1", b"msg"]), 4).unwrap();
        assert_eq!(
            (from.identity.as_slice(), from.delimited),
            (&b"c1"[..], false)
        );
        assert_eq!(payload, b"msg");
        let (from, payload) = split_envelope(parts(&[b"c1", b"", b"msg"]), 4).unwrap();
        assert!(from.delimited);
        assert_eq!(payload, b"msg");
    }

    #[test]
    fn envelopes_rejected_with_sender() {
        let err = split_envelope(parts(&[b"c1", b"a", b"b"]), 4).unwrap_err();
        assert_eq!(err.from.unwrap().identity, b"c1");
        let err = split_envelope(parts(&[b"c1", b"", b"a", b"b", b"c"]), 4).unwrap_err();
        assert!(err.detail.contains("limit of 4"), "{}", err.detail);
        assert!(err.from.unwrap().delimited);
        assert!(split_envelope(parts(&[b"c1"]), 4).is_err());
        assert!(split_envelope(Vec::new(), 4).unwrap_err().from.is_none());
    }
}
