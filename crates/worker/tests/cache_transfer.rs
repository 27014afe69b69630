//! Carrying prefix-cache K/V between engines on the real default model, as
//! a live migration does: K/V read from one model and written into another
//! gives the same next-token logits as computing it there, and an engine
//! that imports another's hottest cache serves the same greedy output from
//! cache hits.
#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, bounded};
use zinfer_fetch::test_model_path;
use zinfer_model::device::{Device, test_device};
use zinfer_model::{
    ChunkOutput, LoadOptions, LoadedModel, ModelError, SeqChunk, candle_device, load, load_candle,
};
use zinfer_protocol::{ChunkBody, DoneBody, GenerateRequest, Usage};
use zinfer_text::ModelTokenizer;
use zinfer_worker::engine::{Engine, EngineConfig, EngineError, EngineEvent, EngineHandle};
use zinfer_worker::scheduler::SchedulerConfig;
use zinfer_worker::{CacheBlock, KvShape};

#[path = "../../model/tests/support/mod.rs"]
mod support;
use support::{argmax, max_abs_diff, prompt_ids};

/// One model at a time: the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn options(kv_capacity: usize, device: String) -> LoadOptions {
    LoadOptions {
        kv_capacity,
        threads: Some(1),
        device,
        ..LoadOptions::default()
    }
}

/// zinfer's CPU kernels ([`zinfer_model::Llama`]).
fn cpu_model(kv_capacity: usize) -> LoadedModel {
    load(
        &test_model_path().unwrap(),
        &options(kv_capacity, "cpu".into()),
    )
    .unwrap()
}

/// The candle backend on the test device (candle's CPU device without a GPU).
fn candle_model(kv_capacity: usize) -> LoadedModel {
    let device: Device = test_device().parse().unwrap();
    load_candle(
        &test_model_path().unwrap(),
        &options(kv_capacity, test_device()),
        &candle_device(device).unwrap(),
    )
    .unwrap()
}

/// Logits of `ids[start..]` over `slots`, whose first `start` hold K/V.
fn step(m: &mut LoadedModel, ids: &[u32], slots: &[u32], start: usize) -> Vec<f32> {
    m.model
        .forward(&[SeqChunk {
            tokens: &ids[start..],
            slots,
            start_pos: start,
            output: ChunkOutput::LastLogits,
        }])
        .unwrap()
        .remove(0)
}

/// Prefill a prompt into slots 0..n, copy its K/V to slots 100.., read it
/// back unchanged, and decode the last token from the copy: same logits.
fn round_trip(m: &mut LoadedModel) {
    let ids = prompt_ids();
    let n = ids.len();
    let shape = m.model.kv_shape();
    assert_eq!(
        shape,
        KvShape {
            layers: 30,
            kv_heads: 3,
            key_dim: 64,
            value_dim: 64,
        }
    );
    let here: Vec<u32> = (0..n as u32).collect();
    let there: Vec<u32> = (100..100 + n as u32).collect();
    let direct = step(m, &ids, &here, 0);
    let kv = m.model.read_kv(&here[..n - 1]).unwrap();
    assert_eq!(kv.len(), (n - 1) * shape.floats_per_slot());
    m.model.write_kv(&there[..n - 1], &kv).unwrap();
    assert_eq!(m.model.read_kv(&there[..n - 1]).unwrap(), kv);
    let from_copy = step(m, &ids, &there, n - 1);
    assert!(
        max_abs_diff(&direct, &from_copy) < 1e-3,
        "{}",
        max_abs_diff(&direct, &from_copy)
    );
    assert_eq!(argmax(&direct), argmax(&from_copy));
    // Bad input is an error, never a panic, and changes nothing.
    let capacity = m.model.kv_capacity() as u32;
    for result in [
        m.model.read_kv(&[0, capacity]).map(|_| ()),
        m.model.write_kv(&there[..2], &kv[..7]),
        m.model
            .write_kv(&[capacity], &kv[..shape.floats_per_slot()]),
    ] {
        assert!(
            matches!(result, Err(ModelError::KvTransfer(_))),
            "{result:?}"
        );
    }
    assert_eq!(m.model.read_kv(&there[..n - 1]).unwrap(), kv);
    assert!(m.model.read_kv(&[]).unwrap().is_empty());
}

#[test]
fn kv_round_trips_on_the_cpu_kernels() {
    let _serial = serial();
    round_trip(&mut cpu_model(256));
}

#[test]
fn kv_round_trips_on_the_candle_backend() {
    let _serial = serial();
    round_trip(&mut candle_model(256));
}

