//! The OpenAI-compatible front (`zinfer http`) in front of a real router
//! and worker, driven by the official `openai` Python package and by
//! `zinfer bench --compare-url`.

use std::process::Command;

use crate::harness::{Cluster, free_port, spawn_until, venv_python, zinfer};

#[test]
fn openai_python_client_and_bench_against_zinfer_http() {
    let python = venv_python("openai");
    let cluster = Cluster::start("cache_aware", 1);
    let listen = format!("127.0.0.1:{}", free_port());
    let _front = spawn_until(
        "listening on",
        &[
            "http",
            "--router",
            &cluster.clients,
            "--listen",
            &listen,
            "--served-model-name",
            "smol",
        ],
    );

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/e2e/openai_check.py"
    );
    let output = Command::new(&python)
        .args([script, &format!("http://{listen}/v1"), "smol", "unused-key"])
        .output()
        .expect("running the openai check script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("openai checks passed"),
        "the openai client checks failed:\n{stdout}\n{stderr}"
    );

    // `zinfer bench --compare-url` speaks /v1/completions: our own front
    // must serve it with the same token counts as the router.
    let output = Command::new(zinfer())
        .args([
            "bench",
            "--router",
            &cluster.clients,
            "-n",
            "3",
            "-c",
            "1",
            "--input-len",
            "16",
            "--output-len",
            "6",
            "--ignore-eos",
            "--no-progress",
            "--json",
            "--compare-url",
            &format!("http://{listen}"),
        ])
        .output()
        .expect("running zinfer bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("bench --json output");
    let compare = &report["compare"];
    assert_eq!(report["completed"], 3, "{report}");
    assert_eq!(compare["completed"], 3, "{report}");
    assert_eq!(compare["failed"], 0, "{report}");
    assert_eq!(compare["completion_tokens"], 18, "{report}");
    assert_eq!(
        compare["prompt_tokens"], report["prompt_tokens"],
        "{report}"
    );
    assert!(
        compare["cached_tokens"].is_u64(),
        "cached tokens come through: {report}"
    );
}
