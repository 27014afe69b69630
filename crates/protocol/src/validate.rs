//! Field limits and value domains, checked after a frame has decoded.

use crate::{
    AdminReply, AdminRequest, ApplyTemplateRequest, CacheTransfer, ChatMessage, ChunkBody,
    ClientReply, ClientRequest, DecodeError, DetokenizeRequest, DoneBody, GenerateRequest, Limits,
    MessageContent, Piece, ReadyBody, RouterToSupervisor, RouterToWorker, SupervisorToRouter,
    TextRequest, TokenLogprob, TokenizeRequest, ToolChoice, WireMessage, WorkerToRouter,
    chat::json_bytes, valid_function_name,
};

/// Most `tools` on one request.
const MAX_TOOLS: usize = 128;

/// Most choices (`n`) on one request.
const MAX_CHOICES: u32 = 16;

/// Most `logit_bias` entries on one request.
const MAX_LOGIT_BIAS: usize = 1024;

fn over(field: &'static str, size: usize, max: usize) -> Result<(), DecodeError> {
    if size > max {
        return Err(DecodeError::OverLimit {
            field,
            detail: format!("{size} exceeds the limit of {max}"),
        });
    }
    Ok(())
}

fn name(field: &'static str, value: &str, limits: &Limits) -> Result<(), DecodeError> {
    over(field, value.len(), limits.max_name_bytes)
}

/// Why a chat turn is refused; the decode error names the turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum TurnError {
    /// Content left out of a turn that is not the assistant's.
    #[error("\"content\" is required for a {0:?} turn (only an assistant turn may leave it out)")]
    NoContent(String),
    /// A content part of another type than text.
    #[error("content part type {0:?} is not supported: only \"text\" parts are")]
    PartType(String),
    /// A text part without its text.
    #[error("a \"text\" content part needs \"text\"")]
    PartText,
    /// A tool call of another type than function.
    #[error("tool call type {0:?} is not supported: only \"function\" is")]
    CallType(String),
    /// Tool call arguments that are neither a JSON string nor a map.
    #[error("the arguments of tool call {0:?} must be a JSON string or a map")]
    Arguments(String),
}

impl ChatMessage {
    /// The value domains of a turn's fields: content is a string or text
    /// parts, and absent only for an assistant turn; tool calls are
    /// functions whose arguments are a JSON string or a map.
    fn check(&self) -> Result<(), TurnError> {
        match &self.content {
            None if self.role != "assistant" => {
                return Err(TurnError::NoContent(self.role.clone()));
            }
            Some(MessageContent::Parts(parts)) => {
                for part in parts {
                    if part.kind != "text" {
                        return Err(TurnError::PartType(part.kind.clone()));
                    }
                    if part.text.is_none() {
                        return Err(TurnError::PartText);
                    }
                }
            }
            _ => {}
        }
        for call in self.tool_calls.iter().flatten() {
            if let Some(kind) = call.kind.as_deref().filter(|kind| *kind != "function") {
                return Err(TurnError::CallType(kind.to_string()));
            }
            if !(call.function.arguments.is_string() || call.function.arguments.is_object()) {
                return Err(TurnError::Arguments(call.function.name.clone()));
            }
        }
        Ok(())
    }
}

