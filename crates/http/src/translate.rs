//! OpenAI request bodies to protocol `generate` requests. Pure functions:
//! bytes and settings in, a [`Translated`] request or an [`ApiError`] out.
//!
//! Fields are read one by one from the JSON object, so every error names
//! its field (`param`). A field that OpenAI defines but zinfer does not
//! implement is accepted only at its default value (`n: 1`,
//! `presence_penalty: 0`, empty `tools`, ...); any other value, and any
//! field OpenAI does not define, is a 400.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use zinfer_protocol::{
    ChatMessage, ContentPart, DecodeError, GenerateRequest, Limits, MessageContent, ToolCall,
};

use crate::error::ApiError;

/// Fields of `POST /v1/completions`.
const COMPLETION_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "logprobs",
    "echo",
    "suffix",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "metadata",
    "priority",
    "speculative",
    "keep_alive",
];

/// Fields of `POST /v1/chat/completions`.
const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "functions",
    "function_call",
    "chat_template_kwargs",
    "reasoning_effort",
    "metadata",
    "priority",
    "speculative",
    "keep_alive",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "modalities",
];

/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const COMPLETION_DEFAULT_MAX_TOKENS: u32 = 16;

/// What a translation needs besides the body.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The protocol request id to use.
    pub id: &'a str,
    /// `--served-model-name`: this name means the router's default model.
    pub alias: Option<&'a str>,
    /// The protocol's limits, checked before anything is sent.
    pub limits: &'a Limits,
}

/// A valid request, ready to send to the router.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    /// The protocol request (`stream` is always true: the front streams
    /// from the router and buffers itself for non-streaming responses).
    pub request: GenerateRequest,
    /// Whether the HTTP response is a server-sent event stream.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The model name echoed in responses.
    pub model: String,
    /// `echo` on completions: each choice's text starts with its prompt's.
    pub echo: bool,
    /// A completions body with a list of prompts: the requests of the
    /// second prompt on (`request` is the first's); ids `{id}-{index}`.
    pub more: Vec<GenerateRequest>,
}

impl Translated {
    /// Every prompt's request, in order.
    pub fn requests(&self) -> Vec<GenerateRequest> {
        std::iter::once(&self.request)
            .chain(&self.more)
            .cloned()
            .collect()
    }
}

/// Most prompts in one completions request.
pub const MAX_PROMPTS: usize = 256;

/// One prompt of a completions body.
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// A completions `prompt`: a string, token ids, or a list of either.
fn prompts(value: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    let items = match value {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("prompt", "\"prompt\" is required"));
        }
        Some(Value::String(text)) => return Ok(vec![Prompt::Text(text.clone())]),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "\"prompt\" must be a string, an array of strings, token ids, or an array of token id arrays",
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::invalid("prompt", "\"prompt\" must not be empty"));
    }
    if items.iter().all(Value::is_number) {
        return Ok(vec![Prompt::Tokens(token_ids(items)?)]);
    }
    if items.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "at most {MAX_PROMPTS} prompts per request, got {}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(text) => Ok(Prompt::Text(text.clone())),
            Value::Array(tokens) if !tokens.is_empty() => Ok(Prompt::Tokens(token_ids(tokens)?)),
            _ => Err(ApiError::invalid(
                "prompt",
                "each prompt of a list must be a string or a non-empty array of token ids",
            )),
        })
        .collect()
}

/// Sets `prompt` as `request`'s input.
fn set_prompt(request: &mut GenerateRequest, prompt: Prompt) {
    match prompt {
        Prompt::Text(text) => {
            request.prompt = Some(text);
            request.tokens = None;
        }
        Prompt::Tokens(tokens) => {
            request.prompt = None;
            request.tokens = Some(tokens);
        }
    }
}

/// The JSON object of a request body.
struct Body(Map<String, Value>);

/// A request body's JSON object, every key one of `known`.
pub(crate) fn json_object(bytes: &[u8], known: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::InvalidRequest {
        message: format!("the body is not valid JSON: {e}"),
        param: None,
    })?;
    let Value::Object(map) = value else {
        return Err(ApiError::InvalidRequest {
            message: "the body must be a JSON object".into(),
            param: None,
        });
    };
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::UnknownField(unknown.clone()));
    }
    Ok(map)
}

impl Body {
    fn parse(bytes: &[u8], known: &[&str]) -> Result<Body, ApiError> {
        json_object(bytes, known).map(Body)
    }

