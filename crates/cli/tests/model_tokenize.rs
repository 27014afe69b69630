//! `zinfer model tokenize` as a user runs it: the built binary on
//! llama.cpp's vocabulary-only test files (no tensors at all), checked
//! against the ids llama.cpp expects for them, and on the default model.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn zinfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zinfer"))
        .args(["model", "tokenize"])
        .args(args)
        .output()
        .unwrap()
}

/// One array of ids per output line; fails the test when the command fails.
fn ids(args: &[&str]) -> Vec<Vec<u32>> {
    let out = zinfer(args);
    assert!(
        out.status.success(),
        "tokenize {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn vocab(name: &str) -> PathBuf {
    zinfer_fetch::llama_cpp_reference()
        .unwrap()
        .join("models")
        .join(format!("ggml-vocab-{name}.gguf"))
}

/// The inputs of a `.inp` file and the ids of its `.out` file, split as
/// llama.cpp's `test-tokenizer-0` splits them.
fn cases(base: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    // Each input ends at the marker; nothing follows the last one.
    let mut inputs: Vec<String> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(String::from)
        .collect();
    if inputs.last().is_some_and(String::is_empty) {
        inputs.pop();
    }
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(inputs.len(), expected.len(), "{}", base.display());
    inputs.into_iter().zip(expected).collect()
}

/// The expected ids are llama.cpp's without BOS/EOS and with special
/// tokens unparsed, so these are the flags; every case of three
/// vocabularies (SentencePiece, GPT-2 BPE, Qwen2 BPE) goes in one run.
#[test]
fn vocabulary_only_files_give_llama_cpps_ids() {
    for name in ["llama-spm", "gpt-2", "qwen2"] {
        let path = vocab(name);
        let cases = cases(&path);
        let mut args = vec![
            "--no-add-special",
            "--no-parse-special",
            path.to_str().unwrap(),
            "--",
        ];
        args.extend(cases.iter().map(|(text, _)| text.as_str()));
        let got = ids(&args);
        assert_eq!(got.len(), cases.len(), "{name}: one line per text");
        for ((text, want), got) in cases.iter().zip(&got) {
            assert_eq!(got, want, "{name}: {text:?}");
        }
    }
}

/// The defaults add the file's BOS (llama-spm asks for one) and parse
/// special-token text; each flag turns one off.
#[test]
fn defaults_add_bos_and_parse_special_tokens() {
    let path = vocab("llama-spm");
    let file = path.to_str().unwrap();
    let plain = ids(&["--no-add-special", file, "Hello world"]);
    let full = ids(&[file, "Hello world", "<s>"]);
    assert_eq!(full[0][0], 1, "BOS first: {full:?}");
    assert_eq!(full[0][1..], plain[0][..]);
    // `<s>` parsed is BOS (after the added one); unparsed it is text.
    assert_eq!(full[1], [1, 1]);
    let unparsed = ids(&["--no-parse-special", file, "<s>"]);
    assert!(unparsed[0].len() > 2, "{unparsed:?}");
    // Texts are taken literally: a backslash-n is two characters.
    let escaped = ids(&["--no-add-special", file, "a\\nb"]);
    let newline = ids(&["--no-add-special", file, "a\nb"]);
    assert_ne!(escaped, newline);
}

/// A full model reads its tokenizer the same way: the default model's ids
/// for a chat turn, its special tokens parsed, match the tokenizer the
/// worker runs (loaded here in-process from the same file).
#[test]
fn the_default_model() {
    let path = zinfer_fetch::test_model_path().unwrap();
    let text = "<|im_start|>user\nHi there<|im_end|>\n";
    let got = ids(&[path.to_str().unwrap(), text]);
    let tokenizer = zinfer_text::ModelTokenizer::open(&path).unwrap();
    assert_eq!(got, [tokenizer.tokenize(text, true, true).unwrap()]);
    let im_start = tokenizer.tokenize("<|im_start|>", false, true).unwrap();
    assert_eq!(im_start.len(), 1);
    assert!(got[0].contains(&im_start[0]), "{got:?}");
}

#[test]
fn missing_files_and_texts_are_errors_not_panics() {
    let out = zinfer(&["/nonexistent.gguf", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent.gguf"), "{stderr}");
    let out = zinfer(&[vocab("gpt-2").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "TEXT is required");
}
