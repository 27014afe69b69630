//! Protocol replies to OpenAI response bodies and server-sent events. Pure:
//! the caller supplies the response id, the time and the replies.

use serde_json::{Value, json};
use zinfer_protocol::{
    ChunkBody, ClientReply, DoneBody, FinishReason, PromptLogprob, TokenLogprob, ToolCall, Usage,
};

use crate::error::ApiError;

/// Which OpenAI endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// What every response and chunk of one request repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The response id (`cmpl-...` or `chatcmpl-...`).
    pub id: String,
    /// Unix seconds when the request arrived.
    pub created: u64,
    /// The model name echoed back.
    pub model: String,
    /// Whether the request asked for log probabilities.
    pub logprobs: bool,
    /// Choices in all: `n` per prompt.
    pub choices: u32,
    /// Choices per prompt (`n`): choice `i` answers prompt `i / n`.
    pub n: u32,
    /// `echo` on completions: each prompt's text, which its choices start
    /// with; empty without `echo`.
    pub echo: Vec<String>,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// OpenAI's `finish_reason` for the protocol's.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length | FinishReason::Deadline => "length",
        FinishReason::ToolCalls => "tool_calls",
    }
}

/// OpenAI's `tool_calls` entry; `index` only in stream deltas. The
/// arguments are a JSON string, as OpenAI sends them.
fn tool_call(call: &ToolCall, index: Option<usize>) -> Value {
    let arguments = match &call.function.arguments {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let mut value = json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    });
    if let Some(index) = index {
        value["index"] = json!(index);
    }
    value
}

/// A non-streamed request's output, gathered from the router's replies.
#[derive(Debug, Default)]
pub struct Collected {
    /// The answer text.
    pub text: String,
    /// The reasoning text.
    pub reasoning: String,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Every token's log probabilities, when asked for.
    pub entries: Vec<TokenLogprob>,
    /// The prompt tokens' log probabilities, with `echo` and `logprobs`.
    pub prompt: Vec<PromptLogprob>,
    /// The entry of the stop token that ended the output, with `logprobs`.
    pub stop: Option<TokenLogprob>,
}

impl Collected {
    /// Adds a `chunk`'s or a `done`'s output.
    pub fn add(
        &mut self,
        text: &str,
        reasoning: &str,
        tool_calls: Vec<ToolCall>,
        entries: Option<Vec<TokenLogprob>>,
    ) {
        self.text.push_str(text);
        self.reasoning.push_str(reasoning);
        self.tool_calls.extend(tool_calls);
        self.entries.extend(entries.unwrap_or_default());
    }
}

/// A reply to a one-choice streamed request as the Messages and
/// Responses encoders read it: output (a chunk's, or what a `done`
/// carries), then on `done` how it ended.
#[derive(Debug, Default)]
pub struct Part {
    /// Answer text.
    pub text: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Calls completed.
    pub calls: Vec<ToolCall>,
    /// The tokens' log probabilities, when asked for.
    pub entries: Vec<TokenLogprob>,
    /// On `done`: why it ended, the usage, and the stop token's entry.
    pub end: Option<(FinishReason, Usage, Option<TokenLogprob>)>,
}

impl Part {
    /// The part of `reply`, or the error it stands for; `None` for a
    /// reply that is not about a request's output.
    pub fn of(reply: ClientReply) -> Option<Result<Part, ApiError>> {
        match reply {
            ClientReply::Chunk { body, .. } => Some(Ok(Part {
                text: body.text,
                reasoning: body.reasoning,
                calls: body.tool_calls,
                entries: body.logprobs.unwrap_or_default(),
                end: None,
            })),
            ClientReply::Done { body, .. } => Some(Ok(Part {
                text: body.text.unwrap_or_default(),
                reasoning: body.reasoning.unwrap_or_default(),
                calls: body.tool_calls.unwrap_or_default(),
                entries: body.logprobs.unwrap_or_default(),
                end: Some((body.finish_reason, body.usage, body.stop_logprob)),
            })),
            ClientReply::Error { code, message, .. } => {
                Some(Err(ApiError::from_router(code, message, None)))
            }
            ClientReply::Models { .. }
            | ClientReply::Pong { .. }
            | ClientReply::Tokenized { .. }
            | ClientReply::Detokenized { .. }
            | ClientReply::AppliedTemplate { .. }
            | ClientReply::Embedding { .. } => None,
        }
    }
}

