//! Writes a synthetic llama GGUF (real shape, random weights) for speed
//! comparisons with bigger models than the one that can be downloaded:
//!
//! ```text
//! cargo run --release -p zinfer-worker --example synth_model -- \
//!     --shape tinyllama-1.1b --quant q4_k_m --out /tmp/tinyllama-q4km.gguf \
//!     [--seed N] [--layers N] [--tokenizer-from PATH]
//! ```
//!
//! The tokenizer metadata comes from `--tokenizer-from` (a GGUF file), else
//! from the default SmolLM2 model.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use zinfer_worker::synthetic::{PRESETS, QUANTS, SynthShape, SynthSpec, generate};

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
}

fn usage() -> String {
    format!(
        "usage: synth_model --shape NAME --quant TYPE --out FILE [--seed N] [--layers N] [--tokenizer-from GGUF]\n  shapes: {}\n  quants: {}",
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
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{}", usage());
            std::process::exit(0);
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
            "--tokenizer-from" => tokenizer_from = Some(PathBuf::from(value)),
            other => return Err(format!("unknown flag {other}\n{}", usage()).into()),
        }
    }
    let missing = |what: &str| format!("{what} is required\n{}", usage());
    Ok(Args {
        shape: shape.ok_or_else(|| missing("--shape"))?,
        quant: quant.ok_or_else(|| missing("--quant"))?,
        out: out.ok_or_else(|| missing("--out"))?,
        seed,
        layers,
        tokenizer_from,
    })
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let mut shape = SynthShape::preset(&args.shape)?;
    if let Some(n) = args.layers {
        shape.n_layers = n;
    }
    let spec = SynthSpec {
        shape,
        quant: args.quant.parse()?,
        seed: args.seed,
    };
    let tok_path = match args.tokenizer_from {
        Some(p) => p,
        None => zinfer_worker::fetch::test_model_path()?,
    };
    let mut f = std::fs::File::open(&tok_path)
        .map_err(|e| format!("opening {}: {e}", tok_path.display()))?;
    let tokenizer = gguf_file::Content::read(&mut f)
        .map_err(|e| format!("reading {}: {e}", tok_path.display()))?
        .metadata;
    let s = &spec.shape;
    println!(
        "{} ({} layers, hidden {}, heads {}/{}, ffn {}, vocab {}), {}, seed {} -> {}",
        s.name,
        s.n_layers,
        s.hidden,
        s.n_heads,
        s.n_kv_heads,
        s.ffn,
        s.vocab,
        args.quant,
        spec.seed,
        args.out.display()
    );
    let start = Instant::now();
    let summary = generate(&args.out, &spec, &tokenizer, |p| {
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
    })?;
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
    Ok(())
}
