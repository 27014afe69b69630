//! Engine throughput and latency through the public Engine API, on the
//! default model: prefill of a 512-token prompt, decode with 1/4/8/16/64
//! streams, TTFT of a 1,000-token prompt cold and with 950 tokens cached,
//! long-prompt prefill rates (512 to 8,190 tokens) and peak RSS.
//! Run: `cargo bench -p zinfer-worker --bench engine`.
//!
//! `ZINFER_BENCH` picks cases by name, comma-separated: `prefill`, `decode`,
//! `ttft`, `warm` (the 950-cached TTFT alone, 21 runs; not run by default), `long` (prefill rate at 512/1,024/2,048/4,096/8,190 tokens; not
//! run by default, it takes minutes), `all`. Default: `prefill,decode,ttft`.
//! `ZINFER_BENCH_LONG` overrides the long-prompt lengths (e.g. `512,4096`).
//! `ZINFER_KV_DTYPE` (`f32` or `f16`) picks the KV pool element type,
//! `ZINFER_ATTENTION_DTYPE` (`auto`, `f32`, `bf16`) the attention's products.
//! ZINFER_THREADS=1 keeps every kernel on the engine thread (steadier on
//! shared cores); ZINFER_THREADS=N sizes the kernels' pool, else
//! CANDLE_NUM_THREADS or the core count does.
//! ZINFER_DEVICE picks the device (`cpu`, or `cuda:0` in a CUDA build).
//! `ZINFER_BENCH_STREAMS` overrides the decode stream counts (e.g. `1,16`),
//! `ZINFER_BENCH_CONTEXT` the prompt tokens of each decode stream (128, as
//! `llama-batched-bench -npp 128`).
//! ZINFER_BENCH_MODEL runs another GGUF file instead of the default model,
//! e.g. a synthetic checkpoint from zinfer-model's `examples/synth_model.rs`.
//!
//! `constrained` (not run by default): inter-token latency with every
//! stream constrained by a nested JSON schema against the same streams
//! unconstrained (stream counts from `ZINFER_BENCH_STREAMS`, default 1,16),
//! and the time to compile a 2 KB schema, cold and cached.
//!
//! `speculative` (not run by default): greedy decode of a workload file's
//! prompts (`ZINFER_BENCH_SPEC_FILE`, default `bench/workloads/quoting.jsonl`)
//! with prompt-lookup speculation off and on (`ZINFER_BENCH_SPEC_DRAFT`
//! tokens, default 8; n-gram 3), alternating prompt by prompt, in groups of
//! `ZINFER_BENCH_STREAMS` streams (default 1): decode tok/s, speed-up and
//! acceptance. Checks that both modes give outputs of the same lengths.
#![allow(clippy::unwrap_used)] // a benchmark may unwrap (team rules)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use zinfer_fetch::test_model_path;
use zinfer_model::{LoadOptions, load};
use zinfer_protocol::{Constraint, DoneBody, GenerateRequest, Timings, Usage};
use zinfer_text::ModelTokenizer;
use zinfer_worker::constraint::Grammars;
use zinfer_worker::engine::{Engine, EngineConfig, EngineEvent, EngineHandle};
use zinfer_worker::sampling::{Sampler, SamplingParams};

/// Runs per figure; the median is reported.
const REPEATS: usize = 3;
/// Warm TTFT runs of the `warm` case.
const WARM_REPEATS: usize = 21;
/// Tokens generated per stream in the decode figures.
const DECODE_TOKENS: u32 = 64;

struct Finished {
    usage: Usage,
    timings: Timings,
    first_chunk: Option<Instant>,
    done: Instant,
}

