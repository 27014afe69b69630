//! The worker's side of its link to the router, free of I/O (the router
//! core's shape): registration, heartbeats, reconnects, drain and stop,
//! load reports and the control replies that go with them.
//!
//! The socket loop feeds it frames from the router (`handle_frame`), what
//! became of the actions it asked for (`handle_register_sent`,
//! `handle_reconnected`, `handle_refused`, `handle_export_ended`), a local
//! stop (`handle_shutdown`) and timer ticks (`handle_tick`), and carries
//! out whatever `poll_action` yields. Time is passed in, so tests drive it
//! with a virtual clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use zinfer_protocol::{
    ControlOp, ErrorCode, GenerateRequest, Limits, LoadReport, RouterToWorker, TextRequest,
    WorkerToRouter,
};

/// How soon an unregistered link tries `ready` again (the connection is
/// not up yet while ZMQ_IMMEDIATE refuses the send).
const REGISTER_RETRY: Duration = Duration::from_millis(10);

/// Settings of the link.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The `ready` message this worker registers with.
    pub ready: WorkerToRouter,
    /// Heartbeat period; 3 periods of router silence trigger a reconnect.
    pub heartbeat: Duration,
    /// Least time between two load checks (a report goes out only when
    /// the load changed).
    pub load_interval: Duration,
    /// Time in-flight requests get to finish after a local stop.
    pub grace: Duration,
    /// Limits on frames from the router.
    pub limits: Limits,
}

/// What the link asks of the socket loop, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this message to the router.
    Send(WorkerToRouter),
    /// Send this `ready`, then tell [`RouterLink::handle_register_sent`]
    /// whether the socket took it.
    Register(WorkerToRouter),
    /// Replace the connection with a fresh one, then call
    /// [`RouterLink::handle_reconnected`] if that worked.
    Reconnect,
    /// Hand the request to the engine; a refusal goes back through
    /// [`RouterLink::handle_refused`].
    Submit {
        /// Router request id.
        rid: u64,
        /// The request as the router sent it (boxed: it is the largest
        /// action by far).
        request: Box<GenerateRequest>,
    },
    /// Answer a text request beside the engine (`tokenize`, `detokenize`,
    /// `apply_template`); it never enters the engine's queue.
    Text {
        /// Router request id.
        rid: u64,
        /// The request.
        request: TextRequest,
    },
    /// Cancel one request in the engine.
    Cancel(u64),
    /// Cancel every request in the engine: the router forgot them.
    CancelAll,
    /// Drop cached prefixes of one namespace, or all.
    FlushCache(Option<String>),
    /// Start exporting the prefix cache; its end goes back through
    /// [`RouterLink::handle_export_ended`].
    StartExport {
        /// Where the replacement takes the cache.
        endpoint: String,
        /// About how many tokens to send.
        max_tokens: u64,
        /// The replacement's import key, for CURVE.
        key: Option<String>,
    },
    /// Stopping is over (idle, or the grace ran out): flush and return.
    Stop,
}

/// What the link reads of the engine, only when it needs it.
pub trait EngineProbe {
    /// No request is running or waiting.
    fn idle(&self) -> bool;
    /// The load to report; read once per load check.
    fn load(&self) -> LoadReport;
}

/// The worker's link state machine.
#[derive(Debug)]
pub struct RouterLink {
    config: LinkConfig,
    actions: VecDeque<Action>,
    last_heard: Instant,
    last_heartbeat: Instant,
    last_load_check: Instant,
    last_load: Option<LoadReport>,
    /// Whether `ready` was taken by the socket since the last (re)connect.
    registered: bool,
    /// A `Register` action waits for its outcome.
    register_pending: bool,
    /// When `ready` was last tried.
    last_register: Option<Instant>,
    /// Takes no new requests.
    draining: bool,
    /// When stopping ends at the latest; `None` while not stopping.
    stop_at: Option<Instant>,
    /// `Stop` was handed out.
    stopped: bool,
    /// A cache export runs.
    exporting: bool,
}

