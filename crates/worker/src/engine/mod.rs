//! The engine thread: owns the model, the KV pool, the radix cache and the
//! scheduler outright, so no request ever waits on a lock held during a
//! forward pass.
//!
//! The worker's socket loop talks to it through an [`EngineHandle`]:
//! [`EngineHandle::submit`] validates and tokenizes on the caller's thread
//! and queues the request on a bounded channel (a full one answers
//! `overloaded` at once); the engine streams [`EngineEvent`]s back on another
//! bounded channel, mirroring the `chunk` / `done` / `error` messages of the
//! protocol. Every accepted request gets exactly one terminal event.

mod choices;
mod clock;
mod draft;
mod handle;
mod reply;
mod run;
#[cfg(test)]
pub(crate) mod tests;
mod transfer;
mod valid;

use std::sync::Arc;

use zinfer_cache::CacheConfig;
use zinfer_model::{ForwardModel, LoadedModel, ModelError};
use zinfer_protocol::{ChunkBody, DoneBody, ErrorCode, FinishReason, Limits, WorkerToRouter};
use zinfer_text::detokenize::DetokenizeError;
use zinfer_text::{ModelTokenizer, TextError};

use crate::constraint::Grammars;
use crate::sampling::SamplingError;
use crate::scheduler::{SchedulerConfig, SchedulerError};

pub use clock::{Clock, VirtualClock};
pub use handle::EngineHandle;
pub use transfer::CacheBlock;
pub use valid::ValidRequest;
pub use zinfer_text::TextCodec;

/// Settings of one engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Batching and admission.
    pub scheduler: SchedulerConfig,
    /// Radix cache eviction policy and page size.
    pub cache: CacheConfig,
    /// Most requests accepted and not yet ended (queued, waiting or
    /// running); beyond it `submit` answers `overloaded` at once.
    pub max_requests: usize,
    /// Commands (submits, cancels, flushes) queued between the handle and
    /// the engine thread; a full queue also answers `overloaded`.
    pub queue_capacity: usize,
    /// Events buffered for the socket loop; a full buffer pauses the engine.
    pub event_capacity: usize,
    /// Limits every request is validated against.
    pub limits: Limits,
    /// Where arrival times, deadlines and timings are read.
    pub clock: Clock,
    /// Seeds the engine's generator of sampling seeds for requests that
    /// name none; `None`: a random seed at start-up.
    pub seed: Option<u64>,
    /// Speculative decoding of requests that do not ask for it themselves
    /// (off by default).
    pub speculative: zinfer_protocol::Speculative,
    /// The model's classification head when it is a reranker: what
    /// `rank` pooling applies to a prompt's last hidden state. Without it
    /// such requests are refused.
    pub classifier: Option<Arc<zinfer_model::Classifier>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            scheduler: SchedulerConfig::default(),
            cache: CacheConfig::default(),
            max_requests: 1024,
            queue_capacity: 2048,
            event_capacity: 4096,
            limits: Limits::default(),
            clock: Clock::System,
            seed: None,
            speculative: zinfer_protocol::Speculative::OFF,
            classifier: None,
        }
    }
}

/// What the engine reports about one request; maps 1:1 onto the
/// `chunk` / `done` / `error` messages of `WorkerToRouter`.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// New output of a streamed request.
    Chunk {
        /// Router request id.
        rid: u64,
        /// The output, sent to the router as is.
        body: ChunkBody,
    },
    /// The request (or, with `n`, one of its choices) finished; the
    /// request's last `Done` is terminal.
    Done {
        /// Router request id.
        rid: u64,
        /// How it ended, sent to the router as is.
        body: DoneBody,
    },
    /// The request failed; terminal.
    Error {
        /// Router request id.
        rid: u64,
        /// Stable error code.
        code: ErrorCode,
        /// For a person.
        message: String,
    },
}

impl EngineEvent {
    /// The request the event belongs to.
    pub fn rid(&self) -> u64 {
        match self {
            EngineEvent::Chunk { rid, .. }
            | EngineEvent::Done { rid, .. }
            | EngineEvent::Error { rid, .. } => *rid,
        }
    }

