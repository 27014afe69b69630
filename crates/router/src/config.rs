//! Router settings: socket endpoints, routing policy and its knobs, limits.

use std::{fmt, net::SocketAddr, str::FromStr, time::Duration};

use zinfer_protocol::Limits;

/// Cached tokens a migration carries when neither `ctl migrate` nor the
/// router's flags say: enough for a few long system prompts, small enough
/// to move in well under a second on one host.
pub const DEFAULT_CARRY_TOKENS: u64 = 16_384;

/// How the router picks a worker for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Each request to the next worker in registration order; spreads load
    /// evenly when requests cost the same.
    RoundRobin,
    /// The worker with the fewest requests in flight plus waiting.
    LeastLoad,
    /// The worker whose approximate prefix index matches the prompt best,
    /// unless load is imbalanced (after SGLang's gateway). Reuses each
    /// worker's prefix cache, so repeated system prompts skip prefill.
    #[default]
    CacheAware,
}

impl Policy {
    /// Every policy, for help texts.
    pub const ALL: [Policy; 3] = [Policy::RoundRobin, Policy::LeastLoad, Policy::CacheAware];

    /// The name used on the command line and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::LeastLoad => "least_load",
            Policy::CacheAware => "cache_aware",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of `round_robin`, `least_load`, `cache_aware`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown routing policy {0:?}; use round_robin, least_load or cache_aware")]
pub struct ParsePolicyError(String);

impl FromStr for Policy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|policy| policy.as_str() == s)
            .ok_or_else(|| ParsePolicyError(s.to_string()))
    }
}

/// Everything `run` needs. `Default` gives the documented ports and knobs.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// Front socket endpoint clients connect to.
    pub clients: String,
    /// Back socket endpoint workers connect to.
    pub workers: String,
    /// Control socket endpoint for `zinfer ctl`; localhost by default
    /// because it has no authentication.
    pub control: String,
    /// Where to serve Prometheus `/metrics`; `None` turns it off.
    pub metrics: Option<SocketAddr>,
    /// Routing policy.
    pub policy: Policy,
    /// Load is imbalanced when max - min exceeds this (and `balance_rel`
    /// holds too); then cache-aware routing picks the least loaded worker.
    pub balance_abs: u32,
    /// Load is imbalanced when max exceeds min times this (and `balance_abs`
    /// holds too).
    pub balance_rel: f64,
    /// Cache-aware routing follows the best prefix match only when the
    /// matched share of the prompt exceeds this ratio.
    pub cache_threshold: f64,
    /// Bytes of prompt text each worker's prefix index holds before it
    /// evicts least recently used entries.
    pub index_bytes_per_worker: usize,
    /// Requests waiting in the router for a free worker; beyond it new
    /// requests get `overloaded` at once.
    pub queue_capacity: usize,
    /// Most requests in flight on one worker; `None` derives it from the
    /// worker's `max_batch` (twice that, so its batch refills without a
    /// round trip).
    pub max_inflight_per_worker: Option<u32>,
    /// Most requests one client connection (with CURVE: one client key)
    /// may have in flight (queued or running); more get `overloaded`.
    /// `None`: no limit.
    pub max_inflight_per_client: Option<u32>,
    /// Generated tokens per second one client connection (with CURVE: one
    /// client key) may use, as a token bucket holding one second's worth;
    /// a client whose bucket is empty gets `overloaded` for new requests
    /// (running ones go on). `None`: no limit.
    pub max_tokens_per_second_per_client: Option<f64>,
    /// How often the router heartbeats each worker.
    pub heartbeat_interval: Duration,
    /// A worker silent for this long is lost (3 missed heartbeats).
    pub heartbeat_expiry: Duration,
    /// How long a lost worker stays listed by `zinfer ctl workers`.
    pub lost_retention: Duration,
    /// Size limits on every decoded frame (ZMQ_MAXMSGSIZE too).
    pub limits: Limits,
    /// Longest the I/O loop sleeps in one poll; it bounds how long a
    /// shutdown request waits. Timers do not depend on it: the loop
    /// sleeps until the core's `poll_timeout` when that is sooner.
    pub poll_interval: Duration,
    /// ZeroMQ send/receive high-water mark per peer, in messages.
    pub hwm: i32,
    /// How long a spawned worker may take to load and register.
    pub spawn_timeout: Duration,
    /// Cached tokens a migration carries when `migrate` does not say.
    pub carry_tokens: u64,
    /// How long a migration waits for the cache transfer before switching
    /// routing without it.
    pub carry_timeout: Duration,
    /// Longest pause after failed spawns of a model before it may be
    /// spawned again (the pause doubles per failure from 1 s).
    pub spawn_backoff_max: Duration,
    /// How long a model loaded on demand stays loaded after its last
    /// request, when neither the request nor the model's offer says.
    pub keep_alive: zinfer_protocol::KeepAlive,
    /// Adds and removes workers by load; `None` leaves counts to `scale`.
    pub autoscale: Option<AutoscaleConfig>,
    /// CURVE encryption and allow-lists on all three sockets; `None`:
    /// plain connections (then the control socket must be on loopback).
    pub curve: Option<crate::CurveConfig>,
    /// Makes the ids of spawned workers unique to this router process
    /// (random by default), so a restarted router never reuses the id of a
    /// worker its predecessor started.
    pub spawn_nonce: u32,
}

/// When the autoscaler adds or removes a worker of a model a supervisor
/// offers.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscaleConfig {
    /// Fewest workers per model.
    pub min_workers: u32,
    /// Most workers per model.
    pub max_workers: u32,
    /// Add a worker when, per worker, this many requests wait (in the
    /// router queue and inside workers) for all of `up_window`.
    pub queue_per_worker: f64,
    /// How long the queue must stay above the threshold.
    pub up_window: Duration,
    /// Remove a worker after this long with nothing waiting and at least
    /// one worker idle.
    pub idle_window: Duration,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            min_workers: 1,
            max_workers: 4,
            queue_per_worker: 4.0,
            up_window: Duration::from_secs(10),
            idle_window: Duration::from_secs(60),
        }
    }
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            clients: "tcp://*:5555".into(),
            workers: "tcp://*:5556".into(),
            control: "tcp://127.0.0.1:5557".into(),
            metrics: Some(SocketAddr::from(([0, 0, 0, 0], 9100))),
            policy: Policy::CacheAware,
            balance_abs: 32,
            balance_rel: 1.5,
            cache_threshold: 0.5,
            index_bytes_per_worker: 4 << 20,
            queue_capacity: 1024,
            max_inflight_per_worker: None,
            max_inflight_per_client: None,
            max_tokens_per_second_per_client: None,
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_expiry: Duration::from_secs(3),
            lost_retention: Duration::from_secs(60),
            limits: Limits::default(),
            poll_interval: Duration::from_millis(100),
            hwm: 100_000,
            spawn_timeout: Duration::from_secs(300),
            carry_tokens: DEFAULT_CARRY_TOKENS,
            carry_timeout: Duration::from_secs(60),
            spawn_backoff_max: Duration::from_secs(60),
            keep_alive: zinfer_protocol::DEFAULT_KEEP_ALIVE,
            autoscale: None,
            curve: None,
            spawn_nonce: std::process::id()
                ^ std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for policy in Policy::ALL {
            assert_eq!(policy.to_string().parse::<Policy>(), Ok(policy));
        }
        assert_eq!(Policy::default(), Policy::CacheAware);
        let err = "fastest".parse::<Policy>().unwrap_err();
        assert!(err.to_string().contains("cache_aware"));
    }
}
