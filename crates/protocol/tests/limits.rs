//! Every field of `Limits`, at and one past its bound, and the decode errors
//! that name what was wrong.

#![allow(clippy::unwrap_used)]

mod common;

use zinfer_protocol::{
    AdminRequest, CacheTransfer, ChatMessage, ChunkBody, ClientReply, ClientRequest, DecodeError,
    DoneBody, FinishReason, GenerateRequest, Limits, ReadyBody, RouterToSupervisor, RouterToWorker,
    SupervisorToRouter, Timings, TokenLogprob, TopLogprob, Usage, WorkerToRouter, decode, encode,
};

fn generate(edit: impl FnOnce(&mut GenerateRequest)) -> Vec<u8> {
    let mut request = GenerateRequest::from_prompt("r", "Hi");
    edit(&mut request);
    encode(&ClientRequest::Generate(request)).unwrap()
}

fn decode_request(frame: &[u8], limits: &Limits) -> Result<ClientRequest, DecodeError> {
    decode::<ClientRequest>(frame, limits)
}

/// Asserts `frame` decodes and that one more unit (built by `over`) fails
/// with `OverLimit` on `field`.
fn assert_bound(field: &str, at: Vec<u8>, over: Vec<u8>, limits: &Limits) {
    decode_request(&at, limits).unwrap_or_else(|e| panic!("{field} at its limit: {e}"));
    match decode_request(&over, limits) {
        Err(DecodeError::OverLimit { field: f, .. }) => assert_eq!(f, field),
        other => panic!("{field} over its limit gave {other:?}"),
    }
}

fn small() -> Limits {
    Limits {
        max_prompt_bytes: 10,
        max_prompt_items: 3,
        max_stop: 2,
        max_stop_bytes: 4,
        max_stop_token_ids: 2,
        max_tokens_cap: 200,
        max_name_bytes: 5,
        ..Limits::default()
    }
}

#[test]
fn frame_size_is_checked_before_anything_else() {
    let frame = generate(|_| {});
    let limits = Limits {
        max_frame_bytes: frame.len(),
        ..Limits::default()
    };
    decode_request(&frame, &limits).unwrap();
    let tight = Limits {
        max_frame_bytes: frame.len() - 1,
        ..Limits::default()
    };
    assert_eq!(
        decode_request(&frame, &tight),
        Err(DecodeError::FrameTooLarge {
            size: frame.len(),
            max: frame.len() - 1
        })
    );
    // Garbage over the limit is rejected for its size, not parsed.
    let junk = vec![0xc1; Limits::default().max_frame_bytes + 1];
    assert!(matches!(
        decode_request(&junk, &Limits::default()),
        Err(DecodeError::FrameTooLarge { .. })
    ));
}

/// `{"type": "ping", "x": [[...]]}` with `levels` levels in total.
fn nested(levels: usize) -> Vec<u8> {
    let mut frame = b"\x82\xa4type\xa4ping\xa1x".to_vec();
    frame.extend(std::iter::repeat_n(0x91, levels - 2));
    frame.push(0x90);
    frame
}

#[test]
fn depth_counts_the_top_map_as_level_one() {
    for max_depth in [2, 4, 16] {
        let limits = Limits {
            max_depth,
            ..Limits::default()
        };
        decode_request(&nested(max_depth), &limits).unwrap();
        match decode_request(&nested(max_depth + 1), &limits) {
            Err(DecodeError::OverLimit {
                field: "depth",
                detail,
            }) => {
                assert!(detail.contains(&max_depth.to_string()), "{detail}")
            }
            other => panic!("depth {} gave {other:?}", max_depth + 1),
        }
    }
    // A very deep frame fails without recursing through it.
    let deep = nested(100_000);
    assert!(matches!(
        decode_request(&deep, &Limits::default()),
        Err(DecodeError::OverLimit { field: "depth", .. })
    ));
}

#[test]
fn max_depth_zero_or_one_rejects_without_panicking() {
    for max_depth in [0, 1] {
        let limits = Limits {
            max_depth,
            ..Limits::default()
        };
        let result = decode_request(&encode(&ClientRequest::Ping { id: None }).unwrap(), &limits);
        assert_eq!(max_depth == 1, result.is_ok(), "{result:?}");
        assert!(decode_request(&nested(2), &limits).is_err());
    }
}