impl GenerateRequest {
    /// Checks limits and value domains; the router and the worker accept
    /// only requests that pass.
    pub fn validate(&self, limits: &Limits) -> Result<(), DecodeError> {
        over("id", self.id.len(), limits.max_name_bytes)?;
        let sources = [
            self.prompt.is_some(),
            self.messages.is_some(),
            self.tokens.is_some(),
        ];
        if sources.iter().filter(|set| **set).count() != 1 {
            return Err(DecodeError::Invalid {
                field: "prompt",
                detail: "give exactly one of \"prompt\", \"messages\" or \"tokens\"".into(),
            });
        }
        if let Some(prompt) = &self.prompt {
            over("prompt", prompt.len(), limits.max_prompt_bytes)?;
        }
        if let Some(messages) = &self.messages {
            chat_messages(messages, limits)?;
        }
        if let Some(tokens) = &self.tokens {
            over("tokens", tokens.len(), limits.max_prompt_items)?;
            if tokens.is_empty() {
                return Err(DecodeError::Invalid {
                    field: "tokens",
                    detail: "must hold at least one token".into(),
                });
            }
        }
        if let Some(model) = &self.model {
            over("model", model.len(), limits.max_name_bytes)?;
        }
        if let Some(namespace) = &self.namespace {
            over("namespace", namespace.len(), limits.max_name_bytes)?;
        }
        over(
            "max_tokens",
            self.max_tokens as usize,
            limits.max_tokens_cap as usize,
        )?;
        over("stop", self.stop.len(), limits.max_stop)?;
        for stop in &self.stop {
            over("stop", stop.len(), limits.max_stop_bytes)?;
            if stop.is_empty() {
                return Err(DecodeError::Invalid {
                    field: "stop",
                    detail: "stop strings must not be empty".into(),
                });
            }
        }
        over(
            "stop_token_ids",
            self.stop_token_ids.len(),
            limits.max_stop_token_ids,
        )?;
        let ranges: [(&'static str, f32, f32, f32); 6] = [
            ("temperature", self.temperature, 0.0, 100.0),
            ("top_p", self.top_p, 0.0, 1.0),
            ("min_p", self.min_p, 0.0, 1.0),
            ("repetition_penalty", self.repetition_penalty, 0.01, 100.0),
            ("presence_penalty", self.presence_penalty, -2.0, 2.0),
            ("frequency_penalty", self.frequency_penalty, -2.0, 2.0),
        ];
        for (field, value, lo, hi) in ranges {
            if !(lo..=hi).contains(&value) {
                return Err(DecodeError::Invalid {
                    field,
                    detail: format!("{value} is outside [{lo}, {hi}]"),
                });
            }
        }
        if self.top_p == 0.0 {
            return Err(DecodeError::Invalid {
                field: "top_p",
                detail: "must be greater than 0".into(),
            });
        }
        if let Some(constraint) = &self.constraint {
            constraint.kind()?;
        }
        self.validate_tools(limits)?;
        self.validate_logit_bias()?;
        if let Some(document) = &self.document {
            over("document", document.len(), limits.max_prompt_bytes)?;
            if self.embed != Some(crate::Pooling::Rank) || self.prompt.is_none() {
                return Err(DecodeError::Invalid {
                    field: "document",
                    detail: "a document is scored against a text \"prompt\" (the query) \
                             with \"embed\": \"rank\""
                        .into(),
                });
            }
        }
        if self.embed.is_some() && self.max_tokens != 0 {
            return Err(DecodeError::Invalid {
                field: "embed",
                detail: "an embedding computes the prompt only: needs \"max_tokens\": 0".into(),
            });
        }
        if let Some(top) = self.prompt_logprobs {
            over(
                "prompt_logprobs",
                top as usize,
                limits.max_top_logprobs as usize,
            )?;
        }
        if let Some(speculative) = &self.speculative {
            speculative.validate()?;
        }
        if !(1..=MAX_CHOICES).contains(&self.n) {
            return Err(DecodeError::Invalid {
                field: "n",
                detail: format!("{} is outside [1, {MAX_CHOICES}]", self.n),
            });
        }
        self.validate_logprobs(limits)
    }

    /// Whether the request, sent as a frame, stays within
    /// `limits.max_depth` levels of nesting (tool schemas, constraints and
    /// chat template variables are free-form JSON). [`Self::validate`]
    /// does not look, since a decoded frame was checked as it was read; a
    /// request built elsewhere (the HTTP front) checks it here, so the
    /// router never refuses what was sent to it.
    pub fn check_nesting(&self, limits: &Limits) -> Result<(), DecodeError> {
        let frame = crate::encode(self).map_err(|error| DecodeError::Invalid {
            field: "request",
            detail: error.to_string(),
        })?;
        crate::scan::check_structure(&frame, limits.max_depth)
    }

    /// The token ids of `logit_bias` with their biases, in id order;
    /// valid once [`Self::validate`] passed.
    pub fn logit_bias_ids(&self) -> Vec<(u32, f32)> {
        let mut ids: Vec<(u32, f32)> = self
            .logit_bias
            .iter()
            .filter_map(|(id, &bias)| Some((id.parse().ok()?, bias)))
            .collect();
        ids.sort_unstable_by_key(|&(id, _)| id);
        ids
    }

    /// Decimal token ids, OpenAI's bias range and count.
    fn validate_logit_bias(&self) -> Result<(), DecodeError> {
        over("logit_bias", self.logit_bias.len(), MAX_LOGIT_BIAS)?;
        for (id, bias) in &self.logit_bias {
            if id.parse::<u32>().is_err() {
                return Err(DecodeError::Invalid {
                    field: "logit_bias",
                    detail: format!("key {id:?} is not a token id (a decimal integer)"),
                });
            }
            if !(-100.0..=100.0).contains(bias) {
                return Err(DecodeError::Invalid {
                    field: "logit_bias",
                    detail: format!("bias {bias} of token {id} is outside [-100, 100]"),
                });
            }
        }
        Ok(())
    }

    /// Tools need a conversation; names are OpenAI's and unique; a forced
    /// call names a tool given and excludes a `constraint` of its own.
    fn validate_tools(&self, limits: &Limits) -> Result<(), DecodeError> {
        let invalid = |field, detail: String| DecodeError::Invalid { field, detail };
        if let Some(kwargs) = &self.chat_template_kwargs {
            over("chat_template_kwargs", kwargs.len(), limits.max_stop)?;
            if self.messages.is_none() {
                return Err(invalid(
                    "chat_template_kwargs",
                    "needs \"messages\": only a chat template reads them".into(),
                ));
            }
        }
        if self.tools.is_empty() {
            return match &self.tool_choice {
                ToolChoice::Auto | ToolChoice::None => Ok(()),
                _ => Err(invalid(
                    "tool_choice",
                    "\"required\" or a named function needs \"tools\"".into(),
                )),
            };
        }
        over("tools", self.tools.len(), MAX_TOOLS)?;
        let bytes: usize = self
            .tools
            .iter()
            .map(|tool| {
                let def = &tool.function;
                def.name.len()
                    + def.description.as_ref().map_or(0, String::len)
                    + def.parameters.as_ref().map_or(0, json_bytes)
            })
            .sum();
        over("tools", bytes, limits.max_prompt_bytes)?;
        if self.messages.is_none() {
            return Err(invalid(
                "tools",
                "needs \"messages\": the chat template shows the tools to the model".into(),
            ));
        }
        for (i, tool) in self.tools.iter().enumerate() {
            let name = &tool.function.name;
            if tool.kind != "function" {
                return Err(invalid(
                    "tools",
                    format!(
                        "tools[{i}]: type {:?} is not supported: only \"function\" is",
                        tool.kind
                    ),
                ));
            }
            if !valid_function_name(name) {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}]: name {name:?} must be 1 to 64 of a-z, A-Z, 0-9, _ and -"),
                ));
            }
            if self.tools[..i].iter().any(|t| t.function.name == *name) {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}]: {name:?} is given twice"),
                ));
            }
            if let Some(parameters) = &tool.function.parameters
                && !parameters.is_object()
            {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}]: \"parameters\" of {name:?} must be a JSON schema map"),
                ));
            }
        }
        if let ToolChoice::Function(name) = &self.tool_choice
            && !self.tools.iter().any(|t| t.function.name == *name)
        {
            return Err(invalid(
                "tool_choice",
                format!("names {name:?}, which is not among \"tools\""),
            ));
        }
        if self.tool_choice.forces_a_call() && self.constraint.is_some() {
            return Err(invalid(
                "tool_choice",
                "a forced tool call is its own constraint; leave out \"constraint\"".into(),
            ));
        }
        Ok(())
    }

    fn validate_logprobs(&self, limits: &Limits) -> Result<(), DecodeError> {
        over(
            "top_logprobs",
            self.top_logprobs as usize,
            limits.max_top_logprobs as usize,
        )?;
        if self.top_logprobs > 0 && !self.logprobs {
            return Err(DecodeError::Invalid {
                field: "top_logprobs",
                detail: "needs \"logprobs\": true".into(),
            });
        }
        if self.logprobs && !self.stream {
            let entries = (self.max_tokens as usize).saturating_mul(1 + self.top_logprobs as usize);
            if entries > limits.max_logprob_entries {
                return Err(DecodeError::OverLimit {
                    field: "logprobs",
                    detail: format!(
                        "a non-streamed request would carry max_tokens x (1 + top_logprobs) = \
                         {entries} entries in one done, over the limit of {}; stream it or \
                         lower max_tokens",
                        limits.max_logprob_entries
                    ),
                });
            }
        }
        Ok(())
    }
}

