use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;
use zinfer_protocol::{ContentPart, FunctionCall, ToolCall};

use super::*;

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(Some(source.into()), "<s>".into(), "</s>".into())
}

fn render(source: &str, messages: &[ChatMessage]) -> Result<String, TextError> {
    template(source).render_messages(messages)
}

#[test]
fn no_template_is_chatml() {
    let t = ChatTemplate::new(None, String::new(), String::new());
    assert_eq!(
        t.render_messages(&[msg("user", "hi")]).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn python_string_methods_render() {
    // As Qwen, DeepSeek and Llama templates use them.
    let source = "{% for m in messages %}\
        {% if m['content'].startswith('/') %}[cmd {{ m['content'][1:].strip().upper() }}]\
        {% else %}<{{ m['role'] }}>{{ m['content'].strip() }}{% endif %}\
        {% endfor %}{{ eos_token }}";
    assert_eq!(
        render(source, &[msg("user", "  hello \n"), msg("user", "/reset ")]).unwrap(),
        "<user>hello[cmd RESET]</s>"
    );
}

#[test]
fn blocks_are_trimmed_as_transformers_does() {
    let source = "{% for m in messages %}\n  {% if m.role == 'user' %}\nU:{{ m.content }}\n  {% endif %}\n{% endfor %}";
    assert_eq!(
        render(source, &[msg("user", "a"), msg("user", "b")]).unwrap(),
        "U:a\nU:b\n"
    );
}

#[test]
fn raise_exception_and_broken_templates_are_errors() {
    let err = render(
        "{{ raise_exception('roles must alternate') }}",
        &[msg("user", "x")],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("roles must alternate"), "{err}");

    let err = render("{% for m in messages %}", &[msg("user", "x")])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chat template:"), "{err}");
}

/// Prints each field of each message as Python would see it.
const FIELDS: &str = "{% for m in messages %}[{{ m.role }}\
    |{{ m.content is none }}:{{ m.content }}\
    |{{ m.name if m.name is defined else '-' }}\
    |{% if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c.id }} {{ c.type }} {{ c.function.name }} {{ c.function.arguments }} {{ c.function.arguments | tojson }};{% endfor %}{% else %}-{% endif %}\
    |{{ m.tool_call_id | default('-') }}\
    |{{ m.reasoning_content | default('-') }}]\n{% endfor %}";

#[test]
fn openai_message_fields_reach_the_template() {
    let parts = ChatMessage {
        name: Some("alice".into()),
        content: Some(MessageContent::Parts(vec![
            ContentPart {
                kind: "text".into(),
                text: Some("one".into()),
            },
            ContentPart {
                kind: "text".into(),
                text: Some("two".into()),
            },
        ])),
        ..msg("user", "")
    };
    let call = |id: &str, arguments| ToolCall {
        id: Some(id.into()),
        kind: Some("function".into()),
        function: FunctionCall {
            name: "get_weather".into(),
            arguments,
        },
    };
    let calls = ChatMessage {
        role: "assistant".into(),
        tool_calls: Some(vec![
            call("c1", json!("{\"city\": \"Paris\"}")),
            call("c2", json!({"city": "Oslo", "days": 2})),
        ]),
        ..ChatMessage::default()
    };
    let result = ChatMessage {
        tool_call_id: Some("c1".into()),
        ..msg("tool", "21 C")
    };
    let reasoning = ChatMessage {
        reasoning_content: Some("think".into()),
        ..msg("assistant", "done")
    };
    let out = render(FIELDS, &[parts, calls, result, reasoning]).unwrap();
    assert_eq!(
        out,
        "[user|False:one\ntwo|alice|-|-|-]\n\
         [assistant|True:None|-|c1 function get_weather {\"city\": \"Paris\"} \"{\\\"city\\\": \\\"Paris\\\"}\";\
         c2 function get_weather {'city': 'Oslo', 'days': 2} {\"city\": \"Oslo\", \"days\": 2};|-|-]\n\
         [tool|False:21 C|-|-|c1|-]\n\
         [assistant|False:done|-|-|-|think]\n"
    );
}

#[test]
fn tools_generation_prompt_and_extra_variables_are_template_variables() {
    let source = "{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|\
        {{ enable_thinking | default('unset') }}|{{ bos_token }}{{ eos_token }}|\
        {% for t in tools or [] %}{{ t.function.name }}{% endfor %}";
    let t = template(source);
    let messages = [msg("user", "x")];
    assert_eq!(
        t.render_messages(&messages).unwrap(),
        "True|True|True|unset|<s></s>|"
    );
    let tools = [json!({"type": "function", "function": {"name": "f"}})];
    let variables = json!({"enable_thinking": false, "eos_token": "<end>"});
    let input = TemplateInput {
        tools: Some(&tools),
        add_generation_prompt: false,
        variables: variables.as_object(),
        ..TemplateInput::new(&messages)
    };
    assert_eq!(
        t.render(&input).unwrap(),
        "False|True|False|False|<s><end>|f"
    );
    let variables = json!({"messages": []});
    let input = TemplateInput {
        variables: variables.as_object(),
        ..TemplateInput::new(&messages)
    };
    let err = t.render(&input).unwrap_err().to_string();
    assert!(err.contains("\"messages\" comes from the request"), "{err}");
}

#[test]
fn tojson_is_python_json_dumps() {
    let value = json!({"b": "<tag> & 'q' \"d\" é 😀\n\u{1}", "a": [1, 2.5, 1e-7, null, true], "e": {}, "l": []});
    let tools = [value];
    let input = |source: &str| {
        let t = template(source);
        let messages = [msg("user", "x")];
        t.render(&TemplateInput {
            tools: Some(&tools),
            ..TemplateInput::new(&messages)
        })
        .unwrap()
    };
    // Keys keep the order they were given in, as Python's dicts do.
    assert_eq!(
        input("{{ tools[0] | tojson }}"),
        r#"{"b": "<tag> & 'q' \"d\" é 😀\n\u0001", "a": [1, 2.5, 1e-07, null, true], "e": {}, "l": []}"#
    );
    assert_eq!(
        input("{{ tools[0].b | tojson(ensure_ascii=True) }}"),
        r#""<tag> & 'q' \"d\" \u00e9 \ud83d\ude00\n\u0001""#
    );
    assert_eq!(
        input("{{ tools[0].a | tojson(indent=2) }}"),
        "[\n  1,\n  2.5,\n  1e-07,\n  null,\n  true\n]"
    );
    assert_eq!(
        input("{{ {'z': 1, 'y': [2]} | tojson(separators=(',', ':'), sort_keys=true) }}"),
        r#"{"y":[2],"z":1}"#
    );
    assert_eq!(
        input("{{ {'k': {'x': []}} | tojson(indent='\t') }}"),
        "{\n\t\"k\": {\n\t\t\"x\": []\n\t}\n}"
    );
    let err = template("{{ x | tojson }}")
        .render_messages(&[msg("user", "x")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("not JSON serializable"), "{err}");
}

#[test]
fn strftime_now_reads_the_render_clock() {
    let t = template("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}");
    let messages = [msg("user", "x")];
    let input = TemplateInput {
        // 2026-01-02 14:05:09 UTC.
        now: UNIX_EPOCH + Duration::from_secs(1_767_362_709),
        ..TemplateInput::new(&messages)
    };
    assert_eq!(t.render(&input).unwrap(), "02 Jan 2026|2026-01-02 14:05");
}

#[test]
fn generation_blocks_render_their_body() {
    let source = "{% for m in messages %}{% generation %}\n{{ m.content }}\n{%- endgeneration %}|{% endfor %}";
    assert_eq!(
        render(source, &[msg("user", "a"), msg("assistant", "b")]).unwrap(),
        "a|b|"
    );
    assert_eq!(
        without_generation_tags("{%- generation -%}x{%endgeneration%}{% if generation %}"),
        "{%- if true -%}x{%endif%}{% if generation %}"
    );
}
