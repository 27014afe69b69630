//! The Lark grammar (llguidance's dialect) that forces tool calls.
//!
//! Each allowed tool is one rule holding an inline `%json { schema }` whose
//! schema fixes the name and checks the arguments (or, where the format
//! names the function outside the JSON, as harmony does, the name written
//! before a schema of the arguments alone); the format's syntax (tags,
//! separators, control tokens) is written around them in Lark by the
//! format's own file.

use std::fmt::Write;

use serde_json::{Map, Value, json};
use zinfer_protocol::{Tool, ToolChoice};

use super::ToolFormat;

/// Why no grammar could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// `tool_choice` does not force a call.
    #[error("tool_choice does not force a call")]
    NotForced,
    /// `tool_choice` names a function that is not among the tools.
    #[error("tool_choice names function {0:?}, which is not one of the tools")]
    UnknownFunction(String),
    /// `tool_choice` is `required` but no tools were given.
    #[error("tool_choice is \"required\" but there are no tools")]
    NoTools,
}

/// How many calls a forced output holds: one, or with `parallel_tool_calls`
/// one or more joined by the format's separator.
#[derive(Debug, Clone, Copy)]
pub(super) struct Repeat {
    parallel: bool,
}

impl Repeat {
    /// The rule of the calls, `call` rules joined by `separator`.
    pub(super) fn joined_by(self, separator: &str) -> String {
        if self.parallel {
            format!("call ({} call)*", literal(separator))
        } else {
            "call".to_string()
        }
    }
}

/// How a forced call's JSON names its function.
#[derive(Debug, Clone, Copy)]
pub(super) enum CallJson {
    /// `{"name": NAME, KEY: ARGUMENTS}`, with the arguments under this key.
    Wrapped(&'static str),
    /// The JSON is the arguments alone; this gives the Lark that names the
    /// function before it.
    Bare(fn(&str, &Controls<'_>) -> String),
}

/// How the vocabulary has a format's control tokens.
pub(super) struct Controls<'a>(&'a dyn Fn(&str) -> Option<u32>);

impl Controls<'_> {
    /// `piece` in Lark: the token by id when the vocabulary has it as one
    /// token (its text would be tokenized as plain text, which the model
    /// never writes), else the text.
    pub(super) fn lark(&self, piece: &str) -> String {
        match (self.0)(piece) {
            Some(id) => format!("<[{id}]>"),
            None => literal(piece),
        }
    }
}

/// A grammar whose every sentence is one call (or, with `parallel` and
/// `required`, one or more) of the tools `choice` allows, in `format`'s
/// syntax, arguments valid under each tool's schema: a named choice is
/// exactly one call, as it names one function. A schema's objects are
/// closed unless the tool says `strict: false` (see
/// [`zinfer_protocol::closed_objects`]). `token_id` gives the id of a
/// control token of the format (Mistral's `[TOOL_CALLS]`, harmony's
/// `<|channel|>`, ...) when the vocabulary has it as one token: the
/// grammar writes those by id.
pub fn forced_call_grammar(
    format: ToolFormat,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    token_id: &dyn Fn(&str) -> Option<u32>,
) -> Result<String, GrammarError> {
    let allowed = allowed_tools(tools, choice)?;
    let parallel = parallel && *choice == ToolChoice::Required;
    let syntax = format.syntax();
    let controls = Controls(token_id);
    let (start, call) = (syntax.forced)(Repeat { parallel }, &controls);
    let mut grammar = format!("start: {start}\ncall: {call}\ntool: ");
    let alternatives: Vec<String> = (0..allowed.len()).map(|i| format!("tool_{i}")).collect();
    grammar.push_str(&alternatives.join(" | "));
    grammar.push('\n');
    for (i, tool) in allowed.iter().enumerate() {
        // serde_json's text is valid JSON, which is what `%json` reads.
        let _ = match syntax.call_json {
            CallJson::Wrapped(key) => {
                let schema = Value::Object(call_schema(tool, key));
                writeln!(grammar, "tool_{i}: %json {schema}")
            }
            CallJson::Bare(name) => {
                let mut schema = parameters(tool);
                if let Some(map) = schema.as_object_mut() {
                    map.insert("x-guidance".into(), compact());
                }
                let name = name(&tool.function.name, &controls);
                writeln!(grammar, "tool_{i}: {name} %json {schema}")
            }
        };
    }
    Ok(grammar)
}

/// The tools `choice` lets the model call.
fn allowed_tools<'a>(
    tools: &'a [Tool],
    choice: &ToolChoice,
) -> Result<Vec<&'a Tool>, GrammarError> {
    match choice {
        ToolChoice::Auto | ToolChoice::None => Err(GrammarError::NotForced),
        ToolChoice::Required if tools.is_empty() => Err(GrammarError::NoTools),
        ToolChoice::Required => Ok(tools.iter().collect()),
        ToolChoice::Function(name) => tools
            .iter()
            .find(|tool| tool.function.name == *name)
            .map(|tool| vec![tool])
            .ok_or_else(|| GrammarError::UnknownFunction(name.clone())),
    }
}

/// The schema of a tool's arguments, its objects closed unless the tool
/// says `strict: false`.
fn parameters(tool: &Tool) -> Value {
    let mut parameters = tool
        .function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    if tool.function.strict != Some(false) {
        zinfer_protocol::closed_objects(&mut parameters);
    }
    parameters
}

/// llguidance's option for JSON without free whitespace, as the worker's
/// constraints do for schemas: free whitespace lets a small model fill its
/// budget with blank lines.
fn compact() -> Value {
    json!({"whitespace_flexible": false})
}

/// `{"name": NAME, ARGUMENTS_KEY: {...}}`, nothing else, name first.
fn call_schema(tool: &Tool, arguments_key: &str) -> Map<String, Value> {
    let mut parameters = parameters(tool);
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    // References such as `#/$defs/x` are resolved from the document's
    // root, which is now this wrapper: their definitions move up with them.
    let mut definitions = Map::new();
    if let Some(parameters) = parameters.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(defs) = parameters.remove(key) {
                definitions.insert(key.into(), defs);
            }
        }
    }
    let mut properties = Map::new();
    properties.insert("name".into(), json!({"const": tool.function.name}));
    properties.insert(arguments_key.into(), parameters);
    schema.insert("properties".into(), Value::Object(properties));
    schema.insert("required".into(), json!(["name", arguments_key]));
    schema.insert("additionalProperties".into(), json!(false));
    schema.extend(definitions);
    schema.insert("x-guidance".into(), compact());
    schema
}

/// `text` as a Lark string literal: llguidance reads them as JSON strings.
pub(super) fn literal(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}