#[test]
fn prompt_bytes() {
    let l = small();
    assert_bound(
        "prompt",
        generate(|r| r.prompt = Some("a".repeat(10))),
        generate(|r| r.prompt = Some("a".repeat(11))),
        &l,
    );
}

fn chat(n: usize, content: &str) -> Option<Vec<ChatMessage>> {
    Some(vec![ChatMessage::new("user", content); n])
}

#[test]
fn messages_count_and_bytes() {
    let l = Limits {
        max_prompt_bytes: 100,
        ..small()
    };
    let with = |n| {
        generate(move |r| {
            r.prompt = None;
            r.messages = chat(n, "x");
        })
    };
    assert_bound("messages", with(3), with(4), &l);
    // Role and content bytes add up across messages: 2 * (4 + 1) = 10.
    let bytes = |content: &'static str| {
        generate(move |r| {
            r.prompt = None;
            r.messages = chat(2, content);
        })
    };
    assert_bound("messages", bytes("x"), bytes("xx"), &small());
}

#[test]
fn tokens_count() {
    let with = |n| {
        generate(move |r| {
            r.prompt = None;
            r.tokens = Some(vec![5; n]);
        })
    };
    assert_bound("tokens", with(3), with(4), &small());
}

#[test]
fn stop_count_and_length() {
    let l = small();
    assert_bound(
        "stop",
        generate(|r| r.stop = vec!["a".into(), "b".into()]),
        generate(|r| r.stop = vec!["a".into(), "b".into(), "c".into()]),
        &l,
    );
    assert_bound(
        "stop",
        generate(|r| r.stop = vec!["abcd".into()]),
        generate(|r| r.stop = vec!["abcde".into()]),
        &l,
    );
}

#[test]
fn stop_token_ids_count() {
    assert_bound(
        "stop_token_ids",
        generate(|r| r.stop_token_ids = vec![1, 2]),
        generate(|r| r.stop_token_ids = vec![1, 2, 3]),
        &small(),
    );
}

#[test]
fn max_tokens_cap() {
    assert_bound(
        "max_tokens",
        generate(|r| r.max_tokens = 200),
        generate(|r| r.max_tokens = 201),
        &small(),
    );
    let default_cap = Limits::default().max_tokens_cap;
    assert_bound(
        "max_tokens",
        generate(|r| r.max_tokens = default_cap),
        generate(|r| r.max_tokens = default_cap + 1),
        &Limits::default(),
    );
}

#[test]
fn name_lengths_on_generate() {
    let l = small();
    assert_bound(
        "id",
        generate(|r| r.id = "abcde".into()),
        generate(|r| r.id = "abcdef".into()),
        &l,
    );
    assert_bound(
        "model",
        generate(|r| r.model = Some("abcde".into())),
        generate(|r| r.model = Some("abcdef".into())),
        &l,
    );
    assert_bound(
        "namespace",
        generate(|r| r.namespace = Some("abcde".into())),
        generate(|r| r.namespace = Some("abcdef".into())),
        &l,
    );
    let cancel = |id: &str| encode(&ClientRequest::Cancel { id: id.into() }).unwrap();
    assert_bound("id", cancel("abcde"), cancel("abcdef"), &l);
    let ping = |id: &str| {
        encode(&ClientRequest::Ping {
            id: Some(id.into()),
        })
        .unwrap()
    };
    assert_bound("id", ping("abcde"), ping("abcdef"), &l);
}

fn assert_name_bound<T: zinfer_protocol::WireMessage + std::fmt::Debug>(
    field: &str,
    at: T,
    over: T,
) {
    let l = small();
    decode::<T>(&encode(&at).unwrap(), &l).unwrap();
    match decode::<T>(&encode(&over).unwrap(), &l) {
        Err(DecodeError::OverLimit { field: f, .. }) => assert_eq!(f, field),
        other => panic!("{field} over its limit gave {other:?}"),
    }
}