/// Submits all requests at once and waits for every one to finish.
fn run(handle: &EngineHandle, requests: Vec<GenerateRequest>, first_rid: u64) -> Vec<Finished> {
    let mut first_chunk: HashMap<u64, Instant> = HashMap::new();
    let mut finished = HashMap::new();
    let count = requests.len();
    for (i, request) in requests.into_iter().enumerate() {
        handle.submit(request, first_rid + i as u64).unwrap();
    }
    while finished.len() < count {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(600))
            .unwrap();
        let now = Instant::now();
        match event {
            EngineEvent::Chunk { rid, .. } => {
                first_chunk.entry(rid).or_insert(now);
            }
            EngineEvent::Done {
                rid,
                body: DoneBody { usage, timings, .. },
                ..
            } => {
                finished.insert(
                    rid,
                    Finished {
                        usage,
                        timings,
                        first_chunk: first_chunk.get(&rid).copied(),
                        done: now,
                    },
                );
            }
            EngineEvent::Error { code, message, .. } => panic!("{code}: {message}"),
        }
    }
    let mut out: Vec<(u64, Finished)> = finished.into_iter().collect();
    out.sort_by_key(|(rid, _)| *rid);
    out.into_iter().map(|(_, f)| f).collect()
}

fn tokens_request(tokens: &[u32], max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: None,
        tokens: Some(tokens.to_vec()),
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..GenerateRequest::from_prompt("bench", "")
    }
}

/// A nested schema whose output cannot end within the decode figures'
/// 64 tokens (at least 64 items), so every stream runs all its tokens.
fn long_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "items": {"type": "array", "minItems": 64, "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0},
                    "name": {"type": "string", "maxLength": 16},
                    "kind": {"enum": ["river", "bridge", "clock", "garden"]},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                             "maxItems": 3}
                },
                "required": ["id", "name", "kind"],
                "additionalProperties": false
            }}
        },
        "required": ["title", "items"],
        "additionalProperties": false
    })
}