    /// The field `name`, `None` when absent or `null`.
    fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => T::deserialize(value)
                .map(Some)
                .map_err(|e| ApiError::invalid(name, format!("invalid {name:?}: {e}"))),
        }
    }

    /// Rejects `name` unless it is absent, `null` or passes `is_default`.
    fn only_default<T: DeserializeOwned>(
        &self,
        name: &str,
        is_default: impl Fn(&T) -> bool,
        why: &str,
    ) -> Result<(), ApiError> {
        match self.get::<T>(name)? {
            Some(value) if !is_default(&value) => Err(ApiError::unsupported(
                name,
                format!("{name:?} is not supported: {why}"),
            )),
            _ => Ok(()),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
    /// Accepted and ignored: zinfer pads no events, so there is no
    /// padding to turn off.
    #[serde(default, rename = "include_obfuscation")]
    _include_obfuscation: Option<bool>,
}

/// Translates a `/v1/completions` body.
pub fn completion(bytes: &[u8], ctx: Context<'_>) -> Result<Translated, ApiError> {
    let body = Body::parse(bytes, COMPLETION_FIELDS)?;
    let mut prompts = prompts(body.0.get("prompt"))?.into_iter();
    let several = prompts.len() > 1;
    let mut request = GenerateRequest::from_prompt(ctx.id, "");
    if let Some(first) = prompts.next() {
        set_prompt(&mut request, first);
    }
    if several {
        request.id = format!("{}-0", ctx.id);
    }
    request.max_tokens = body
        .get::<u32>("max_tokens")?
        .unwrap_or(COMPLETION_DEFAULT_MAX_TOKENS);
    body.only_default::<u32>("best_of", |n| *n == 1, "only best_of 1 is served")?;
    let echo = body.get::<bool>("echo")?.unwrap_or(false);
    body.only_default::<String>("suffix", String::is_empty, "no insertion mode")?;
    // Legacy completions: `logprobs: n` asks for the n most likely tokens
    // at each position, besides the chosen one (0: only the chosen one).
    if let Some(top) = body.get::<u32>("logprobs")? {
        if top > ctx.limits.max_top_logprobs {
            return Err(ApiError::invalid(
                "logprobs",
                format!(
                    "\"logprobs\" must be at most {}, got {top}",
                    ctx.limits.max_top_logprobs
                ),
            ));
        }
        request.logprobs = true;
        request.top_logprobs = top;
    }
    if echo {
        if body.get::<bool>("stream")?.unwrap_or(false) {
            return Err(ApiError::unsupported(
                "echo",
                "\"echo\" is served without \"stream\" only",
            ));
        }
        // With `logprobs`, the prompt's tokens get theirs too.
        if request.logprobs {
            request.prompt_logprobs = Some(request.top_logprobs);
        }
    }
    let mut translated = finish(body, request, ctx)?;
    translated.echo = echo;
    for (index, prompt) in prompts.enumerate() {
        let mut request = translated.request.clone();
        request.id = format!("{}-{}", ctx.id, index + 1);
        set_prompt(&mut request, prompt);
        request.validate(ctx.limits).map_err(decode_error)?;
        translated.more.push(request);
    }
    Ok(translated)
}

/// Translates a `/v1/chat/completions` body.
pub fn chat(bytes: &[u8], ctx: Context<'_>) -> Result<Translated, ApiError> {
    let body = Body::parse(bytes, CHAT_FIELDS)?;
    let mut request = GenerateRequest::from_prompt(ctx.id, "");
    request.prompt = None;
    let Some(raw) = body.get::<Vec<Value>>("messages")? else {
        return Err(ApiError::invalid("messages", "\"messages\" is required"));
    };
    let messages = raw
        .iter()
        .enumerate()
        .map(|(i, m)| chat_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    request.messages = Some(messages);
    let max_completion = body.get::<u32>("max_completion_tokens")?;
    // OpenAI's chat default is "as many as fit"; the worker clamps to the
    // context length.
    request.max_tokens = max_completion
        .or(body.get::<u32>("max_tokens")?)
        .unwrap_or(ctx.limits.max_tokens_cap);
    // Range and "top_logprobs needs logprobs" are checked by the
    // protocol's validation below, which names the field.
    request.logprobs = body.get::<bool>("logprobs")?.unwrap_or(false);
    request.top_logprobs = body.get::<u32>("top_logprobs")?.unwrap_or(0);
    body.only_default::<Vec<Value>>(
        "functions",
        Vec::is_empty,
        "the legacy functions API is not served; send \"tools\"",
    )?;
    body.only_default::<Value>(
        "function_call",
        |c| c == "none",
        "the legacy functions API is not served; send \"tool_choice\"",
    )?;
    request.tools = body.get("tools")?.unwrap_or_default();
    request.tool_choice = body.get("tool_choice")?.unwrap_or_default();
    request.parallel_tool_calls = body.get("parallel_tool_calls")?.unwrap_or(true);
    request.chat_template_kwargs = body.get("chat_template_kwargs")?;
    // OpenAI's reasoning control: "none" turns thinking off in templates
    // that read `enable_thinking` (Qwen3); low, medium and high also reach
    // templates that read `reasoning_effort` (gpt-oss's "Reasoning: high").
    if let Some(effort) = body.get::<String>("reasoning_effort")? {
        if !["none", "minimal", "low", "medium", "high"].contains(&effort.as_str()) {
            return Err(ApiError::invalid(
                "reasoning_effort",
                "\"reasoning_effort\" must be none, minimal, low, medium or high",
            ));
        }
        let kwargs = request
            .chat_template_kwargs
            .get_or_insert_with(Box::default);
        if effort == "none" {
            kwargs
                .entry("enable_thinking")
                .or_insert(Value::Bool(false));
        } else if effort != "minimal" {
            kwargs
                .entry("reasoning_effort")
                .or_insert(Value::String(effort));
        }
    }
    request.constraint = response_format(body.get::<Value>("response_format")?)?.map(Box::new);
    ignored_chat_fields(&body)?;
    finish(body, request, ctx)
}

/// Fields OpenAI's chat clients send that change nothing here, checked
/// for their type and values: `store` (nothing is stored),
/// `service_tier`, `prompt_cache_key` (the prefix cache needs no key),
/// `safety_identifier` (logged with `user`), `verbosity`, and
/// `modalities`, which may ask for text only.
fn ignored_chat_fields(body: &Body) -> Result<(), ApiError> {
    body.get::<bool>("store")?;
    body.get::<String>("prompt_cache_key")?;
    body.get::<String>("safety_identifier")?;
    one_of(
        body,
        "service_tier",
        &["auto", "default", "flex", "scale", "priority"],
    )?;
    one_of(body, "verbosity", &["low", "medium", "high"])?;
    for modality in body.get::<Vec<String>>("modalities")?.unwrap_or_default() {
        match modality.as_str() {
            "text" => {}
            "audio" => {
                return Err(ApiError::unsupported(
                    "modalities",
                    "audio output is not supported; \"modalities\" may only be [\"text\"]",
                ));
            }
            other => {
                return Err(ApiError::invalid(
                    "modalities",
                    format!("unknown modality {other:?}; only \"text\" is served"),
                ));
            }
        }
    }
    Ok(())
}

/// Rejects `name` unless it is absent or one of `values`.
fn one_of(body: &Body, name: &str, values: &[&str]) -> Result<(), ApiError> {
    match body.get::<String>(name)? {
        Some(value) if !values.contains(&value.as_str()) => Err(ApiError::invalid(
            name,
            format!("{name:?} must be one of {}", values.join(", ")),
        )),
        _ => Ok(()),
    }
}

/// OpenAI's `response_format` as a protocol `constraint`: `text` is none,
/// `json_object` any JSON object, `json_schema` its `schema` (any JSON
/// when left out). The worker enforces every schema; unless `strict` is
/// `false`, its objects are closed first, as OpenAI's strict mode and
/// vLLM read them ([`zinfer_protocol::closed_objects`]).
fn response_format(format: Option<Value>) -> Result<Option<zinfer_protocol::Constraint>, ApiError> {
    use zinfer_protocol::Constraint;
    let param = "response_format";
    let Some(format) = format else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::json_object())),
        Some("json_schema") => {
            let Some(spec) = format.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::invalid(
                    param,
                    "\"response_format\" of type \"json_schema\" needs a \"json_schema\" object",
                ));
            };
            if let Some(strict) = spec.get("strict")
                && !strict.is_boolean()
                && !strict.is_null()
            {
                return Err(ApiError::invalid(
                    param,
                    "\"response_format.json_schema.strict\" must be a boolean",
                ));
            }
            match spec.get("schema") {
                None | Some(Value::Null) => {
                    Ok(Some(Constraint::json_schema(Value::Object(Map::new()))))
                }
                Some(schema @ Value::Object(_)) => {
                    let mut schema = schema.clone();
                    if spec.get("strict") != Some(&Value::Bool(false)) {
                        zinfer_protocol::closed_objects(&mut schema);
                    }
                    Ok(Some(Constraint::json_schema(schema)))
                }
                Some(_) => Err(ApiError::invalid(
                    param,
                    "\"response_format.json_schema.schema\" must be a JSON schema object",
                )),
            }
        }
        _ => Err(ApiError::unsupported(
            param,
            "\"response_format\" must have \"type\" \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// The sampling fields both endpoints share, the model, and the final check.
fn finish(
    body: Body,
    mut request: GenerateRequest,
    ctx: Context<'_>,
) -> Result<Translated, ApiError> {
    let model: Option<String> = body.get("model")?;
    request.model = model
        .clone()
        .filter(|m| !m.is_empty() && Some(m.as_str()) != ctx.alias);
    if let Some(t) = body.get::<f32>("temperature")? {
        request.temperature = t;
    }
    if let Some(p) = body.get::<f32>("top_p")? {
        request.top_p = p;
    }
    if let Some(k) = body.get::<i64>("top_k")? {
        // vLLM's convention: -1 (or 0) turns top-k off.
        request.top_k = match k {
            -1 | 0 => 0,
            k => u32::try_from(k).map_err(|_| {
                ApiError::invalid("top_k", "\"top_k\" must be -1, 0 or a positive integer")
            })?,
        };
    }
    if let Some(p) = body.get::<f32>("min_p")? {
        request.min_p = p;
    }
    if let Some(p) = body.get::<f32>("repetition_penalty")? {
        request.repetition_penalty = p;
    }
    request.seed = body.get::<u64>("seed")?;
    request.stop = match body.get::<OneOrMany>("stop")? {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    request.stop_token_ids = body.get("stop_token_ids")?.unwrap_or_default();
    request.ignore_eos = body.get("ignore_eos")?.unwrap_or(false);
    if let Some(n) = body.get::<u32>("n")? {
        request.n = n;
    }
    if let Some(p) = body.get::<f32>("presence_penalty")? {
        request.presence_penalty = p;
    }
    if let Some(p) = body.get::<f32>("frequency_penalty")? {
        request.frequency_penalty = p;
    }
    request.logit_bias = body.get("logit_bias")?.unwrap_or_default();
    // vLLM's scheduling priority (higher first here; the protocol's sense).
    request.priority = body.get::<i32>("priority")?.unwrap_or(0);
    // zinfer's prompt-lookup speculation, as on the protocol.
    request.speculative = body.get("speculative")?;
    // Ollama's: how long a model loaded on demand stays loaded after this.
    request.keep_alive = body.get("keep_alive")?;
    // Accepted and logged, as OpenAI stores them; they change nothing.
    let user = body.get::<String>("user")?;
    let safety_identifier = body.get::<String>("safety_identifier")?;
    let metadata = body.get::<Map<String, Value>>("metadata")?;
    if let Some(metadata) = &metadata
        && let Some((key, _)) = metadata.iter().find(|(_, v)| !v.is_string())
    {
        return Err(ApiError::invalid(
            "metadata",
            format!("\"metadata\" values must be strings; {key:?} is not"),
        ));
    }
    if user.is_some() || safety_identifier.is_some() || metadata.is_some() {
        tracing::info!(id = ctx.id, user, safety_identifier, metadata = ?metadata, "request labels");
    }
    let stream = body.get::<bool>("stream")?.unwrap_or(false);
    let options = body.get::<StreamOptions>("stream_options")?;
    if options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "\"stream_options\" is only allowed when \"stream\" is true",
        ));
    }
    let include_usage = options.and_then(|o| o.include_usage).unwrap_or(false);
    request.stream = true;
    request.validate(ctx.limits).map_err(decode_error)?;
    request.check_nesting(ctx.limits).map_err(decode_error)?;
    Ok(Translated {
        echo: false,
        more: Vec::new(),
        request,
        stream,
        include_usage,
        model: model
            .filter(|m| !m.is_empty())
            .or(ctx.alias.map(str::to_string))
            .unwrap_or_else(|| "default".to_string()),
    })
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid("prompt", "token ids must be integers from 0 to 2^32-1")
                })
        })
        .collect()
}

