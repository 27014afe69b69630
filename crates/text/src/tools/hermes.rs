//! Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
//! one block per call (Hermes, Qwen2.5, Qwen3), and zinfer's fallback for
//! templates that do not show tools: the tools become a system preamble in
//! the words of Qwen2.5's template, and tool calls and results become
//! Hermes text in assistant and user turns.

use serde_json::Value as Json;
use zinfer_protocol::{ChatMessage, MessageContent, ToolCall};

use super::grammar::{Controls, Repeat, literal};
use super::parse::{CallParser, Parsed, Shape, is_blank, parse_call};
use super::tag::partial_tag;
use super::{CallJson, Format, ToolFormat};
use crate::TextError;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The format's row in [`super::FORMATS`].
pub(super) const HERMES: Format = Format {
    format: ToolFormat::Hermes,
    // The default: any template that shows no other format.
    detect: |_| true,
    markers: &[],
    call_json: CallJson::Wrapped("arguments"),
    forced,
    parser: || Box::new(Hermes::default()),
};

/// Calls one per line, each a block.
fn forced(calls: Repeat, _controls: &Controls<'_>) -> (String, String) {
    (
        calls.joined_by("\n"),
        format!(
            "{} tool {}",
            literal(&format!("{OPEN}\n")),
            literal(&format!("\n{CLOSE}"))
        ),
    )
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

impl CallParser for Hermes {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        let mut text = text.to_string();
        loop {
            let Some(block) = &mut self.block else {
                self.held.push_str(&text);
                if let Some(at) = self.held.find(OPEN) {
                    let opened = self.held.split_off(at);
                    if self.segment_started || !is_blank(&self.held) {
                        self.emit_held(out);
                    }
                    self.block = Some(String::new());
                    self.searched = 0;
                    text = opened[OPEN.len()..].to_string();
                    continue;
                }
                let ready = self.held.len() - partial_tag(&self.held, OPEN);
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
            let mut from = self.searched.saturating_sub(CLOSE.len() - 1);
            while !block.is_char_boundary(from) {
                from -= 1;
            }
            let Some(found) = block[from..].find(CLOSE) else {
                self.searched = block.len();
                return;
            };
            let at = from + found;
            text = block[at + CLOSE.len()..].to_string();
            block.truncate(at);
            let body = std::mem::take(block);
            self.block = None;
            self.end_block(&body, true, out);
        }
    }

    fn finish(&mut self, out: &mut Parsed, cut: bool) {
        if let Some(body) = self.block.take() {
            match parse_call(body.trim(), Shape::Tagged) {
                None if cut => {}
                _ => self.end_block(&body, false, out),
            }
        } else if !(self.called && is_blank(&self.held)) {
            self.emit_held(out);
        }
        self.held.clear();
    }
}

impl Hermes {
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
            self.held.push_str(OPEN);
            self.held.push_str(body);
            if closed {
                self.held.push_str(CLOSE);
            }
            self.emit_held(out);
        }
    }
}

/// The system preamble that lists `tools` (OpenAI tool dicts), one
/// compact JSON object per line, in the words of Qwen2.5's template.
pub(crate) fn fallback_preamble(tools: &[Json]) -> Result<String, TextError> {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&to_json(tool)?);
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    Ok(text)
}

/// `messages` with tool calls and tool results as Hermes text: an
/// assistant turn's calls become `<tool_call>` blocks after its content;
/// each run of `tool` turns becomes one `user` turn of `<tool_response>`
/// blocks, so templates that need user/assistant alternation accept it.
pub(crate) fn fallback_turns(messages: &[ChatMessage]) -> Result<Vec<ChatMessage>, TextError> {
    let mut turns: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut in_tool_run = false;
    for message in messages {
        let text = message.content.as_ref().map(MessageContent::text);
        let text = text.as_deref().unwrap_or("");
        if message.role == "tool" {
            let block = format!("<tool_response>\n{text}\n</tool_response>");
            match turns.last_mut() {
                Some(ChatMessage {
                    content: Some(MessageContent::Text(merged)),
                    ..
                }) if in_tool_run => {
                    merged.push('\n');
                    merged.push_str(&block);
                }
                _ => turns.push(ChatMessage::new("user", block)),
            }
            in_tool_run = true;
            continue;
        }
        in_tool_run = false;
        let calls = message.tool_calls.as_deref().unwrap_or_default();
        if message.role == "assistant" && (!calls.is_empty() || message.content.is_none()) {
            let mut content = text.to_string();
            for (i, call) in calls.iter().enumerate() {
                if i > 0 || !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&call_block(call)?);
            }
            // Rewritten turns keep role, text and reasoning only.
            turns.push(ChatMessage {
                reasoning_content: message.reasoning_content.clone(),
                ..ChatMessage::new("assistant", content)
            });
        } else {
            turns.push(message.clone());
        }
    }
    Ok(turns)
}

/// One call as the model writes it:
/// `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`.
/// Arguments sent as a string that holds JSON (as OpenAI sends them) are
/// shown as that JSON; any other value is shown as given.
fn call_block(call: &ToolCall) -> Result<String, TextError> {
    let arguments = &call.function.arguments;
    let parsed = arguments
        .as_str()
        .and_then(|s| serde_json::from_str::<Json>(s).ok());
    let name = to_json(&Json::from(call.function.name.as_str()))?;
    let arguments = to_json(parsed.as_ref().unwrap_or(arguments))?;
    Ok(format!(
        "<tool_call>\n{{\"name\": {name}, \"arguments\": {arguments}}}\n</tool_call>"
    ))
}

/// Compact JSON, keys in the client's order.
fn to_json(value: &Json) -> Result<String, TextError> {
    serde_json::to_string(value)
        .map_err(|e| TextError::ChatTemplate(format!("tool JSON does not serialize: {e}")))
}
