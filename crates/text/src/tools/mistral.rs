//! Mistral: content, then `[TOOL_CALLS]` and a JSON array of
//! `{"name": ..., "arguments": {...}}`, or (v11 and later)
//! `[TOOL_CALLS]name[ARGS]{...}` per call, to the end of the output.

use serde_json::Value;

use super::grammar::{Controls, Repeat, literal};
use super::parse::{
    CallParser, Parsed, ParsedCall, Shape, arguments_text, call_from_value, is_blank, leading_json,
};
use super::tag::partial_tag;
use super::{CallJson, Format, ToolFormat};

const CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

/// The format's row in [`super::FORMATS`].
pub(super) const MISTRAL: Format = Format {
    format: ToolFormat::Mistral,
    detect: |source| source.contains(CALLS),
    markers: &[CALLS, ARGS, CALL_ID],
    call_json: CallJson::Wrapped("arguments"),
    forced,
    parser: || Box::new(Mistral::default()),
};

/// `[TOOL_CALLS]` then a JSON array of the calls.
fn forced(calls: Repeat, controls: &Controls<'_>) -> (String, String) {
    let marker = controls.lark(CALLS);
    let array = format!("{} {} {}", literal("["), calls.joined_by(","), literal("]"));
    (format!("{marker} {array}"), "tool".to_string())
}

/// Where the output is: content, then from `[TOOL_CALLS]` on calls.
#[derive(Debug, Default)]
struct Mistral {
    /// Not yet emitted: a blank start of the content, then a partial
    /// `[TOOL_CALLS]`.
    held: String,
    /// From `[TOOL_CALLS]` on (after a blank start), parsed at the end.
    buffer: Option<String>,
    /// Whether content was emitted.
    started: bool,
}

impl CallParser for Mistral {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        let content = &mut out.content;
        if let Some(buffer) = &mut self.buffer {
            buffer.push_str(text);
            return;
        }
        self.held.push_str(text);
        if let Some(at) = self.held.find(CALLS) {
            // A blank start goes with the calls: dropped if they parse.
            let from = if self.started || !is_blank(&self.held[..at]) {
                content.push_str(&self.held[..at]);
                at
            } else {
                0
            };
            self.buffer = Some(self.held[from..].to_string());
            self.held.clear();
            return;
        }
        let ready = self.held.len() - partial_tag(&self.held, CALLS);
        if self.started || !is_blank(&self.held[..ready]) {
            content.push_str(&self.held[..ready]);
            self.held.drain(..ready);
            self.started = true;
        }
    }

    fn finish(&mut self, out: &mut Parsed, cut: bool) {
        match self.buffer.take() {
            Some(buffer) => match parse(&buffer) {
                Some(calls) => out.calls.extend(calls),
                None if cut => {}
                None => out.content.push_str(&buffer),
            },
            None => out.content.push_str(&self.held),
        }
        self.held.clear();
        self.started = true;
    }
}

/// What follows `[TOOL_CALLS]`: a JSON array of calls (or one call), or
/// `name[ARGS]{...}` per call (v11; `name[CALL_ID]id[ARGS]{...}` too),
/// each possibly after another `[TOOL_CALLS]`. All of the text, or nothing.
fn parse(text: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = text;
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(CALLS) {
            rest = after;
            continue;
        }
        if rest.is_empty() {
            break;
        }
        if rest.starts_with('[') || rest.starts_with('{') {
            let (value, after) = leading_json(rest)?;
            match value {
                Value::Array(items) => {
                    for item in items {
                        calls.push(call_from_value(item, Shape::Tagged)?);
                    }
                }
                call => calls.push(call_from_value(call, Shape::Tagged)?),
            }
            rest = after;
        } else {
            let args_at = rest.find(ARGS)?;
            let head = &rest[..args_at];
            let name = head.split(CALL_ID).next().unwrap_or(head).trim();
            if !plausible_name(name) {
                return None;
            }
            let (arguments, after) = leading_json(&rest[args_at + ARGS.len()..])?;
            calls.push(ParsedCall {
                name: name.to_string(),
                arguments: arguments_text(Some(arguments))?,
            });
            rest = after;
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// A v11 call's name: one word, no JSON or control syntax in it.
fn plausible_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '[' | ']' | '{' | '}' | '"'))
}
