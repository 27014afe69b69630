//! Forward-pass throughput on the default model: prefill of a 512-token
//! prompt, single-stream decode and 16-stream batched decode.
//!
//! `cargo bench -p zinfer-worker --bench forward`; set `CANDLE_NUM_THREADS`
//! to choose the thread count (1 keeps every kernel on the calling thread). Prints medians of a few runs.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Instant;

use zinfer_fetch::test_model_path;
use zinfer_model::{ChunkOutput, LoadOptions, SeqChunk, load};

const PROMPT: &str = "The history of the city goes back many centuries, and its streets \
    still show the marks of every age that passed through them. ";

/// CPU seconds this process has used (user + system), from /proc; on a
/// shared machine `tokens / cpu` with one thread shows the kernel cost that
/// wall time hides behind other processes.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / 100.0
}

/// Runs `f` and returns (wall seconds, CPU seconds).
fn timed(f: impl FnOnce()) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu_seconds());
    f();
    (t.elapsed().as_secs_f64(), cpu_seconds() - c)
}

fn report(what: &str, tokens: f64, runs: Vec<(f64, f64)>) {
    let wall = median(runs.iter().map(|r| tokens / r.0).collect());
    let cpu = median(runs.iter().map(|r| tokens / r.1.max(1e-9)).collect());
    println!(
        "{what}: {wall:.1} tok/s wall, {cpu:.1} tok/s per CPU-second (median of {})",
        runs.len()
    );
}

/// Resident set size of this process in MiB, from /proc.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .unwrap()
}

fn main() {
    let path = test_model_path().unwrap();
    let capacity = 16_384;
    // The thread count follows CANDLE_NUM_THREADS, which sizes the kernels' pool.
    let threads: Option<usize> = std::env::var("CANDLE_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    let t0 = Instant::now();
    let loaded = load(
        &path,
        &LoadOptions {
            kv_capacity: capacity,
            threads,
            // ZINFER_KV_DTYPE (`f32` or `f16`) picks the KV pool element type.
            kv_dtype: std::env::var("ZINFER_KV_DTYPE")
                .ok()
                .map(|v| v.parse().unwrap())
                .unwrap_or_default(),
            attention: std::env::var("ZINFER_ATTENTION_DTYPE")
                .ok()
                .map(|v| v.parse().unwrap())
                .unwrap_or_default(),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let load_s = t0.elapsed().as_secs_f64();
    let mut model = loaded.model;
    let threads = threads.unwrap_or_else(zinfer_model::kernel_threads);
    let tokenizer = zinfer_text::ModelTokenizer::open(&path).unwrap();
    let mut text = String::new();
    let prompt = loop {
        let ids = tokenizer.encode(&text).unwrap();
        if ids.len() >= 512 {
            break ids[..512].to_vec();
        }
        text.push_str(PROMPT);
    };
    let slots: Vec<u32> = (0..capacity as u32).collect();
    let file_mib = std::fs::metadata(&path).map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64);
    println!(
        "model {} ({file_mib:.1} MiB) loaded in {load_s:.2} s, {threads} threads, RSS {:.1} MiB",
        path.display(),
        rss_mib()
    );

    let runs = 3;
    let mut prefill = Vec::new();
    for _ in 0..runs {
        let chunk = [SeqChunk {
            tokens: &prompt,
            slots: &slots[..512],
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        }];
        prefill.push(timed(|| {
            model.forward(&chunk).unwrap();
        }));
    }
    report("prefill 512 tokens", 512.0, prefill);

    let steps = 64;
    let mut single = Vec::new();
    for _ in 0..runs {
        let start = 32;
        let first = [SeqChunk {
            tokens: &prompt[..start],
            slots: &slots[..start],
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        }];
        let mut logits = model.forward(&first).unwrap();
        single.push(timed(|| {
            for pos in start..start + steps {
                let tok = [argmax(&logits[0])];
                let chunk = [SeqChunk {
                    tokens: &tok,
                    slots: &slots[..=pos],
                    start_pos: pos,
                    output: ChunkOutput::LastLogits,
                }];
                logits = model.forward(&chunk).unwrap();
            }
        }));
    }
    report(
        "decode, 1 stream (64 steps after a 32-token prompt)",
        steps as f64,
        single,
    );

    let streams = 16;
    let prompt_len = 32;
    let span = prompt_len + steps + 1;
    let seq_slots: Vec<&[u32]> = (0..streams)
        .map(|s| &slots[s * span..(s + 1) * span])
        .collect();
    let mut multi = Vec::new();
    for _ in 0..runs {
        // Each stream gets a different prompt (a different window of the text).
        let chunks: Vec<SeqChunk> = (0..streams)
            .map(|s| SeqChunk {
                tokens: &prompt[s * 8..s * 8 + prompt_len],
                slots: &seq_slots[s][..prompt_len],
                start_pos: 0,
                output: ChunkOutput::LastLogits,
            })
            .collect();
        let mut logits = model.forward(&chunks).unwrap();
        multi.push(timed(|| {
            for pos in prompt_len..prompt_len + steps {
                let toks: Vec<[u32; 1]> = logits.iter().map(|l| [argmax(l)]).collect();
                let chunks: Vec<SeqChunk> = (0..streams)
                    .map(|s| SeqChunk {
                        tokens: &toks[s],
                        slots: &seq_slots[s][..=pos],
                        start_pos: pos,
                        output: ChunkOutput::LastLogits,
                    })
                    .collect();
                logits = model.forward(&chunks).unwrap();
            }
        }));
    }
    report(
        &format!("decode, {streams} streams, aggregate"),
        (streams * steps) as f64,
        multi,
    );
    // KV rows: 30 layers x (K + V) x 192 f32 = 45 KiB per slot, committed as slots are first written.
    let touched_slots = (streams * span).max(512);
    println!(
        "RSS at the end {:.1} MiB ({touched_slots} KV slots written)",
        rss_mib()
    );
}
