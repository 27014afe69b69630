//! Harmony (gpt-oss): the output is a run of messages, each a header, then
//! `<|message|>` and a body that `<|end|>`, `<|return|>` or `<|call|>`
//! ends. The prompt ends with `<|start|>assistant`, so the first header
//! follows at once; later ones start with `<|start|>assistant`:
//!
//! - `<|channel|>analysis<|message|>...`: reasoning;
//! - `<|channel|>final<|message|>...`, and `commentary` with no recipient
//!   (a preamble before calls): content;
//! - `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>`,
//!   or the recipient before the channel
//!   (`to=functions.NAME<|channel|>commentary json<|message|>`): a call;
//!   without tools in the request, and for other recipients (the built-in
//!   `python`, `browser.*`), the message is dropped, as llama.cpp drops it.
//!
//! The model writes the template's channels and reasoning even without
//! tools, so this parser reads the whole output whenever the template is
//! harmony ([`super::Thinking::Harmony`]). Output that does not start like
//! a header (a model ignoring the format) is content as written.

use serde_json::Value;

use super::grammar::{Controls, Repeat, literal};
use super::parse::{CallParser, Parsed, ParsedCall, arguments_text, leading_json};
use super::tag::partial_tag;
use super::{CallJson, Format, ToolFormat};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const END: &str = "<|end|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";

/// What ends a message's body: its own end tags, or the next message.
const TERMINATORS: [&str; 4] = [END, RETURN, CALL, START];
/// The length of the longest terminator.
const LONGEST_TAG: usize = RETURN.len();
/// What a header may start with (after blanks).
const HEADER_OPENERS: [&str; 4] = [START, CHANNEL, "to=", MESSAGE];
/// Longer than any header a model writes (function names are at most 64
/// characters): text that long without `<|message|>` is no header.
const HEADER_BYTES: usize = 256;
/// The recipient of calls to the request's tools.
const FUNCTIONS: &str = "functions.";

/// The format's row in [`super::FORMATS`].
pub(super) const HARMONY: Format = Format {
    format: ToolFormat::Harmony,
    detect: |source| source.contains(CHANNEL) && source.contains(MESSAGE),
    markers: &[START, CHANNEL, MESSAGE, CONSTRAIN, END, RETURN, CALL],
    call_json: CallJson::Bare(header),
    forced,
    parser: || Box::new(Harmony::new(true)),
};

/// One call: `<|call|>` ends the model's turn, so gpt-oss writes one call
/// per turn and `parallel_tool_calls` cannot add more.
fn forced(_calls: Repeat, controls: &Controls<'_>) -> (String, String) {
    ("call".to_string(), format!("tool {}", controls.lark(CALL)))
}

/// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`.
fn header(name: &str, controls: &Controls<'_>) -> String {
    format!(
        "{} {} {} {} {}",
        controls.lark(CHANNEL),
        literal(&format!("commentary to={FUNCTIONS}{name} ")),
        controls.lark(CONSTRAIN),
        literal("json"),
        controls.lark(MESSAGE),
    )
}

/// What a message's body is, from its header.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    /// The `analysis` channel.
    Reasoning,
    /// The `final` channel, a preamble, or text that is no harmony.
    Content,
    /// A call of the named function; the body is its arguments.
    Call(String),
    /// A message for someone else (a built-in tool, or a function when the
    /// request has no tools).
    Dropped,
}

/// Where the parser is in the run of messages.
#[derive(Debug)]
enum State {
    /// Reading a header: held until `<|message|>`.
    Header(String),
    /// In a body; `held` is a partial terminator, or a call's arguments.
    Body { body: Body, held: String },
}

/// The streaming parser of harmony output.
#[derive(Debug)]
pub(super) struct Harmony {
    state: State,
    /// Whether calls to `functions.*` are the request's tool calls.
    tools: bool,
}

impl Harmony {
    pub(super) fn new(tools: bool) -> Self {
        Harmony {
            state: State::Header(String::new()),
            tools,
        }
    }
}

impl CallParser for Harmony {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        let mut text = text.to_string();
        loop {
            match &mut self.state {
                State::Header(held) => {
                    held.push_str(&text);
                    let Some(at) = held.find(MESSAGE) else {
                        let ready = held.len() - partial_tag(held, MESSAGE);
                        if !may_be_header(&held[..ready]) {
                            text = not_a_header(std::mem::take(held));
                            self.state = plain();
                            continue;
                        }
                        return;
                    };
                    if !may_be_header(&held[..at]) {
                        text = not_a_header(std::mem::take(held));
                        self.state = plain();
                        continue;
                    }
                    let body = body_of(&held[..at], self.tools);
                    text = held[at + MESSAGE.len()..].to_string();
                    self.state = State::Body {
                        body,
                        held: String::new(),
                    };
                }
                State::Body { body, held } => {
                    // A call's arguments are searched from where the last
                    // push could have begun a terminator.
                    let from = match body {
                        Body::Call(_) => {
                            last_boundary(held, held.len().saturating_sub(LONGEST_TAG - 1))
                        }
                        _ => 0,
                    };
                    held.push_str(&text);
                    if let Some((at, tag)) = first_terminator(held, from) {
                        let after = held[at + tag.len()..].to_string();
                        held.truncate(at);
                        let body = std::mem::replace(body, Body::Dropped);
                        end_body(body, held, out);
                        // The next message's `<|start|>` opens its header.
                        let next = if tag == START { START } else { "" };
                        self.state = State::Header(next.to_string());
                        text = after;
                        continue;
                    }
                    if !matches!(body, Body::Call(_)) {
                        let ready = held.len() - partial_terminator(held);
                        let done: String = held.drain(..ready).collect();
                        stream(body, &done, out);
                    }
                    return;
                }
            }
        }
    }

    /// A call cut short has arguments that do not parse, so `cut` needs
    /// no case of its own: such a call is dropped either way.
    fn finish(&mut self, out: &mut Parsed, _cut: bool) {
        match std::mem::replace(&mut self.state, State::Header(String::new())) {
            // A header the output ended in is dropped, and so are the
            // blanks between messages; other text is content.
            State::Header(held) => {
                let start = held.trim_start();
                if !(start.is_empty() || start.starts_with("<|") || start.starts_with("to=")) {
                    out.content.push_str(&held);
                }
            }
            State::Body { body, held } => end_body(body, &held, out),
        }
    }
}