/// One named server-sent event: its name and JSON data.
pub type Sse = (&'static str, String);

/// An encoder of a one-choice stream into named events (Messages,
/// Responses), fed the [`Part`]s of its replies.
pub trait PartEncoder {
    /// Whether its last event went out.
    fn finished(&self) -> bool;
    /// The events for one part of the output.
    fn part(&mut self, part: Part) -> Vec<Sse>;
    /// The events that end a stream that failed after it started.
    fn failed(&mut self, error: &ApiError) -> Vec<Sse>;

    /// The events for one reply: none once finished, or for a reply that
    /// is not about the output.
    fn on_reply(&mut self, reply: ClientReply) -> Vec<Sse> {
        if self.finished() {
            return Vec::new();
        }
        match Part::of(reply) {
            None => Vec::new(),
            Some(Err(error)) => self.failed(&error),
            Some(Ok(part)) => self.part(part),
        }
    }
}

/// OpenAI's `usage` object, cached prompt tokens included.
pub fn usage(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    })
}

/// The lowest logprob reported: JSON has no `-inf`, and OpenAI clients
/// expect a number (vLLM uses the same floor).
const LOGPROB_FLOOR: f32 = -9999.0;

fn finite(logprob: f32) -> f32 {
    if logprob.is_nan() {
        LOGPROB_FLOOR
    } else {
        logprob.max(LOGPROB_FLOOR)
    }
}

/// Chat's `logprobs` object: `{"content": [{token, logprob, bytes,
/// top_logprobs}]}`, `bytes` being the UTF-8 of the token's text.
pub fn chat_logprobs(entries: &[TokenLogprob]) -> Value {
    let one = |text: &str, logprob: f32| json!({"token": text, "logprob": finite(logprob), "bytes": text.as_bytes()});
    let content: Vec<Value> = entries
        .iter()
        .map(|entry| {
            let mut item = one(&entry.text, entry.logprob);
            item["top_logprobs"] = entry
                .top_logprobs
                .iter()
                .map(|top| one(&top.text, top.logprob))
                .collect();
            item
        })
        .collect();
    json!({ "content": content })
}

/// Legacy completions' `logprobs` object: parallel `tokens`,
/// `token_logprobs`, `top_logprobs` (a map of text to logprob per position,
/// the chosen token included, as OpenAI does) and `text_offset` (each
/// token's character offset in the output, counted from `offset`, which is
/// advanced past these tokens).
pub fn completion_logprobs(entries: &[TokenLogprob], offset: &mut usize) -> Value {
    completion_logprobs_echoed(&[], entries, offset)
}

/// [`completion_logprobs`] with the prompt's tokens first (`echo`): the
/// first prompt token has `null` for its logprob and its alternatives, as
/// OpenAI shows it.
pub fn completion_logprobs_echoed(
    prompt: &[PromptLogprob],
    entries: &[TokenLogprob],
    offset: &mut usize,
) -> Value {
    let count = prompt.len() + entries.len();
    let mut tokens = Vec::with_capacity(count);
    let mut token_logprobs = Vec::with_capacity(count);
    let mut top_logprobs = Vec::with_capacity(count);
    let mut text_offset = Vec::with_capacity(count);
    let items = prompt
        .iter()
        .map(|p| (&p.text, p.logprob, &p.top_logprobs))
        .chain(
            entries
                .iter()
                .map(|e| (&e.text, Some(e.logprob), &e.top_logprobs)),
        );
    for (text, logprob, alternatives) in items {
        tokens.push(text.clone());
        text_offset.push(*offset);
        *offset += text.chars().count();
        let Some(logprob) = logprob else {
            token_logprobs.push(Value::Null);
            top_logprobs.push(Value::Null);
            continue;
        };
        token_logprobs.push(json!(finite(logprob)));
        let mut top = serde_json::Map::new();
        for alternative in alternatives {
            // Two ids may decode to one text (U+FFFD): keep the likelier.
            top.entry(alternative.text.clone())
                .or_insert_with(|| json!(finite(alternative.logprob)));
        }
        top.entry(text.clone())
            .or_insert_with(|| json!(finite(logprob)));
        top_logprobs.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    })
}

