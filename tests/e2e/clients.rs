//! Clients beside the harness's own: the Python module
//! `clients/python/zinfer_client.py` (and its example), and `zinfer
//! generate` configured by `ZINFER_*` environment variables alone.

use std::process::{Command, Output};

use crate::harness::{Cluster, free_port, venv_python, zinfer};

const PROMPT: &str = "The capital of France is";

fn repo_path(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Uses the module's API: stream and non-stream agree under greedy
/// sampling, `models` lists the worker's model, and errors are typed.
const MODULE_CHECK: &str = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
from zinfer_client import Client, ZinferError, ZinferTimeout

prompt, out = sys.argv[4], {}
with Client(sys.argv[2], timeout=120) as client:
    stream = client.stream(prompt, max_tokens=8, temperature=0)
    chunks = [chunk.text for chunk in stream]
    whole = client.generate(prompt, max_tokens=8, temperature=0)
    out["streamed"] = "".join(chunks)
    out["whole"] = whole.text
    out["stream_finish"] = stream.result.finish_reason
    out["finish"] = whole.finish_reason
    out["completion_tokens"] = whole.usage["completion_tokens"]
    out["models"] = [m["name"] for m in client.models()]
    try:
        client.generate(prompt, model="no-such-model")
    except ZinferError as e:
        out["unknown_model"] = [e.code, e.retryable]
    try:
        client.generate(prompt, max_tokenz=3)
    except TypeError as e:
        out["bad_field"] = str(e)
try:
    Client(sys.argv[3], connect_timeout=0.3).models()
except ZinferTimeout as e:
    out["no_router"] = str(e)
print(json.dumps(out))
"#;

#[test]
fn python_client_module_and_its_example_talk_to_a_real_router() {
    let cluster = Cluster::start("cache_aware", 1);
    let python = venv_python("client");
    let model = cluster.workers_info()[0].models[0].clone();

    let example = Command::new(&python)
        .args([
            &repo_path("clients/python/example.py"),
            "--router",
            &cluster.clients,
            "--max-tokens",
            "8",
            "--raw",
            PROMPT,
        ])
        .output()
        .expect("running the client venv's python");
    let (stdout, stderr) = text(&example);
    assert!(
        example.status.success(),
        "example failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("model: {model} (1 worker(s))")),
        "{stderr}"
    );
    assert!(
        stderr.contains("finish_reason=length") && stderr.contains("completion_tokens=8"),
        "summary missing:\n{stderr}"
    );
    assert!(!stdout.trim().is_empty(), "streamed text missing");

    let dead = format!("tcp://127.0.0.1:{}", free_port());
    let check = Command::new(&python)
        .args([
            "-c",
            MODULE_CHECK,
            &repo_path("clients/python"),
            &cluster.clients,
            &dead,
            PROMPT,
        ])
        .output()
        .expect("running the client venv's python");
    let (stdout, stderr) = text(&check);
    assert!(
        check.status.success(),
        "module check failed:\n{stdout}\n{stderr}"
    );
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(!out["whole"].as_str().unwrap().is_empty(), "{out}");
    assert_eq!(out["streamed"], out["whole"], "greedy: streamed == whole");
    assert_eq!(out["finish"], "length");
    assert_eq!(out["stream_finish"], "length");
    assert_eq!(out["completion_tokens"], 8);
    assert_eq!(out["models"], serde_json::json!([model]));
    assert_eq!(
        out["unknown_model"],
        serde_json::json!(["unknown_model", false])
    );
    assert!(
        out["bad_field"].as_str().unwrap().contains("max_tokenz"),
        "{out}"
    );
    assert!(
        out["no_router"].as_str().unwrap().contains(&dead),
        "the timeout names the endpoint: {out}"
    );
}

#[test]
fn zinfer_environment_variables_set_flags() {
    let cluster = Cluster::start("cache_aware", 1);
    let generate = |envs: &[(&str, &str)], args: &[&str]| {
        let output = Command::new(zinfer())
            .arg("generate")
            .args(args)
            .arg(PROMPT)
            .env("ZINFER_MAX_TOKENS", "5")
            .env("ZINFER_TEMPERATURE", "0")
            .env("ZINFER_JSON", "true")
            .env("ZINFER_CONNECT_TIMEOUT", "1")
            .envs(envs.iter().copied())
            .output()
            .expect("running zinfer generate");
        let (stdout, stderr) = text(&output);
        (output.status.success(), stdout, stderr)
    };

    // No flags at all: the router, the length, greedy sampling and the JSON
    // record all come from the environment.
    let (ok, stdout, stderr) = generate(&[("ZINFER_ROUTER", &cluster.clients)], &[]);
    assert!(ok, "generate failed:\n{stdout}\n{stderr}");
    let done: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap()).expect("--json via ZINFER_JSON");
    assert_eq!(done["usage"]["completion_tokens"], 5, "{done}");
    assert_eq!(done["finish_reason"], "length", "{done}");

    // The variable is really what was read: a dead endpoint in it fails,
    // naming that endpoint...
    let dead = format!("tcp://127.0.0.1:{}", free_port());
    let (ok, stdout, stderr) = generate(&[("ZINFER_ROUTER", &dead)], &[]);
    assert!(!ok, "generate reached a router at {dead}:\n{stdout}");
    assert!(stderr.contains(&dead), "{stderr}");

    // ...and a flag on the command line wins over its variable.
    let (ok, stdout, stderr) =
        generate(&[("ZINFER_ROUTER", &dead)], &["--router", &cluster.clients]);
    assert!(ok, "the flag should win:\n{stdout}\n{stderr}");
}

#[test]
fn zinfer_generate_notices_a_dropped_router_connection_at_once() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::io::Read;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let mut cluster = Cluster::start("cache_aware", 1);
    // The worker is stopped, so the request surely stays in flight (no
    // early end of sequence) until the router dies without a goodbye.
    let worker = Pid::from_raw(cluster.workers[0].1.child.id() as i32);
    kill(worker, Signal::SIGSTOP).expect("stopping the worker");
    let mut generate = Command::new(zinfer())
        .args(["generate", "--router", &cluster.clients])
        .args(["--max-tokens", "64", "--timeout", "120"])
        .arg(PROMPT)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running zinfer generate");
    let dispatched = Instant::now();
    while cluster.worker_info("w0").is_none_or(|w| w.inflight == 0) {
        assert!(
            dispatched.elapsed() < Duration::from_secs(10),
            "the request never reached the worker"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Instant::now();
    cluster.restart_router();
    let status = loop {
        if let Some(status) = generate.try_wait().expect("waiting for generate") {
            break Some(status);
        }
        if killed.elapsed() > Duration::from_secs(20) {
            let _ = generate.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = kill(worker, Signal::SIGCONT);
    let took = killed.elapsed();
    let mut stderr = String::new();
    if let Some(mut pipe) = generate.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = status.expect("generate still waiting 20 s after the router died");
    assert!(!status.success(), "generate succeeded without an answer");
    assert!(stderr.contains("dropped"), "{stderr}");
    assert!(
        took < Duration::from_secs(10),
        "noticed only after {took:?}"
    );
}
