//! Models loaded on demand with real processes: a router, `zinfer
//! supervisor --models-dir` offering two names of the default model, and
//! DEALER clients (and the HTTP front) asking for models no worker runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use zinfer_protocol::{
    ClientReply, ClientRequest, DoneBody, ErrorCode, FinishReason, KeepAlive, ModelInfo,
    ModelState, WorkerState,
};

use crate::control::ControlPlane;
use crate::harness::{self, Client, greedy};

/// A directory offering the default model as `a` and `b` (symlinks, so
/// the supervisor names them by their stems).
struct ModelsDir(PathBuf);

impl ModelsDir {
    fn new(tag: &str) -> ModelsDir {
        let dir =
            std::env::temp_dir().join(format!("zinfer-on-demand-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["a", "b"] {
            std::os::unix::fs::symlink(harness::model_path(), dir.join(format!("{name}.gguf")))
                .unwrap();
        }
        ModelsDir(dir)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for ModelsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn for_model(id: &str, model: &str) -> zinfer_protocol::GenerateRequest {
    let mut request = greedy(id, "The capital of France is", 6);
    request.model = Some(model.into());
    request
}

fn models(clients: &str) -> Vec<ModelInfo> {
    let client = Client::connect(clients);
    client.send(&ClientRequest::Models { id: None });
    match client.recv(Duration::from_secs(10)) {
        Some(ClientReply::Models { models, .. }) => models,
        other => panic!("models answered {other:?}"),
    }
}

fn state(clients: &str, model: &str) -> Option<ModelState> {
    models(clients)
        .into_iter()
        .find(|m| m.name == model)
        .and_then(|m| m.state)
}

fn assert_done(outcome: &harness::Outcome) {
    assert!(
        matches!(
            outcome.terminal,
            Some(ClientReply::Done {
                body: DoneBody {
                    finish_reason: FinishReason::Length | FinishReason::Stop,
                    ..
                },
                ..
            })
        ),
        "{:?}",
        outcome.terminal
    );
}

#[test]
fn sixty_four_first_requests_start_one_worker_and_all_are_answered() {
    let dir = ModelsDir::new("burst");
    let plane = ControlPlane::start(&[], &["--models-dir", &dir.path(), "--max-batch", "16"]);
    let front = harness::http_front_for(&plane.clients, &[]);
    let listed = harness::http_get(&front.addr, "/v1/models").expect("GET /v1/models");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let states: Vec<(String, String)> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("a".to_string(), "unloaded".to_string()),
            ("b".to_string(), "unloaded".to_string())
        ]
    );

    let started = Instant::now();
    let answers: Vec<harness::Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..64)
            .map(|i| {
                let clients = plane.clients.clone();
                scope.spawn(move || {
                    Client::connect(&clients).generate(for_model(&format!("first-{i}"), "a"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!(
        "64 first requests answered in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for outcome in &answers {
        assert_done(outcome);
    }
    assert_eq!(plane.metric("zinfer_router_spawns_total"), 1.0);
    assert_eq!(plane.metric("zinfer_router_cold_starts_total"), 1.0);
    let live: Vec<_> = plane
        .workers()
        .into_iter()
        .filter(|w| w.state != WorkerState::Lost)
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].models, ["a"]);
    assert_eq!(state(&plane.clients, "a"), Some(ModelState::Loaded));
    assert_eq!(state(&plane.clients, "b"), Some(ModelState::Unloaded));
    let listed = harness::http_get(&front.addr, "/v1/models").unwrap();
    assert!(
        listed.contains(r#""id":"a""#) && listed.contains(r#""state":"loaded""#),
        "{listed}"
    );
}

/// The memory a worker of the default model is expected to need before
/// any ran (the supervisor's estimate): file, KV pool, 128 MiB.
fn unmeasured_worker_bytes(kv_tokens: u64) -> u64 {
    let path = harness::model_path();
    let file = std::fs::metadata(&path).unwrap().len();
    let per_token = zinfer_probe::kv_bytes_per_token(&path, zinfer_probe::KvDtype::F32).unwrap();
    file + kv_tokens * per_token + (128 << 20)
}

#[test]
fn memory_for_one_model_evicts_the_idle_one_fails_fast_when_busy_and_idle_models_unload() {
    let dir = ModelsDir::new("budget");
    // Room for one worker of either name, not two.
    let budget = (unmeasured_worker_bytes(16_384) * 3 / 2).to_string();
    let plane = ControlPlane::start(
        &[],
        &[
            "--models-dir",
            &dir.path(),
            "--kv-tokens",
            "16384",
            "--memory-budget",
            &budget,
        ],
    );
    let client = Client::connect(&plane.clients);
    assert_done(&client.generate(for_model("a-1", "a")));

    // `a` busy: `b` cannot get the memory, and says so at once.
    let busy = Client::connect(&plane.clients);
    let mut long = for_model("a-long", "a");
    long.max_tokens = 4000;
    long.ignore_eos = true;
    busy.send(&ClientRequest::Generate(long));
    assert!(matches!(
        busy.recv(Duration::from_secs(60)),
        Some(ClientReply::Chunk { .. })
    ));
    let asked = Instant::now();
    let refused = client.generate(for_model("b-1", "b"));
    let Some(ClientReply::Error { code, message, .. }) = &refused.terminal else {
        panic!("expected overloaded, got {:?}", refused.terminal);
    };
    assert_eq!(*code, ErrorCode::Overloaded, "{message}");
    assert!(asked.elapsed() < Duration::from_secs(2), "fails fast");
    for part in [
        "model \"b\" needs about",
        "held by a (",
        "busy",
        "--memory-budget",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    busy.send(&ClientRequest::Cancel {
        id: "a-long".into(),
    });
    let ended = busy.collect(Duration::from_secs(60));
    assert!(ended.terminal.is_some());

    // `a` idle now: asking for `b` evicts it; `b` unloads 2 s after its
    // request, as the request asks.
    let mut first_b = for_model("b-2", "b");
    first_b.keep_alive = Some(KeepAlive::For(Duration::from_secs(2)));
    assert_done(&client.generate(first_b));
    assert_eq!(
        plane.metric("zinfer_router_model_unloads_total{reason=\"evicted\"}"),
        1.0
    );
    assert_eq!(state(&plane.clients, "a"), Some(ModelState::Unloaded));
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&plane.clients, "b") != Some(ModelState::Unloaded) {
        assert!(Instant::now() < deadline, "b never unloaded");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        plane.metric("zinfer_router_model_unloads_total{reason=\"idle\"}"),
        1.0
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while plane.workers().iter().any(|w| w.state != WorkerState::Lost) {
        assert!(Instant::now() < deadline, "the idle worker never exited");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The next request loads it again.
    assert_done(&client.generate(for_model("b-3", "b")));
    assert_eq!(plane.metric("zinfer_router_cold_starts_total"), 3.0);
    assert_eq!(state(&plane.clients, "b"), Some(ModelState::Loaded));
}

#[test]
fn serve_with_two_models_loads_each_on_its_first_http_request() {
    let _guard = harness::exclusive();
    let dir = ModelsDir::new("serve");
    let endpoints = harness::RouterEndpoints::fresh();
    let http = format!("127.0.0.1:{}", harness::free_port());
    let worker_metrics = harness::free_port().to_string();
    let (a, b) = (
        format!("{}/a.gguf", dir.path()),
        format!("{}/b.gguf", dir.path()),
    );
    let mut args = vec!["serve", "--threads", "1", "--kv-tokens", "2048"];
    args.extend(endpoints.args());
    args.extend([
        "--worker-metrics-port",
        &worker_metrics,
        "--model",
        &a,
        "--model",
        &b,
        "--http",
        &http,
    ]);
    let _serve = harness::spawn_until("each loaded on its first request", &args);
    assert_eq!(state(&endpoints.clients, "a"), Some(ModelState::Unloaded));
    let body = serde_json::json!({
        "model": "b",
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 4,
        "temperature": 0,
        "keep_alive": "10m",
    });
    let (status, reply) = harness::http_post(&http, "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{reply}");
    let listed = harness::http_get(&http, "/v1/models").expect("GET /v1/models");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let states: Vec<(&str, &str)> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("a", "unloaded"), ("b", "loaded")]);
    let ready = harness::http_get(&endpoints.metrics, "/ready");
    assert!(ready.is_some(), "the router is ready with models to load");
}
