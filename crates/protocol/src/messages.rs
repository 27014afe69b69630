//! Every v1 message, grouped by the socket direction it travels in.

use serde::{Deserialize, Serialize};

use crate::chat::{ChatMessage, ToolCall};
use crate::ids::{RequestId, RouterRequestId};
use crate::text::{ApplyTemplateRequest, DetokenizeRequest, Piece, TextRequest, TokenizeRequest};

fn default_max_tokens() -> u32 {
    128
}
fn default_one() -> f32 {
    1.0
}
fn default_true() -> bool {
    true
}
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}
fn is_true(value: &bool) -> bool {
    *value
}
fn default_n() -> u32 {
    1
}
fn is_one(value: &u32) -> bool {
    *value == 1
}
fn nil_is_n<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    Ok(Option::deserialize(deserializer)?.unwrap_or_else(default_n))
}

/// `nil` in an optional field means the field is absent, so it takes its
/// default. These read the field as an `Option` and fill `None` in.
fn nil_is_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
fn nil_is_max_tokens<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    Ok(Option::deserialize(deserializer)?.unwrap_or_else(default_max_tokens))
}
fn nil_is_one<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f32, D::Error> {
    Ok(Option::deserialize(deserializer)?.unwrap_or_else(default_one))
}
fn nil_is_true<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::deserialize(deserializer)?.unwrap_or_else(default_true))
}

/// `generate`: ask for a completion of exactly one of `prompt`, `messages`
/// or `tokens`. Sampling fields left out take the defaults documented here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Client request id, echoed on every reply for this request.
    pub id: RequestId,
    /// Raw prompt text, tokenized as is (no chat template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Chat turns, rendered with the model's chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// Pre-tokenized prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
    /// Model name; the router's only model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Prefix-cache namespace (tenant, LoRA adapter). Requests in different
    /// namespaces never share cached prefixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Most tokens to generate (default 128).
    #[serde(default = "default_max_tokens", deserialize_with = "nil_is_max_tokens")]
    pub max_tokens: u32,
    /// Softmax temperature; 0 means greedy (default 1.0).
    #[serde(default = "default_one", deserialize_with = "nil_is_one")]
    pub temperature: f32,
    /// Nucleus sampling mass (default 1.0, off).
    #[serde(default = "default_one", deserialize_with = "nil_is_one")]
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 is off (default 0).
    #[serde(default, deserialize_with = "nil_is_default")]
    pub top_k: u32,
    /// Drop tokens below `min_p` times the top probability (default 0, off).
    #[serde(default, deserialize_with = "nil_is_default")]
    pub min_p: f32,
    /// Penalty for tokens already in prompt or output (default 1.0, off).
    #[serde(default = "default_one", deserialize_with = "nil_is_one")]
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty: subtracted once from the logit of every
    /// token already generated (-2 to 2; default 0, off).
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted from a token's logit once per
    /// time it was generated (-2 to 2; default 0, off).
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens, OpenAI's way: token ids as
    /// decimal strings, biases from -100 to 100 (default none).
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "std::collections::BTreeMap::is_empty"
    )]
    pub logit_bias: std::collections::BTreeMap<String, f32>,
    /// Seed for sampling: same seed, parameters and prompt give the same tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop strings; the output ends before the first one and never shows
    /// any part of it.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub stop: Vec<String>,
    /// Token ids that end generation (in addition to the model's EOS).
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the model's end-of-sequence token until
    /// `max_tokens` (default false); for benchmarks with fixed output lengths.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub ignore_eos: bool,
    /// Stream `chunk` messages (default true); otherwise only `done`,
    /// carrying the full text.
    #[serde(default = "default_true", deserialize_with = "nil_is_true")]
    pub stream: bool,
    /// Higher runs first when requests wait (default 0).
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub priority: i32,
    /// Give up after this many milliseconds from arrival at the router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Report each generated token's log probability in `chunk` (or, not
    /// streamed, in `done`); default false.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub logprobs: bool,
    /// With `logprobs`, also report this many most likely tokens at each
    /// position (0 to 20; default 0).
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub top_logprobs: u32,
    /// Constrains the output to a JSON schema, any JSON object, a regex or
    /// a Lark grammar; absent: unconstrained. Boxed: rare, and large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Box<crate::Constraint>>,
    /// Functions the model may call; needs `messages`. The chat template
    /// shows them to the model, and calls in the output come back as
    /// `tool_calls` instead of text.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tools: Vec<crate::Tool>,
    /// Whether the model calls a tool (default `auto`); `required` and a
    /// named function are enforced with a constraint built from the tools'
    /// schemas.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub tool_choice: crate::ToolChoice,
    /// Whether the model may make more than one call (default true).
    #[serde(
        default = "default_true",
        deserialize_with = "nil_is_true",
        skip_serializing_if = "is_true"
    )]
    pub parallel_tool_calls: bool,
    /// Compute the prompt only and return its embedding (the final hidden
    /// states pooled this way, L2-normalised) on `done`; needs
    /// `max_tokens` 0. What an `embed` runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embed: Option<crate::Pooling>,
    /// With `embed` `rank`: the document the `prompt` (the query) is
    /// scored against; the worker makes the pair the model's rerank prompt
    /// (its `tokenizer.chat_template.rerank`, as llama-server does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<String>,
    /// Report the log probability of every prompt token under the model,
    /// with this many most likely alternatives at each position (0 to 20);
    /// absent: off. They come on the request's first `done`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<u32>,
    /// Independent completions of the prompt (default 1, at most 16): the
    /// prompt is computed once and shared; choice `i` samples with the
    /// request's seed mixed with `i` (choice 0 with the seed itself). Each
    /// choice streams its `chunk`s and ends with its own `done`, both
    /// carrying `choice`; the request ends with the last of them.
    #[serde(
        default = "default_n",
        deserialize_with = "nil_is_n",
        skip_serializing_if = "is_one"
    )]
    pub n: u32,
    /// Extra chat template variables, such as `enable_thinking: false`.
    /// Boxed: rare, and a map is large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<Box<serde_json::Map<String, serde_json::Value>>>,
    /// Prompt-lookup speculative decoding for this request; absent: the
    /// worker's default (off unless the worker was started with it).
    /// Requests with a `constraint` (or forced tool calls) never speculate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<crate::Speculative>,
    /// How long the model stays loaded after this request, for a model
    /// the router loads on demand: seconds, or a string such as `"5m"`;
    /// negative keeps it loaded, 0 unloads it when idle. Absent: the
    /// model's default. Ignored for models started by `scale`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive: Option<crate::KeepAlive>,
}

