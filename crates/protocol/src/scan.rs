//! A structural pass over a frame before serde sees it.
//!
//! It walks the MessagePack markers without building any value, so a frame
//! that declares more entries or bytes than it holds, nests too deeply, is not
//! a map, or carries bytes after its one value is rejected before decoding
//! allocates anything for it.

use crate::DecodeError;

/// Checks that `frame` is exactly one MessagePack map, nested at most
/// `max_depth` levels (the top map is level 1), whose declared lengths all
/// fit in the bytes that follow them.
pub(crate) fn check_frame(frame: &[u8], max_depth: usize) -> Result<(), DecodeError> {
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
    // Values still to read in each open array or map, innermost last.
    let mut open: Vec<u64> = Vec::new();
    loop {
        if let Some(left) = open.last_mut() {
            *left -= 1;
        }
        let offset = frame.len() - rest.len();
        if let Some(children) = skip_value(&mut rest, offset)? {
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
                open.push(children);
                continue;
            }
        }
        while open.last() == Some(&0) {
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
