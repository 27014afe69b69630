//! Codepoint classes as llama.cpp's `unicode.cpp` sees them, and GPT-2's
//! byte-to-character map.
//!
//! The classes come from llama.cpp's own tables ([`super::unicode_data`]),
//! not from Rust's: a letter in one Unicode version may be unassigned in
//! another, and the splitters must agree with llama.cpp on every codepoint.

use std::sync::OnceLock;

use super::unicode_data::{RANGES, WHITESPACE};

const UNDEFINED: u16 = 0x0001;
const NUMBER: u16 = 0x0002;
const LETTER: u16 = 0x0004;
const ACCENT_MARK: u16 = 0x0010;
const PUNCTUATION: u16 = 0x0020;
const SYMBOL: u16 = 0x0040;
const CATEGORIES: u16 = 0x00FF;
const SPACE: u16 = 0x0100;

/// llama.cpp's `unicode_cpt_flags` of one codepoint: one category bit plus
/// `\s`. The empty value (no bit) is what llama.cpp reads past the end of a
/// chunk.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(super) struct Flags(u16);

impl Flags {
    pub(super) fn is_number(self) -> bool {
        self.0 & NUMBER != 0
    }
    pub(super) fn is_letter(self) -> bool {
        self.0 & LETTER != 0
    }
    pub(super) fn is_accent_mark(self) -> bool {
        self.0 & ACCENT_MARK != 0
    }
    pub(super) fn is_whitespace(self) -> bool {
        self.0 & SPACE != 0
    }
    /// Any flag at all: false only outside the chunk.
    pub(super) fn is_set(self) -> bool {
        self.0 != 0
    }
    /// The byte llama.cpp's regex fallback stands a non-ASCII codepoint in
    /// for ("collapsed" text): whitespace is `\v`, each category its own byte.
    pub(super) fn collapsed(self) -> u32 {
        if self.is_whitespace() {
            return 0x0B;
        }
        match self.0 & CATEGORIES {
            NUMBER => 0xD1,
            LETTER => 0xD2,
            PUNCTUATION => 0xD3,
            ACCENT_MARK => 0xD4,
            SYMBOL => 0xD5,
            _ => 0xD0,
        }
    }
}

/// Flags of every codepoint of the Basic Multilingual Plane, built once;
/// others are looked up in the ranges.
fn bmp() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![0u16; 0x10000];
        for pair in RANGES.windows(2) {
            let (start, flags) = pair[0];
            let end = pair[1].0.min(0x10000);
            for cp in start..end {
                table[cp as usize] = flags;
            }
        }
        for &cp in &WHITESPACE {
            if let Some(slot) = table.get_mut(cp as usize) {
                *slot |= SPACE;
            }
        }
        table
    })
}

/// The flags of `cp`.
pub(super) fn flags(cp: char) -> Flags {
    let cp = cp as u32;
    if let Some(&f) = bmp().get(cp as usize) {
        return Flags(f);
    }
    let i = RANGES.partition_point(|&(start, _)| start <= cp);
    let f = i.checked_sub(1).map_or(UNDEFINED, |i| RANGES[i].1);
    let space = if WHITESPACE.binary_search(&cp).is_ok() {
        SPACE
    } else {
        0
    };
    Flags(f | space)
}

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode`).
pub(super) fn byte_to_char() -> &'static [char; 256] {
    static MAP: OnceLock<[char; 256]> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = ['\0'; 256];
        let mut next = 256u32;
        for (b, slot) in map.iter_mut().enumerate() {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let cp = if printable {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        map
    })
}

/// The byte a GPT-2 stand-in character encodes, if it is one: printable
/// bytes stand for themselves, the others were numbered from 256 in order.
pub(super) fn char_to_byte(c: char) -> Option<u8> {
    let b = match c as u32 {
        cp @ (0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF) => cp,
        cp @ 256..=288 => cp - 256,
        cp @ 289..=322 => cp - 289 + 0x7F,
        323 => 0xAD,
        _ => return None,
    };
    u8::try_from(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_llama_cpp_tables() {
        assert!(flags('a').is_letter());
        assert!(flags('7').is_number());
        assert!(flags(' ').is_whitespace());
        assert!(flags('\u{3000}').is_whitespace());
        // U+001C..U+001F are `\s` to Python, not to llama.cpp.
        assert!(!flags('\u{1C}').is_whitespace());
        assert!(flags('\u{0301}').is_accent_mark());
        assert!(flags('😀').is_set() && !flags('😀').is_letter());
        assert_eq!(flags('😀').collapsed(), 0xD5);
        assert!(flags('𝔸').is_letter());
        assert_eq!(flags('\u{A0}').collapsed(), 0x0B);
    }

    #[test]
    fn byte_map_round_trips() {
        let map = byte_to_char();
        assert_eq!(map[b' ' as usize], 'Ġ');
        assert_eq!(map[b'\n' as usize], 'Ċ');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(map[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('é'), Some(0xE9));
        assert_eq!(char_to_byte('中'), None);
    }
}
