//! zinfer's side of `scripts/llamacpp-reference.sh --embeddings`: the final
//! hidden state of every position of some token-id prompts, as JSON lines,
//! and optionally every position's logits as raw f32.
//!
//! ```text
//! cargo run -p zinfer-model --example dump_embeddings -- MODEL.gguf PROMPTS.txt \
//!     [--threads N] [--chunk C] [--logits OUT.f32] > out.jsonl
//! cargo run -p zinfer-model --example dump_embeddings -- MODEL.gguf PROMPTS.txt --rank > scores.jsonl
//! cargo run -p zinfer-model --example dump_embeddings -- MODEL.gguf PAIRS.tsv --rank --pairs > scores.jsonl
//! ```
//!
//! PROMPTS.txt holds one prompt per line, token ids separated by spaces (no
//! tokenizer involved). For every position one line goes to stdout:
//!
//! ```text
//! {"prompt":P,"pos":I,"hidden":[hidden_size() values]}
//! ```
//!
//! the row [`ChunkOutput::AllHidden`] gives for it: after the output norm,
//! before the LM head, unpooled and not normalised. These are the lines
//! `scripts/llamacpp-reference/dump_embeddings.cpp` writes for llama.cpp
//! with `LLAMA_POOLING_TYPE_NONE`; `compare_embeddings.py` pools them.
//!
//! Each prompt runs as one prefill chunk (`--chunk C`: in chunks of C
//! positions, each on top of the ones before). With `--logits`, every step
//! also runs a second copy of the same chunk, in other slots of the same
//! batch, asking for [`ChunkOutput::AllLogits`]; its rows go to OUT.f32 as
//! raw little-endian f32, prompt by prompt, position by position,
//! `vocab_size()` per position, as the C++ side writes them. The model runs
//! on the CPU with an f32 K/V pool.
//!
//! `--rank` (a reranker GGUF, each prompt a formatted query/document pair)
//! writes instead one line per prompt, the [`Classifier`]'s outputs for the
//! last position's hidden state, as `dump_embeddings.cpp --rank` does with
//! llama.cpp's rank pooling: `{"prompt":P,"scores":[outputs]}`. With
//! `--pairs` each line is a query, a tab and a document, made a prompt by
//! `ModelTokenizer::rerank_prompt`, and the line has `"tokens":[ids]` too.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use zinfer_model::{AttentionDtype, ChunkOutput, Classifier, LoadOptions, SeqChunk, load};

/// Errors are reported, not handled: a boxed error is enough here.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const USAGE: &str = "usage: dump_embeddings MODEL.gguf PROMPTS.txt [--rank] [--threads N] [--chunk C] [--logits OUT.f32]";

struct Args {
    model: PathBuf,
    prompts: PathBuf,
    threads: usize,
    /// Positions per chunk; 0: the whole prompt.
    chunk: usize,
    logits: Option<PathBuf>,
    rank: bool,
    pairs: bool,
}

