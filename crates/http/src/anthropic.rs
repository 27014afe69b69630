//! Anthropic's Messages API (`POST /v1/messages`, `POST
//! /v1/messages/count_tokens`) on top of the chat translation. Pure: a
//! Messages body becomes the OpenAI chat body it means, which
//! [`translate::chat`] turns into a protocol request (the same template,
//! tool parser and forcing grammar as chat completions); replies become a
//! Messages body or its typed server-sent events.
//!
//! What is refused, by name: image and document content blocks, server
//! tools (`web_search`, `bash`, ...), and fields Anthropic does not define.

use axum::http::StatusCode;
use serde_json::{Map, Value, json};
use zinfer_protocol::{FinishReason, ToolCall, Usage};

use crate::error::ApiError;
use crate::respond::{Collected, Part, PartEncoder, Sse};
use crate::translate::{self, Context, Translated};

/// Fields of `POST /v1/messages`.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
];

/// A valid Messages request.
#[derive(Debug, Clone, PartialEq)]
pub struct Messages {
    /// The protocol request and what the response needs.
    pub translated: Translated,
    /// `stop_sequences`, to tell which one ended the output.
    pub stop_sequences: Vec<String>,
}

/// Translates a `/v1/messages` body; `count`: for `count_tokens`, where
/// `max_tokens` is not asked for.
pub fn request(bytes: &[u8], ctx: Context<'_>, count: bool) -> Result<Messages, ApiError> {
    let body = translate::json_object(bytes, FIELDS)?;
    let mut chat = Map::new();
    let mut turns = Vec::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => turns.push(json!({"role": "system", "content": text})),
        Some(Value::Array(blocks)) => {
            let parts = text_parts(blocks, "system")?;
            turns.push(json!({"role": "system", "content": parts}));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "system",
                "\"system\" must be a string or an array of text blocks",
            ));
        }
    }
    let Some(Value::Array(messages)) = body.get("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "\"messages\" is required: an array of {\"role\", \"content\"}",
        ));
    };
    for (i, message) in messages.iter().enumerate() {
        message_turns(i, message, &mut turns)?;
    }
    chat.insert("messages".into(), Value::Array(turns));
    match body.get("max_tokens") {
        Some(Value::Number(n)) => {
            chat.insert("max_tokens".into(), Value::Number(n.clone()));
        }
        None | Some(Value::Null) if count => {}
        _ => {
            return Err(ApiError::invalid(
                "max_tokens",
                "\"max_tokens\" is required: the most tokens to generate",
            ));
        }
    }
    for (from, to) in [
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stream", "stream"),
        ("stop_sequences", "stop"),
    ] {
        if let Some(value) = body.get(from).filter(|v| !v.is_null()) {
            chat.insert(to.into(), value.clone());
        }
    }
    if let Some(metadata) = body.get("metadata").filter(|v| !v.is_null()) {
        match metadata.get("user_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(user)) => {
                chat.insert("user".into(), json!(user));
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "metadata.user_id",
                    "\"metadata.user_id\" must be a string",
                ));
            }
        }
    }
    if let Some(tier) = body.get("service_tier").filter(|v| !v.is_null())
        && !matches!(tier.as_str(), Some("auto" | "standard_only"))
    {
        return Err(ApiError::invalid(
            "service_tier",
            "\"service_tier\" must be \"auto\" or \"standard_only\"",
        ));
    }
    if let Some(thinking) = body.get("thinking").filter(|v| !v.is_null()) {
        let enabled = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::invalid(
                    "thinking",
                    "\"thinking.type\" must be \"enabled\" or \"disabled\"",
                ));
            }
        };
        chat.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": enabled}),
        );
    }
    tools(&body, &mut chat)?;
    let chat = Value::Object(chat).to_string();
    let mut translated = translate::chat(chat.as_bytes(), ctx)?;
    // Which stop sequence ended an output is told from its tokens' texts.
    if !translated.request.stop.is_empty() {
        translated.request.logprobs = true;
    }
    Ok(Messages {
        stop_sequences: translated.request.stop.clone(),
        translated,
    })
}

/// Text blocks as OpenAI text parts; anything else is refused by name.
fn text_parts(blocks: &[Value], param: &str) -> Result<Vec<Value>, ApiError> {
    blocks
        .iter()
        .map(|block| match (kind(block), block.get("text")) {
            (Some("text"), Some(Value::String(text))) => Ok(json!({"type": "text", "text": text})),
            (other, _) => Err(refused_block(param, other)),
        })
        .collect()
}

