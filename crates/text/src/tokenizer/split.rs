//! Pre-tokenizers: the text cut into words before BPE merges, exactly as
//! llama.cpp's `unicode_regex_split` cuts it.
//!
//! llama.cpp runs a list of regexes per `tokenizer.ggml.pre`; each splits
//! every chunk the previous ones left into its matches and the text between
//! them. The common ones (GPT-2, Llama 3, Qwen 2, Qwen 3.5, newlines) have
//! hand-written matchers in `unicode.cpp`, ported here line by line. The rest
//! go through `std::regex` on a "collapsed" text (a non-ASCII codepoint
//! replaced by one byte for its class, whitespace by `\v`), or on the
//! codepoints with non-ASCII whitespace replaced by `\v`; [`Step`] spells out
//! what each of those regexes matches under that scheme.

use super::unicode::{Flags, flags as cp_flags};
use super::unicode_data::{CJK, DEEPSEEK_LETTERS, DEEPSEEK_PUNCT};

/// A chunk of the text, as codepoint indices `[start, end)`.
pub(super) type Chunk = (usize, usize);

/// One regex of a pre-tokenizer, named after what it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// Llama 3: `(?i:'s|'t|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// Qwen 2: Llama 3 with single digits (`\p{N}`).
    Qwen2,
    /// Qwen 3.5: Qwen 2 with combining marks in words (`[\p{L}\p{M}]+`).
    Qwen35,
    /// GPT-4o (o200k): `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|...)?`,
    /// the same with `*` and `+` swapped, then
    /// `\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`; llama.cpp has
    /// no hand-written matcher for it and runs `std::regex` on the collapsed text.
    Gpt4o,
    /// `[^\n]+|[\n]+`
    Newlines,
    /// `\p{N}`: each number alone.
    Number,
    /// `\p{N}+`
    Numbers,
    /// `[0-9][0-9][0-9]`
    ThreeDigits,
    /// `[\r\n]`
    CrOrLf,
    /// `[\p{P}\$\+<=>\^~\|]+` (the default pre-tokenizer's first regex).
    PunctSymbols,
    /// ``[\p{P}\$\+<=>\^~\|`]+`` (Falcon's).
    PunctSymbolsBacktick,
    /// DeepSeek LLM's `\s?[A-Za-zµÀ-ÖØ-ö...]+` (Latin, Greek, Cyrillic, ... letters).
    DeepseekLetters,
    /// DeepSeek LLM's `\s?[!-/:-~！-／：-～‘-‟　-。]+`
    DeepseekPunct,
    /// `\s+$`
    TrailingSpace,
    /// `[一-龥ࠀ-一가-퟿]+`
    Cjk,
    /// `\s?\p{L}+`
    SpaceLetters,
    /// `\s?\p{P}+`
    SpacePunct,
}

fn in_ranges(ranges: &[(u32, u32)], cp: u32) -> bool {
    ranges.iter().any(|&(lo, hi)| lo <= cp && cp <= hi)
}

/// The text as llama.cpp's splitters see it: codepoints and their flags.
pub(super) struct Text {
    pub(super) cps: Vec<char>,
    flags: Vec<Flags>,
}

impl Text {
    pub(super) fn new(text: &str) -> Self {
        let cps: Vec<char> = text.chars().collect();
        let flags = cps.iter().map(|&c| cp_flags(c)).collect();
        Text { cps, flags }
    }

    /// The codepoint `std::regex` compares in the collapsed text.
    fn collapsed(&self, i: usize) -> u32 {
        let c = u32::from(self.cps[i]);
        if c < 128 {
            c
        } else {
            self.flags[i].collapsed()
        }
    }

    /// The codepoint `std::wregex` compares: non-ASCII whitespace is `\v`.
    fn wide(&self, i: usize) -> u32 {
        let c = u32::from(self.cps[i]);
        if c > 0x7F && self.flags[i].is_whitespace() {
            0x0B
        } else {
            c
        }
    }

