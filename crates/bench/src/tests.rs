//! Whole-bench tests: flags, plans, and short runs against fake and real
//! servers on loopback ports.

use clap::{CommandFactory, Parser};
use serde_json::Value;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(flags: &[&str]) -> BenchArgs {
    let argv = std::iter::once("bench").chain(flags.iter().copied());
    Cli::try_parse_from(argv).unwrap().bench
}

#[test]
fn flags_are_consistent_and_documented() {
    Cli::command().debug_assert();
    let help = Cli::command().render_long_help().to_string();
    for flag in [
        "--router",
        "--workload",
        "--request-rate",
        "--compare-url",
        "--no-progress",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    let defaults = args(&[]);
    assert_eq!(defaults.router, "tcp://127.0.0.1:5555");
    assert_eq!(defaults.temperature, 0.0);
    assert!(
        Cli::try_parse_from(["bench", "--workload", "file"]).is_err(),
        "file needs --file"
    );
    assert!(Cli::try_parse_from(["bench", "--output-len", "9-3"]).is_err());
    assert_eq!(
        args(&["--max-tokens", "32"]).output_len,
        LenRange { min: 32, max: 32 }
    );
}

#[test]
fn plans_pick_the_loop_and_the_budget_from_the_flags() {
    let closed = Plan::from_args(&args(&[
        "--workload",
        "shared-prefix",
        "--prefix-groups",
        "3",
        "--questions-per-prefix",
        "5",
    ]))
    .unwrap();
    assert_eq!(closed.load, Load::Closed { concurrency: 4 });
    assert_eq!(closed.stop.max_requests, Some(15), "K x M by default");
    assert_eq!(closed.config.workload, "shared-prefix");
    assert_eq!(closed.config.shared_prefix.as_deref(), Some("3x5@512"));
    let open = Plan::from_args(&args(&[
        "--request-rate",
        "2.5",
        "-c",
        "3",
        "--duration",
        "9",
    ]))
    .unwrap();
    assert_eq!(
        open.load,
        Load::Open {
            rate: 2.5,
            max_concurrency: Some(3)
        }
    );
    assert_eq!(
        open.stop,
        Stop {
            max_requests: None,
            duration: Some(Duration::from_secs(9))
        }
    );
    assert!(Plan::from_args(&args(&["--request-rate", "0"])).is_err());
    assert!(Plan::from_args(&args(&["--duration=-1"])).is_err());
}

#[test]
fn a_short_bench_against_a_fake_router_and_a_fake_openai_server() {
    let router = fakes::router();
    let openai = fakes::openai();
    let bench = args(&[
        "--router",
        &router.url,
        "--compare-url",
        &openai.url,
        "--workload",
        "random",
        "--input-len",
        "3-6",
        "--output-len",
        "3",
        "-n",
        "12",
        "-c",
        "3",
        "--seed",
        "5",
        "--json",
        "--no-progress",
    ]);
    let report = run_report(&bench, None).unwrap();
    let seen_router = router.stop();
    let seen_openai = openai.stop();

    assert_eq!(
        (report.requests, report.completed, report.failed),
        (12, 12, 0)
    );
    assert_eq!(report.completion_tokens, 36);
    assert_eq!(report.ttft.count, 12);
    assert_eq!(report.itl.count, 24, "two gaps between three chunks");
    assert!(report.ttft.p50 <= report.e2e.p50);
    let prompt_words: u64 = seen_router
        .iter()
        .map(|r| r.prompt.as_deref().unwrap().split_whitespace().count() as u64)
        .sum();
    assert_eq!(
        report.prompt_tokens, prompt_words,
        "prompt tokens come from done.usage"
    );
    assert!(report.cached_ratio.unwrap() > 0.0);

    let compare = report.compare.as_deref().unwrap();
    assert_eq!(
        (compare.backend.as_str(), compare.completed),
        ("openai", 12)
    );
    assert_eq!(compare.prompt_tokens, prompt_words);
    let mut zinfer_prompts: Vec<String> = seen_router
        .iter()
        .map(|r| r.prompt.clone().unwrap())
        .collect();
    let mut openai_prompts: Vec<String> = seen_openai
        .iter()
        .map(|b| b["prompt"].as_str().unwrap().to_string())
        .collect();
    zinfer_prompts.sort();
    openai_prompts.sort();
    assert_eq!(
        zinfer_prompts, openai_prompts,
        "the same seed sends the same workload"
    );

    let json: Value = serde_json::to_value(&report).unwrap();
    for field in [
        "requests",
        "completed",
        "failed",
        "errors_by_code",
        "duration_s",
        "request_throughput",
        "output_throughput",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "cached_ratio",
        "config",
        "compare",
    ] {
        assert!(json.get(field).is_some(), "JSON lacks {field}");
    }
    for latency in ["ttft", "itl", "e2e"] {
        for stat in ["mean", "p50", "p90", "p99"] {
            assert!(
                json[latency][stat].as_f64().unwrap() > 0.0,
                "{latency}.{stat}"
            );
        }
    }
    assert_eq!(json["config"]["seed"], 5);
    let table = report.to_table();
    assert!(
        table.contains("tcp://") && table.contains("/v1/completions"),
        "{table}"
    );
}

#[test]
fn a_shared_prefix_bench_through_the_real_router_to_a_fake_worker() {
    let config = zinfer_router::RouterConfig {
        clients: "tcp://127.0.0.1:*".into(),
        workers: "tcp://127.0.0.1:*".into(),
        control: "tcp://127.0.0.1:*".into(),
        metrics: None,
        ..zinfer_router::RouterConfig::default()
    };
    let router = zinfer_router::Router::bind(config).unwrap();
    let endpoints = router.endpoints().clone();
    let (stop_router, stopped) = crossbeam_channel::bounded(1);
    let serving = std::thread::spawn(move || router.serve(stopped));
    let worker = fakes::worker(&endpoints.workers);
    let bench = args(&[
        "--router",
        &endpoints.clients,
        "--workload",
        "shared-prefix",
        "--prefix-groups",
        "2",
        "--questions-per-prefix",
        "3",
        "--prefix-len",
        "20",
        "--input-len",
        "4",
        "-c",
        "4",
        "--model",
        "smol",
        "--no-progress",
    ]);
    // The worker registers asynchronously; retry while the router has none.
    let deadline = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let report = run_report(&bench, None).unwrap();
        if report.errors_by_code.contains_key("unavailable") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        break report;
    };
    let served = worker.stop();
    stop_router.send(()).unwrap();
    serving.join().unwrap().unwrap();
    assert_eq!(
        (report.requests, report.completed, report.failed),
        (6, 6, 0),
        "{report:?}"
    );
    assert!(served >= 6);
    assert_eq!(report.completion_tokens, 18);
    assert_eq!(report.itl.count, 12);
    // Prompts are 20 + 4 words plus "Question:" and "Answer:" lines.
    assert_eq!(report.prompt_tokens, 6 * 26);
}