fn kind(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// The 400 for a content block that is not served here.
fn refused_block(param: &str, kind: Option<&str>) -> ApiError {
    match kind {
        Some(kind @ ("image" | "document")) => ApiError::unsupported(
            param,
            format!("{kind} content blocks are not supported: the served models read text only"),
        ),
        Some(kind) => ApiError::unsupported(
            param,
            format!("content blocks of type {kind:?} are not supported here"),
        ),
        None => ApiError::invalid(param, "each content block needs a \"type\""),
    }
}

/// One Messages turn as OpenAI chat turns: a user turn's `tool_result`
/// blocks become `tool` turns (in place, so text after them follows
/// them); an assistant turn's `tool_use` blocks become its `tool_calls`,
/// and its `thinking` its `reasoning_content`.
fn message_turns(i: usize, message: &Value, turns: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = format!("messages[{i}]");
    let role = match message.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant")) => role,
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.role"),
                "\"role\" must be \"user\" or \"assistant\"",
            ));
        }
    };
    let blocks = match message.get("content") {
        Some(Value::String(text)) => {
            turns.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.content"),
                "\"content\" must be a string or an array of content blocks",
            ));
        }
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning = String::new();
    for (j, block) in blocks.iter().enumerate() {
        let block_param = format!("{param}.content[{j}]");
        match (role, kind(block)) {
            (_, Some("text")) => {
                texts.extend(text_parts(std::slice::from_ref(block), &block_param)?)
            }
            ("user", Some("tool_result")) => {
                if !texts.is_empty() {
                    turns.push(json!({"role": "user", "content": std::mem::take(&mut texts)}));
                }
                let content = match block.get("content") {
                    None | Some(Value::Null) => json!(""),
                    Some(Value::String(text)) => json!(text),
                    Some(Value::Array(parts)) => {
                        Value::Array(text_parts(parts, &format!("{block_param}.content"))?)
                    }
                    Some(_) => {
                        return Err(ApiError::invalid(
                            block_param,
                            "a tool_result's \"content\" is a string or text blocks",
                        ));
                    }
                };
                let Some(id) = block.get("tool_use_id").and_then(Value::as_str) else {
                    return Err(ApiError::invalid(
                        block_param,
                        "a tool_result needs \"tool_use_id\"",
                    ));
                };
                turns.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("assistant", Some("tool_use")) => {
                let (Some(id), Some(name)) = (
                    block.get("id").and_then(Value::as_str),
                    block.get("name").and_then(Value::as_str),
                ) else {
                    return Err(ApiError::invalid(
                        block_param,
                        "a tool_use block needs \"id\", \"name\" and \"input\"",
                    ));
                };
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("assistant", Some("thinking")) => {
                if let Some(text) = block.get("thinking").and_then(Value::as_str) {
                    reasoning.push_str(text);
                }
            }
            ("assistant", Some("redacted_thinking")) => {}
            (_, other) => return Err(refused_block(&block_param, other)),
        }
    }
    if role == "user" {
        if !texts.is_empty() || blocks.is_empty() {
            turns.push(json!({"role": "user", "content": texts}));
        }
        return Ok(());
    }
    let mut turn = json!({"role": "assistant", "content": texts});
    if !calls.is_empty() {
        turn["tool_calls"] = Value::Array(calls);
        if turn["content"] == json!([]) {
            turn["content"] = Value::Null;
        }
    }
    if !reasoning.is_empty() {
        turn["reasoning_content"] = json!(reasoning);
    }
    turns.push(turn);
    Ok(())
}

/// `tools` (custom tools with `input_schema`) and `tool_choice` as
/// OpenAI's; server tools are refused by name.
fn tools(body: &Map<String, Value>, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    if let Some(list) = body.get("tools").filter(|v| !v.is_null()) {
        let Value::Array(list) = list else {
            return Err(ApiError::invalid("tools", "\"tools\" must be an array"));
        };
        let mut functions = Vec::with_capacity(list.len());
        for (i, tool) in list.iter().enumerate() {
            let param = format!("tools[{i}]");
            if let Some(kind) = kind(tool).filter(|k| *k != "custom") {
                return Err(ApiError::unsupported(
                    &param,
                    format!(
                        "tool type {kind:?} is not supported: only custom tools (\"name\", \"input_schema\") are served"
                    ),
                ));
            }
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                return Err(ApiError::invalid(param, "a tool needs a \"name\""));
            };
            let mut function = json!({"name": name});
            if let Some(description) = tool.get("description").filter(|v| !v.is_null()) {
                function["description"] = description.clone();
            }
            if let Some(schema) = tool.get("input_schema").filter(|v| !v.is_null()) {
                function["parameters"] = schema.clone();
            }
            functions.push(json!({"type": "function", "function": function}));
        }
        chat.insert("tools".into(), Value::Array(functions));
    }
    let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let mapped = match kind(choice) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "a tool_choice of type \"tool\" needs \"name\"",
                ));
            }
        },
        _ => {
            return Err(ApiError::invalid(
                "tool_choice",
                "\"tool_choice.type\" must be \"auto\", \"any\", \"tool\" or \"none\"",
            ));
        }
    };
    chat.insert("tool_choice".into(), mapped);
    if let Some(disable) = choice.get("disable_parallel_tool_use") {
        let Some(disable) = disable.as_bool() else {
            return Err(ApiError::invalid(
                "tool_choice",
                "\"disable_parallel_tool_use\" must be a boolean",
            ));
        };
        chat.insert("parallel_tool_calls".into(), json!(!disable));
    }
    Ok(())
}