fn parse_args() -> Result<Args> {
    let mut positional = Vec::new();
    let (mut threads, mut chunk, mut logits, mut rank, mut pairs) = (1, 0, None, false, false);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let target = match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--rank" => {
                rank = true;
                continue;
            }
            "--pairs" => {
                pairs = true;
                continue;
            }
            "--threads" => &mut threads,
            "--chunk" => &mut chunk,
            "--logits" => {
                let path = it.next().ok_or("--logits needs a path")?;
                logits = Some(PathBuf::from(path));
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
        chunk,
        logits,
        rank,
        pairs,
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

/// Query/document pairs (query TAB document per line), made prompts by
/// the model's tokenizer as a reranker's.
fn read_pairs(model: &std::path::Path, path: &std::path::Path) -> Result<Vec<Vec<u32>>> {
    let tokenizer = zinfer_text::ModelTokenizer::open(model)?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read pairs file {}: {e}", path.display()))?;
    text.lines()
        .map(|line| {
            let (query, document) = line
                .split_once('\t')
                .ok_or_else(|| format!("pairs file {}: a line without a tab", path.display()))?;
            Ok(tokenizer.rerank_prompt(query, document)?)
        })
        .collect()
}

/// One JSON line: a position's hidden state.
fn hidden_line(prompt: usize, pos: usize, row: &[f32]) -> Result<String> {
    if row.iter().any(|v| !v.is_finite()) {
        return Err(format!("non-finite hidden state at prompt {prompt} position {pos}").into());
    }
    let values: Vec<String> = row.iter().map(f32::to_string).collect();
    Ok(format!(
        "{{\"prompt\":{prompt},\"pos\":{pos},\"hidden\":[{}]}}",
        values.join(",")
    ))
}

fn run() -> Result<()> {
    let args = parse_args()?;
    let prompts = if args.pairs {
        read_pairs(&args.model, &args.prompts)?
    } else {
        read_prompts(&args.prompts)?
    };
    let head = if args.rank {
        Some(
            Classifier::load(&args.model)?
                .ok_or_else(|| format!("{} is not a reranker", args.model.display()))?,
        )
    } else {
        None
    };
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let mut loaded = load(
        &args.model,
        &LoadOptions {
            // A second copy of each prompt for the logits.
            kv_capacity: 2 * longest,
            threads: Some(args.threads),
            // As llama.cpp's side: bf16 products (the default on an AVX-512
            // BF16 CPU) move a reranker's scores by more than 1e-3.
            attention: if args.rank {
                AttentionDtype::F32
            } else {
                AttentionDtype::Auto
            },
            ..LoadOptions::default()
        },
    )
    .map_err(|e| format!("zinfer could not load {}: {e}", args.model.display()))?;
    let model = &mut loaded.model;
    let (vocab, hidden) = (model.vocab_size(), model.hidden_size());
    if let Some(id) = prompts.iter().flatten().find(|&&id| id as usize >= vocab) {
        return Err(format!("token id {id} is outside the vocabulary of {vocab}").into());
    }
    eprintln!(
        "dump_embeddings: zinfer, {}, hidden {hidden}, vocab {vocab}, {} thread(s), chunk {}",
        args.model.display(),
        args.threads,
        if args.chunk == 0 {
            "whole prompt".to_string()
        } else {
            args.chunk.to_string()
        }
    );
    let mut logits_out = match &args.logits {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        )),
        None => None,
    };
    let hidden_slots: Vec<u32> = (0..longest as u32).collect();
    let logit_slots: Vec<u32> = (longest as u32..2 * longest as u32).collect();
    let mut out = String::new();
    for (p, ids) in prompts.iter().enumerate() {
        let chunk = if args.chunk == 0 {
            ids.len()
        } else {
            args.chunk
        };
        for start in (0..ids.len()).step_by(chunk) {
            let end = (start + chunk).min(ids.len());
            let rows = end - start;
            let mut batch = vec![SeqChunk {
                tokens: &ids[start..end],
                slots: &hidden_slots[..end],
                start_pos: start,
                output: ChunkOutput::AllHidden,
            }];
            if logits_out.is_some() {
                batch.push(SeqChunk {
                    slots: &logit_slots[..end],
                    output: ChunkOutput::AllLogits,
                    ..batch[0]
                });
            }
            let outputs = model.forward(&batch)?;
            let states = &outputs[0];
            if states.len() != rows * hidden {
                return Err(format!(
                    "{} values for {rows} hidden states of {hidden}",
                    states.len()
                )
                .into());
            }
            if let Some(head) = &head {
                if end == ids.len() {
                    let last = &states[(rows - 1) * hidden..];
                    let scores: Vec<String> =
                        head.scores(last)?.iter().map(f32::to_string).collect();
                    let tokens = if args.pairs {
                        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                        format!("\"tokens\":[{}],", ids.join(","))
                    } else {
                        String::new()
                    };
                    out.push_str(&format!(
                        "{{\"prompt\":{p},{tokens}\"scores\":[{}]}}\n",
                        scores.join(",")
                    ));
                }
                continue;
            }
            for (pos, row) in (start..end).zip(states.chunks_exact(hidden)) {
                out.push_str(&hidden_line(p, pos, row)?);
                out.push('\n');
            }
            if let Some(w) = logits_out.as_mut() {
                let logits = &outputs[1];
                if logits.len() != rows * vocab {
                    return Err(
                        format!("{} logits for {rows} rows of {vocab}", logits.len()).into(),
                    );
                }
                let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
                w.write_all(&bytes)?;
            }
        }
    }
    if let Some(mut w) = logits_out {
        w.flush()?;
    }
    print!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dump_embeddings: {e}");
            ExitCode::FAILURE
        }
    }
}
