//! Prometheus metrics of the router, in a private registry, with the
//! `process_*` families (CPU seconds, resident memory, open fds) of the
//! prometheus crate's process collector on Linux, and what its `/ready`
//! probe answers; `zinfer-metrics-http` serves them.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use zinfer_metrics_http::NotReady;
pub use zinfer_metrics_http::{MetricsError, MetricsServer};

/// Every router metric. Cheap to update from the core (atomics only).
pub struct Metrics {
    registry: Registry,
    /// Terminal replies by outcome: a finish reason or an error code.
    pub(crate) requests: IntCounterVec,
    /// Requests waiting in the router queue.
    pub(crate) queue_depth: IntGauge,
    /// Sum of `running` over the workers' last load reports.
    pub(crate) running: IntGauge,
    /// Sum of `waiting` over the workers' last load reports.
    pub(crate) waiting: IntGauge,
    /// Requests in flight on workers, as the router counts them.
    pub(crate) inflight: IntGauge,
    /// Arrival at the router to first relayed chunk.
    pub(crate) ttft: Histogram,
    /// Gap between relayed chunks, per token.
    pub(crate) inter_token: Histogram,
    /// Arrival at the router to the terminal reply.
    pub(crate) e2e: Histogram,
    /// Arrival at the router to the first dispatch to a worker.
    pub(crate) queue_time: Histogram,
    /// Prompt tokens of finished requests.
    pub(crate) prompt_tokens: IntCounter,
    /// Generated tokens of finished requests.
    pub(crate) generated_tokens: IntCounter,
    /// Prompt tokens served from worker prefix caches.
    pub(crate) cached_tokens: IntCounter,
    /// Known workers by state.
    pub(crate) workers: IntGaugeVec,
    /// Routing decisions by outcome.
    pub(crate) routing: IntCounterVec,
    /// Messages the I/O loop could not send, by socket.
    pub(crate) dropped: IntCounterVec,
    /// Chunks relayed from workers to clients.
    pub(crate) relayed_chunks: IntCounter,
    /// Requests re-sent to another worker after their worker was lost.
    pub(crate) retries: IntCounter,
    /// Worker registrations refused, by reason.
    pub(crate) refused: IntCounterVec,
    /// Requests refused with `overloaded` for a per-client limit, by limit.
    pub(crate) client_limited: IntCounterVec,
    /// CURVE handshakes refused (unknown key, no CURVE, bad handshake), by
    /// socket: a refused peer gets no error frame, so this is where
    /// refusals show.
    pub(crate) auth_refusals: IntCounterVec,
    /// Worker processes the router asked supervisors to start.
    pub(crate) spawns: IntCounter,
    /// Spawns that produced no worker.
    pub(crate) spawn_failures: IntCounter,
    /// Live migrations and reloads, by outcome (ok, failed).
    pub(crate) migrations: IntCounterVec,
    /// Start of a migration to the routing switch.
    pub(crate) migration_time: Histogram,
    /// Cached tokens carried to replacement workers.
    pub(crate) migration_kv_tokens: IntCounter,
    /// Start of a drain to its last request ending.
    pub(crate) drain_time: Histogram,
    /// Supervisors connected.
    pub(crate) supervisors: IntGauge,
    /// Autoscaler decisions, by direction (up, down).
    pub(crate) autoscale: IntCounterVec,
    /// Models listed by `models`, by state (loaded, loading, unloaded).
    pub(crate) models: IntGaugeVec,
    /// Workers started to load a model on demand.
    pub(crate) cold_starts: IntCounter,
    /// A cold start's first request arriving to its worker registering.
    pub(crate) cold_start_time: Histogram,
    /// Models loaded on demand that were unloaded, by reason (idle,
    /// evicted: for another model that needed the memory).
    pub(crate) unloads: IntCounterVec,
}

fn latency_buckets() -> Vec<f64> {
    vec![
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        60.0, 120.0,
    ]
}