/// Anthropic's `stop_reason` for how the output ended; `stop_sequence`:
/// the stop sequence that ended it, when one did.
fn stop_reason(reason: FinishReason, stop_sequence: Option<&str>) -> &'static str {
    match reason {
        FinishReason::ToolCalls => "tool_use",
        FinishReason::Length | FinishReason::Deadline => "max_tokens",
        FinishReason::Stop | FinishReason::Cancelled if stop_sequence.is_some() => "stop_sequence",
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
    }
}

/// Anthropic's `usage`: `input_tokens` are the prompt tokens not read
/// from the prefix cache, `cache_read_input_tokens` those that were.
fn usage(used: &Usage) -> Value {
    json!({
        "input_tokens": used.prompt_tokens.saturating_sub(used.cached_tokens),
        "output_tokens": used.completion_tokens,
        "cache_read_input_tokens": used.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// A call as a `tool_use` block; `input` is the arguments' object.
fn tool_use(call: &ToolCall) -> Value {
    let input = match &call.function.arguments {
        Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| json!({})),
        other => other.clone(),
    };
    json!({"type": "tool_use", "id": call.id, "name": call.function.name, "input": input})
}

/// What a Messages response repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageMeta {
    /// `msg_...`.
    pub id: String,
    /// The model name echoed back.
    pub model: String,
    /// The request's `stop_sequences`.
    pub stop_sequences: Vec<String>,
}

impl MessageMeta {
    /// The stop sequence that ended an output that stopped with `text`
    /// (its last tokens' texts `tail`), if one did rather than the model's
    /// end token: the output stops right before it, so it is what the
    /// tokens' texts hold past `text`.
    fn stop_sequence(
        &self,
        reason: FinishReason,
        ended_by_token: bool,
        tail: &str,
    ) -> Option<&str> {
        if reason != FinishReason::Stop || ended_by_token || self.stop_sequences.is_empty() {
            return None;
        }
        self.stop_sequences
            .iter()
            .filter_map(|stop| tail.rfind(stop.as_str()).map(|at| (at, stop)))
            .min_by_key(|(at, _)| *at)
            .map(|(_, stop)| stop.as_str())
            .or(self.stop_sequences.first().map(String::as_str))
    }
}

/// The whole (non-streaming) Messages response.
pub fn message(meta: &MessageMeta, out: &Collected, reason: FinishReason, used: &Usage) -> Value {
    let tail: String = out.entries.iter().map(|e| e.text.as_str()).collect();
    let tail = tail.get(out.text.len()..).unwrap_or(&tail);
    let stop = meta.stop_sequence(reason, out.stop.is_some(), tail);
    let mut content = Vec::new();
    if !out.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": out.reasoning, "signature": ""}));
    }
    if !out.text.is_empty() || (out.tool_calls.is_empty() && content.is_empty()) {
        content.push(json!({"type": "text", "text": out.text}));
    }
    content.extend(out.tool_calls.iter().map(tool_use));
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": stop_reason(reason, stop),
        "stop_sequence": stop,
        "usage": usage(used),
    })
}

/// `count_tokens`' body.
pub fn count(used: &Usage) -> Value {
    json!({"input_tokens": used.prompt_tokens})
}

/// Anthropic's error `type` and the HTTP status for an error.
fn error_kind(error: &ApiError) -> (StatusCode, &'static str) {
    let status = error.status();
    let kind = match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    (status, kind)
}