impl TextRequest {
    /// Checks limits and value domains, as [`GenerateRequest::validate`]
    /// does for its fields of the same names.
    pub fn validate(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            TextRequest::Tokenize(request) => request.validate(limits),
            TextRequest::Detokenize(request) => request.validate(limits),
            TextRequest::ApplyTemplate(request) => request.validate(limits),
        }
    }
}

fn id_and_model(id: &str, model: Option<&str>, limits: &Limits) -> Result<(), DecodeError> {
    name("id", id, limits)?;
    name("model", model.unwrap_or_default(), limits)
}

impl TokenizeRequest {
    /// Checks limits: `content` is held to the prompt limit.
    pub fn validate(&self, limits: &Limits) -> Result<(), DecodeError> {
        id_and_model(&self.id, self.model.as_deref(), limits)?;
        over("content", self.content.len(), limits.max_prompt_bytes)
    }
}

impl DetokenizeRequest {
    /// Checks limits: `tokens` is held to the prompt-items limit.
    pub fn validate(&self, limits: &Limits) -> Result<(), DecodeError> {
        id_and_model(&self.id, self.model.as_deref(), limits)?;
        over("tokens", self.tokens.len(), limits.max_prompt_items)
    }
}

impl ApplyTemplateRequest {
    /// Checks limits: `messages` as in `generate`.
    pub fn validate(&self, limits: &Limits) -> Result<(), DecodeError> {
        id_and_model(&self.id, self.model.as_deref(), limits)?;
        chat_messages(&self.messages, limits)
    }
}

