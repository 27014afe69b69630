//! The grammars that force tool calls (`zinfer_text::tools`), compiled by
//! the worker's constraint compiler: each compiles, what they let a model
//! write parses back into allowed calls, and arguments follow the schemas.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use llguidance::Matcher;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use zinfer_protocol::{Constraint, Tool, ToolChoice};
use zinfer_text::tools::{GrammarError, OutputParser, Thinking, forced_call_grammar};
use zinfer_text::{TokenBytes, ToolFormat};
use zinfer_worker::constraint::Grammars;

const EOS: u32 = 256;
const TOOL_CALLS: u32 = 257;
/// Harmony's control tokens, as a gpt-oss vocabulary has them: the ones
/// llama.cpp renders as text, then `<|call|>`, which ends generation.
const HARMONY_TEXT: [(u32, &str); 3] = [
    (258, "<|channel|>"),
    (259, "<|constrain|>"),
    (260, "<|message|>"),
];
const CALL: u32 = 261;
/// Every token that ends generation.
const END: [u32; 2] = [EOS, CALL];

/// One token per byte, then EOS, Mistral's `[TOOL_CALLS]` and harmony's
/// control tokens.
fn vocabulary() -> Vec<TokenBytes> {
    let mut tokens: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
    tokens.push(TokenBytes::Special("<eos>".into()));
    tokens.push(TokenBytes::Special("[TOOL_CALLS]".into()));
    for (_, text) in HARMONY_TEXT {
        tokens.push(TokenBytes::Text(text.as_bytes().to_vec()));
    }
    tokens.push(TokenBytes::Special("<|call|>".into()));
    tokens
}

/// The text a token stands for in the output.
fn token_text(token: u32) -> Vec<u8> {
    match token {
        TOOL_CALLS => b"[TOOL_CALLS]".to_vec(),
        _ => match HARMONY_TEXT.iter().find(|(id, _)| *id == token) {
            Some((_, text)) => text.as_bytes().to_vec(),
            None => vec![u8::try_from(token).unwrap()],
        },
    }
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::function(
            "get_weather",
            json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "days": {"type": "integer", "minimum": 1, "maximum": 9},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "days"],
                "additionalProperties": false,
            }),
        ),
        Tool::function(
            "pick",
            json!({
                "type": "object",
                "properties": {"item": {"$ref": "#/$defs/item"}},
                "required": ["item"],
                "additionalProperties": false,
                "$defs": {"item": {"enum": ["a", "b\"c"]}},
            }),
        ),
        Tool {
            kind: "function".into(),
            function: zinfer_protocol::FunctionDef {
                name: "now".into(),
                description: None,
                parameters: None,
                strict: None,
            },
        },
    ]
}

/// The test vocabulary's control tokens, `by_id`, or none (the grammar
/// writes their text).
fn ids(by_id: bool) -> impl Fn(&str) -> Option<u32> {
    move |piece| {
        let control = match piece {
            "[TOOL_CALLS]" => Some(TOOL_CALLS),
            "<|call|>" => Some(CALL),
            _ => HARMONY_TEXT
                .iter()
                .find(|(_, text)| *text == piece)
                .map(|(id, _)| *id),
        };
        control.filter(|_| by_id)
    }
}

/// Every format, choice, `parallel` and control tokens by id or as text.
fn cases() -> Vec<(ToolFormat, ToolChoice, bool, bool)> {
    let choices = [
        ToolChoice::Required,
        ToolChoice::Function("get_weather".into()),
        ToolChoice::Function("pick".into()),
        ToolChoice::Function("now".into()),
    ];
    let mut cases = Vec::new();
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Llama3Json,
        ToolFormat::Mistral,
        ToolFormat::Harmony,
    ] {
        let markers = match format {
            ToolFormat::Mistral | ToolFormat::Harmony => vec![false, true],
            _ => vec![false],
        };
        for choice in &choices {
            for parallel in [false, true] {
                for &marker in &markers {
                    cases.push((format, choice.clone(), parallel, marker));
                }
            }
        }
    }
    cases
}

fn compile(grammars: &Grammars, grammar: &str) -> Matcher {
    grammars
        .compile(&Constraint::lark(grammar))
        .unwrap_or_else(|e| panic!("{e}\n{grammar}"))
}