/// One chat turn, with OpenAI's message fields mapped to the protocol's:
/// `content` as a string, text parts or null (an assistant turn with
/// `tool_calls`), `name`, `tool_calls`, `tool_call_id` and
/// `reasoning_content`. The template sees them as given.
fn chat_message(i: usize, value: &Value) -> Result<ChatMessage, ApiError> {
    let param = format!("messages[{i}]");
    let Value::Object(map) = value else {
        return Err(ApiError::invalid(param, "each message must be an object"));
    };
    // Fields an SDK echoes back from a response (`refusal`, `audio`, ...)
    // are harmless while null.
    if let Some((key, _)) = map
        .iter()
        .find(|(k, v)| !MESSAGE_FIELDS.contains(&k.as_str()) && !v.is_null())
    {
        return Err(ApiError::unsupported(
            &format!("{param}.{key}"),
            format!("message field {key:?} is not supported"),
        ));
    }
    let role = match map.get("role").and_then(Value::as_str) {
        Some(role @ ("system" | "user" | "assistant" | "tool")) => role.to_string(),
        // OpenAI's newer name for the system turn.
        Some("developer") => "system".to_string(),
        Some(other) => {
            return Err(ApiError::unsupported(
                &format!("{param}.role"),
                format!(
                    "role {other:?} is not supported; use system, developer, user, assistant or tool"
                ),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                format!("{param}.role"),
                "\"role\" is required",
            ));
        }
    };
    let content = match map.get("content") {
        Some(Value::String(text)) => Some(MessageContent::Text(text.clone())),
        None | Some(Value::Null) if role == "assistant" => None,
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(text))) => texts.push(ContentPart {
                        kind: "text".into(),
                        text: Some(text.clone()),
                    }),
                    _ => {
                        return Err(ApiError::unsupported(
                            &format!("{param}.content"),
                            "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                        ));
                    }
                }
            }
            Some(MessageContent::Parts(texts))
        }
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.content"),
                "\"content\" must be a string or an array of text parts (null only for an assistant turn)",
            ));
        }
    };
    let text = |key: &str| -> Result<Option<String>, ApiError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid(
                format!("{param}.{key}"),
                format!("\"{key}\" must be a string"),
            )),
        }
    };
    let tool_calls = match map.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(calls) => Some(
            serde_json::from_value::<Vec<ToolCall>>(calls.clone()).map_err(|e| {
                ApiError::invalid(
                    format!("{param}.tool_calls"),
                    format!(
                        "tool calls are [{{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}]: {e}"
                    ),
                )
            })?,
        ),
    };
    Ok(ChatMessage {
        role,
        content,
        name: text("name")?,
        tool_calls,
        tool_call_id: text("tool_call_id")?,
        reasoning_content: text("reasoning_content")?,
    })
}