impl GenerateRequest {
    /// A request for `prompt` with every other field at its default.
    pub fn from_prompt(id: impl Into<String>, prompt: impl Into<String>) -> Self {
        GenerateRequest {
            id: id.into(),
            prompt: Some(prompt.into()),
            messages: None,
            tokens: None,
            model: None,
            namespace: None,
            max_tokens: default_max_tokens(),
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: std::collections::BTreeMap::new(),
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            stream: true,
            priority: 0,
            deadline_ms: None,
            logprobs: false,
            top_logprobs: 0,
            constraint: None,
            tools: Vec::new(),
            tool_choice: crate::ToolChoice::Auto,
            parallel_tool_calls: true,
            chat_template_kwargs: None,
            n: 1,
            prompt_logprobs: None,
            embed: None,
            document: None,
            speculative: None,
            keep_alive: None,
        }
    }
}

/// A likely token at one output position, with its log probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// Token id.
    pub token: u32,
    /// The token's text: the tokenizer's decoding of this id alone.
    pub text: String,
    /// Natural log of its probability (see [`TokenLogprob::logprob`]).
    pub logprob: f32,
}

/// One generated token with its log probability and, when asked for, the
/// most likely tokens at its position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The generated token id (the same as in `tokens`).
    pub token: u32,
    /// The token's text: the tokenizer's decoding of this id alone (may
    /// hold U+FFFD where the token is part of a UTF-8 character).
    pub text: String,
    /// Natural log of the token's probability under the distribution the
    /// sampler drew from: log-softmax of the logits after the repetition
    /// penalty, divided by the temperature (1 when the temperature is 0),
    /// before top-k, top-p and min-p cut the candidates.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens at this position, most likely
    /// first (ties by lower id); empty when `top_logprobs` was 0.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One prompt token with its log probability given the tokens before it
/// (`prompt_logprobs`); the first prompt token has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptLogprob {
    /// The prompt token id.
    pub token: u32,
    /// The token's text: the tokenizer's decoding of this id alone.
    pub text: String,
    /// Natural log of its probability under the model (log-softmax of the
    /// raw logits); nil for the first prompt token.
    #[serde(default)]
    pub logprob: Option<f32>,
    /// The most likely tokens at this position, most likely first.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub top_logprobs: Vec<TopLogprob>,
}

