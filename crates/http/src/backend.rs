//! The router connection: one I/O thread owns a DEALER socket (ZeroMQ
//! sockets are not `Sync`) and multiplexes every HTTP request over it by
//! request id. Handlers send commands over a bounded channel and wake the
//! thread through a socket pair that it polls together with the DEALER;
//! replies come back on one bounded channel per request.
//!
//! A dropped router connection loses every request on it: a restarted
//! router knows none of them, and a new connection gets a new identity, so
//! no reply for them can ever arrive. The thread watches the socket's
//! `disconnected` events and ends those requests at once with a retryable
//! `unavailable` instead of leaving them to time out.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc as tmpsc, oneshot};
use zinfer_curve::DropWatch;
use zinfer_protocol::{
    ClientReply, ClientRequest, ErrorCode, GenerateRequest, Limits, ModelInfo, TextRequest,
};

use crate::error::ApiError;

/// Commands waiting for the I/O thread; beyond this, requests get 429.
const COMMAND_QUEUE: usize = 4096;
/// How long a request waits for a router connection (at start-up, or while
/// the router restarts) before it is answered `unavailable`.
const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// A `models` request nobody answered is forgotten after this long.
const MODELS_EXPIRY: Duration = Duration::from_secs(30);
/// What a request in flight gets when the router connection drops.
const CONNECTION_LOST: &str = "the connection to the router dropped (router restarted, \
     network cut, or our CURVE key refused) while this request was in flight; its output is \
     lost: retry it";

enum Command {
    Generate {
        request: Box<GenerateRequest>,
        replies: tmpsc::Sender<ClientReply>,
    },
    /// `tokenize`, `detokenize` or `apply_template`: one reply.
    Text {
        request: Box<TextRequest>,
        replies: tmpsc::Sender<ClientReply>,
    },
    Cancel {
        id: String,
    },
    Models {
        id: String,
        reply: oneshot::Sender<Vec<ModelInfo>>,
    },
    Stop,
}

struct Shared {
    commands: mpsc::SyncSender<Command>,
    waker: UnixStream,
    next_id: AtomicU64,
}

/// A handle on the router connection; cheap to clone, shared by handlers.
#[derive(Clone)]
pub struct RouterClient {
    shared: Arc<Shared>,
}

/// Why a frame did not go to the router.
#[derive(Debug, thiserror::Error)]
enum SendError {
    /// The message could not be encoded.
    #[error(transparent)]
    Encode(#[from] zinfer_protocol::EncodeError),
    /// No router is connected, or its queue is full: the DEALER would
    /// block.
    #[error(
        "the router is not reachable (not connected, or its queue is full); retry with backoff"
    )]
    Unreachable,
    /// libzmq refused the send.
    #[error("{0}")]
    Socket(zmq::Error),
}

