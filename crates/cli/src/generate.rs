//! `zinfer generate`: one request to a running router, streamed to stdout.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use zinfer_protocol::{
    ChatMessage, ChunkBody, ClientReply, ClientRequest, DoneBody, GenerateRequest, Limits,
};

use crate::zmq_util;

/// Flags of `zinfer generate`.
#[derive(Debug, clap::Args)]
pub(crate) struct GenerateArgs {
    /// The prompt text. With --chat it is sent as one user message and the
    /// model's chat template is applied; otherwise it is completed as is.
    prompt: String,
    /// Router client endpoint.
    #[arg(long, default_value = "tcp://127.0.0.1:5555", env = "ZINFER_ROUTER")]
    router: String,
    #[command(flatten)]
    curve: zmq_util::CurveArgs,
    /// Send the prompt as a chat message (uses the model's chat template).
    #[arg(long, env = "ZINFER_CHAT")]
    chat: bool,
    /// System message to put before the prompt (implies --chat).
    #[arg(long, env = "ZINFER_SYSTEM")]
    system: Option<String>,
    /// Model name; the router's only model when left out.
    #[arg(long, env = "ZINFER_REQUEST_MODEL")]
    model: Option<String>,
    /// Prefix-cache namespace (tenant); namespaces never share cached prefixes.
    #[arg(long, env = "ZINFER_NAMESPACE")]
    namespace: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128, env = "ZINFER_MAX_TOKENS")]
    max_tokens: u32,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.7, env = "ZINFER_TEMPERATURE")]
    temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens with this much probability.
    #[arg(long, default_value_t = 1.0, env = "ZINFER_TOP_P")]
    top_p: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0, env = "ZINFER_TOP_K")]
    top_k: u32,
    /// Drop tokens less likely than min_p times the most likely one (0: off).
    #[arg(long, default_value_t = 0.0, env = "ZINFER_MIN_P")]
    min_p: f32,
    /// Penalize tokens already seen (1.0: off).
    #[arg(long, default_value_t = 1.0, env = "ZINFER_REPETITION_PENALTY")]
    repetition_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long, env = "ZINFER_SEED")]
    seed: Option<u64>,
    /// Stop string (repeatable); the output ends before it.
    #[arg(long, env = "ZINFER_STOP")]
    stop: Vec<String>,
    /// Wait for the whole answer instead of streaming it.
    #[arg(long, env = "ZINFER_NO_STREAM")]
    no_stream: bool,
    /// Print the final `done` record as one JSON line after the text.
    #[arg(long, env = "ZINFER_JSON")]
    json: bool,
    /// Give up after this many seconds without a reply.
    #[arg(long, default_value_t = 120.0, env = "ZINFER_TIMEOUT")]
    timeout: f64,
    /// Seconds to wait for the router to answer a ping before sending the
    /// request; no answer means no router is listening at --router.
    #[arg(long, default_value_t = 3.0, env = "ZINFER_CONNECT_TIMEOUT")]
    connect_timeout: f64,
}

impl GenerateArgs {
    fn request(&self) -> GenerateRequest {
        let mut request = GenerateRequest::from_prompt("cli-1", self.prompt.clone());
        if self.chat || self.system.is_some() {
            request.prompt = None;
            let mut messages = Vec::new();
            if let Some(system) = &self.system {
                messages.push(ChatMessage::new("system", system.clone()));
            }
            messages.push(ChatMessage::new("user", self.prompt.clone()));
            request.messages = Some(messages);
        }
        request.model = self.model.clone();
        request.namespace = self.namespace.clone();
        request.max_tokens = self.max_tokens;
        request.temperature = self.temperature;
        request.top_p = self.top_p;
        request.top_k = self.top_k;
        request.min_p = self.min_p;
        request.repetition_penalty = self.repetition_penalty;
        request.seed = self.seed;
        request.stop = self.stop.clone();
        request.stream = !self.no_stream;
        request
    }
}

/// Sends one generate request and prints the answer as it streams.
pub(crate) fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let request = args.request();
    let context = zmq::Context::new();
    let curve = args.curve.load()?;
    let (socket, watch) = zmq_util::watched_client_socket(&context, &args.router, curve.as_ref())?;
    zmq_util::ping(
        &socket,
        &args.router,
        Duration::from_secs_f64(args.connect_timeout.max(0.001)),
    )?;
    let frame = zinfer_protocol::encode(&ClientRequest::Generate(request))?;
    socket
        .send(frame, 0)
        .context("sending the request to the router")?;

    let deadline = Duration::from_secs_f64(args.timeout.max(0.001));
    let mut last_reply = Instant::now();
    let limits = Limits::default();
    let mut stdout = std::io::stdout().lock();
    loop {
        let remaining = deadline.saturating_sub(last_reply.elapsed());
        if remaining.is_zero() {
            bail!(
                "no reply from the router at {} for {:.0} s; is `zinfer serve` (or `zinfer router` plus a worker) running?",
                args.router,
                args.timeout
            );
        }
        let mut items = [socket.as_poll_item(zmq::POLLIN), watch.as_poll_item()];
        zmq::poll(&mut items, remaining.as_millis().max(1) as i64)?;
        if items[1].is_readable() && watch.dropped() {
            bail!(
                "the connection to the router at {} dropped before the answer ended; \
                 the request is lost (run it again once the router is back)",
                args.router
            );
        }
        if !items[0].is_readable() {
            continue;
        }
        let frame = socket.recv_bytes(0)?;
        last_reply = Instant::now();
        match zinfer_protocol::decode::<ClientReply>(&frame, &limits)? {
            ClientReply::Chunk {
                body: ChunkBody { text, .. },
                ..
            } => {
                stdout.write_all(text.as_bytes())?;
                stdout.flush()?;
            }
            done @ ClientReply::Done { .. } => {
                if let ClientReply::Done {
                    body:
                        DoneBody {
                            text: Some(text), ..
                        },
                    ..
                } = &done
                {
                    stdout.write_all(text.as_bytes())?;
                }
                writeln!(stdout)?;
                if args.json {
                    writeln!(stdout, "{}", serde_json::to_string(&done)?)?;
                }
                return Ok(());
            }
            ClientReply::Error {
                code,
                message,
                retryable,
                ..
            } => {
                let hint = if retryable { " (retryable)" } else { "" };
                bail!("router answered {code}{hint}: {message}");
            }
            ClientReply::Models { .. }
            | ClientReply::Pong { .. }
            | ClientReply::Tokenized { .. }
            | ClientReply::Detokenized { .. }
            | ClientReply::AppliedTemplate { .. }
            | ClientReply::Embedding { .. } => {}
        }
    }
}