/// A schema of about 2 KB: 24 typed properties, some nested; `salt`
/// makes each one new to the cache.
fn wide_schema(salt: &str) -> serde_json::Value {
    let mut properties = serde_json::Map::new();
    for i in 0..24 {
        let property = match i % 4 {
            0 => serde_json::json!({"type": "string", "maxLength": 32}),
            1 => serde_json::json!({"type": "integer", "minimum": 0, "maximum": 1000}),
            2 => serde_json::json!({"enum": ["alpha", "beta", "gamma", "delta"]}),
            _ => serde_json::json!({"type": "object", "properties": {
                "x": {"type": "number"}, "y": {"type": "boolean"}}, "required": ["x"]}),
        };
        properties.insert(format!("{salt}_field_{i}"), property);
    }
    serde_json::json!({"type": "object", "properties": properties,
                       "required": [format!("{salt}_field_0")]})
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A long, varied text to cut prompts of exact token counts from.
fn long_text() -> String {
    let topics = [
        "rivers",
        "bridges",
        "clocks",
        "gardens",
        "ships",
        "libraries",
        "markets",
        "trains",
    ];
    (0..1200)
        .map(|i| {
            format!(
                "Chapter {i} tells how the {} of the old town changed over {} years. ",
                topics[i % topics.len()],
                i * 7 + 3
            )
        })
        .collect()
}

/// Median time of one draw with top-k 40 and top-p 0.95, and greedy.
fn sampling_cost() -> String {
    let row: Vec<f32> = (0..49_152u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 20) as f32 / 512.0)
        .collect();
    let time = |params: SamplingParams| {
        let mut sampler = Sampler::new(params, &[]);
        let mut times: Vec<f64> = (0..200)
            .map(|_| {
                let mut logits = row.clone();
                let start = Instant::now();
                std::hint::black_box(sampler.sample(&mut logits).unwrap());
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let greedy = time(SamplingParams::greedy());
    let nucleus = time(SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        ..SamplingParams::greedy()
    });
    let full = time(SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        repetition_penalty: 1.1,
        ..SamplingParams::greedy()
    });
    format!("greedy {greedy:.0} us, top-k 40 + top-p {nucleus:.0} us, top-p only {full:.0} us")
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Whether `ZINFER_BENCH` selects the case `name`.
fn selected(name: &str) -> bool {
    let cases = std::env::var("ZINFER_BENCH").unwrap_or_else(|_| "prefill,decode,ttft".into());
    cases
        .split(',')
        .any(|c| c.trim() == name || c.trim() == "all")
}

fn main() {
    let path = match std::env::var_os("ZINFER_BENCH_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => test_model_path().unwrap(),
    };
    let load_start = Instant::now();
    let threads: Option<usize> = std::env::var("ZINFER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    let options = LoadOptions {
        threads,
        kv_dtype: std::env::var("ZINFER_KV_DTYPE")
            .ok()
            .map(|v| v.parse().unwrap())
            .unwrap_or_default(),
        attention: std::env::var("ZINFER_ATTENTION_DTYPE")
            .ok()
            .map(|v| v.parse().unwrap())
            .unwrap_or_default(),
        device: std::env::var("ZINFER_DEVICE").unwrap_or_else(|_| "cpu".to_string()),
        ..LoadOptions::default()
    };
    let options_device = options.device.clone();
    let loaded = load(&path, &options).unwrap();
    let tokenizer = ModelTokenizer::open(&path).unwrap();
    let load_s = load_start.elapsed().as_secs_f64();
    let corpus = tokenizer.encode(&long_text()).unwrap();
    assert!(corpus.len() >= 1000, "corpus too short: {}", corpus.len());
    let mut config = EngineConfig::default();
    // Room for the 64-stream figure.
    config.scheduler.max_batch = 64;
    // Requests ask for speculation themselves in `speculative`, at every
    // batch size, to find where it stops paying.
    config.scheduler.speculate_max_decodes = 64;
    let max_positions = loaded.model.max_positions();
    let trie_start = Instant::now();
    let grammars = selected("constrained")
        .then(|| Grammars::new(tokenizer.token_bytes(), tokenizer.eos_token_ids()));
    let trie_s = trie_start.elapsed().as_secs_f64();
    let handle = Engine::start(loaded, tokenizer, config);
    let threads = match threads {
        Some(1) => "1 (engine thread only)".to_string(),
        _ => zinfer_model::kernel_threads().to_string(),
    };
    let mut rid = 0u64;
    let mut rows: Vec<(String, String)> = Vec::new();

    // Prefill: a cold 512-token prompt, one output token.
    if selected("prefill") {
        let prefill: Vec<f64> = (0..REPEATS)
            .map(|_| {
                handle.flush_cache(None);
                let f = run(&handle, vec![tokens_request(&corpus[..512], 1)], rid);
                rid += 1;
                512.0 / f[0].timings.prefill_s
            })
            .collect();
        rows.push((
            "prefill, 512-token prompt".into(),
            format!("{:.0} tok/s", median(prefill)),
        ));
    }

    // Decode: N streams with distinct short prompts, generated together.
    let decode_streams: Vec<usize> = if selected("decode") {
        std::env::var("ZINFER_BENCH_STREAMS")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![1, 4, 8, 16, 64])
    } else {
        Vec::new()
    };
    // Prompt tokens per decode stream: 128 by default, as llama-batched-bench -npp 128.
    let decode_prompt: usize = std::env::var("ZINFER_BENCH_CONTEXT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
        .clamp(1, corpus.len() - 1);
    for &streams in &decode_streams {
        let mut rates = Vec::new();
        let mut per_stream = Vec::new();
        let mut generated = 0;
        for _ in 0..REPEATS {
            handle.flush_cache(None);
            let prompts: Vec<&[u32]> = (0..streams)
                .map(|s| {
                    let at = (s * 16) % (corpus.len() - decode_prompt);
                    &corpus[at..at + decode_prompt]
                })
                .collect();
            // The prompts enter the prefix cache first, as llama-batched-bench
            // fills its KV before it times generation: every stream then
            // starts decoding within a step of the others, so the window
            // from the first token to the last holds decode alone.
            let warm = prompts.iter().map(|p| tokens_request(p, 1)).collect();
            run(&handle, warm, rid);
            rid += streams as u64;
            let requests = prompts
                .iter()
                .map(|p| tokens_request(p, DECODE_TOKENS))
                .collect();
            let done = run(&handle, requests, rid);
            rid += streams as u64;
            // From the first stream's first token: a stream that had to wait
            // (a full KV pool) counts its wait, rather than shrinking the window.
            let start = done.iter().filter_map(|f| f.first_chunk).min().unwrap();
            let end = done.iter().map(|f| f.done).max().unwrap();
            let tokens: u32 = done
                .iter()
                .map(|f| f.usage.completion_tokens.saturating_sub(1))
                .sum();
            generated = done.iter().map(|f| f.usage.completion_tokens).sum::<u32>();
            rates.push(f64::from(tokens) / (end - start).as_secs_f64());
            let decode_s: f64 = done.iter().map(|f| f.timings.decode_s).sum();
            per_stream.push(f64::from(tokens) / decode_s);
        }
        rows.push((
            format!("decode, {streams} stream(s), aggregate"),
            format!(
                "{:.1} tok/s ({:.1} per stream, {generated} tokens)",
                median(rates),
                median(per_stream)
            ),
        ));
    }

    if let Some(grammars) = &grammars {
        rows.push((
            "constrained: token trie and parser factory, once per model".into(),
            format!("{:.1} ms", trie_s * 1e3),
        ));
        // Compiling a 2 KB schema: a new one each time, then the same again.
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        for i in 0..5 {
            let schema = wide_schema(&format!("run{i}"));
            let started = Instant::now();
            let mut matcher = grammars
                .compile(&Constraint::json_schema(schema.clone()))
                .unwrap();
            // The first mask builds lexer states lazily; it belongs to the first token too.
            matcher.compute_mask().unwrap();
            cold.push(started.elapsed().as_secs_f64());
            let started = Instant::now();
            let mut matcher = grammars.compile(&Constraint::json_schema(schema)).unwrap();
            matcher.compute_mask().unwrap();
            warm.push(started.elapsed().as_secs_f64());
        }
        rows.push((
            format!(
                "constrained: compile + first mask, {}-byte schema, new",
                wide_schema("run0").to_string().len()
            ),
            format!("{:.2} ms", median(cold) * 1e3),
        ));
        rows.push((
            "constrained: the same schema again (cached)".into(),
            format!("{:.3} ms", median(warm) * 1e3),
        ));
        let streams: Vec<usize> = std::env::var("ZINFER_BENCH_STREAMS")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![1, 16]);
        for &n in &streams {
            let mut itl = [Vec::new(), Vec::new()];
            let mut mask_wait = 0.0;
            let mut mask_busy = 0.0;
            // Alternate the two so drift from the shared machine hits both.
            for _ in 0..REPEATS {
                for (which, constrained) in [false, true].into_iter().enumerate() {
                    handle.flush_cache(None);
                    let before = handle.stats();
                    let requests = (0..n)
                        .map(|s| {
                            let at = (s * 16) % (corpus.len() - 128);
                            let mut request = tokens_request(&corpus[at..at + 128], DECODE_TOKENS);
                            if constrained {
                                request.constraint =
                                    Some(Box::new(Constraint::json_schema(long_schema())));
                            }
                            request
                        })
                        .collect();
                    let done = run(&handle, requests, rid);
                    rid += n as u64;
                    for f in &done {
                        assert_eq!(f.usage.completion_tokens, DECODE_TOKENS);
                    }
                    let per_token: Vec<f64> = done
                        .iter()
                        .map(|f| f.timings.decode_s / f64::from(DECODE_TOKENS - 1))
                        .collect();
                    itl[which].push(per_token.iter().sum::<f64>() / per_token.len() as f64);
                    if constrained {
                        let after = handle.stats();
                        mask_wait += after.mask_wait_s - before.mask_wait_s;
                        mask_busy += after.mask_s - before.mask_s;
                    }
                }
            }
            let (plain, masked) = (median(itl[0].clone()), median(itl[1].clone()));
            let steps = (REPEATS * (DECODE_TOKENS as usize)) as f64;
            rows.push((
                format!("inter-token latency, {n} stream(s): unconstrained / JSON schema"),
                format!(
                    "{:.2} / {:.2} ms ({:+.1}%); masks {:.2} ms per step, of which the step waited {:.2} ms",
                    plain * 1e3,
                    masked * 1e3,
                    (masked / plain - 1.0) * 100.0,
                    mask_busy / steps * 1e3,
                    mask_wait / steps * 1e3
                ),
            ));
        }
    }

    // TTFT of a 1,000-token prompt: cold, then with its first 950 cached.
    if selected("ttft") {
        let prompt = &corpus[..1000];
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        let mut cached = 0;
        for _ in 0..REPEATS {
            handle.flush_cache(None);
            let f = run(&handle, vec![tokens_request(prompt, 1)], rid);
            cold.push(f[0].timings.ttft_s);
            handle.flush_cache(None);
            let _ = run(&handle, vec![tokens_request(&prompt[..950], 1)], rid + 1);
            let f = run(&handle, vec![tokens_request(prompt, 1)], rid + 2);
            cached = f[0].usage.cached_tokens;
            warm.push(f[0].timings.ttft_s);
            rid += 3;
        }
        rows.push((
            "TTFT, 1,000-token prompt, cold".into(),
            format!("{:.0} ms", median(cold) * 1e3),
        ));
        rows.push((
            format!("TTFT, 1,000-token prompt, {cached} cached"),
            format!("{:.1} ms", median(warm) * 1e3),
        ));
    }

    // Warm TTFT alone, many times: a steadier median, and a profile of
    // the warm chunk without the cold prefill beside it.
    if selected("warm") {
        let mut warm = Vec::new();
        let mut cached = 0;
        handle.flush_cache(None);
        let _ = run(&handle, vec![tokens_request(&corpus[..950], 1)], rid);
        rid += 1;
        for i in 0..WARM_REPEATS {
            // The same 950 cached tokens, then 50 the cache has not seen.
            let tail = &corpus[1000 + 50 * i..1050 + 50 * i];
            let prompt: Vec<u32> = corpus[..950].iter().chain(tail).copied().collect();
            let f = run(&handle, vec![tokens_request(&prompt, 1)], rid);
            cached = f[0].usage.cached_tokens;
            warm.push(f[0].timings.ttft_s);
            rid += 1;
        }
        let (lo, hi) = (
            warm.iter().copied().fold(f64::MAX, f64::min),
            warm.iter().copied().fold(0.0, f64::max),
        );
        rows.push((
            format!("TTFT, 1,000-token prompt, {cached} cached, {WARM_REPEATS} runs"),
            format!(
                "{:.1} ms (min {:.1}, max {:.1})",
                median(warm) * 1e3,
                lo * 1e3,
                hi * 1e3
            ),
        ));
    }

    // Long prompts: prefill rate of a cold prompt of each length, and its
    // ratio to the 512-token rate (attention grows with the square of the
    // length, the matmuls linearly).
    if selected("long") {
        let lengths: Vec<usize> = std::env::var("ZINFER_BENCH_LONG")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![512, 1024, 2048, 4096, 8190]);
        let mut base = None;
        for len in lengths {
            if len >= max_positions {
                rows.push((
                    format!("prefill rate, {len}-token prompt"),
                    format!("skipped: the model's context is {max_positions} tokens"),
                ));
                continue;
            }
            assert!(corpus.len() >= len, "corpus has {} tokens", corpus.len());
            // One run for the slow lengths keeps the case within minutes.
            let repeats = if len > 2048 { 1 } else { REPEATS };
            let rates: Vec<f64> = (0..repeats)
                .map(|_| {
                    handle.flush_cache(None);
                    let f = run(&handle, vec![tokens_request(&corpus[..len], 1)], rid);
                    rid += 1;
                    len as f64 / f[0].timings.prefill_s
                })
                .collect();
            let rate = median(rates);
            let base = *base.get_or_insert(rate);
            rows.push((
                format!("prefill rate, {len}-token prompt ({repeats} run(s))"),
                format!("{rate:.0} tok/s ({:.2}x the first length)", rate / base),
            ));
        }
    }
    if selected("speculative") {
        speculative(&handle, &mut rid, &mut rows);
    }

    let stats = handle.stats();
    rows.push((
        "peak RSS (VmHWM)".into(),
        peak_rss_mib().map_or("n/a".into(), |m| format!("{m:.0} MiB")),
    ));
    drop(handle);

    println!(
        "\nzinfer engine bench: {} on {} (load {load_s:.1} s), threads {threads}, \
         kv capacity {}, median of {REPEATS}\n",
        path.display(),
        options_device,
        stats.kv_capacity
    );
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("| {:width$} | value |", "measure");
    println!("|{}|-------|", "-".repeat(width + 2));
    for (key, value) in rows {
        println!("| {key:width$} | {value} |");
    }
    let per_step = |seconds: f64| seconds * 1e3 / stats.steps.max(1) as f64;
    println!(
        "\nsteps {}, forward {:.1} s, engine overhead (step - forward) {:.3} ms/step, \
         preemptions {}",
        stats.steps,
        stats.forward_s,
        per_step(stats.step_s - stats.forward_s),
        stats.preemptions
    );
    println!(
        "step phases, ms/step: plan {:.3}, draft {:.3}, forward {:.3}, sample {:.3}, \
         rest {:.3} (step {:.3})",
        per_step(stats.plan_s),
        per_step(stats.draft_s),
        per_step(stats.forward_s),
        per_step(stats.sample_s),
        per_step(stats.rest_s),
        per_step(stats.step_s)
    );
    println!("sampling one 49,152-logit row: {}", sampling_cost());
}