#[test]
fn failures_are_counted_by_code_and_multi_turn_chats_resend_their_history() {
    let router = fakes::router();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"hello\"}\n{\"prompt\": \"FAIL me\", \"max_tokens\": 2}\n",
    )
    .unwrap();
    let file_args = [
        "--router",
        &router.url,
        "--workload",
        "file",
        "--file",
        file.to_str().unwrap(),
        "-n",
        "6",
        "--no-progress",
    ];
    let report = run_report(&args(&file_args), None).unwrap();
    assert_eq!(
        (report.requests, report.completed, report.failed),
        (6, 3, 3)
    );
    assert_eq!(report.errors_by_code.get("overloaded"), Some(&3));

    let chat_args = [
        "--router",
        &router.url,
        "--workload",
        "multi-turn",
        "--turns",
        "3",
        "--input-len",
        "2",
        "-n",
        "6",
        "-c",
        "2",
        "--no-progress",
    ];
    let report = run_report(&args(&chat_args), None).unwrap();
    assert_eq!(report.completed, 6);
    let seen = router.stop();
    let chats: Vec<&str> = seen[6..]
        .iter()
        .map(|r| r.prompt.as_deref().unwrap())
        .collect();
    let third_turns: Vec<&&str> = chats
        .iter()
        .filter(|p| p.matches("User: ").count() == 3)
        .collect();
    assert_eq!(third_turns.len(), 2, "two chats of three turns");
    for prompt in third_turns {
        assert_eq!(
            prompt.matches("\nAssistant: a b c\n").count(),
            2,
            "{prompt}"
        );
    }
}

