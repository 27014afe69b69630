//! The streaming output parser.
//!
//! Two stages, each fed the previous one's output: reasoning first (a
//! `<think>` block that opens the output), then tool calls in the content
//! that follows, in the model family's syntax (each format's parser is in
//! its own file). A stage holds back only text that could still become a
//! tag (or, next to calls, blank text that may turn out to be only the gap
//! between them), so what comes out never depends on how the text was
//! chunked. The JSON of a call is read the same way for every format, here.

use serde_json::Value;

use super::ToolFormat;
use super::harmony::Harmony;
use super::reasoning::{Reasoning, Thinking};

/// A complete tool call found in the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// The arguments as compact JSON text of a map.
    pub arguments: String,
}

/// What one push of text produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Answer text.
    pub content: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Calls completed.
    pub calls: Vec<ParsedCall>,
}

/// One format's streaming call parser, fed the content after reasoning.
pub(crate) trait CallParser: std::fmt::Debug + Send {
    /// Takes the next (non-empty) piece of content.
    fn push(&mut self, text: &str, out: &mut Parsed);
    /// The output ended: whatever is held back. `cut`: it ended before
    /// the model was done (`max_tokens`), so a call it was writing is
    /// unfinished and dropped, not shown as content.
    fn finish(&mut self, out: &mut Parsed, cut: bool);
}

/// Splits streamed output text into content, reasoning and tool calls.
#[derive(Debug)]
pub struct OutputParser {
    reasoning: Reasoning,
    /// The call parser of the request's format; none without tools, when
    /// content passes through.
    calls: Option<Box<dyn CallParser>>,
}

impl OutputParser {
    /// A parser for one request: `tools` is the call syntax when the
    /// request has tools (and `tool_choice` is not `none`). Harmony output
    /// is read by its own parser whether or not there are tools.
    pub fn new(tools: Option<ToolFormat>, thinking: Thinking) -> Self {
        let calls: Option<Box<dyn CallParser>> = match thinking {
            Thinking::Harmony => Some(Box::new(Harmony::new(tools.is_some()))),
            _ => tools.map(|format| (format.syntax().parser)()),
        };
        OutputParser {
            reasoning: Reasoning::new(thinking),
            calls,
        }
    }

    /// Takes the next text delta.
    #[must_use]
    pub fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed::default();
        let mut content = String::new();
        self.reasoning.push(text, &mut out.reasoning, &mut content);
        self.push_content(&content, &mut out);
        out
    }

    /// The output ended: whatever is held back.
    #[must_use]
    pub fn finish(&mut self) -> Parsed {
        self.end(false)
    }

    /// The output was cut short (`max_tokens`, a deadline): as
    /// [`OutputParser::finish`], but a call the model was still writing is
    /// dropped instead of coming out as content, so its markup never
    /// reaches a client.
    #[must_use]
    pub fn finish_cut(&mut self) -> Parsed {
        self.end(true)
    }

    fn end(&mut self, cut: bool) -> Parsed {
        let mut out = Parsed::default();
        let mut content = String::new();
        self.reasoning.finish(&mut out.reasoning, &mut content);
        self.push_content(&content, &mut out);
        if let Some(calls) = &mut self.calls {
            calls.finish(&mut out, cut);
        }
        out
    }

    fn push_content(&mut self, text: &str, out: &mut Parsed) {
        if text.is_empty() {
            return;
        }
        match &mut self.calls {
            None => out.content.push_str(text),
            Some(calls) => calls.push(text, out),
        }
    }
}

pub(super) fn is_blank(text: &str) -> bool {
    text.trim().is_empty()
}

/// How sure the syntax around a JSON object is that it is a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// Inside tags or after a marker: missing arguments are `{}`.
    Tagged,
    /// A bare object (Llama 3): a call only with `parameters` or
    /// `arguments`, so that a JSON answer with a `name` stays an answer.
    Bare,
}

/// A call from JSON text that is exactly one call object.
pub(super) fn parse_call(text: &str, shape: Shape) -> Option<ParsedCall> {
    call_from_value(serde_json::from_str(text).ok()?, shape)
}

/// `{"name": ..., "arguments"|"parameters": {...} or "{...}"}`.
pub(super) fn call_from_value(value: Value, shape: Shape) -> Option<ParsedCall> {
    let Value::Object(mut map) = value else {
        return None;
    };
    let Some(Value::String(name)) = map.remove("name") else {
        return None;
    };
    if name.is_empty() {
        return None;
    }
    let arguments = map.remove("arguments").or_else(|| map.remove("parameters"));
    if shape == Shape::Bare && arguments.is_none() {
        return None;
    }
    Some(ParsedCall {
        name,
        arguments: arguments_text(arguments)?,
    })
}

/// The compact text of a call's arguments: a map, or a string holding
/// one's JSON (as OpenAI writes them); absent or null is no arguments.
pub(super) fn arguments_text(arguments: Option<Value>) -> Option<String> {
    let map = match arguments {
        None | Some(Value::Null) => return Some("{}".to_string()),
        Some(Value::Object(map)) => map,
        Some(Value::String(text)) => match serde_json::from_str(&text).ok()? {
            Value::Object(map) => map,
            _ => return None,
        },
        Some(_) => return None,
    };
    serde_json::to_string(&map).ok()
}

/// The JSON value at the start of `text`, and the text after it.
pub(super) fn leading_json(text: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}