/// The whole (non-streaming) response: one entry of `outs` per choice,
/// in order. A chat message that holds only tool calls has `content:
/// null`, as OpenAI's does. `used` counts the prompt once and every
/// choice's output.
pub fn full_response(meta: &Meta, outs: &[(Collected, FinishReason)], used: &Usage) -> Value {
    let choices: Vec<Value> = outs
        .iter()
        .enumerate()
        .map(|(index, (out, reason))| full_choice(meta, index, out, *reason))
        .collect();
    let mut body = meta.envelope(false, Value::Array(choices));
    body["usage"] = usage(used);
    body
}

fn full_choice(meta: &Meta, index: usize, out: &Collected, reason: FinishReason) -> Value {
    match meta.endpoint {
        Endpoint::Completions => {
            let prompt = index / meta.n.max(1) as usize;
            let echo = meta.echo.get(prompt).map_or("", String::as_str);
            // The stop token (EOS) is shown as vLLM shows it: scorers that
            // read the last generated token (lm-eval's `[ctxlen:-1]`) need it.
            let entries: Vec<TokenLogprob> = out.entries.iter().chain(&out.stop).cloned().collect();
            let logprobs = meta
                .logprobs
                .then(|| completion_logprobs_echoed(&out.prompt, &entries, &mut 0));
            json!({
                "index": index, "text": format!("{echo}{}", out.text),
                "logprobs": logprobs,
                "finish_reason": finish_reason(reason),
            })
        }
        Endpoint::Chat => {
            let mut message = json!({"role": "assistant", "content": out.text});
            if !out.tool_calls.is_empty() {
                if out.text.trim().is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = out.tool_calls.iter().map(|c| tool_call(c, None)).collect();
            }
            if !out.reasoning.is_empty() {
                message["reasoning_content"] = json!(out.reasoning);
            }
            json!({
                "index": index,
                "message": message,
                "logprobs": meta.logprobs.then(|| chat_logprobs(&out.entries)),
                "finish_reason": finish_reason(reason),
            })
        }
    }
}

/// The usage of a request of several choices: each prompt once (as its
/// first choice's `done` counts it), every choice's output. `first`: this
/// `done` is its prompt's first choice's.
pub fn add_usage(total: &mut Usage, first: bool, used: &Usage) {
    if first {
        total.prompt_tokens += used.prompt_tokens;
        total.cached_tokens += used.cached_tokens;
    }
    total.completion_tokens += used.completion_tokens;
}

/// Turns the replies of one streamed request into SSE `data:` payloads:
/// text chunks, a last chunk with `finish_reason`, the usage chunk when
/// asked for, then `[DONE]`.
#[derive(Debug)]
pub struct StreamEncoder {
    meta: Meta,
    include_usage: bool,
    finished: bool,
    /// Per choice: whether its first chunk (with the role) went out.
    sent_role: Vec<bool>,
    /// Per choice: characters of output so far, for completions'
    /// `text_offset`.
    text_offset: Vec<usize>,
    /// Per choice: tool calls streamed so far, the next one's `index`.
    tool_calls: Vec<usize>,
    /// Choices not ended yet.
    dones_left: u32,
    /// Usage of the choices ended so far.
    used: Usage,
}

/// One reply's output as a stream delta shows it.
struct Streamed<'a> {
    text: &'a str,
    reasoning: &'a str,
    calls: &'a [ToolCall],
}

impl Streamed<'_> {
    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }
}

/// The payload that ends every stream.
pub const DONE: &str = "[DONE]";

impl StreamEncoder {
    /// An encoder for one request.
    pub fn new(meta: Meta, include_usage: bool) -> Self {
        let n = meta.choices.max(1) as usize;
        StreamEncoder {
            dones_left: n as u32,
            meta,
            include_usage,
            finished: false,
            sent_role: vec![false; n],
            text_offset: vec![0; n],
            tool_calls: vec![0; n],
            used: Usage::default(),
        }
    }