/// A conversation: at least one turn, within the prompt limits, each turn
/// well formed.
fn chat_messages(messages: &[ChatMessage], limits: &Limits) -> Result<(), DecodeError> {
    over("messages", messages.len(), limits.max_prompt_items)?;
    let bytes: usize = messages.iter().map(ChatMessage::text_bytes).sum();
    over("messages", bytes, limits.max_prompt_bytes)?;
    if messages.is_empty() {
        return Err(DecodeError::Invalid {
            field: "messages",
            detail: "must hold at least one message".into(),
        });
    }
    for (i, message) in messages.iter().enumerate() {
        message.check().map_err(|detail| DecodeError::Invalid {
            field: "messages",
            detail: format!("messages[{i}]: {detail}"),
        })?;
    }
    Ok(())
}

/// `pieces`, when present, has one entry per token.
fn pieces(pieces: Option<&[Piece]>, tokens: usize) -> Result<(), DecodeError> {
    match pieces {
        Some(pieces) if pieces.len() != tokens => Err(DecodeError::Invalid {
            field: "pieces",
            detail: format!("{} pieces for {tokens} tokens", pieces.len()),
        }),
        _ => Ok(()),
    }
}

impl WireMessage for ClientRequest {
    const TYPES: &'static [&'static str] = &[
        "generate",
        "cancel",
        "models",
        "ping",
        "tokenize",
        "detokenize",
        "apply_template",
        "embed",
    ];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            ClientRequest::Generate(request) => request.validate(limits),
            ClientRequest::Embed(request) => request.to_generate().validate(limits),
            ClientRequest::Tokenize(request) => request.validate(limits),
            ClientRequest::Detokenize(request) => request.validate(limits),
            ClientRequest::ApplyTemplate(request) => request.validate(limits),
            ClientRequest::Cancel { id } => over("id", id.len(), limits.max_name_bytes),
            ClientRequest::Models { id } | ClientRequest::Ping { id } => over(
                "id",
                id.as_ref().map_or(0, String::len),
                limits.max_name_bytes,
            ),
        }
    }
}