/// The text of a random sentence: random allowed tokens, then after
/// `free` steps the ones that close things, and EOS once allowed.
fn walk(matcher: &mut Matcher, rng: &mut StdRng, free: usize) -> String {
    let mut bytes = Vec::new();
    for step in 0..4000 {
        if matcher.is_stopped() {
            return String::from_utf8(bytes).unwrap();
        }
        let allowed = matcher.compute_mask().unwrap().to_list();
        assert!(!allowed.is_empty(), "dead end after {bytes:?}");
        // A quote first: it closes strings, and opens only short ones.
        let closing = [EOS, b'"'.into(), b'}'.into(), b']'.into(), b','.into()];
        let token = match closing.iter().find(|t| allowed.contains(t)) {
            Some(&token) if step >= free => token,
            _ => {
                // No exponents where there is a choice: JSON allows
                // 1e400, serde_json (no arbitrary_precision) does not.
                let exponent = |t: u32| t == u32::from(b'e') || t == u32::from(b'E');
                let mut others: Vec<u32> = allowed.iter().copied().filter(|&t| t != EOS).collect();
                if others.iter().any(|&t| !exponent(t)) {
                    others.retain(|&t| !exponent(t));
                }
                if others.is_empty() {
                    EOS
                } else {
                    others[rng.random_range(0..others.len())]
                }
            }
        };
        matcher.consume_token(token).unwrap();
        // A token that ends generation ends the text, as the engine stops
        // there without decoding it (harmony's `<|call|>` included).
        if END.contains(&token) {
            return String::from_utf8(bytes).unwrap();
        }
        bytes.extend(token_text(token));
    }
    panic!(
        "no end after 4000 steps: {:?}",
        String::from_utf8_lossy(&bytes)
    );
}

/// The call's arguments follow the test tools' schemas.
fn check_arguments(name: &str, arguments: &str) {
    let arguments: Value = serde_json::from_str(arguments).unwrap();
    let map = arguments.as_object().unwrap();
    match name {
        "get_weather" => {
            assert!(map["city"].is_string(), "{arguments}");
            let days = map["days"].as_i64().unwrap();
            assert!((1..=9).contains(&days), "{arguments}");
            if let Some(unit) = map.get("unit") {
                assert!(unit == "celsius" || unit == "fahrenheit", "{arguments}");
            }
        }
        "pick" => assert!(map["item"] == "a" || map["item"] == "b\"c", "{arguments}"),
        // No schema: any map.
        "now" => {}
        other => panic!("unknown tool {other}"),
    }
}

#[test]
fn only_forcing_choices_give_a_grammar() {
    let tools = tools();
    for choice in [ToolChoice::Auto, ToolChoice::None] {
        let result = forced_call_grammar(ToolFormat::Hermes, &tools, &choice, false, &ids(false));
        assert_eq!(result, Err(GrammarError::NotForced));
    }
    let missing = ToolChoice::Function("nope".into());
    assert_eq!(
        forced_call_grammar(ToolFormat::Hermes, &tools, &missing, false, &ids(false)),
        Err(GrammarError::UnknownFunction("nope".into()))
    );
    assert_eq!(
        forced_call_grammar(
            ToolFormat::Hermes,
            &[],
            &ToolChoice::Required,
            true,
            &ids(false)
        ),
        Err(GrammarError::NoTools)
    );
}

#[test]
fn grammars_have_one_json_rule_per_allowed_tool() {
    let tools = tools();
    let choice = ToolChoice::Function("now".into());
    let hermes =
        forced_call_grammar(ToolFormat::Hermes, &tools, &choice, false, &ids(false)).unwrap();
    assert_eq!(
        hermes,
        "start: call\n\
         call: \"<tool_call>\\n\" tool \"\\n</tool_call>\"\n\
         tool: tool_0\n\
         tool_0: %json {\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"now\"},\
         \"arguments\":{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}},\
         \"required\":[\"name\",\"arguments\"],\
         \"additionalProperties\":false,\"x-guidance\":{\"whitespace_flexible\":false}}\n"
    );
    let all = ToolChoice::Required;
    let llama =
        forced_call_grammar(ToolFormat::Llama3Json, &tools, &all, true, &ids(false)).unwrap();
    assert!(
        llama.starts_with(
            "start: call (\"; \" call)*\ncall: tool\ntool: tool_0 | tool_1 | tool_2\n"
        )
    );
    assert!(llama.contains("\"required\":[\"name\",\"parameters\"]"));
    let mistral = forced_call_grammar(ToolFormat::Mistral, &tools, &all, true, &ids(true)).unwrap();
    assert!(
        mistral.starts_with("start: <[257]> \"[\" call (\",\" call)* \"]\"\n"),
        "{mistral}"
    );
    let literal =
        forced_call_grammar(ToolFormat::Mistral, &tools, &all, false, &ids(false)).unwrap();
    assert!(
        literal.starts_with("start: \"[TOOL_CALLS]\" \"[\" call \"]\"\n"),
        "{literal}"
    );
    // Harmony: the name in the header, the JSON the arguments alone, one
    // call (`<|call|>` ends the turn), the control tokens by id.
    let harmony =
        forced_call_grammar(ToolFormat::Harmony, &tools, &choice, true, &ids(true)).unwrap();
    assert_eq!(
        harmony,
        "start: call\n\
         call: tool <[261]>\n\
         tool: tool_0\n\
         tool_0: <[258]> \"commentary to=functions.now \" <[259]> \"json\" <[260]> \
         %json {\"type\":\"object\",\"properties\":{},\"additionalProperties\":false,\
         \"x-guidance\":{\"whitespace_flexible\":false}}\n"
    );
}

