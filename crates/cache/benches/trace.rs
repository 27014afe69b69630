//! The cache issue's trace: 100k requests over 1k shared system prompts
//! into a 1M-token pool, served like the engine does, timing every cache
//! operation. Prints mean, p50, p99 and max per operation, throughput, the
//! hit-token ratio and the heap bytes per cached token.
//!
//! `cargo bench -p zinfer-cache --bench trace`. Environment overrides:
//! `ZINFER_TRACE_POLICY` (lru, lfu, fifo), `ZINFER_TRACE_ZIPF` (exponent),
//! `ZINFER_TRACE_REQUESTS`. Without `--bench` (under `cargo test`) it runs a
//! short smoke trace.

mod common;

use std::time::Instant;

use common::{CAPACITY, Trace, TraceConfig};
use zinfer_cache::{CacheConfig, EvictionPolicy, RadixCache, TokenPool};

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// A global allocator that keeps a running total of live heap bytes, to
/// measure what the cache really holds.
#[allow(unsafe_code)]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    static LIVE: AtomicUsize = AtomicUsize::new(0);

    pub(crate) fn live_bytes() -> usize {
        LIVE.load(Relaxed)
    }

    pub(crate) struct Counting;

    // SAFETY: every method forwards its arguments unchanged to the system
    // allocator, which upholds the GlobalAlloc contract; the only addition
    // is an atomic counter that never touches the memory.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same contract as our caller's.
            let ptr = unsafe { System.alloc(layout) };
            if !ptr.is_null() {
                LIVE.fetch_add(layout.size(), Relaxed);
            }
            ptr
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same contract as our caller's.
            let ptr = unsafe { System.alloc_zeroed(layout) };
            if !ptr.is_null() {
                LIVE.fetch_add(layout.size(), Relaxed);
            }
            ptr
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator with this layout.
            unsafe { System.dealloc(ptr, layout) };
            LIVE.fetch_sub(layout.size(), Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: `ptr` came from this allocator with this layout.
            let new = unsafe { System.realloc(ptr, layout, new_size) };
            if !new.is_null() {
                LIVE.fetch_add(new_size, Relaxed);
                LIVE.fetch_sub(layout.size(), Relaxed);
            }
            new
        }
    }
}

/// Latencies of one operation, in nanoseconds.
struct Samples {
    name: &'static str,
    ns: Vec<u64>,
}

impl Samples {
    fn with_capacity(name: &'static str, n: usize) -> Self {
        Self {
            name,
            ns: Vec::with_capacity(n),
        }
    }

