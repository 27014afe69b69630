//! Tool calls and reasoning in a model's output: the streaming parser that
//! splits the text into content, reasoning and calls, and the grammar that
//! forces a call when `tool_choice` asks for one.

mod grammar;
mod parse;

pub use grammar::{GrammarError, forced_call_grammar};
pub use parse::{OutputParser, Parsed, ParsedCall, Thinking};
