//! A stock Python msgpack client reads our golden frames and writes one the
//! Rust decoder accepts. Runs in the `client` test virtual environment
//! (`scripts/test-venv.sh`, made on first use); fails, never skips, when it
//! cannot be made.

#![allow(clippy::unwrap_used)]

use std::{path::PathBuf, process::Command};

use zinfer_protocol::{ChatMessage, ClientRequest, DecodeError, GenerateRequest, Limits, decode};

const INSTALL: &str = "this test needs python3 with msgpack (scripts/test-venv.sh client)";

/// The python of the `client` test virtual environment, made on first use.
fn venv_python() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = format!("{}/client-venv", env!("CARGO_TARGET_TMPDIR"));
    let output = Command::new("bash")
        .arg(root.join("scripts/test-venv.sh"))
        .args(["client", &dir])
        .output()
        .expect("running scripts/test-venv.sh (needs bash and python3)");
    assert!(
        output.status.success(),
        "scripts/test-venv.sh client could not make its venv:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[test]
fn python_msgpack_reads_and_writes_protocol_frames() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    let python = venv_python();
    let output = Command::new(&python)
        .arg(dir.join("python/interop.py"))
        .arg(dir.join("golden"))
        .output()
        .unwrap_or_else(|e| panic!("could not run {python} ({e}); {INSTALL}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code() != Some(3),
        "{INSTALL}\npython3 said: {stderr}"
    );
    assert!(output.status.success(), "interop.py failed:\n{stderr}");

    let stdout = String::from_utf8(output.stdout).unwrap();
    let mut lines = stdout.lines();
    let frame = unhex(lines.next().unwrap());
    let ClientRequest::Generate(request) = decode(&frame, &Limits::default()).unwrap() else {
        panic!("Python's frame is not a generate")
    };
    assert_eq!(request.id, "py-1");
    assert_eq!(request.prompt, None);
    assert_eq!(
        request.messages,
        Some(vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Grüße aus Python"),
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

    let mut seen = Vec::new();
    for line in lines {
        let (name, hex) = line.split_once(' ').unwrap();
        let result = decode::<ClientRequest>(&unhex(hex), &Limits::default());
        match name {
            "nil_is_absent" => assert_eq!(
                result,
                Ok(ClientRequest::Generate(GenerateRequest::from_prompt(
                    "py-2", "Hi"
                )))
            ),
            "integer_key" | "bin_prompt" => {
                assert!(
                    matches!(result, Err(DecodeError::Encoding(_))),
                    "{name}: {result:?}"
                )
            }
            "wrong_type" => {
                let text = result.unwrap_err().to_string();
                assert!(text.contains("field \"max_tokens\""), "{text}");
            }
            other => panic!("unexpected case {other}"),
        }
        seen.push(name.to_string());
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
}

fn unhex(hex: &str) -> Vec<u8> {
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}
