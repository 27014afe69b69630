//! Constrained requests on the fake model: the mask holds on every step
//! (checked token by token against an independent matcher), constrained
//! and unconstrained requests share batches, and the finish reasons and
//! refusals are the protocol's.

use proptest::prelude::*;
use zinfer_protocol::{ChunkBody, Constraint};

use super::*;
use crate::constraint::Grammars;

fn vocab() -> Grammars {
    Grammars::new(Bytes.token_bytes(), &[EOS])
}

/// Every generated token, in order, EOS included.
fn tokens(events: &[EngineEvent]) -> Vec<u32> {
    events
        .iter()
        .flat_map(|e| match e {
            EngineEvent::Chunk {
                body: ChunkBody { tokens, .. },
                ..
            } => tokens.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// Replays `output` through a fresh matcher of `constraint`: every token
/// must be allowed by the mask of the state it was drawn in.
fn assert_all_allowed(constraint: &Constraint, output: &[u32]) {
    let mut matcher = vocab().compile(constraint).expect("compiles");
    for (at, &token) in output.iter().enumerate() {
        let mask = matcher.compute_mask().expect("mask");
        assert!(
            mask.is_allowed(token),
            "token {token} at {at} of {output:?} is masked under {constraint:?}"
        );
        matcher.consume_token(token).expect("consume");
    }
}

fn constrained(prompt: &str, constraint: Constraint, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        constraint: Some(Box::new(constraint)),
        ..greedy(prompt, max_tokens)
    }
}

#[test]
fn a_regex_constraint_shapes_the_output_and_stops_when_complete() {
    let handle = engine(Mode::Script, 512, 0, EngineConfig::default());
    // Unconstrained, the script says "Hello, ..."; constrained, digits.
    handle
        .submit(
            constrained("x\n", Constraint::regex("[0-9]{3}-[a-c]{2}"), 50),
            1,
        )
        .unwrap();
    handle.submit(greedy("x\n", 5), 2).unwrap();
    let mut by_rid: HashMap<u64, Vec<EngineEvent>> = HashMap::new();
    let mut ended = 0;
    while ended < 2 {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(20))
            .expect("engine went quiet");
        ended += usize::from(event.is_terminal());
        by_rid.entry(event.rid()).or_default().push(event);
    }
    let text = streamed_text(&by_rid[&1]);
    assert_eq!(text.len(), 6, "{text:?}");
    assert!(text[..3].bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    assert_eq!(&text[3..4], "-");
    assert!(
        text[4..].bytes().all(|b| (b'a'..=b'c').contains(&b)),
        "{text:?}"
    );
    assert_eq!(done(&by_rid[&1]).0, FinishReason::Stop);
    // The unconstrained batch mate is untouched.
    assert_eq!(streamed_text(&by_rid[&2]), "Hello");
    let stats = wait_idle(&handle);
    assert!(stats.mask_s > 0.0);
}

#[test]
fn max_tokens_inside_a_structure_ends_with_length_and_a_valid_prefix() {
    let handle = engine(Mode::Script, 512, 0, EngineConfig::default());
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 30}},
        "required": ["name"]
    });
    let constraint = Constraint::json_schema(schema);
    handle
        .submit(constrained("x\n", constraint.clone(), 12), 1)
        .unwrap();
    let events = collect(&handle, 1);
    assert_eq!(done(&events).0, FinishReason::Length);
    let text = streamed_text(&events);
    assert!(text.starts_with("{\"name\":\""), "{text:?}");
    assert_all_allowed(&constraint, &tokens(&events));
}

#[test]
fn constraints_that_do_not_compile_are_refused_at_submit() {
    let handle = engine(Mode::Script, 64, 0, EngineConfig::default());
    let bad = [
        Constraint::lark("start: undefined_rule"),
        Constraint::regex("(unclosed"),
        Constraint::json_schema(serde_json::json!({"type": "no-such-type"})),
    ];
    for constraint in bad {
        let error = handle
            .submit(constrained("x\n", constraint.clone(), 4), 1)
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::BadRequest, "{constraint:?}");
        assert!(
            error.to_string().contains("does not compile"),
            "{constraint:?}: {error}"
        );
    }
}

#[test]
fn a_repeated_constraint_is_compiled_once() {
    let grammars = vocab();
    let schema = serde_json::json!({"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}});
    let first = Instant::now();
    grammars
        .compile(&Constraint::json_schema(schema.clone()))
        .unwrap();
    let cold = first.elapsed();
    let again = Instant::now();
    grammars.compile(&Constraint::json_schema(schema)).unwrap();
    let warm = again.elapsed();
    assert!(warm * 4 < cold, "cached {warm:?} vs compiled {cold:?}");
}

/// Regexes of a few shapes, with random bounds and alternatives.
fn regexes() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..4, 1u32..6).prop_map(|(lo, extra)| format!("[a-f]{{{lo},{}}}", lo + extra)),
        (1u32..5).prop_map(|n| format!("[0-9]{{{n}}}-[0-9]{{{n}}}")),
        proptest::collection::vec("[a-z]{1,4}", 1..4)
            .prop_map(|words| format!("({})+!", words.join("|"))),
        Just("(yes|no|maybe)( [A-Z][a-z]*)?".to_string()),
    ]
}

