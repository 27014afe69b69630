//! The streaming output parser.
//!
//! Two stages, each fed the previous one's output: reasoning first (a
//! `<think>` block that opens the output), then tool calls in the content
//! that follows, in the model family's syntax. A stage holds back only
//! text that could still become a tag (or, next to calls, blank text that
//! may turn out to be only the gap between them), so what comes out never
//! depends on how the text was chunked.

use crate::ToolFormat;
use serde_json::Value;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";

/// Where the model's reasoning is at the start of its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// The model does not think in `<think>` blocks: all text is content.
    Off,
    /// A `<think>...</think>` block may open the output.
    Tags,
    /// The prompt ended inside an open `<think>`: output is reasoning up
    /// to `</think>`.
    Open,
}

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

/// Splits streamed output text into content, reasoning and tool calls.
#[derive(Debug)]
pub struct OutputParser {
    reasoning: Reasoning,
    calls: Calls,
}

impl OutputParser {
    /// A parser for one request: `tools` is the call syntax when the
    /// request has tools (and `tool_choice` is not `none`).
    pub fn new(tools: Option<ToolFormat>, thinking: Thinking) -> Self {
        OutputParser {
            reasoning: Reasoning::new(thinking),
            calls: Calls::new(tools),
        }
    }

    /// Takes the next text delta.
    #[must_use]
    pub fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed::default();
        let mut content = String::new();
        self.reasoning.push(text, &mut out.reasoning, &mut content);
        self.calls.push(&content, &mut out);
        out
    }

    /// The output ended: whatever is held back.
    #[must_use]
    pub fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let mut content = String::new();
        self.reasoning.finish(&mut out.reasoning, &mut content);
        self.calls.push(&content, &mut out);
        self.calls.finish(&mut out);
        out
    }
}

/// The length of the longest end of `text` that is a proper start of
/// `tag`: text that may still become the tag. Tags are ASCII, so what is
/// left before it ends on a character boundary.
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

fn is_blank(text: &str) -> bool {
    text.trim().is_empty()
}

/// Where the output is with respect to a `<think>` block.
#[derive(Debug)]
enum Reasoning {
    /// `Thinking::Tags`, nothing but blanks and part of `<think>` yet.
    Opening(String),
    /// Inside the block; holds a partial `</think>`.
    Inside(String),
    /// Right after `</think>`: blanks are dropped.
    Closed,
    /// Everything from here on is content.
    Content,
}

impl Reasoning {
    fn new(thinking: Thinking) -> Self {
        match thinking {
            Thinking::Off => Reasoning::Content,
            Thinking::Tags => Reasoning::Opening(String::new()),
            Thinking::Open => Reasoning::Inside(String::new()),
        }
    }

    fn push(&mut self, text: &str, reasoning: &mut String, content: &mut String) {
        match self {
            Reasoning::Content => content.push_str(text),
            Reasoning::Closed => {
                let rest = text.trim_start();
                if !rest.is_empty() {
                    *self = Reasoning::Content;
                    content.push_str(rest);
                }
            }
            Reasoning::Opening(held) => {
                held.push_str(text);
                let start = held.trim_start();
                if let Some(inside) = start.strip_prefix(THINK_OPEN) {
                    let inside = inside.to_string();
                    *self = Reasoning::Inside(String::new());
                    self.push(&inside, reasoning, content);
                } else if !THINK_OPEN.starts_with(start) {
                    content.push_str(held);
                    *self = Reasoning::Content;
                }
            }
            Reasoning::Inside(held) => {
                held.push_str(text);
                if let Some(at) = held.find(THINK_CLOSE) {
                    reasoning.push_str(&held[..at]);
                    let after = held[at + THINK_CLOSE.len()..].to_string();
                    *self = Reasoning::Closed;
                    self.push(&after, reasoning, content);
                } else {
                    let ready = held.len() - partial_tag(held, THINK_CLOSE);
                    reasoning.push_str(&held[..ready]);
                    held.drain(..ready);
                }
            }
        }
    }