/// client -> router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "a message lives for one hop; boxing would change the public shape others match on"
)]
pub enum ClientRequest {
    /// Start a generation.
    Generate(GenerateRequest),
    /// Cancel a request of this client; it ends with `done` and finish
    /// reason `cancelled`.
    Cancel {
        /// The client request id to cancel.
        id: RequestId,
    },
    /// List the models served.
    Models {
        /// Echoed on the reply.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
    },
    /// Liveness check; answered with `pong`.
    Ping {
        /// Echoed on the reply.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
    },
    /// Token ids of a text; answered with `tokenized`.
    Tokenize(TokenizeRequest),
    /// Text of token ids; answered with `detokenized`.
    Detokenize(DetokenizeRequest),
    /// Prompt text of chat turns; answered with `applied_template`.
    ApplyTemplate(ApplyTemplateRequest),
    /// The embedding of a text; answered with `embedding`.
    Embed(crate::EmbedRequest),
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The client cancelled.
    Cancelled,
    /// `deadline_ms` passed.
    Deadline,
    /// The output ended with tool calls (in `tool_calls`).
    ToolCalls,
}

impl FinishReason {
    /// Every reason, for metrics labels.
    pub const ALL: [FinishReason; 5] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Cancelled,
        FinishReason::Deadline,
        FinishReason::ToolCalls,
    ];

    /// The wire name, e.g. `"length"`; also the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Deadline => "deadline",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt, after templating.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache (not recomputed).
    pub cached_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
}

/// Where one request's time went, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Waiting before the engine admitted it (router queue included).
    pub queue_s: f64,
    /// Computing the uncached prompt.
    pub prefill_s: f64,
    /// Arrival to first token.
    pub ttft_s: f64,
    /// First token to last token.
    pub decode_s: f64,
}

/// Stable error codes; a client decides what to do from the code alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The message was malformed, over a limit, or of an unknown type or
    /// version. Fix the request; do not retry it as is.
    BadRequest,
    /// No worker serves the named model.
    UnknownModel,
    /// Queue full: retry later with backoff.
    Overloaded,
    /// No worker is registered: retry later.
    Unavailable,
    /// The prompt does not fit the worker's KV pool.
    PromptTooLong,
    /// The worker died mid-request: retry.
    WorkerLost,
    /// `deadline_ms` passed before the request could finish.
    Deadline,
    /// A bug or resource failure on our side.
    Internal,
}

impl ErrorCode {
    /// Every code, for documentation and metrics labels.
    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::BadRequest,
        ErrorCode::UnknownModel,
        ErrorCode::Overloaded,
        ErrorCode::Unavailable,
        ErrorCode::PromptTooLong,
        ErrorCode::WorkerLost,
        ErrorCode::Deadline,
        ErrorCode::Internal,
    ];

    /// The wire name of the code, e.g. `"bad_request"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::PromptTooLong => "prompt_too_long",
            ErrorCode::WorkerLost => "worker_lost",
            ErrorCode::Deadline => "deadline",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether sending the same request again may succeed.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Overloaded | ErrorCode::Unavailable | ErrorCode::WorkerLost
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A model and how many ready workers serve it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Model name as clients pass it in `model`.
    pub name: String,
    /// Ready workers serving it.
    pub workers: u32,
    /// Most tokens of prompt plus output one request can hold: the
    /// smallest context length its workers reported. Absent when no worker
    /// reported one (an older worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    /// Token ids run from 0 to `vocab_size - 1`; absent when no worker
    /// reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<u32>,
    /// Whether it can run now: absent from an older router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ModelState>,
}

impl ModelInfo {
    /// Whether a request for it runs: a worker serves it, or the router
    /// says where it stands (loaded, loading, or loaded on demand).
    pub fn servable(&self) -> bool {
        self.workers > 0 || self.state.is_some()
    }
}

/// Where a model stands in the `models` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    /// A worker serves it.
    Loaded,
    /// Its first worker is starting; requests for it wait.
    Loading,
    /// A supervisor offers it and no worker runs it: the first request
    /// loads it.
    Unloaded,
}

impl ModelState {
    /// The name on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Loaded => "loaded",
            ModelState::Loading => "loading",
            ModelState::Unloaded => "unloaded",
        }
    }
}

