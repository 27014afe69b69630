//! The OpenAI-compatible front (`zinfer http`) in front of a real router
//! and worker, driven by the official `openai` Python package and by
//! `zinfer bench --compare-url`.

use std::process::Command;

use crate::harness::{Cluster, http_front, openai_script, zinfer};

#[test]
fn openai_python_client_and_bench_against_zinfer_http() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = http_front(&cluster);
    openai_script(
        "openai_check.py",
        &[&front.base_url(), "smol", "unused-key"],
        "openai checks passed",
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
            &format!("http://{}", front.addr),
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