/// Why the router connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// ZeroMQ refused the socket or the endpoint.
    #[error("connecting to the router at {endpoint}: {source}")]
    Zmq {
        /// The endpoint.
        endpoint: String,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// CURVE could not be set up on the DEALER.
    #[error("CURVE to the router at {endpoint}: {source}")]
    Curve {
        /// The endpoint.
        endpoint: String,
        /// What went wrong.
        source: zinfer_curve::CurveError,
    },
    /// The wake-up socket pair or the thread could not be created.
    #[error("starting the router I/O thread: {0}")]
    Io(#[from] std::io::Error),
}

impl RouterClient {
    /// Connects a DEALER to `endpoint` and starts the I/O thread. The
    /// connection is made in the background: a router that is not up yet
    /// is reached once it is.
    pub fn connect(endpoint: &str) -> Result<RouterClient, ConnectError> {
        Self::connect_with(endpoint, None)
    }

    /// [`RouterClient::connect`], with CURVE when `curve` is given.
    pub fn connect_with(
        endpoint: &str,
        curve: Option<&zinfer_curve::ClientCurve>,
    ) -> Result<RouterClient, ConnectError> {
        let zmq_error = |source| ConnectError::Zmq {
            endpoint: endpoint.to_string(),
            source,
        };
        let limits = Limits::default();
        let context = zmq::Context::new();
        let socket = context.socket(zmq::DEALER).map_err(zmq_error)?;
        socket.set_linger(0).map_err(zmq_error)?;
        // Queue only on a live connection: with no router connected, a send
        // fails at once (503) instead of waiting for a router to appear.
        socket.set_immediate(true).map_err(zmq_error)?;
        socket
            .set_maxmsgsize(limits.max_frame_bytes as i64)
            .map_err(zmq_error)?;
        zinfer_curve::apply_client(&socket, curve).map_err(|source| ConnectError::Curve {
            endpoint: endpoint.to_string(),
            source,
        })?;
        let watch = DropWatch::new(&context, &socket).map_err(zmq_error)?;
        socket.connect(endpoint).map_err(zmq_error)?;
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let (commands, receiver) = mpsc::sync_channel(COMMAND_QUEUE);
        std::thread::Builder::new()
            .name("http-router-io".into())
            .spawn(move || {
                let _context = context;
                IoThread {
                    socket,
                    watch,
                    wake: wake_rx,
                    commands: receiver,
                    limits,
                    requests: HashMap::new(),
                    models: HashMap::new(),
                    unsent: Vec::new(),
                }
                .run();
            })?;
        Ok(RouterClient {
            shared: Arc::new(Shared {
                commands,
                waker: wake_tx,
                next_id: AtomicU64::new(1),
            }),
        })
    }

    /// A fresh protocol request id.
    pub fn next_id(&self) -> String {
        format!("h-{}", self.shared.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn send(&self, command: Command) -> Result<(), ApiError> {
        match self.shared.commands.try_send(command) {
            Ok(()) => {
                // A full pipe already wakes the thread; nothing else can fail here
                // that the thread's poll timeout would not recover from.
                let _ = (&self.shared.waker).write(&[1]);
                Ok(())
            }
            Err(mpsc::TrySendError::Full(_)) => Err(ApiError::Busy),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(ApiError::ShuttingDown),
        }
    }

    /// Sends `request` (its `id` must come from [`RouterClient::next_id`]).
    /// Dropping the returned [`Pending`] before its terminal reply cancels
    /// the request in the router.
    pub fn generate(&self, request: GenerateRequest) -> Result<Pending, ApiError> {
        // One chunk per token at most, plus the terminal reply: the channel
        // never fills while the handler keeps reading.
        let choices = request.n.max(1);
        let capacity = (request.max_tokens as usize + 2) * choices as usize;
        let (replies, receiver) = tmpsc::channel(capacity);
        let id = request.id.clone();
        self.send(Command::Generate {
            request: Box::new(request),
            replies,
        })?;
        Ok(Pending {
            id,
            replies: receiver,
            client: self.clone(),
            finished: false,
            dones_left: choices,
        })
    }

    /// Sends a text request (its id from [`RouterClient::next_id`]) and
    /// waits up to `timeout` for its one reply: its answer, or the
    /// router's `error` as an [`ApiError`].
    pub async fn text(
        &self,
        request: TextRequest,
        timeout: Duration,
    ) -> Result<ClientReply, ApiError> {
        let model = request.model().map(str::to_string);
        let (replies, receiver) = tmpsc::channel(1);
        let id = request.id().to_string();
        self.send(Command::Text {
            request: Box::new(request),
            replies,
        })?;
        let mut pending = Pending {
            id,
            replies: receiver,
            client: self.clone(),
            finished: false,
            dones_left: 1,
        };
        match pending.next(timeout).await? {
            ClientReply::Error { code, message, .. } => {
                Err(ApiError::from_router(code, message, model.as_deref()))
            }
            reply => Ok(reply),
        }
    }

    /// The models the router serves, with their ready worker counts.
    pub async fn models(&self, timeout: Duration) -> Result<Vec<ModelInfo>, ApiError> {
        let (reply, receiver) = oneshot::channel();
        self.send(Command::Models {
            id: self.next_id(),
            reply,
        })?;
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(models)) => Ok(models),
            // The I/O thread could not send the question.
            Ok(Err(_)) => Err(ApiError::Router {
                code: ErrorCode::Unavailable,
                message: "the router is not reachable".into(),
            }),
            Err(_) => Err(ApiError::RouterTimeout(timeout.as_secs().max(1))),
        }
    }

    /// Stops the I/O thread (requests still waiting get no more replies).
    pub fn shutdown(&self) {
        let _ = self.send(Command::Stop);
    }
}

/// One request in flight: its replies, and a cancel when dropped early.
pub struct Pending {
    id: String,
    replies: tmpsc::Receiver<ClientReply>,
    client: RouterClient,
    finished: bool,
    /// `done`s still to come: one per choice.
    dones_left: u32,
}

impl Pending {
    /// The next reply, waiting at most `timeout` for it. After an `error`,
    /// or the `done` of every choice, the request is finished.
    pub async fn next(&mut self, timeout: Duration) -> Result<ClientReply, ApiError> {
        match tokio::time::timeout(timeout, self.replies.recv()).await {
            Ok(Some(reply)) => {
                match &reply {
                    ClientReply::Done { .. } => {
                        self.dones_left = self.dones_left.saturating_sub(1);
                        self.finished = self.dones_left == 0;
                    }
                    other if other.is_terminal() => self.finished = true,
                    _ => {}
                }
                Ok(reply)
            }
            Ok(None) => {
                self.finished = true;
                Err(ApiError::Router {
                    code: ErrorCode::Internal,
                    message: "the router connection dropped the request".into(),
                })
            }
            Err(_) => Err(ApiError::RouterTimeout(timeout.as_secs().max(1))),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.finished {
            tracing::debug!(id = %self.id, "client went away; cancelling");
            let _ = self.client.send(Command::Cancel {
                id: std::mem::take(&mut self.id),
            });
        }
    }
}

struct IoThread {
    socket: zmq::Socket,
    /// The DEALER's `disconnected` events.
    watch: DropWatch,
    wake: UnixStream,
    commands: mpsc::Receiver<Command>,
    limits: Limits,
    /// Each request's replies, and how many terminal replies it still
    /// gets (a `done` per choice; one for text requests).
    requests: HashMap<String, (tmpsc::Sender<ClientReply>, u32)>,
    models: HashMap<String, (Instant, oneshot::Sender<Vec<ModelInfo>>)>,
    /// Questions that found no router connection, with when they arrived.
    unsent: Vec<(Instant, Unsent)>,
}

/// A question for the router that found no connection yet. It is retried
/// for up to [`CONNECT_WAIT`] after it arrived, so a front started beside
/// its router does not refuse its first requests while the DEALER connects.
enum Unsent {
    Generate(Box<GenerateRequest>, tmpsc::Sender<ClientReply>),
    Text(Box<TextRequest>, tmpsc::Sender<ClientReply>),
    Models(String, oneshot::Sender<Vec<ModelInfo>>),
}

impl IoThread {
    fn run(mut self) {
        loop {
            let mut items = [
                self.socket.as_poll_item(zmq::POLLIN),
                zmq::PollItem::from_fd(self.wake.as_raw_fd(), zmq::POLLIN),
                self.watch.as_poll_item(),
            ];
            let wait = if self.unsent.is_empty() { 1000 } else { 20 };
            if let Err(error) = zmq::poll(&mut items, wait) {
                tracing::error!(%error, "polling the router socket");
                std::thread::sleep(Duration::from_millis(100));
            }
            let dropped = items[2].is_readable();
            let mut buf = [0u8; 256];
            while matches!(self.wake.read(&mut buf), Ok(n) if n > 0) {}
            loop {
                match self.commands.try_recv() {
                    Ok(Command::Stop) | Err(mpsc::TryRecvError::Disconnected) => return,
                    Ok(command) => self.on_command(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                }
            }
            loop {
                match self.socket.recv_bytes(zmq::DONTWAIT) {
                    Ok(frame) => self.on_frame(&frame),
                    Err(zmq::Error::EAGAIN) => break,
                    Err(error) => {
                        tracing::error!(%error, "receiving from the router");
                        break;
                    }
                }
            }
            if dropped && self.watch.dropped() {
                self.end_in_flight();
            }
            for (arrived, unsent) in std::mem::take(&mut self.unsent) {
                self.try_send(arrived, unsent);
            }
            let now = Instant::now();
            self.models
                .retain(|_, (asked, _)| now.duration_since(*asked) < MODELS_EXPIRY);
        }
    }

    /// Ends every request sent on the dropped connection; replies to them
    /// can no longer arrive.
    fn end_in_flight(&mut self) {
        if !self.requests.is_empty() {
            tracing::warn!(
                requests = self.requests.len(),
                "router connection dropped; ending the requests in flight"
            );
        }
        for (id, (replies, _)) in self.requests.drain() {
            let _ = replies.try_send(unavailable(
                id,
                ErrorCode::Unavailable,
                CONNECTION_LOST.to_string(),
            ));
        }
        self.models.clear();
    }

    /// Sends without blocking: with no router connected a DEALER would
    /// block, so that case is reported at once instead.
    fn send(&self, request: &ClientRequest) -> Result<(), SendError> {
        let frame = zinfer_protocol::encode(request)?;
        self.socket
            .send(frame, zmq::DONTWAIT)
            .map_err(|error| match error {
                zmq::Error::EAGAIN => SendError::Unreachable,
                other => SendError::Socket(other),
            })
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Generate { request, replies } => {
                self.try_send(Instant::now(), Unsent::Generate(request, replies));
            }
            Command::Text { request, replies } => {
                self.try_send(Instant::now(), Unsent::Text(request, replies));
            }
            Command::Cancel { id } => {
                if self.requests.remove(&id).is_some()
                    && let Err(error) = self.send(&ClientRequest::Cancel { id })
                {
                    tracing::warn!(%error, "sending cancel to the router");
                }
            }
            Command::Models { id, reply } => {
                self.try_send(Instant::now(), Unsent::Models(id, reply));
            }
            Command::Stop => {}
        }
    }

    /// Sends a question, or keeps it for the next round while no router is
    /// connected, up to [`CONNECT_WAIT`] after it arrived. A question whose
    /// asker went away is dropped.
    fn try_send(&mut self, arrived: Instant, unsent: Unsent) {
        let request = match &unsent {
            Unsent::Generate(_, replies) | Unsent::Text(_, replies) if replies.is_closed() => {
                return;
            }
            Unsent::Models(_, reply) if reply.is_closed() => return,
            Unsent::Generate(request, _) => ClientRequest::Generate((**request).clone()),
            Unsent::Text(request, _) => client_request(request),
            Unsent::Models(id, _) => ClientRequest::Models {
                id: Some(id.clone()),
            },
        };
        // Err(None): not connected yet, keep it; Err(Some(..)): give up.
        let sent = self.send(&request).map_err(|error| match error {
            SendError::Unreachable if arrived.elapsed() < CONNECT_WAIT => None,
            SendError::Encode(_) => Some((ErrorCode::Internal, error.to_string())),
            SendError::Unreachable | SendError::Socket(_) => {
                Some((ErrorCode::Unavailable, error.to_string()))
            }
        });
        match (sent, unsent) {
            (Ok(()), Unsent::Generate(request, replies)) => {
                self.requests
                    .insert(request.id.clone(), (replies, request.n.max(1)));
            }
            (Ok(()), Unsent::Text(request, replies)) => {
                self.requests.insert(request.id().to_string(), (replies, 1));
            }
            (Ok(()), Unsent::Models(id, reply)) => {
                self.models.insert(id, (Instant::now(), reply));
            }
            (Err(None), unsent) => self.unsent.push((arrived, unsent)),
            (Err(Some((code, message))), Unsent::Generate(request, replies)) => {
                let _ = replies.try_send(unavailable(request.id.clone(), code, message));
            }
            (Err(Some((code, message))), Unsent::Text(request, replies)) => {
                let _ = replies.try_send(unavailable(request.id().to_string(), code, message));
            }
            // `reply` drops: the caller sees the router as unreachable.
            (Err(Some(_)), Unsent::Models(..)) => {}
        }
    }

    fn on_frame(&mut self, frame: &[u8]) {
        let reply = match zinfer_protocol::decode::<ClientReply>(frame, &self.limits) {
            Ok(reply) => reply,
            Err(error) => {
                tracing::warn!(%error, "unreadable reply from the router");
                return;
            }
        };
        match &reply {
            ClientReply::Chunk { id, .. } => {
                let delivered = self
                    .requests
                    .get(id)
                    .map(|(replies, _)| replies.try_send(reply.clone()).is_ok());
                if delivered == Some(false) {
                    // The handler is gone (or stopped reading): cancel.
                    let id = id.clone();
                    self.requests.remove(&id);
                    let _ = self.send(&ClientRequest::Cancel { id });
                }
            }
            ClientReply::Done { id, .. } => {
                // A choice ended; the request ends with the last one.
                if let Some((replies, left)) = self.requests.get_mut(id) {
                    *left = left.saturating_sub(1);
                    let _ = replies.try_send(reply.clone());
                    if *left == 0 {
                        self.requests.remove(id);
                    }
                }
            }
            ClientReply::Error { id: Some(id), .. }
            | ClientReply::Tokenized { id, .. }
            | ClientReply::Detokenized { id, .. }
            | ClientReply::AppliedTemplate { id, .. }
            | ClientReply::Embedding { id, .. } => {
                if let Some((replies, _)) = self.requests.remove(id) {
                    let _ = replies.try_send(reply);
                }
            }
            ClientReply::Error {
                id: None, message, ..
            } => {
                tracing::error!(%message, "the router could not read a frame of ours");
            }
            ClientReply::Models {
                id: Some(id),
                models,
            } => {
                if let Some((_, answer)) = self.models.remove(id) {
                    let _ = answer.send(models.clone());
                }
            }
            ClientReply::Models { id: None, .. } | ClientReply::Pong { .. } => {}
        }
    }
}

/// The client message of a text request.
fn client_request(request: &TextRequest) -> ClientRequest {
    match request.clone() {
        TextRequest::Tokenize(r) => ClientRequest::Tokenize(r),
        TextRequest::Detokenize(r) => ClientRequest::Detokenize(r),
        TextRequest::ApplyTemplate(r) => ClientRequest::ApplyTemplate(r),
    }
}

/// The terminal error of a request that could not be sent.
fn unavailable(id: String, code: ErrorCode, message: String) -> ClientReply {
    ClientReply::Error {
        id: Some(id),
        code,
        message,
        retryable: code.retryable(),
    }
}
