//! The `<think>` block a reasoning model opens its output with: the same
//! for every tool-call format, so it is parsed before them. (Harmony's
//! reasoning is a channel of its messages, read by its own parser.)

use super::ToolFormat;
use crate::ChatFeatures;

/// Opens the reasoning block.
const THINK_OPEN: &str = "<think>";
/// Closes it.
const THINK_CLOSE: &str = "</think>";

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
    /// Harmony messages (gpt-oss): the `analysis` channel is reasoning,
    /// read with the rest of the output by the harmony parser, with or
    /// without tools.
    Harmony,
}

impl Thinking {
    /// The block's tags: the parser must see them, also as control tokens
    /// that decoding drops.
    pub const TAGS: [&'static str; 2] = [THINK_OPEN, THINK_CLOSE];

    /// How the output of a prompt rendered as `rendered` by a template
    /// with `features` starts: harmony messages for a harmony template;
    /// for one that thinks (see [`crate::ChatFeatures::thinks`]), a block
    /// already open when the prompt ends with `<think>` (DeepSeek-R1
    /// distills, QwQ).
    pub fn after_prompt(features: &ChatFeatures, rendered: &str) -> Self {
        if features.tool_format == ToolFormat::Harmony {
            Thinking::Harmony
        } else if !features.thinks {
            Thinking::Off
        } else if rendered.trim_end().ends_with(THINK_OPEN) {
            Thinking::Open
        } else {
            Thinking::Tags
        }
    }
}

impl Thinking {
    /// Control tokens the output parser must see for this kind of
    /// reasoning, though decoding may drop them.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            Thinking::Off => &[],
            Thinking::Tags | Thinking::Open => &Thinking::TAGS,
            Thinking::Harmony => ToolFormat::Harmony.markers(),
        }
    }
}

/// Whether a chat template's source writes `<think>` blocks.
pub(crate) fn in_template(source: &str) -> bool {
    Thinking::TAGS.iter().any(|tag| source.contains(tag))
}

/// Where the output is with respect to a `<think>` block.
#[derive(Debug)]
pub(super) enum Reasoning {
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
    pub(super) fn new(thinking: Thinking) -> Self {
        match thinking {
            Thinking::Off | Thinking::Harmony => Reasoning::Content,
            Thinking::Tags => Reasoning::Opening(String::new()),
            Thinking::Open => Reasoning::Inside(String::new()),
        }
    }

    pub(super) fn push(&mut self, text: &str, reasoning: &mut String, content: &mut String) {
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
                    let ready = held.len() - super::tag::partial_tag(held, THINK_CLOSE);
                    reasoning.push_str(&held[..ready]);
                    held.drain(..ready);
                }
            }
        }
    }

    /// An unopened `<think>` was content; an unclosed block is reasoning.
    pub(super) fn finish(&mut self, reasoning: &mut String, content: &mut String) {
        match std::mem::replace(self, Reasoning::Content) {
            Reasoning::Opening(held) => content.push_str(&held),
            Reasoning::Inside(held) => reasoning.push_str(&held),
            Reasoning::Closed | Reasoning::Content => {}
        }
    }
}
