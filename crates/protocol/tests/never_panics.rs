//! Whatever bytes arrive, `decode` returns `Ok` or a typed `Err`; it never
//! panics. A frame that decodes re-encodes to a frame that decodes to the
//! same bytes again (checked inside `decode_as_every_direction`).

#![allow(clippy::unwrap_used)]

mod common;

use proptest::prelude::*;
use zinfer_protocol::{ClientRequest, GenerateRequest, Limits, decode, encode};

fn limits() -> Vec<Limits> {
    vec![
        Limits::default(),
        Limits {
            max_depth: 3,
            max_prompt_bytes: 8,
            max_prompt_items: 2,
            max_stop: 1,
            max_stop_bytes: 2,
            max_stop_token_ids: 1,
            max_tokens_cap: 10,
            max_name_bytes: 4,
            ..Limits::default()
        },
    ]
}

fn check(frame: &[u8]) {
    for limits in limits() {
        let _ = common::decode_as_every_direction(frame, &limits);
    }
}

/// One edit of a valid frame.
#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Set { at: usize, byte: u8 },
    Insert { at: usize, byte: u8 },
    Remove { at: usize },
    Truncate { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (at, any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        // Markers that declare lengths are the interesting bytes to insert.
        (
            at,
            prop_oneof![
                Just(0xdcu8),
                Just(0xdd),
                Just(0xde),
                Just(0xdf),
                Just(0xdb),
                any::<u8>()
            ]
        )
            .prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        at.prop_map(|at| Mutation::Remove { at }),
        at.prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn apply(frame: &mut Vec<u8>, mutation: &Mutation) {
    let len = frame.len();
    match *mutation {
        Mutation::Flip { at, bit } => frame[at % len] ^= 1 << bit,
        Mutation::Set { at, byte } => frame[at % len] = byte,
        Mutation::Insert { at, byte } => frame.insert(at % (len + 1), byte),
        Mutation::Remove { at } if len > 1 => {
            frame.remove(at % len);
        }
        Mutation::Remove { .. } => {}
        Mutation::Truncate { at } => frame.truncate(at % len),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(frame in prop::collection::vec(any::<u8>(), 0..256)) {
        check(&frame);
    }

    #[test]
    fn arbitrary_bytes_after_a_map_marker_never_panic(
        marker in prop_oneof![0x80u8..=0x8f, Just(0xde), Just(0xdf)],
        rest in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut frame = vec![marker];
        frame.extend(rest);
        check(&frame);
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec(mutation(), 1..4),
    ) {
        let frames = common::all_frames();
        let mut frame = frames[pick.index(frames.len())].1.clone();
        for edit in &edits {
            if frame.is_empty() {
                break;
            }
            apply(&mut frame, edit);
        }
        check(&frame);
    }
}

fn generate_request() -> impl Strategy<Value = GenerateRequest> {
    (
        "[a-z0-9-]{0,12}",
        prop::option::of(".{0,40}"),
        prop::option::of(prop::collection::vec(any::<u32>(), 1..8)),
        0u32..=32_768,
        0.0f32..=2.0,
        0.01f32..=1.0,
        any::<Option<u64>>(),
        prop::collection::vec("[a-z]{1,4}", 0..3),
        any::<bool>(),
        any::<i32>(),
    )
        .prop_map(
            |(id, prompt, tokens, max_tokens, temperature, top_p, seed, stop, stream, priority)| {
                let mut request = GenerateRequest::from_prompt(id, "");
                request.prompt = prompt;
                request.tokens = if request.prompt.is_some() {
                    None
                } else {
                    tokens.or(Some(vec![1]))
                };
                request.max_tokens = max_tokens;
                request.temperature = temperature;
                request.top_p = top_p;
                request.seed = seed;
                request.stop = stop;
                request.stream = stream;
                request.priority = priority;
                request
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn valid_generate_requests_round_trip(request in generate_request()) {
        let message = ClientRequest::Generate(request);
        let frame = encode(&message).unwrap();
        prop_assert_eq!(decode::<ClientRequest>(&frame, &Limits::default()).unwrap(), message);
    }
}