    /// `\s` of `std::regex` in the C locale, after either replacement.
    fn is_space(&self, i: usize) -> bool {
        matches!(self.wide(i), 0x09..=0x0D | 0x20)
    }

    fn is_collapsed_number(&self, i: usize) -> bool {
        matches!(self.collapsed(i), 0xD1 | 0x30..=0x39)
    }

    fn is_collapsed_letter(&self, i: usize) -> bool {
        matches!(self.collapsed(i), 0xD2 | 0x41..=0x5A | 0x61..=0x7A)
    }

    /// `\p{P}` collapsed: non-ASCII punctuation, or `!-#%-*,-/:;?@[-]_{}`.
    fn is_collapsed_punct(&self, i: usize) -> bool {
        matches!(
            self.collapsed(i),
            0xD3 | 0x21..=0x23 | 0x25..=0x2A | 0x2C..=0x2F | 0x3A..=0x3B | 0x3F..=0x40 | 0x5B..=0x5D | 0x5F | 0x7B | 0x7D
        )
    }

    /// Whether codepoint `i` is in the class a simple step repeats.
    fn in_class(&self, step: Step, i: usize) -> bool {
        match step {
            Step::Number | Step::Numbers => self.is_collapsed_number(i),
            Step::ThreeDigits => matches!(self.wide(i), 0x30..=0x39),
            Step::CrOrLf => matches!(self.wide(i), 0x0A | 0x0D),
            Step::PunctSymbols => {
                self.is_collapsed_punct(i)
                    || matches!(
                        self.collapsed(i),
                        0x24 | 0x2B | 0x3C..=0x3E | 0x5E | 0x7E | 0x7C
                    )
            }
            Step::PunctSymbolsBacktick => {
                self.in_class(Step::PunctSymbols, i) || self.collapsed(i) == 0x60
            }
            Step::DeepseekLetters => in_ranges(&DEEPSEEK_LETTERS, self.wide(i)),
            Step::DeepseekPunct => in_ranges(&DEEPSEEK_PUNCT, self.wide(i)),
            Step::Cjk => in_ranges(&CJK, self.wide(i)),
            Step::SpaceLetters => self.is_collapsed_letter(i),
            Step::SpacePunct => self.is_collapsed_punct(i),
            Step::TrailingSpace => self.is_space(i),
            Step::Gpt2
            | Step::Llama3
            | Step::Qwen2
            | Step::Qwen35
            | Step::Gpt4o
            | Step::Newlines => false,
        }
    }

    fn flags_at(&self, i: usize, (lo, hi): Chunk) -> Flags {
        if lo <= i && i < hi {
            self.flags[i]
        } else {
            Flags::default()
        }
    }

    fn cp_at(&self, i: usize, (lo, hi): Chunk) -> Option<char> {
        (lo <= i && i < hi).then(|| self.cps[i])
    }
}

/// The chunks of the whole text after every step, in order.
pub(super) fn split(text: &Text, steps: &[Step]) -> Vec<Chunk> {
    let mut chunks = vec![(0, text.cps.len())];
    for &step in steps {
        let mut out = Vec::with_capacity(chunks.len() * 2);
        for &chunk in &chunks {
            if chunk.0 < chunk.1 {
                split_chunk(text, step, chunk, &mut out);
            }
        }
        chunks = out;
    }
    chunks.retain(|&(lo, hi)| lo < hi);
    chunks
}

fn split_chunk(text: &Text, step: Step, chunk: Chunk, out: &mut Vec<Chunk>) {
    match step {
        Step::Gpt2 => gpt2(text, chunk, out),
        Step::Llama3 => llama3_like(text, chunk, Digits::UpToThree, false, out),
        Step::Qwen2 => llama3_like(text, chunk, Digits::One, false, out),
        Step::Qwen35 => llama3_like(text, chunk, Digits::One, true, out),
        Step::Gpt4o => gpt4o(text, chunk, out),
        Step::Newlines => newlines(text, chunk, out),
        _ => regex_like(text, step, chunk, out),
    }
}