#[test]
fn every_grammar_compiles() {
    let grammars = Grammars::new(Ok(vocabulary()), &END);
    for (format, choice, parallel, marker) in cases() {
        let grammar =
            forced_call_grammar(format, &tools(), &choice, parallel, &ids(marker)).unwrap();
        let mut matcher = compile(&grammars, &grammar);
        if marker {
            let first = matcher.compute_mask().unwrap().to_list();
            let opener = match format {
                ToolFormat::Harmony => HARMONY_TEXT[0].0,
                _ => TOOL_CALLS,
            };
            assert_eq!(first, [opener], "the control token opens the calls");
        }
    }
}

/// The parser reads a forced output as calls only, each allowed by
/// `choice` and with arguments that follow its schema.
fn check_forced(format: ToolFormat, choice: &ToolChoice, text: &str) -> usize {
    let mut parser = OutputParser::new(Some(format), Thinking::Off);
    let mut parsed = parser.push(text);
    let rest = parser.finish();
    parsed.content.push_str(&rest.content);
    parsed.calls.extend(rest.calls);
    assert_eq!(parsed.content, "", "{text:?}");
    assert!(!parsed.calls.is_empty(), "{text:?}");
    for call in &parsed.calls {
        match choice {
            ToolChoice::Function(name) => assert_eq!(&call.name, name, "{text:?}"),
            _ => assert!(
                tools().iter().any(|t| t.function.name == call.name),
                "{text:?}"
            ),
        }
        check_arguments(&call.name, &call.arguments);
    }
    parsed.calls.len()
}

#[test]
fn forced_output_parses_back_into_allowed_calls() {
    let grammars = Grammars::new(Ok(vocabulary()), &END);
    let mut rng = StdRng::seed_from_u64(7);
    let mut several = 0;
    for (format, choice, parallel, marker) in cases() {
        let grammar =
            forced_call_grammar(format, &tools(), &choice, parallel, &ids(marker)).unwrap();
        let matcher = compile(&grammars, &grammar);
        for round in 0..8 {
            let text = walk(&mut matcher.clone(), &mut rng, 20 + round * 40);
            let calls = check_forced(format, &choice, &text);
            let one = !parallel || matches!(choice, ToolChoice::Function(_));
            assert!(!one || calls == 1, "a named choice is one call: {text:?}");
            several += usize::from(calls > 1);
        }
    }
    assert!(several > 0, "no walk wrote parallel calls");
}

#[test]
fn arguments_must_follow_the_schema() {
    let grammars = Grammars::new(Ok(vocabulary()), &END);
    let choice = ToolChoice::Function("get_weather".into());
    let grammar =
        forced_call_grammar(ToolFormat::Hermes, &tools(), &choice, false, &ids(false)).unwrap();
    let accepts = |text: &str| {
        let mut matcher = compile(&grammars, &grammar);
        let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        matcher.try_consume_tokens(&tokens).unwrap() == tokens.len()
            && matcher.is_accepting().unwrap()
    };
    let call = |json: &str| format!("<tool_call>\n{json}\n</tool_call>");
    assert!(accepts(&call(
        r#"{"name":"get_weather","arguments":{"city":"Oslo","days":3}}"#
    )));
    assert!(!accepts(&call(
        r#"{"name":"get_weather","arguments":{"city":"Oslo"}}"#
    )));
    assert!(!accepts(&call(r#"{"name":"now","arguments":{}}"#)));
    assert!(!accepts(&call(
        r#"{"arguments":{"city":"Oslo","days":3},"name":"get_weather"}"#
    )));
}

/// Tool schemas are closed unless the tool says `strict: false`: a key the
/// schema does not list is refused (a small model copying the schema into
/// its arguments runs to `max_tokens` otherwise).
#[test]
fn object_schemas_are_strict_unless_the_tool_says_not() {
    let grammars = Grammars::new(Ok(vocabulary()), &END);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"},
        "where": {"type": "object", "properties": {"x": {"type": "integer"}}}}});
    let mut tool = Tool::function("f", schema);
    let choice = ToolChoice::Function("f".into());
    let call = |json: &str| format!("<tool_call>\n{json}\n</tool_call>");
    for (strict, extra_allowed) in [(None, false), (Some(true), false), (Some(false), true)] {
        tool.function.strict = strict;
        let grammar = forced_call_grammar(
            ToolFormat::Hermes,
            &[tool.clone()],
            &choice,
            true,
            &ids(false),
        )
        .unwrap();
        let accepts = |text: &str| {
            let mut matcher = compile(&grammars, &grammar);
            let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
            matcher.try_consume_tokens(&tokens).unwrap() == tokens.len()
                && matcher.is_accepting().unwrap()
        };
        assert!(accepts(&call(
            r#"{"name":"f","arguments":{"city":"Oslo"}}"#
        )));
        for extra in [
            r#"{"name":"f","arguments":{"city":"Oslo","type":"object"}}"#,
            r#"{"name":"f","arguments":{"where":{"x":1,"y":2}}}"#,
        ] {
            assert_eq!(accepts(&call(extra)), extra_allowed, "{strict:?}: {extra}");
        }
    }
}
