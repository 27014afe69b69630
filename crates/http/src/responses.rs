//! OpenAI's Responses API (`POST /v1/responses`) on top of the chat
//! translation. Pure: a Responses body becomes the chat completions body it
//! means, which [`translate::chat`] turns into a protocol request (the same
//! template, tool parser and forcing grammar); replies become a response
//! object or its typed server-sent events.
//!
//! Responses are kept (by the caller, in [`crate::store`]) as the chat
//! turns they continue, so `previous_response_id` prepends them; `background`
//! and item references are refused, as are built-in tools (web search,
//! file search, computer use, ...), by name.

use serde_json::{Map, Value, json};
use zinfer_protocol::{FinishReason, ToolCall, Usage};

use crate::error::ApiError;
use crate::respond::{Collected, Part, PartEncoder, Sse};
use crate::translate::{self, Context, Translated};

/// Fields of `POST /v1/responses`.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "max_output_tokens",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "stream",
    "stream_options",
    "store",
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "truncation",
    "include",
    "previous_response_id",
    "background",
];

/// Fields passed to the chat translation as they are.
const SAME_IN_CHAT: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "stream",
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// A valid Responses request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The chat request it means.
    pub translated: Translated,
    /// With `store` (the default): the conversation as chat turns, the
    /// `instructions` left out (a continuation does not inherit them, as
    /// OpenAI's do not), to store with the output.
    pub turns: Option<Vec<Value>>,
    /// Whether to store the response.
    pub store: bool,
    /// `previous_response_id`.
    pub previous: Option<String>,
}

/// Translates a `/v1/responses` body; `previous` finds the stored
/// conversation of a `previous_response_id`.
pub fn request(
    bytes: &[u8],
    ctx: Context<'_>,
    previous: impl FnOnce(&str) -> Option<Vec<Value>>,
) -> Result<ResponsesRequest, ApiError> {
    let body = translate::json_object(bytes, FIELDS)?;
    let set = |name: &str| body.get(name).filter(|v| !v.is_null());
    let previous_id = match set("previous_response_id") {
        None => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "previous_response_id",
                "\"previous_response_id\" must be a string",
            ));
        }
    };
    let store = match set("store") {
        None => true,
        Some(Value::Bool(store)) => *store,
        Some(_) => return Err(ApiError::invalid("store", "\"store\" must be a boolean")),
    };
    if set("background").is_some_and(|b| b != &Value::Bool(false)) {
        return Err(ApiError::unsupported(
            "background",
            "\"background\" is not supported: responses are not stored",
        ));
    }
    if let Some(truncation) = set("truncation")
        && !matches!(truncation.as_str(), Some("disabled" | "auto"))
    {
        return Err(ApiError::invalid(
            "truncation",
            "\"truncation\" must be \"disabled\" or \"auto\"",
        ));
    }
    if set("include").is_some_and(|i| !i.is_array()) {
        return Err(ApiError::invalid("include", "\"include\" must be an array"));
    }
    let mut chat = Map::new();
    for name in SAME_IN_CHAT {
        if let Some(value) = set(name) {
            chat.insert((*name).into(), value.clone());
        }
    }
    if let Some(limit) = set("max_output_tokens") {
        chat.insert("max_tokens".into(), limit.clone());
    }
    if let Some(options) = set("stream_options") {
        // Only `include_obfuscation`, which pads nothing here.
        if options
            .as_object()
            .is_none_or(|o| o.keys().any(|k| k != "include_obfuscation"))
        {
            return Err(ApiError::invalid(
                "stream_options",
                "\"stream_options\" may only hold \"include_obfuscation\"",
            ));
        }
    }
    let mut messages = Vec::new();
    if let Some(instructions) = set("instructions") {
        let Some(text) = instructions.as_str() else {
            return Err(ApiError::invalid(
                "instructions",
                "\"instructions\" must be a string",
            ));
        };
        messages.push(json!({"role": "system", "content": text}));
    }
    let mut turns = match &previous_id {
        None => Vec::new(),
        Some(id) => previous(id).ok_or_else(|| ApiError::ResponseNotFound(id.clone()))?,
    };
    match set("input") {
        Some(Value::String(text)) => turns.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                input_item(i, item, &mut turns)?;
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "input",
                "\"input\" is required: a string or an array of input items",
            ));
        }
    }
    messages.extend(turns.iter().cloned());
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = set("tools") {
        chat.insert("tools".into(), function_tools(tools)?);
    }
    if let Some(choice) = set("tool_choice") {
        chat.insert("tool_choice".into(), tool_choice(choice)?);
    }
    if let Some(format) = set("text").and_then(|t| t.get("format"))
        && let Some(format) = response_format(format)?
    {
        chat.insert("response_format".into(), format);
    }
    if let Some(reasoning) = set("reasoning") {
        match reasoning.get("effort") {
            None | Some(Value::Null) => {}
            Some(effort) => {
                chat.insert("reasoning_effort".into(), effort.clone());
            }
        }
    }
    Ok(ResponsesRequest {
        translated: translate::chat(Value::Object(chat).to_string().as_bytes(), ctx)?,
        turns: store.then_some(turns),
        store,
        previous: previous_id,
    })
}

