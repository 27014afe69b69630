//! The output parser over every format: calls, reasoning and content
//! come out the same however the text is chunked.

use proptest::prelude::*;

use super::*;

/// Everything `chunks` produce, pushes and finish together.
fn run<'a>(
    format: Option<ToolFormat>,
    thinking: Thinking,
    chunks: impl IntoIterator<Item = &'a str>,
) -> Parsed {
    let mut parser = OutputParser::new(format, thinking);
    let mut all = Parsed::default();
    let mut add = |part: Parsed| {
        all.content.push_str(&part.content);
        all.reasoning.push_str(&part.reasoning);
        all.calls.extend(part.calls);
    };
    for chunk in chunks {
        add(parser.push(chunk));
    }
    add(parser.finish());
    all
}

/// `text` in one piece and one character at a time give `expected`.
pub(super) fn check(format: Option<ToolFormat>, thinking: Thinking, text: &str, expected: &Parsed) {
    assert_eq!(&run(format, thinking, [text]), expected, "whole: {text:?}");
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let by_char = run(format, thinking, chars.iter().map(String::as_str));
    assert_eq!(&by_char, expected, "by char: {text:?}");
}

pub(super) fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

pub(super) fn parsed(content: &str, reasoning: &str, calls: Vec<ParsedCall>) -> Parsed {
    Parsed {
        content: content.into(),
        reasoning: reasoning.into(),
        calls,
    }
}

const HERMES: Option<ToolFormat> = Some(ToolFormat::Hermes);
const LLAMA3: Option<ToolFormat> = Some(ToolFormat::Llama3Json);
const MISTRAL: Option<ToolFormat> = Some(ToolFormat::Mistral);
const HARMONY: Option<ToolFormat> = Some(ToolFormat::Harmony);

#[test]
fn without_tools_or_thinking_text_is_content() {
    let text = "Hi <tool_call>{\"name\": \"f\"}</tool_call> <think>x</think>";
    check(None, Thinking::Off, text, &parsed(text, "", vec![]));
}

