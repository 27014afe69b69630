//! Encoding and the one checked decoder.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{Limits, PROTOCOL_VERSION, scan};

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
    /// The frame is not one MessagePack map with a string `type`.
    #[error("frame is not one MessagePack map with a string \"type\" field: {0}")]
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
    v: Option<Version>,
}

/// `v` as sent; anything but a non-negative integer is kept apart so the
/// error can say that `v` itself is wrong.
#[derive(Deserialize)]
#[serde(untagged)]
enum Version {
    Number(u64),
    Other(serde::de::IgnoredAny),
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
    scan::check_frame(frame, limits.max_depth)?;
    let header: Header =
        from_slice(frame, limits).map_err(|e| DecodeError::NotAMessage(e.to_string()))?;
    match header.v {
        None => {}
        Some(Version::Number(v)) if v == u64::from(PROTOCOL_VERSION) => {}
        Some(Version::Number(v)) => {
            return Err(DecodeError::UnsupportedVersion {
                found: v,
                supported: PROTOCOL_VERSION,
            });
        }
        Some(Version::Other(_)) => {
            return Err(DecodeError::Invalid {
                field: "v",
                detail: format!("must be the integer {PROTOCOL_VERSION} or left out"),
            });
        }
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
    // `check_frame` already bounded the depth, so this is only a backstop.
    // rmp-serde allows one level fewer than its setting, and 0 would
    // underflow its counter.
    de.set_max_depth(limits.max_depth.saturating_add(1));
    T::deserialize(&mut de)
}
