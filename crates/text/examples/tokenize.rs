//! Tokenizes a file with a GGUF file's vocabulary, as llama.cpp would: to
//! compare ids with llama.cpp's, and to time the tokenizer.
//!
//! ```text
//! cargo run --release -p zinfer-text --example tokenize -- VOCAB.gguf TEXT MODE [ADD_SPECIAL] [PARSE_SPECIAL] [REPS]
//! ```
//!
//! MODE `ids` prints the ids of the whole file; `cases` splits it at
//! llama.cpp's `__ggml_vocab_test__` separators and prints one line of ids
//! per case (the format of `.gguf.out`); `decode-cases` prints, per case,
//! the decoded text of its ids in hex; `lines` prints the ids of each line;
//! `time` prints the best of REPS runs over the whole file, in tokens per
//! second.

use std::path::Path;
use std::time::Instant;

use zinfer_text::ModelTokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [vocab, text, mode, rest @ ..] = args.as_slice() else {
        return Err("usage: tokenize VOCAB.gguf TEXT ids|cases|decode-cases|lines|time [ADD_SPECIAL] [PARSE_SPECIAL] [REPS]".into());
    };
    let flag = |i: usize| rest.get(i).is_some_and(|a| a == "1");
    let (add, parse) = (flag(0), flag(1));
    let tok = ModelTokenizer::from_gguf_file(Path::new(vocab))?;
    let text = std::fs::read_to_string(text)?;
    let print = |ids: &[u32]| {
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!(" {}", line.join(" "));
    };
    match mode.as_str() {
        "ids" => print(&tok.tokenize(&text, add, parse)?),
        "cases" => {
            let mut rest = text.as_str();
            while !rest.is_empty() {
                let (case, tail) = rest
                    .split_once("\n__ggml_vocab_test__\n")
                    .unwrap_or((rest, ""));
                print(&tok.tokenize(case, add, parse)?);
                rest = tail;
            }
        }
        "decode-cases" => {
            let mut rest = text.as_str();
            while !rest.is_empty() {
                let (case, tail) = rest
                    .split_once("\n__ggml_vocab_test__\n")
                    .unwrap_or((rest, ""));
                let decoded = tok.decode(&tok.tokenize(case, add, parse)?)?;
                let hex: String = decoded.bytes().map(|b| format!("{b:02x}")).collect();
                println!("{hex}");
                rest = tail;
            }
        }
        "lines" => {
            for line in text.lines() {
                print(&tok.tokenize(line, add, parse)?);
            }
        }
        "time" => {
            let reps: usize = rest.get(2).map_or(Ok(5), |r| r.parse())?;
            let mut best = f64::INFINITY;
            let mut n = 0;
            for _ in 0..reps {
                let start = Instant::now();
                n = tok.tokenize(&text, add, parse)?.len();
                best = best.min(start.elapsed().as_secs_f64());
            }
            println!(
                "{n} tokens {} bytes best {best:.4} s  {:.0} tok/s",
                text.len(),
                n as f64 / best
            );
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    Ok(())
}
