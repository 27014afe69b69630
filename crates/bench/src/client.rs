//! The zinfer client: one DEALER socket to the router's front socket,
//! multiplexing every in-flight request by its id. The socket lives on the
//! bench's one I/O thread, which stamps each reply as it reads it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use zinfer_curve::DropWatch;

use zinfer_protocol::{
    ChunkBody, ClientReply, ClientRequest, DoneBody, GenerateRequest, Limits, decode, encode,
};

use crate::BenchError;

use super::{
    Transport,
    driver::{Event, EventKind, Outgoing, TokenCounts},
};

/// Prefix of the request ids this client sends; the rest is the driver key.
const ID_PREFIX: &str = "bench-";

/// Most frames read in one [`Transport::poll`] call.
const MAX_DRAIN: usize = 1024;

/// Sampling settings shared by every request of a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RequestSettings {
    /// Model name, if any.
    pub(crate) model: Option<String>,
    /// Prefix-cache namespace, if any.
    pub(crate) namespace: Option<String>,
    /// Sampling temperature (0 is greedy).
    pub(crate) temperature: f32,
    /// Generate exactly `max_tokens`, past the model's end-of-sequence token.
    pub(crate) ignore_eos: bool,
}

/// A DEALER connected to a router.
pub(crate) struct ZmqTransport {
    socket: zmq::Socket,
    /// Reports a dropped router connection, which ends every request in
    /// flight at once rather than by timeout.
    watch: DropWatch,
    /// Requests sent and not yet ended.
    in_flight: BTreeSet<u64>,
    /// The watch saw a drop that [`Transport::poll`] has not reported yet.
    dropped: bool,
    settings: RequestSettings,
    limits: Limits,
}

impl ZmqTransport {
    /// Connects to `endpoint` and checks with a `ping` that a router answers
    /// within `wait`, so a wrong address fails at once rather than as a run
    /// of timeouts.
    pub(crate) fn connect(
        context: &zmq::Context,
        endpoint: &str,
        settings: RequestSettings,
        wait: Duration,
        curve: Option<&zinfer_curve::ClientCurve>,
    ) -> Result<ZmqTransport, BenchError> {
        let limits = Limits::default();
        let socket = context
            .socket(zmq::DEALER)
            .map_err(BenchError::socket("creating a DEALER socket"))?;
        let setup = || BenchError::socket("setting up the DEALER socket");
        socket.set_linger(0).map_err(setup())?;
        socket.set_rcvhwm(0).map_err(setup())?;
        socket
            .set_maxmsgsize(i64::try_from(limits.max_frame_bytes).unwrap_or(i64::MAX))
            .map_err(setup())?;
        zinfer_curve::apply_client(&socket, curve)?;
        let watch = DropWatch::new(context, &socket).map_err(setup())?;
        socket
            .connect(endpoint)
            .map_err(BenchError::socket(format!(
                "connecting to the router at {endpoint}"
            )))?;
        let mut transport = ZmqTransport {
            socket,
            watch,
            in_flight: BTreeSet::new(),
            dropped: false,
            settings,
            limits,
        };
        transport.ping(endpoint, wait)?;
        Ok(transport)
    }

    fn ping(&mut self, endpoint: &str, wait: Duration) -> Result<(), BenchError> {
        let ping = encode(&ClientRequest::Ping {
            id: Some(format!("{ID_PREFIX}ping")),
        })?;
        self.socket
            .send(ping, 0)
            .map_err(BenchError::socket("sending a ping to the router"))?;
        let deadline = Instant::now() + wait;
        while let Some(frame) = self.recv_frame(deadline)? {
            match decode::<ClientReply>(&frame, &self.limits) {
                Ok(ClientReply::Pong { .. }) => return Ok(()),
                Ok(ClientReply::Error { code, message, .. }) => {
                    return Err(BenchError::PingRefused {
                        endpoint: endpoint.to_string(),
                        code,
                        message,
                    });
                }
                _ => continue,
            }
        }
        Err(BenchError::NoRouter {
            endpoint: endpoint.to_string(),
            wait,
        })
    }