    /// Whether the terminal reply has been encoded.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// One chunk; `entries` are the log probabilities of its tokens, shown
    /// when the request asked for them and this is not the finishing chunk.
    fn chunk(
        &mut self,
        choice: usize,
        output: Option<Streamed<'_>>,
        role: bool,
        reason: Option<FinishReason>,
        entries: &[TokenLogprob],
    ) -> Value {
        let delta_text = output.as_ref().map(|d| d.text);
        let with_logprobs = self.meta.logprobs && reason.is_none();
        let reason = reason.map(finish_reason);
        let choice = match self.meta.endpoint {
            Endpoint::Completions => json!({
                "index": choice, "text": delta_text.unwrap_or(""),
                "logprobs": with_logprobs.then(|| completion_logprobs(entries, &mut self.text_offset[choice])),
                "finish_reason": reason,
            }),
            Endpoint::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                }
                if let Some(out) = &output {
                    if !out.text.is_empty() || (out.reasoning.is_empty() && out.calls.is_empty()) {
                        delta["content"] = json!(out.text);
                    }
                    if !out.reasoning.is_empty() {
                        delta["reasoning_content"] = json!(out.reasoning);
                    }
                    if !out.calls.is_empty() {
                        let calls: Vec<Value> = out
                            .calls
                            .iter()
                            .enumerate()
                            .map(|(i, c)| tool_call(c, Some(self.tool_calls[choice] + i)))
                            .collect();
                        self.tool_calls[choice] += calls.len();
                        delta["tool_calls"] = Value::Array(calls);
                    }
                }
                let logprobs = with_logprobs.then(|| chat_logprobs(entries));
                json!({"index": choice, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
            }
        };
        let mut body = self.meta.envelope(true, json!([choice]));
        if self.include_usage {
            body["usage"] = Value::Null;
        }
        body
    }

    /// The payloads for one reply of this request (none for an empty text
    /// chunk after the first).
    pub fn on_reply(&mut self, reply: ClientReply) -> Vec<String> {
        if self.finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        match reply {
            ClientReply::Chunk {
                body:
                    ChunkBody {
                        text,
                        logprobs,
                        reasoning,
                        tool_calls,
                        choice,
                        ..
                    },
                ..
            } => {
                let Some(choice) = self.choice(choice) else {
                    return out;
                };
                let role = self.meta.endpoint == Endpoint::Chat && !self.sent_role[choice];
                let entries = logprobs.unwrap_or_default();
                let delta = Streamed {
                    text: &text,
                    reasoning: &reasoning,
                    calls: &tool_calls,
                };
                if role || !delta.is_empty() || !entries.is_empty() {
                    out.push(
                        self.chunk(choice, Some(delta), role, None, &entries)
                            .to_string(),
                    );
                    self.sent_role[choice] = true;
                }
            }
            ClientReply::Done {
                body:
                    DoneBody {
                        finish_reason,
                        usage: used,
                        text,
                        logprobs,
                        reasoning,
                        tool_calls,
                        choice,
                        stop_logprob,
                        ..
                    },
                ..
            } => {
                let Some(index) = self.choice(choice) else {
                    return out;
                };
                let role = self.meta.endpoint == Endpoint::Chat && !self.sent_role[index];
                let mut entries = logprobs.unwrap_or_default();
                if self.meta.endpoint == Endpoint::Completions {
                    entries.extend(stop_logprob);
                }
                let (text, reasoning) = (text.unwrap_or_default(), reasoning.unwrap_or_default());
                let calls = tool_calls.unwrap_or_default();
                let delta = Streamed {
                    text: &text,
                    reasoning: &reasoning,
                    calls: &calls,
                };
                if role || !delta.is_empty() || !entries.is_empty() {
                    out.push(
                        self.chunk(index, Some(delta), role, None, &entries)
                            .to_string(),
                    );
                }
                out.push(
                    self.chunk(index, None, false, Some(finish_reason), &[])
                        .to_string(),
                );
                add_usage(&mut self.used, choice % self.meta.n.max(1) == 0, &used);
                self.dones_left = self.dones_left.saturating_sub(1);
                if self.dones_left > 0 {
                    return out;
                }
                if self.include_usage {
                    let mut body = self.meta.envelope(true, json!([]));
                    body["usage"] = usage(&self.used);
                    out.push(body.to_string());
                }
                out.push(DONE.to_string());
                self.finished = true;
            }
            ClientReply::Error { code, message, .. } => {
                out.push(
                    ApiError::from_router(code, message, None)
                        .body()
                        .to_string(),
                );
                out.push(DONE.to_string());
                self.finished = true;
            }
            ClientReply::Models { .. }
            | ClientReply::Pong { .. }
            | ClientReply::Tokenized { .. }
            | ClientReply::Detokenized { .. }
            | ClientReply::AppliedTemplate { .. }
            | ClientReply::Embedding { .. } => {}
        }
        out
    }

