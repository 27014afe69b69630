//! A structural pass over a frame before serde sees it.
//!
//! It walks the MessagePack markers without building any value, so a frame
//! that declares more entries or bytes than it holds, nests too deeply, is not
//! a map, or carries bytes after its one value is rejected before decoding
//! allocates anything for it.

use crate::DecodeError;

/// A container still being read: how many values it has left, and
/// whether it is a map (whose values alternate key, value).
struct Open {
    left: u64,
    map: bool,
}

/// Checks that `frame` is exactly one MessagePack map, nested at most
/// `max_depth` levels (the top map is level 1), whose declared lengths all
/// fit in the bytes that follow them, with only `str` map keys and no `bin`
/// values at any depth, except in the top-level fields named in
/// `bin_fields` (raw data, such as K/V in a cache transfer).
///
/// Keys must be `str` because serde would read an integer key as the
/// position of a field (`{18: 3}` would set the 19th field); `bin` is
/// refused because serde would accept it wherever a string is expected.
pub(crate) fn check_frame(
    frame: &[u8],
    max_depth: usize,
    bin_fields: &[&str],
) -> Result<(), DecodeError> {
    walk(frame, max_depth, true, bin_fields)
}

/// [`check_frame`] without the key and `bin` rules: the frame is one
/// well-formed map within the depth limit.
pub(crate) fn check_structure(frame: &[u8], max_depth: usize) -> Result<(), DecodeError> {
    walk(frame, max_depth, false, &[])
}

fn walk(
    frame: &[u8],
    max_depth: usize,
    strict: bool,
    bin_fields: &[&str],
) -> Result<(), DecodeError> {
    let mut rest = frame;
    match rest.first() {
        Some(0x80..=0x8f | 0xde | 0xdf) => {}
        Some(marker) => {
            return Err(not_a_message(format!(
                "the frame starts with marker 0x{marker:02x}, not a map"
            )));
        }
        None => return Err(not_a_message("the frame is empty".into())),
    }
    // Open arrays and maps, innermost last.
    let mut open: Vec<Open> = Vec::new();
    // The top-level key the current value sits under, for error messages.
    let mut field: &[u8] = &[];
    loop {
        let at_key = open.last().is_some_and(|o| o.map && o.left % 2 == 0);
        let top_level = open.len() == 1;
        if let Some(o) = open.last_mut() {
            o.left -= 1;
        }
        let offset = frame.len() - rest.len();
        let before = rest;
        let children = skip_value(&mut rest, offset)?;
        let value = &before[..before.len() - rest.len()];
        let marker = value.first().copied().unwrap_or_default();
        if !strict {
            // Only the structure is checked.
        } else if at_key {
            if !is_str(marker) {
                let place = if top_level {
                    String::new()
                } else {
                    within(field)
                };
                return Err(DecodeError::Encoding(format!(
                    "{place}the map key at byte {offset} is {}, not a str; v1 map keys \
                     are str (fields are named, never numbered)",
                    kind(marker)
                )));
            }
            if top_level {
                field = value;
            }
        } else if matches!(marker, 0xc4..=0xc6)
            && !(top_level && str_value(field).is_some_and(|name| bin_fields.contains(&name)))
        {
            return Err(DecodeError::Encoding(format!(
                "{}the value at byte {offset} is MessagePack bin; v1 strings are str and \
                 no field is bin (pack text as str)",
                within(field)
            )));
        }
        if let Some(children) = children {
            let depth = open.len() + 1;
            if depth > max_depth {
                return Err(DecodeError::OverLimit {
                    field: "depth",
                    detail: format!("nesting of {depth} exceeds the limit of {max_depth}"),
                });
            }
            // Every value takes at least one byte.
            if children > rest.len() as u64 {
                return Err(not_a_message(format!(
                    "a container at byte {offset} declares {children} values but only {} bytes follow",
                    rest.len()
                )));
            }
            if children > 0 {
                open.push(Open {
                    left: children,
                    map: matches!(marker, 0x80..=0x8f | 0xde | 0xdf),
                });
                continue;
            }
        }
        while open.last().is_some_and(|o| o.left == 0) {
            open.pop();
        }
        if open.is_empty() {
            break;
        }
    }
    if !rest.is_empty() {
        return Err(not_a_message(format!(
            "{} bytes follow the message; send one MessagePack map per frame",
            rest.len()
        )));
    }
    Ok(())
}

/// `in field "name", ` for a value under the top-level key `field`.
fn within(field: &[u8]) -> String {
    match str_value(field) {
        Some(name) => format!("in field {name:?}, "),
        None => String::new(),
    }
}

fn is_str(marker: u8) -> bool {
    matches!(marker, 0xa0..=0xbf | 0xd9..=0xdb)
}

