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
    /// The frame breaks a v1 encoding rule: a map key that is not `str`, or
    /// a `bin` value, at any depth.
    #[error("frame breaks the v1 encoding: {0}")]
    Encoding(String),
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

    /// Top-level fields that hold raw bytes (MessagePack bin); everywhere
    /// else bin is refused.
    const BIN_FIELDS: &'static [&'static str] = &[];

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
    scan::check_frame(frame, limits.max_depth, T::BIN_FIELDS)?;
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
    let message: T = from_slice(frame, limits).map_err(|e| {
        let detail = e.to_string();
        let detail = match culprit::<T>(frame, limits, &detail) {
            Some(field) => format!("field {field:?}: {detail}"),
            None => detail,
        };
        DecodeError::Malformed {
            kind: header.kind,
            detail,
        }
    })?;
    message.check_limits(limits)?;
    Ok(message)
}

/// The `id` of a frame that failed to decode, for the error reply: the
/// value of a top-level `str` key `"id"` when it is a `str` within the
/// name limit. Keys are matched by name only (never by position, never
/// `bin`), and a frame that is not well formed has none.
pub fn recover_id(frame: &[u8], limits: &Limits) -> Option<String> {
    if frame.len() > limits.max_frame_bytes {
        return None;
    }
    scan::check_structure(frame, limits.max_depth).ok()?;
    scan::entries(frame)
        .into_iter()
        .find(|(key, _)| scan::str_value(&frame[key.clone()]) == Some("id"))
        .and_then(|(_, value)| scan::str_value(&frame[value]).map(str::to_string))
        .filter(|id| id.len() <= limits.max_name_bytes)
}

/// The top-level field whose value made decoding fail with `detail`, for
/// errors such as `invalid type: string "ten", expected u32` that do not
/// name it. serde reads fields in frame order and stops at the first bad
/// one, so the culprit is the last field of the shortest prefix of the
/// map that fails the same way; a binary search finds it in a handful of
/// decodes, paid only by frames that are rejected anyway. Maps of more
/// than [`MAX_PROBED_FIELDS`] entries are not searched, which bounds the
/// extra work at 7 decodes.
fn culprit<T: DeserializeOwned>(frame: &[u8], limits: &Limits, detail: &str) -> Option<String> {
    // serde names the field itself in these ("missing field `id`").
    if detail.contains("field `") {
        return None;
    }
    let entries = scan::entries(frame);
    let is_type =
        |key: &std::ops::Range<usize>| scan::str_value(&frame[key.clone()]) == Some("type");
    let tag = entries.iter().find(|(key, _)| is_type(key))?.clone();
    let fields: Vec<_> = entries.iter().filter(|(key, _)| !is_type(key)).collect();
    if fields.len() > MAX_PROBED_FIELDS {
        return None;
    }
    let fails_alike = |n: usize| {
        let mut prefix = map_header(n + 1);
        prefix.extend_from_slice(&frame[tag.0.start..tag.1.end]);
        for (key, value) in &fields[..n] {
            prefix.extend_from_slice(&frame[key.start..value.end]);
        }
        from_slice::<T>(&prefix, limits).is_err_and(|e| e.to_string() == detail)
    };
    // Smallest n in 1..=len with fails_alike(n); it holds for len.
    let (mut lo, mut hi) = (1, fields.len());
    if hi == 0 || !fails_alike(hi) {
        return None;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fails_alike(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let (key, _) = fields[lo - 1];
    scan::str_value(&frame[key.clone()]).map(str::to_string)
}

/// Most fields [`culprit`] searches; every v1 message has fewer.
const MAX_PROBED_FIELDS: usize = 64;

/// A MessagePack map header for `len` pairs.
fn map_header(len: usize) -> Vec<u8> {
    match len {
        0..=15 => vec![0x80 | len as u8],
        16..=0xffff => {
            let mut header = vec![0xde];
            header.extend_from_slice(&(len as u16).to_be_bytes());
            header
        }
        _ => {
            let mut header = vec![0xdf];
            header.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
            header
        }
    }
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