/// Collects the words of one chunk, each ending where the next begins.
struct Words<'a> {
    out: &'a mut Vec<Chunk>,
    prev: usize,
}

impl Words<'_> {
    /// Ends a word at `end`; returns its length (llama.cpp's `_add_token`).
    fn add(&mut self, end: usize) -> usize {
        let len = end.saturating_sub(self.prev);
        if len > 0 {
            self.out.push((self.prev, end));
        }
        self.prev = end;
        len
    }
}

fn is_contraction_letter(c: char) -> bool {
    matches!(c, 's' | 't' | 'm' | 'd')
}

fn is_two_letter_contraction(a: char, b: char) -> bool {
    matches!((a, b), ('r', 'e') | ('v', 'e') | ('l', 'l'))
}

/// `unicode_regex_split_custom_gpt2`.
fn gpt2(t: &Text, chunk: Chunk, out: &mut Vec<Chunk>) {
    let (lo, hi) = chunk;
    let mut w = Words { out, prev: lo };
    let mut pos = lo;
    while pos < hi {
        let cpt = t.cps[pos];
        let flags = t.flags[pos];
        if cpt == '\'' && pos + 1 < hi {
            let next = t.cps[pos + 1];
            if is_contraction_letter(next) {
                pos += w.add(pos + 2);
                continue;
            }
            if pos + 2 < hi && is_two_letter_contraction(next, t.cps[pos + 2]) {
                pos += w.add(pos + 3);
                continue;
            }
        }
        let space = usize::from(cpt == ' ');
        let mut flags2 = if cpt == ' ' {
            t.flags_at(pos + 1, chunk)
        } else {
            flags
        };
        if flags2.is_letter() {
            pos += space;
            while flags2.is_letter() {
                pos += 1;
                flags2 = t.flags_at(pos, chunk);
            }
            w.add(pos);
            continue;
        }
        if flags2.is_number() {
            pos += space;
            while flags2.is_number() {
                pos += 1;
                flags2 = t.flags_at(pos, chunk);
            }
            w.add(pos);
            continue;
        }
        if is_other(flags2) {
            pos += space;
            while is_other(flags2) {
                pos += 1;
                flags2 = t.flags_at(pos, chunk);
            }
            w.add(pos);
            continue;
        }
        let spaces = count_spaces(t, pos, chunk);
        pos = whitespace_or_one_end(t, pos, spaces, chunk);
        w.add(pos);
    }
}

/// `[^\s\p{L}\p{N}]` inside the chunk.
fn is_other(f: Flags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.is_set()
}

/// `[^\s\p{L}\p{M}\p{N}]` inside the chunk (Qwen 3.5).
fn is_other_or_mark(f: Flags) -> bool {
    is_other(f) && !f.is_accent_mark()
}

/// The end of the last alternatives both GPT-2-style patterns share,
/// `\s+(?!\S)|\s+|.`, at `pos` with `spaces` whitespace code points there:
/// a run of whitespace followed by more text leaves its last one to the
/// next word.
fn whitespace_or_one_end(t: &Text, pos: usize, spaces: usize, chunk: Chunk) -> usize {
    if spaces > 1 && t.cp_at(pos + spaces, chunk).is_some() {
        pos + spaces - 1
    } else if spaces > 0 {
        pos + spaces
    } else {
        pos + 1
    }
}

