//! Encoding and the one checked decoder.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{
    AdminReply, AdminRequest, ClientReply, ClientRequest, GenerateRequest, Limits,
    PROTOCOL_VERSION, RouterToWorker, WorkerToRouter,
};

/// Why a frame was rejected. Every variant maps to the `bad_request` error
/// code, and its message names what was wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The frame is larger than `Limits::max_frame_bytes`.
    #[error("frame of {size} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// Frame size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The frame is not a MessagePack map with a string `type`.
    #[error("frame is not a MessagePack map with a string \"type\" field: {0}")]
    NotAMessage(String),
    /// `type` names no message valid on this socket.
    #[error("unknown message type {found:?}; expected one of {expected:?}")]
    UnknownType {
        /// The type received.
        found: String,
        /// The types valid here.
        expected: &'static [&'static str],
    },
    /// `v` names a protocol version this build does not speak.
    #[error("unsupported protocol version {found}; this server speaks version {supported}")]
    UnsupportedVersion {
        /// The version received.
        found: u64,
        /// The version spoken here.
        supported: u32,
    },
    /// A known message type with missing, mistyped or too deeply nested fields.
    #[error("malformed {kind:?} message: {detail}")]
    Malformed {
        /// The message type.
        kind: String,
        /// What the decoder reported.
        detail: String,
    },
    /// A field is over its limit.
    #[error("field {field:?} is over its limit: {detail}")]
    OverLimit {
        /// The field.
        field: &'static str,
        /// Size and limit.
        detail: String,
    },
    /// A field has a value outside its domain.
    #[error("field {field:?} is invalid: {detail}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        detail: String,
    },
}

/// Encoding failed; only possible for a value serde cannot represent.
#[derive(Debug, thiserror::Error)]
#[error("encoding failed: {0}")]
pub struct EncodeError(#[from] rmp_serde::encode::Error);

/// A message type that can be decoded from one side of a socket.
pub trait WireMessage: Serialize + DeserializeOwned {
    /// Every `type` valid in this direction.
    const TYPES: &'static [&'static str];

    /// Field limits beyond what decoding already bounds.
    fn check_limits(&self, _limits: &Limits) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// Encodes a message as a MessagePack map with string keys.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, EncodeError> {
    Ok(rmp_serde::to_vec_named(message)?)
}

#[derive(Deserialize)]
struct Header {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    v: Option<u64>,
}

/// Decodes one frame, enforcing every limit. Never panics; any failure is a
/// [`DecodeError`] that says what was wrong.
pub fn decode<T: WireMessage>(frame: &[u8], limits: &Limits) -> Result<T, DecodeError> {
    if frame.len() > limits.max_frame_bytes {
        return Err(DecodeError::FrameTooLarge {
            size: frame.len(),
            max: limits.max_frame_bytes,
        });
    }
    let header: Header =
        from_slice(frame, limits).map_err(|e| DecodeError::NotAMessage(e.to_string()))?;
    if let Some(v) = header.v
        && v != u64::from(PROTOCOL_VERSION)
    {
        return Err(DecodeError::UnsupportedVersion {
            found: v,
            supported: PROTOCOL_VERSION,
        });
    }
    if !T::TYPES.contains(&header.kind.as_str()) {
        return Err(DecodeError::UnknownType {
            found: header.kind,
            expected: T::TYPES,
        });
    }
    let message: T = from_slice(frame, limits).map_err(|e| DecodeError::Malformed {
        kind: header.kind,
        detail: e.to_string(),
    })?;
    message.check_limits(limits)?;
    Ok(message)
}

fn from_slice<T: DeserializeOwned>(
    frame: &[u8],
    limits: &Limits,
) -> Result<T, rmp_serde::decode::Error> {
    let mut de = rmp_serde::Deserializer::from_read_ref(frame);
    de.set_max_depth(limits.max_depth);
    T::deserialize(&mut de)
}

fn over(field: &'static str, size: usize, max: usize) -> Result<(), DecodeError> {
    if size > max {
        return Err(DecodeError::OverLimit {
            field,
            detail: format!("{size} exceeds the limit of {max}"),
        });
    }
    Ok(())
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
            let bytes: usize = messages.iter().map(|m| m.content.len() + m.role.len()).sum();
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
        Ok(())
    }
}

impl WireMessage for ClientRequest {
    const TYPES: &'static [&'static str] = &["generate", "cancel", "models", "ping"];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            ClientRequest::Generate(request) => request.validate(limits),
            ClientRequest::Cancel { id } => over("id", id.len(), limits.max_name_bytes),
            ClientRequest::Models { id } | ClientRequest::Ping { id } => {
                over("id", id.as_ref().map_or(0, String::len), limits.max_name_bytes)
            }
        }
    }
}

impl WireMessage for ClientReply {
    const TYPES: &'static [&'static str] = &["chunk", "done", "error", "models", "pong"];
}

impl WireMessage for RouterToWorker {
    const TYPES: &'static [&'static str] = &[
        "generate",
        "cancel",
        "heartbeat",
        "disconnect",
        "drain",
        "migrate",
        "shutdown",
        "flush_cache",
    ];

    fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        match self {
            RouterToWorker::Generate { request, .. } => request.validate(limits),
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
        "control_reply",
    ];
}

impl WireMessage for AdminRequest {
    const TYPES: &'static [&'static str] = &["workers", "drain", "migrate", "scale"];
}

impl WireMessage for AdminReply {
    const TYPES: &'static [&'static str] = &["workers", "ack", "error"];
}