    /// Whether this ends its choice: the request, unless it asked for
    /// `n` > 1 (then its last `Done` does).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, EngineEvent::Chunk { .. })
    }
}

/// The protocol message an event becomes: the bodies pass through whole.
impl From<EngineEvent> for WorkerToRouter {
    fn from(event: EngineEvent) -> Self {
        match event {
            EngineEvent::Chunk { rid, body } => WorkerToRouter::Chunk { rid, body },
            EngineEvent::Done { rid, body } => WorkerToRouter::Done { rid, body },
            EngineEvent::Error { rid, code, message } => {
                WorkerToRouter::Error { rid, code, message }
            }
        }
    }
}

/// Why `submit` refused a request; no event follows a refusal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The request is malformed or names an impossible token.
    #[error("{0}")]
    BadRequest(String),
    /// The prompt does not fit the KV pool.
    #[error(
        "prompt of {prompt} tokens does not fit this worker, which holds at most {capacity} \
         tokens per sequence (KV pool and context length); shorten the prompt"
    )]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Pool capacity.
        capacity: usize,
    },
    /// The engine holds as many requests as it may.
    #[error("engine is full ({0} requests in flight or queued); retry with backoff")]
    Overloaded(usize),
    /// This rid is still in flight.
    #[error("request id {0} is already in flight; use a fresh id")]
    DuplicateRid(u64),
    /// The engine thread has stopped.
    #[error("the engine has stopped; restart the worker")]
    Stopped,
    /// Tokenizing or templating failed: a fault of the worker's model
    /// files, so the client sees only [`INTERNAL_MESSAGE`].
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
}

/// What a client is told about a fault inside the worker; the detail goes
/// to the worker's log, with the request's ids.
pub const INTERNAL_MESSAGE: &str =
    "internal error in the worker; its log has the details under this request's id";

/// A fault inside the worker that ends an accepted request: the client
/// gets `internal` and [`INTERNAL_MESSAGE`]; this goes to the log.
#[derive(Debug, thiserror::Error)]
pub enum InternalError {
    /// The forward pass failed.
    #[error("forward pass failed: {0}")]
    Forward(#[from] ModelError),
    /// The model returned the wrong number of logit rows.
    #[error("the model returned {rows} logit rows for {chunks} chunks")]
    LogitRows {
        /// Rows returned.
        rows: usize,
        /// Chunks in the batch.
        chunks: usize,
    },
    /// The scheduler planned a chunk it cannot show (a bug).
    #[error("the scheduler planned a chunk it cannot show (bug)")]
    MissingChunk,
    /// The scheduler refused an operation it should have taken (a bug).
    #[error("scheduler: {0}")]
    Scheduler(#[from] SchedulerError),
    /// No token could be drawn from the logits.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The output could not be turned into text.
    #[error(transparent)]
    Detokenize(#[from] DetokenizeError),
    /// A token's text for its logprobs entry could not be decoded.
    #[error("cannot decode token {token} for logprobs: {source}")]
    LogprobText {
        /// The token.
        token: u32,
        /// Why.
        source: TextError,
    },
    /// The sampler computed no log probabilities for a request that asked
    /// for them (a bug).
    #[error("the sampler computed no log probabilities (bug)")]
    NoLogprobs,
}

impl EngineError {
    /// The protocol error code for this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            EngineError::BadRequest(_) | EngineError::DuplicateRid(_) => ErrorCode::BadRequest,
            EngineError::PromptTooLong { .. } => ErrorCode::PromptTooLong,
            EngineError::Overloaded(_) => ErrorCode::Overloaded,
            EngineError::Stopped => ErrorCode::Unavailable,
            EngineError::Tokenizer(_) => ErrorCode::Internal,
        }
    }

    /// What the client is told: the whole story for its own mistakes and
    /// for load, [`INTERNAL_MESSAGE`] for faults of the worker (the caller
    /// logs those).
    pub fn client_message(&self) -> String {
        match self.code() {
            ErrorCode::Internal => INTERNAL_MESSAGE.to_string(),
            _ => self.to_string(),
        }
    }
}

/// A latency series: enough for a mean and a maximum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Sum of samples, seconds.
    pub sum_s: f64,
    /// Largest sample, seconds.
    pub max_s: f64,
}

