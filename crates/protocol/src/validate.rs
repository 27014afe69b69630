//! Field limits and value domains, checked after a frame has decoded.

use crate::{
    AdminReply, AdminRequest, CacheTransfer, ClientReply, ClientRequest, DecodeError,
    GenerateRequest, Limits, RouterToSupervisor, RouterToWorker, SupervisorToRouter, TokenLogprob,
    WireMessage, WorkerToRouter,
};

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
            over("messages", messages.len(), limits.max_prompt_items)?;
            let bytes: usize = messages
                .iter()
                .map(|m| m.content.len() + m.role.len())
                .sum();
            over("messages", bytes, limits.max_prompt_bytes)?;
            if messages.is_empty() {
                return Err(DecodeError::Invalid {
                    field: "messages",
                    detail: "must hold at least one message".into(),
                });
            }
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
        let ranges: [(&'static str, f32, f32, f32); 4] = [
            ("temperature", self.temperature, 0.0, 100.0),
            ("top_p", self.top_p, 0.0, 1.0),
            ("min_p", self.min_p, 0.0, 1.0),
            ("repetition_penalty", self.repetition_penalty, 0.01, 100.0),
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
        self.validate_logprobs(limits)
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

impl WireMessage for ClientRequest {
    const TYPES: &'static [&'static str] = &["generate", "cancel", "models", "ping"];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            ClientRequest::Generate(request) => request.validate(limits),
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

impl WireMessage for ClientReply {
    const TYPES: &'static [&'static str] = &["chunk", "done", "error", "models", "pong"];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            ClientReply::Chunk {
                tokens,
                logprobs: entries,
                ..
            } => logprobs(entries.as_deref(), Some(tokens.len()), limits),
            ClientReply::Done {
                logprobs: entries, ..
            } => logprobs(entries.as_deref(), None, limits),
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
    ];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            RouterToWorker::Generate { request, .. } => request.validate(limits),
            RouterToWorker::ExportCache { endpoint, .. } => name("endpoint", endpoint, limits),
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
    ];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            WorkerToRouter::Ready {
                worker_id,
                models,
                device,
                import_endpoint,
                ..
            } => {
                name("worker_id", worker_id, limits)?;
                name("device", device, limits)?;
                if let Some(endpoint) = import_endpoint {
                    name("import_endpoint", endpoint, limits)?;
                }
                for model in models {
                    name("models", model, limits)?;
                }
                Ok(())
            }
            WorkerToRouter::Chunk {
                tokens,
                logprobs: entries,
                ..
            } => logprobs(entries.as_deref(), Some(tokens.len()), limits),
            WorkerToRouter::Done {
                logprobs: entries, ..
            } => logprobs(entries.as_deref(), None, limits),
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
                ..
            } => {
                name("worker_id", worker_id, limits)?;
                name("model", model, limits)?;
                optional_path("model_path", model_path.as_deref(), limits)?;
                if let Some(device) = device {
                    name("device", device, limits)?;
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