    fn print(&mut self) {
        if self.ns.is_empty() {
            println!("{:<34} {:>8}", self.name, 0);
            return;
        }
        self.ns.sort_unstable();
        let n = self.ns.len();
        let mean = self.ns.iter().sum::<u64>() as f64 / n as f64;
        let pct = |p: f64| self.ns[((n as f64 * p) as usize).min(n - 1)] as f64 / 1e3;
        println!(
            "{:<34} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.1} {:>12.0}",
            self.name,
            n,
            mean / 1e3,
            pct(0.50),
            pct(0.99),
            self.ns[n - 1] as f64 / 1e3,
            1e9 / mean
        );
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let mut config = TraceConfig {
        zipf_s: env_or("ZINFER_TRACE_ZIPF", TraceConfig::default().zipf_s),
        ..TraceConfig::default()
    };
    config.requests = env_or("ZINFER_TRACE_REQUESTS", if full { 100_000 } else { 2_000 });
    let policy = env_or("ZINFER_TRACE_POLICY", EvictionPolicy::Lru);
    let trace = Trace::generate(&config);
    let n = config.requests;

    let mut matches = Samples::with_capacity("match_prefix", n);
    let mut long_matches = Samples::with_capacity("match_prefix, keys 1900-2300 tok", n);
    let mut locks = Samples::with_capacity("lock", n);
    let mut inserts = Samples::with_capacity("insert", n);
    let mut unlocks = Samples::with_capacity("unlock", n);
    let mut evicts = Samples::with_capacity("evict, per call", n);
    let mut evicts_1k = Samples::with_capacity("evict, calls of >=1k tok, per 1k", n);
    let (mut evicted, mut queried, mut hit) = (0usize, 0usize, 0usize);
    let mut pool = TokenPool::new(CAPACITY);
    let mut key = Vec::with_capacity(config.prompt_len.1 + config.suffix_len.1);

    let heap_before = counting::live_bytes();
    let mut cache = RadixCache::new(CacheConfig {
        policy,
        page_size: 1,
    });
    let started = Instant::now();
    for i in 0..n {
        trace.key(i, &mut key);
        let t0 = Instant::now();
        let m = cache.match_prefix("", &key);
        let t1 = Instant::now();
        cache.lock(m.node);
        let t2 = Instant::now();
        let match_ns = (t1 - t0).as_nanos() as u64;
        matches.ns.push(match_ns);
        if (1900..=2300).contains(&key.len()) {
            long_matches.ns.push(match_ns);
        }
        locks.ns.push((t2 - t1).as_nanos() as u64);
        queried += key.len();
        hit += m.len;

        let need = key.len() - m.len;
        if pool.available() < need {
            let t = Instant::now();
            let freed = cache.evict(need - pool.available());
            let ns = t.elapsed().as_nanos() as u64;
            evicts.ns.push(ns);
            if freed.len() >= 1000 {
                evicts_1k.ns.push(ns * 1000 / freed.len() as u64);
            }
            evicted += freed.len();
            pool.free(&freed)
                .unwrap_or_else(|e| panic!("cache freed a bad slot: {e}"));
        }
        let Ok(own) = pool.alloc(need) else {
            let _ = cache.unlock(m.node);
            continue;
        };
        let mut slots = m.slots;
        slots.extend_from_slice(&own);
        let t3 = Instant::now();
        let out = cache.insert("", &key, &slots);
        let t4 = Instant::now();
        pool.free(&out.duplicate_slots)
            .unwrap_or_else(|e| panic!("cache returned a bad duplicate: {e}"));
        let t5 = Instant::now();
        let unlocked = cache.unlock(m.node);
        let t6 = Instant::now();
        assert!(unlocked.is_ok(), "unlock failed: {unlocked:?}");
        inserts.ns.push((t4 - t3).as_nanos() as u64);
        unlocks.ns.push((t6 - t5).as_nanos() as u64);
    }
    let wall = started.elapsed().as_secs_f64();
    let heap = counting::live_bytes().saturating_sub(heap_before);

    let stats = cache.stats();
    println!(
        "trace: {n} requests over {} prompts (zipf s={}), suffixes {}-{} tokens, pool {CAPACITY} tokens, policy {policy}",
        config.prompts, config.zipf_s, config.suffix_len.0, config.suffix_len.1
    );
    println!(
        "hit-token ratio {:.3}; {:.2} s for the whole trace, {:.0} requests/s, {:.1} M tokens/s looked up",
        hit as f64 / queried as f64,
        wall,
        n as f64 / wall,
        queried as f64 / wall / 1e6
    );
    println!(
        "{:<34} {:>8} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "operation (us)", "calls", "mean", "p50", "p99", "max", "ops/s"
    );
    for samples in [
        &mut matches,
        &mut long_matches,
        &mut locks,
        &mut inserts,
        &mut unlocks,
        &mut evicts,
        &mut evicts_1k,
    ] {
        samples.print();
    }
    let evict_total: u64 = evicts.ns.iter().sum();
    println!(
        "evicted {evicted} tokens in {} calls ({:.0} per call): {:.1} us per 1k evicted tokens overall",
        evicts.ns.len(),
        evicted as f64 / evicts.ns.len().max(1) as f64,
        evict_total as f64 / 1e3 / (evicted.max(1) as f64 / 1e3)
    );
    let tokens = cache.total_tokens();
    let per_token = heap as f64 / tokens.max(1) as f64;
    println!(
        "memory: {heap} heap bytes for {tokens} cached tokens in {} nodes = {per_token:.2} bytes/token, {:.2} beyond the 4-byte slot id",
        stats.nodes,
        per_token - 4.0
    );
}