/// The assistant turn a response's output makes, to continue from: its
/// message text, its calls, its reasoning.
pub fn assistant_turn(response: &Value) -> Value {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for item in response["output"].as_array().into_iter().flatten() {
        match kind(item) {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    text.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            Some("reasoning") => {
                for part in item["summary"].as_array().into_iter().flatten() {
                    reasoning.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            Some("function_call") => calls.push(json!({"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}})),
            _ => {}
        }
    }
    let mut turn = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        turn["tool_calls"] = Value::Array(calls);
        if text.is_empty() {
            turn["content"] = Value::Null;
        }
    }
    if !reasoning.is_empty() {
        turn["reasoning_content"] = json!(reasoning);
    }
    turn
}

fn kind(value: &Value) -> Option<&str> {
    value.get("type").and_then(Value::as_str)
}

/// One input item as chat turns: messages, function calls (joined to the
/// assistant turn before them) and their outputs (tool turns); reasoning
/// items are dropped, the template writes its own.
fn input_item(i: usize, item: &Value, turns: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = format!("input[{i}]");
    match kind(item) {
        None | Some("message") => {
            let role = match item.get("role").and_then(Value::as_str) {
                Some(role @ ("user" | "assistant" | "system" | "developer")) => role,
                _ => {
                    return Err(ApiError::invalid(
                        format!("{param}.role"),
                        "\"role\" must be user, assistant, system or developer",
                    ));
                }
            };
            let content = text_content(item.get("content"), &format!("{param}.content"))?;
            turns.push(json!({"role": role, "content": content}));
        }
        Some("function_call") => {
            let (Some(id), Some(name)) = (
                item.get("call_id").and_then(Value::as_str),
                item.get("name").and_then(Value::as_str),
            ) else {
                return Err(ApiError::invalid(
                    param,
                    "a function_call item needs \"call_id\", \"name\" and \"arguments\"",
                ));
            };
            let arguments = item.get("arguments").cloned().unwrap_or(json!("{}"));
            let call = json!({"id": id, "type": "function",
                "function": {"name": name, "arguments": arguments}});
            match turns.last_mut() {
                Some(last) if last["role"] == "assistant" => {
                    if !last["tool_calls"].is_array() {
                        last["tool_calls"] = json!([]);
                    }
                    if let Some(calls) = last["tool_calls"].as_array_mut() {
                        calls.push(call);
                    }
                }
                _ => {
                    turns.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}))
                }
            }
        }
        Some("function_call_output") => {
            let Some(id) = item.get("call_id").and_then(Value::as_str) else {
                return Err(ApiError::invalid(
                    param,
                    "a function_call_output item needs \"call_id\" and \"output\"",
                ));
            };
            let output = text_content(item.get("output"), &format!("{param}.output"))?;
            turns.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        }
        Some("reasoning") => {}
        Some(other) => {
            return Err(ApiError::unsupported(
                &param,
                format!("input items of type {other:?} are not supported"),
            ));
        }
    }
    Ok(())
}

/// A message's content or a call's output: a string, or text parts as
/// chat's.
fn text_content(value: Option<&Value>, param: &str) -> Result<Value, ApiError> {
    match value {
        Some(Value::String(text)) => Ok(json!(text)),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| content_part(&format!("{param}[{j}]"), part))
            .collect(),
        _ => Err(ApiError::invalid(
            param,
            format!("{param:?} must be a string or an array of text parts"),
        )),
    }
}

