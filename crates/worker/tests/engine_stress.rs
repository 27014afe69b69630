//! Random traffic on the real model with a KV pool small enough to force
//! preemption: every request ends exactly once, and afterwards every slot
//! is free or cached.
#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use zinfer_fetch::test_model_path;
use zinfer_model::device::test_device;
use zinfer_model::{LoadOptions, load};
use zinfer_protocol::{ChunkBody, ErrorCode, GenerateRequest};
use zinfer_text::ModelTokenizer;
use zinfer_worker::engine::{Engine, EngineConfig, EngineEvent};
use zinfer_worker::scheduler::SchedulerConfig;

#[test]
fn random_requests_cancels_and_preemptions_leave_the_pool_whole() {
    let capacity = 384;
    let path = test_model_path().unwrap();
    let options = LoadOptions {
        kv_capacity: capacity,
        device: test_device(),
        ..LoadOptions::default()
    };
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_batch: 8,
            step_token_budget: 128,
            decode_reserve: 0,
            shared_prefix_hold: 16,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    let tokenizer = ModelTokenizer::open(&path).unwrap();
    let handle = Engine::start(load(&path, &options).unwrap(), tokenizer, config);
    let mut rng = StdRng::seed_from_u64(2024);
    let stems = [
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\n",
        "<|im_start|>user\nContinue the list: apples, pears, ",
        "Once upon a time",
    ];
    let words = ["cat", "river", "blue", "seven", "quietly", "mountain"];
    let total = 40u64;
    // All at once, so the running batch stays full and its decodes outgrow
    // the pool; a few are cancelled while they wait.
    for rid in 0..total {
        let stem = stems[rng.random_range(0..stems.len())];
        let tail: Vec<&str> = (0..rng.random_range(1..40))
            .map(|_| words[rng.random_range(0..words.len())])
            .collect();
        let request = GenerateRequest {
            temperature: if rng.random_bool(0.5) { 0.0 } else { 0.8 },
            seed: Some(rng.random()),
            max_tokens: rng.random_range(16..96),
            priority: rng.random_range(0..2),
            ..GenerateRequest::from_prompt("s", format!("{stem}{}", tail.join(" ")))
        };
        handle.submit(request, rid).unwrap();
        if rng.random_bool(0.1) {
            handle.cancel(rng.random_range(0..=rid));
        }
    }
    let mut terminal: HashMap<u64, EngineEvent> = HashMap::new();
    let mut last_chunk: HashMap<u64, u32> = HashMap::new();
    let started = Instant::now();
    while terminal.len() < total as usize {
        match handle.events().recv_timeout(Duration::from_millis(100)) {
            Ok(event) => {
                let rid = event.rid();
                assert!(
                    !terminal.contains_key(&rid),
                    "event after terminal for {rid}"
                );
                if let EngineEvent::Chunk {
                    body: ChunkBody { index, .. },
                    ..
                } = event
                {
                    let expected = last_chunk.get(&rid).map_or(0, |i| i + 1);
                    assert_eq!(index, expected, "chunk order of {rid}");
                    last_chunk.insert(rid, index);
                    // Cancel some while they run.
                    if rng.random_bool(0.004) {
                        handle.cancel(rid);
                    }
                } else {
                    terminal.insert(rid, event);
                }
            }
            Err(_) => assert!(started.elapsed() < Duration::from_secs(600), "stuck"),
        }
    }
    for (rid, event) in &terminal {
        if let EngineEvent::Error { code, message, .. } = event {
            assert_ne!(*code, ErrorCode::Internal, "request {rid}: {message}");
        }
    }
    let stats = loop {
        let stats = handle.stats();
        if stats.running == 0 && stats.waiting == 0 {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(stats.kv_capacity, capacity);
    assert_eq!(
        stats.kv_used, stats.kv_cached,
        "free + cached must be the whole pool: {stats:?}"
    );
    assert!(
        stats.preemptions > 0,
        "the small pool should preempt: {stats:?}"
    );
    assert!(
        stats.cache_hit_tokens > 0,
        "shared stems should hit: {stats:?}"
    );
    let done: u64 = stats.requests_done.iter().sum();
    assert_eq!(done + stats.requests_failed, total);
}
