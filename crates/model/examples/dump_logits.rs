//! zinfer's side of `scripts/llamacpp-reference.sh`: the top-k log-softmax
//! of every position of some token-id prompts, as JSON lines.
//!
//! ```text
//! cargo run -p zinfer-model --example dump_logits -- MODEL.gguf PROMPTS.txt \
//!     [--threads N] [--top-k K] [--chunk C] [--all-logits] > out.jsonl
//! ```
//!
//! PROMPTS.txt holds one prompt per line, token ids separated by spaces (no
//! tokenizer involved). For every position one line goes to stdout:
//!
//! ```text
//! {"prompt":P,"pos":I,"ids":[top-k ids],"logprobs":[their log-softmax]}
//! ```
//!
//! ids by descending logit (lower id first on equal logits), log-softmax in
//! f64 over the whole vocabulary: the lines `scripts/llamacpp-reference/dump_logits.cpp`
//! writes for llama.cpp. The model runs on the CPU with an f32 K/V pool and
//! f32 attention, as llama.cpp's side does: on a CPU with AVX-512 BF16 the
//! default bf16 attention rounds scores enough to flip near-tied expert
//! choices of a 128-expert router.
//!
//! By default every position takes its own step, asking for the logits of
//! its chunk's last token ([`ChunkOutput::LastLogits`], what sampling
//! uses). With `--chunk 1` (the default) those are the engine's decode
//! steps: position `i` is one token on top of `i` cached ones. With
//! `--chunk C` the prompt goes in blocks of C positions; position `i` of
//! the block starting at `j` is a prefill chunk `j..=i` on top of `j`
//! cached positions, so the prefill path (chunks of 1 to C tokens) produces
//! every logit instead. `--all-logits` runs each block as ONE chunk asking
//! for every row's logits ([`ChunkOutput::AllLogits`], prompt logprobs).

use std::path::PathBuf;
use std::process::ExitCode;

use zinfer_model::{AttentionDtype, ChunkOutput, LoadOptions, SeqChunk, load};

/// Errors are reported, not handled: a boxed error is enough here.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const USAGE: &str = "usage: dump_logits MODEL.gguf PROMPTS.txt [--threads N] [--top-k K] [--chunk C] [--all-logits]";

struct Args {
    model: PathBuf,
    prompts: PathBuf,
    threads: usize,
    top_k: usize,
    chunk: usize,
    all_logits: bool,
}

fn parse_args() -> Result<Args> {
    let mut positional = Vec::new();
    let (mut threads, mut top_k, mut chunk) = (1, 8, 1);
    let mut all_logits = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let target = match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--threads" => &mut threads,
            "--top-k" => &mut top_k,
            "--chunk" => &mut chunk,
            "--all-logits" => {
                all_logits = true;
                continue;
            }
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}").into()),
            _ => {
                positional.push(PathBuf::from(arg));
                continue;
            }
        };
        let value = it.next().ok_or_else(|| format!("{arg} needs a value"))?;
        *target = match value.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("{arg} must be a positive integer, not {value}").into()),
        };
    }
    let [model, prompts] = <[PathBuf; 2]>::try_from(positional)
        .map_err(|_| "expected MODEL.gguf and PROMPTS.txt".to_string())?;
    Ok(Args {
        model,
        prompts,
        threads,
        top_k,
        chunk,
        all_logits,
    })
}

fn read_prompts(path: &std::path::Path) -> Result<Vec<Vec<u32>>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read prompts file {}: {e}", path.display()))?;
    let mut prompts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let ids = line
            .split_whitespace()
            .map(str::parse::<u32>)
            .collect::<std::result::Result<Vec<u32>, _>>()
            .map_err(|_| {
                format!(
                    "prompts file {}: line {} is not a list of token ids",
                    path.display(),
                    n + 1
                )
            })?;
        if !ids.is_empty() {
            prompts.push(ids);
        }
    }
    if prompts.is_empty() {
        return Err(format!("no prompts in {}", path.display()).into());
    }
    Ok(prompts)
}

/// One JSON line: the top-k ids and their log-softmax, as the C++ side
/// writes it.
fn position_line(prompt: usize, pos: usize, logits: &[f32], top_k: usize) -> Result<String> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let sum: f64 = logits.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    let log_z = max + sum.ln();
    if !log_z.is_finite() {
        return Err(format!("non-finite logits at prompt {prompt} position {pos}").into());
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = top_k.min(order.len());
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, by_logit);
    }
    order.truncate(k);
    order.sort_by(by_logit);
    let ids: Vec<String> = order.iter().map(|i| i.to_string()).collect();
    let logprobs: Vec<String> = order
        .iter()
        .map(|&i| format!("{:.7}", f64::from(logits[i]) - log_z))
        .collect();
    Ok(format!(
        "{{\"prompt\":{prompt},\"pos\":{pos},\"ids\":[{}],\"logprobs\":[{}]}}",
        ids.join(","),
        logprobs.join(",")
    ))
}

fn run() -> Result<()> {
    let args = parse_args()?;
    let prompts = read_prompts(&args.prompts)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let mut loaded = load(
        &args.model,
        &LoadOptions {
            kv_capacity: longest,
            threads: Some(args.threads),
            attention: AttentionDtype::F32,
            ..LoadOptions::default()
        },
    )
    .map_err(|e| format!("zinfer could not load {}: {e}", args.model.display()))?;
    let model = &mut loaded.model;
    let vocab = model.vocab_size();
    if let Some(id) = prompts.iter().flatten().find(|&&id| id as usize >= vocab) {
        return Err(format!("token id {id} is outside the vocabulary of {vocab}").into());
    }
    eprintln!(
        "dump_logits: zinfer, {}, vocab {vocab}, {} thread(s), chunk {}{}",
        args.model.display(),
        args.threads,
        args.chunk,
        if args.all_logits { ", all logits" } else { "" }
    );
    let slots: Vec<u32> = (0..longest as u32).collect();
    let mut out = String::new();
    for (p, ids) in prompts.iter().enumerate() {
        for block in (0..ids.len()).step_by(args.chunk) {
            let end = (block + args.chunk).min(ids.len());
            if args.all_logits {
                let rows = model.forward(&[SeqChunk {
                    tokens: &ids[block..end],
                    slots: &slots[..end],
                    start_pos: block,
                    output: ChunkOutput::AllLogits,
                }])?;
                let rows = rows.first().ok_or("the model returned no logits")?;
                if rows.len() != (end - block) * vocab {
                    return Err(format!(
                        "{} logits for {} rows, expected {vocab} per row",
                        rows.len(),
                        end - block
                    )
                    .into());
                }
                for (pos, row) in (block..end).zip(rows.chunks_exact(vocab)) {
                    out.push_str(&position_line(p, pos, row, args.top_k)?);
                    out.push('\n');
                }
                continue;
            }
            for pos in block..end {
                let logits = model.forward(&[SeqChunk {
                    tokens: &ids[block..=pos],
                    slots: &slots[..=pos],
                    start_pos: block,
                    output: ChunkOutput::LastLogits,
                }])?;
                let last = logits.first().ok_or("the model returned no logits")?;
                if last.len() != vocab {
                    return Err(format!("{} logits, expected {vocab}", last.len()).into());
                }
                out.push_str(&position_line(p, pos, last, args.top_k)?);
                out.push('\n');
            }
        }
    }
    print!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dump_logits: {e}");
            ExitCode::FAILURE
        }
    }
}
