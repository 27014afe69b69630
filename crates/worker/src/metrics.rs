//! The worker's Prometheus metrics and the HTTP endpoint that serves them.
//!
//! Names follow Prometheus conventions: `zinfer_worker_` prefix (the router
//! uses `zinfer_router_`), base units (seconds, tokens), `_total` on counters.
//! `zinfer_worker_info{model,device}` (always 1) names what the worker
//! serves, for joins (`* on(instance) group_left(model) zinfer_worker_info`);
//! the `process_*` families (CPU seconds, resident memory, open fds) come
//! from the prometheus crate's process collector.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus::{
    CounterVec, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use zinfer_metrics_http::{MetricsError, MetricsServer};

/// Latency buckets in seconds, from 1 ms to 2 minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Everything a worker exports.
#[derive(Clone)]
pub struct WorkerMetrics {
    registry: Registry,
    /// Finished requests by outcome (finish reason or error code).
    pub requests: IntCounterVec,
    /// Sequences in the running batch.
    pub running: IntGauge,
    /// Requests waiting for admission.
    pub waiting: IntGauge,
    /// Arrival to first token.
    pub ttft: Histogram,
    /// Mean time between consecutive tokens, one sample per request.
    pub inter_token: Histogram,
    /// Arrival to terminal message.
    pub e2e: Histogram,
    /// Waiting before admission.
    pub queue_time: Histogram,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: IntCounter,
    /// Generated tokens of finished requests.
    pub generation_tokens: IntCounter,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: IntCounter,
    /// Fraction of the KV pool in use.
    pub kv_usage: Gauge,
    /// KV pool capacity in tokens.
    pub kv_capacity: IntGauge,
    /// Prefix-cache hit ratio over all prompt tokens looked up since start.
    pub prefix_hit_ratio: Gauge,
    /// Sequences preempted for lack of KV slots.
    pub preemptions: IntCounter,
    /// Messages to the router that could not be sent.
    pub dropped_sends: IntCounter,
    /// Engine step time by phase (`plan`, `draft`, `forward`, `sample`,
    /// `rest`),
    /// seconds; fed by [`WorkerMetrics::observe_engine`].
    pub step_phases: CounterVec,
    /// Speculative decoding's draft tokens, `drafted` (fed for checking)
    /// and `accepted` (each one a decode step saved); fed by
    /// [`WorkerMetrics::observe_engine`].
    pub speculative_tokens: IntCounterVec,
    /// 1 for the served model and device; set by [`WorkerMetrics::set_info`].
    info: IntGaugeVec,
}