impl RouterLink {
    /// A link that registers at once.
    pub fn new(config: LinkConfig, now: Instant) -> Self {
        let mut link = RouterLink {
            config,
            actions: VecDeque::new(),
            last_heard: now,
            last_heartbeat: now,
            last_load_check: now,
            last_load: None,
            registered: false,
            register_pending: false,
            last_register: None,
            draining: false,
            stop_at: None,
            stopped: false,
            exporting: false,
        };
        link.register(now);
        link
    }

    /// The next thing to do, if any.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Self::handle_tick`] has something to do at the latest.
    #[must_use]
    pub fn poll_timeout(&self) -> Instant {
        let mut at = (self.last_heartbeat + self.config.heartbeat)
            .min(self.last_load_check + self.config.load_interval);
        if let Some(stop_at) = self.stop_at {
            at = at.min(stop_at);
        }
        if !self.registered {
            let retry = self
                .last_register
                .map_or(at, |tried| tried + REGISTER_RETRY);
            at = at.min(retry);
        }
        at
    }

    /// Takes no new requests (drained, or stopping).
    pub fn draining(&self) -> bool {
        self.draining
    }

    /// One frame from the router; an undecodable one still shows the
    /// router is alive.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.last_heard = now;
        match zinfer_protocol::decode::<RouterToWorker>(frame, &self.config.limits) {
            Ok(message) => self.handle_message(now, message),
            Err(error) => tracing::warn!(%error, "undecodable frame from the router"),
        }
    }

    fn handle_message(&mut self, now: Instant, message: RouterToWorker) {
        match message {
            RouterToWorker::Generate { rid, request } => {
                if self.draining {
                    tracing::debug!(rid, id = %request.id, "draining; request refused");
                    self.send(WorkerToRouter::Error {
                        rid,
                        code: ErrorCode::Unavailable,
                        message: "worker is draining and takes no new requests".into(),
                    });
                } else {
                    self.actions.push_back(Action::Submit {
                        rid,
                        request: Box::new(request),
                    });
                }
            }
            RouterToWorker::Tokenize { rid, request } => {
                let request = TextRequest::Tokenize(request);
                self.actions.push_back(Action::Text { rid, request });
            }
            RouterToWorker::Detokenize { rid, request } => {
                let request = TextRequest::Detokenize(request);
                self.actions.push_back(Action::Text { rid, request });
            }
            RouterToWorker::ApplyTemplate { rid, request } => {
                let request = TextRequest::ApplyTemplate(request);
                self.actions.push_back(Action::Text { rid, request });
            }
            RouterToWorker::Cancel { rid } => self.actions.push_back(Action::Cancel(rid)),
            RouterToWorker::Heartbeat {} => {}
            RouterToWorker::Disconnect { reason } => self.handle_disconnect(now, &reason),
            RouterToWorker::Drain {} => {
                self.draining = true;
                self.control_reply(ControlOp::Drain, true, "draining".into());
            }
            RouterToWorker::Resume {} => {
                if self.stop_at.is_none() {
                    self.draining = false;
                }
            }
            RouterToWorker::ExportCache {
                endpoint,
                max_tokens,
                key,
            } => {
                if self.exporting {
                    let message = "an export is already running".to_string();
                    self.control_reply(ControlOp::ExportCache, false, message);
                } else {
                    self.exporting = true;
                    self.actions.push_back(Action::StartExport {
                        endpoint,
                        max_tokens,
                        key,
                    });
                }
            }
            RouterToWorker::Shutdown { grace_ms } => {
                self.control_reply(ControlOp::Shutdown, true, "shutting down".into());
                self.begin_stop(now, Duration::from_millis(grace_ms));
            }
            RouterToWorker::FlushCache { namespace } => {
                self.actions.push_back(Action::FlushCache(namespace));
                self.control_reply(ControlOp::FlushCache, true, "prefix cache flushed".into());
            }
        }
    }

    fn handle_disconnect(&mut self, now: Instant, reason: &str) {
        if self.stop_at.is_some() {
            // Stopping: registering again would only make the router list
            // a worker about to exit.
            tracing::debug!(%reason, "router forgot us while stopping");
            return;
        }
        // Every message sent before our `ready` reached a router that does
        // not know us earns one of these; answering each would register
        // again and again, and the router takes a second `ready` for a
        // restart and loses what it just gave us. Once per heartbeat is
        // enough: if the router still does not know us, our next heartbeat
        // brings another.
        if self
            .last_register
            .is_some_and(|at| now.saturating_duration_since(at) < self.config.heartbeat)
        {
            tracing::debug!(%reason, "router forgot us again; registered just now");
            return;
        }
        // Also how a refused registration (a duplicate id, another protocol
        // version) is explained, so it must be visible.
        tracing::warn!(%reason, "router asked us to register again");
        // A router that does not know us does not know our requests either
        // (it ended or retried them, or it restarted): nobody waits for
        // their output.
        self.actions.push_back(Action::CancelAll);
        self.register(now);
    }

    /// The engine refused a submitted request: the router gets an error.
    pub fn handle_refused(&mut self, rid: u64, code: ErrorCode, message: String) {
        self.send(WorkerToRouter::Error { rid, code, message });
    }

    /// A cache export ended (or could not start).
    pub fn handle_export_ended(&mut self, ok: bool, message: String) {
        self.exporting = false;
        self.control_reply(ControlOp::ExportCache, ok, message);
    }

    /// Whether the socket took the `ready` of the last `Register` action.
    pub fn handle_register_sent(&mut self, sent: bool) {
        self.register_pending = false;
        self.registered = sent;
    }

    /// The `Reconnect` action gave a fresh connection. Requests that came
    /// on the old one are cancelled: their output can no longer reach the
    /// router under the old identity, and a router silent for three
    /// heartbeats has expired us and ended or retried them anyway. (Without
    /// this a worker that reconnected before the router's `disconnect`
    /// arrived kept generating for nobody.)
    pub fn handle_reconnected(&mut self, now: Instant) {
        self.last_heard = now;
        self.actions.push_back(Action::CancelAll);
        self.register(now);
    }

    /// The process was asked to stop: finish in-flight requests within the
    /// configured grace. A second request changes nothing.
    pub fn handle_shutdown(&mut self, now: Instant) {
        if self.stop_at.is_none() {
            self.begin_stop(now, self.config.grace);
        }
    }

    /// Runs the timers: stop once idle or out of grace, retry `ready`,
    /// heartbeat or reconnect, check the load.
    pub fn handle_tick(&mut self, now: Instant, engine: &impl EngineProbe) {
        if self.stopped {
            return;
        }
        if let Some(stop_at) = self.stop_at
            && (now >= stop_at || engine.idle())
        {
            self.stopped = true;
            self.actions.push_back(Action::Stop);
            return;
        }
        if !self.registered && !self.register_pending {
            self.register(now);
        }
        if now.saturating_duration_since(self.last_heartbeat) >= self.config.heartbeat {
            self.last_heartbeat = now;
            if now.saturating_duration_since(self.last_heard) > self.config.heartbeat * 3 {
                tracing::warn!("router silent for 3 heartbeats; reconnecting");
                self.actions.push_back(Action::Reconnect);
            } else {
                self.send(WorkerToRouter::Heartbeat {});
            }
        }
        if now.saturating_duration_since(self.last_load_check) >= self.config.load_interval {
            self.last_load_check = now;
            let load = engine.load();
            if self.last_load != Some(load) {
                self.last_load = Some(load);
                self.send(WorkerToRouter::Load(load));
            }
        }
    }

    /// Queues a message for the router.
    pub fn send(&mut self, message: WorkerToRouter) {
        self.actions.push_back(Action::Send(message));
    }

    fn begin_stop(&mut self, now: Instant, grace: Duration) {
        tracing::info!(?grace, "stopping: finishing in-flight requests");
        self.draining = true;
        self.stop_at = Some(now + grace);
    }

    fn control_reply(&mut self, op: ControlOp, ok: bool, message: String) {
        self.send(WorkerToRouter::ControlReply { op, ok, message });
    }

    fn register(&mut self, now: Instant) {
        self.last_load = None;
        self.last_register = Some(now);
        self.registered = false;
        self.register_pending = true;
        self.actions
            .push_back(Action::Register(self.config.ready.clone()));
    }
}

#[cfg(test)]
mod tests;