/// A marker's MessagePack type, for messages.
fn kind(marker: u8) -> &'static str {
    match marker {
        0x00..=0x7f | 0xcc..=0xd3 | 0xe0..=0xff => "an integer",
        0x80..=0x8f | 0xde | 0xdf => "a map",
        0x90..=0x9f | 0xdc | 0xdd => "an array",
        0xa0..=0xbf | 0xd9..=0xdb => "a str",
        0xc0 => "nil",
        0xc2 | 0xc3 => "a boolean",
        0xc4..=0xc6 => "bin",
        0xca | 0xcb => "a float",
        _ => "an ext value",
    }
}

/// The text of one encoded `str` value, or `None` for anything else.
pub(crate) fn str_value(value: &[u8]) -> Option<&str> {
    let (&marker, body) = value.split_first()?;
    let skip = match marker {
        0xa0..=0xbf => 0,
        0xd9 => 1,
        0xda => 2,
        0xdb => 4,
        _ => return None,
    };
    std::str::from_utf8(body.get(skip..)?).ok()
}

/// The byte ranges of each key and value of the top-level map of a frame
/// that passed [`check_frame`], in order; empty for anything else.
pub(crate) fn entries(frame: &[u8]) -> Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let mut rest = frame;
    let pairs = match skip_value(&mut rest, 0) {
        Ok(Some(children)) => children / 2,
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for _ in 0..pairs {
        let key_start = frame.len() - rest.len();
        if skip_whole(&mut rest).is_err() {
            return Vec::new();
        }
        let value_start = frame.len() - rest.len();
        if skip_whole(&mut rest).is_err() {
            return Vec::new();
        }
        out.push((
            key_start..value_start,
            value_start..frame.len() - rest.len(),
        ));
    }
    out
}

/// Skips one value with everything inside it, without recursion.
fn skip_whole(rest: &mut &[u8]) -> Result<(), DecodeError> {
    let mut pending: u64 = 1;
    while pending > 0 {
        pending -= 1;
        if let Some(children) = skip_value(rest, 0)? {
            pending = pending.saturating_add(children);
        }
    }
    Ok(())
}

/// Skips one value's marker and payload. Returns how many values it
/// contains when it is an array or a map (keys and values both count).
fn skip_value(rest: &mut &[u8], offset: usize) -> Result<Option<u64>, DecodeError> {
    let marker = take(rest, 1, offset)?[0];
    let payload = match marker {
        0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => 0,
        0x80..=0x8f => return Ok(Some(2 * u64::from(marker & 0x0f))),
        0x90..=0x9f => return Ok(Some(u64::from(marker & 0x0f))),
        0xa0..=0xbf => u64::from(marker & 0x1f),
        0xc1 => {
            return Err(not_a_message(format!(
                "byte {offset} holds the reserved marker 0xc1"
            )));
        }
        0xc4 | 0xd9 => read_len(rest, 1, offset)?,
        0xc5 | 0xda => read_len(rest, 2, offset)?,
        0xc6 | 0xdb => read_len(rest, 4, offset)?,
        0xc7 => read_len(rest, 1, offset)? + 1,
        0xc8 => read_len(rest, 2, offset)? + 1,
        0xc9 => read_len(rest, 4, offset)? + 1,
        0xca => 4,
        0xcb => 8,
        0xcc | 0xd0 => 1,
        0xcd | 0xd1 => 2,
        0xce | 0xd2 => 4,
        0xcf | 0xd3 => 8,
        0xd4 => 2,
        0xd5 => 3,
        0xd6 => 5,
        0xd7 => 9,
        0xd8 => 17,
        0xdc => return Ok(Some(read_len(rest, 2, offset)?)),
        0xdd => return Ok(Some(read_len(rest, 4, offset)?)),
        0xde => return Ok(Some(2 * read_len(rest, 2, offset)?)),
        0xdf => return Ok(Some(2 * read_len(rest, 4, offset)?)),
    };
    let payload = usize::try_from(payload).unwrap_or(usize::MAX);
    take(rest, payload, offset)?;
    Ok(None)
}

/// Reads a big-endian length of `width` bytes.
fn read_len(rest: &mut &[u8], width: usize, offset: usize) -> Result<u64, DecodeError> {
    let bytes = take(rest, width, offset)?;
    Ok(bytes
        .iter()
        .fold(0u64, |len, byte| (len << 8) | u64::from(*byte)))
}

fn take<'a>(rest: &mut &'a [u8], n: usize, offset: usize) -> Result<&'a [u8], DecodeError> {
    if n > rest.len() {
        return Err(not_a_message(format!(
            "the value at byte {offset} needs {n} more bytes but only {} remain",
            rest.len()
        )));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn not_a_message(detail: String) -> DecodeError {
    DecodeError::NotAMessage(detail)
}
