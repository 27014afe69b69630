//! Writes a synthetic GGUF checkpoint (real shape, random weights) for speed
//! comparisons with bigger models than the one that can be downloaded, and
//! for tests of other architectures (llama, qwen2, qwen3, qwen3moe, phi3,
//! gemma2, gemma3):
//!
//! ```text
//! cargo run --release -p zinfer-model --features synthetic --example synth_model -- \
//!     --shape tinyllama-1.1b --quant q4_k_m --out /tmp/tinyllama-q4km.gguf \
//!     [--seed N] [--layers N] [--vocab NAME | --tokenizer-from PATH] [--threads N] [--check]
//!     [--rerank] [--rerank-template TEMPLATE]
//! ```
//!
//! `--rerank` makes it a reranker as llama.cpp converts Qwen3-Reranker
//! (`pooling_type` rank, a two-row `cls.output` of "yes" and "no");
//! `--rerank-template` (implies `--rerank`) adds `tokenizer.chat_template.rerank`,
//! with `{query}` and `{document}` where they go.
//!
//! `--check` then loads the file with the worker's loader and times a
//! 128-token prefill and 32 decode steps (one sequence), a quick sanity and
//! speed figure (`ZINFER_THREADS` and `CANDLE_NUM_THREADS` as for the
//! engine bench); the engine bench and `llama-bench` give the real ones.
//!
//! The tokenizer metadata comes from `--tokenizer-from` (a GGUF file), else
//! from llama.cpp's test vocabulary `ggml-vocab-NAME.gguf` of `--vocab NAME`
//! (fetched by zinfer-fetch), else from the shape's own vocabulary for the
//! non-llama shapes (Qwen's, Phi-3's; Gemma's stand-in is llama-spm), else
//! from the default SmolLM2 model, as for the llama shapes (`--vocab
//! llama-bpe` gives llama-3.2-1b Llama 3's). `--threads` (default: every
//! core) quantize in parallel; the file is the same for any count.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use zinfer_model::synthetic::{
    Architecture, PRESETS, QUANTS, Rerank, SynthShape, SynthSpec, generate, generate_reranker,
};
use zinfer_model::{ChunkOutput, LoadOptions, SeqChunk, load};

/// Errors are reported, not handled: a boxed error is enough here.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const MIB: f64 = 1024.0 * 1024.0;

struct Args {
    shape: String,
    quant: String,
    out: PathBuf,
    seed: u64,
    layers: Option<usize>,
    tokenizer_from: Option<PathBuf>,
    vocab: Option<String>,
    check: bool,
    threads: usize,
    rerank: Option<Rerank>,
}

fn usage() -> String {
    format!(
        "usage: synth_model --shape NAME --quant TYPE --out FILE [--seed N] [--layers N] [--vocab NAME | --tokenizer-from GGUF] [--threads N] [--check] [--rerank] [--rerank-template T]\n  shapes: {}\n  quants: {}\n  vocab: a llama.cpp test vocabulary (ggml-vocab-NAME.gguf), e.g. qwen2, phi-3, llama-bpe, llama-spm",
        PRESETS.join(", "),
        QUANTS.join(", ")
    )
}