/// The output of one `chunk`, the same from the worker to the router and
/// from the router to the client: the router forwards it as is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkBody {
    /// 0 for the first chunk of the request, then 1, 2, ...
    pub index: u32,
    /// Text delta; never part of a UTF-8 character or of a stop string.
    pub text: String,
    /// Token ids produced since the previous chunk.
    pub tokens: Vec<u32>,
    /// One entry per entry of `tokens`, when the request asked for
    /// `logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Which of the request's `n` choices this belongs to (absent: 0).
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub choice: u32,
    /// Reasoning text delta (a thinking model's `<think>` block), kept
    /// out of `text`.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub reasoning: String,
    /// Tool calls completed since the previous chunk, whole.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tool_calls: Vec<ToolCall>,
}

/// How one choice of a request ended (`done`), the same from the worker to
/// the router and from the router to the client; the router only fills in
/// `worker`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoneBody {
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Full output text when the request was not streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Token counts.
    pub usage: Usage,
    /// Time spent (in the worker, on a worker's `done`).
    pub timings: Timings,
    /// The worker that served it: set by the router on the client's
    /// `done`, absent on a worker's. Here, not beside the request id, so
    /// the client's `done` keeps its field order on the wire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Every generated token's entry, when the request was not
    /// streamed and asked for `logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Which of the request's `n` choices this belongs to (absent: 0); a
    /// request ends with the last of its choices' `done`s.
    #[serde(
        default,
        deserialize_with = "nil_is_default",
        skip_serializing_if = "is_default"
    )]
    pub choice: u32,
    /// Every prompt token's log probability, when the request asked
    /// for `prompt_logprobs` (on choice 0's `done`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<PromptLogprob>>,
    /// The prompt's embedding, when the request set `embed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
    /// The whole reasoning text, when the request was not streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Every tool call, when the request was not streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// With `logprobs`: the entry of the stop token that ended the output
    /// (end-of-sequence, a `stop_token_ids` id), which `logprobs` leaves
    /// out; scorers that read the last token need it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_logprob: Option<TokenLogprob>,
}

impl DoneBody {
    /// An end with these counts and times and every optional field absent.
    pub fn new(finish_reason: FinishReason, usage: Usage, timings: Timings) -> Self {
        DoneBody {
            finish_reason,
            text: None,
            usage,
            timings,
            worker: None,
            logprobs: None,
            choice: 0,
            prompt_logprobs: None,
            embedding: None,
            reasoning: None,
            tool_calls: None,
            stop_logprob: None,
        }
    }
}

/// router -> client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientReply {
    /// New output of a streamed request.
    Chunk {
        /// Client request id.
        id: RequestId,
        /// The output, as the worker sent it.
        #[serde(flatten)]
        body: ChunkBody,
    },
    /// The request finished; terminal.
    Done {
        /// Client request id.
        id: RequestId,
        /// How it ended, as the worker sent it with `worker` filled in.
        #[serde(flatten)]
        body: DoneBody,
    },
    /// The request failed (terminal when `id` is set), or a message could
    /// not be understood.
    Error {
        /// Client request id, when it could be read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        /// What went wrong, as a stable code.
        code: ErrorCode,
        /// What went wrong and what to do, for a person.
        message: String,
        /// Whether sending the same request again may succeed.
        retryable: bool,
    },
    /// Reply to `models`.
    Models {
        /// Echo of the request's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        /// Models served now.
        models: Vec<ModelInfo>,
    },
    /// Reply to `ping`.
    Pong {
        /// Echo of the request's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
    },
    /// Reply to `tokenize`; terminal.
    Tokenized {
        /// Client request id.
        id: RequestId,
        /// Token ids.
        tokens: Vec<u32>,
        /// One piece per entry of `tokens`, when `with_pieces` was set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pieces: Option<Vec<Piece>>,
    },
    /// Reply to `detokenize`; terminal.
    Detokenized {
        /// Client request id.
        id: RequestId,
        /// The text.
        content: String,
    },
    /// Reply to `apply_template`; terminal.
    AppliedTemplate {
        /// Client request id.
        id: RequestId,
        /// The rendered prompt.
        prompt: String,
    },
    /// Reply to `embed`; terminal.
    Embedding {
        /// Client request id.
        id: RequestId,
        /// The pooled, L2-normalised final hidden state.
        embedding: Vec<f32>,
        /// `prompt_tokens` (and `cached_tokens`) of the input.
        usage: Usage,
        /// The worker that computed it.
        worker: String,
    },
}