/// A real router and a real worker (the default model, 1 thread) in this
/// process, for a short bench over real sockets.
struct RealCluster {
    clients: String,
    stop_router: crossbeam_channel::Sender<()>,
    stop_worker: crossbeam_channel::Sender<()>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl RealCluster {
    fn start() -> RealCluster {
        use zinfer_model as model;
        use zinfer_worker::{engine, metrics, server};
        let config = zinfer_router::RouterConfig {
            clients: "tcp://127.0.0.1:*".into(),
            workers: "tcp://127.0.0.1:*".into(),
            control: "tcp://127.0.0.1:*".into(),
            metrics: None,
            ..zinfer_router::RouterConfig::default()
        };
        let router = zinfer_router::Router::bind(config).unwrap();
        let endpoints = router.endpoints().clone();
        let (stop_router, router_stopped) = crossbeam_channel::bounded(1);
        let router_thread = std::thread::spawn(move || router.serve(router_stopped).unwrap());

        let path = zinfer_fetch::test_model_path().unwrap();
        let options = model::LoadOptions {
            kv_capacity: 4096,
            threads: Some(1),
            ..Default::default()
        };
        let engine = engine::Engine::start(
            model::load(&path, &options).unwrap(),
            zinfer_text::ModelTokenizer::open(&path).unwrap(),
            Default::default(),
        );
        let server_config = server::ServerConfig {
            models: vec![engine.model_name().to_string()],
            kv_capacity: engine.kv_capacity() as u64,
            max_batch: engine.max_batch() as u32,
            ..server::ServerConfig::new(endpoints.workers.clone(), "bench-test-worker")
        };
        let (stop_worker, worker_stopped) = crossbeam_channel::bounded(1);
        let worker_metrics = metrics::WorkerMetrics::new().unwrap();
        let worker_thread = std::thread::spawn(move || {
            server::run(server_config, engine, worker_metrics, worker_stopped).unwrap();
        });
        RealCluster {
            clients: endpoints.clients,
            stop_router,
            stop_worker,
            threads: vec![worker_thread, router_thread],
        }
    }

    /// Benches until the worker has registered (`unavailable` before that).
    fn bench(&self, flags: &[&str]) -> BenchReport {
        let mut all = vec!["--router", &self.clients, "--no-progress"];
        all.extend_from_slice(flags);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let report = run_report(&args(&all), None).unwrap();
            if report.errors_by_code.contains_key("unavailable") && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            return report;
        }
    }

    fn stop(self) {
        self.stop_worker.send(()).unwrap();
        self.stop_router.send(()).unwrap();
        for thread in self.threads {
            thread.join().unwrap();
        }
    }
}

#[test]
fn a_short_bench_against_a_real_router_and_worker() {
    let cluster = RealCluster::start();
    let report = cluster.bench(&[
        "--workload",
        "shared-prefix",
        "--prefix-groups",
        "2",
        "--questions-per-prefix",
        "3",
        "--prefix-len",
        "64",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "-c",
        "2",
        "--seed",
        "1",
    ]);
    cluster.stop();

    let json: Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["requests"], 6, "{json:#}");
    assert_eq!(json["completed"], 6, "{json:#}");
    assert_eq!(json["failed"], 0);
    assert_eq!(json["errors_by_code"], serde_json::json!({}));
    // Each prompt: 64 prefix words, "\nQuestion: ", 8 words, "\nAnswer:".
    let prompt_tokens = json["prompt_tokens"].as_u64().unwrap();
    assert!(
        (6 * 72..=6 * 80).contains(&prompt_tokens),
        "{prompt_tokens}"
    );
    let completion_tokens = json["completion_tokens"].as_u64().unwrap();
    assert!((6..=48).contains(&completion_tokens), "{completion_tokens}");
    let cached = json["cached_tokens"].as_u64().unwrap();
    assert!(
        cached >= 64,
        "later questions reuse their group's prefix: {cached}"
    );
    assert!(json["cached_ratio"].as_f64().unwrap() > 0.0);
    assert_eq!(json["ttft"]["count"], 6);
    assert_eq!(json["e2e"]["count"], 6);
    assert!(report.ttft.p50 > 0.0 && report.ttft.p50 <= report.e2e.p50);
    assert!(report.ttft.p99 <= report.e2e.p99);
    assert!(json["request_throughput"].as_f64().unwrap() > 0.0);
    assert!(json["output_throughput"].as_f64().unwrap() > 0.0);
    assert_eq!(json["config"]["workload"], "shared-prefix");
    assert_eq!(json["config"]["shared_prefix"], "2x3@64");
}
