//! Every message of every direction survives encode -> decode, and every
//! `type` a direction accepts has a sample.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use common::Sample;
use zinfer_protocol::{
    ClientReply, ClientRequest, ErrorCode, GenerateRequest, Limits, PROTOCOL_VERSION, WireMessage,
    WorkerToRouter, decode, encode,
};

/// Round-trips every sample and returns the `type` strings seen.
fn round_trip<T: WireMessage + PartialEq + std::fmt::Debug>(
    samples: Vec<Sample<T>>,
) -> BTreeSet<String> {
    let limits = Limits::default();
    let mut types = BTreeSet::new();
    for Sample { name, message } in samples {
        let frame = encode(&message).unwrap();
        let back: T = decode(&frame, &limits).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, message, "{name}");
        let value = rmpv::decode::read_value(&mut &frame[..]).unwrap();
        let kind = value
            .as_map()
            .and_then(|map| map.iter().find(|(k, _)| k.as_str() == Some("type")))
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name}: no string \"type\" in {value}"));
        let case = name.split_once('.').unwrap().1;
        assert!(
            case == kind || case.starts_with(&format!("{kind}_")),
            "{name} encodes as type {kind:?}"
        );
        types.insert(kind.to_string());
    }
    types
}

fn assert_covers<T: WireMessage>(seen: BTreeSet<String>) {
    let expected: BTreeSet<String> = T::TYPES.iter().map(|t| t.to_string()).collect();
    assert_eq!(seen, expected, "samples must cover every type in TYPES");
}

#[test]
fn client_requests_round_trip() {
    assert_covers::<ClientRequest>(round_trip(common::client_requests()));
}

#[test]
fn client_replies_round_trip() {
    assert_covers::<zinfer_protocol::ClientReply>(round_trip(common::client_replies()));
}

#[test]
fn router_to_worker_round_trips() {
    assert_covers::<zinfer_protocol::RouterToWorker>(round_trip(common::router_to_worker()));
}

#[test]
fn worker_to_router_round_trips() {
    assert_covers::<zinfer_protocol::WorkerToRouter>(round_trip(common::worker_to_router()));
}

#[test]
fn admin_requests_round_trip() {
    assert_covers::<zinfer_protocol::AdminRequest>(round_trip(common::admin_requests()));
}

#[test]
fn admin_replies_round_trip() {
    assert_covers::<zinfer_protocol::AdminReply>(round_trip(common::admin_replies()));
}

#[test]
fn control_plane_round_trips() {
    assert_covers::<zinfer_protocol::SupervisorToRouter>(
        round_trip(common::supervisor_to_router()),
    );
    assert_covers::<zinfer_protocol::RouterToSupervisor>(
        round_trip(common::router_to_supervisor()),
    );
    assert_covers::<zinfer_protocol::CacheTransfer>(round_trip(common::cache_transfers()));
}

/// Builds a frame from `(key, value)` pairs the way another language would.
fn frame(pairs: Vec<(&str, rmpv::Value)>) -> Vec<u8> {
    let map = pairs.into_iter().map(|(k, v)| (k.into(), v)).collect();
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &rmpv::Value::Map(map)).unwrap();
    out
}

#[test]
fn omitted_generate_fields_take_their_documented_defaults() {
    let bytes = frame(vec![
        ("type", "generate".into()),
        ("id", "a".into()),
        ("prompt", "Hi".into()),
    ]);
    let decoded: ClientRequest = decode(&bytes, &Limits::default()).unwrap();
    assert_eq!(
        decoded,
        ClientRequest::Generate(GenerateRequest::from_prompt("a", "Hi"))
    );
    let ClientRequest::Generate(request) = decoded else {
        unreachable!()
    };
    assert_eq!(request.max_tokens, 128);
    assert_eq!(request.temperature, 1.0);
    assert_eq!(request.top_p, 1.0);
    assert_eq!(request.top_k, 0);
    assert_eq!(request.min_p, 0.0);
    assert_eq!(request.repetition_penalty, 1.0);
    assert!(request.stream);
    assert_eq!(request.priority, 0);
    assert_eq!((request.seed, request.deadline_ms), (None, None));
}