impl Metrics {
    /// Builds and registers every metric in a new private registry.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, label: &str| {
            let metric = IntCounterVec::new(Opts::new(name, help), &[label])?;
            registry.register(Box::new(metric.clone()))?;
            Ok::<_, prometheus::Error>(metric)
        };
        let counter = |name: &str, help: &str| {
            let metric = IntCounter::new(name, help)?;
            registry.register(Box::new(metric.clone()))?;
            Ok::<_, prometheus::Error>(metric)
        };
        let gauge = |name: &str, help: &str| {
            let metric = IntGauge::new(name, help)?;
            registry.register(Box::new(metric.clone()))?;
            Ok::<_, prometheus::Error>(metric)
        };
        let histogram = |name: &str, help: &str| {
            let metric =
                Histogram::with_opts(HistogramOpts::new(name, help).buckets(latency_buckets()))?;
            registry.register(Box::new(metric.clone()))?;
            Ok::<_, prometheus::Error>(metric)
        };
        let workers = IntGaugeVec::new(
            Opts::new("zinfer_router_workers", "Known workers by lifecycle state."),
            &["state"],
        )?;
        registry.register(Box::new(workers.clone()))?;
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let models = IntGaugeVec::new(
            Opts::new(
                "zinfer_router_models",
                "Models workers serve or supervisors offer, by state (loaded, loading, unloaded).",
            ),
            &["state"],
        )?;
        registry.register(Box::new(models.clone()))?;
        let metrics = Metrics {
            models,
            requests: counter_vec(
                "zinfer_router_requests_total",
                "Requests ended, by outcome (finish reason or error code).",
                "outcome",
            )?,
            queue_depth: gauge(
                "zinfer_router_queue_depth",
                "Requests waiting in the router queue for a worker.",
            )?,
            running: gauge(
                "zinfer_router_worker_running",
                "Sequences running on workers (sum of their last load reports).",
            )?,
            waiting: gauge(
                "zinfer_router_worker_waiting",
                "Requests waiting inside workers (sum of their last load reports).",
            )?,
            inflight: gauge(
                "zinfer_router_inflight",
                "Requests the router has dispatched to workers and not yet finished.",
            )?,
            ttft: histogram(
                "zinfer_router_time_to_first_token_seconds",
                "Arrival at the router to the first relayed chunk.",
            )?,
            inter_token: histogram(
                "zinfer_router_inter_token_latency_seconds",
                "Time between relayed chunks, divided by the tokens in the later chunk.",
            )?,
            e2e: histogram(
                "zinfer_router_request_duration_seconds",
                "Arrival at the router to the terminal reply.",
            )?,
            queue_time: histogram(
                "zinfer_router_queue_time_seconds",
                "Arrival at the router to dispatch to a worker.",
            )?,
            prompt_tokens: counter(
                "zinfer_router_prompt_tokens_total",
                "Prompt tokens of finished requests.",
            )?,
            generated_tokens: counter(
                "zinfer_router_generated_tokens_total",
                "Tokens generated for finished requests.",
            )?,
            cached_tokens: counter(
                "zinfer_router_cached_tokens_total",
                "Prompt tokens served from worker prefix caches.",
            )?,
            workers,
            routing: counter_vec(
                "zinfer_router_routing_decisions_total",
                "Routing decisions by outcome.",
                "outcome",
            )?,
            dropped: counter_vec(
                "zinfer_router_dropped_sends_total",
                "Messages the router could not send (peer gone or its queue full), by socket.",
                "socket",
            )?,
            relayed_chunks: counter(
                "zinfer_router_relayed_chunks_total",
                "Chunks relayed from workers to clients.",
            )?,
            retries: counter(
                "zinfer_router_retries_total",
                "Requests re-sent to another worker after their worker was lost.",
            )?,
            refused: counter_vec(
                "zinfer_router_refused_registrations_total",
                "Worker registrations refused, by reason (protocol, worker_id, no_model, duplicate_id).",
                "reason",
            )?,
            client_limited: counter_vec(
                "zinfer_router_client_limited_total",
                "Requests answered overloaded for a per-client limit (inflight, tokens_per_second).",
                "limit",
            )?,
            auth_refusals: counter_vec(
                "zinfer_router_auth_refusals_total",
                "Connections refused during the CURVE handshake (unknown or missing key), by socket.",
                "socket",
            )?,
            spawns: counter(
                "zinfer_router_spawns_total",
                "Worker processes the router asked supervisors to start.",
            )?,
            spawn_failures: counter(
                "zinfer_router_spawn_failures_total",
                "Spawns that produced no worker (refused, exited during load, timed out).",
            )?,
            migrations: counter_vec(
                "zinfer_router_migrations_total",
                "Live migrations and reloads, by outcome (ok, failed).",
                "outcome",
            )?,
            migration_time: histogram(
                "zinfer_router_migration_seconds",
                "Start of a migration or reload to the routing switch.",
            )?,
            migration_kv_tokens: counter(
                "zinfer_router_migration_kv_tokens_total",
                "Cached tokens (K/V) carried to replacement workers.",
            )?,
            drain_time: histogram(
                "zinfer_router_drain_seconds",
                "Start of a drain to the end of the worker's last request.",
            )?,
            supervisors: gauge(
                "zinfer_router_supervisors",
                "Supervisors connected to the control socket.",
            )?,
            autoscale: counter_vec(
                "zinfer_router_autoscale_decisions_total",
                "Autoscaler decisions, by direction (up, down).",
                "direction",
            )?,
            cold_starts: counter(
                "zinfer_router_cold_starts_total",
                "Workers started to load a model on demand (a request asked for a model no worker served).",
            )?,
            cold_start_time: histogram(
                "zinfer_router_cold_start_seconds",
                "A cold start's first request arriving to the model's first worker registering.",
            )?,
            unloads: counter_vec(
                "zinfer_router_model_unloads_total",
                "Models loaded on demand that were unloaded, by reason (idle: keep-alive over; \
                 evicted: another model needed the memory).",
                "reason",
            )?,
            registry,
        };
        for outcome in ["ok", "failed"] {
            metrics.migrations.with_label_values(&[outcome]).inc_by(0);
        }
        for state in ["loaded", "loading", "unloaded"] {
            metrics.models.with_label_values(&[state]).set(0);
        }
        for reason in ["idle", "evicted"] {
            metrics.unloads.with_label_values(&[reason]).inc_by(0);
        }
        for direction in ["up", "down"] {
            metrics.autoscale.with_label_values(&[direction]).inc_by(0);
        }
        for state in zinfer_protocol::WorkerState::ALL {
            metrics.workers.with_label_values(&[state.as_str()]).set(0);
        }
        for reason in ["protocol", "worker_id", "no_model", "duplicate_id"] {
            metrics.refused.with_label_values(&[reason]).inc_by(0);
        }
        for limit in ["inflight", "tokens_per_second"] {
            metrics.client_limited.with_label_values(&[limit]).inc_by(0);
        }
        for socket in ["clients", "workers", "control"] {
            metrics.dropped.with_label_values(&[socket]).inc_by(0);
            metrics.auth_refusals.with_label_values(&[socket]).inc_by(0);
        }
        Ok(metrics)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        if let Err(err) = TextEncoder::new().encode(&self.registry.gather(), &mut buffer) {
            tracing::error!(%err, "encoding metrics failed");
        }
        String::from_utf8_lossy(&buffer).into_owned()
    }

    /// Counts a connection refused during the CURVE handshake on `socket`.
    pub(crate) fn count_auth_refusal(&self, socket: &str) {
        self.auth_refusals.with_label_values(&[socket]).inc();
    }

    /// Counts a send the I/O loop gave up on.
    pub(crate) fn count_drop(&self, socket: &str) {
        self.dropped.with_label_values(&[socket]).inc();
    }
}

