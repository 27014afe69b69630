//! Forward-pass throughput on the default model: prefill of a 512-token
//! prompt, single-stream decode and 16-stream batched decode.
//!
//! `cargo bench -p zinfer-worker --bench forward`; set `CANDLE_NUM_THREADS`
//! to choose the thread count. Prints medians of a few runs.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Instant;

use zinfer_worker::fetch::test_model_path;
use zinfer_worker::model::{LoadOptions, SeqChunk, load};

const PROMPT: &str = "The history of the city goes back many centuries, and its streets \
    still show the marks of every age that passed through them. ";

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
    let t0 = Instant::now();
    let loaded = load(
        &path,
        &LoadOptions {
            kv_capacity: capacity,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let load_s = t0.elapsed().as_secs_f64();
    let mut model = loaded.model;
    let threads = candle_core::utils::barrier_pool().n_workers() + 1;
    let mut text = String::new();
    let prompt = loop {
        let ids = loaded.tokenizer.encode(&text).unwrap();
        if ids.len() >= 512 {
            break ids[..512].to_vec();
        }
        text.push_str(PROMPT);
    };
    let slots: Vec<u32> = (0..capacity as u32).collect();
    println!(
        "model {} loaded in {load_s:.2} s, {threads} threads",
        path.display()
    );

    let runs = 3;
    let mut prefill = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        model
            .forward(&[SeqChunk {
                tokens: &prompt,
                slots: &slots[..512],
                start_pos: 0,
            }])
            .unwrap();
        prefill.push(512.0 / t.elapsed().as_secs_f64());
    }
    println!(
        "prefill 512 tokens: {:.1} tok/s (median of {runs})",
        median(prefill)
    );

    let steps = 64;
    let mut single = Vec::new();
    for _ in 0..runs {
        let start = 32;
        let mut logits = model
            .forward(&[SeqChunk {
                tokens: &prompt[..start],
                slots: &slots[..start],
                start_pos: 0,
            }])
            .unwrap();
        let t = Instant::now();
        for pos in start..start + steps {
            let tok = [argmax(&logits[0])];
            logits = model
                .forward(&[SeqChunk {
                    tokens: &tok,
                    slots: &slots[..=pos],
                    start_pos: pos,
                }])
                .unwrap();
        }
        single.push(steps as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "decode, 1 stream: {:.1} tok/s (median of {runs}, {steps} steps after a 32-token prompt)",
        median(single)
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
            })
            .collect();
        let mut logits = model.forward(&chunks).unwrap();
        let t = Instant::now();
        for pos in prompt_len..prompt_len + steps {
            let toks: Vec<[u32; 1]> = logits.iter().map(|l| [argmax(l)]).collect();
            let chunks: Vec<SeqChunk> = (0..streams)
                .map(|s| SeqChunk {
                    tokens: &toks[s],
                    slots: &seq_slots[s][..=pos],
                    start_pos: pos,
                })
                .collect();
            logits = model.forward(&chunks).unwrap();
        }
        multi.push((streams * steps) as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "decode, {streams} streams: {:.1} tok/s aggregate (median of {runs})",
        median(multi)
    );
}