/// A migration from a CPU worker to a GPU one carries K/V computed by one
/// backend into the other: same layout, so the next token agrees within the
/// two backends' quantization tolerance (see `model_backend.rs`).
#[test]
fn kv_from_the_cpu_kernels_serves_the_candle_backend() {
    let _serial = serial();
    let mut cpu = cpu_model(128);
    let mut gpu = candle_model(128);
    let ids = prompt_ids();
    let n = ids.len();
    let slots: Vec<u32> = (0..n as u32).collect();
    step(&mut cpu, &ids[..n - 1], &slots[..n - 1], 0);
    let kv = cpu.model.read_kv(&slots[..n - 1]).unwrap();
    gpu.model.write_kv(&slots[..n - 1], &kv).unwrap();
    let carried = step(&mut gpu, &ids, &slots, n - 1);
    let own = step(&mut gpu, &ids, &slots, 0);
    assert!(max_abs_diff(&carried, &own) < 2.5);
    assert_eq!(argmax(&carried), argmax(&own));
}

/// See `engine_model.rs`: a step budget under the 32-row matmul switch, so
/// a token computed alone and in a prefill chunk take the same path.
fn config() -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            step_token_budget: 16,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    }
}

fn engine(kv_capacity: usize) -> EngineHandle {
    let path = test_model_path().unwrap();
    Engine::start(
        load(&path, &options(kv_capacity, test_device())).unwrap(),
        ModelTokenizer::open(&path).unwrap(),
        config(),
    )
}

/// A ~200-token shared system prompt and a question.
fn prompt(question: &str) -> String {
    let system = "You are a patient teacher of geography. You answer in one short \
        sentence, you never invent facts, and when you do not know something you say \
        so. You prefer capitals, rivers and mountains to trivia, and you name the \
        country of every city you mention. "
        .repeat(4);
    format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n\
         <|im_start|>assistant\n"
    )
}

fn greedy(text: &str) -> GenerateRequest {
    GenerateRequest {
        temperature: 0.0,
        max_tokens: 12,
        ..GenerateRequest::from_prompt("t", text)
    }
}

/// Submits every request, then gathers each one's tokens and usage.
fn run_all(handle: &EngineHandle, requests: &[(u64, String)]) -> HashMap<u64, (Vec<u32>, Usage)> {
    for (rid, text) in requests {
        handle.submit(greedy(text), *rid).unwrap();
    }
    let mut out: HashMap<u64, (Vec<u32>, Usage)> = HashMap::new();
    let mut ended = 0;
    while ended < requests.len() {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(300))
            .expect("no event within 5 minutes");
        let entry = out.entry(event.rid()).or_default();
        match event {
            EngineEvent::Chunk {
                body: ChunkBody { tokens, .. },
                ..
            } => entry.0.extend(tokens),
            EngineEvent::Done {
                body: DoneBody { usage, .. },
                ..
            } => {
                entry.1 = usage;
                ended += 1;
            }
            EngineEvent::Error { code, message, .. } => panic!("{code}: {message}"),
        }
    }
    out
}

/// Imports every block into `to` until `End`, backing off while its
/// queue is full; returns the export's (spans, tokens).
fn forward(blocks: &Receiver<CacheBlock>, to: &EngineHandle) -> (usize, usize) {
    loop {
        let block = blocks
            .recv_timeout(Duration::from_secs(300))
            .expect("export went quiet");
        if let CacheBlock::End { spans, tokens } = block {
            return (spans, tokens);
        }
        match to.import_cache_timeout(block, Duration::from_secs(60)) {
            Ok(()) => {}
            Err(EngineError::Overloaded(n)) => panic!("import queue stuck at {n}"),
            Err(other) => panic!("{other}"),
        }
    }
}

fn truncated(block: &CacheBlock) -> Option<CacheBlock> {
    match block {
        CacheBlock::Span {
            namespace,
            tokens,
            prefix_len,
            kv,
        } => Some(CacheBlock::Span {
            namespace: namespace.clone(),
            tokens: tokens.clone(),
            prefix_len: *prefix_len,
            kv: kv[..kv.len() - 1].to_vec(),
        }),
        CacheBlock::End { .. } => None,
    }
}