/// `/metrics` renders every metric; `/ready` is 200 while at least one
/// worker is ready to take requests or a supervisor offers a model to
/// load on demand, 503 otherwise.
impl zinfer_metrics_http::Exporter for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }

    fn ready(&self) -> Result<String, NotReady> {
        let ready = self
            .workers
            .with_label_values(&[zinfer_protocol::WorkerState::Ready.as_str()])
            .get();
        let on_demand = self.models.with_label_values(&["unloaded"]).get()
            + self.models.with_label_values(&["loading"]).get();
        if ready > 0 {
            Ok(format!("ready: {ready} worker(s)\n"))
        } else if on_demand > 0 {
            Ok(format!(
                "ready: {on_demand} model(s) offered, loaded on their first request\n"
            ))
        } else {
            Err(NotReady("not ready: no worker is ready\n".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::Arc;

    fn start(metrics: Arc<Metrics>) -> MetricsServer {
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), "router-metrics", metrics).unwrap()
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        zinfer_metrics_http::get(addr, path).unwrap()
    }

    #[test]
    fn health_and_ready_probes() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let server = start(metrics.clone());
        assert!(get(server.addr(), "/health").starts_with("HTTP/1.1 200"));
        let response = get(server.addr(), "/ready");
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        metrics.workers.with_label_values(&["ready"]).set(2);
        let response = get(server.addr(), "/ready");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("2 worker(s)"), "{response}");
        assert!(get(server.addr(), "/nope").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn http_endpoint_serves_metrics() {
        let metrics = Arc::new(Metrics::new().unwrap());
        metrics.relayed_chunks.inc_by(7);
        let server = start(metrics);
        let body = get(server.addr(), "/metrics");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            body.contains("zinfer_router_relayed_chunks_total 7"),
            "{body}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn exports_process_cpu_memory_and_fds() {
        let text = Metrics::new().unwrap().render();
        for family in [
            "# TYPE process_cpu_seconds_total counter",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_open_fds gauge",
            "# TYPE process_start_time_seconds gauge",
        ] {
            assert!(text.contains(family), "missing {family} in\n{text}");
        }
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(rss > 1e6, "a running test process uses over 1 MB: {rss}");
    }
}
