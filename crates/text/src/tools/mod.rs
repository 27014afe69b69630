//! Tool calls and reasoning in a model's output: the formats models write
//! calls in, the streaming parser that splits output into content,
//! reasoning and calls, and the grammar that forces a call when
//! `tool_choice` asks for one.
//!
//! Each format is one file holding all zinfer knows of it: how a chat
//! template shows that it is in use, the control tokens its parser reads,
//! the streaming parser of its calls and the Lark rules that force one
//! (Hermes also the preamble of zinfer's fallback for templates that do
//! not show tools). `FORMATS` lists them; a new format is one more file,
//! a [`ToolFormat`] variant and a row there. The `<think>` block is
//! `reasoning`'s, the same for every format.

mod grammar;
mod harmony;
#[cfg(test)]
mod harmony_tests;
mod hermes;
mod llama3;
mod mistral;
mod parse;
mod reasoning;
mod tag;
#[cfg(test)]
mod tests;

pub use grammar::{GrammarError, forced_call_grammar};
pub(crate) use hermes::{fallback_preamble, fallback_turns};
pub use parse::{OutputParser, Parsed, ParsedCall};
pub use reasoning::Thinking;
pub(crate) use reasoning::in_template as thinks_in_template;

use grammar::{CallJson, Controls, Repeat};
use parse::CallParser;

/// How a model family writes tool calls in its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block
    /// per call: Hermes, Qwen2.5, Qwen3, and zinfer's fallback for templates
    /// that do not show tools.
    #[default]
    Hermes,
    /// Llama 3.1 / 3.2: `{"name": ..., "parameters": {...}}`, optionally
    /// after `<|python_tag|>`, several separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then a JSON array of
    /// `{"name": ..., "arguments": {...}}`, or (v11 and later)
    /// `[TOOL_CALLS]name[ARGS]{...}` per call.
    Mistral,
    /// gpt-oss's harmony messages: `<|channel|>commentary
    /// to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`, beside
    /// the `analysis` (reasoning) and `final` (content) channels.
    Harmony,
}

/// One tool-call format: what a template, the parser, the request's
/// validation and the forcing grammar need to know of it.
struct Format {
    /// The format this row describes.
    format: ToolFormat,
    /// Whether a chat template's source writes calls this way; the first
    /// row of [`FORMATS`] that says so is the template's format.
    detect: fn(&str) -> bool,
    /// Control tokens of the format that its parser reads, though
    /// decoding drops them.
    markers: &'static [&'static str],
    /// How a forced call's JSON names its function.
    call_json: CallJson,
    /// The forcing grammar's `start` and `call` rules, given how many calls
    /// are allowed and how the vocabulary has the control tokens.
    forced: fn(Repeat, &Controls<'_>) -> (String, String),
    /// A fresh streaming parser of the format's calls.
    parser: fn() -> Box<dyn CallParser>,
}

/// Every format, in the order template sources are matched against them
/// (Hermes, which matches any, last).
const FORMATS: &[&Format] = &[
    &harmony::HARMONY,
    &mistral::MISTRAL,
    &llama3::LLAMA3_JSON,
    &hermes::HERMES,
];

impl ToolFormat {
    /// The format a chat template's source writes calls in.
    pub(crate) fn of_template(source: &str) -> Self {
        FORMATS
            .iter()
            .find(|f| (f.detect)(source))
            .map_or(ToolFormat::Hermes, |f| f.format)
    }

    /// Control tokens of this format that the output parser reads
    /// (`<|python_tag|>`, `[TOOL_CALLS]`, ...).
    pub fn markers(self) -> &'static [&'static str] {
        self.syntax().markers
    }

    /// This format's row of [`FORMATS`].
    fn syntax(self) -> &'static Format {
        match self {
            ToolFormat::Hermes => &hermes::HERMES,
            ToolFormat::Llama3Json => &llama3::LLAMA3_JSON,
            ToolFormat::Mistral => &mistral::MISTRAL,
            ToolFormat::Harmony => &harmony::HARMONY,
        }
    }
}