/// A worker's load, reported in `load` and shown by `zinfer ctl workers`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Sequences in the running batch.
    pub running: u32,
    /// Requests waiting for admission.
    pub waiting: u32,
    /// KV slots in use (running sequences and prefix cache).
    pub kv_used: u64,
    /// KV slots free.
    pub kv_free: u64,
    /// Prompt tokens served from the prefix cache since start.
    pub cache_hit_tokens: u64,
    /// Prompt tokens looked up in the prefix cache since start.
    pub cache_query_tokens: u64,
    /// Resident memory of the worker process in bytes (0 when unknown);
    /// the supervisor's memory budget learns from it.
    #[serde(default)]
    pub rss_bytes: u64,
}

/// A control operation the router asks of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlOp {
    /// Stop taking requests, finish the running ones.
    Drain,
    /// Exit after a grace period.
    Shutdown,
    /// Drop the prefix cache.
    FlushCache,
    /// Stream the hottest prefix-cache K/V to a replacement worker.
    ExportCache,
}

/// router -> worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "a message lives for one hop; boxing would change the public shape others match on"
)]
pub enum RouterToWorker {
    /// Run this request; reply with `chunk`s and one `done` or `error`
    /// carrying the same `rid`.
    Generate {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// The client's request, validated by the router.
        request: GenerateRequest,
    },
    /// Stop a request; the worker answers with `done` (cancelled).
    Cancel {
        /// Router-internal request id.
        rid: RouterRequestId,
    },
    /// The router is alive.
    Heartbeat {},
    /// The router does not know this worker (it expired or the router
    /// restarted): register again with `ready`.
    Disconnect {
        /// Why, for logs.
        reason: String,
    },
    /// Finish running requests, take no new ones.
    Drain {},
    /// Take requests again after a drain (a parked worker is resumed).
    Resume {},
    /// Stream the hottest prefix-cache entries, K/V included, to the
    /// replacement worker listening at `endpoint` (live migration); answer
    /// with `control_reply` (`export_cache`) when done. Serving goes on.
    ExportCache {
        /// The replacement's `import_endpoint`, from its `ready`.
        endpoint: String,
        /// Most cached tokens to carry, hottest first.
        max_tokens: u64,
        /// The replacement's `import_key`, from its `ready`: connect with
        /// CURVE and trust only this server key. Set whenever the
        /// replacement gave one; a worker using CURVE refuses to export
        /// without it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// Exit, failing what is still running after `grace_ms`.
    Shutdown {
        /// Milliseconds to let running requests finish.
        grace_ms: u64,
    },
    /// Drop cached prefixes (all, or one namespace).
    FlushCache {
        /// Only this namespace, when set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
    /// Tokenize; answer with `tokenized` or `error` carrying `rid`.
    Tokenize {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// The client's request, `model` filled in.
        request: TokenizeRequest,
    },
    /// Detokenize; answer with `detokenized` or `error` carrying `rid`.
    Detokenize {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// The client's request, `model` filled in.
        request: DetokenizeRequest,
    },
    /// Render the chat template; answer with `applied_template` or `error`
    /// carrying `rid`.
    ApplyTemplate {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// The client's request, `model` filled in.
        request: ApplyTemplateRequest,
    },
}

/// A worker's `ready`: what it serves and how much it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadyBody {
    /// Worker id; also the DEALER routing id.
    pub worker_id: String,
    /// Protocol version the worker speaks.
    pub protocol: u32,
    /// Model names served.
    pub models: Vec<String>,
    /// Device, e.g. `cpu` or `cuda:0`.
    pub device: String,
    /// KV pool capacity in tokens.
    pub kv_capacity: u64,
    /// Most sequences decoded together.
    pub max_batch: u32,
    /// The model's context length in tokens (prompt plus output);
    /// optional, added after v1 shipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    /// The model's vocabulary size; optional, added after v1 shipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<u32>,
    /// Where this worker takes prefix-cache K/V from the worker it
    /// replaces (set only on a worker started as a migration target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_endpoint: Option<String>,
    /// The CURVE public key (Z85) of the import socket, set when the
    /// worker uses CURVE: the exporter encrypts the K/V to it and
    /// trusts no other server there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_key: Option<String>,
}

/// worker -> router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerToRouter {
    /// Register (first message, and again after a reconnect).
    Ready(ReadyBody),
    /// The worker is alive (every second).
    Heartbeat {},
    /// Load changed (at most every 100 ms).
    Load(LoadReport),
    /// New output of request `rid`.
    Chunk {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// The output, forwarded to the client as is.
        #[serde(flatten)]
        body: ChunkBody,
    },
    /// Request `rid` finished.
    Done {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// How it ended; `worker` is left out (the router fills it in).
        #[serde(flatten)]
        body: DoneBody,
    },
    /// Request `rid` failed.
    Error {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// Stable code.
        code: ErrorCode,
        /// For a person.
        message: String,
    },
    /// A migration target took the K/V its predecessor streamed (sent once
    /// the stream ended, or gave up).
    CacheImported {
        /// Cached tokens now in this worker's pool and prefix tree.
        tokens: u64,
        /// Tokens received but not kept (no free slot, shape mismatch).
        skipped_tokens: u64,
        /// K/V bytes received.
        bytes: u64,
        /// Seconds from the first block to the end.
        seconds: f64,
    },
    /// Answer to a control message.
    ControlReply {
        /// The operation answered.
        op: ControlOp,
        /// Whether it succeeded.
        ok: bool,
        /// Details, for a person.
        message: String,
    },
    /// Answer to `tokenize` `rid`.
    Tokenized {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// Token ids.
        tokens: Vec<u32>,
        /// One piece per entry of `tokens`, when asked for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pieces: Option<Vec<Piece>>,
    },
    /// Answer to `detokenize` `rid`.
    Detokenized {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// The text.
        content: String,
    },
    /// Answer to `apply_template` `rid`.
    AppliedTemplate {
        /// Router-internal request id.
        rid: RouterRequestId,
        /// The rendered prompt.
        prompt: String,
    },
}