#[test]
fn name_lengths_on_admin_and_worker_messages() {
    let drain = |w: &str| AdminRequest::Drain {
        worker: w.into(),
        park: false,
    };
    assert_name_bound("worker", drain("abcde"), drain("abcdef"));
    let scale = |m: &str| AdminRequest::Scale {
        model: m.into(),
        workers: 1,
        device: None,
    };
    assert_name_bound("model", scale("abcde"), scale("abcdef"));
    let migrate = |d: &str| AdminRequest::Migrate {
        worker: "w".into(),
        device: d.into(),
        carry_tokens: None,
    };
    assert_name_bound("device", migrate("cuda0"), migrate("cuda:0"));
    let ready = |id: &str| {
        WorkerToRouter::Ready(ReadyBody {
            worker_id: id.into(),
            protocol: 1,
            models: vec!["m".into()],
            device: "cpu".into(),
            kv_capacity: 1,
            max_batch: 1,
            context_length: None,
            vocab_size: None,
            import_endpoint: None,
            import_key: None,
        })
    };
    assert_name_bound("worker_id", ready("abcde"), ready("abcdef"));
    let flush = |n: &str| RouterToWorker::FlushCache {
        namespace: Some(n.into()),
    };
    assert_name_bound("namespace", flush("abcde"), flush("abcdef"));
    let failed = |id: &str| SupervisorToRouter::SpawnFailed {
        worker_id: id.into(),
        reason: "no memory".into(),
    };
    assert_name_bound("worker_id", failed("abcde"), failed("abcdef"));
    let spawn = |m: &str| RouterToSupervisor::Spawn {
        worker_id: "w".into(),
        model: m.into(),
        model_path: None,
        device: None,
        import_cache: false,
        exporter_key: None,
    };
    assert_name_bound("model", spawn("abcde"), spawn("abcdef"));
}

#[test]
fn a_cache_span_must_extend_its_prefix() {
    let span = |prefix_len: u32| CacheTransfer::CacheSpan {
        namespace: String::new(),
        tokens: vec![1, 2],
        prefix_len,
        layers: 1,
        kv_dim: 1,
        kv: vec![0; 8],
    };
    let limits = Limits::default();
    assert!(decode::<CacheTransfer>(&encode(&span(1)).unwrap(), &limits).is_ok());
    let err = decode::<CacheTransfer>(&encode(&span(2)).unwrap(), &limits).unwrap_err();
    assert!(err.to_string().contains("prefix_len"), "{err}");
}