fn count_spaces(t: &Text, pos: usize, chunk: Chunk) -> usize {
    let mut n = 0;
    while t.flags_at(pos + n, chunk).is_whitespace() {
        n += 1;
    }
    n
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Digits {
    One,
    UpToThree,
}

/// `unicode_regex_split_custom_llama3`, `_qwen2` and `_qwen35`: the same
/// matcher with digits one or up to three at a time, and (Qwen 3.5)
/// combining marks counted with letters.
fn llama3_like(t: &Text, chunk: Chunk, digits: Digits, marks: bool, out: &mut Vec<Chunk>) {
    let (lo, hi) = chunk;
    let mut w = Words { out, prev: lo };
    let word = |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
    let other = |f: Flags| {
        if marks {
            is_other_or_mark(f)
        } else {
            is_other(f)
        }
    };
    let mut pos = lo;
    while pos < hi {
        let cpt = t.cps[pos];
        let flags = t.flags[pos];
        if cpt == '\'' && pos + 1 < hi {
            let next = t.cps[pos + 1].to_ascii_lowercase();
            if is_contraction_letter(next) {
                pos += w.add(pos + 2);
                continue;
            }
            if pos + 2 < hi && is_two_letter_contraction(next, t.cps[pos + 2].to_ascii_lowercase())
            {
                pos += w.add(pos + 3);
                continue;
            }
        }
        if !(cpt == '\r' || cpt == '\n' || flags.is_number())
            && (word(flags) || word(t.flags_at(pos + 1, chunk)))
        {
            pos += 1;
            while word(t.flags_at(pos, chunk)) {
                pos += 1;
            }
            w.add(pos);
            continue;
        }
        if flags.is_number() {
            match digits {
                Digits::One => {
                    pos += 1;
                    w.add(pos);
                }
                Digits::UpToThree => {
                    let mut ini = pos;
                    while t.flags_at(pos, chunk).is_number() {
                        pos += 1;
                        if pos - ini >= 3 {
                            w.add(pos);
                            ini = pos;
                        }
                    }
                    w.add(pos);
                }
            }
            continue;
        }
        let mut flags2 = if cpt == ' ' {
            t.flags_at(pos + 1, chunk)
        } else {
            flags
        };
        // llama.cpp tests the first codepoint's flags here, not `flags2`'s.
        if other(flags2) || (!flags2.is_set() && flags.is_set()) {
            pos += usize::from(cpt == ' ');
            while other(flags2) {
                pos += 1;
                flags2 = t.flags_at(pos, chunk);
            }
            while matches!(t.cp_at(pos, chunk), Some('\r' | '\n')) {
                pos += 1;
            }
            w.add(pos);
            continue;
        }
        let mut spaces = 0;
        let mut last_newline_end = 0;
        while t.flags_at(pos + spaces, chunk).is_whitespace() {
            if matches!(t.cps[pos + spaces], '\r' | '\n') {
                last_newline_end = pos + spaces + 1;
            }
            spaces += 1;
        }
        if last_newline_end > 0 {
            pos = last_newline_end;
            w.add(pos);
            continue;
        }
        pos = whitespace_or_one_end(t, pos, spaces, chunk);
        w.add(pos);
    }
}

/// The GPT-4o regex as `std::regex` matches it on the collapsed text, where
/// every non-ASCII letter is one byte that is both "upper" (`[^a-z]`) and
/// "lower" (`[^A-Z]`) and every non-ASCII space is `\v`. The first
/// alternative that matches wins, each taking what backtracking leaves it.
fn gpt4o(t: &Text, chunk: Chunk, out: &mut Vec<Chunk>) {
    let (lo, hi) = chunk;
    let mut w = Words { out, prev: lo };
    let c = |i: usize| if i < hi { Some(t.collapsed(i)) } else { None };
    let letter = |i: usize| matches!(c(i), Some(0xD2 | 0x41..=0x5A | 0x61..=0x7A));
    let number = |i: usize| matches!(c(i), Some(0xD1 | 0x30..=0x39));
    let space = |i: usize| i < hi && t.is_space(i);
    let upper = |i: usize| matches!(c(i), Some(0xD2 | 0x41..=0x5A));
    let lower = |i: usize| matches!(c(i), Some(0xD2 | 0x61..=0x7A));
    let newline = |i: usize| matches!(c(i), Some(0x0A | 0x0D));
    let other = |i: usize| i < hi && !space(i) && !letter(i) && !number(i);
    let mut pos = lo;
    while pos < hi {
        // `[^\r\n\p{L}\p{N}]?`, then upper* lower+ or upper+ lower*.
        let start = pos + usize::from(!newline(pos) && !letter(pos) && !number(pos));
        let mut up_end = start;
        while upper(up_end) {
            up_end += 1;
        }
        let word_end = if lower(up_end) {
            let mut end = up_end;
            while lower(end) {
                end += 1;
            }
            Some(end)
        } else if let Some(k) = (start..up_end).rev().find(|&k| c(k) == Some(0xD2)) {
            // `upper*` gives back up to its last non-ASCII letter, which
            // `lower+` then takes.
            Some(k + 1)
        } else {
            (up_end > start).then_some(up_end)
        };
        if let Some(end) = word_end {
            pos = end + contraction_len(t, end, chunk);
            w.add(pos);
            continue;
        }
        if number(pos) {
            let mut end = pos;
            while number(end) && end - pos < 3 {
                end += 1;
            }
            pos = end;
            w.add(pos);
            continue;
        }
        let start = if t.cp_at(pos, chunk) == Some(' ') && other(pos + 1) {
            pos + 1
        } else {
            pos
        };
        if other(start) {
            pos = start;
            while other(pos) {
                pos += 1;
            }
            while newline(pos) || c(pos) == Some(u32::from(b'/')) {
                pos += 1;
            }
            w.add(pos);
            continue;
        }
        let mut spaces = 0;
        let mut last_newline_end = None;
        while space(pos + spaces) {
            if newline(pos + spaces) {
                last_newline_end = Some(pos + spaces + 1);
            }
            spaces += 1;
        }
        pos = match last_newline_end {
            Some(end) => end,
            None => whitespace_or_one_end(t, pos, spaces, chunk),
        };
        w.add(pos);
    }
}

/// Length of `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])` at `pos`, or 0.
fn contraction_len(t: &Text, pos: usize, chunk: Chunk) -> usize {
    if t.cp_at(pos, chunk) != Some('\'') {
        return 0;
    }
    let next = |i: usize| t.cp_at(pos + i, chunk).map(|c| c.to_ascii_lowercase());
    match (next(1), next(2)) {
        (Some(a), _) if is_contraction_letter(a) => 2,
        (Some(a), Some(b)) if is_two_letter_contraction(a, b) => 3,
        _ => 0,
    }
}

/// `unicode_regex_split_custom_newlines`: runs of `\n`, runs of anything else.
fn newlines(t: &Text, (lo, hi): Chunk, out: &mut Vec<Chunk>) {
    let mut pos = lo;
    while pos < hi {
        let newline = t.cps[pos] == '\n';
        let start = pos;
        while pos < hi && (t.cps[pos] == '\n') == newline {
            pos += 1;
        }
        out.push((start, pos));
    }
}

/// The leftmost match of a simple step at or after `from`, as
/// `std::regex_search` finds it.
fn find(t: &Text, step: Step, from: usize, (lo, hi): Chunk) -> Option<Chunk> {
    let class = |i: usize| t.in_class(step, i);
    match step {
        Step::TrailingSpace => {
            let mut start = hi;
            while start > lo && t.is_space(start - 1) {
                start -= 1;
            }
            (start < hi && start >= from).then_some((start, hi))
        }
        Step::ThreeDigits => (from..hi.saturating_sub(2))
            .find_map(|s| (class(s) && class(s + 1) && class(s + 2)).then_some((s, s + 3))),
        Step::Number | Step::CrOrLf => (from..hi).find(|&s| class(s)).map(|s| (s, s + 1)),
        Step::DeepseekLetters | Step::DeepseekPunct | Step::SpaceLetters | Step::SpacePunct => {
            // `\s?C+`: the space joins only when a class codepoint follows it.
            (from..hi).find_map(|s| {
                let start = if t.is_space(s) && s + 1 < hi && class(s + 1) {
                    s + 1
                } else if class(s) {
                    s
                } else {
                    return None;
                };
                let mut end = start;
                while end < hi && class(end) {
                    end += 1;
                }
                Some((s, end))
            })
        }
        _ => (from..hi).find(|&s| class(s)).map(|s| {
            let mut end = s;
            while end < hi && class(end) {
                end += 1;
            }
            (s, end)
        }),
    }
}

/// Splits a chunk into the matches of a simple step and the text between
/// them (`unicode_regex_split_stl`).
fn regex_like(t: &Text, step: Step, chunk: Chunk, out: &mut Vec<Chunk>) {
    let (lo, hi) = chunk;
    let mut at = lo;
    while let Some((s, e)) = find(t, step, at, chunk) {
        if s > at {
            out.push((at, s));
        }
        out.push((s, e));
        at = e;
    }
    if at < hi {
        out.push((at, hi));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str, steps: &[Step]) -> Vec<String> {
        let t = Text::new(text);
        split(&t, steps)
            .into_iter()
            .map(|(s, e)| t.cps[s..e].iter().collect())
            .collect()
    }

    #[test]
    fn gpt2_splits_like_its_regex() {
        assert_eq!(
            words("Hello world's  3.14 !!", &[Step::Gpt2]),
            ["Hello", " world", "'s", " ", " 3", ".", "14", " !!"]
        );
        assert_eq!(words("a   ", &[Step::Gpt2]), ["a", "   "]);
    }

    #[test]
    fn llama3_groups_three_digits_and_keeps_newlines_together() {
        assert_eq!(
            words("1234567 I'M\n\n  x", &[Step::Llama3]),
            ["123", "456", "7", " I", "'M", "\n\n", " ", " x"]
        );
    }

    #[test]
    fn simple_steps_match_leftmost() {
        assert_eq!(words("ab12c3", &[Step::Number]), ["ab", "1", "2", "c", "3"]);
        assert_eq!(
            words("x, a b!", &[Step::SpacePunct]),
            ["x", ",", " a b", "!"]
        );
        assert_eq!(words("ab  \n ", &[Step::TrailingSpace]), ["ab", "  \n "]);
        assert_eq!(words("12345", &[Step::ThreeDigits]), ["123", "45"]);
        assert_eq!(words("中文abc", &[Step::Cjk]), ["中文", "abc"]);
    }

    /// llama.cpp's words for the GPT-4o regex (`unicode_regex_split`),
    /// recorded by scripts/gpt4o-tokenizer-reference.sh.
    #[test]
    fn gpt4o_splits_as_llama_cpp_does() {
        #[derive(serde::Deserialize)]
        struct Split {
            input: String,
            words: Vec<String>,
        }
        #[derive(serde::Deserialize)]
        struct Reference {
            splits: Vec<Split>,
        }
        let reference: Reference =
            serde_json::from_str(include_str!("../../tests/data/gpt4o-tokenizer.json")).unwrap();
        assert!(reference.splits.len() > 60);
        let failures: Vec<String> = reference
            .splits
            .iter()
            .filter_map(|case| {
                let got = words(&case.input, &[Step::Gpt4o]);
                (got != case.words).then(|| {
                    format!(
                        "{:?}:\n  llama.cpp {:?}\n  zinfer    {got:?}",
                        case.input, case.words
                    )
                })
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn deepseek_classes_come_from_llama_cpp_brackets() {
        let letters = &DEEPSEEK_LETTERS;
        assert!(in_ranges(letters, u32::from('µ')));
        assert!(in_ranges(letters, u32::from('ж')));
        assert!(!in_ranges(letters, u32::from('中')));
        // `K-ℭ` starts at U+212A KELVIN SIGN, which normalizes to `K`: the
        // range must not swallow `|` or Arabic.
        assert!(in_ranges(letters, 0x212A));
        assert!(!in_ranges(letters, u32::from('|')));
        assert!(!in_ranges(letters, u32::from('ا')));
        // U+3000 is in the bracket, but llama.cpp turns whitespace into `\v`
        // first: it only ever joins as the optional leading space.
        assert_eq!(
            words("\u{3000}\u{3000}、", &[Step::DeepseekPunct]),
            ["\u{3000}", "\u{3000}、"]
        );
        assert_eq!(
            words("\u{3000}\u{3000}", &[Step::DeepseekPunct]),
            ["\u{3000}\u{3000}"]
        );
    }
}