impl LatencySummary {
    fn record(&mut self, seconds: f64) {
        self.count += 1;
        self.sum_s += seconds;
        self.max_s = self.max_s.max(seconds);
    }

    /// Mean in seconds, 0 with no samples.
    pub fn mean_s(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_s / self.count as f64
        }
    }
}

/// The engine's own measures, refreshed after every step; for load
/// reports, metrics and `zinfer ctl`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Sequences in the running batch.
    pub running: usize,
    /// Requests waiting for admission (queued in the channel included).
    pub waiting: usize,
    /// KV pool capacity in tokens.
    pub kv_capacity: usize,
    /// Slots in use (running sequences and prefix cache).
    pub kv_used: usize,
    /// Free slots.
    pub kv_free: usize,
    /// Slots held by the prefix cache.
    pub kv_cached: usize,
    /// Prompt tokens served from the prefix cache since start.
    pub cache_hit_tokens: u64,
    /// Prompt tokens looked up in the prefix cache since start.
    pub cache_query_tokens: u64,
    /// Sequences preempted for lack of slots since start.
    pub preemptions: u64,
    /// Requests accepted by `submit`.
    pub requests_accepted: u64,
    /// Requests ended with `done`, by finish reason in the order of
    /// [`FinishReason::ALL`]: stop, length, cancelled, deadline, tool calls.
    pub requests_done: [u64; FinishReason::ALL.len()],
    /// Requests ended with `error`.
    pub requests_failed: u64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Prompt tokens of finished requests served from the cache.
    pub cached_tokens: u64,
    /// Forward steps run.
    pub steps: u64,
    /// Tokens fed to the model in prefill chunks (uncached prompt).
    pub prefill_tokens: u64,
    /// Draft tokens fed for verification (speculative decoding).
    pub draft_tokens: u64,
    /// Draft tokens the model agreed with: each saved a decode step.
    pub accepted_draft_tokens: u64,
    /// Time spent in forward passes, seconds.
    pub forward_s: f64,
    /// Time spent in whole steps (scheduling, forward, sampling, text,
    /// events), seconds; minus `forward_s` it is the engine's overhead.
    /// Its phases `plan_s`, `draft_s`, `forward_s`, `sample_s` and `rest_s`
    /// split it: each moment of a step is charged to one, so they add up to
    /// at most this.
    pub step_s: f64,
    /// Phase of the steps spent in the scheduler, seconds: planning the
    /// step, laying out its [`zinfer_model::StepBatch`], recording its
    /// results.
    pub plan_s: f64,
    /// Phase of the steps spent in the draft model, seconds (speculative
    /// decoding with `--draft-model`).
    pub draft_s: f64,
    /// Phase of the steps spent sampling, seconds: handing out and waiting
    /// for constraint masks, applying them, and the samplers.
    pub sample_s: f64,
    /// The rest of the steps, seconds: admissions, reading prompt rows
    /// (prompt logprobs, embeddings), stop checks, detokenizing and events.
    pub rest_s: f64,
    /// Time the mask thread spent computing constrained requests' token
    /// masks, seconds (mostly hidden behind forward passes).
    pub mask_s: f64,
    /// Time the step loop waited for masks after its forward pass, seconds:
    /// what constrained decoding added to the steps.
    pub mask_wait_s: f64,
    /// Submission to admission.
    pub queue_time: LatencySummary,
    /// Admission to first token.
    pub prefill_time: LatencySummary,
    /// Submission to first token.
    pub ttft: LatencySummary,
    /// Time between consecutive tokens of one request.
    pub inter_token: LatencySummary,
    /// Tokens of K/V sent by cache exports (migrations from this engine).
    pub cache_exported_tokens: u64,
    /// Tokens of K/V imported into the prefix cache (migrations to it).
    pub cache_imported_tokens: u64,
    /// Imported tokens not cached: K/V of another shape, a prefix missing,
    /// or too few free slots. Tokens already cached count in neither.
    pub cache_import_skipped_tokens: u64,
    /// Imported spans taken up, kept or skipped: the transport compares it
    /// with the spans it handed over to know the import has settled.
    pub cache_import_spans: u64,
}