/// Log-probability entries: one per token of a chunk, and at most
/// `max_top_logprobs` alternatives each.
fn logprobs(
    entries: Option<&[TokenLogprob]>,
    tokens: Option<usize>,
    limits: &Limits,
) -> Result<(), DecodeError> {
    let Some(entries) = entries else {
        return Ok(());
    };
    if let Some(tokens) = tokens
        && entries.len() != tokens
    {
        return Err(DecodeError::Invalid {
            field: "logprobs",
            detail: format!("{} entries for {tokens} tokens", entries.len()),
        });
    }
    for entry in entries {
        over(
            "top_logprobs",
            entry.top_logprobs.len(),
            limits.max_top_logprobs as usize,
        )?;
    }
    Ok(())
}

impl ChunkBody {
    /// One `logprobs` entry per token, each within the limits.
    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        logprobs(self.logprobs.as_deref(), Some(self.tokens.len()), limits)
    }
}

impl DoneBody {
    /// Every `logprobs` entry within the limits.
    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        logprobs(self.logprobs.as_deref(), None, limits)?;
        logprobs(Some(self.stop_logprob.as_slice()), None, limits)
    }
}

impl WireMessage for ClientReply {
    const TYPES: &'static [&'static str] = &[
        "chunk",
        "done",
        "error",
        "models",
        "pong",
        "tokenized",
        "detokenized",
        "applied_template",
        "embedding",
    ];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            ClientReply::Tokenized {
                tokens,
                pieces: entries,
                ..
            } => pieces(entries.as_deref(), tokens.len()),
            ClientReply::Chunk { body, .. } => body.check_limits(limits),
            ClientReply::Done { body, .. } => body.check_limits(limits),
            _ => Ok(()),
        }
    }
}

impl WireMessage for RouterToWorker {
    const TYPES: &'static [&'static str] = &[
        "generate",
        "cancel",
        "heartbeat",
        "disconnect",
        "drain",
        "resume",
        "export_cache",
        "shutdown",
        "flush_cache",
        "tokenize",
        "detokenize",
        "apply_template",
    ];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            RouterToWorker::Generate { request, .. } => request.validate(limits),
            RouterToWorker::Tokenize { request, .. } => request.validate(limits),
            RouterToWorker::Detokenize { request, .. } => request.validate(limits),
            RouterToWorker::ApplyTemplate { request, .. } => request.validate(limits),
            RouterToWorker::ExportCache { endpoint, key, .. } => {
                name("endpoint", endpoint, limits)?;
                key.as_deref().map_or(Ok(()), |key| curve_key("key", key))
            }
            RouterToWorker::FlushCache {
                namespace: Some(namespace),
            } => name("namespace", namespace, limits),
            _ => Ok(()),
        }
    }
}

impl WireMessage for WorkerToRouter {
    const TYPES: &'static [&'static str] = &[
        "ready",
        "heartbeat",
        "load",
        "chunk",
        "done",
        "error",
        "cache_imported",
        "control_reply",
        "tokenized",
        "detokenized",
        "applied_template",
    ];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            WorkerToRouter::Tokenized {
                tokens,
                pieces: entries,
                ..
            } => pieces(entries.as_deref(), tokens.len()),
            WorkerToRouter::Ready(ReadyBody {
                worker_id,
                models,
                device,
                import_endpoint,
                import_key,
                ..
            }) => {
                name("worker_id", worker_id, limits)?;
                name("device", device, limits)?;
                if let Some(endpoint) = import_endpoint {
                    name("import_endpoint", endpoint, limits)?;
                }
                if let Some(key) = import_key {
                    curve_key("import_key", key)?;
                }
                for model in models {
                    name("models", model, limits)?;
                }
                Ok(())
            }
            WorkerToRouter::Chunk { body, .. } => body.check_limits(limits),
            WorkerToRouter::Done { body, .. } => body.check_limits(limits),
            _ => Ok(()),
        }
    }
}