/// A worker's lifecycle state as the router sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Registered and taking requests.
    Ready,
    /// Finishing its requests, taking no new ones.
    Draining,
    /// Serving while its replacement loads and takes its cache.
    Migrating,
    /// Loaded as a replacement, taking its predecessor's cache; not routed
    /// to until the switch.
    Warming,
    /// Drained and kept running, taking no requests until `resume`.
    Parked,
    /// Drained and asked to exit.
    Stopping,
    /// Missed heartbeats; its requests were failed or retried.
    Lost,
}

impl WorkerState {
    /// Every state, for metrics labels.
    pub const ALL: [WorkerState; 7] = [
        WorkerState::Ready,
        WorkerState::Draining,
        WorkerState::Migrating,
        WorkerState::Warming,
        WorkerState::Parked,
        WorkerState::Stopping,
        WorkerState::Lost,
    ];

    /// The wire name, e.g. `"draining"`; also the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Ready => "ready",
            WorkerState::Draining => "draining",
            WorkerState::Migrating => "migrating",
            WorkerState::Warming => "warming",
            WorkerState::Parked => "parked",
            WorkerState::Stopping => "stopping",
            WorkerState::Lost => "lost",
        }
    }
}

/// One row of `workers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Worker id.
    pub id: String,
    /// Device.
    pub device: String,
    /// Models served.
    pub models: Vec<String>,
    /// Lifecycle state.
    pub state: WorkerState,
    /// Requests the router has in flight on it.
    pub inflight: u32,
    /// KV pool capacity in tokens.
    pub kv_capacity: u64,
    /// Last load report.
    pub load: LoadReport,
    /// Seconds since its last message.
    pub last_seen_s: f64,
}

/// admin -> router, on the control socket.
///
/// With the `clap` feature it is also `zinfer ctl`'s command line, so every
/// admin operation is a `ctl` subcommand and the two cannot drift apart;
/// the doc comments below are its help texts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Subcommand))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AdminRequest {
    /// List workers: id, device, model, state, running / waiting, KV usage,
    /// hit rate, memory.
    Workers {},
    /// Stop routing new requests to a worker, let its running ones finish,
    /// then stop it (or park it with --park).
    Drain {
        /// Worker id, as `ctl workers` lists it.
        worker: String,
        /// Keep the drained worker running, idle, until `resume`.
        #[serde(default)]
        #[cfg_attr(feature = "clap", arg(long, env = "ZINFER_DRAIN_PARK"))]
        park: bool,
    },
    /// Route to a draining or parked worker again.
    Resume {
        /// Worker id.
        worker: String,
    },
    /// Replace a worker by one on another device, carrying its hottest
    /// prefix cache; answered once routing has switched (or it failed).
    Migrate {
        /// Worker id.
        worker: String,
        /// Target device, e.g. `cpu:1` or `cuda:0`.
        device: String,
        /// Most cached tokens to carry (0: none). Absent: the router's
        /// --carry-tokens.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long, env = "ZINFER_CARRY_TOKENS"))]
        carry_tokens: Option<u64>,
    },
    /// Replace a worker by one loading a (new) model file on the same
    /// device, with no downtime; no cache is carried (other weights make
    /// other K/V).
    Reload {
        /// Worker id.
        worker: String,
        /// Model file for the replacement. Absent: the same model again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long, env = "ZINFER_RELOAD_MODEL_PATH"))]
        model_path: Option<String>,
    },
    /// Set how many workers serve a model; answered when that many are
    /// routable (new ones registered, surplus ones draining), or it failed.
    /// Needs a supervisor (`zinfer serve`, or `zinfer supervisor`).
    Scale {
        /// Model name, as `ctl workers` lists it.
        model: String,
        /// Wanted number of workers (0 drains them all).
        workers: u32,
        /// Device for new workers. Absent: the supervisor's least used.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long, env = "ZINFER_DEVICE"))]
        device: Option<String>,
    },
}

