//! Incremental detokenization and stop strings.
//!
//! [`IncrementalDecoder`] turns a growing list of token ids into text
//! deltas that never split a UTF-8 character: it decodes a short window of
//! ids and emits only text that is complete (the prefix_offset/read_offset
//! technique of TGI and vLLM). [`StopMatcher`] sits on top and holds back any
//! text that could be the start of a stop string, so no part of a stop
//! string is ever streamed. [`Detokenizer`] joins the two for one request.

/// Decoding failed inside the tokenizer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("detokenization failed: {0}")]
pub struct DetokenizeError(pub String);

/// Anything that turns token ids into text, skipping special tokens.
pub trait TokenDecoder {
    /// Decodes `ids` as one piece of text.
    fn decode_ids(&self, ids: &[u32]) -> Result<String, DetokenizeError>;
}

/// The text a decoder marks an incomplete UTF-8 sequence with.
const REPLACEMENT: char = '\u{FFFD}';

/// Emits the text of a growing list of ids, one complete piece at a time.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context (already emitted).
    prefix_offset: usize,
    /// End of the ids whose text has been emitted.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Adds `id` and returns the new stable text (often empty while a
    /// character is incomplete).
    pub fn push(&mut self, decoder: &dyn TokenDecoder, id: u32) -> Result<String, DetokenizeError> {
        self.ids.push(id);
        let prefix = decoder.decode_ids(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = decoder.decode_ids(&self.ids[self.prefix_offset..])?;
        if full.len() <= prefix.len() || full.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        match full.get(prefix.len()..) {
            Some(delta) if full.starts_with(&prefix) => {
                let delta = delta.to_owned();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                Ok(delta)
            }
            _ => Ok(String::new()),
        }
    }

    /// Returns whatever text is still held back, incomplete characters
    /// included (as U+FFFD); call once at the end.
    pub fn flush(&mut self, decoder: &dyn TokenDecoder) -> Result<String, DetokenizeError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = decoder.decode_ids(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = decoder.decode_ids(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full
            .strip_prefix(prefix.as_str())
            .map(str::to_owned)
            .unwrap_or(full))
    }
}

/// Text released by a [`StopMatcher`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text safe to show.
    pub text: String,
    /// A stop string was found; `text` ends right before it.
    pub stopped: bool,
}

/// Holds back text that could begin a stop string; finds the first
/// complete one.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet released: a possible start of a stop string.
    pending: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..StopMatcher::default()
        }
    }

    /// Adds `text`; returns what may be shown now.
    pub fn push(&mut self, text: &str) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        self.pending.push_str(text);
        if let Some(start) = self.first_stop() {
            self.stopped = true;
            self.pending.truncate(start);
            return StopOutput {
                text: std::mem::take(&mut self.pending),
                stopped: true,
            };
        }
        let keep = self.partial_stop_len();
        let release = self.pending.len() - keep;
        let rest = self.pending.split_off(release);
        StopOutput {
            text: std::mem::replace(&mut self.pending, rest),
            stopped: false,
        }
    }

    /// Releases the held-back text when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Byte offset in `pending` of the earliest complete stop string.
    fn first_stop(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|stop| self.pending.find(stop.as_str()))
            .min()
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of
    /// some stop string.
    fn partial_stop_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let earliest = self.pending.len().saturating_sub(longest.saturating_sub(1));
        (earliest..self.pending.len())
            .filter(|&start| self.pending.is_char_boundary(start))
            .find(|&start| {
                let tail = &self.pending[start..];
                self.stops.iter().any(|stop| stop.starts_with(tail))
            })
            .map_or(0, |start| self.pending.len() - start)
    }
}

/// What one new token adds to a request's visible output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextDelta {
    /// New text to show (may be empty).
    pub text: String,
    /// A stop string ended the output.
    pub stopped: bool,
}

/// One request's output text: incremental decoding plus stop strings.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    decoder: IncrementalDecoder,
    stops: StopMatcher,
}

impl Detokenizer {
    /// A detokenizer that ends the output at the first of `stops`.
    pub fn new(stops: &[String]) -> Self {
        Detokenizer {
            decoder: IncrementalDecoder::default(),
            stops: StopMatcher::new(stops),
        }
    }

    /// Adds one generated token.
    pub fn push(
        &mut self,
        decoder: &dyn TokenDecoder,
        id: u32,
    ) -> Result<TextDelta, DetokenizeError> {
        let text = self.decoder.push(decoder, id)?;
        let out = self.stops.push(&text);
        Ok(TextDelta {
            text: out.text,
            stopped: out.stopped,
        })
    }