    /// The index of a choice this request asked for; a reply naming
    /// another is dropped.
    fn choice(&self, choice: u32) -> Option<usize> {
        let index = choice as usize;
        (index < self.sent_role.len()).then_some(index)
    }

    /// The payloads for a failure of the front itself mid-stream.
    pub fn on_error(&mut self, error: &ApiError) -> Vec<String> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        vec![error.body().to_string(), DONE.to_string()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_protocol::{ErrorCode, Timings};

    fn meta(endpoint: Endpoint) -> Meta {
        Meta {
            endpoint,
            id: "chatcmpl-1".into(),
            created: 1_700_000_000,
            model: "smol".into(),
            logprobs: false,
            choices: 1,
            n: 1,
            echo: Vec::new(),
        }
    }

    fn with_logprobs(endpoint: Endpoint) -> Meta {
        Meta {
            logprobs: true,
            ..meta(endpoint)
        }
    }

    fn entry(token: u32, text: &str, logprob: f32, top: &[(u32, &str, f32)]) -> TokenLogprob {
        TokenLogprob {
            token,
            text: text.into(),
            logprob,
            top_logprobs: top
                .iter()
                .map(|&(token, text, logprob)| zinfer_protocol::TopLogprob {
                    token,
                    text: text.into(),
                    logprob,
                })
                .collect(),
        }
    }

    fn chunk_with(index: u32, text: &str, entries: Vec<TokenLogprob>) -> ClientReply {
        ClientReply::Chunk {
            id: "h-1".into(),
            body: ChunkBody {
                index,
                text: text.into(),
                tokens: entries.iter().map(|e| e.token).collect(),
                logprobs: Some(entries),
                ..ChunkBody::default()
            },
        }
    }

    fn collected(text: &str, entries: Vec<TokenLogprob>) -> Collected {
        Collected {
            text: text.into(),
            entries,
            ..Collected::default()
        }
    }

    fn chunk(index: u32, text: &str) -> ClientReply {
        ClientReply::Chunk {
            id: "h-1".into(),
            body: ChunkBody {
                index,
                text: text.into(),
                tokens: vec![1],
                ..ChunkBody::default()
            },
        }
    }

    fn done() -> ClientReply {
        ClientReply::Done {
            id: "h-1".into(),
            body: DoneBody {
                worker: Some("w0".into()),
                ..DoneBody::new(
                    FinishReason::Length,
                    Usage {
                        prompt_tokens: 10,
                        cached_tokens: 4,
                        completion_tokens: 2,
                    },
                    Timings::default(),
                )
            },
        }
    }

    fn parse(payloads: &[String]) -> Vec<Value> {
        payloads
            .iter()
            .filter(|p| p.as_str() != DONE)
            .map(|p| serde_json::from_str(p).unwrap())
            .collect()
    }

    #[test]
    fn chat_stream_sends_role_text_finish_usage_done() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Chat), true);
        let mut payloads = encoder.on_reply(chunk(0, "Hel"));
        payloads.extend(encoder.on_reply(chunk(1, "")));
        payloads.extend(encoder.on_reply(chunk(2, "lo")));
        assert!(!encoder.finished());
        payloads.extend(encoder.on_reply(done()));
        assert!(encoder.finished());
        assert_eq!(payloads.last().map(String::as_str), Some(DONE));
        let events = parse(&payloads);
        assert_eq!(events.len(), 4, "{events:?}");
        assert_eq!(events[0]["object"], "chat.completion.chunk");
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(events[0]["choices"][0]["delta"]["content"], "Hel");
        assert!(events[0]["usage"].is_null());
        assert_eq!(events[1]["choices"][0]["delta"]["content"], "lo");
        assert!(events[1]["choices"][0]["delta"].get("role").is_none());
        assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(events[2]["choices"][0]["delta"], json!({}));
        assert_eq!(events[3]["choices"], json!([]));
        assert_eq!(events[3]["usage"]["total_tokens"], 12);
        assert_eq!(
            events[3]["usage"]["prompt_tokens_details"]["cached_tokens"],
            4
        );
        assert!(encoder.on_reply(chunk(3, "late")).is_empty());
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: Some(id.into()),
            kind: Some("function".into()),
            function: zinfer_protocol::FunctionCall {
                name: name.into(),
                arguments: json!(arguments),
            },
        }
    }

    #[test]
    fn tool_calls_and_reasoning_stream_as_openai_deltas() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Chat), false);
        let ClientReply::Chunk {
            id,
            body: ChunkBody { tokens, .. },
            ..
        } = chunk(0, "")
        else {
            unreachable!()
        };
        let mut payloads = encoder.on_reply(ClientReply::Chunk {
            id: id.clone(),
            body: ChunkBody {
                tokens: tokens.clone(),
                reasoning: "Paris?".into(),
                ..ChunkBody::default()
            },
        });
        for (index, c) in [call("a", "f", "{\"x\":1}"), call("b", "g", "{}")]
            .into_iter()
            .enumerate()
        {
            payloads.extend(encoder.on_reply(ClientReply::Chunk {
                id: id.clone(),
                body: ChunkBody {
                    index: index as u32 + 1,
                    tokens: tokens.clone(),
                    tool_calls: vec![c],
                    ..ChunkBody::default()
                },
            }));
        }
        let ClientReply::Done { id, mut body } = done() else {
            unreachable!()
        };
        body.finish_reason = FinishReason::ToolCalls;
        payloads.extend(encoder.on_reply(ClientReply::Done { id, body }));
        let events = parse(&payloads);
        assert_eq!(events.len(), 4, "{events:?}");
        let delta = |i: usize| &events[i]["choices"][0]["delta"];
        assert_eq!(delta(0)["reasoning_content"], "Paris?");
        assert!(delta(0).get("content").is_none(), "{}", delta(0));
        assert_eq!(
            delta(1)["tool_calls"],
            json!([{"index": 0, "id": "a", "type": "function",
                    "function": {"name": "f", "arguments": "{\"x\":1}"}}])
        );
        assert_eq!(delta(2)["tool_calls"][0]["index"], 1);
        assert_eq!(events[3]["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_message_of_tool_calls_has_null_content() {
        let out = Collected {
            text: "\n".into(),
            reasoning: "think".into(),
            tool_calls: vec![call("a", "f", "{}")],
            ..Collected::default()
        };
        let body = full_response(
            &meta(Endpoint::Chat),
            &[(out, FinishReason::ToolCalls)],
            &Usage::default(),
        );
        let message = &body["choices"][0]["message"];
        assert!(message["content"].is_null(), "{message}");
        assert_eq!(message["reasoning_content"], "think");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "f");
        assert!(message["tool_calls"][0].get("index").is_none());
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn completion_stream_without_usage() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Completions), false);
        let mut payloads = encoder.on_reply(chunk(0, ""));
        assert!(payloads.is_empty(), "no role chunk for completions");
        payloads.extend(encoder.on_reply(chunk(1, "Hi")));
        payloads.extend(encoder.on_reply(done()));
        let events = parse(&payloads);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["object"], "text_completion");
        assert_eq!(events[0]["choices"][0]["text"], "Hi");
        assert!(events[0].get("usage").is_none());
        assert_eq!(events[1]["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn a_router_error_mid_stream_is_an_error_event() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Chat), false);
        let payloads = encoder.on_reply(ClientReply::Error {
            id: Some("h-1".into()),
            code: ErrorCode::WorkerLost,
            message: "gone".into(),
            retryable: true,
        });
        let events = parse(&payloads);
        assert_eq!(events[0]["error"]["code"], "worker_lost");
        assert_eq!(payloads.last().map(String::as_str), Some(DONE));
        assert!(encoder.finished());
    }

    #[test]
    fn full_responses() {
        let used = Usage {
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 1,
        };
        let body = full_response(
            &meta(Endpoint::Chat),
            &[(collected("Paris", Vec::new()), FinishReason::Stop)],
            &used,
        );
        assert!(body["choices"][0]["logprobs"].is_null());
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["message"]["content"], "Paris");
        assert_eq!(body["choices"][0]["message"]["role"], "assistant");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["total_tokens"], 4);
        let body = full_response(
            &meta(Endpoint::Completions),
            &[(collected("x", Vec::new()), FinishReason::Length)],
            &used,
        );
        assert!(body["choices"][0]["logprobs"].is_null());
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["choices"][0]["text"], "x");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn chat_logprobs_are_openai_shaped_streamed_and_not() {
        let used = Usage::default();
        let entries = vec![
            entry(5, "Par", -0.25, &[(5, "Par", -0.25), (9, "Lon", -2.0)]),
            entry(6, "\u{e9}", f32::NEG_INFINITY, &[]),
        ];
        let body = full_response(
            &with_logprobs(Endpoint::Chat),
            &[(collected("Par\u{e9}", entries.clone()), FinishReason::Stop)],
            &used,
        );
        let content = &body["choices"][0]["logprobs"]["content"];
        assert_eq!(content.as_array().map(Vec::len), Some(2), "{body}");
        assert_eq!(content[0]["token"], "Par");
        assert_eq!(content[0]["logprob"], -0.25);
        assert_eq!(content[0]["bytes"], json!([80, 97, 114]));
        assert_eq!(content[0]["top_logprobs"][1]["token"], "Lon");
        assert_eq!(content[0]["top_logprobs"][1]["logprob"], -2.0);
        assert_eq!(
            content[0]["top_logprobs"][1]["bytes"],
            json!([76, 111, 110])
        );
        assert_eq!(content[1]["bytes"], json!([0xc3, 0xa9]));
        assert_eq!(content[1]["logprob"], -9999.0, "no -inf in JSON");
        assert_eq!(content[1]["top_logprobs"], json!([]));

        let mut encoder = StreamEncoder::new(with_logprobs(Endpoint::Chat), false);
        let mut payloads = encoder.on_reply(chunk_with(0, "", vec![entries[0].clone()]));
        payloads.extend(encoder.on_reply(chunk_with(1, "Par\u{e9}", vec![entries[1].clone()])));
        payloads.extend(encoder.on_reply(done()));
        let events = parse(&payloads);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(
            events[0]["choices"][0]["logprobs"]["content"][0]["token"], "Par",
            "a chunk with held-back text still carries its tokens' logprobs"
        );
        assert_eq!(events[0]["choices"][0]["delta"]["content"], "");
        assert_eq!(
            events[1]["choices"][0]["logprobs"]["content"][0]["token"],
            "\u{e9}"
        );
        assert!(events[2]["choices"][0]["logprobs"].is_null());
        assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn completion_logprobs_are_openai_shaped_streamed_and_not() {
        let used = Usage::default();
        let entries = vec![
            entry(5, " red", -0.5, &[(7, " blue", -0.25), (5, " red", -0.5)]),
            entry(
                6,
                ",",
                -0.125,
                &[
                    (6, ",", -0.125),
                    (8, "\u{fffd}", -3.0),
                    (9, "\u{fffd}", -4.0),
                ],
            ),
            entry(10, " green", -1.0, &[]),
        ];
        let body = full_response(
            &with_logprobs(Endpoint::Completions),
            &[(
                collected(" red, green", entries.clone()),
                FinishReason::Length,
            )],
            &used,
        );
        let logprobs = &body["choices"][0]["logprobs"];
        assert_eq!(logprobs["tokens"], json!([" red", ",", " green"]));
        assert_eq!(logprobs["token_logprobs"], json!([-0.5, -0.125, -1.0]));
        assert_eq!(logprobs["text_offset"], json!([0, 4, 5]));
        assert_eq!(
            logprobs["top_logprobs"][0],
            json!({" blue": -0.25, " red": -0.5})
        );
        assert_eq!(
            logprobs["top_logprobs"][1],
            json!({",": -0.125, "\u{fffd}": -3.0}),
            "equal texts keep the likelier"
        );
        assert_eq!(
            logprobs["top_logprobs"][2],
            json!({" green": -1.0}),
            "the chosen token is always listed"
        );

        let mut encoder = StreamEncoder::new(with_logprobs(Endpoint::Completions), false);
        let mut payloads = encoder.on_reply(chunk_with(0, " red,", entries[..2].to_vec()));
        payloads.extend(encoder.on_reply(chunk_with(1, " green", entries[2..].to_vec())));
        payloads.extend(encoder.on_reply(done()));
        let events = parse(&payloads);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(
            events[0]["choices"][0]["logprobs"]["text_offset"],
            json!([0, 4])
        );
        assert_eq!(
            events[1]["choices"][0]["logprobs"]["text_offset"],
            json!([5]),
            "offsets run on across chunks"
        );
        assert_eq!(
            events[1]["choices"][0]["logprobs"]["tokens"],
            json!([" green"])
        );
        assert!(events[2]["choices"][0]["logprobs"].is_null());
    }

    /// The stop token (EOS) ends the completions' logprobs, whole and
    /// streamed, after an echoed prompt; chat leaves it out, as OpenAI does.
    #[test]
    fn completions_show_the_stop_token_chat_does_not() {
        let eos = entry(2, "<|endoftext|>", -0.5, &[]);
        let out = Collected {
            text: " b".into(),
            entries: vec![entry(9, " b", -1.0, &[])],
            prompt: vec![PromptLogprob {
                token: 4,
                text: "a".into(),
                logprob: None,
                top_logprobs: Vec::new(),
            }],
            stop: Some(eos.clone()),
            ..Collected::default()
        };
        let echoed = Meta {
            echo: vec!["a".into()],
            ..with_logprobs(Endpoint::Completions)
        };
        let body = full_response(&echoed, &[(out, FinishReason::Stop)], &Usage::default());
        let choice = &body["choices"][0];
        assert_eq!(choice["text"], "a b");
        assert_eq!(
            choice["logprobs"]["tokens"],
            json!(["a", " b", "<|endoftext|>"])
        );
        assert_eq!(
            choice["logprobs"]["token_logprobs"],
            json!([null, -1.0, -0.5])
        );
        let done = |stop: Option<TokenLogprob>| ClientReply::Done {
            id: "h-1".into(),
            body: DoneBody {
                stop_logprob: stop,
                ..DoneBody::new(FinishReason::Stop, Usage::default(), Timings::default())
            },
        };
        let mut encoder = StreamEncoder::new(with_logprobs(Endpoint::Completions), false);
        let events = parse(&encoder.on_reply(done(Some(eos.clone()))));
        assert_eq!(
            events[0]["choices"][0]["logprobs"]["tokens"],
            json!(["<|endoftext|>"])
        );
        assert_eq!(events[1]["choices"][0]["finish_reason"], "stop");
        let mut encoder = StreamEncoder::new(with_logprobs(Endpoint::Chat), false);
        let events = parse(&encoder.on_reply(done(Some(eos))));
        assert!(
            events.iter().all(|e| e["choices"][0]["logprobs"].is_null()
                || e["choices"][0]["logprobs"]["content"] == json!([])),
            "{events:?}"
        );
    }

    #[test]
    fn no_logprobs_unless_asked() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Completions), false);
        let payloads = encoder.on_reply(chunk(0, "Hi"));
        let events = parse(&payloads);
        assert!(events[0]["choices"][0]["logprobs"].is_null());
    }
}