fn parse_args() -> Result<Args> {
    let mut shape = None;
    let mut quant = None;
    let mut out = None;
    let mut seed = 0;
    let mut layers = None;
    let mut tokenizer_from = None;
    let mut vocab = None;
    let mut check = false;
    let mut rerank = None;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{}", usage());
            std::process::exit(0);
        }
        if flag == "--check" {
            check = true;
            continue;
        }
        if flag == "--rerank" {
            rerank.get_or_insert_with(Rerank::default);
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))?;
        match flag.as_str() {
            "--shape" => shape = Some(value),
            "--quant" => quant = Some(value),
            "--out" => out = Some(PathBuf::from(value)),
            "--seed" => seed = value.parse().map_err(|e| format!("--seed: {e}"))?,
            "--layers" => layers = Some(value.parse().map_err(|e| format!("--layers: {e}"))?),
            "--threads" => threads = value.parse().map_err(|e| format!("--threads: {e}"))?,
            "--tokenizer-from" => tokenizer_from = Some(PathBuf::from(value)),
            "--vocab" => vocab = Some(value),
            "--rerank-template" => {
                rerank = Some(Rerank {
                    template: Some(value),
                })
            }
            other => return Err(format!("unknown flag {other}\n{}", usage()).into()),
        }
    }
    if tokenizer_from.is_some() && vocab.is_some() {
        return Err(format!(
            "--vocab and --tokenizer-from exclude each other\n{}",
            usage()
        )
        .into());
    }
    let missing = |what: &str| format!("{what} is required\n{}", usage());
    Ok(Args {
        shape: shape.ok_or_else(|| missing("--shape"))?,
        quant: quant.ok_or_else(|| missing("--quant"))?,
        out: out.ok_or_else(|| missing("--out"))?,
        seed,
        layers,
        tokenizer_from,
        vocab,
        check,
        threads,
        rerank,
    })
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let mut shape = SynthShape::preset(&args.shape)?;
    if let Some(n) = args.layers {
        shape.n_layers = n;
    }
    // Llama shapes keep the default model's tokenizer, as before vocabularies
    // could be fetched (the published speed figures use those files).
    let vocab = args.vocab.or_else(|| {
        (shape.arch != Architecture::Llama)
            .then(|| shape.vocab_file.clone())
            .flatten()
    });
    let tok_path = match (args.tokenizer_from, vocab) {
        (Some(p), _) => p,
        (None, Some(name)) => zinfer_fetch::vocab_file(&name)?,
        (None, None) => zinfer_fetch::test_model_path()?,
    };
    let mut f = std::fs::File::open(&tok_path)
        .map_err(|e| format!("opening {}: {e}", tok_path.display()))?;
    let tokenizer = gguf_file::Content::read(&mut f)
        .map_err(|e| format!("reading {}: {e}", tok_path.display()))?
        .metadata;
    let spec = SynthSpec {
        shape: shape.fitted_to(&tokenizer)?,
        quant: args.quant.parse()?,
        seed: args.seed,
        threads: args.threads,
    };
    let s = &spec.shape;
    println!(
        "{} ({} {} layers, hidden {}, heads {}/{} of {}, ffn {}, vocab {} from {}), {}, seed {} -> {}",
        s.name,
        s.arch,
        s.n_layers,
        s.hidden,
        s.n_heads,
        s.n_kv_heads,
        s.head_dim,
        s.ffn,
        s.vocab,
        tok_path.display(),
        args.quant,
        spec.seed,
        args.out.display()
    );
    if let Some(m) = s.moe {
        println!(
            "{} experts of width {} per layer, {} per token",
            m.experts, m.expert_ffn, m.used
        );
    }
    let start = Instant::now();
    let progress = |p: &zinfer_model::synthetic::Progress<'_>| {
        if let (Some(layer), true) = (p.layer, p.end_of_layer) {
            println!(
                "layer {:>3}/{}: {:.1} of {:.1} MiB, {:.1} s",
                layer + 1,
                s.n_layers,
                p.bytes_done as f64 / MIB,
                p.bytes_total as f64 / MIB,
                start.elapsed().as_secs_f64()
            );
        }
    };
    let summary = match &args.rerank {
        Some(r) => generate_reranker(&args.out, &spec, &tokenizer, r, progress)?,
        None => generate(&args.out, &spec, &tokenizer, progress)?,
    };
    let types: Vec<String> = summary
        .tensor_types
        .iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    println!(
        "wrote {} ({} bytes, {:.1} MiB) in {:.1} s; tensors: {}",
        args.out.display(),
        summary.file_bytes,
        summary.file_bytes as f64 / MIB,
        start.elapsed().as_secs_f64(),
        types.join(", ")
    );
    if args.check {
        check(&args.out, s.vocab)?;
    }
    Ok(())
}

/// Loads the file as the worker would and times one sequence's prefill and
/// decode; fails on logits that are not finite.
fn check(path: &std::path::Path, vocab: usize) -> Result<()> {
    const PREFILL: usize = 128;
    const DECODE: usize = 32;
    let start = Instant::now();
    let mut m = load(
        path,
        &LoadOptions {
            kv_capacity: PREFILL + DECODE,
            // As the engine bench reads it: 1 keeps every kernel on this thread.
            threads: std::env::var("ZINFER_THREADS")
                .ok()
                .and_then(|v| v.parse().ok()),
            ..LoadOptions::default()
        },
    )?;
    println!("loaded in {:.2} s", start.elapsed().as_secs_f64());
    // Any ids below the vocabulary do: speed does not depend on them.
    let mut ids: Vec<u32> = (0..PREFILL)
        .map(|i| ((1000 + 7 * i) % vocab) as u32)
        .collect();
    let slots: Vec<u32> = (0..(PREFILL + DECODE) as u32).collect();
    let mut step = |ids: &[u32], start_pos: usize| -> Result<u32> {
        let logits = m.model.forward(&[SeqChunk {
            tokens: &ids[start_pos..],
            slots: &slots[..ids.len()],
            start_pos,
            output: ChunkOutput::LastLogits,
        }])?;
        let last = logits.first().ok_or("no logits")?;
        if last.len() != vocab || !last.iter().all(|x| x.is_finite()) {
            return Err(format!(
                "bad logits: {} values, finite: {}",
                last.len(),
                last.iter().all(|x| x.is_finite())
            )
            .into());
        }
        let next = last
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32);
        Ok(next)
    };
    let prompt = ids.clone();
    // Run 0 warms up (first-touch of the KV pool and scratch buffers), as
    // llama-bench does; run 1 is reported.
    for run in 0..2 {
        ids.clone_from(&prompt);
        let t = Instant::now();
        let mut next = step(&ids, 0)?;
        let prefill_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..DECODE {
            ids.push(next);
            next = step(&ids, ids.len() - 1)?;
        }
        let decode_s = t.elapsed().as_secs_f64();
        if run == 1 {
            println!(
                "prefill {PREFILL} tokens: {:.1} tok/s; decode {DECODE} tokens: {:.1} tok/s (one sequence, logits finite)",
                PREFILL as f64 / prefill_s,
                DECODE as f64 / decode_s
            );
        }
    }
    Ok(())
}
