//! Criterion benchmarks of the headline operations on a full cache (1M
//! tokens, warmed up with the trace): matching a 2k-token key, inserting a
//! request, evicting 1k tokens, lock + unlock.
//!
//! `cargo bench -p zinfer-cache --bench ops`

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{Server, Trace, TraceConfig, random_tokens};
use criterion::Criterion;
use rand::SeedableRng;
use rand::rngs::StdRng;
use zinfer_cache::CacheConfig;

/// Requests served before measuring: enough to fill the 1M-token pool.
const WARM_UP_REQUESTS: usize = 30_000;
const KEY_LEN: usize = 2_048;

struct Fixture {
    server: Server,
    trace: Trace,
    /// A fully cached 2,048-token key: the longest prompt plus a suffix.
    cached_key: Vec<u32>,
    rng: StdRng,
    next_request: usize,
}

impl Fixture {
    fn new() -> Self {
        let trace = Trace::generate(&TraceConfig {
            requests: WARM_UP_REQUESTS * 2,
            ..TraceConfig::default()
        });
        let mut server = Server::new(CacheConfig::default());
        server.warm_up(&trace, WARM_UP_REQUESTS);
        let mut rng = StdRng::seed_from_u64(11);
        let longest = trace.prompts.iter().max_by_key(|p| p.len()).cloned();
        let mut cached_key = longest.unwrap_or_default();
        cached_key.truncate(KEY_LEN);
        let extra = random_tokens(&mut rng, KEY_LEN - cached_key.len(), 49_152);
        cached_key.extend(extra);
        server.serve(&cached_key);
        Self {
            server,
            trace,
            cached_key,
            rng,
            next_request: WARM_UP_REQUESTS,
        }
    }

    /// A new request key: a trace prompt and a fresh suffix.
    fn fresh_key(&mut self) -> Vec<u32> {
        let i = self.next_request % self.trace.requests.len();
        self.next_request += 1;
        let mut key = Vec::new();
        self.trace.key(i, &mut key);
        key
    }

    /// Serves trace requests until the pool has at most `free` slots left,
    /// so each eviction measurement starts from a full cache.
    fn refill(&mut self, free: usize) {
        while self.server.pool.available() > free {
            let key = self.fresh_key();
            self.server.serve(&key);
        }
    }
}

fn bench_match(c: &mut Criterion, f: &mut Fixture) {
    let cache = &mut f.server.cache;
    let key = &f.cached_key;
    assert_eq!(cache.match_prefix("", key).len, KEY_LEN);
    c.bench_function("match_prefix/2k_tokens_all_cached", |b| {
        b.iter(|| black_box(cache.match_prefix("", black_box(key))))
    });
    let mut partial = key[..1_900].to_vec();
    partial.extend(random_tokens(&mut f.rng, KEY_LEN - 1_900, 49_152));
    c.bench_function("match_prefix/2k_tokens_1900_cached", |b| {
        b.iter(|| black_box(cache.match_prefix("", black_box(&partial))))
    });
}

fn bench_insert(c: &mut Criterion, f: &mut Fixture) {
    c.bench_function("insert/trace_request", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let key = f.fresh_key();
                let server = &mut f.server;
                let m = server.cache.match_prefix("", &key);
                server.cache.lock(m.node);
                let need = key.len() - m.len;
                if server.pool.available() < need {
                    let freed = server.cache.evict(need - server.pool.available());
                    let _ = server.pool.free(&freed);
                }
                if let Ok(own) = server.pool.alloc(need) {
                    let mut slots = m.slots;
                    slots.extend_from_slice(&own);
                    let start = Instant::now();
                    let out = server.cache.insert("", black_box(&key), &slots);
                    total += start.elapsed();
                    let _ = server.pool.free(&out.duplicate_slots);
                }
                let _ = server.cache.unlock(m.node);
            }
            total
        })
    });
}

fn bench_evict(c: &mut Criterion, f: &mut Fixture) {
    c.bench_function("evict/1k_tokens_from_full_cache", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                f.refill(200);
                let start = Instant::now();
                let freed = f.server.cache.evict(black_box(1_000));
                total += start.elapsed();
                let _ = f.server.pool.free(&freed);
            }
            total
        })
    });
}

fn bench_lock(c: &mut Criterion, f: &mut Fixture) {
    let handle = f.server.cache.match_prefix("", &f.cached_key).node;
    let cache = &mut f.server.cache;
    c.bench_function("lock_unlock/2k_token_path", |b| {
        b.iter(|| {
            cache.lock(black_box(handle));
            cache.unlock(black_box(handle))
        })
    });
}

fn benches(c: &mut Criterion) {
    let mut fixture = Fixture::new();
    bench_match(c, &mut fixture);
    bench_lock(c, &mut fixture);
    bench_insert(c, &mut fixture);
    bench_evict(c, &mut fixture);
}

fn main() {
    let mut criterion = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    benches(&mut criterion);
    criterion.final_summary();
}
