//! Golden frames pin the v1 wire format: each sample in `common` must encode
//! to exactly the bytes in `tests/golden/<name>.hex`, and those bytes must
//! decode back to the sample. Changing an encoding fails here; if the change
//! is meant (a new protocol version), rerun with `ZINFER_BLESS_GOLDEN=1` to
//! rewrite the files and review the diff.

#![allow(clippy::unwrap_used)]

mod common;

use std::{collections::BTreeSet, fs, path::PathBuf};

use common::Sample;
use zinfer_protocol::{ClientRequest, Limits, WireMessage, decode, encode};

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn bless() -> bool {
    std::env::var_os("ZINFER_BLESS_GOLDEN").is_some_and(|v| v == "1")
}

fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::new();
    for line in bytes.chunks(32) {
        for byte in line {
            out.push_str(&format!("{byte:02x}"));
        }
        out.push('\n');
    }
    out
}

fn from_hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn check<T: WireMessage + PartialEq + std::fmt::Debug>(samples: Vec<Sample<T>>) {
    for Sample { name, message } in samples {
        let path = golden_dir().join(format!("{name}.hex"));
        let encoded = encode(&message).unwrap();
        if bless() {
            fs::create_dir_all(golden_dir()).unwrap();
            fs::write(&path, to_hex(&encoded)).unwrap();
        }
        let text = fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with ZINFER_BLESS_GOLDEN=1 to create it",
                path.display()
            )
        });
        let golden = from_hex(&text);
        assert_eq!(
            to_hex(&encoded),
            to_hex(&golden),
            "{name}: the encoding changed; if that is meant, bump the protocol version and rerun with ZINFER_BLESS_GOLDEN=1"
        );
        let decoded: T = decode(&golden, &Limits::default()).unwrap();
        assert_eq!(
            decoded, message,
            "{name}: golden bytes decode to another value"
        );
    }
}

#[test]
fn client_requests_match_golden() {
    check(common::client_requests());
}

#[test]
fn client_replies_match_golden() {
    check(common::client_replies());
}

#[test]
fn router_to_worker_matches_golden() {
    check(common::router_to_worker());
}

#[test]
fn worker_to_router_matches_golden() {
    check(common::worker_to_router());
}

#[test]
fn admin_requests_match_golden() {
    check(common::admin_requests());
}

#[test]
fn admin_replies_match_golden() {
    check(common::admin_replies());
}

#[test]
fn control_plane_matches_golden() {
    check(common::supervisor_to_router());
    check(common::router_to_supervisor());
    check(common::cache_transfers());
}

#[test]
fn every_golden_file_has_a_sample() {
    let samples: BTreeSet<String> = common::all_frames()
        .into_iter()
        .map(|(name, _)| format!("{name}.hex"))
        .collect();
    let files: BTreeSet<String> = fs::read_dir(golden_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".hex"))
        .collect();
    assert_eq!(files, samples, "stale or missing golden files");
}

/// Assembled by hand from the MessagePack spec, independent of our encoder.
#[test]
fn hand_assembled_frames_match_the_encoder() {
    // fixmap(1) "type" "ping"
    let ping = b"\x81\xa4type\xa4ping".to_vec();
    assert_eq!(encode(&ClientRequest::Ping { id: None }).unwrap(), ping);
    // fixmap(2) "type" "cancel" "id" "r1"
    let cancel = b"\x82\xa4type\xa6cancel\xa2id\xa2r1".to_vec();
    assert_eq!(
        encode(&ClientRequest::Cancel { id: "r1".into() }).unwrap(),
        cancel
    );
    assert_eq!(
        decode::<ClientRequest>(&cancel, &Limits::default()).unwrap(),
        ClientRequest::Cancel { id: "r1".into() }
    );
}