    /// Ends the output (EOS, length, cancel): returns all text still held
    /// back, unless a stop string already ended it.
    pub fn finish(&mut self, decoder: &dyn TokenDecoder) -> Result<TextDelta, DetokenizeError> {
        let tail = self.decoder.flush(decoder)?;
        let out = self.stops.push(&tail);
        if out.stopped {
            return Ok(TextDelta {
                text: out.text,
                stopped: true,
            });
        }
        let mut text = out.text;
        text.push_str(&self.stops.flush());
        Ok(TextDelta {
            text,
            stopped: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each id is a run of raw bytes, joined and decoded lossily, as a
    /// byte-level BPE decoder does.
    struct ByteDecoder(Vec<Vec<u8>>);

    impl TokenDecoder for ByteDecoder {
        fn decode_ids(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
            let mut bytes = Vec::new();
            for &id in ids {
                let piece = self.0.get(id as usize);
                bytes.extend(piece.ok_or(DetokenizeError(format!("unknown id {id}")))?);
            }
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
    }

    /// Splits `text` into tokens of `sizes` bytes (cycled), ignoring
    /// character boundaries on purpose.
    fn tokenize(text: &str, sizes: &[usize]) -> (ByteDecoder, Vec<u32>) {
        let bytes = text.as_bytes();
        let mut pieces = Vec::new();
        let mut at = 0;
        for size in sizes.iter().cycle() {
            if at >= bytes.len() {
                break;
            }
            let end = (at + size).min(bytes.len());
            pieces.push(bytes[at..end].to_vec());
            at = end;
        }
        let ids = (0..pieces.len() as u32).collect();
        (ByteDecoder(pieces), ids)
    }

    #[test]
    fn multibyte_characters_split_across_tokens_are_never_split_in_output() {
        let text = "héllo 日本語 🎉 ok ñ";
        for sizes in [&[1usize][..], &[2], &[3, 1], &[5, 2, 1]] {
            let (decoder, ids) = tokenize(text, sizes);
            let mut detok = IncrementalDecoder::default();
            let mut out = String::new();
            for &id in &ids {
                let delta = detok.push(&decoder, id).unwrap();
                assert!(!delta.contains(REPLACEMENT), "split char in {delta:?}");
                out.push_str(&delta);
            }
            out.push_str(&detok.flush(&decoder).unwrap());
            assert_eq!(out, text, "sizes {sizes:?}");
        }
    }

    #[test]
    fn an_emoji_appears_only_once_its_last_byte_arrives() {
        let (decoder, ids) = tokenize("🎉", &[1]);
        let mut detok = IncrementalDecoder::default();
        let deltas: Vec<String> = ids
            .iter()
            .map(|&id| detok.push(&decoder, id).unwrap())
            .collect();
        assert_eq!(deltas, ["", "", "", "🎉"]);
    }

    #[test]
    fn truly_invalid_bytes_come_out_at_flush() {
        let decoder = ByteDecoder(vec![b"ab".to_vec(), vec![0xE6, 0x97]]);
        let mut detok = IncrementalDecoder::default();
        assert_eq!(detok.push(&decoder, 0).unwrap(), "ab");
        assert_eq!(detok.push(&decoder, 1).unwrap(), "");
        assert_eq!(detok.flush(&decoder).unwrap(), "\u{FFFD}");
    }

    fn stream(text: &str, sizes: &[usize], stops: &[&str]) -> (Vec<String>, String, bool) {
        let (decoder, ids) = tokenize(text, sizes);
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut detok = Detokenizer::new(&stops);
        let mut deltas = Vec::new();
        for &id in &ids {
            let delta = detok.push(&decoder, id).unwrap();
            deltas.push(delta.text);
            if delta.stopped {
                let joined = deltas.concat();
                return (deltas, joined, true);
            }
        }
        let last = detok.finish(&decoder).unwrap();
        deltas.push(last.text);
        let joined = deltas.concat();
        (deltas, joined, last.stopped)
    }

    #[test]
    fn stop_string_split_across_tokens_is_cut_and_never_streamed() {
        for sizes in [&[1usize][..], &[2], &[3], &[4, 1]] {
            let (deltas, text, stopped) = stream("The answer: 42\nUser: more", sizes, &["\nUser:"]);
            assert!(stopped, "sizes {sizes:?}");
            assert_eq!(text, "The answer: 42", "sizes {sizes:?}");
            for delta in &deltas {
                assert!(!delta.contains('\n'), "leaked {delta:?}");
            }
        }
    }

    #[test]
    fn a_false_start_of_a_stop_string_is_released() {
        let (_, text, stopped) = stream("a <b <c> <end> tail", &[1], &["<end>"]);
        assert!(stopped);
        assert_eq!(text, "a <b <c> ");
        let (_, text, stopped) = stream("x <en", &[2], &["<end>"]);
        assert!(!stopped, "only a prefix: released at the end");
        assert_eq!(text, "x <en");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let (_, text, stopped) = stream("one two three", &[3], &["three", "two"]);
        assert!(stopped);
        assert_eq!(text, "one ");
    }

    #[test]
    fn stop_strings_with_multibyte_characters() {
        let (deltas, text, stopped) = stream("café ☕ fin", &[1], &["☕"]);
        assert!(stopped);
        assert_eq!(text, "café ");
        assert!(deltas.iter().all(|d| !d.contains(REPLACEMENT)));
        let (_, text, stopped) = stream("日本語", &[1], &["本x"]);
        assert!(!stopped);
        assert_eq!(text, "日本語");
    }

    #[test]
    fn stop_matcher_holds_only_a_possible_prefix() {
        let mut matcher = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(matcher.push("abcST").text, "abc");
        assert_eq!(matcher.push("x").text, "STx");
        let out = matcher.push("STO");
        assert_eq!(out.text, "");
        let out = matcher.push("P and more");
        assert!(out.stopped);
        assert_eq!(out.text, "");
        assert_eq!(matcher.push("later").text, "", "nothing after a stop");
    }
}
