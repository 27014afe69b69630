//! CURVE authentication: which keys may connect to which socket.
//!
//! libzmq asks a ZAP handler (RFC 27) about every CURVE handshake; the
//! handler answers from the socket's ZAP domain (`clients`, `workers`,
//! `control`) and its allow-list, and names the peer by its Z85 public key
//! (the `User-Id` every message from it carries, which the router turns
//! into a tenant). The decision is [`Authenticator::check`], pure and
//! unit-tested; [`AuthThread`] is the socket plumbing around it, plus
//! socket monitors that count every refused handshake (a plaintext peer
//! never reaches ZAP, but its handshake fails all the same).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use zinfer_curve::{AllowList, KeyPair, PublicKey};

use crate::{RouterError, metrics::Metrics};

/// ZAP domain of the front socket.
pub(crate) const CLIENTS: &str = "clients";
/// ZAP domain of the back socket.
pub(crate) const WORKERS: &str = "workers";
/// ZAP domain of the control socket.
pub(crate) const CONTROL: &str = "control";

/// Where libzmq looks for the ZAP handler of a context (RFC 27).
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// CURVE on the router's three sockets.
#[derive(Debug, Clone)]
pub struct CurveConfig {
    /// The router's key pair; clients trust its public half.
    pub keys: KeyPair,
    /// Client keys allowed on the front socket. `None`: any client that
    /// completes a CURVE handshake (traffic encrypted, tenant taken from
    /// its key, but no identity check), so public clients need no
    /// registration step.
    pub clients: Option<AllowList>,
    /// Worker (and supervisor-spawned worker) keys allowed on the back
    /// socket. Required: an unknown worker would receive prompts.
    pub workers: AllowList,
    /// Admin and supervisor keys allowed on the control socket. Required:
    /// it can stop and start workers.
    pub admins: AllowList,
}

/// What the ZAP handler answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Accept; the peer's messages carry `user_id` as `User-Id`.
    Allow {
        /// The peer's public key, Z85.
        user_id: String,
    },
    /// Refuse; the peer's connection is closed with no message.
    Deny {
        /// Why, for logs and the ZAP reply's status text.
        reason: String,
    },
}

/// Decides on CURVE handshakes from the allow-lists.
#[derive(Debug, Clone)]
pub(crate) struct Authenticator {
    clients: Option<AllowList>,
    workers: AllowList,
    admins: AllowList,
}

impl Authenticator {
    pub(crate) fn new(config: &CurveConfig) -> Self {
        Authenticator {
            clients: config.clients.clone(),
            workers: config.workers.clone(),
            admins: config.admins.clone(),
        }
    }

    /// The answer for a peer presenting `credentials` (its raw 32-byte
    /// public key) with `mechanism` on the socket of ZAP domain `domain`.
    pub(crate) fn check(&self, domain: &str, mechanism: &str, credentials: &[u8]) -> Decision {
        let deny = |reason: String| Decision::Deny { reason };
        if mechanism != "CURVE" {
            return deny(format!("mechanism {mechanism} is not CURVE"));
        }
        let Ok(bytes) = <[u8; 32]>::try_from(credentials) else {
            return deny(format!(
                "a CURVE key is 32 bytes, got {}",
                credentials.len()
            ));
        };
        let key = PublicKey::from_bytes(bytes);
        let list = match domain {
            CLIENTS => self.clients.as_ref(),
            WORKERS => Some(&self.workers),
            CONTROL => Some(&self.admins),
            other => return deny(format!("unknown ZAP domain {other:?}")),
        };
        match list {
            Some(list) if !list.contains(&key) => {
                deny(format!("key {key} is not on the {domain} allow-list"))
            }
            _ => Decision::Allow {
                user_id: key.to_z85(),
            },
        }
    }
}

/// The tenant of a peer named by its ZAP `User-Id` (a Z85 public key).
pub(crate) fn tenant_of(user_id: &str) -> Option<String> {
    PublicKey::from_z85(user_id).ok().map(|key| key.tenant())
}

