//! OpenAI's sampling parameters and request labels through the HTTP front
//! on the default model, with the official `openai` package.

use std::process::Command;

use crate::harness::{Cluster, venv_python};

#[test]
fn openai_sampling_parameters_through_the_http_front() {
    let python = venv_python("openai");
    let cluster = Cluster::start("cache_aware", 1);
    let listen = format!("127.0.0.1:{}", crate::harness::free_port());
    let _front = crate::harness::spawn_until(
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
        "/../../tests/e2e/openai_params.py"
    );
    let output = Command::new(&python)
        .args([script, &format!("http://{listen}/v1"), "smol"])
        .output()
        .expect("running the openai params script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("openai params checks passed"),
        "the openai params checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
