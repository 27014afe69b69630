//! `zinfer spawned-worker`, the process a supervisor starts: it reads its
//! whole configuration on stdin and refuses a bad one with a message that
//! says what is wrong, before loading anything.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `zinfer spawned-worker` with `stdin` as its input; its exit status
/// and stderr.
fn spawned(stdin: &str) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zinfer"))
        .arg("spawned-worker")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start zinfer");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write the configuration");
    let out = child.wait_with_output().expect("wait for zinfer");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A whole configuration with `ngram` as its prompt-lookup length.
fn config(ngram: u32) -> String {
    format!(
        r#"{{"router":"tcp://127.0.0.1:1","id":"w1","device":"cpu","metrics":null,"grace_secs":1,
        "import_cache":false,"import_host":"127.0.0.1","import_from_key":null,"model":"/nonexistent.gguf",
        "curve":{{"server_key":null,"key":null}},
        "engine":{{"threads":1,"kv_tokens":64,"kv_dtype":"f32","attention_dtype":"f32","max_batch":1,
        "prefill_chunk":16,"speculative_draft":0,"speculative_ngram":{ngram},"speculative_max_batch":1,
        "draft_model":null}}}}"#
    )
}

#[test]
fn a_configuration_that_is_not_one_is_refused_by_name() {
    let (ok, stderr) = spawned("{}");
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("worker configuration is not valid") && stderr.contains("missing field"),
        "{stderr}"
    );
}

#[test]
fn settings_out_of_the_flags_ranges_are_refused_before_the_load() {
    let (ok, stderr) = spawned(&config(99));
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("ngram 99 is outside"), "{stderr}");
    assert!(!stderr.contains("nonexistent"), "{stderr}");
    // The same configuration in range gets as far as the model file.
    let (ok, stderr) = spawned(&config(3));
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("nonexistent"), "{stderr}");
}
