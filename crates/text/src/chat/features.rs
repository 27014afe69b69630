//! What a chat template says about tools and reasoning: the syntax the
//! model writes tool calls in, whether the template shows tools itself,
//! and whether the model thinks in `<think>` blocks.
//!
//! Also where the Hermes fallback for templates that do not show tools
//! puts its preamble (the preamble and the rewritten turns are the Hermes
//! format's, in `tools/hermes.rs`), so any template renders a tool
//! conversation.

use zinfer_protocol::{ChatMessage, MessageContent};

use super::TemplateInput;
use crate::tools::{ToolFormat, thinks_in_template};

/// What a chat template supports, read from its source once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChatFeatures {
    /// The syntax of tool calls in the model's output.
    pub tool_format: ToolFormat,
    /// Whether the template shows `tools` to the model itself; when it
    /// does not, zinfer renders them in the Hermes format (see
    /// [`super::ChatTemplate::render_request`]).
    pub renders_tools: bool,
    /// Whether the model writes its reasoning in `<think>...</think>`.
    pub thinks: bool,
}

/// The features of a template's source.
///
/// - `tool_format`: the first format of the tools table that recognises
///   the source (`<|channel|>` and `<|message|>`: harmony; `[TOOL_CALLS]`:
///   Mistral; `<|python_tag|>`, or Llama 3 headers with a `"parameters"`
///   key: Llama 3 JSON), else Hermes.
/// - `renders_tools`: see [`reads_tools`].
/// - `thinks`: the source has `<think>` or `</think>`.
pub(crate) fn detect(source: &str) -> ChatFeatures {
    ChatFeatures {
        tool_format: ToolFormat::of_template(source),
        renders_tools: reads_tools(source),
        thinks: thinks_in_template(source),
    }
}

/// Whether the template reads the variable `tools`: the identifier `tools`
/// as a whole name inside a `{% ... %}` or `{{ ... }}` tag, outside string
/// literals and not as an attribute (`x.tools`). So `tool_calls`,
/// `custom_tools`, `tools_in_user_message`, comments and prose such as
/// `raise_exception("Cannot put tools ...")` do not count.
fn reads_tools(source: &str) -> bool {
    let mut rest = source;
    while let Some(open) = rest.find('{') {
        let tag = &rest[open..];
        let closer = if tag.starts_with("{%") {
            "%}"
        } else if tag.starts_with("{{") {
            "}}"
        } else if tag.starts_with("{#") {
            // A comment: skip it whole.
            rest = tag.find("#}").map_or("", |end| &tag[end + 2..]);
            continue;
        } else {
            rest = &tag[1..];
            continue;
        };
        let (body, after) = tag_body(&tag[2..], closer);
        if names(body).any(|name| name == "tools") {
            return true;
        }
        rest = after;
    }
    false
}

/// A tag's body up to its `closer` (outside strings and nested braces),
/// and the source after the closer.
fn tag_body<'a>(tag: &'a str, closer: &str) -> (&'a str, &'a str) {
    let bytes = tag.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"') => i = string_end(bytes, i + 1, quote),
            b'{' => depth += 1,
            b'}' if depth > 0 => depth -= 1,
            _ if depth == 0 && bytes[i..].starts_with(closer.as_bytes()) => {
                return (&tag[..i], &tag[i + closer.len()..]);
            }
            _ => {}
        }
        i += 1;
    }
    (tag, "")
}

/// The index of the quote that ends the string literal starting at `from`
/// (after its opening `quote`), or the end of the input.
fn string_end(bytes: &[u8], mut from: usize, quote: u8) -> usize {
    while from < bytes.len() {
        match bytes[from] {
            b'\\' => from += 1,
            b if b == quote => return from,
            _ => {}
        }
        from += 1;
    }
    bytes.len()
}

/// The names a tag's body reads: identifiers outside string literals that
/// are not attributes (not after a `.`).
fn names(body: &str) -> impl Iterator<Item = &str> {
    let bytes = body.as_bytes();
    let mut i = 0;
    let mut after_dot = false;
    std::iter::from_fn(move || {
        while i < bytes.len() {
            let b = bytes[i];
            if b == b'\'' || b == b'"' {
                i = string_end(bytes, i + 1, b) + 1;
                after_dot = false;
            } else if b.is_ascii_alphabetic() || b == b'_' {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let attribute = std::mem::replace(&mut after_dot, false);
                if !attribute {
                    return Some(&body[start..i]);
                }
            } else if b.is_ascii_digit() {
                // A number: its digits are not a name.
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                after_dot = false;
            } else {
                if !b.is_ascii_whitespace() {
                    after_dot = b == b'.';
                }
                i += 1;
            }
        }
        None
    })
}

/// Whether a request needs the Hermes fallback when the template does not
/// show tools: it gives tools, or its conversation has tool calls or
/// tool results.
pub(super) fn uses_tools(input: &TemplateInput<'_>) -> bool {
    input.tools.is_some_and(|tools| !tools.is_empty())
        || input.messages.iter().any(|m| {
            m.role == "tool" || m.tool_calls.as_ref().is_some_and(|calls| !calls.is_empty())
        })
}