impl WorkerMetrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let histogram = |name: &str, help: &str| -> Result<Histogram, MetricsError> {
            let h = Histogram::with_opts(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
            )?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        let counter = |name: &str, help: &str| -> Result<IntCounter, MetricsError> {
            let c = IntCounter::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let int_gauge = |name: &str, help: &str| -> Result<IntGauge, MetricsError> {
            let g = IntGauge::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let gauge = |name: &str, help: &str| -> Result<Gauge, MetricsError> {
            let g = Gauge::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let requests = IntCounterVec::new(
            Opts::new(
                "zinfer_worker_requests_total",
                "Finished requests by outcome (finish reason or error code).",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        let info = IntGaugeVec::new(
            Opts::new(
                "zinfer_worker_info",
                "Always 1; its labels name the served model and the device.",
            ),
            &["model", "device"],
        )?;
        registry.register(Box::new(info.clone()))?;
        let step_phases = CounterVec::new(
            Opts::new(
                "zinfer_worker_step_phase_seconds_total",
                "Engine step time by phase: plan (scheduler and batch layout), draft (draft \
                 model), forward (model), sample (masks and samplers), rest (events, \
                 detokenizing).",
            ),
            &["phase"],
        )?;
        registry.register(Box::new(step_phases.clone()))?;
        let speculative_tokens = IntCounterVec::new(
            Opts::new(
                "zinfer_worker_speculative_tokens_total",
                "Speculative decoding's draft tokens: drafted (checked by the model) and \
                 accepted (the model agreed; each saved a decode step).",
            ),
            &["kind"],
        )?;
        registry.register(Box::new(speculative_tokens.clone()))?;
        register_process_collector(&registry)?;
        Ok(WorkerMetrics {
            info,
            requests,
            step_phases,
            speculative_tokens,
            running: int_gauge(
                "zinfer_worker_running_requests",
                "Sequences in the running batch.",
            )?,
            waiting: int_gauge(
                "zinfer_worker_waiting_requests",
                "Requests waiting for admission.",
            )?,
            ttft: histogram(
                "zinfer_worker_time_to_first_token_seconds",
                "Time from arrival to the first generated token.",
            )?,
            inter_token: histogram(
                "zinfer_worker_inter_token_latency_seconds",
                "Mean time between consecutive generated tokens of one request.",
            )?,
            e2e: histogram(
                "zinfer_worker_e2e_request_latency_seconds",
                "Time from arrival to the terminal message.",
            )?,
            queue_time: histogram(
                "zinfer_worker_queue_time_seconds",
                "Time a request waited before admission.",
            )?,
            prompt_tokens: counter(
                "zinfer_worker_prompt_tokens_total",
                "Prompt tokens processed.",
            )?,
            generation_tokens: counter(
                "zinfer_worker_generation_tokens_total",
                "Tokens generated.",
            )?,
            cached_tokens: counter(
                "zinfer_worker_cached_tokens_total",
                "Prompt tokens served from the prefix cache.",
            )?,
            kv_usage: gauge(
                "zinfer_worker_kv_cache_usage_ratio",
                "Fraction of KV slots in use.",
            )?,
            kv_capacity: int_gauge(
                "zinfer_worker_kv_cache_capacity_tokens",
                "KV pool capacity in tokens.",
            )?,
            prefix_hit_ratio: gauge(
                "zinfer_worker_prefix_cache_hit_ratio",
                "Prompt tokens served from the prefix cache over prompt tokens looked up.",
            )?,
            preemptions: counter(
                "zinfer_worker_preemptions_total",
                "Sequences preempted for lack of KV slots.",
            )?,
            dropped_sends: counter(
                "zinfer_worker_dropped_sends_total",
                "Messages to the router that could not be sent.",
            )?,
            registry,
        })
    }

    /// Feeds the gauges (and the preemption and step phase counters) from
    /// one engine stats snapshot, so they all describe the same moment.
    pub fn observe_engine(&self, stats: &crate::engine::EngineStats) {
        self.running.set(stats.running as i64);
        self.waiting.set(stats.waiting as i64);
        self.kv_capacity.set(stats.kv_capacity as i64);
        let kv_total = (stats.kv_used + stats.kv_free).max(1);
        self.kv_usage.set(stats.kv_used as f64 / kv_total as f64);
        if stats.cache_query_tokens > 0 {
            self.prefix_hit_ratio
                .set(stats.cache_hit_tokens as f64 / stats.cache_query_tokens as f64);
        }
        let seen = self.preemptions.get();
        if stats.preemptions > seen {
            self.preemptions.inc_by(stats.preemptions - seen);
        }
        for (phase, total) in [
            ("plan", stats.plan_s),
            ("draft", stats.draft_s),
            ("forward", stats.forward_s),
            ("sample", stats.sample_s),
            ("rest", stats.rest_s),
        ] {
            let counter = self.step_phases.with_label_values(&[phase]);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
        for (kind, total) in [
            ("drafted", stats.draft_tokens),
            ("accepted", stats.accepted_draft_tokens),
        ] {
            let counter = self.speculative_tokens.with_label_values(&[kind]);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
    }

    /// Counts a finished request and observes its latencies, all measured
    /// by the engine (its `done` timings): one source for the histograms.
    /// Inter-token latency is the request's mean gap between tokens.
    pub fn observe_done(
        &self,
        outcome: &str,
        usage: &zinfer_protocol::Usage,
        timings: &zinfer_protocol::Timings,
    ) {
        self.requests.with_label_values(&[outcome]).inc();
        self.ttft.observe(timings.ttft_s);
        self.queue_time.observe(timings.queue_s);
        self.e2e.observe(timings.ttft_s + timings.decode_s);
        if usage.completion_tokens > 1 {
            let gaps = f64::from(usage.completion_tokens - 1);
            self.inter_token.observe(timings.decode_s / gaps);
        }
        self.prompt_tokens.inc_by(u64::from(usage.prompt_tokens));
        self.generation_tokens
            .inc_by(u64::from(usage.completion_tokens));
        self.cached_tokens.inc_by(u64::from(usage.cached_tokens));
    }

    /// Labels `zinfer_worker_info` with the model and device now served
    /// (replacing any earlier pair).
    pub fn set_info(&self, model: &str, device: &str) {
        self.info.reset();
        self.info.with_label_values(&[model, device]).set(1);
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// Adds the `process_*` families of this process (Linux only: they are
/// read from /proc).
fn register_process_collector(registry: &Registry) -> Result<(), MetricsError> {
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    #[cfg(not(target_os = "linux"))]
    let _ = registry;
    Ok(())
}

/// Serves `GET /metrics` from `render`, and the probes `GET /health` and
/// `GET /ready` (any other path: 404), on its own thread until the
/// returned server is dropped.
pub fn serve(
    addr: SocketAddr,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> Result<MetricsServer, MetricsError> {
    MetricsServer::start(addr, "metrics-http", Arc::new(Loaded(render)))
}

/// A loaded worker's exports.
struct Loaded(Arc<dyn Fn() -> String + Send + Sync>);

impl zinfer_metrics_http::Exporter for Loaded {
    fn render(&self) -> String {
        (self.0)()
    }

    /// The listener starts once the model is loaded, so a worker that
    /// answers at all can serve: both probes pass.
    fn ready(&self) -> Result<String, zinfer_metrics_http::NotReady> {
        Ok("ready: model loaded\n".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_metrics_and_probes() {
        let server = serve(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(|| "zinfer_worker_x 1\n".to_string()),
        )
        .unwrap();
        let addr = server.addr();
        let get = |path: &str| zinfer_metrics_http::get(addr, path).unwrap();
        assert!(get("/metrics").contains("zinfer_worker_x 1"));
        assert!(get("/health").starts_with("HTTP/1.1 200"));
        let ready = get("/ready");
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
        assert!(ready.ends_with("ready: model loaded\n"), "{ready}");
        assert!(get("/other").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn renders_every_family_in_text_format() {
        let metrics = WorkerMetrics::new().unwrap();
        metrics.requests.with_label_values(&["stop"]).inc();
        metrics.ttft.observe(0.05);
        metrics.kv_usage.set(0.25);
        metrics.set_info("old", "cpu");
        metrics.set_info("smollm2-135m", "cpu");
        let text = metrics.render();
        assert!(!text.contains("model=\"old\""), "{text}");
        for name in [
            "zinfer_worker_info{device=\"cpu\",model=\"smollm2-135m\"} 1",
            #[cfg(target_os = "linux")]
            "process_resident_memory_bytes",
            #[cfg(target_os = "linux")]
            "process_cpu_seconds_total",
            #[cfg(target_os = "linux")]
            "process_open_fds",
            "zinfer_worker_requests_total{outcome=\"stop\"} 1",
            "zinfer_worker_time_to_first_token_seconds_bucket",
            "zinfer_worker_kv_cache_usage_ratio 0.25",
            "# TYPE zinfer_worker_preemptions_total counter",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn step_phases_follow_the_engine_totals() {
        let metrics = WorkerMetrics::new().unwrap();
        let mut stats = crate::engine::EngineStats {
            plan_s: 0.25,
            forward_s: 2.0,
            sample_s: 0.5,
            rest_s: 0.125,
            draft_tokens: 40,
            accepted_draft_tokens: 30,
            ..Default::default()
        };
        metrics.observe_engine(&stats);
        stats.forward_s = 3.0;
        stats.draft_tokens = 48;
        metrics.observe_engine(&stats);
        let text = metrics.render();
        for name in [
            "# TYPE zinfer_worker_step_phase_seconds_total counter",
            "zinfer_worker_step_phase_seconds_total{phase=\"plan\"} 0.25",
            "zinfer_worker_step_phase_seconds_total{phase=\"forward\"} 3",
            "zinfer_worker_step_phase_seconds_total{phase=\"sample\"} 0.5",
            "zinfer_worker_step_phase_seconds_total{phase=\"rest\"} 0.125",
            "zinfer_worker_speculative_tokens_total{kind=\"drafted\"} 48",
            "zinfer_worker_speculative_tokens_total{kind=\"accepted\"} 30",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