/// A model a supervisor can start workers for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelOffer {
    /// Model name, as workers report it.
    pub name: String,
    /// Model file or directory on the supervisor's host.
    pub path: String,
    /// Memory one worker of it is expected to use, in bytes.
    pub worker_bytes: u64,
    /// How long it stays loaded after a request when it was loaded on
    /// demand; absent: the router's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive: Option<crate::KeepAlive>,
}

/// supervisor -> router, on the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SupervisorToRouter {
    /// Registration and heartbeat, every second: what this supervisor can
    /// start and how much memory it has left.
    SupervisorStatus {
        /// Supervisor id, unique among supervisors.
        supervisor_id: String,
        /// Host name, for listings.
        host: String,
        /// Models it can start workers for.
        models: Vec<ModelOffer>,
        /// Devices it starts workers on.
        devices: Vec<String>,
        /// Memory budget for its workers, bytes.
        memory_budget_bytes: u64,
        /// Memory its workers hold or have reserved, bytes.
        memory_used_bytes: u64,
        /// Ids of the workers it runs.
        workers: Vec<String>,
    },
    /// A `spawn` did not produce a worker: refused (memory, unknown
    /// model or device) or the process exited before registering.
    SpawnFailed {
        /// The worker id the spawn was for.
        worker_id: String,
        /// For a person: why, with the worker's last log lines.
        reason: String,
    },
    /// A worker process this supervisor ran has exited.
    WorkerExited {
        /// Worker id.
        worker_id: String,
        /// Exit status, for a person.
        status: String,
    },
}

/// router -> supervisor, on the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RouterToSupervisor {
    /// Start a worker process; it registers with the router as `worker_id`.
    Spawn {
        /// Id the new worker registers with.
        worker_id: String,
        /// Model name, one of the supervisor's offers.
        model: String,
        /// Model file to load instead of the offer's path (`reload`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model_path: Option<String>,
        /// Device; absent: the supervisor's least used device.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        /// Start it as a migration target that takes a predecessor's cache.
        #[serde(default)]
        import_cache: bool,
        /// With `import_cache` and CURVE: the predecessor's public key
        /// (Z85), the only client the new worker's import socket admits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exporter_key: Option<String>,
    },
    /// Stop a worker process (it was drained and told to exit; this makes
    /// sure it does), killing it after `grace_ms`.
    Stop {
        /// Worker id.
        worker_id: String,
        /// Milliseconds before the process is killed.
        grace_ms: u64,
    },
}

/// worker -> worker, on a migration target's import socket: the hottest
/// prefix-cache entries of the worker it replaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CacheTransfer {
    /// One cached span: its K/V extends the cached prefix `tokens[..prefix_len]`
    /// (sent earlier) by `tokens[prefix_len..]`.
    CacheSpan {
        /// Prefix-cache namespace.
        namespace: String,
        /// Token ids from the namespace root to the span's end.
        tokens: Vec<u32>,
        /// Tokens before the span.
        prefix_len: u32,
        /// Model layers in `kv`.
        layers: u32,
        /// K (and V) row width in `kv`.
        kv_dim: u32,
        /// Little-endian f32: per layer, the span's K rows then its V rows.
        #[serde(with = "serde_bytes")]
        kv: Vec<u8>,
    },
    /// The stream ended.
    CacheEnd {
        /// Spans sent.
        spans: u64,
        /// Tokens sent.
        tokens: u64,
    },
}