/// `turns` with `preamble` in the system turn: after the first turn's
/// content when that is a system turn, else in a new system turn first.
pub(super) fn in_system_turn(turns: &[ChatMessage], preamble: &str) -> Vec<ChatMessage> {
    let mut turns = turns.to_vec();
    match turns.first_mut() {
        Some(first) if first.role == "system" => {
            let text = first.content.as_ref().map(MessageContent::text);
            first.content = Some(MessageContent::Text(joined(
                text.as_deref().unwrap_or(""),
                preamble,
            )));
        }
        _ => turns.insert(0, ChatMessage::new("system", preamble)),
    }
    turns
}

/// `turns` with `preamble` before the first user turn's content, for
/// templates that refuse a system turn; `None` without a user turn.
pub(super) fn in_first_user_turn(
    turns: &[ChatMessage],
    preamble: &str,
) -> Option<Vec<ChatMessage>> {
    let mut turns = turns.to_vec();
    let user = turns.iter_mut().find(|m| m.role == "user")?;
    let text = user.content.as_ref().map(MessageContent::text);
    user.content = Some(MessageContent::Text(joined(
        preamble,
        text.as_deref().unwrap_or(""),
    )));
    Some(turns)
}

/// `first` and `second` with a blank line between, or the one that is not
/// empty.
fn joined(first: &str, second: &str) -> String {
    match (first.is_empty(), second.is_empty()) {
        (true, _) => second.to_string(),
        (_, true) => first.to_string(),
        _ => format!("{first}\n\n{second}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value as Json, json};
    use zinfer_protocol::{FunctionCall, ToolCall};

    use super::*;
    use crate::ChatTemplate;
    use crate::tools::fallback_turns;

    fn chatml() -> ChatTemplate {
        ChatTemplate::new(None, "<s>".into(), "</s>".into())
    }

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new(Some(source.into()), "<s>".into(), "</s>".into())
    }

    fn call(id: &str, name: &str, arguments: Json) -> ToolCall {
        ToolCall {
            id: Some(id.into()),
            kind: Some("function".into()),
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }

    fn tool_result(id: &str, name: &str, content: &str) -> ChatMessage {
        ChatMessage {
            tool_call_id: Some(id.into()),
            name: Some(name.into()),
            ..ChatMessage::new("tool", content)
        }
    }

    fn weather_tools() -> Vec<Json> {
        vec![
            json!({"type": "function", "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
            }}),
            json!({"type": "function", "function": {
                "name": "get_time",
                "description": "Local time in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "format": {"type": "string"}}, "required": ["city"]}
            }}),
        ]
    }

    /// A user question, two calls (arguments as a JSON string and as a
    /// map) with null content, their two results, and a follow-up.
    fn tool_conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("user", "Weather and time in Paris?"),
            ChatMessage {
                role: "assistant".into(),
                tool_calls: Some(vec![
                    call("call_1", "get_weather", json!("{\"city\": \"Paris\"}")),
                    call(
                        "call_2",
                        "get_time",
                        json!({"city": "Paris", "format": "24h"}),
                    ),
                ]),
                ..ChatMessage::default()
            },
            tool_result("call_1", "get_weather", "{\"temp_c\": 18}"),
            tool_result("call_2", "get_time", "14:05"),
            ChatMessage::new("user", "Thanks! Anything else?"),
        ]
    }

    fn input<'a>(messages: &'a [ChatMessage], tools: Option<&'a [Json]>) -> TemplateInput<'a> {
        TemplateInput {
            tools,
            ..TemplateInput::new(messages)
        }
    }

    const PREAMBLE: &str = r#"# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type":"function","function":{"name":"get_weather","description":"Current weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}
{"type":"function","function":{"name":"get_time","description":"Local time in a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"format":{"type":"string"}},"required":["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>"#;

    #[test]
    fn chatml_tool_conversation_renders_in_hermes_format() {
        let tools = weather_tools();
        let messages = tool_conversation();
        let prompt = chatml()
            .render_request(&input(&messages, Some(&tools)))
            .unwrap();
        let expected = format!(
            "<|im_start|>system\n{PREAMBLE}<|im_end|>\n{}",
            r#"<|im_start|>user
Weather and time in Paris?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city":"Paris"}}
</tool_call>
<tool_call>
{"name": "get_time", "arguments": {"city":"Paris","format":"24h"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temp_c": 18}
</tool_response>
<tool_response>
14:05
</tool_response><|im_end|>
<|im_start|>user
Thanks! Anything else?<|im_end|>
<|im_start|>assistant
"#
        );
        assert_eq!(prompt, expected);
    }

    #[test]
    fn preamble_follows_the_clients_system_turn() {
        let tools = weather_tools();
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        let prompt = chatml()
            .render_request(&input(&messages, Some(&tools)))
            .unwrap();
        assert_eq!(
            prompt,
            format!(
                "<|im_start|>system\nBe brief.\n\n{PREAMBLE}<|im_end|>\n\
                 <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            )
        );
    }

    #[test]
    fn template_refusing_system_gets_preamble_in_first_user_turn() {
        let t = template(
            "{% for m in messages %}{% if m.role == 'system' %}\
             {{ raise_exception('System role not supported') }}{% endif %}\
             <{{ m.role }}>{{ m.content }}{% endfor %}",
        );
        let tools = weather_tools();
        let messages = [ChatMessage::new("user", "Hi")];
        let prompt = t.render_request(&input(&messages, Some(&tools))).unwrap();
        assert_eq!(prompt, format!("<user>{PREAMBLE}\n\nHi"));
    }

    #[test]
    fn template_that_renders_tools_gets_them_unchanged() {
        let t = template(
            "{% if tools %}{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}\
             {% for m in messages %}<{{ m.role }}>{{ m.content }}\
             {% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}",
        );
        assert!(t.features().renders_tools);
        let tools = weather_tools();
        let messages = tool_conversation();
        let request = input(&messages, Some(&tools));
        let rendered = t.render(&request).unwrap();
        assert_eq!(t.render_request(&request).unwrap(), rendered);
        assert!(rendered.contains("<tool>"), "{rendered}");
    }

    #[test]
    fn requests_without_tools_render_as_given() {
        let messages = [
            ChatMessage::new("user", "Hi"),
            ChatMessage {
                role: "assistant".into(),
                ..ChatMessage::default()
            },
        ];
        let request = input(&messages, Some(&[]));
        assert!(!uses_tools(&request));
        let t = template("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
        assert_eq!(
            t.render_request(&request).unwrap(),
            t.render(&request).unwrap()
        );
    }

    #[test]
    fn tool_turns_without_tools_are_rewritten_without_preamble() {
        let messages = [
            ChatMessage::new("user", "Go"),
            ChatMessage {
                tool_calls: Some(vec![call("c", "run", json!("not json {"))]),
                ..ChatMessage::new("assistant", "Running it.")
            },
            tool_result("c", "run", "done"),
        ];
        let prompt = template("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
            .render_request(&input(&messages, None))
            .unwrap();
        assert_eq!(
            prompt,
            "<user>Go<assistant>Running it.\n<tool_call>\n\
             {\"name\": \"run\", \"arguments\": \"not json {\"}\n</tool_call>\
             <user><tool_response>\ndone\n</tool_response>"
        );
    }

    #[test]
    fn rewritten_turns_drop_tool_fields() {
        let turns = fallback_turns(&tool_conversation()).unwrap();
        let roles: Vec<&str> = turns.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "user", "user"]);
        for turn in &turns[1..3] {
            assert_eq!(turn.tool_calls, None);
            assert_eq!(turn.tool_call_id, None);
            assert_eq!(turn.name, None);
        }
        let silent = [ChatMessage {
            role: "assistant".into(),
            ..ChatMessage::default()
        }];
        assert_eq!(
            fallback_turns(&silent).unwrap(),
            [ChatMessage::new("assistant", "")]
        );
    }

    #[test]
    fn tool_format_follows_call_markers() {
        assert_eq!(
            detect("{{ '[TOOL_CALLS]' + x }}").tool_format,
            ToolFormat::Mistral
        );
        assert_eq!(
            detect("{{ '<|python_tag|>' }}").tool_format,
            ToolFormat::Llama3Json
        );
        assert_eq!(
            detect("{{ '<|start_header_id|>' }}{{ '\"parameters\": ' }}").tool_format,
            ToolFormat::Llama3Json
        );
        assert_eq!(
            detect("{{ '<|start_header_id|>' }}").tool_format,
            ToolFormat::Hermes
        );
        assert_eq!(
            detect("<|start|>{{ r }}<|channel|>final<|message|>{{ c }}<|end|>").tool_format,
            ToolFormat::Harmony
        );
        assert_eq!(detect(super::super::CHATML), ChatFeatures::default());
    }

    #[test]
    fn reading_tools_means_the_variable_in_a_tag() {
        for source in [
            "{% if tools %}x{% endif %}",
            "{%- if tools is not none %}x{% endif %}",
            "{% for tool in tools %}{{ tool }}{% endfor %}",
            "{{ tools | tojson }}",
            "{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}",
            "{% set d = {'a': {'b': 1}} %}{{ tools }}",
        ] {
            assert!(reads_tools(source), "{source}");
        }
        for source in [
            "tools in plain text",
            "{# uses tools #}",
            "{{ m.tool_calls }}{{ tools_in_user_message }}{{ custom_tools }}",
            "{{ raise_exception(\"Cannot put tools here\") }}",
            "{{ 'it\\'s tools' }}",
            "{{ message.tools }}",
            "{{ 'use <tools>' }}",
            "{{ café }}{% if x %}ü{% endif %}",
        ] {
            assert!(!reads_tools(source), "{source}");
        }
    }

    #[test]
    fn thinking_is_a_think_tag() {
        assert!(detect("{{ '<think>\\n' }}").thinks);
        assert!(detect("{% set c = c.split('</think>')[-1] %}").thinks);
        assert!(!detect("{{ 'think' }}").thinks);
    }
}