#[test]
fn version_one_unknown_fields_nil_options_and_float64_are_accepted() {
    // What a Python client typically sends: floats as float64, ints where
    // floats are expected, nil for absent options, and `v`.
    let bytes = frame(vec![
        ("v", 1.into()),
        ("type", "generate".into()),
        ("id", "a".into()),
        ("prompt", "Hi".into()),
        ("temperature", rmpv::Value::F64(0.5)),
        ("top_p", 1.into()),
        ("seed", rmpv::Value::Nil),
        ("future_field", vec![rmpv::Value::from(1)].into()),
    ]);
    let ClientRequest::Generate(request) = decode(&bytes, &Limits::default()).unwrap() else {
        panic!("not a generate")
    };
    assert_eq!(request.temperature, 0.5);
    assert_eq!(request.top_p, 1.0);
    assert_eq!(request.seed, None);
    assert_eq!(PROTOCOL_VERSION, 1);
}

#[test]
fn error_codes_have_stable_names_and_retry_rules() {
    let names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        names,
        [
            "bad_request",
            "unknown_model",
            "overloaded",
            "unavailable",
            "prompt_too_long",
            "worker_lost",
            "deadline",
            "internal"
        ]
    );
    for code in ErrorCode::ALL {
        let value = rmpv::decode::read_value(&mut &encode(&code).unwrap()[..]).unwrap();
        assert_eq!(value.as_str(), Some(code.as_str()));
        assert_eq!(code.to_string(), code.as_str());
    }
    let retryable: Vec<&str> = ErrorCode::ALL
        .iter()
        .filter(|c| c.retryable())
        .map(|c| c.as_str())
        .collect();
    assert_eq!(retryable, ["overloaded", "unavailable", "worker_lost"]);
}

/// The router forwards a worker's `chunk` and `done` bodies as they came:
/// each worker frame's body, put in a client reply, decodes from the
/// client's frame unchanged, and the two frames differ only in the id
/// (and `done`'s `worker`).
#[test]
fn worker_and_client_replies_carry_the_same_bodies() {
    let limits = Limits::default();
    let forwarded = |frame: &[u8]| -> ClientReply {
        match decode::<WorkerToRouter>(frame, &limits).unwrap() {
            WorkerToRouter::Chunk { body, .. } => ClientReply::Chunk {
                id: "r".into(),
                body,
            },
            WorkerToRouter::Done { mut body, .. } => {
                body.worker = Some("w".into());
                ClientReply::Done {
                    id: "r".into(),
                    body,
                }
            }
            other => panic!("not a chunk or done: {other:?}"),
        }
    };
    let mut checked = 0;
    for Sample { name, message } in common::worker_to_router() {
        if !matches!(
            message,
            WorkerToRouter::Chunk { .. } | WorkerToRouter::Done { .. }
        ) {
            continue;
        }
        let reply = forwarded(&encode(&message).unwrap());
        let back: ClientReply = decode(&encode(&reply).unwrap(), &limits).unwrap();
        assert_eq!(back, reply, "{name}");
        let mut worker = rmpv::decode::read_value(&mut &encode(&message).unwrap()[..]).unwrap();
        let mut client = rmpv::decode::read_value(&mut &encode(&reply).unwrap()[..]).unwrap();
        for (value, drop) in [
            (&mut worker, &["rid"][..]),
            (&mut client, &["id", "worker"]),
        ] {
            if let rmpv::Value::Map(entries) = value {
                entries.retain(|(k, _)| !drop.contains(&k.as_str().unwrap()));
            }
        }
        assert_eq!(worker, client, "{name}: the bodies differ on the wire");
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} chunk and done samples");
}