    /// One frame, or `None` once `deadline` passed. Multipart messages are
    /// reduced to their last frame, so a router that adds an empty
    /// delimiter still works.
    fn recv_frame(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, BenchError> {
        loop {
            match self.socket.recv_multipart(zmq::DONTWAIT) {
                Ok(mut frames) => return Ok(frames.pop()),
                Err(zmq::Error::EAGAIN) => {}
                Err(e) => return Err(BenchError::socket("receiving from the router")(e)),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.dropped {
                return Ok(None);
            }
            let millis = i64::try_from(left.as_millis().max(1)).unwrap_or(i64::MAX);
            let mut items = [
                self.socket.as_poll_item(zmq::POLLIN),
                self.watch.as_poll_item(),
            ];
            zmq::poll(&mut items, millis)
                .map_err(BenchError::socket("polling the router socket"))?;
            if items[1].is_readable() && self.watch.dropped() {
                self.dropped = true;
            }
        }
    }

    fn event(&self, frame: &[u8], at: Instant) -> Option<Event> {
        let reply = match decode::<ClientReply>(frame, &self.limits) {
            Ok(reply) => reply,
            Err(e) => {
                tracing::warn!("ignoring an unreadable reply from the router: {e}");
                return None;
            }
        };
        let (id, kind) = match reply {
            ClientReply::Chunk {
                id,
                body: ChunkBody { text, .. },
                ..
            } => (id, EventKind::Chunk { text }),
            ClientReply::Done {
                id,
                body: DoneBody { usage, .. },
                ..
            } => {
                let counts = TokenCounts {
                    prompt: Some(u64::from(usage.prompt_tokens)),
                    completion: u64::from(usage.completion_tokens),
                    cached: Some(u64::from(usage.cached_tokens)),
                };
                (id, EventKind::Done { counts })
            }
            ClientReply::Error {
                id: Some(id),
                code,
                message,
                ..
            } => {
                let code = code.as_str().to_string();
                (id, EventKind::Error { code, message })
            }
            ClientReply::Error {
                id: None, message, ..
            } => {
                tracing::warn!("the router could not read a request: {message}");
                return None;
            }
            // The bench sends none of these.
            ClientReply::Models { .. }
            | ClientReply::Pong { .. }
            | ClientReply::Tokenized { .. }
            | ClientReply::Detokenized { .. }
            | ClientReply::AppliedTemplate { .. }
            | ClientReply::Embedding { .. } => return None,
        };
        let key = id.strip_prefix(ID_PREFIX)?.parse().ok()?;
        Some(Event { key, at, kind })
    }

    /// The event a frame holds, if any; a request that ended is no longer
    /// in flight.
    fn take(&mut self, frame: &[u8], events: &mut Vec<Event>) {
        if let Some(event) = self.event(frame, Instant::now()) {
            if !matches!(event.kind, EventKind::Chunk { .. }) {
                self.in_flight.remove(&event.key);
            }
            events.push(event);
        }
    }

    /// Ends every request in flight: their replies can no longer arrive.
    fn end_in_flight(&mut self, events: &mut Vec<Event>) {
        let at = Instant::now();
        for key in std::mem::take(&mut self.in_flight) {
            events.push(Event {
                key,
                at,
                kind: EventKind::Error {
                    code: "disconnected".into(),
                    message: "the connection to the router dropped; the request is lost".into(),
                },
            });
        }
    }
}

impl Transport for ZmqTransport {
    fn send(&mut self, key: u64, request: &Outgoing) -> Result<(), BenchError> {
        let mut generate =
            GenerateRequest::from_prompt(format!("{ID_PREFIX}{key}"), &request.prompt);
        generate.model.clone_from(&self.settings.model);
        generate.namespace.clone_from(&self.settings.namespace);
        generate.max_tokens = request.max_tokens;
        generate.temperature = self.settings.temperature;
        generate.ignore_eos = self.settings.ignore_eos;
        generate.seed = Some(request.seed);
        generate.stream = true;
        let frame = encode(&ClientRequest::Generate(generate))?;
        self.socket
            .send(frame, zmq::DONTWAIT)
            .map_err(BenchError::socket(
                "sending to the router (its queue is full or the socket closed)",
            ))?;
        self.in_flight.insert(key);
        Ok(())
    }

    fn cancel(&mut self, key: u64) {
        self.in_flight.remove(&key);
        let cancel = ClientRequest::Cancel {
            id: format!("{ID_PREFIX}{key}"),
        };
        if let Ok(frame) = encode(&cancel)
            && let Err(e) = self.socket.send(frame, zmq::DONTWAIT)
        {
            tracing::debug!("could not cancel request {key}: {e}");
        }
    }

    fn poll(&mut self, until: Instant, events: &mut Vec<Event>) -> Result<(), BenchError> {
        if let Some(frame) = self.recv_frame(until)? {
            self.take(&frame, events);
            // Bounded, so a steady stream of chunks cannot hold off sends
            // and timeouts.
            for _ in 0..MAX_DRAIN {
                let Some(frame) = self.recv_frame(Instant::now())? else {
                    break;
                };
                self.take(&frame, events);
            }
        }
        if std::mem::take(&mut self.dropped) {
            self.end_in_flight(events);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes;

    fn settings() -> RequestSettings {
        RequestSettings {
            model: Some("smol".into()),
            namespace: None,
            temperature: 0.0,
            ignore_eos: false,
        }
    }

    fn outgoing(prompt: &str) -> Outgoing {
        Outgoing {
            prompt: prompt.into(),
            max_tokens: 3,
            seed: 11,
        }
    }

    #[test]
    fn streams_chunks_and_done_from_a_router_multiplexed_by_id() {
        let router = fakes::router();
        let context = zmq::Context::new();
        let mut transport = ZmqTransport::connect(
            &context,
            &router.url,
            settings(),
            Duration::from_secs(5),
            None,
        )
        .unwrap();
        transport.send(7, &outgoing("one two three four")).unwrap();
        transport.send(8, &outgoing("please FAIL")).unwrap();
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let terminal = |e: &Event| !matches!(e.kind, EventKind::Chunk { .. });
        while events.iter().filter(|e| terminal(e)).count() < 2 && Instant::now() < deadline {
            transport
                .poll(Instant::now() + Duration::from_millis(50), &mut events)
                .unwrap();
        }
        let of = |key| {
            events
                .iter()
                .filter(move |e: &&Event| e.key == key)
                .map(|e| e.kind.clone())
        };
        let first: Vec<EventKind> = of(7).collect();
        assert_eq!(first.len(), 4);
        assert_eq!(first[0], EventKind::Chunk { text: " a".into() });
        let counts = TokenCounts {
            prompt: Some(4),
            completion: 3,
            cached: Some(2),
        };
        assert_eq!(first[3], EventKind::Done { counts });
        assert!(
            events.windows(2).all(|w| w[0].at <= w[1].at),
            "stamped in order"
        );
        let failed: Vec<EventKind> = of(8).collect();
        assert!(matches!(&failed[..], [EventKind::Error { code, .. }] if code == "overloaded"));
        let seen = router.stop();
        assert_eq!(seen.len(), 2);
        let request = &seen[0];
        assert_eq!(
            (request.id.as_str(), request.max_tokens, request.seed),
            ("bench-7", 3, Some(11))
        );
        assert_eq!(
            (
                request.model.as_deref(),
                request.temperature,
                request.stream
            ),
            (Some("smol"), 0.0, true)
        );
    }

    #[test]
    fn a_dropped_router_connection_ends_requests_in_flight_at_once() {
        let context = zmq::Context::new();
        let router = context.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = router.get_last_endpoint().unwrap().unwrap();
        let answer_ping = std::thread::spawn(move || {
            let frames = router.recv_multipart(0).unwrap();
            let pong = encode(&ClientReply::Pong {
                id: Some(format!("{ID_PREFIX}ping")),
            })
            .unwrap();
            router.send_multipart([frames[0].clone(), pong], 0).unwrap();
            router.recv_multipart(0).unwrap();
            // The request arrived; the router goes away without answering.
        });
        let mut transport = ZmqTransport::connect(
            &context,
            &endpoint,
            settings(),
            Duration::from_secs(5),
            None,
        )
        .unwrap();
        transport.send(3, &outgoing("one two")).unwrap();
        answer_ping.join().unwrap();
        let started = Instant::now();
        let mut events = Vec::new();
        while events.is_empty() && started.elapsed() < Duration::from_secs(10) {
            transport
                .poll(Instant::now() + Duration::from_millis(50), &mut events)
                .unwrap();
        }
        assert!(
            matches!(&events[..], [Event { key: 3, kind: EventKind::Error { code, .. }, .. }] if code == "disconnected"),
            "{events:?}"
        );
        assert!(transport.in_flight.is_empty());
    }

    #[test]
    fn a_missing_router_is_reported_at_connect() {
        let context = zmq::Context::new();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        drop(listener);
        let error = ZmqTransport::connect(
            &context,
            &endpoint,
            settings(),
            Duration::from_millis(200),
            None,
        )
        .err()
        .unwrap();
        assert!(
            error.to_string().contains("no answer from a router"),
            "{error}"
        );
    }
}