/// Objects of a few property types, some required.
fn schemas() -> impl Strategy<Value = serde_json::Value> {
    let property = prop_oneof![
        Just(serde_json::json!({"type": "integer"})),
        Just(serde_json::json!({"type": "boolean"})),
        (1u32..6).prop_map(|n| serde_json::json!({"type": "string", "maxLength": n})),
        Just(serde_json::json!({"enum": ["red", "green", "blue"]})),
        (1u32..4).prop_map(|n| serde_json::json!(
            {"type": "array", "items": {"type": "integer"}, "maxItems": n}
        )),
        // Bounded: any JSON number is grammatical, but serde_json refuses
        // exponents past f64's range.
        Just(
            serde_json::json!({"type": "object", "required": ["x"], "properties":
            {"x": {"type": "number", "minimum": -100, "maximum": 100}}})
        ),
    ];
    proptest::collection::vec(property, 1..4).prop_map(|props| {
        let names: Vec<String> = (0..props.len()).map(|i| format!("p{i}")).collect();
        let properties: serde_json::Map<String, serde_json::Value> =
            names.iter().cloned().zip(props).collect();
        serde_json::json!({
            "type": "object",
            "properties": properties,
            "required": names,
            "additionalProperties": false
        })
    })
}

fn constraints() -> impl Strategy<Value = Constraint> {
    prop_oneof![
        regexes().prop_map(Constraint::regex),
        schemas().prop_map(Constraint::json_schema),
        Just(Constraint::json_object()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random constraints, random logits (the hash model), sampled or
    /// greedy, with penalties, beside an unconstrained request: no
    /// constrained token is ever one its mask forbids; a `stop` output is
    /// complete (JSON parses); a `length` one is a prefix.
    #[test]
    fn a_constrained_request_never_samples_a_masked_token(
        constraint in constraints(),
        temperature in prop_oneof![Just(0.0f32), 0.5f32..2.0],
        penalty in prop_oneof![Just(1.0f32), 1.1f32..2.0],
        seed in any::<u64>(),
        max_tokens in 1u32..60,
    ) {
        let handle = engine(Mode::Hash, 1024, 0, EngineConfig::default());
        let request = GenerateRequest {
            temperature,
            repetition_penalty: penalty,
            seed: Some(seed),
            constraint: Some(Box::new(constraint.clone())),
            ..greedy("prompt\n", max_tokens)
        };
        handle.submit(request, 1).unwrap();
        handle.submit(greedy("other\n", 8), 2).unwrap();
        let mut events = Vec::new();
        let mut ended = 0;
        while ended < 2 {
            let event = handle.events().recv_timeout(Duration::from_secs(20)).expect("quiet");
            ended += usize::from(event.is_terminal());
            if event.rid() == 1 {
                events.push(event);
            }
        }
        let (reason, _, usage) = done(&events);
        let output = tokens(&events);
        assert_all_allowed(&constraint, &output);
        match reason {
            FinishReason::Stop => {
                if constraint.regex.is_none() {
                    let text = streamed_text(&events);
                    let value: serde_json::Value = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
                    prop_assert!(value.is_object());
                }
            }
            FinishReason::Length => prop_assert_eq!(usage.completion_tokens, max_tokens),
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }
}

/// Bytes, except that no token spells `b`: a grammar that needs one
/// reaches a state no token extends.
struct NoB;

impl TextCodec for NoB {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        Bytes.encode(text)
    }
    fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        Bytes.decode(ids)
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TextError> {
        Bytes.render_chat(messages)
    }
    fn eos_token_ids(&self) -> &[u32] {
        &[EOS]
    }
    fn token_bytes(&self) -> Result<Vec<TokenBytes>, TextError> {
        let mut tokens = Bytes.token_bytes()?;
        tokens[usize::from(b'b')] = TokenBytes::Text(Vec::new());
        Ok(tokens)
    }
}

#[test]
fn a_matcher_that_fails_mid_stream_ends_its_request_with_a_clear_error() {
    let model = FakeModel {
        mode: Mode::Script,
        delay: Duration::ZERO,
        kv: vec![None; 256],
        max_positions: usize::MAX,
    };
    let handle = Engine::start_with(
        "fake".into(),
        Box::new(model),
        Arc::new(NoB),
        EngineConfig::default(),
    );
    handle
        .submit(constrained("x\n", Constraint::regex("aab"), 10), 1)
        .unwrap();
    let events = collect(&handle, 1);
    match events.last() {
        Some(EngineEvent::Error { code, message, .. }) => {
            assert_eq!(*code, ErrorCode::Internal);
            assert!(
                message.contains("the constraint failed while generating"),
                "{message}"
            );
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(
        tokens(&events),
        [u32::from(b'a'); 2],
        "the tokens before it"
    );
    // The engine goes on serving.
    handle.submit(greedy("x\n", 3), 2).unwrap();
    assert_eq!(streamed_text(&collect(&handle, 2)), "Hel");
    let stats = wait_idle(&handle);
    assert_eq!(
        (stats.kv_used - stats.kv_cached, stats.requests_failed),
        (0, 1)
    );
}