/// The message fields [`chat_message`] maps.
const MESSAGE_FIELDS: [&str; 6] = [
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
];

fn decode_error(error: DecodeError) -> ApiError {
    let message = error.to_string();
    match error {
        DecodeError::OverLimit { field, .. } | DecodeError::Invalid { field, .. } => {
            ApiError::invalid(field, message)
        }
        _ => ApiError::InvalidRequest {
            message,
            param: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(limits: &Limits) -> Context<'_> {
        Context {
            id: "h-1",
            alias: Some("smol"),
            limits,
        }
    }

    fn chat_ok(body: Value) -> Translated {
        let limits = Limits::default();
        chat(body.to_string().as_bytes(), ctx(&limits)).unwrap()
    }

    fn chat_err(body: Value) -> ApiError {
        let limits = Limits::default();
        chat(body.to_string().as_bytes(), ctx(&limits)).unwrap_err()
    }

    fn completion_ok(body: Value) -> Translated {
        let limits = Limits::default();
        completion(body.to_string().as_bytes(), ctx(&limits)).unwrap()
    }

    fn completion_err(body: Value) -> ApiError {
        let limits = Limits::default();
        completion(body.to_string().as_bytes(), ctx(&limits)).unwrap_err()
    }

    fn param(error: &ApiError) -> Option<String> {
        error.body()["error"]["param"].as_str().map(str::to_string)
    }

    #[test]
    fn chat_maps_every_sampling_field() {
        let t = chat_ok(serde_json::json!({
            "model": "m", "messages": [{"role": "user", "content": "Hi"}],
            "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
            "repetition_penalty": 1.1, "seed": 7, "stop": "\n",
            "max_completion_tokens": 9, "max_tokens": 100, "ignore_eos": true,
            "stop_token_ids": [2], "n": 1, "presence_penalty": 0,
            "stream": true, "stream_options": {"include_usage": true}, "user": "u",
        }));
        let r = &t.request;
        assert_eq!(r.id, "h-1");
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(
            (r.temperature, r.top_p, r.top_k, r.min_p),
            (0.5, 0.9, 40, 0.05)
        );
        assert_eq!(r.repetition_penalty, 1.1);
        assert_eq!(r.seed, Some(7));
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert_eq!(
            r.max_tokens, 9,
            "max_completion_tokens wins over max_tokens"
        );
        assert!(r.ignore_eos);
        assert_eq!(r.stop_token_ids, vec![2]);
        assert!(r.stream, "the front always streams from the router");
        assert!(t.stream && t.include_usage);
        assert_eq!(t.model, "m");
        let messages = r.messages.as_ref().unwrap();
        assert_eq!(messages[0].role, "user");
        assert_eq!(messages[0], ChatMessage::new("user", "Hi"));
    }

    #[test]
    fn chat_defaults_and_content_forms() {
        let t = chat_ok(serde_json::json!({
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null},
            ],
            "stop": ["x", "y"], "top_k": -1,
        }));
        let r = &t.request;
        assert_eq!(r.model, None);
        assert_eq!(t.model, "smol", "the alias names the default model");
        assert_eq!(r.max_tokens, Limits::default().max_tokens_cap);
        assert_eq!(r.temperature, 1.0);
        assert_eq!(r.top_k, 0);
        assert_eq!(r.stop.len(), 2);
        assert!(!t.stream && !t.include_usage);
        let m = r.messages.as_ref().unwrap();
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content.as_ref().unwrap().text(), "a\nb");
        assert_eq!(m[2].content, None);
    }

    #[test]
    fn tool_calls_tool_results_and_reasoning_pass_through() {
        let t = chat_ok(serde_json::json!({
            "messages": [
                {"role": "user", "name": "alice", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "refusal": null, "reasoning_content": "look it up",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
            ],
        }));
        let m = t.request.messages.unwrap();
        assert_eq!(m[0].name.as_deref(), Some("alice"));
        assert_eq!(m[1].content, None);
        assert_eq!(m[1].reasoning_content.as_deref(), Some("look it up"));
        let calls = m[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0].id.as_deref(), Some("c1"));
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(
            calls[0].function.arguments,
            serde_json::json!("{\"city\": \"Paris\"}")
        );
        assert_eq!(m[2].role, "tool");
        assert_eq!(m[2].tool_call_id.as_deref(), Some("c1"));
        // Arguments that are neither a string nor a map are refused by the
        // protocol's validation, which names the turn.
        let error = chat_err(serde_json::json!({"messages": [
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]}]}));
        assert!(error.to_string().contains("messages[0]"), "{error}");
    }

    #[test]
    fn the_alias_means_the_default_model() {
        let t = chat_ok(
            serde_json::json!({"model": "smol", "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(t.request.model, None);
        assert_eq!(t.model, "smol");
    }

    #[test]
    fn unsupported_and_unknown_fields_are_400_naming_the_field() {
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        for (field, value) in [
            ("n", serde_json::json!(17)),
            ("tools", serde_json::json!([{"type": "function"}])),
            ("tool_choice", serde_json::json!("required")),
            ("functions", serde_json::json!([{"name": "f"}])),
            ("reasoning_effort", serde_json::json!("extreme")),
            ("presence_penalty", serde_json::json!(2.5)),
            ("logit_bias", serde_json::json!({"one": 5})),
            ("metadata", serde_json::json!({"k": 1})),
            ("response_format", serde_json::json!({"type": "xml"})),
            ("frobnicate", serde_json::json!(1)),
        ] {
            let mut body = serde_json::json!({"messages": user});
            body[field] = value;
            let error = chat_err(body);
            assert_eq!(
                error.status(),
                axum::http::StatusCode::BAD_REQUEST,
                "{field}"
            );
            assert_eq!(param(&error).as_deref(), Some(field), "{field}: {error}");
        }
        // Defaults of unsupported fields are fine.
        chat_ok(
            serde_json::json!({"messages": user, "n": 1, "tools": [], "tool_choice": "none",
            "frequency_penalty": 0.0, "logit_bias": {},
            "response_format": {"type": "text"}, "parallel_tool_calls": true}),
        );
    }

    /// Found by the `translate` fuzz target: a tool schema nested past the
    /// protocol's depth limit was forwarded, and the router refused it.
    #[test]
    fn a_schema_nested_past_the_frame_limit_is_refused_here() {
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        let mut schema = serde_json::json!({"type": "string"});
        for _ in 0..20 {
            schema = serde_json::json!({"type": "object", "properties": {"a": schema}});
        }
        let tools = serde_json::json!([{"type": "function",
            "function": {"name": "f", "parameters": schema}}]);
        let error = chat_err(serde_json::json!({"messages": user, "tools": tools}));
        assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST);
        assert!(error.to_string().contains("nesting"), "{error}");
        let shallow = serde_json::json!([{"type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}}}]);
        chat_ok(serde_json::json!({"messages": user, "tools": shallow}));
    }

    /// What OpenAI's SDKs and agent frameworks send on every call is
    /// accepted (and changes nothing).
    #[test]
    fn standard_fields_real_clients_send_are_accepted() {
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        let plain = chat_ok(serde_json::json!({"messages": user}));
        let t = chat_ok(serde_json::json!({"messages": user, "store": false,
            "service_tier": "auto", "prompt_cache_key": "k-1", "safety_identifier": "u-9",
            "verbosity": "medium", "modalities": ["text"], "stream": true,
            "stream_options": {"include_usage": true, "include_obfuscation": false}}));
        assert_eq!(t.request, plain.request);
        assert!(t.include_usage);
        let t = chat_ok(serde_json::json!({"messages": user, "store": true,
            "service_tier": "default", "verbosity": "low"}));
        assert_eq!(t.request, plain.request);
    }

    #[test]
    fn penalties_bias_priority_and_labels_reach_the_protocol() {
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        let t = chat_ok(
            serde_json::json!({"messages": user, "presence_penalty": 0.5,
            "frequency_penalty": -0.25, "logit_bias": {"42": 100, "7": -100},
            "priority": 3, "user": "u-1", "metadata": {"team": "search"}}),
        );
        let r = &t.request;
        assert_eq!((r.presence_penalty, r.frequency_penalty), (0.5, -0.25));
        assert_eq!(r.logit_bias_ids(), vec![(7, -100.0), (42, 100.0)]);
        assert_eq!(r.priority, 3);
        let t = completion_ok(
            serde_json::json!({"prompt": "x", "logit_bias": {"1": 5}, "priority": -1}),
        );
        assert_eq!(t.request.logit_bias_ids(), vec![(1, 5.0)]);
        assert_eq!(t.request.priority, -1);
        assert_eq!(t.request.speculative, None);
        let t = completion_ok(serde_json::json!({"prompt": "x", "speculative": {"max_draft": 5}}));
        assert_eq!(
            t.request.speculative,
            Some(zinfer_protocol::Speculative {
                ngram: 3,
                max_draft: 5
            })
        );
        let error = completion_err(serde_json::json!({"prompt": "x", "speculative": {"ngram": 1}}));
        assert_eq!(param(&error).as_deref(), Some("speculative"), "{error}");
        let t = completion_ok(serde_json::json!({"prompt": "x", "keep_alive": "10m"}));
        assert_eq!(
            t.request.keep_alive,
            Some(zinfer_protocol::KeepAlive::For(
                std::time::Duration::from_secs(600)
            ))
        );
        let t = completion_ok(serde_json::json!({"prompt": "x", "keep_alive": -1}));
        assert_eq!(
            t.request.keep_alive,
            Some(zinfer_protocol::KeepAlive::Forever)
        );
        let error = completion_err(serde_json::json!({"prompt": "x", "keep_alive": "soon"}));
        assert_eq!(param(&error).as_deref(), Some("keep_alive"), "{error}");
        let error = chat_err(serde_json::json!({"messages": user, "logit_bias": {"1": 101}}));
        assert_eq!(param(&error).as_deref(), Some("logit_bias"), "{error}");
        let error = chat_err(serde_json::json!({"messages": user, "frequency_penalty": -3}));
        assert_eq!(
            param(&error).as_deref(),
            Some("frequency_penalty"),
            "{error}"
        );
    }

    #[test]
    fn tools_and_their_choice_reach_the_protocol() {
        use zinfer_protocol::{Tool, ToolChoice};
        let user = serde_json::json!([{"role": "user", "content": "Weather in Paris?"}]);
        let params =
            serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let tools = serde_json::json!([{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather", "parameters": params}}]);
        let t = chat_ok(serde_json::json!({"messages": user, "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false, "chat_template_kwargs": {"enable_thinking": false}}));
        let r = &t.request;
        let mut expected = Tool::function("get_weather", params.clone());
        expected.function.description = Some("Current weather".into());
        assert_eq!(r.tools, vec![expected]);
        assert_eq!(r.tool_choice, ToolChoice::Function("get_weather".into()));
        assert!(!r.parallel_tool_calls);
        assert_eq!(
            r.chat_template_kwargs.as_ref().unwrap()["enable_thinking"],
            false
        );
        let t = chat_ok(serde_json::json!({"messages": user, "tools": tools}));
        assert_eq!(t.request.tool_choice, ToolChoice::Auto);
        assert!(t.request.parallel_tool_calls);
        let t = chat_ok(serde_json::json!({"messages": user, "reasoning_effort": "none"}));
        assert_eq!(
            t.request.chat_template_kwargs.unwrap()["enable_thinking"],
            false
        );
        let t = chat_ok(serde_json::json!({"messages": user, "reasoning_effort": "high"}));
        let kwargs = t.request.chat_template_kwargs.unwrap();
        assert_eq!(kwargs["reasoning_effort"], "high");
        assert!(!kwargs.contains_key("enable_thinking"));
        let t = chat_ok(
            serde_json::json!({"messages": user, "reasoning_effort": "low",
            "chat_template_kwargs": {"reasoning_effort": "medium"}}),
        );
        assert_eq!(
            t.request.chat_template_kwargs.unwrap()["reasoning_effort"],
            "medium",
            "the request's own template variables win"
        );
        for (body, field) in [
            (
                serde_json::json!({"messages": user, "tools": tools,
                    "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (
                serde_json::json!({"messages": user, "tools": [
                    {"type": "function", "function": {"name": "bad name"}}]}),
                "tools",
            ),
            (
                serde_json::json!({"messages": user, "tools": tools, "tool_choice": "required",
                    "response_format": {"type": "json_object"}}),
                "tool_choice",
            ),
        ] {
            let error = chat_err(body);
            assert_eq!(param(&error).as_deref(), Some(field), "{error}");
        }
    }

    #[test]
    fn response_format_becomes_a_constraint() {
        use zinfer_protocol::Constraint;
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        let schema =
            serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let closed = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}},
            "additionalProperties": false});
        for (format, expected) in [
            (serde_json::json!({"type": "text"}), None),
            (
                serde_json::json!({"type": "json_object"}),
                Some(Constraint::json_object()),
            ),
            (
                serde_json::json!({"type": "json_schema",
                    "json_schema": {"name": "a", "strict": true, "schema": schema}}),
                Some(Constraint::json_schema(closed.clone())),
            ),
            (
                serde_json::json!({"type": "json_schema",
                    "json_schema": {"name": "a", "schema": schema}}),
                Some(Constraint::json_schema(closed.clone())),
            ),
            (
                serde_json::json!({"type": "json_schema",
                    "json_schema": {"name": "a", "strict": false, "schema": schema}}),
                Some(Constraint::json_schema(schema.clone())),
            ),
            (
                serde_json::json!({"type": "json_schema", "json_schema": {"name": "any"}}),
                Some(Constraint::json_schema(serde_json::json!({}))),
            ),
        ] {
            let t = chat_ok(serde_json::json!({"messages": user, "response_format": format}));
            assert_eq!(t.request.constraint.map(|c| *c), expected, "{format}");
        }
        for format in [
            serde_json::json!({"type": "json_schema"}),
            serde_json::json!({"type": "json_schema", "json_schema": {"schema": "object"}}),
            serde_json::json!({"type": "json_schema", "json_schema": {"strict": "yes"}}),
        ] {
            let error = chat_err(serde_json::json!({"messages": user, "response_format": format}));
            assert_eq!(
                param(&error).as_deref(),
                Some("response_format"),
                "{format}"
            );
        }
    }

    #[test]
    fn bad_values_are_400_naming_the_field() {
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        let error = chat_err(serde_json::json!({"messages": user, "temperature": "hot"}));
        assert_eq!(param(&error).as_deref(), Some("temperature"));
        let error = chat_err(serde_json::json!({"messages": user, "temperature": -1}));
        assert_eq!(param(&error).as_deref(), Some("temperature"), "{error}");
        let error = chat_err(serde_json::json!({"messages": user, "top_k": -5}));
        assert_eq!(param(&error).as_deref(), Some("top_k"));
        let error = chat_err(
            serde_json::json!({"messages": user, "stream_options": {"include_usage": true}}),
        );
        assert_eq!(param(&error).as_deref(), Some("stream_options"));
        for (field, value) in [
            ("modalities", serde_json::json!(["text", "audio"])),
            ("modalities", serde_json::json!(["video"])),
            ("service_tier", serde_json::json!("fastest")),
            ("verbosity", serde_json::json!("loud")),
            ("store", serde_json::json!("yes")),
            ("prompt_cache_key", serde_json::json!(5)),
        ] {
            let mut body = serde_json::json!({"messages": user});
            body[field] = value;
            let error = chat_err(body);
            assert_eq!(param(&error).as_deref(), Some(field), "{error}");
        }
        let error = chat_err(serde_json::json!({"messages": user, "modalities": ["audio"]}));
        assert!(error.to_string().contains("audio"), "{error}");
        let error = chat_err(serde_json::json!({"messages": []}));
        assert_eq!(param(&error).as_deref(), Some("messages"));
        let error = chat_err(serde_json::json!({"model": "m"}));
        assert_eq!(param(&error).as_deref(), Some("messages"));
        let error = chat_err(serde_json::json!({"messages": [{"role": "robot", "content": "x"}]}));
        assert_eq!(param(&error).as_deref(), Some("messages[0].role"));
        let error = chat_err(
            serde_json::json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": 1}]}]}),
        );
        assert_eq!(param(&error).as_deref(), Some("messages[0].tool_calls"));
        let error = chat_err(
            serde_json::json!({"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}),
        );
        assert_eq!(param(&error).as_deref(), Some("messages[0].audio"));
        let error = chat_err(serde_json::json!({"messages": [{"role": "tool", "content": null}]}));
        assert_eq!(param(&error).as_deref(), Some("messages[0].content"));
        let error = chat_err(
            serde_json::json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        );
        assert_eq!(param(&error).as_deref(), Some("messages[0].content"));
        let limits = Limits::default();
        for body in [&b"{"[..], b"[1]", b""] {
            let error = chat(body, ctx(&limits)).unwrap_err();
            assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn chat_logprobs_map_to_the_protocol() {
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        let t = chat_ok(serde_json::json!({"messages": user}));
        assert!(!t.request.logprobs && t.request.top_logprobs == 0);
        let t = chat_ok(serde_json::json!({"messages": user, "logprobs": false}));
        assert!(!t.request.logprobs);
        let t = chat_ok(serde_json::json!({"messages": user, "logprobs": true}));
        assert!(t.request.logprobs && t.request.top_logprobs == 0);
        let t =
            chat_ok(serde_json::json!({"messages": user, "logprobs": true, "top_logprobs": 20}));
        assert!(t.request.logprobs && t.request.top_logprobs == 20);
        for body in [
            serde_json::json!({"messages": user, "logprobs": true, "top_logprobs": 21}),
            serde_json::json!({"messages": user, "logprobs": true, "top_logprobs": -1}),
            serde_json::json!({"messages": user, "top_logprobs": 2}),
            serde_json::json!({"messages": user, "logprobs": false, "top_logprobs": 2}),
        ] {
            let error = chat_err(body.clone());
            assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(
                param(&error).as_deref(),
                Some("top_logprobs"),
                "{body}: {error}"
            );
            assert_eq!(error.body()["error"]["type"], "invalid_request_error");
        }
        let error = chat_err(serde_json::json!({"messages": user, "logprobs": 2}));
        assert_eq!(param(&error).as_deref(), Some("logprobs"));
    }

    #[test]
    fn completion_logprobs_count_maps_to_top_logprobs() {
        let t = completion_ok(serde_json::json!({"prompt": "x"}));
        assert!(!t.request.logprobs);
        let t = completion_ok(serde_json::json!({"prompt": "x", "logprobs": null}));
        assert!(!t.request.logprobs);
        let t = completion_ok(serde_json::json!({"prompt": "x", "logprobs": 0}));
        assert!(t.request.logprobs && t.request.top_logprobs == 0);
        let t = completion_ok(serde_json::json!({"prompt": "x", "logprobs": 5}));
        assert!(t.request.logprobs && t.request.top_logprobs == 5);
        for bad in [
            serde_json::json!(21),
            serde_json::json!(-1),
            serde_json::json!(true),
        ] {
            let error = completion_err(serde_json::json!({"prompt": "x", "logprobs": bad}));
            assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(param(&error).as_deref(), Some("logprobs"), "{error}");
        }
    }

    #[test]
    fn completion_prompt_forms() {
        let t = completion_ok(serde_json::json!({"model": "m", "prompt": "Once"}));
        assert_eq!(t.request.prompt.as_deref(), Some("Once"));
        assert_eq!(t.request.max_tokens, COMPLETION_DEFAULT_MAX_TOKENS);
        let t = completion_ok(serde_json::json!({"prompt": ["Once"], "max_tokens": 5}));
        assert_eq!(t.request.prompt.as_deref(), Some("Once"));
        assert_eq!(t.request.max_tokens, 5);
        let t = completion_ok(serde_json::json!({"prompt": [1, 2, 3]}));
        assert_eq!(t.request.tokens, Some(vec![1, 2, 3]));
        assert_eq!(t.request.prompt, None);
        let t = completion_ok(serde_json::json!({"prompt": [[4, 5]]}));
        assert_eq!(t.request.tokens, Some(vec![4, 5]));
        let t = completion_ok(serde_json::json!({"prompt": ["a", [7, 8], "c"], "n": 2}));
        let requests = t.requests();
        assert_eq!(requests.len(), 3);
        assert_eq!(
            requests.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["h-1-0", "h-1-1", "h-1-2"]
        );
        assert_eq!(requests[0].prompt.as_deref(), Some("a"));
        assert_eq!(
            (requests[1].prompt.as_ref(), requests[1].tokens.as_deref()),
            (None, Some(&[7, 8][..]))
        );
        assert_eq!(requests[2].prompt.as_deref(), Some("c"));
        assert!(requests.iter().all(|r| r.n == 2));
        let t = completion_ok(serde_json::json!({"prompt": [[1, 2], [3]]}));
        assert_eq!(t.requests()[1].tokens, Some(vec![3]));
        let many: Vec<String> = (0..=MAX_PROMPTS).map(|i| i.to_string()).collect();
        for (prompt, field) in [
            (serde_json::json!(many), "prompt"),
            (serde_json::json!(["a", 5]), "prompt"),
            (serde_json::json!(["a", []]), "prompt"),
            (serde_json::json!([]), "prompt"),
            (serde_json::json!([-1]), "prompt"),
            (serde_json::json!(5), "prompt"),
        ] {
            let error = completion_err(serde_json::json!({"prompt": prompt}));
            assert_eq!(param(&error).as_deref(), Some(field), "{error}");
        }
        let t = completion_ok(serde_json::json!({"prompt": "x", "echo": true, "logprobs": 2}));
        assert!(t.echo);
        assert_eq!(t.request.prompt_logprobs, Some(2));
        let t = completion_ok(serde_json::json!({"prompt": "x", "echo": true}));
        assert_eq!(t.request.prompt_logprobs, None);
        let t = completion_ok(serde_json::json!({"prompt": [[1, 2], [3]], "echo": true,
            "logprobs": 1, "max_tokens": 0}));
        assert!(t.echo);
        assert!(t.requests().iter().all(|r| r.prompt_logprobs == Some(1)));
        let error =
            completion_err(serde_json::json!({"prompt": "x", "echo": true, "stream": true}));
        assert_eq!(param(&error).as_deref(), Some("echo"));
        let error = completion_err(serde_json::json!({"prompt": "x", "messages": []}));
        assert_eq!(param(&error).as_deref(), Some("messages"));
        let error = completion_err(serde_json::json!({"prompt": "x", "max_tokens": 40000}));
        assert_eq!(param(&error).as_deref(), Some("max_tokens"), "{error}");
    }
}