#[test]
fn hermes_calls_are_parsed_and_the_gap_between_them_dropped() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"parameters\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}\n</tool_call>\n";
    let expected = parsed(
        "",
        "",
        vec![
            call("get_weather", r#"{"city":"Paris","days":2}"#),
            call("now", r#"{"tz":"UTC"}"#),
        ],
    );
    check(HERMES, Thinking::Off, text, &expected);
    let leading = format!("\n\n{text}");
    check(HERMES, Thinking::Off, &leading, &expected);
}

#[test]
fn hermes_content_around_calls_is_kept() {
    let text = "Let me check.\n<tool_call>{\"name\": \"f\"}</tool_call>\nDone <tool";
    check(
        HERMES,
        Thinking::Off,
        text,
        &parsed("Let me check.\n\nDone <tool", "", vec![call("f", "{}")]),
    );
    check(HERMES, Thinking::Off, " \n", &parsed(" \n", "", vec![]));
}

#[test]
fn hermes_streams_content_holding_only_a_partial_tag() {
    let mut parser = OutputParser::new(HERMES, Thinking::Off);
    assert_eq!(parser.push("Sure <tool_c").content, "Sure ");
    assert_eq!(parser.push("all").content, "");
    let done = parser.push(">{\"name\": \"f\", \"arguments\": {}}</tool_call>");
    assert_eq!(done.calls, [call("f", "{}")], "emitted at </tool_call>");
    assert_eq!(parser.push("\n").content, "", "held: may be a gap");
    assert_eq!(parser.push("ok").content, "\nok");
    assert_eq!(parser.finish(), Parsed::default());
}

#[test]
fn hermes_invalid_json_is_content_as_written() {
    for text in [
        "<tool_call>{\"name\": \"f\", </tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        "a\n<tool_call>not json",
    ] {
        check(HERMES, Thinking::Off, text, &parsed(text, "", vec![]));
    }
    let text = "\n<tool_call>bad</tool_call>\n<tool_call>{\"name\": \"g\"}</tool_call>";
    let expected = parsed("\n<tool_call>bad</tool_call>\n", "", vec![call("g", "{}")]);
    check(HERMES, Thinking::Off, text, &expected);
}

#[test]
fn hermes_unclosed_block_is_a_call_when_its_json_is_one() {
    let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n";
    check(
        HERMES,
        Thinking::Off,
        text,
        &parsed("", "", vec![call("f", r#"{"a":1}"#)]),
    );
}

/// An output cut by `max_tokens` in the middle of a call: the call is
/// dropped, never shown as content; what came before it stays.
#[test]
fn a_call_cut_short_is_dropped_not_content() {
    for (format, text, before) in [
        (
            HERMES,
            "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu",
            "Sure.\n",
        ),
        (HERMES, "<tool_call>", ""),
        (MISTRAL, "[TOOL_CALLS] [{\"name\": \"f\",", ""),
        (LLAMA3, "<|python_tag|>{\"name\": \"f\", \"para", ""),
    ] {
        let mut parser = OutputParser::new(format, Thinking::Off);
        let mut content = parser.push(text).content;
        let end = parser.finish_cut();
        content.push_str(&end.content);
        assert_eq!(content, before, "{format:?}: {text:?}");
        assert!(end.calls.is_empty());
        // Not cut, the same text is content as written.
        let mut parser = OutputParser::new(format, Thinking::Off);
        let mut content = parser.push(text).content;
        content.push_str(&parser.finish().content);
        assert_eq!(content, text);
    }
    // A block whose JSON is whole is still a call when cut before its tag.
    let mut parser = OutputParser::new(HERMES, Thinking::Off);
    let _ = parser.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
    assert_eq!(parser.finish_cut().calls, vec![call("f", "{}")]);
    // A bare JSON answer cut short stays content (Llama 3).
    let mut parser = OutputParser::new(LLAMA3, Thinking::Off);
    let _ = parser.push("{\"name\": \"Ada\", ");
    assert_eq!(parser.finish_cut().content, "{\"name\": \"Ada\", ");
}

#[test]
fn llama3_calls_with_and_without_python_tag() {
    let text = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"arguments\": {}}\n";
    let expected = parsed("", "", vec![call("f", r#"{"x":1}"#), call("g", "{}")]);
    check(LLAMA3, Thinking::Off, text, &expected);
    let bare =
        "\n{\"name\": \"f\", \"parameters\": {\"x\": 1}}\n{\"name\": \"g\", \"parameters\": {}}";
    check(LLAMA3, Thinking::Off, bare, &expected);
}

#[test]
fn llama3_answers_stream_and_bad_calls_are_content() {
    let mut parser = OutputParser::new(LLAMA3, Thinking::Off);
    assert_eq!(parser.push(" <|py").content, "");
    assert_eq!(parser.push("thon is").content, " <|python is");
    assert_eq!(parser.push(" {\"name\"").content, " {\"name\"");
    for text in [
        "{\"name\": \"Ada\", \"age\": 36}",
        "{\"name\": \"f\", \"parameters\": {}} trailing",
        "<|python_tag|>print(1)",
        "<|python_tag|>",
        " <|python",
    ] {
        check(LLAMA3, Thinking::Off, text, &parsed(text, "", vec![]));
    }
}

#[test]
fn mistral_v3_array_and_single_object() {
    let text = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}, {\"name\": \"g\", \"arguments\": {}, \"id\": \"abc123xyz\"}]";
    let expected = parsed("", "", vec![call("f", r#"{"a":"b"}"#), call("g", "{}")]);
    check(MISTRAL, Thinking::Off, text, &expected);
    let one = "[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}";
    check(
        MISTRAL,
        Thinking::Off,
        one,
        &parsed("", "", vec![call("f", r#"{"a":"b"}"#)]),
    );
}

#[test]
fn mistral_v11_calls() {
    let text = "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}";
    let expected = parsed(
        "Checking.",
        "",
        vec![
            call("get_weather", r#"{"city":"Paris"}"#),
            call("now", "{}"),
        ],
    );
    check(MISTRAL, Thinking::Off, text, &expected);
}

#[test]
fn mistral_bad_calls_are_content_as_written() {
    for text in [
        "[TOOL_CALLS] [{\"name\": \"f\",",
        "[TOOL_CALLS]two words[ARGS]{}",
        "[TOOL_CALLS][]",
        "\n[TOOL_CALLS]f[ARGS]{} then text",
        "[TOOL_CALL",
    ] {
        check(MISTRAL, Thinking::Off, text, &parsed(text, "", vec![]));
    }
}

#[test]
fn think_block_opening_the_output_is_reasoning() {
    let text = "\n<think>\nstep 1\n</think>\n\nThe answer.";
    check(
        None,
        Thinking::Tags,
        text,
        &parsed("The answer.", "\nstep 1\n", vec![]),
    );
    let later = "Hi <think>x</think>";
    check(None, Thinking::Tags, later, &parsed(later, "", vec![]));
    check(
        None,
        Thinking::Tags,
        " <thin",
        &parsed(" <thin", "", vec![]),
    );
    check(
        None,
        Thinking::Tags,
        "<think>cut off <",
        &parsed("", "cut off <", vec![]),
    );
}

#[test]
fn open_thinking_starts_as_reasoning() {
    let text = "plan</think>answer";
    check(
        None,
        Thinking::Open,
        text,
        &parsed("answer", "plan", vec![]),
    );
    check(
        None,
        Thinking::Open,
        "still thinking",
        &parsed("", "still thinking", vec![]),
    );
    let mut parser = OutputParser::new(None, Thinking::Open);
    assert_eq!(parser.push("a </thi").reasoning, "a ", "only </thi is held");
    assert_eq!(parser.push("s").reasoning, "</this");
}

#[test]
fn thinking_then_a_hermes_call() {
    let text = "<think>I should call <tool_call>{\"name\": \"no\"}</tool_call></think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
    let expected = parsed(
        "",
        "I should call <tool_call>{\"name\": \"no\"}</tool_call>",
        vec![call("f", r#"{"q":"x"}"#)],
    );
    check(HERMES, Thinking::Tags, text, &expected);
    check(HERMES, Thinking::Open, &text["<think>".len()..], &expected);
}

#[test]
fn finish_twice_and_push_after_finish_do_not_panic() {
    let mut parser = OutputParser::new(HERMES, Thinking::Tags);
    let _ = parser.push("<think>a");
    let _ = parser.finish();
    assert_eq!(parser.finish(), Parsed::default());
    let _ = parser.push("<tool_call>");
    let _ = parser.finish();
}

/// Pieces that make tags, JSON and blanks likely to meet chunk edges.
const PIECES: &[&str] = &[
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|start|>",
    "assistant",
    "<|channel|>",
    "analysis",
    "final",
    "commentary",
    " to=functions.f",
    " <|constrain|>json",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
    "{\"name\": \"g\", \"parameters\": {}}",
    "[{\"name\": \"h\", \"arguments\": {}}]",
    "f",
    "; ",
    " ",
    "\n",
    "text",
    "é",
    "日本",
    "<",
    "</",
    "[",
    "{",
    "}",
    "\"",
    "🦀",
];

fn formats() -> impl Strategy<Value = Option<ToolFormat>> {
    prop::sample::select(vec![None, HERMES, LLAMA3, MISTRAL, HARMONY])
}

fn thinkings() -> impl Strategy<Value = Thinking> {
    prop::sample::select(vec![
        Thinking::Off,
        Thinking::Tags,
        Thinking::Open,
        Thinking::Harmony,
    ])
}

proptest! {
    #[test]
    fn chunking_never_changes_the_result(
        format in formats(),
        thinking in thinkings(),
        pieces in prop::collection::vec(prop::sample::select(PIECES), 0..24),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let text: String = pieces.concat();
        let boundaries: Vec<usize> =
            (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let mut at: Vec<usize> = cuts.iter().map(|cut| *cut.get(&boundaries)).collect();
        at.push(0);
        at.push(text.len());
        at.sort_unstable();
        at.dedup();
        let chunks: Vec<&str> = at.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        let whole = run(format, thinking, [text.as_str()]);
        prop_assert_eq!(&run(format, thinking, chunks), &whole);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        prop_assert_eq!(&run(format, thinking, chars.iter().map(String::as_str)), &whole);
        if format.is_none() && thinking == Thinking::Off {
            prop_assert_eq!(&whole.content, &text);
        }
    }

    #[test]
    fn arbitrary_text_never_panics(
        format in formats(),
        thinking in thinkings(),
        chunks in prop::collection::vec(".{0,12}", 0..12),
    ) {
        let _ = run(format, thinking, chunks.iter().map(String::as_str));
    }
}

/// Each format has one row, found by its variant, and its markers are
/// the control tokens its parser reads.
#[test]
fn every_format_has_one_row() {
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Llama3Json,
        ToolFormat::Mistral,
        ToolFormat::Harmony,
    ] {
        let rows = FORMATS.iter().filter(|f| f.format == format).count();
        assert_eq!(rows, 1, "{format:?}");
        assert_eq!(format.syntax().format, format);
    }
    assert_eq!(ToolFormat::Hermes.markers(), [] as [&str; 0]);
    assert_eq!(ToolFormat::Llama3Json.markers(), ["<|python_tag|>"]);
    assert_eq!(
        ToolFormat::Mistral.markers(),
        ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]
    );
    assert_eq!(Thinking::Harmony.markers(), ToolFormat::Harmony.markers());
    assert!(ToolFormat::Harmony.markers().contains(&"<|call|>"));
}
