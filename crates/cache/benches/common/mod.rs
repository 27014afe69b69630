//! The benchmark workload shared by the trace and criterion benches:
//! requests over shared system prompts, served the way the engine does it.
// Each bench binary uses only part of this module.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zinfer_cache::{CacheConfig, RadixCache, TokenPool};

/// Shape of the synthetic trace (the numbers by default).
#[derive(Clone, Debug)]
pub(crate) struct TraceConfig {
    pub(crate) prompts: usize,
    pub(crate) requests: usize,
    pub(crate) prompt_len: (usize, usize),
    pub(crate) suffix_len: (usize, usize),
    /// Zipf exponent for which prompt a request uses (tuned so the hit-token
    /// ratio comes out near SGLang's 0.82 on the same shape).
    pub(crate) zipf_s: f64,
    pub(crate) vocab: u32,
    pub(crate) seed: u64,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            prompts: 1_000,
            requests: 100_000,
            prompt_len: (200, 2_000),
            suffix_len: (20, 200),
            zipf_s: 1.0,
            vocab: 49_152,
            seed: 7,
        }
    }
}

/// KV pool size of the benchmark, in tokens.
pub(crate) const CAPACITY: usize = 1_000_000;

/// The generated trace: prompts, and per request a prompt and a suffix.
pub(crate) struct Trace {
    pub(crate) prompts: Vec<Vec<u32>>,
    pub(crate) requests: Vec<(usize, Vec<u32>)>,
}

impl Trace {
    pub(crate) fn generate(config: &TraceConfig) -> Self {
        let mut rng = StdRng::seed_from_u64(config.seed);
        let prompts = (0..config.prompts)
            .map(|_| {
                let len = rng.random_range(config.prompt_len.0..=config.prompt_len.1);
                random_tokens(&mut rng, len, config.vocab)
            })
            .collect();
        let zipf = Zipf::new(config.prompts, config.zipf_s);
        let requests = (0..config.requests)
            .map(|_| {
                let prompt = zipf.sample(&mut rng);
                let len = rng.random_range(config.suffix_len.0..=config.suffix_len.1);
                (prompt, random_tokens(&mut rng, len, config.vocab))
            })
            .collect();
        Self { prompts, requests }
    }

    /// The full key of request `i`: its prompt, then its suffix.
    pub(crate) fn key(&self, i: usize, key: &mut Vec<u32>) {
        let (prompt, suffix) = &self.requests[i];
        key.clear();
        key.extend_from_slice(&self.prompts[*prompt]);
        key.extend_from_slice(suffix);
    }
}

pub(crate) fn random_tokens(rng: &mut StdRng, len: usize, vocab: u32) -> Vec<u32> {
    (0..len).map(|_| rng.random_range(0..vocab)).collect()
}

/// Zipf-like choice among `n` items: item k has weight 1 / (k + 1)^s.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut total = 0.0;
        let cdf = (0..n)
            .map(|k| {
                total += 1.0 / ((k + 1) as f64).powf(s);
                total
            })
            .collect::<Vec<_>>();
        Self {
            cdf: cdf.into_iter().map(|c| c / total).collect(),
        }
    }

    fn sample(&self, rng: &mut StdRng) -> usize {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// A cache and pool served like the engine: match and lock the prefix,
/// evict if short, allocate the rest, insert, free duplicates, unlock.
pub(crate) struct Server {
    pub(crate) cache: RadixCache<u32>,
    pub(crate) pool: TokenPool,
}

impl Server {
    pub(crate) fn new(config: CacheConfig) -> Self {
        Self {
            cache: RadixCache::new(config),
            pool: TokenPool::new(CAPACITY),
        }
    }

    /// Serves one request without timing anything; returns the matched length.
    pub(crate) fn serve(&mut self, key: &[u32]) -> usize {
        let m = self.cache.match_prefix("", key);
        self.cache.lock(m.node);
        let need = key.len() - m.len;
        if self.pool.available() < need {
            let freed = self.cache.evict(need - self.pool.available());
            let _ = self.pool.free(&freed);
        }
        if let Ok(own) = self.pool.alloc(need) {
            let mut slots = m.slots;
            slots.extend_from_slice(&own);
            let out = self.cache.insert("", key, &slots);
            let _ = self.pool.free(&out.duplicate_slots);
        }
        let _ = self.cache.unlock(m.node);
        m.len
    }

    /// Runs the first `n` requests of `trace` to warm the cache up.
    pub(crate) fn warm_up(&mut self, trace: &Trace, n: usize) {
        let mut key = Vec::new();
        for i in 0..n.min(trace.requests.len()) {
            trace.key(i, &mut key);
            self.serve(&key);
        }
    }
}