/// A text part (`input_text`, `output_text`) as chat's; images and files
/// are refused by name.
fn content_part(param: &str, part: &Value) -> Result<Value, ApiError> {
    match (kind(part), part.get("text")) {
        (Some("input_text" | "output_text" | "text"), Some(Value::String(text))) => {
            Ok(json!({"type": "text", "text": text}))
        }
        (Some(kind @ ("input_image" | "input_file" | "input_audio")), _) => {
            Err(ApiError::unsupported(
                param,
                format!("{kind} parts are not supported: the served models read text only"),
            ))
        }
        _ => Err(ApiError::invalid(
            param,
            "content parts are {\"type\": \"input_text\", \"text\": ...}",
        )),
    }
}

/// Function tools in chat's shape; built-in tools are refused by type.
fn function_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(ApiError::invalid("tools", "\"tools\" must be an array"));
    };
    let mut functions = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let param = format!("tools[{i}]");
        match kind(tool) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    &param,
                    format!(
                        "built-in tool {other:?} is not supported: only function tools are served"
                    ),
                ));
            }
            None => return Err(ApiError::invalid(param, "a tool needs a \"type\"")),
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(value) = tool.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), value.clone());
            }
        }
        functions.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(functions))
}

/// `tool_choice` in chat's shape.
fn tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        _ => match (kind(choice), choice.get("name").and_then(Value::as_str)) {
            (Some("function"), Some(name)) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            (Some(other), _) if other != "function" => Err(ApiError::unsupported(
                "tool_choice",
                format!("tool_choice of type {other:?} is not supported"),
            )),
            _ => Err(ApiError::invalid(
                "tool_choice",
                "\"tool_choice\" is \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
            )),
        },
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(format: &Value) -> Result<Option<Value>, ApiError> {
    match kind(format) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut spec = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(value) = format.get(key).filter(|v| !v.is_null()) {
                    spec.insert(key.into(), value.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": spec})))
        }
        _ => Err(ApiError::invalid(
            "text.format",
            "\"text.format.type\" must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// What a response object repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    /// `resp_...`; its items' ids are derived from it.
    pub id: String,
    /// Unix seconds when the request arrived.
    pub created: u64,
    /// The model name echoed back.
    pub model: String,
    /// Whether it is stored.
    pub store: bool,
    /// The response it continues.
    pub previous: Option<String>,
}

impl ResponseMeta {
    fn item_id(&self, prefix: &str, index: usize) -> String {
        let id = self.id.trim_start_matches("resp_");
        format!("{prefix}_{id}_{index}")
    }

    /// The response object with `output` and how it ended (`None`: still
    /// in progress).
    fn object(&self, output: Vec<Value>, ended: Option<FinishReason>, used: &Usage) -> Value {
        let (status, incomplete) = match ended {
            None => ("in_progress", Value::Null),
            Some(FinishReason::Length | FinishReason::Deadline) => {
                ("incomplete", json!({"reason": "max_output_tokens"}))
            }
            Some(_) => ("completed", Value::Null),
        };
        let usage = ended.map(|_| {
            json!({
                "input_tokens": used.prompt_tokens,
                "input_tokens_details": {"cached_tokens": used.cached_tokens},
                "output_tokens": used.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": used.prompt_tokens + used.completion_tokens,
            })
        });
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "store": self.store,
            "previous_response_id": self.previous,
            "metadata": {},
            "usage": usage,
        })
    }
}

fn reasoning_item(id: String, text: &str) -> Value {
    json!({"type": "reasoning", "id": id,
        "summary": [{"type": "summary_text", "text": text}]})
}

fn message_item(id: String, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(id: String, call: &ToolCall, status: &str) -> Value {
    let arguments = match &call.function.arguments {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    json!({"type": "function_call", "id": id, "call_id": call.id, "name": call.function.name,
        "arguments": arguments, "status": status})
}

/// The whole (non-streaming) response object.
pub fn response(meta: &ResponseMeta, out: &Collected, reason: FinishReason, used: &Usage) -> Value {
    let mut output = Vec::new();
    if !out.reasoning.is_empty() {
        output.push(reasoning_item(
            meta.item_id("rs", output.len()),
            &out.reasoning,
        ));
    }
    if !out.text.is_empty() || out.tool_calls.is_empty() {
        output.push(message_item(
            meta.item_id("msg", output.len()),
            &out.text,
            "completed",
        ));
    }
    for call in &out.tool_calls {
        output.push(call_item(
            meta.item_id("fc", output.len()),
            call,
            "completed",
        ));
    }
    meta.object(output, Some(reason), used)
}

/// The output item a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
}

/// What is done with a finished response object (it is stored).
type Keep = Box<dyn FnOnce(&Value) + Send>;

/// Turns one streamed request's replies into Responses events (event
/// name, JSON data, each with its `sequence_number`): `response.created`
/// and `response.in_progress`, then per output item
/// `response.output_item.added`, its parts and deltas
/// (`response.output_text.delta`, `response.reasoning_summary_text.delta`,
/// `response.function_call_arguments.delta`) and their `.done`s,
/// `response.output_item.done`; at the end `response.completed` (or
/// `response.incomplete` when `max_output_tokens` ran out).
pub struct ResponseStream {
    meta: ResponseMeta,
    /// Called with the finished response object (to store it).
    keep: Option<Keep>,
    sequence: u64,
    started: bool,
    finished: bool,
    /// The open item and its text so far.
    open: Option<(Open, String)>,
    /// Items done, in order.
    output: Vec<Value>,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream")
            .field("id", &self.meta.id)
            .field("sequence", &self.sequence)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl ResponseStream {
    /// Hands the finished response object to `keep` (to store it).
    #[must_use]
    pub fn keeping(mut self, keep: impl FnOnce(&Value) + Send + 'static) -> Self {
        self.keep = Some(Box::new(keep));
        self
    }

    /// An encoder for one request.
    pub fn new(meta: ResponseMeta) -> Self {
        ResponseStream {
            meta,
            keep: None,
            sequence: 0,
            started: false,
            finished: false,
            open: None,
            output: Vec::new(),
        }
    }

    fn event(&mut self, name: &'static str, mut data: Value, out: &mut Vec<Sse>) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push((name, data.to_string()));
    }

    fn start(&mut self, out: &mut Vec<Sse>) {
        if self.started {
            return;
        }
        self.started = true;
        let response = self.meta.object(Vec::new(), None, &Usage::default());
        self.event("response.created", json!({"response": response}), out);
        let response = self.meta.object(Vec::new(), None, &Usage::default());
        self.event("response.in_progress", json!({"response": response}), out);
    }

    /// Closes the open item: its `.done` events.
    fn close(&mut self, out: &mut Vec<Sse>) {
        let Some((open, text)) = self.open.take() else {
            return;
        };
        let index = self.output.len();
        let item = match open {
            Open::Reasoning => {
                let id = self.meta.item_id("rs", index);
                let part = json!({"type": "summary_text", "text": text});
                let at = json!({"item_id": id, "output_index": index, "summary_index": 0});
                let mut done = at.clone();
                done["text"] = json!(text);
                self.event("response.reasoning_summary_text.done", done, out);
                let mut done = at;
                done["part"] = part;
                self.event("response.reasoning_summary_part.done", done, out);
                reasoning_item(id, &text)
            }
            Open::Message => {
                let id = self.meta.item_id("msg", index);
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["text"] = json!(text);
                done["logprobs"] = json!([]);
                self.event("response.output_text.done", done, out);
                let mut done = at;
                done["part"] = json!({"type": "output_text", "text": text, "annotations": []});
                self.event("response.content_part.done", done, out);
                message_item(id, &text, "completed")
            }
        };
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
            out,
        );
        self.output.push(item);
    }

    /// Text of kind `open`, opening its item (and closing another) first.
    fn delta(&mut self, open: Open, text: &str, out: &mut Vec<Sse>) {
        if text.is_empty() {
            return;
        }
        if self.open.as_ref().map(|(o, _)| *o) != Some(open) {
            self.close(out);
            let index = self.output.len();
            let (item, name, part) = match open {
                Open::Reasoning => {
                    let id = self.meta.item_id("rs", index);
                    (
                        json!({"type": "reasoning", "id": id, "summary": []}),
                        "response.reasoning_summary_part.added",
                        json!({"item_id": id, "output_index": index, "summary_index": 0,
                            "part": {"type": "summary_text", "text": ""}}),
                    )
                }
                Open::Message => {
                    let id = self.meta.item_id("msg", index);
                    (
                        json!({"type": "message", "id": id, "status": "in_progress",
                            "role": "assistant", "content": []}),
                        "response.content_part.added",
                        json!({"item_id": id, "output_index": index, "content_index": 0,
                            "part": {"type": "output_text", "text": "", "annotations": []}}),
                    )
                }
            };
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
                out,
            );
            self.event(name, part, out);
            self.open = Some((open, String::new()));
        }
        let index = self.output.len();
        if let Some((_, so_far)) = self.open.as_mut() {
            so_far.push_str(text);
        }
        match open {
            Open::Reasoning => {
                let id = self.meta.item_id("rs", index);
                self.event(
                    "response.reasoning_summary_text.delta",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": text}),
                    out,
                );
            }
            Open::Message => {
                let id = self.meta.item_id("msg", index);
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "delta": text, "logprobs": []}),
                    out,
                );
            }
        }
    }

    /// A whole call: its item, one arguments delta, and its `.done`s.
    fn call(&mut self, call: &ToolCall, out: &mut Vec<Sse>) {
        self.close(out);
        let index = self.output.len();
        let id = self.meta.item_id("fc", index);
        let done = call_item(id.clone(), call, "completed");
        let mut added = call_item(id.clone(), call, "in_progress");
        added["arguments"] = json!("");
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
            out,
        );
        let arguments = done["arguments"].clone();
        self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
            out,
        );
        self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": arguments}),
            out,
        );
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
            out,
        );
        self.output.push(done);
    }

    fn output(&mut self, text: &str, reasoning: &str, calls: &[ToolCall], out: &mut Vec<Sse>) {
        self.start(out);
        self.delta(Open::Reasoning, reasoning, out);
        self.delta(Open::Message, text, out);
        for call in calls {
            self.call(call, out);
        }
    }
}