#[test]
fn an_imported_cache_serves_the_same_greedy_output_from_cache_hits() {
    let _serial = serial();
    let a = engine(4096);
    let questions = [
        "What is the capital of France?",
        "Which river flows through Cairo?",
        "What is the highest mountain in Japan?",
    ];
    let requests: Vec<(u64, String)> = questions
        .iter()
        .enumerate()
        .map(|(i, q)| (i as u64, prompt(q)))
        .collect();
    let on_a = run_all(&a, &requests);
    // Whichever request the scheduler prefills first (all three may arrive
    // in one step, and then the shortest goes first), the other two are
    // served the system prompt from its cache.
    let mut cached: Vec<usize> = on_a
        .values()
        .map(|(_, u)| u.cached_tokens as usize)
        .collect();
    cached.sort_unstable();
    let shared = cached[1];
    assert!(shared >= 200, "the system prompt is shared: {cached:?}");

    // Two more requests run on A while its cache is exported.
    let during: Vec<(u64, String)> = ["Where is Lima?", "Name a river in Germany."]
        .iter()
        .enumerate()
        .map(|(i, q)| (10 + i as u64, prompt(q)))
        .collect();
    for (rid, text) in &during {
        a.submit(greedy(text), *rid).unwrap();
    }
    let (tx, rx) = bounded(2);
    a.export_cache(100_000, tx).unwrap();
    let b = engine(4096);
    let (first_tx, first_rx) = bounded(1);
    let importer = std::thread::spawn(move || {
        // The first block also goes in truncated, as if from another model:
        // skipped, and the intact copy after it still imports.
        let first = rx.recv_timeout(Duration::from_secs(300)).unwrap();
        if let Some(bad) = truncated(&first) {
            b.import_cache(bad).unwrap();
        }
        first_tx.send(first.clone()).unwrap();
        if let CacheBlock::Span { .. } = first {
            b.import_cache_timeout(first, Duration::from_secs(60))
                .unwrap();
        }
        let totals = forward(&rx, &b);
        (totals, b)
    });
    let mut during_on_a = HashMap::new();
    let mut ended = 0;
    while ended < during.len() {
        let event = a.events().recv_timeout(Duration::from_secs(300)).unwrap();
        ended += usize::from(event.is_terminal());
        let entry: &mut Vec<u32> = during_on_a.entry(event.rid()).or_default();
        match event {
            EngineEvent::Chunk {
                body: ChunkBody { tokens, .. },
                ..
            } => entry.extend(tokens),
            EngineEvent::Error { code, message, .. } => panic!("{code}: {message}"),
            EngineEvent::Done { .. } => {}
        }
    }
    let ((spans, tokens), b) = importer.join().unwrap();
    let first = first_rx.recv().unwrap();
    let CacheBlock::Span {
        tokens: first_key,
        prefix_len,
        ..
    } = &first
    else {
        panic!("the export sent no span");
    };
    assert_eq!(*prefix_len, 0);
    let first_len = first_key.len();
    assert!(
        spans >= 4 && tokens >= shared,
        "{spans} spans, {tokens} tokens"
    );
    // Stats are published after the step that sent `End`.
    let started = Instant::now();
    while a.stats().cache_exported_tokens as usize != tokens {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            a.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }

    // On B: the same requests, served from the imported prefixes.
    let on_b = run_all(&b, &requests);
    for (rid, (want, _)) in &on_a {
        let (got, usage) = &on_b[rid];
        assert_eq!(got, want, "request {rid} differs after migration");
        assert!(
            usage.cached_tokens as usize >= shared / 16 * 16,
            "request {rid}: {usage:?}"
        );
    }
    let b_stats = b.stats();
    assert_eq!(b_stats.cache_imported_tokens as usize, tokens);
    assert_eq!(b_stats.cache_import_skipped_tokens as usize, first_len);
    assert_eq!(
        b_stats.cache_query_tokens,
        on_b.values()
            .map(|(_, u)| u64::from(u.prompt_tokens))
            .sum::<u64>(),
        "imports are not cache queries"
    );

    // The requests that ran during the export match a run without one
    // (from an empty cache; the second still hits the first's prefix).
    a.flush_cache(None);
    let again = run_all(&a, &during);
    for (rid, (want, _)) in &again {
        assert_eq!(&during_on_a[rid], want, "request {rid} during the export");
    }

    // Figures: an idle engine's export, and an import into an empty cache.
    let (tx, rx) = bounded(1024);
    let started = Instant::now();
    a.export_cache(100_000, tx).unwrap();
    let blocks: Vec<CacheBlock> = rx.iter().collect();
    let exported = started.elapsed();
    let Some(CacheBlock::End { tokens, .. }) = blocks.last() else {
        panic!("no End");
    };
    let tokens = *tokens;
    b.flush_cache(None);
    let before = b.stats().cache_imported_tokens;
    let started = Instant::now();
    for block in blocks {
        b.import_cache_timeout(block, Duration::from_secs(60))
            .unwrap();
    }
    while b.stats().cache_imported_tokens - before < tokens as u64 {
        assert!(started.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(1));
    }
    let imported = started.elapsed();
    let per_token = KvShape {
        layers: 30,
        kv_heads: 3,
        key_dim: 64,
        value_dim: 64,
    }
    .floats_per_slot()
        * 4;
    eprintln!(
        "{tokens} tokens ({} MiB of K/V): export {exported:?}, import {imported:?}",
        (tokens * per_token) >> 20
    );
}