/// The body a header (the text before `<|message|>`) announces; calls to
/// `functions.*` are calls only when the request has `tools`.
fn body_of(header: &str, tools: bool) -> Body {
    // Only the assistant's own messages: a tool's result or a system
    // message the model made up is not output.
    let start = header.trim_start();
    if let Some(role) = start.strip_prefix(START).map(word)
        && role != "assistant"
    {
        return Body::Dropped;
    }
    let recipient = recipients(header).find(|r| !matches!(*r, "assistant" | "user" | "all"));
    if let Some(recipient) = recipient {
        return match recipient.strip_prefix(FUNCTIONS) {
            Some(name) if tools && !name.is_empty() => Body::Call(name.to_string()),
            _ => Body::Dropped,
        };
    }
    match channel(header) {
        Some("analysis") => Body::Reasoning,
        _ => Body::Content,
    }
}

/// A body ended, at a terminator or with the output; `held` is the rest of
/// it. A call whose arguments are not a JSON map is dropped: its markup
/// never becomes content.
fn end_body(body: Body, held: &str, out: &mut Parsed) {
    match body {
        Body::Call(name) => {
            if let Some(arguments) = call_arguments(held) {
                out.calls.push(ParsedCall { name, arguments });
            }
        }
        // A partial terminator at the very end was text after all.
        body => stream(&body, held, out),
    }
}

/// What a text that is no header leaves as content: all of it, less the
/// `<|start|>` that opened it (as content, that tag would open it again).
fn not_a_header(held: String) -> String {
    match held.strip_prefix(START) {
        Some(rest) => rest.to_string(),
        None => held,
    }
}

/// The state for output that is not harmony: all content.
fn plain() -> State {
    State::Body {
        body: Body::Content,
        held: String::new(),
    }
}

fn stream(body: &Body, text: &str, out: &mut Parsed) {
    match body {
        Body::Reasoning => out.reasoning.push_str(text),
        Body::Content => out.content.push_str(text),
        Body::Call(_) | Body::Dropped => {}
    }
}

/// The arguments of a call body: one JSON map (or a string holding one),
/// nothing after it but blanks.
fn call_arguments(body: &str) -> Option<String> {
    let (value, rest) = leading_json(body.trim_start())?;
    if !rest.trim().is_empty() || !matches!(value, Value::Object(_) | Value::String(_)) {
        return None;
    }
    arguments_text(Some(value))
}

/// Whether `text` may be (the start of) a header: it opens like one, holds
/// only header characters and no terminator, and is short. Every start of
/// such a text is one too, so where the decision falls does not depend on
/// how the output was chunked.
fn may_be_header(text: &str) -> bool {
    let start = text.trim_start();
    text.len() <= HEADER_BYTES
        && HEADER_OPENERS
            .iter()
            .any(|opener| start.starts_with(opener) || opener.starts_with(start))
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c.is_whitespace() || "<|>_-.:=/".contains(c))
        && ![END, RETURN, CALL].iter().any(|tag| text.contains(tag))
}

/// Every `to=RECIPIENT` of a header, in order.
fn recipients(header: &str) -> impl Iterator<Item = &str> {
    header
        .match_indices("to=")
        .filter(|&(at, _)| {
            at == 0 || header[..at].ends_with(|c: char| c.is_whitespace() || c == '>')
        })
        .map(|(at, _)| word(&header[at + 3..]))
}

/// The channel a header names (the last one: gpt-oss sometimes writes a
/// stray `<|channel|>commentary to=assistant` before the real one).
fn channel(header: &str) -> Option<&str> {
    let at = header.rfind(CHANNEL)?;
    Some(word(&header[at + CHANNEL.len()..]))
}

/// The word `text` starts with: up to a blank or a tag.
fn word(text: &str) -> &str {
    let end = text
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(text.len());
    &text[..end]
}

/// The first terminator in `text` at or after byte `from`.
fn first_terminator(text: &str, from: usize) -> Option<(usize, &'static str)> {
    TERMINATORS
        .iter()
        .filter_map(|tag| text[from..].find(tag).map(|at| (from + at, *tag)))
        .min_by_key(|&(at, _)| at)
}

/// The length of the longest end of `text` that may still become a
/// terminator.
fn partial_terminator(text: &str) -> usize {
    TERMINATORS
        .iter()
        .map(|tag| partial_tag(text, tag))
        .max()
        .unwrap_or(0)
}

/// The last character boundary of `text` at or before `at`.
fn last_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}
