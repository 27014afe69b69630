//! Harmony output, with llama.cpp's own cases (`tests/test-chat.cpp`, the
//! GPT-OSS block; its inputs start after the prompt's `<|start|>assistant`,
//! as the model's output does) as the reference: each text gives the same
//! content, reasoning and calls whole and one character at a time.

use super::tests::{call, check, parsed};
use super::*;

const TOOLS: Option<ToolFormat> = Some(ToolFormat::Harmony);
const HELLO: &str = "Hello, world!\nWhat's up?";
const THINKING: &str = "I'm\nthinking";

#[test]
fn final_and_preamble_channels_are_content() {
    for text in [
        "<|channel|>final<|message|>Hello, world!\nWhat's up?",
        "<|channel|>commentary<|message|>Hello, world!\nWhat's up?",
    ] {
        for tools in [None, TOOLS] {
            check(tools, Thinking::Harmony, text, &parsed(HELLO, "", vec![]));
        }
    }
}

#[test]
fn analysis_channel_is_reasoning() {
    let text = "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?";
    check(
        None,
        Thinking::Harmony,
        text,
        &parsed(HELLO, THINKING, vec![]),
    );
    // Cut inside the analysis message.
    let partial = "<|channel|>analysis<|message|>I'm\nthinking";
    check(
        None,
        Thinking::Harmony,
        partial,
        &parsed("", THINKING, vec![]),
    );
    // A stray `<|channel|>commentary to=assistant` before either message.
    for text in [
        "<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?",
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>Hello, world!\nWhat's up?",
    ] {
        check(
            None,
            Thinking::Harmony,
            text,
            &parsed(HELLO, THINKING, vec![]),
        );
    }
}

#[test]
fn calls_with_the_recipient_in_the_role_or_the_channel() {
    let expected = parsed("", "", vec![call("special_function", r#"{"arg1":1}"#)]);
    for text in [
        " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
        "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}",
        " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
        "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}",
        // As the template writes calls in the history, and ended by `<|call|>`.
        " to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}<|call|>",
    ] {
        check(TOOLS, Thinking::Harmony, text, &expected);
    }
    let after_thinking = "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}";
    check(
        TOOLS,
        Thinking::Harmony,
        after_thinking,
        &parsed(
            "",
            THINKING,
            vec![call("special_function", r#"{"arg1":1}"#)],
        ),
    );
}

#[test]
fn a_call_with_markup_like_arguments() {
    let text = "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}";
    let arguments = r#"{"oldString":"if (part < railCount - 1) {","newString":"if (part < 4) {","replaceAll":false}"#;
    check(
        TOOLS,
        Thinking::Harmony,
        text,
        &parsed("", "Thinking about edit...", vec![call("edit", arguments)]),
    );
}

#[test]
fn structured_output_in_the_final_channel_is_content() {
    let text = "<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{\"amount\": 123.45, \"date\": \"2025-12-03\"}";
    let expected = parsed(
        r#"{"amount": 123.45, "date": "2025-12-03"}"#,
        "I need to output the invoice details in JSON",
        vec![],
    );
    check(None, Thinking::Harmony, text, &expected);
}

/// Calls to built-in tools, and to functions when the request has no
/// tools, are dropped (llama.cpp: "no good way to handle these").
#[test]
fn unsolicited_calls_are_dropped() {
    let reasoning = "I will execute python to say hello";
    for text in [
        "<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
        "<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print(\"hello\")",
    ] {
        for tools in [None, TOOLS] {
            check(
                tools,
                Thinking::Harmony,
                text,
                &parsed("", reasoning, vec![]),
            );
        }
    }
    let call =
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>";
    check(None, Thinking::Harmony, call, &parsed("", "", vec![]));
    // A message in another role is not the assistant's output.
    let result = "<|start|>functions.f to=assistant<|channel|>commentary<|message|>\"42\"<|end|>";
    check(None, Thinking::Harmony, result, &parsed("", "", vec![]));
}

#[test]
fn markers_are_held_back_while_streaming() {
    let mut parser = OutputParser::new(None, Thinking::Harmony);
    assert_eq!(parser.push("<|chan").content, "", "a header is held");
    assert_eq!(parser.push("nel|>final<|message|>Hel").content, "Hel");
    assert_eq!(parser.push("lo <|").content, "lo ", "a partial tag is held");
    assert_eq!(parser.push("end|>").content, "");
    let next = parser.push("<|start|>assistant<|channel|>analysis<|message|>a <|st");
    assert_eq!((next.content.as_str(), next.reasoning.as_str()), ("", "a "));
    assert_eq!(parser.push("ill").reasoning, "<|still");
    assert_eq!(parser.finish(), Parsed::default());
    // A call comes out at `<|call|>`, or at the end of the output when
    // `<|call|>` ended generation without reaching the parser.
    let mut parser = OutputParser::new(TOOLS, Thinking::Harmony);
    let header = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>";
    assert_eq!(parser.push(header), Parsed::default());
    assert_eq!(parser.push("{\"a\": 1}"), Parsed::default());
    assert_eq!(parser.push("<|call|>").calls, [call("f", r#"{"a":1}"#)]);
    let mut parser = OutputParser::new(TOOLS, Thinking::Harmony);
    let _ = parser.push(header);
    let _ = parser.push("{}");
    assert_eq!(parser.finish().calls, [call("f", "{}")]);
}

#[test]
fn broken_calls_never_become_content() {
    for text in [
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json<|call|>",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
        "<|channel|>commentary to=functions. <|constrain|>json<|message|>{}",
        "<|channel|>commentary to=functions.f <|constrain|>js",
    ] {
        check(TOOLS, Thinking::Harmony, text, &parsed("", "", vec![]));
        let mut parser = OutputParser::new(TOOLS, Thinking::Harmony);
        let mut all = parser.push(text);
        let end = parser.finish_cut();
        all.content.push_str(&end.content);
        assert_eq!(all.content, "", "{text:?}");
        assert!(end.calls.is_empty(), "{text:?}");
    }
}

#[test]
fn output_that_is_not_harmony_is_content() {
    for text in [
        "Hello there",
        "to be or not",
        "<b>bold</b>",
        "  indented, with <|end|",
    ] {
        check(None, Thinking::Harmony, text, &parsed(text, "", vec![]));
    }
    // A `<|start|>` that opens no header is dropped, the rest is content.
    for (text, content) in [
        ("<|start|>Hello, world", "Hello, world"),
        ("<|start|><|start|>x, y", "x, y"),
        ("a<|start|>b, c<|end|>\n<|start|>d, e", "ab, c\nd, e"),
    ] {
        check(None, Thinking::Harmony, text, &parsed(content, "", vec![]));
    }
    // Text then a message: the text up to its end tag is content.
    let text = "Hi<|end|><|start|>assistant<|channel|>final<|message|> there";
    check(
        None,
        Thinking::Harmony,
        text,
        &parsed("Hi there", "", vec![]),
    );
}