    /// An unopened `<think>` was content; an unclosed block is reasoning.
    fn finish(&mut self, reasoning: &mut String, content: &mut String) {
        match std::mem::replace(self, Reasoning::Content) {
            Reasoning::Opening(held) => content.push_str(&held),
            Reasoning::Inside(held) => reasoning.push_str(&held),
            Reasoning::Closed | Reasoning::Content => {}
        }
    }
}

/// The call parser of the request's format.
#[derive(Debug)]
enum Calls {
    /// No tools: content passes through.
    Off,
    Hermes(Hermes),
    Llama3(Llama3),
    Mistral(Mistral),
}

impl Calls {
    fn new(format: Option<ToolFormat>) -> Self {
        match format {
            None => Calls::Off,
            Some(ToolFormat::Hermes) => Calls::Hermes(Hermes::default()),
            Some(ToolFormat::Llama3Json) => Calls::Llama3(Llama3::Start(String::new())),
            Some(ToolFormat::Mistral) => Calls::Mistral(Mistral::default()),
        }
    }

    fn push(&mut self, text: &str, out: &mut Parsed) {
        if text.is_empty() {
            return;
        }
        match self {
            Calls::Off => out.content.push_str(text),
            Calls::Hermes(hermes) => hermes.push(text, out),
            Calls::Llama3(llama) => llama.push(text, &mut out.content),
            Calls::Mistral(mistral) => mistral.push(text, &mut out.content),
        }
    }

    fn finish(&mut self, out: &mut Parsed) {
        match self {
            Calls::Off => {}
            Calls::Hermes(hermes) => hermes.finish(out),
            Calls::Llama3(llama) => llama.finish(out),
            Calls::Mistral(mistral) => mistral.finish(out),
        }
    }
}

/// `<tool_call>{json}</tool_call>` blocks anywhere in the content.
///
/// A *segment* is the content between calls (or the output's ends). One
/// that is only blanks next to a call is the gap between blocks, not an
/// answer, so a segment's blank start is held until something else shows up.
#[derive(Debug, Default)]
struct Hermes {
    /// Not yet emitted: the segment's blank start, if nothing of it was
    /// emitted yet, then a partial `<tool_call>`. Inside a block: only
    /// that blank start.
    held: String,
    /// Inside a block: the text after `<tool_call>`.
    block: Option<String>,
    /// How far `block` was searched for `</tool_call>`.
    searched: usize,
    /// Whether the current segment has emitted text.
    segment_started: bool,
    /// Whether a call was emitted.
    called: bool,
}

impl Hermes {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        let mut text = text.to_string();
        loop {
            let Some(block) = &mut self.block else {
                self.held.push_str(&text);
                if let Some(at) = self.held.find(HERMES_OPEN) {
                    let opened = self.held.split_off(at);
                    if self.segment_started || !is_blank(&self.held) {
                        self.emit_held(out);
                    }
                    self.block = Some(String::new());
                    self.searched = 0;
                    text = opened[HERMES_OPEN.len()..].to_string();
                    continue;
                }
                let ready = self.held.len() - partial_tag(&self.held, HERMES_OPEN);
                if self.segment_started || !is_blank(&self.held[..ready]) {
                    out.content.push_str(&self.held[..ready]);
                    self.held.drain(..ready);
                    self.segment_started = true;
                }
                return;
            };
            block.push_str(&text);
            // Only the new text, and the tag's length before it, can hold
            // a `</tool_call>` not seen yet.
            let mut from = self.searched.saturating_sub(HERMES_CLOSE.len() - 1);
            while !block.is_char_boundary(from) {
                from -= 1;
            }
            let Some(found) = block[from..].find(HERMES_CLOSE) else {
                self.searched = block.len();
                return;
            };
            let at = from + found;
            text = block[at + HERMES_CLOSE.len()..].to_string();
            block.truncate(at);
            let body = std::mem::take(block);
            self.block = None;
            self.end_block(&body, true, out);
        }
    }

    fn emit_held(&mut self, out: &mut Parsed) {
        out.content.push_str(&self.held);
        self.held.clear();
        self.segment_started = true;
    }

    /// A block ended (`closed`) or the output did: a call if its JSON is
    /// one, else content as written.
    fn end_block(&mut self, body: &str, closed: bool, out: &mut Parsed) {
        if let Some(call) = parse_call(body.trim(), Shape::Tagged) {
            self.held.clear();
            out.calls.push(call);
            self.called = true;
            self.segment_started = false;
        } else {
            self.held.push_str(HERMES_OPEN);
            self.held.push_str(body);
            if closed {
                self.held.push_str(HERMES_CLOSE);
            }
            self.emit_held(out);
        }
    }

    fn finish(&mut self, out: &mut Parsed) {
        if let Some(body) = self.block.take() {
            self.end_block(&body, false, out);
        } else if !(self.called && is_blank(&self.held)) {
            self.emit_held(out);
        }
        self.held.clear();
    }
}

