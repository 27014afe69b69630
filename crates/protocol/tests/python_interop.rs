//! A stock Python msgpack client reads our golden frames and writes one the
//! Rust decoder accepts. Needs `python3` with the `msgpack` package; fails
//! (never skips) when they are missing.

#![allow(clippy::unwrap_used)]

use std::{path::PathBuf, process::Command};

use zinfer_protocol::{ChatMessage, ClientRequest, Limits, decode};

const INSTALL: &str = "this test needs python3 with msgpack: pip install msgpack";

#[test]
fn python_msgpack_reads_and_writes_protocol_frames() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    let output = Command::new("python3")
        .arg(dir.join("python/interop.py"))
        .arg(dir.join("golden"))
        .output()
        .unwrap_or_else(|e| panic!("could not run python3 ({e}); {INSTALL}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code() != Some(3),
        "{INSTALL}\npython3 said: {stderr}"
    );
    assert!(output.status.success(), "interop.py failed:\n{stderr}");

    let hex = String::from_utf8(output.stdout).unwrap();
    let frame: Vec<u8> = (0..hex.trim().len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex.trim()[i..i + 2], 16).unwrap())
        .collect();
    let ClientRequest::Generate(request) = decode(&frame, &Limits::default()).unwrap() else {
        panic!("Python's frame is not a generate")
    };
    assert_eq!(request.id, "py-1");
    assert_eq!(request.prompt, None);
    assert_eq!(
        request.messages,
        Some(vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into()
            },
            ChatMessage {
                role: "user".into(),
                content: "Grüße aus Python".into()
            },
        ])
    );
    assert_eq!(request.max_tokens, 16);
    assert_eq!(request.temperature, 0.0);
    assert_eq!(request.top_p, 0.9);
    assert_eq!(request.seed, None);
    assert_eq!(request.stop, vec!["\n".to_string()]);
    assert!(request.stream);
    assert_eq!(request.top_k, 0);
    assert_eq!(request.repetition_penalty, 1.0);
}