#[test]
fn generate_value_domains_are_checked() {
    let l = Limits::default();
    let cases: [(&str, Vec<u8>); 8] = [
        ("temperature", generate(|r| r.temperature = -0.5)),
        ("temperature", generate(|r| r.temperature = f32::NAN)),
        ("top_p", generate(|r| r.top_p = 0.0)),
        ("top_p", generate(|r| r.top_p = 1.5)),
        ("min_p", generate(|r| r.min_p = 2.0)),
        (
            "repetition_penalty",
            generate(|r| r.repetition_penalty = 0.0),
        ),
        ("stop", generate(|r| r.stop = vec![String::new()])),
        (
            "prompt",
            generate(|r| r.tokens = Some(vec![1])), // prompt and tokens both set
        ),
    ];
    for (field, frame) in cases {
        match decode_request(&frame, &l) {
            Err(DecodeError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    let empty_tokens = generate(|r| {
        r.prompt = None;
        r.tokens = Some(vec![]);
    });
    assert!(matches!(
        decode_request(&empty_tokens, &l),
        Err(DecodeError::Invalid {
            field: "tokens",
            ..
        })
    ));
}

#[test]
fn top_logprobs_bound_and_needs_logprobs() {
    let with = |top: u32| {
        generate(move |r| {
            r.logprobs = true;
            r.top_logprobs = top;
        })
    };
    assert_bound("top_logprobs", with(20), with(21), &Limits::default());
    let alone = generate(|r| r.top_logprobs = 1);
    assert!(matches!(
        decode_request(&alone, &Limits::default()),
        Err(DecodeError::Invalid {
            field: "top_logprobs",
            ..
        })
    ));
    // logprobs alone, without alternatives, is fine.
    decode_request(&generate(|r| r.logprobs = true), &Limits::default()).unwrap();
}

/// A non-streamed request carries every entry in one `done`, so its size is
/// bounded up front; a streamed one is not.
#[test]
fn non_streamed_logprob_entries_are_bounded() {
    let limits = Limits::default();
    let request = |max_tokens: u32, stream: bool| {
        generate(move |r| {
            r.logprobs = true;
            r.top_logprobs = 3;
            r.max_tokens = max_tokens;
            r.stream = stream;
        })
    };
    let at = limits.max_logprob_entries as u32 / 4;
    assert_bound(
        "logprobs",
        request(at, false),
        request(at + 1, false),
        &limits,
    );
    decode_request(&request(limits.max_tokens_cap, true), &limits).unwrap();
}

/// At the entry limit, with token texts longer than the default model's
/// (at most 16 bytes, usually 2 to 8), a `done` fits well within a frame;
/// so does a streamed chunk of 16 tokens with 20 alternatives each.
#[test]
fn logprob_frames_at_the_limits_fit_a_frame() {
    let limits = Limits::default();
    let top = limits.max_top_logprobs as usize;
    let entry = |token: u32| TokenLogprob {
        token: 40_000 + token,
        text: "x".repeat(48),
        logprob: -17.123_456,
        top_logprobs: (0..top)
            .map(|i| TopLogprob {
                token: 40_000 + i as u32,
                text: "y".repeat(48),
                logprob: -(i as f32) - 0.5,
            })
            .collect(),
    };
    let tokens = limits.max_logprob_entries / (1 + top);
    let done = WorkerToRouter::Done {
        rid: u64::MAX,
        body: DoneBody {
            text: Some("x".repeat(48 * tokens)),
            logprobs: Some((0..tokens as u32).map(entry).collect()),
            ..DoneBody::new(FinishReason::Length, Usage::default(), Timings::default())
        },
    };
    let frame = encode(&done).unwrap();
    assert!(
        frame.len() < limits.max_frame_bytes / 2,
        "{} bytes",
        frame.len()
    );
    assert_eq!(decode::<WorkerToRouter>(&frame, &limits).unwrap(), done);
    let chunk = WorkerToRouter::Chunk {
        rid: 1,
        body: ChunkBody {
            tokens: (0..16).collect(),
            logprobs: Some((0..16).map(entry).collect()),
            ..ChunkBody::default()
        },
    };
    let frame = encode(&chunk).unwrap();
    assert!(frame.len() < 64 * 1024, "{} bytes", frame.len());
}

#[test]
fn logprobs_come_one_per_token_with_bounded_alternatives() {
    let limits = Limits::default();
    let mut entries = common::token_logprobs();
    let chunk = |entries: Vec<TokenLogprob>| {
        encode(&WorkerToRouter::Chunk {
            rid: 1,
            body: ChunkBody {
                text: "a".into(),
                tokens: vec![7042, 2208],
                logprobs: Some(entries),
                ..ChunkBody::default()
            },
        })
        .unwrap()
    };
    decode::<WorkerToRouter>(&chunk(entries.clone()), &limits).unwrap();
    let one_short = chunk(entries[..1].to_vec());
    assert!(matches!(
        decode::<WorkerToRouter>(&one_short, &limits),
        Err(DecodeError::Invalid {
            field: "logprobs",
            ..
        })
    ));
    let alternative = entries[0].top_logprobs[0].clone();
    entries[0].top_logprobs = vec![alternative; 21];
    let frame = chunk(entries);
    assert!(matches!(
        decode::<WorkerToRouter>(&frame, &limits),
        Err(DecodeError::OverLimit {
            field: "top_logprobs",
            ..
        })
    ));
    // The client side checks the same.
    let reply = encode(&ClientReply::Chunk {
        id: "r".into(),
        body: ChunkBody {
            tokens: vec![1, 2, 3],
            logprobs: Some(common::token_logprobs()),
            ..ChunkBody::default()
        },
    })
    .unwrap();
    assert!(matches!(
        decode::<ClientReply>(&reply, &limits),
        Err(DecodeError::Invalid {
            field: "logprobs",
            ..
        })
    ));
}

fn map(pairs: Vec<(&str, rmpv::Value)>) -> Vec<u8> {
    let map = pairs.into_iter().map(|(k, v)| (k.into(), v)).collect();
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &rmpv::Value::Map(map)).unwrap();
    out
}

#[test]
fn unknown_type_names_the_type_and_the_valid_ones() {
    let frame = map(vec![("type", "frobnicate".into()), ("id", "r".into())]);
    let err = decode_request(&frame, &Limits::default()).unwrap_err();
    assert_eq!(
        err,
        DecodeError::UnknownType {
            found: "frobnicate".into(),
            expected: &[
                "generate",
                "cancel",
                "models",
                "ping",
                "tokenize",
                "detokenize",
                "apply_template",
                "embed",
            ],
        }
    );
    assert!(err.to_string().contains("\"frobnicate\""), "{err}");
    // A valid type sent to the wrong socket is unknown there.
    let chunk = encode(&common::client_replies().remove(0).message).unwrap();
    assert!(matches!(
        decode_request(&chunk, &Limits::default()),
        Err(DecodeError::UnknownType { found, .. }) if found == "chunk"
    ));
}

#[test]
fn unsupported_version_names_the_version() {
    let frame = map(vec![("type", "ping".into()), ("v", 2.into())]);
    let err = decode_request(&frame, &Limits::default()).unwrap_err();
    assert_eq!(
        err,
        DecodeError::UnsupportedVersion {
            found: 2,
            supported: 1
        }
    );
    assert!(err.to_string().contains("version 2"), "{err}");
    // The version is checked before the type, so a future message type
    // from a newer client is reported as a version problem.
    let future = map(vec![("type", "embed".into()), ("v", 2.into())]);
    assert!(matches!(
        decode::<ClientReply>(&future, &Limits::default()),
        Err(DecodeError::UnsupportedVersion { found: 2, .. })
    ));
    for bad in [
        rmpv::Value::from("1"),
        rmpv::Value::from(-1),
        rmpv::Value::F64(1.0),
    ] {
        let frame = map(vec![("type", "ping".into()), ("v", bad.clone())]);
        assert!(
            matches!(
                decode_request(&frame, &Limits::default()),
                Err(DecodeError::Invalid { field: "v", .. })
            ),
            "v = {bad}"
        );
    }
}

#[test]
fn malformed_messages_say_what_is_wrong() {
    let l = Limits::default();
    let missing_id = map(vec![("type", "cancel".into())]);
    match decode_request(&missing_id, &l) {
        Err(DecodeError::Malformed { kind, detail }) => {
            assert_eq!(kind, "cancel");
            assert!(detail.contains("id"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    let wrong_type = map(vec![
        ("type", "generate".into()),
        ("id", "r".into()),
        ("prompt", "Hi".into()),
        ("max_tokens", "many".into()),
    ]);
    assert!(matches!(
        decode_request(&wrong_type, &l),
        Err(DecodeError::Malformed { kind, .. }) if kind == "generate"
    ));
    let cases: [(&str, Vec<u8>); 6] = [
        ("empty frame", vec![]),
        ("array, not a map", b"\x92\xa4ping\xc0".to_vec()),
        ("no type", map(vec![("id", "r".into())])),
        ("type is a number", map(vec![("type", 3.into())])),
        ("trailing bytes", {
            let mut f = encode(&ClientRequest::Ping { id: None }).unwrap();
            f.push(0xc0);
            f
        }),
        ("truncated", {
            let f = encode(&ClientRequest::Cancel { id: "r1".into() }).unwrap();
            f[..f.len() - 1].to_vec()
        }),
    ];
    for (what, frame) in cases {
        assert!(
            matches!(decode_request(&frame, &l), Err(DecodeError::NotAMessage(_))),
            "{what}: {:?}",
            decode_request(&frame, &l)
        );
    }
}

#[test]
fn huge_declared_lengths_fail_before_decoding() {
    let l = Limits::default();
    let prefix = b"\x83\xa4type\xa8generate\xa2id\xa1r\xa6tokens".to_vec();
    for header in [
        &b"\xdd\xff\xff\xff\xff"[..], // array32 of 4,294,967,295
        b"\xdf\xff\xff\xff\xff",      // map32
        b"\xdb\xff\xff\xff\xff",      // str32
        b"\xc6\xff\xff\xff\xff",      // bin32
        b"\xc9\xff\xff\xff\xff\x01",  // ext32
    ] {
        let mut frame = prefix.clone();
        frame.extend_from_slice(header);
        frame.extend_from_slice(&[1, 2, 3]);
        match decode_request(&frame, &l) {
            Err(DecodeError::NotAMessage(detail)) => {
                assert!(detail.contains("bytes"), "{detail}")
            }
            other => panic!("{header:02x?}: {other:?}"),
        }
    }
}

/// `{"type": "generate", "id": "r", "prompt": "Hi"}` plus `extra` entries.
fn generate_with(extra: Vec<(rmpv::Value, rmpv::Value)>) -> Vec<u8> {
    let mut pairs: Vec<(rmpv::Value, rmpv::Value)> = vec![
        ("type".into(), "generate".into()),
        ("id".into(), "r".into()),
        ("prompt".into(), "Hi".into()),
    ];
    pairs.extend(extra);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &rmpv::Value::Map(pairs)).unwrap();
    out
}

#[test]
fn integer_keys_never_name_fields() {
    let l = Limits::default();
    // serde would read key 18 as the 19th field, deadline_ms.
    let frame = generate_with(vec![(18.into(), 3.into())]);
    match decode_request(&frame, &l) {
        Err(DecodeError::Encoding(detail)) => {
            assert!(detail.contains("not a str"), "{detail}");
            assert!(detail.contains("an integer"), "{detail}");
        }
        other => panic!("integer key gave {other:?}"),
    }
    // Nested maps too, with the top-level field named.
    let nested = generate_with(vec![(
        "messages".into(),
        rmpv::Value::Array(vec![rmpv::Value::Map(vec![(0.into(), "user".into())])]),
    )]);
    match decode_request(&nested, &l) {
        Err(DecodeError::Encoding(detail)) => {
            assert!(detail.contains("in field \"messages\""), "{detail}")
        }
        other => panic!("nested integer key gave {other:?}"),
    }
    // A nil or boolean key is no better.
    for key in [rmpv::Value::Nil, rmpv::Value::Boolean(true)] {
        let frame = generate_with(vec![(key.clone(), 1.into())]);
        assert!(
            matches!(decode_request(&frame, &l), Err(DecodeError::Encoding(_))),
            "key {key}"
        );
    }
}

#[test]
fn nil_in_an_optional_field_is_its_default() {
    let fields = [
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "stream",
        "priority",
        "deadline_ms",
        "model",
        "namespace",
        "logprobs",
        "top_logprobs",
    ];
    let extra = fields
        .iter()
        .map(|field| ((*field).into(), rmpv::Value::Nil))
        .collect();
    let ClientRequest::Generate(request) =
        decode_request(&generate_with(extra), &Limits::default()).unwrap()
    else {
        panic!("not a generate")
    };
    assert_eq!(request, GenerateRequest::from_prompt("r", "Hi"));
    // A required field set to nil is still missing.
    let frame = map(vec![("type", "cancel".into()), ("id", rmpv::Value::Nil)]);
    assert!(matches!(
        decode_request(&frame, &Limits::default()),
        Err(DecodeError::Malformed { .. })
    ));
}

#[test]
fn wrong_types_name_the_field() {
    let l = Limits::default();
    let cases: [(&str, rmpv::Value); 5] = [
        ("max_tokens", "ten".into()),
        ("temperature", "hot".into()),
        ("stream", 1.into()),
        ("stop", "END".into()),
        ("tokens", rmpv::Value::Array(vec![(-1).into()])),
    ];
    for (field, value) in cases {
        let frame = generate_with(vec![(field.into(), value)]);
        match decode_request(&frame, &l) {
            Err(err @ DecodeError::Malformed { .. }) => {
                let text = err.to_string();
                assert!(text.contains(&format!("field \"{field}\"")), "{text}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    // The culprit is found wherever it sits among valid fields.
    let frame = generate_with(vec![
        ("top_k".into(), 3.into()),
        ("max_tokens".into(), "ten".into()),
        ("seed".into(), 1.into()),
    ]);
    let text = decode_request(&frame, &l).unwrap_err().to_string();
    assert!(
        text.contains("field \"max_tokens\": invalid type: string \"ten\""),
        "{text}"
    );
    let cancel = map(vec![("type", "cancel".into()), ("id", 5.into())]);
    let text = decode_request(&cancel, &l).unwrap_err().to_string();
    assert!(text.contains("field \"id\""), "{text}");
}

#[test]
fn bin_is_refused_where_str_is_specified() {
    let l = Limits::default();
    let bin = || rmpv::Value::Binary(b"Hi".to_vec());
    let mut pairs: Vec<(rmpv::Value, rmpv::Value)> = vec![
        ("type".into(), "generate".into()),
        ("id".into(), "r".into()),
        ("prompt".into(), bin()),
    ];
    let mut frame = Vec::new();
    rmpv::encode::write_value(&mut frame, &rmpv::Value::Map(pairs.clone())).unwrap();
    match decode_request(&frame, &l) {
        Err(DecodeError::Encoding(detail)) => {
            assert!(detail.contains("in field \"prompt\""), "{detail}");
            assert!(detail.contains("bin"), "{detail}");
        }
        other => panic!("bin prompt gave {other:?}"),
    }
    // As a key, and as the type.
    pairs[2] = (bin(), "Hi".into());
    frame.clear();
    rmpv::encode::write_value(&mut frame, &rmpv::Value::Map(pairs)).unwrap();
    assert!(matches!(
        decode_request(&frame, &l),
        Err(DecodeError::Encoding(_))
    ));
    let frame = map(vec![("type", rmpv::Value::Binary(b"ping".to_vec()))]);
    assert!(matches!(
        decode_request(&frame, &l),
        Err(DecodeError::Encoding(_))
    ));
}

#[test]
fn recover_id_reads_only_a_named_str_id() {
    let l = Limits::default();
    // A rejected frame with a readable id gets it echoed.
    let bin_prompt = {
        let pairs: Vec<(rmpv::Value, rmpv::Value)> = vec![
            ("type".into(), "generate".into()),
            ("id".into(), "r7".into()),
            ("prompt".into(), rmpv::Value::Binary(b"Hi".to_vec())),
        ];
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &rmpv::Value::Map(pairs)).unwrap();
        out
    };
    assert_eq!(
        zinfer_protocol::recover_id(&bin_prompt, &l).as_deref(),
        Some("r7")
    );
    // Never by position, never from bin, never from a broken frame.
    let positional = {
        let pairs: Vec<(rmpv::Value, rmpv::Value)> = vec![(0.into(), "r8".into())];
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &rmpv::Value::Map(pairs)).unwrap();
        out
    };
    assert_eq!(zinfer_protocol::recover_id(&positional, &l), None);
    let bin_id = map(vec![("id", rmpv::Value::Binary(b"r9".to_vec()))]);
    assert_eq!(zinfer_protocol::recover_id(&bin_id, &l), None);
    let truncated = map(vec![("type", "x".into()), ("id", "r10".into())]);
    assert_eq!(
        zinfer_protocol::recover_id(&truncated[..truncated.len() - 1], &l),
        None
    );
    let long = map(vec![("id", "x".repeat(257).into())]);
    assert_eq!(zinfer_protocol::recover_id(&long, &l), None);
}

#[test]
fn text_requests_are_held_to_the_prompt_limits() {
    let limits = Limits::default();
    let long = "x".repeat(limits.max_prompt_bytes + 1);
    let frame = map(vec![
        ("type", "tokenize".into()),
        ("id", "t".into()),
        ("content", long.as_str().into()),
    ]);
    let err = decode_request(&frame, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::OverLimit {
                field: "content",
                ..
            }
        ),
        "{err}"
    );
    let frame = map(vec![
        ("type", "apply_template".into()),
        ("id", "a".into()),
        ("messages", rmpv::Value::Array(Vec::new())),
    ]);
    let err = decode_request(&frame, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Invalid {
                field: "messages",
                ..
            }
        ),
        "{err}"
    );
    let ids = vec![rmpv::Value::from(1); limits.max_prompt_items + 1];
    let frame = map(vec![
        ("type", "detokenize".into()),
        ("id", "d".into()),
        ("tokens", rmpv::Value::Array(ids)),
    ]);
    let err = decode_request(&frame, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::OverLimit {
                field: "tokens",
                ..
            }
        ),
        "{err}"
    );
    // A text request needs its id, and its content: nothing to answer otherwise.
    let frame = map(vec![("type", "tokenize".into()), ("content", "x".into())]);
    assert!(decode_request(&frame, &limits).is_err());
}

#[test]
fn text_defaults_and_nil_fields() {
    let frame = map(vec![
        ("type", "tokenize".into()),
        ("id", "t".into()),
        ("content", "hi".into()),
        ("add_special", rmpv::Value::Nil),
        ("with_pieces", rmpv::Value::Nil),
    ]);
    let ClientRequest::Tokenize(request) = decode_request(&frame, &Limits::default()).unwrap()
    else {
        panic!("not a tokenize")
    };
    assert!(request.add_special && request.parse_special && !request.with_pieces);
    let frame = map(vec![
        ("type", "apply_template".into()),
        ("id", "a".into()),
        (
            "messages",
            rmpv::Value::Array(vec![rmpv::Value::Map(vec![
                ("role".into(), "user".into()),
                ("content".into(), "hi".into()),
            ])]),
        ),
    ]);
    let ClientRequest::ApplyTemplate(request) = decode_request(&frame, &Limits::default()).unwrap()
    else {
        panic!("not an apply_template")
    };
    assert!(request.add_generation_prompt);
}

#[test]
fn pieces_must_match_tokens_and_bytes_are_no_bin() {
    use zinfer_protocol::Piece;
    let reply = ClientReply::Tokenized {
        id: "t".into(),
        tokens: vec![1, 2],
        pieces: Some(vec![Piece::Text("a".into())]),
    };
    let frame = encode(&reply).unwrap();
    let err = decode::<ClientReply>(&frame, &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Invalid {
                field: "pieces",
                ..
            }
        ),
        "{err}"
    );
    // Byte pieces travel as arrays of integers, which the v1 rules allow.
    let reply = ClientReply::Tokenized {
        id: "t".into(),
        tokens: vec![1],
        pieces: Some(vec![Piece::Bytes(vec![0xe3])]),
    };
    let frame = encode(&reply).unwrap();
    assert_eq!(
        decode::<ClientReply>(&frame, &Limits::default()).unwrap(),
        reply
    );
    let value = rmpv::decode::read_value(&mut &frame[..]).unwrap();
    let pieces = value
        .as_map()
        .unwrap()
        .iter()
        .find(|(k, _)| k.as_str() == Some("pieces"));
    assert_eq!(
        pieces.map(|(_, v)| v.clone()),
        Some(rmpv::Value::Array(vec![rmpv::Value::Array(vec![
            0xe3.into()
        ])]))
    );
}

#[test]
fn tools_need_messages_valid_unique_names_and_a_choice_among_them() {
    use zinfer_protocol::{Constraint, Tool, ToolChoice};
    let chat = |edit: &dyn Fn(&mut GenerateRequest)| {
        generate(|r| {
            r.prompt = None;
            r.messages = Some(vec![ChatMessage::new("user", "Hi")]);
            r.tools = vec![Tool::function("f", serde_json::json!({"type": "object"}))];
            edit(r);
        })
    };
    let limits = Limits::default();
    decode_request(&chat(&|_| {}), &limits).unwrap();
    decode_request(&chat(&|r| r.tool_choice = ToolChoice::Required), &limits).unwrap();
    type Edit<'a> = &'a dyn Fn(&mut GenerateRequest);
    let cases: [(&str, Edit); 8] = [
        ("tools", &|r| {
            r.messages = None;
            r.prompt = Some("Hi".into());
        }),
        ("tools", &|r| r.tools[0].function.name = "has space".into()),
        ("tools", &|r| r.tools.push(r.tools[0].clone())),
        ("tools", &|r| r.tools[0].kind = "code".into()),
        ("tools", &|r| {
            r.tools[0].function.parameters = Some(serde_json::json!("object"));
        }),
        ("tool_choice", &|r| {
            r.tool_choice = ToolChoice::Function("g".into());
        }),
        ("tool_choice", &|r| {
            r.tools.clear();
            r.tool_choice = ToolChoice::Required;
        }),
        ("tool_choice", &|r| {
            r.tool_choice = ToolChoice::Required;
            r.constraint = Some(Box::new(Constraint::json_object()));
        }),
    ];
    for (field, edit) in cases {
        match decode_request(&chat(edit), &limits) {
            Err(DecodeError::Invalid { field: f, detail }) => assert_eq!(f, field, "{detail}"),
            other => panic!("{field}: expected invalid, got {other:?}"),
        }
    }
    let kwargs_on_prompt = generate(|r| {
        r.chat_template_kwargs = Some(Box::default());
    });
    match decode_request(&kwargs_on_prompt, &limits) {
        Err(DecodeError::Invalid { field, .. }) => assert_eq!(field, "chat_template_kwargs"),
        other => panic!("expected invalid, got {other:?}"),
    }
}