/// Why a draft model cannot serve beside a model.
#[derive(Debug, thiserror::Error)]
pub enum DraftModelError {
    /// Its vocabulary or special tokens differ.
    #[error(
        "the draft model {draft} has another tokenizer than {model}; \
         use a draft model of the same family (same vocabulary)"
    )]
    OtherTokenizer {
        /// The served model.
        model: String,
        /// The draft model.
        draft: String,
    },
    /// The model keeps a recurrent state per sequence (a hybrid model),
    /// which rejected draft tokens cannot be rolled back from.
    #[error(
        "{model} keeps a recurrent state per sequence (Gated DeltaNet layers): \
         speculative decoding with a draft model is not supported for it; serve it without --draft-model"
    )]
    Recurrent {
        /// The served model.
        model: String,
    },
}

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Starts the engine thread for a loaded model and its tokenizer.
    pub fn start(
        loaded: LoadedModel,
        tokenizer: ModelTokenizer,
        config: EngineConfig,
    ) -> EngineHandle {
        Engine::start_with(loaded.name, loaded.model, Arc::new(tokenizer), config)
    }

    /// Starts the engine thread for a loaded model and a draft model that
    /// proposes tokens for speculative decoding. Refuses a draft model
    /// whose tokenizer differs from the model's: its token ids would mean
    /// other text.
    pub fn start_with_draft(
        loaded: LoadedModel,
        tokenizer: ModelTokenizer,
        draft: LoadedModel,
        draft_tokenizer: &ModelTokenizer,
        config: EngineConfig,
    ) -> Result<EngineHandle, DraftModelError> {
        if loaded.model.recurrent() {
            return Err(DraftModelError::Recurrent { model: loaded.name });
        }
        let same = loaded.model.vocab_size() == draft.model.vocab_size()
            && tokenizer.eos_token_ids() == draft_tokenizer.eos_token_ids()
            && tokenizer.token_bytes().ok() == draft_tokenizer.token_bytes().ok();
        if !same {
            return Err(DraftModelError::OtherTokenizer {
                model: loaded.name,
                draft: draft.name,
            });
        }
        Ok(Engine::start_inner(
            loaded.name,
            loaded.model,
            Some(draft.model),
            Arc::new(tokenizer),
            config,
        ))
    }

    /// Starts the engine thread for any forward pass and text codec (a
    /// model from elsewhere, or fakes in tests).
    pub fn start_with(
        name: String,
        model: Box<dyn ForwardModel + Send>,
        text: Arc<dyn TextCodec>,
        config: EngineConfig,
    ) -> EngineHandle {
        Engine::start_inner(name, model, None, text, config)
    }

    fn start_inner(
        name: String,
        model: Box<dyn ForwardModel + Send>,
        draft: Option<Box<dyn ForwardModel + Send>>,
        text: Arc<dyn TextCodec>,
        config: EngineConfig,
    ) -> EngineHandle {
        let (command_tx, command_rx) = crossbeam_channel::bounded(config.queue_capacity.max(1));
        let (event_tx, event_rx) = crossbeam_channel::bounded(config.event_capacity.max(1));
        let shared = Arc::new(handle::Shared::default());
        // Once per model: the token trie and llguidance's parser factory.
        let grammars = Arc::new(Grammars::new(text.token_bytes(), text.eos_token_ids()));
        let info = handle::ModelFacts {
            name,
            vocab_size: model.vocab_size(),
            // What a sequence's tokens can have: the pool less the slots
            // its recurrent state holds (none for most models).
            kv_capacity: model.kv_capacity().saturating_sub(model.state_slots()),
            max_positions: model.max_positions(),
            kv_shape: model.kv_shape(),
        };
        let engine = run::EngineLoop::new(
            model,
            draft,
            Arc::clone(&text),
            &config,
            command_rx,
            event_tx,
            Arc::clone(&shared),
        );
        let thread = std::thread::Builder::new()
            .name("zinfer-engine".into())
            .spawn(move || engine.run())
            .map_err(|error| tracing::error!(%error, "cannot start the engine thread"))
            .ok();
        EngineHandle {
            commands: command_tx,
            events: event_rx,
            shared,
            text,
            grammars,
            info,
            config,
            thread,
        }
    }
}
