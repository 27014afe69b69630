//! Llama 3.1 / 3.2 JSON calls: `{"name": ..., "parameters": {...}}`,
//! optionally after `<|python_tag|>`, several separated by `;`. The calls
//! are the whole output, so output that may be calls is held to its end.

use super::grammar::{Controls, Repeat};
use super::parse::{CallParser, Parsed, ParsedCall, Shape, call_from_value, leading_json};
use super::{CallJson, Format, ToolFormat};

const PYTHON_TAG: &str = "<|python_tag|>";

/// The format's row in [`super::FORMATS`].
pub(super) const LLAMA3_JSON: Format = Format {
    format: ToolFormat::Llama3Json,
    detect,
    markers: &[PYTHON_TAG],
    call_json: CallJson::Wrapped("parameters"),
    forced,
    parser: || Box::new(Llama3::Start(String::new())),
};

/// `<|python_tag|>` (Llama 3.1, 3.3), or Llama 3 headers together with
/// the `"parameters"` key Meta's templates ask calls in (Llama 3.2 has no
/// python tag).
fn detect(source: &str) -> bool {
    source.contains(PYTHON_TAG)
        || (source.contains("<|start_header_id|>") && source.contains("\"parameters\""))
}

/// Bare calls separated by `; `.
fn forced(calls: Repeat, _controls: &Controls<'_>) -> (String, String) {
    (calls.joined_by("; "), "tool".to_string())
}

/// Where the output is: calls are the whole content, so content that may
/// be calls is held to the end.
#[derive(Debug)]
enum Llama3 {
    /// Only blanks and part of `<|python_tag|>` yet.
    Start(String),
    /// Starts like calls: parsed at the end.
    Buffer(String),
    /// An answer: streams.
    Stream,
}

impl CallParser for Llama3 {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        match self {
            Llama3::Stream => out.content.push_str(text),
            Llama3::Buffer(buffer) => buffer.push_str(text),
            Llama3::Start(held) => {
                held.push_str(text);
                let start = held.trim_start();
                if start.starts_with('{') || start.starts_with(PYTHON_TAG) {
                    *self = Llama3::Buffer(std::mem::take(held));
                } else if !start.is_empty() && !PYTHON_TAG.starts_with(start) {
                    out.content.push_str(held);
                    *self = Llama3::Stream;
                }
            }
        }
    }

    /// A cut buffer is dropped only after `<|python_tag|>`: bare JSON may
    /// be an answer cut short.
    fn finish(&mut self, out: &mut Parsed, cut: bool) {
        match std::mem::replace(self, Llama3::Stream) {
            Llama3::Stream => {}
            Llama3::Start(held) => out.content.push_str(&held),
            Llama3::Buffer(buffer) => match parse(&buffer) {
                Some(calls) => out.calls.extend(calls),
                None if cut && buffer.trim_start().starts_with(PYTHON_TAG) => {}
                None => out.content.push_str(&buffer),
            },
        }
    }
}

/// `[<|python_tag|>] {call} (; {call})*`: all of the text, or nothing.
fn parse(text: &str) -> Option<Vec<ParsedCall>> {
    let text = text.trim_start();
    let mut rest = text.strip_prefix(PYTHON_TAG).unwrap_or(text);
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ';' || c.is_whitespace());
        if rest.is_empty() {
            break;
        }
        let (value, after) = leading_json(rest)?;
        calls.push(call_from_value(value, Shape::Bare)?);
        rest = after;
    }
    (!calls.is_empty()).then_some(calls)
}