/// Whether `endpoint` can only be reached from this host: tcp on a
/// loopback address, ipc, inproc.
pub(crate) fn is_loopback(endpoint: &str) -> bool {
    if endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://") {
        return true;
    }
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return false;
    };
    // `tcp://HOST:PORT`, HOST possibly `[v6]`; a `src;dst` form is a connect, not a bind.
    let host = match rest.rsplit_once(':') {
        Some((host, _port)) => host,
        None => rest,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The ZAP handler and handshake monitors, on their own thread until
/// dropped. Must be dropped before the context is terminated.
pub(crate) struct AuthThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for AuthThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The inproc endpoint a socket's handshake monitor publishes on.
pub(crate) fn monitor_endpoint(domain: &str) -> String {
    format!("inproc://zinfer-router-monitor-{domain}")
}

/// Handshake failures a monitor reports: each is one refused connection.
pub(crate) fn monitored_events() -> i32 {
    i32::from(zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL.to_raw())
        | i32::from(zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL.to_raw())
        | i32::from(zmq::SocketEvent::HANDSHAKE_FAILED_AUTH.to_raw())
}

impl AuthThread {
    /// Binds the ZAP handler in `context`. Call before any CURVE socket
    /// binds: without a handler libzmq accepts every key.
    pub(crate) fn bind(
        context: &zmq::Context,
        authenticator: Authenticator,
        metrics: Arc<Metrics>,
    ) -> Result<PendingAuth, RouterError> {
        let setup = |source| RouterError::Socket {
            socket: "ZAP handler",
            source,
        };
        let zap = context.socket(zmq::REP).map_err(setup)?;
        zap.set_linger(0).map_err(setup)?;
        zap.bind(ZAP_ENDPOINT).map_err(setup)?;
        Ok(PendingAuth {
            context: context.clone(),
            zap,
            authenticator,
            metrics,
        })
    }
}

/// A bound ZAP handler whose thread has not started: the monitors of the
/// sockets exist only once they are created.
pub(crate) struct PendingAuth {
    context: zmq::Context,
    zap: zmq::Socket,
    authenticator: Authenticator,
    metrics: Arc<Metrics>,
}

impl PendingAuth {
    /// Connects to the monitors of `domains` (set up with
    /// [`monitor_endpoint`]) and starts the thread.
    pub(crate) fn start(self, domains: &[&'static str]) -> Result<AuthThread, RouterError> {
        let setup = |source| RouterError::Socket {
            socket: "handshake monitor",
            source,
        };
        let mut monitors = Vec::new();
        for &domain in domains {
            let socket = self.context.socket(zmq::PAIR).map_err(setup)?;
            socket.set_linger(0).map_err(setup)?;
            socket.connect(&monitor_endpoint(domain)).map_err(setup)?;
            monitors.push((domain, socket));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("zinfer-zap".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || {
                    serve(
                        &self.zap,
                        &monitors,
                        &self.authenticator,
                        &self.metrics,
                        &stop,
                    )
                }
            })
            .map_err(RouterError::Thread)?;
        Ok(AuthThread {
            stop,
            thread: Some(thread),
        })
    }
}

fn serve(
    zap: &zmq::Socket,
    monitors: &[(&'static str, zmq::Socket)],
    authenticator: &Authenticator,
    metrics: &Metrics,
    stop: &AtomicBool,
) {
    const WAKE: Duration = Duration::from_millis(100);
    while !stop.load(Ordering::Relaxed) {
        let mut items = vec![zap.as_poll_item(zmq::POLLIN)];
        items.extend(monitors.iter().map(|(_, m)| m.as_poll_item(zmq::POLLIN)));
        match zmq::poll(&mut items, WAKE.as_millis() as i64) {
            Ok(_) | Err(zmq::Error::EINTR) => {}
            Err(err) => {
                tracing::error!(%err, "ZAP handler poll failed; CURVE peers cannot connect");
                return;
            }
        }
        let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
        if ready[0] {
            answer(zap, authenticator);
        }
        for ((domain, monitor), ready) in monitors.iter().zip(&ready[1..]) {
            if *ready {
                while let Ok(parts) = monitor.recv_multipart(zmq::DONTWAIT) {
                    tracing::debug!(socket = domain, event = ?parts.first(), "handshake refused");
                    metrics.count_auth_refusal(domain);
                }
            }
        }
    }
}

/// Reads one ZAP request and sends its reply.
fn answer(zap: &zmq::Socket, authenticator: &Authenticator) {
    let Ok(parts) = zap.recv_multipart(zmq::DONTWAIT) else {
        return;
    };
    // version, request id, domain, address, routing id, mechanism, credentials...
    let text = |i: usize| {
        parts
            .get(i)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default()
    };
    let request_id = parts.get(1).cloned().unwrap_or_default();
    let decision = if text(0) != "1.0" {
        Decision::Deny {
            reason: format!("ZAP version {:?} is not 1.0", text(0)),
        }
    } else {
        let credentials = parts.get(6).map(Vec::as_slice).unwrap_or_default();
        authenticator.check(&text(2), &text(5), credentials)
    };
    let (status, status_text, user_id) = match decision {
        Decision::Allow { user_id } => ("200", "OK".to_string(), user_id),
        Decision::Deny { reason } => {
            tracing::debug!(domain = %text(2), address = %text(3), %reason, "CURVE peer refused");
            ("400", reason, String::new())
        }
    };
    let reply: [&[u8]; 6] = [
        b"1.0",
        &request_id,
        status.as_bytes(),
        status_text.as_bytes(),
        user_id.as_bytes(),
        b"",
    ];
    if let Err(err) = zap.send_multipart(reply, 0) {
        tracing::warn!(%err, "sending a ZAP reply failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> KeyPair {
        KeyPair::generate().unwrap()
    }

    #[test]
    fn lists_decide_per_socket() {
        let (client, worker, admin, stranger) = (key(), key(), key(), key());
        let config = CurveConfig {
            keys: key(),
            clients: Some([client.public()].into_iter().collect()),
            workers: [worker.public()].into_iter().collect(),
            admins: [admin.public()].into_iter().collect(),
        };
        let auth = Authenticator::new(&config);
        let allow = |k: &KeyPair| Decision::Allow {
            user_id: k.public().to_z85(),
        };
        let bytes = |k: &KeyPair| k.public().as_bytes().to_vec();
        assert_eq!(
            auth.check(CLIENTS, "CURVE", &bytes(&client)),
            allow(&client)
        );
        assert_eq!(
            auth.check(WORKERS, "CURVE", &bytes(&worker)),
            allow(&worker)
        );
        assert_eq!(auth.check(CONTROL, "CURVE", &bytes(&admin)), allow(&admin));
        for (domain, k) in [
            (CLIENTS, &stranger),
            (WORKERS, &client),
            (CONTROL, &worker),
            (CONTROL, &stranger),
        ] {
            let decision = auth.check(domain, "CURVE", &bytes(k));
            assert!(
                matches!(decision, Decision::Deny { .. }),
                "{domain}: {decision:?}"
            );
        }
        assert!(matches!(
            auth.check(CLIENTS, "NULL", b""),
            Decision::Deny { .. }
        ));
        assert!(matches!(
            auth.check(CLIENTS, "CURVE", &[0; 31]),
            Decision::Deny { .. }
        ));
        assert!(matches!(
            auth.check("other", "CURVE", &bytes(&client)),
            Decision::Deny { .. }
        ));
    }

    #[test]
    fn no_client_list_admits_any_curve_client_with_its_key_as_user_id() {
        let (worker, stranger) = (key(), key());
        let auth = Authenticator::new(&CurveConfig {
            keys: key(),
            clients: None,
            workers: [worker.public()].into_iter().collect(),
            admins: [worker.public()].into_iter().collect(),
        });
        let decision = auth.check(CLIENTS, "CURVE", stranger.public().as_bytes());
        assert_eq!(
            decision,
            Decision::Allow {
                user_id: stranger.public().to_z85()
            }
        );
        let Decision::Allow { user_id } = decision else {
            unreachable!()
        };
        assert_eq!(tenant_of(&user_id), Some(stranger.public().tenant()));
        assert!(matches!(
            auth.check(WORKERS, "CURVE", stranger.public().as_bytes()),
            Decision::Deny { .. }
        ));
        assert_eq!(tenant_of("not a key"), None);
    }

    #[test]
    fn loopback_endpoints() {
        for endpoint in [
            "tcp://127.0.0.1:5557",
            "tcp://127.0.0.2:1",
            "tcp://localhost:5557",
            "tcp://[::1]:5557",
            "ipc:///tmp/zinfer.sock",
            "inproc://control",
        ] {
            assert!(is_loopback(endpoint), "{endpoint}");
        }
        for endpoint in [
            "tcp://*:5557",
            "tcp://0.0.0.0:5557",
            "tcp://10.0.0.1:5557",
            "tcp://[::]:5557",
            "tcp://eth0:5557",
            "tcp://example.com:5557",
        ] {
            assert!(!is_loopback(endpoint), "{endpoint}");
        }
    }
}