impl WireMessage for AdminRequest {
    const TYPES: &'static [&'static str] =
        &["workers", "drain", "resume", "migrate", "reload", "scale"];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            AdminRequest::Workers {} => Ok(()),
            AdminRequest::Drain { worker, .. } | AdminRequest::Resume { worker } => {
                name("worker", worker, limits)
            }
            AdminRequest::Migrate { worker, device, .. } => {
                name("worker", worker, limits)?;
                name("device", device, limits)
            }
            AdminRequest::Reload { worker, model_path } => {
                name("worker", worker, limits)?;
                optional_path("model_path", model_path.as_deref(), limits)
            }
            AdminRequest::Scale { model, device, .. } => {
                name("model", model, limits)?;
                if let Some(device) = device {
                    name("device", device, limits)?;
                }
                Ok(())
            }
        }
    }
}

impl WireMessage for SupervisorToRouter {
    const TYPES: &'static [&'static str] = &["supervisor_status", "spawn_failed", "worker_exited"];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            SupervisorToRouter::SupervisorStatus {
                supervisor_id,
                host,
                models,
                devices,
                workers,
                ..
            } => {
                name("supervisor_id", supervisor_id, limits)?;
                name("host", host, limits)?;
                for offer in models {
                    name("name", &offer.name, limits)?;
                    optional_path("path", Some(&offer.path), limits)?;
                }
                for device in devices {
                    name("devices", device, limits)?;
                }
                for worker in workers {
                    name("workers", worker, limits)?;
                }
                Ok(())
            }
            SupervisorToRouter::SpawnFailed { worker_id, .. }
            | SupervisorToRouter::WorkerExited { worker_id, .. } => {
                name("worker_id", worker_id, limits)
            }
        }
    }
}

impl WireMessage for RouterToSupervisor {
    const TYPES: &'static [&'static str] = &["spawn", "stop"];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            RouterToSupervisor::Spawn {
                worker_id,
                model,
                model_path,
                device,
                exporter_key,
                ..
            } => {
                name("worker_id", worker_id, limits)?;
                name("model", model, limits)?;
                optional_path("model_path", model_path.as_deref(), limits)?;
                if let Some(device) = device {
                    name("device", device, limits)?;
                }
                if let Some(key) = exporter_key {
                    curve_key("exporter_key", key)?;
                }
                Ok(())
            }
            RouterToSupervisor::Stop { worker_id, .. } => name("worker_id", worker_id, limits),
        }
    }
}

impl WireMessage for CacheTransfer {
    const TYPES: &'static [&'static str] = &["cache_span", "cache_end"];
    const BIN_FIELDS: &'static [&'static str] = &["kv"];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        if let CacheTransfer::CacheSpan {
            namespace,
            tokens,
            prefix_len,
            ..
        } = self
        {
            name("namespace", namespace, limits)?;
            if *prefix_len as usize >= tokens.len() {
                return Err(DecodeError::Invalid {
                    field: "prefix_len",
                    detail: "must be below the number of tokens".into(),
                });
            }
        }
        Ok(())
    }
}

/// Paths may be longer than names, but not unbounded.
fn optional_path(
    field: &'static str,
    path: Option<&str>,
    limits: &Limits,
) -> Result<(), DecodeError> {
    over(
        field,
        path.map_or(0, str::len),
        limits.max_name_bytes.max(4096),
    )
}

impl WireMessage for AdminReply {
    const TYPES: &'static [&'static str] = &["workers", "ack", "error"];
}

/// A CURVE public key in Z85: 40 characters of its alphabet.
fn curve_key(field: &'static str, key: &str) -> Result<(), DecodeError> {
    const Z85: &str =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    if key.len() == 40 && key.chars().all(|c| Z85.contains(c)) {
        Ok(())
    } else {
        Err(DecodeError::Invalid {
            field,
            detail: "not a CURVE public key: 40 Z85 characters".into(),
        })
    }
}