/// router -> admin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AdminReply {
    /// Reply to `workers`.
    Workers {
        /// Every known worker.
        workers: Vec<WorkerInfo>,
    },
    /// Reply to `drain`, `migrate` or `scale`.
    Ack {
        /// Whether the operation was accepted.
        ok: bool,
        /// Details, for a person.
        message: String,
    },
    /// The admin message could not be understood.
    Error {
        /// Stable code.
        code: ErrorCode,
        /// For a person.
        message: String,
    },
}

impl TextRequest {
    /// The client's request id.
    pub fn id(&self) -> &str {
        match self {
            TextRequest::Tokenize(r) => &r.id,
            TextRequest::Detokenize(r) => &r.id,
            TextRequest::ApplyTemplate(r) => &r.id,
        }
    }

    /// The model named, if any.
    pub fn model(&self) -> Option<&str> {
        match self {
            TextRequest::Tokenize(r) => r.model.as_deref(),
            TextRequest::Detokenize(r) => r.model.as_deref(),
            TextRequest::ApplyTemplate(r) => r.model.as_deref(),
        }
    }

    /// Names the model the request runs on.
    pub fn set_model(&mut self, model: String) {
        let slot = match self {
            TextRequest::Tokenize(r) => &mut r.model,
            TextRequest::Detokenize(r) => &mut r.model,
            TextRequest::ApplyTemplate(r) => &mut r.model,
        };
        *slot = Some(model);
    }
}

/// The answer to a text request, without the request's id or rid.
#[derive(Debug, Clone, PartialEq)]
pub enum TextResult {
    /// Answer to `tokenize`.
    Tokenized {
        /// Token ids.
        tokens: Vec<u32>,
        /// One piece per token, when `with_pieces` was set.
        pieces: Option<Vec<Piece>>,
    },
    /// Answer to `detokenize`.
    Detokenized {
        /// The text.
        content: String,
    },
    /// Answer to `apply_template`.
    AppliedTemplate {
        /// The rendered prompt.
        prompt: String,
    },
}

impl TextRequest {
    /// The message that asks a worker to answer it as `rid`.
    pub fn to_worker(&self, rid: RouterRequestId) -> RouterToWorker {
        match self.clone() {
            TextRequest::Tokenize(request) => RouterToWorker::Tokenize { rid, request },
            TextRequest::Detokenize(request) => RouterToWorker::Detokenize { rid, request },
            TextRequest::ApplyTemplate(request) => RouterToWorker::ApplyTemplate { rid, request },
        }
    }
}

impl TextResult {
    /// The worker's answer to request `rid`.
    pub fn to_worker_reply(self, rid: RouterRequestId) -> WorkerToRouter {
        match self {
            TextResult::Tokenized { tokens, pieces } => WorkerToRouter::Tokenized {
                rid,
                tokens,
                pieces,
            },
            TextResult::Detokenized { content } => WorkerToRouter::Detokenized { rid, content },
            TextResult::AppliedTemplate { prompt } => {
                WorkerToRouter::AppliedTemplate { rid, prompt }
            }
        }
    }

    /// The router's reply to the client's request `id`.
    pub fn to_client_reply(self, id: RequestId) -> ClientReply {
        match self {
            TextResult::Tokenized { tokens, pieces } => {
                ClientReply::Tokenized { id, tokens, pieces }
            }
            TextResult::Detokenized { content } => ClientReply::Detokenized { id, content },
            TextResult::AppliedTemplate { prompt } => ClientReply::AppliedTemplate { id, prompt },
        }
    }
}

impl ClientReply {
    /// Whether this reply ends its request: `done`, an `error` with an id,
    /// or the one reply of a text request.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ClientReply::Done { .. }
                | ClientReply::Error { id: Some(_), .. }
                | ClientReply::Tokenized { .. }
                | ClientReply::Detokenized { .. }
                | ClientReply::AppliedTemplate { .. }
                | ClientReply::Embedding { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_are_the_wire_names() {
        let wire = |v: serde_json::Value| v.as_str().map(str::to_string);
        for reason in FinishReason::ALL {
            let name = wire(serde_json::to_value(reason).unwrap());
            assert_eq!(name.as_deref(), Some(reason.as_str()));
        }
        for state in WorkerState::ALL {
            let name = wire(serde_json::to_value(state).unwrap());
            assert_eq!(name.as_deref(), Some(state.as_str()));
        }
        for code in ErrorCode::ALL {
            let name = wire(serde_json::to_value(code).unwrap());
            assert_eq!(name.as_deref(), Some(code.as_str()));
        }
    }
}