impl PartEncoder for ResponseStream {
    /// Whether the last event went out.
    fn finished(&self) -> bool {
        self.finished
    }

    fn part(&mut self, part: Part) -> Vec<Sse> {
        let mut out = Vec::new();
        self.output(&part.text, &part.reasoning, &part.calls, &mut out);
        let Some((finish_reason, used, _)) = part.end else {
            return out;
        };
        if self.output.is_empty() && self.open.is_none() {
            // An empty answer is still one (empty) message.
            self.open = Some((Open::Message, String::new()));
        }
        self.close(&mut out);
        let output = std::mem::take(&mut self.output);
        let response = self.meta.object(output, Some(finish_reason), &used);
        if let Some(keep) = self.keep.take() {
            keep(&response);
        }
        let name = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(name, json!({"response": response}), &mut out);
        self.finished = true;
        out
    }

    /// The `error` event that ends a stream that failed after it started.
    fn failed(&mut self, failure: &ApiError) -> Vec<Sse> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        let body = failure.body();
        let mut out = Vec::new();
        self.event(
            "error",
            json!({"code": body["error"]["code"], "message": body["error"]["message"],
                "param": body["error"]["param"]}),
            &mut out,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_protocol::{ChunkBody, ClientReply, DoneBody, FunctionCall, Timings};

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "resp_h1".into(),
            created: 1,
            model: "m".into(),
            store: false,
            previous: None,
        }
    }

    /// `previous_response_id` puts the stored conversation after the new
    /// instructions and before the new input; what is stored back leaves
    /// the instructions out, and ends with the output as an assistant turn.
    #[test]
    fn a_continuation_starts_from_the_stored_turns() {
        let limits = zinfer_protocol::Limits::default();
        let ctx = Context {
            id: "h-1",
            alias: None,
            limits: &limits,
        };
        let stored = vec![
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello"}),
        ];
        let body = json!({"input": [{"type": "function_call_output", "call_id": "c1",
            "output": "42"}], "instructions": "Be brief.", "previous_response_id": "resp_1"});
        let request = super::request(body.to_string().as_bytes(), ctx, |id| {
            (id == "resp_1").then(|| stored.clone())
        })
        .unwrap();
        let roles: Vec<String> = request
            .translated
            .request
            .messages
            .unwrap()
            .iter()
            .map(|m| m.role.clone())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        let turns = request.turns.unwrap();
        assert_eq!(turns.len(), 3, "no instructions: {turns:?}");
        assert_eq!(request.previous.as_deref(), Some("resp_1"));
        let missing = super::request(body.to_string().as_bytes(), ctx, |_| None).unwrap_err();
        assert_eq!(missing.status(), axum::http::StatusCode::NOT_FOUND);
        let unstored = json!({"input": "x", "store": false});
        let request = super::request(unstored.to_string().as_bytes(), ctx, |_| None).unwrap();
        assert!(request.turns.is_none() && !request.store);

        let out = Collected {
            text: "ok".into(),
            reasoning: "r".into(),
            tool_calls: vec![ToolCall {
                id: Some("call_2".into()),
                kind: Some("function".into()),
                function: FunctionCall {
                    name: "f".into(),
                    arguments: json!("{\"a\":1}"),
                },
            }],
            ..Collected::default()
        };
        let response = response(&meta(), &out, FinishReason::ToolCalls, &Usage::default());
        assert_eq!(
            assistant_turn(&response),
            json!({"role": "assistant", "content": "ok", "reasoning_content": "r",
                "tool_calls": [{"id": "call_2", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\":1}"}}]})
        );
    }

    /// Reasoning becomes a reasoning item with its summary, first, whole
    /// and streamed; a call its function_call item.
    #[test]
    fn reasoning_is_a_summary_item_and_calls_are_function_calls() {
        let call = ToolCall {
            id: Some("call_9".into()),
            kind: Some("function".into()),
            function: FunctionCall {
                name: "f".into(),
                arguments: json!("{}"),
            },
        };
        let out = Collected {
            text: "ok".into(),
            reasoning: "thought".into(),
            tool_calls: vec![call.clone()],
            ..Collected::default()
        };
        let body = response(&meta(), &out, FinishReason::ToolCalls, &Usage::default());
        let output = body["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().filter_map(|i| i["type"].as_str()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(output[0]["summary"][0]["text"], "thought");
        assert_eq!(output[2]["call_id"], "call_9");
        assert_eq!(body["status"], "completed");

        let mut stream = ResponseStream::new(meta());
        let mut events = stream.on_reply(ClientReply::Chunk {
            id: "h-1".into(),
            body: ChunkBody {
                reasoning: "thought".into(),
                text: "ok".into(),
                tool_calls: vec![call],
                ..ChunkBody::default()
            },
        });
        events.extend(stream.on_reply(ClientReply::Done {
            id: "h-1".into(),
            body: DoneBody::new(
                FinishReason::ToolCalls,
                Usage::default(),
                Timings::default(),
            ),
        }));
        let names: Vec<&str> = events.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert!(stream.finished());
    }
}