/// Anthropic's error body, `{"type": "error", "error": {"type",
/// "message"}}`, and its status; also a stream's `error` event.
pub fn error(error: &ApiError) -> (StatusCode, Value) {
    let (status, kind) = error_kind(error);
    let mut message = error.to_string();
    if let ApiError::Unauthorized = error {
        message = "missing or incorrect API key; send it as \"x-api-key: KEY\" or \
                   \"Authorization: Bearer KEY\""
            .into();
    }
    (
        status,
        json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

/// Which content block is open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
}

/// Turns one streamed request's replies into Messages events: (event
/// name, JSON data). `message_start` and a `ping` come with the first
/// reply; then per block `content_block_start`, its deltas and
/// `content_block_stop`; at the end `message_delta` (stop reason, usage)
/// and `message_stop`.
#[derive(Debug)]
pub struct MessageStream {
    meta: MessageMeta,
    started: bool,
    finished: bool,
    /// The open block and its index.
    open: Option<(Block, usize)>,
    /// Blocks started so far: the next one's index.
    blocks: usize,
    /// The output text so far and its tokens' texts, to tell which stop
    /// sequence ended it.
    text: String,
    tokens: String,
}

impl MessageStream {
    /// An encoder for one request.
    pub fn new(meta: MessageMeta) -> Self {
        MessageStream {
            meta,
            started: false,
            finished: false,
            open: None,
            blocks: 0,
            text: String::new(),
            tokens: String::new(),
        }
    }

    fn start(&mut self, out: &mut Vec<Sse>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({"id": self.meta.id, "type": "message", "role": "assistant",
            "content": [], "model": self.meta.model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}});
        out.push(event(
            "message_start",
            json!({"type": "message_start", "message": message}),
        ));
        out.push(event("ping", json!({"type": "ping"})));
    }

    fn close(&mut self, out: &mut Vec<Sse>) {
        if let Some((_, index)) = self.open.take() {
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// A delta of `block`'s kind, opening it (and closing another) first.
    fn delta(&mut self, block: Block, text: &str, out: &mut Vec<Sse>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some((open, index)) if open == block => index,
            _ => {
                self.close(out);
                let index = self.blocks;
                self.blocks += 1;
                let start = match block {
                    Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                    Block::Text => json!({"type": "text", "text": ""}),
                };
                out.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": start}),
                ));
                self.open = Some((block, index));
                index
            }
        };
        let delta = match block {
            Block::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            Block::Text => json!({"type": "text_delta", "text": text}),
        };
        out.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    /// A whole call: its own `tool_use` block with one `input_json_delta`.
    fn call(&mut self, call: &ToolCall, out: &mut Vec<Sse>) {
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        let mut block = tool_use(call);
        let input = std::mem::replace(&mut block["input"], json!({}));
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        out.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
        ));
        out.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }

    fn output(
        &mut self,
        text: &str,
        reasoning: &str,
        calls: &[ToolCall],
        entries: &[zinfer_protocol::TokenLogprob],
        out: &mut Vec<Sse>,
    ) {
        self.start(out);
        self.delta(Block::Thinking, reasoning, out);
        self.delta(Block::Text, text, out);
        for call in calls {
            self.call(call, out);
        }
        self.text.push_str(text);
        self.tokens.extend(entries.iter().map(|e| e.text.as_str()));
    }
}

impl PartEncoder for MessageStream {
    /// Whether `message_stop` (or an error) went out.
    fn finished(&self) -> bool {
        self.finished
    }

    fn part(&mut self, part: Part) -> Vec<Sse> {
        let mut out = Vec::new();
        self.output(
            &part.text,
            &part.reasoning,
            &part.calls,
            &part.entries,
            &mut out,
        );
        let Some((finish_reason, used, stop_logprob)) = part.end else {
            return out;
        };
        if self.blocks == 0 {
            // Every message has a block, even an empty answer.
            self.open = Some((Block::Text, 0));
            self.blocks = 1;
            out.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
            ));
        }
        self.close(&mut out);
        let tail = self.tokens.get(self.text.len()..).unwrap_or(&self.tokens);
        let stop = self
            .meta
            .stop_sequence(finish_reason, stop_logprob.is_some(), tail)
            .map(str::to_string);
        out.push(event(
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(finish_reason, stop.as_deref()),
                          "stop_sequence": stop},
                "usage": usage(&used)}),
        ));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        self.finished = true;
        out
    }

    /// The `error` event that ends a stream that failed after it started.
    fn failed(&mut self, failure: &ApiError) -> Vec<Sse> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        vec![event("error", error(failure).1)]
    }
}

fn event(name: &'static str, data: Value) -> Sse {
    (name, data.to_string())
}
