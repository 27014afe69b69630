//! The worker's gauges come from one engine stats snapshot and its latency
//! histograms from the engine's own `done` timings.

use zinfer_protocol::{Timings, Usage};
use zinfer_worker::engine::EngineStats;
use zinfer_worker::metrics::WorkerMetrics;

fn line<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn one_snapshot_feeds_every_gauge_and_the_preemption_counter() {
    let metrics = WorkerMetrics::new().expect("registry");
    let stats = EngineStats {
        running: 3,
        waiting: 2,
        kv_capacity: 100,
        kv_used: 25,
        kv_free: 75,
        cache_hit_tokens: 1,
        cache_query_tokens: 4,
        preemptions: 5,
        ..EngineStats::default()
    };
    metrics.observe_engine(&stats);
    // A later snapshot with the same count adds nothing.
    metrics.observe_engine(&stats);
    let text = metrics.render();
    assert_eq!(
        line(&text, "zinfer_worker_running_requests"),
        "zinfer_worker_running_requests 3"
    );
    assert_eq!(
        line(&text, "zinfer_worker_waiting_requests"),
        "zinfer_worker_waiting_requests 2"
    );
    assert_eq!(
        line(&text, "zinfer_worker_kv_cache_usage_ratio"),
        "zinfer_worker_kv_cache_usage_ratio 0.25"
    );
    assert_eq!(
        line(&text, "zinfer_worker_kv_cache_capacity_tokens"),
        "zinfer_worker_kv_cache_capacity_tokens 100"
    );
    assert_eq!(
        line(&text, "zinfer_worker_prefix_cache_hit_ratio"),
        "zinfer_worker_prefix_cache_hit_ratio 0.25"
    );
    assert_eq!(
        line(&text, "zinfer_worker_preemptions_total"),
        "zinfer_worker_preemptions_total 5"
    );
}

#[test]
fn a_finished_request_gives_one_mean_inter_token_sample() {
    let metrics = WorkerMetrics::new().expect("registry");
    let usage = Usage {
        prompt_tokens: 7,
        cached_tokens: 2,
        completion_tokens: 5,
    };
    let timings = Timings {
        queue_s: 0.5,
        prefill_s: 0.25,
        ttft_s: 1.0,
        decode_s: 2.0,
    };
    metrics.observe_done("stop", &usage, &timings);
    let text = metrics.render();
    assert_eq!(
        line(&text, "zinfer_worker_inter_token_latency_seconds_sum"),
        "zinfer_worker_inter_token_latency_seconds_sum 0.5",
        "2 s over 4 gaps"
    );
    assert_eq!(
        line(&text, "zinfer_worker_inter_token_latency_seconds_count"),
        "zinfer_worker_inter_token_latency_seconds_count 1"
    );
    assert_eq!(
        line(&text, "zinfer_worker_e2e_request_latency_seconds_sum"),
        "zinfer_worker_e2e_request_latency_seconds_sum 3"
    );
    assert_eq!(
        line(&text, "zinfer_worker_generation_tokens_total"),
        "zinfer_worker_generation_tokens_total 5"
    );
    // A one-token output has no gap to observe.
    let one = Usage {
        completion_tokens: 1,
        ..usage
    };
    metrics.observe_done("length", &one, &timings);
    let text = metrics.render();
    assert_eq!(
        line(&text, "zinfer_worker_inter_token_latency_seconds_count"),
        "zinfer_worker_inter_token_latency_seconds_count 1"
    );
    assert!(
        text.contains("zinfer_worker_requests_total{outcome=\"length\"} 1"),
        "{text}"
    );
}