/// Llama 3: calls are the whole content, so content that may be calls is
/// held to the end.
#[derive(Debug)]
enum Llama3 {
    /// Only blanks and part of `<|python_tag|>` yet.
    Start(String),
    /// Starts like calls: parsed at the end.
    Buffer(String),
    /// An answer: streams.
    Stream,
}

impl Llama3 {
    fn push(&mut self, text: &str, content: &mut String) {
        match self {
            Llama3::Stream => content.push_str(text),
            Llama3::Buffer(buffer) => buffer.push_str(text),
            Llama3::Start(held) => {
                held.push_str(text);
                let start = held.trim_start();
                if start.starts_with('{') || start.starts_with(PYTHON_TAG) {
                    *self = Llama3::Buffer(std::mem::take(held));
                } else if !start.is_empty() && !PYTHON_TAG.starts_with(start) {
                    content.push_str(held);
                    *self = Llama3::Stream;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Parsed) {
        match std::mem::replace(self, Llama3::Stream) {
            Llama3::Stream => {}
            Llama3::Start(held) => out.content.push_str(&held),
            Llama3::Buffer(buffer) => match parse_llama3(&buffer) {
                Some(calls) => out.calls.extend(calls),
                None => out.content.push_str(&buffer),
            },
        }
    }
}

/// Mistral: content, then `[TOOL_CALLS]` and calls to the end.
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

impl Mistral {
    fn push(&mut self, text: &str, content: &mut String) {
        if let Some(buffer) = &mut self.buffer {
            buffer.push_str(text);
            return;
        }
        self.held.push_str(text);
        if let Some(at) = self.held.find(MISTRAL_CALLS) {
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
        let ready = self.held.len() - partial_tag(&self.held, MISTRAL_CALLS);
        if self.started || !is_blank(&self.held[..ready]) {
            content.push_str(&self.held[..ready]);
            self.held.drain(..ready);
            self.started = true;
        }
    }

    fn finish(&mut self, out: &mut Parsed) {
        match self.buffer.take() {
            Some(buffer) => match parse_mistral(&buffer) {
                Some(calls) => out.calls.extend(calls),
                None => out.content.push_str(&buffer),
            },
            None => out.content.push_str(&self.held),
        }
        self.held.clear();
        self.started = true;
    }
}

/// How sure the syntax around a JSON object is that it is a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Inside tags or after a marker: missing arguments are `{}`.
    Tagged,
    /// A bare object (Llama 3): a call only with `parameters` or
    /// `arguments`, so that a JSON answer with a `name` stays an answer.
    Bare,
}

/// A call from JSON text that is exactly one call object.
fn parse_call(text: &str, shape: Shape) -> Option<ParsedCall> {
    call_from_value(serde_json::from_str(text).ok()?, shape)
}

/// `{"name": ..., "arguments"|"parameters": {...} or "{...}"}`.
fn call_from_value(value: Value, shape: Shape) -> Option<ParsedCall> {
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
fn arguments_text(arguments: Option<Value>) -> Option<String> {
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
fn leading_json(text: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

/// `[<|python_tag|>] {call} (; {call})*`: all of the text, or nothing.
fn parse_llama3(text: &str) -> Option<Vec<ParsedCall>> {
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

/// What follows `[TOOL_CALLS]`: a JSON array of calls (or one call), or
/// `name[ARGS]{...}` per call (v11; `name[CALL_ID]id[ARGS]{...}` too),
/// each possibly after another `[TOOL_CALLS]`. All of the text, or nothing.
fn parse_mistral(text: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = text;
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(MISTRAL_CALLS) {
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
            let args_at = rest.find(MISTRAL_ARGS)?;
            let head = &rest[..args_at];
            let name = head.split(MISTRAL_CALL_ID).next().unwrap_or(head).trim();
            if !plausible_name(name) {
                return None;
            }
            let (arguments, after) = leading_json(&rest[args_at + MISTRAL_ARGS.len()..])?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Everything `chunks` produce, pushes and finish together.
    fn run<'a>(
        format: Option<ToolFormat>,
        thinking: Thinking,
        chunks: impl IntoIterator<Item = &'a str>,
    ) -> Parsed {
        let mut parser = OutputParser::new(format, thinking);
        let mut all = Parsed::default();
        let mut add = |part: Parsed| {
            all.content.push_str(&part.content);
            all.reasoning.push_str(&part.reasoning);
            all.calls.extend(part.calls);
        };
        for chunk in chunks {
            add(parser.push(chunk));
        }
        add(parser.finish());
        all
    }

    /// `text` in one piece and one character at a time give `expected`.
    fn check(format: Option<ToolFormat>, thinking: Thinking, text: &str, expected: &Parsed) {
        assert_eq!(&run(format, thinking, [text]), expected, "whole: {text:?}");
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let by_char = run(format, thinking, chars.iter().map(String::as_str));
        assert_eq!(&by_char, expected, "by char: {text:?}");
    }

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn parsed(content: &str, reasoning: &str, calls: Vec<ParsedCall>) -> Parsed {
        Parsed {
            content: content.into(),
            reasoning: reasoning.into(),
            calls,
        }
    }

    const HERMES: Option<ToolFormat> = Some(ToolFormat::Hermes);
    const LLAMA3: Option<ToolFormat> = Some(ToolFormat::Llama3Json);
    const MISTRAL: Option<ToolFormat> = Some(ToolFormat::Mistral);

    #[test]
    fn without_tools_or_thinking_text_is_content() {
        let text = "Hi <tool_call>{\"name\": \"f\"}</tool_call> <think>x</think>";
        check(None, Thinking::Off, text, &parsed(text, "", vec![]));
    }

    #[test]
    fn hermes_calls_are_parsed_and_the_gap_between_them_dropped() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"parameters\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}\n</tool_call>\n";
        let expected = parsed(
            "",
            "",
            vec![
                call("get_weather", r#"{"city":"Paris","days":2}"#),
                call("now", r#"{"tz":"UTC"}"#),
            ],
        );
        check(HERMES, Thinking::Off, text, &expected);
        let leading = format!("\n\n{text}");
        check(HERMES, Thinking::Off, &leading, &expected);
    }

    #[test]
    fn hermes_content_around_calls_is_kept() {
        let text = "Let me check.\n<tool_call>{\"name\": \"f\"}</tool_call>\nDone <tool";
        check(
            HERMES,
            Thinking::Off,
            text,
            &parsed("Let me check.\n\nDone <tool", "", vec![call("f", "{}")]),
        );
        check(HERMES, Thinking::Off, " \n", &parsed(" \n", "", vec![]));
    }

    #[test]
    fn hermes_streams_content_holding_only_a_partial_tag() {
        let mut parser = OutputParser::new(HERMES, Thinking::Off);
        assert_eq!(parser.push("Sure <tool_c").content, "Sure ");
        assert_eq!(parser.push("all").content, "");
        let done = parser.push(">{\"name\": \"f\", \"arguments\": {}}</tool_call>");
        assert_eq!(done.calls, [call("f", "{}")], "emitted at </tool_call>");
        assert_eq!(parser.push("\n").content, "", "held: may be a gap");
        assert_eq!(parser.push("ok").content, "\nok");
        assert_eq!(parser.finish(), Parsed::default());
    }

    #[test]
    fn hermes_invalid_json_is_content_as_written() {
        for text in [
            "<tool_call>{\"name\": \"f\", </tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "a\n<tool_call>not json",
        ] {
            check(HERMES, Thinking::Off, text, &parsed(text, "", vec![]));
        }
        let text = "\n<tool_call>bad</tool_call>\n<tool_call>{\"name\": \"g\"}</tool_call>";
        let expected = parsed("\n<tool_call>bad</tool_call>\n", "", vec![call("g", "{}")]);
        check(HERMES, Thinking::Off, text, &expected);
    }

    #[test]
    fn hermes_unclosed_block_is_a_call_when_its_json_is_one() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n";
        check(
            HERMES,
            Thinking::Off,
            text,
            &parsed("", "", vec![call("f", r#"{"a":1}"#)]),
        );
    }

    #[test]
    fn llama3_calls_with_and_without_python_tag() {
        let text = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"arguments\": {}}\n";
        let expected = parsed("", "", vec![call("f", r#"{"x":1}"#), call("g", "{}")]);
        check(LLAMA3, Thinking::Off, text, &expected);
        let bare = "\n{\"name\": \"f\", \"parameters\": {\"x\": 1}}\n{\"name\": \"g\", \"parameters\": {}}";
        check(LLAMA3, Thinking::Off, bare, &expected);
    }

    #[test]
    fn llama3_answers_stream_and_bad_calls_are_content() {
        let mut parser = OutputParser::new(LLAMA3, Thinking::Off);
        assert_eq!(parser.push(" <|py").content, "");
        assert_eq!(parser.push("thon is").content, " <|python is");
        assert_eq!(parser.push(" {\"name\"").content, " {\"name\"");
        for text in [
            "{\"name\": \"Ada\", \"age\": 36}",
            "{\"name\": \"f\", \"parameters\": {}} trailing",
            "<|python_tag|>print(1)",
            "<|python_tag|>",
            " <|python",
        ] {
            check(LLAMA3, Thinking::Off, text, &parsed(text, "", vec![]));
        }
    }

    #[test]
    fn mistral_v3_array_and_single_object() {
        let text = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}, {\"name\": \"g\", \"arguments\": {}, \"id\": \"abc123xyz\"}]";
        let expected = parsed("", "", vec![call("f", r#"{"a":"b"}"#), call("g", "{}")]);
        check(MISTRAL, Thinking::Off, text, &expected);
        let one = "[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}";
        check(
            MISTRAL,
            Thinking::Off,
            one,
            &parsed("", "", vec![call("f", r#"{"a":"b"}"#)]),
        );
    }

    #[test]
    fn mistral_v11_calls() {
        let text = "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}";
        let expected = parsed(
            "Checking.",
            "",
            vec![
                call("get_weather", r#"{"city":"Paris"}"#),
                call("now", "{}"),
            ],
        );
        check(MISTRAL, Thinking::Off, text, &expected);
    }

    #[test]
    fn mistral_bad_calls_are_content_as_written() {
        for text in [
            "[TOOL_CALLS] [{\"name\": \"f\",",
            "[TOOL_CALLS]two words[ARGS]{}",
            "[TOOL_CALLS][]",
            "\n[TOOL_CALLS]f[ARGS]{} then text",
            "[TOOL_CALL",
        ] {
            check(MISTRAL, Thinking::Off, text, &parsed(text, "", vec![]));
        }
    }

    #[test]
    fn think_block_opening_the_output_is_reasoning() {
        let text = "\n<think>\nstep 1\n</think>\n\nThe answer.";
        check(
            None,
            Thinking::Tags,
            text,
            &parsed("The answer.", "\nstep 1\n", vec![]),
        );
        let later = "Hi <think>x</think>";
        check(None, Thinking::Tags, later, &parsed(later, "", vec![]));
        check(
            None,
            Thinking::Tags,
            " <thin",
            &parsed(" <thin", "", vec![]),
        );
        check(
            None,
            Thinking::Tags,
            "<think>cut off <",
            &parsed("", "cut off <", vec![]),
        );
    }

    #[test]
    fn open_thinking_starts_as_reasoning() {
        let text = "plan</think>answer";
        check(
            None,
            Thinking::Open,
            text,
            &parsed("answer", "plan", vec![]),
        );
        check(
            None,
            Thinking::Open,
            "still thinking",
            &parsed("", "still thinking", vec![]),
        );
        let mut parser = OutputParser::new(None, Thinking::Open);
        assert_eq!(parser.push("a </thi").reasoning, "a ", "only </thi is held");
        assert_eq!(parser.push("s").reasoning, "</this");
    }

    #[test]
    fn thinking_then_a_hermes_call() {
        let text = "<think>I should call <tool_call>{\"name\": \"no\"}</tool_call></think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
        let expected = parsed(
            "",
            "I should call <tool_call>{\"name\": \"no\"}</tool_call>",
            vec![call("f", r#"{"q":"x"}"#)],
        );
        check(HERMES, Thinking::Tags, text, &expected);
        check(HERMES, Thinking::Open, &text["<think>".len()..], &expected);
    }

    #[test]
    fn finish_twice_and_push_after_finish_do_not_panic() {
        let mut parser = OutputParser::new(HERMES, Thinking::Tags);
        let _ = parser.push("<think>a");
        let _ = parser.finish();
        assert_eq!(parser.finish(), Parsed::default());
        let _ = parser.push("<tool_call>");
        let _ = parser.finish();
    }

    /// Pieces that make tags, JSON and blanks likely to meet chunk edges.
    const PIECES: &[&str] = &[
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        "{\"name\": \"g\", \"parameters\": {}}",
        "[{\"name\": \"h\", \"arguments\": {}}]",
        "f",
        "; ",
        " ",
        "\n",
        "text",
        "é",
        "日本",
        "<",
        "</",
        "[",
        "{",
        "}",
        "\"",
        "🦀",
    ];

    fn formats() -> impl Strategy<Value = Option<ToolFormat>> {
        prop::sample::select(vec![None, HERMES, LLAMA3, MISTRAL])
    }

    fn thinkings() -> impl Strategy<Value = Thinking> {
        prop::sample::select(vec![Thinking::Off, Thinking::Tags, Thinking::Open])
    }

    proptest! {
        #[test]
        fn chunking_never_changes_the_result(
            format in formats(),
            thinking in thinkings(),
            pieces in prop::collection::vec(prop::sample::select(PIECES), 0..24),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let text: String = pieces.concat();
            let boundaries: Vec<usize> =
                (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            let mut at: Vec<usize> = cuts.iter().map(|cut| *cut.get(&boundaries)).collect();
            at.push(0);
            at.push(text.len());
            at.sort_unstable();
            at.dedup();
            let chunks: Vec<&str> = at.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let whole = run(format, thinking, [text.as_str()]);
            prop_assert_eq!(&run(format, thinking, chunks), &whole);
            let chars: Vec<String> = text.chars().map(String::from).collect();
            prop_assert_eq!(&run(format, thinking, chars.iter().map(String::as_str)), &whole);
            if format.is_none() && thinking == Thinking::Off {
                prop_assert_eq!(&whole.content, &text);
            }
        }

        #[test]
        fn arbitrary_text_never_panics(
            format in formats(),
            thinking in thinkings(),
            chunks in prop::collection::vec(".{0,12}", 0..12),
        ) {
            let _ = run(format, thinking, chunks.iter().map(String::as_str));
        }
    }
}