/// The `speculative` case: a workload file's prompts decoded greedily with
/// speculation off and on, alternating group by group.
fn speculative(handle: &EngineHandle, rid: &mut u64, rows: &mut Vec<(String, String)>) {
    let file = std::env::var("ZINFER_BENCH_SPEC_FILE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../bench/workloads/quoting.jsonl"
        )
        .into()
    });
    let draft: u32 = std::env::var("ZINFER_BENCH_SPEC_DRAFT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let prompts: Vec<(String, u32)> = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("reading {file}: {e}"))
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            let prompt = value["prompt"].as_str().unwrap().to_string();
            let max_tokens = value["max_tokens"].as_u64().unwrap_or(128) as u32;
            (prompt, max_tokens)
        })
        .collect();
    let streams: Vec<usize> = std::env::var("ZINFER_BENCH_STREAMS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1]);
    let name = std::path::Path::new(&file)
        .file_name()
        .map_or(file.clone(), |n| n.to_string_lossy().into_owned());
    for &streams in &streams {
        // Per mode: decode tokens and seconds (one stream: the requests'
        // own decode time; several: first token to last done per group).
        let mut totals = [(0u64, 0.0f64); 2];
        let (mut drafted, mut accepted) = (0, 0);
        for group in prompts.chunks(streams.max(1)) {
            let mut lengths: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
            for (mode, on) in [false, true].into_iter().enumerate() {
                let before = handle.stats();
                let requests = group
                    .iter()
                    .map(|(prompt, max_tokens)| GenerateRequest {
                        temperature: 0.0,
                        max_tokens: *max_tokens,
                        speculative: Some(zinfer_protocol::Speculative {
                            ngram: 3,
                            max_draft: if on { draft } else { 0 },
                        }),
                        ..GenerateRequest::from_prompt("bench", prompt.as_str())
                    })
                    .collect();
                let done = run(handle, requests, *rid);
                *rid += group.len() as u64;
                let tokens: u64 = done
                    .iter()
                    .map(|f| u64::from(f.usage.completion_tokens.saturating_sub(1)))
                    .sum();
                let seconds = if streams == 1 {
                    done.iter().map(|f| f.timings.decode_s).sum()
                } else {
                    let start = done.iter().filter_map(|f| f.first_chunk).min().unwrap();
                    let end = done.iter().map(|f| f.done).max().unwrap();
                    (end - start).as_secs_f64()
                };
                totals[mode].0 += tokens;
                totals[mode].1 += seconds;
                lengths[mode] = done.iter().map(|f| f.usage.completion_tokens).collect();
                if on {
                    let after = handle.stats();
                    drafted += after.draft_tokens - before.draft_tokens;
                    accepted += after.accepted_draft_tokens - before.accepted_draft_tokens;
                }
            }
            assert_eq!(
                lengths[0], lengths[1],
                "speculation changed an output's length"
            );
        }
        let rate = |(tokens, seconds): (u64, f64)| tokens as f64 / seconds.max(1e-9);
        let (off, on) = (rate(totals[0]), rate(totals[1]));
        rows.push((
            format!("speculative, {name}, {streams} stream(s), off / on (draft {draft})"),
            format!(
                "{off:.1} / {on:.1} tok/s ({:.2}x), {accepted} of {drafted} draft tokens \
                 accepted ({:.0}%), {} tokens",
                on / off,
                100.0 * accepted as f64 / drafted.max(1) as f64,
                totals[1].0
            ),
        ));
    }
}
