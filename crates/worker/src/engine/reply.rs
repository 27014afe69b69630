//! One request's output text on its way out: plain, or split by the
//! [`OutputParser`] into content, reasoning and tool calls with ids.

use zinfer_protocol::{FunctionCall, ToolCall};

use super::valid::OutputPlan;
use zinfer_text::tools::{OutputParser, Parsed, ParsedCall};

/// Output since the previous delta.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Delta {
    pub(super) content: String,
    pub(super) reasoning: String,
    pub(super) tool_calls: Vec<ToolCall>,
}

impl Delta {
    pub(super) fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.tool_calls.is_empty()
    }
}

/// Reads one request's output text as its [`OutputPlan`] says.
#[derive(Debug)]
pub(super) struct ReplyText {
    parser: Option<OutputParser>,
    markers: Vec<(u32, String)>,
    /// Tool calls so far, for ids and the finish reason.
    calls: u32,
    /// Seeds the calls' ids, so they differ between requests.
    id_seed: u64,
}

impl ReplyText {
    pub(super) fn new(plan: OutputPlan, id_seed: u64) -> Self {
        let parser = plan
            .parses()
            .then(|| OutputParser::new(plan.tools, plan.thinking));
        ReplyText {
            parser,
            markers: plan.markers,
            calls: 0,
            id_seed,
        }
    }

    /// Whether any tool call was made.
    pub(super) fn called_tools(&self) -> bool {
        self.calls > 0
    }

    /// The output of `token`, whose decoded text is `text`.
    pub(super) fn push(&mut self, token: u32, text: String) -> Delta {
        let Some(parser) = self.parser.as_mut() else {
            return Delta {
                content: text,
                ..Delta::default()
            };
        };
        let mut parsed = parser.push(&text);
        if let Some((_, marker)) = self.markers.iter().find(|(id, _)| *id == token) {
            let more = parser.push(marker);
            merge(&mut parsed, more);
        }
        self.delta(parsed)
    }

    /// The output's end: `tail` is the text the detokenizer held back;
    /// `cut`: it ended at `max_tokens` or a deadline, so an unfinished
    /// call is dropped, not shown as content.
    pub(super) fn finish(&mut self, tail: String, cut: bool) -> Delta {
        let Some(parser) = self.parser.as_mut() else {
            return Delta {
                content: tail,
                ..Delta::default()
            };
        };
        let mut parsed = parser.push(&tail);
        let more = if cut {
            parser.finish_cut()
        } else {
            parser.finish()
        };
        merge(&mut parsed, more);
        self.delta(parsed)
    }

    fn delta(&mut self, parsed: Parsed) -> Delta {
        let tool_calls = parsed
            .calls
            .into_iter()
            .map(|call| self.tool_call(call))
            .collect();
        Delta {
            content: parsed.content,
            reasoning: parsed.reasoning,
            tool_calls,
        }
    }

    fn tool_call(&mut self, call: ParsedCall) -> ToolCall {
        let id = call_id(self.id_seed, self.calls);
        self.calls += 1;
        ToolCall {
            id: Some(id),
            kind: Some("function".into()),
            function: FunctionCall {
                name: call.name,
                arguments: serde_json::Value::String(call.arguments),
            },
        }
    }
}

fn merge(into: &mut Parsed, more: Parsed) {
    into.content.push_str(&more.content);
    into.reasoning.push_str(&more.reasoning);
    into.calls.extend(more.calls);
}

/// A call id of 9 letters and digits, the form Mistral's templates
/// demand of ids in the history, and fine for every other.
fn call_id(seed: u64, index: u32) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    // splitmix64: a cheap, well-mixed hash of (seed, index).
    let mut x = seed ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (0..9)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize];
            x /= ALPHABET.len() as u64;
            c as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_text::tools::Thinking;

    #[test]
    fn call_ids_are_nine_alphanumerics_and_differ() {
        let a = call_id(1, 0);
        assert_eq!(a.len(), 9);
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(a, call_id(1, 1));
        assert_ne!(a, call_id(2, 0));
    }

    #[test]
    fn a_plain_request_passes_text_through() {
        let plan = OutputPlan {
            tools: None,
            thinking: Thinking::Off,
            markers: vec![(7, "<m>".into())],
        };
        let mut reply = ReplyText::new(plan, 0);
        assert_eq!(reply.push(7, "a<".into()).content, "a<");
        assert_eq!(reply.finish("b".into(), false).content, "b");
        assert!(!reply.called_tools());
    }
}
