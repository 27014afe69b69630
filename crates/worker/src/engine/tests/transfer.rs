//! Cache transfer between two engines on the fake model, whose output
//! hashes the whole prefix, so K/V carried to the wrong place shows.

use crossbeam_channel::{Receiver, bounded};

use super::*;

/// Three prompts sharing a 120-token prefix.
fn shared_prompts() -> Vec<String> {
    let prefix = "abcdefghij".repeat(12);
    ["one\n", "two\n", "three\n"]
        .iter()
        .map(|tail| format!("{prefix}{tail}"))
        .collect()
}

fn tokens_of(events: &[EngineEvent]) -> Vec<u32> {
    events
        .iter()
        .flat_map(|e| match e {
            EngineEvent::Chunk {
                body: ChunkBody { tokens, .. },
                ..
            } => tokens.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn serve(handle: &EngineHandle, rid: u64, prompt: &str) -> (Vec<u32>, Usage) {
    handle.submit(greedy(prompt, 12), rid).unwrap();
    let events = collect(handle, rid);
    (tokens_of(&events), done(&events).2)
}

/// Passes every block from `blocks` to `to` until `End`; returns the
/// export's totals.
fn forward(blocks: &Receiver<CacheBlock>, to: &EngineHandle) -> (usize, usize) {
    loop {
        let block = blocks
            .recv_timeout(Duration::from_secs(20))
            .expect("export went quiet");
        if let CacheBlock::End { spans, tokens } = block {
            return (spans, tokens);
        }
        let mut block = Some(block);
        while let Some(b) = block.take() {
            match to.import_cache(b.clone()) {
                Ok(()) => {}
                Err(EngineError::Overloaded(_)) => {
                    std::thread::sleep(Duration::from_millis(1));
                    block = Some(b);
                }
                Err(other) => panic!("{other}"),
            }
        }
    }
}

/// The stats once `ready` holds for them (they are published after each
/// step, so a receiver may see an export's `End` before its counts).
fn wait_for(handle: &EngineHandle, ready: impl Fn(&EngineStats) -> bool) -> EngineStats {
    let start = Instant::now();
    loop {
        let stats = handle.stats();
        if ready(&stats) {
            return stats;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{stats:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn an_exported_prefix_is_a_hit_on_the_importing_engine_with_the_same_output() {
    let a = engine(Mode::Hash, 1024, 0, EngineConfig::default());
    let prompts = shared_prompts();
    let outputs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| serve(&a, i as u64, p))
        .collect();
    let (tx, rx) = bounded(2);
    a.export_cache(10_000, tx).unwrap();
    let b = engine(Mode::Hash, 1024, 0, EngineConfig::default());
    let (spans, tokens) = forward(&rx, &b);
    // Stats are published after the step that sent `End`.
    let a_stats = wait_for(&a, |s| s.cache_exported_tokens as usize == tokens);
    assert!(spans >= 4, "the shared prefix and three branches: {spans}");
    assert_eq!(tokens, a_stats.kv_cached, "everything fits the budget");
    // The import is queued before the request, so it is done by then.
    let (tokens_b, usage_b) = serve(&b, 10, &prompts[0]);
    assert_eq!(tokens_b, outputs[0].0, "imported K/V gives the same output");
    assert_eq!(usage_b.cached_tokens, usage_b.prompt_tokens - 1);
    let b_stats = wait_idle(&b);
    assert_eq!(b_stats.cache_imported_tokens as usize, tokens);
    assert_eq!(b_stats.cache_import_skipped_tokens, 0);
    assert_eq!(
        b_stats.cache_query_tokens, usage_b.prompt_tokens as u64,
        "imports are not cache queries"
    );
    assert_eq!(b_stats.kv_used, b_stats.kv_cached, "no slot leaked");
}

#[test]
fn blocks_of_another_shape_without_their_prefix_or_too_big_are_skipped() {
    let b = engine(Mode::Hash, 64, 0, EngineConfig::default());
    let tokens: Vec<u32> = "0123456789".bytes().map(u32::from).collect();
    let span = |tokens: Vec<u32>, prefix_len: usize, kv_len: usize| CacheBlock::Span {
        namespace: String::new(),
        tokens,
        prefix_len,
        kv: vec![1.0; kv_len],
    };
    // Truncated K/V (another model), then a span whose prefix is missing,
    // then one longer than the pool.
    b.import_cache(span(tokens.clone(), 0, 10 * 12 - 1))
        .unwrap();
    b.import_cache(span(tokens.clone(), 4, 6 * 12)).unwrap();
    b.import_cache(span(vec![7; 100], 0, 100 * 12)).unwrap();
    b.import_cache(CacheBlock::End {
        spans: 3,
        tokens: 0,
    })
    .unwrap();
    let (out, usage) = serve(&b, 1, "0123456789\n");
    assert_eq!(usage.cached_tokens, 0);
    let fresh = engine(Mode::Hash, 64, 0, EngineConfig::default());
    assert_eq!(out, serve(&fresh, 1, "0123456789\n").0);
    let stats = wait_idle(&b);
    assert_eq!(stats.cache_import_skipped_tokens, 10 + 6 + 100);
    assert_eq!(stats.cache_imported_tokens, 0);
    assert_eq!(stats.kv_used, stats.kv_cached);
}

#[test]
fn an_export_while_requests_run_leaves_their_outputs_unchanged() {
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("{}{i}\n", "shared prefix ".repeat(20)))
        .collect();
    let expected: Vec<Vec<u32>> = {
        let alone = engine(Mode::Hash, 4096, 0, EngineConfig::default());
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| serve(&alone, i as u64, p).0)
            .collect()
    };
    let a = engine(Mode::Hash, 4096, 1, EngineConfig::default());
    serve(&a, 100, &prompts[0]);
    for (i, p) in prompts.iter().enumerate() {
        a.submit(greedy(p, 12), i as u64).unwrap();
    }
    // A slow receiver: one block in flight at a time.
    let (tx, rx) = bounded(1);
    a.export_cache(10_000, tx).unwrap();
    let b = engine(Mode::Hash, 4096, 0, EngineConfig::default());
    let exporting = std::thread::spawn(move || {
        let totals = forward(&rx, &b);
        (totals, b)
    });
    let mut outputs: HashMap<u64, Vec<EngineEvent>> = HashMap::new();
    let mut ended = 0;
    while ended < prompts.len() {
        let event = a.events().recv_timeout(Duration::from_secs(20)).unwrap();
        ended += usize::from(event.is_terminal());
        outputs.entry(event.rid()).or_default().push(event);
    }
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(&tokens_of(&outputs[&(i as u64)]), want, "request {i}");
    }
    let ((_, tokens), b) = exporting.join().unwrap();
    assert!(tokens >= 280, "at least the shared prefix: {tokens}");
    let (out, usage) = serve(&b, 50, &prompts[0]);
    assert_eq!(out, expected[0]);
    assert!(usage.cached_tokens >= 280);
}

#[test]
fn a_receiver_that_goes_away_ends_the_export_and_nothing_else() {
    let a = engine(Mode::Hash, 1024, 0, EngineConfig::default());
    let prompts = shared_prompts();
    for (i, p) in prompts.iter().enumerate() {
        serve(&a, i as u64, p);
    }
    let (tx, rx) = bounded(1);
    a.export_cache(10_000, tx).unwrap();
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(CacheBlock::Span { .. })
    ));
    drop(rx);
    let (_, usage) = serve(&a, 9, &prompts[1]);
    assert!(usage.cached_tokens > 100);
    let stats = wait_idle(&a);
    assert!(stats.cache_exported_tokens > 0);
    assert_eq!(stats.kv_used, stats.kv_cached);
}

#[test]
fn a_busy_engine_copies_at_most_the_step_budget_per_step() {
    use zinfer_cache::{RadixCache, TokenPool};

    use crate::engine::transfer::{EXPORT_TOKENS_PER_STEP, Export, Progress, SPAN_TOKENS};
    use crate::scheduler::Scheduler;

    let mut scheduler = Scheduler::new(
        SchedulerConfig::default(),
        TokenPool::new(4096),
        RadixCache::new(CacheConfig::default()),
    );
    // Eight unrelated 300-token prefixes: spans of 256 and 44 tokens.
    for i in 0..8u32 {
        let tokens: Vec<u32> = (0..300).map(|t| i * 1000 + t).collect();
        let kept = scheduler.import_prefix("", &tokens, 0, |_| Ok::<(), ()>(()));
        assert_eq!(kept.unwrap(), 300);
    }
    let model = FakeModel {
        mode: Mode::Hash,
        delay: Duration::ZERO,
        kv: vec![None; 4096],
        max_positions: usize::MAX,
    };
    let spans = scheduler.cache().hottest_spans(usize::MAX, SPAN_TOKENS);
    assert_eq!(spans.len(), 16);
    let (tx, rx) = bounded(100);
    let mut export = Export::new(spans.clone(), tx);
    let mut stats = EngineStats::default();
    let mut per_step = Vec::new();
    loop {
        let progress = export.pump(
            &model,
            &scheduler,
            EXPORT_TOKENS_PER_STEP,
            false,
            &mut stats,
        );
        let copied: usize = rx
            .try_iter()
            .map(|block| match block {
                CacheBlock::Span {
                    tokens, prefix_len, ..
                } => tokens.len() - prefix_len,
                CacheBlock::End { .. } => 0,
            })
            .sum();
        per_step.push(copied);
        if progress == Progress::Finished {
            break;
        }
    }
    assert!(
        per_step.iter().all(|&n| n <= EXPORT_TOKENS_PER_STEP),
        "{per_step:?}"
    );
    assert_eq!(per_step.iter().sum::<usize>(), 2400);
    assert_eq!(stats.cache_exported_tokens, 2400);
    // Idle, it all goes in one call.
    let (tx, rx) = bounded(100);
    let mut export = Export::new(spans, tx);
    let progress = export.pump(&model, &scheduler, usize::MAX, true, &mut stats);
    assert_eq!(progress, Progress::Finished);
    assert_eq!(rx.try_iter().count(), 17, "16 spans and End");
}

#[test]
fn imports_beyond_the_queued_bound_answer_overloaded_until_the_engine_catches_up() {
    let b = engine(Mode::Script, 256, 200, EngineConfig::default());
    b.submit(greedy("hi\n", 3), 1).unwrap();
    let end = || CacheBlock::End {
        spans: 0,
        tokens: 0,
    };
    // The engine sleeps 200 ms per step: it drains its queue once at most
    // while these go in.
    let refused = (0..40)
        .filter(|_| matches!(b.import_cache(end()), Err(EngineError::Overloaded(_))))
        .count();
    assert!(refused >= 8, "{refused} of 40 refused");
    b.import_cache_timeout(end(), Duration::from_secs(10))
        .unwrap();
    collect(&b, 1);
    wait_idle(&b);
    b.import_cache(end()).unwrap();
}
