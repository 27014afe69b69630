//! Every GGUF test vocabulary of llama.cpp tokenizes its test inputs to
//! exactly the ids llama.cpp expects (`models/ggml-vocab-*.gguf.inp` and
//! `.out`, read as `tests/test-tokenizer-0.cpp` reads them, with its flags:
//! no BOS/EOS, special tokens not parsed), and BOS, EOS and the
//! end-of-generation set follow llama.cpp's loader.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::{Path, PathBuf};

use zinfer_text::{ModelTokenizer, TextError, TokenizerError};

/// Cases known to differ from llama.cpp, as (vocabulary, case index, why).
/// Empty: every case matches. An entry here keeps the rest of its
/// vocabulary checked; a case not listed that differs fails the test.
const KNOWN_DIFFERENCES: &[(&str, usize, &str)] = &[];

/// Vocabularies whose tokenizer zinfer does not run, with the model they name.
const REFUSED: &[(&str, &str)] = &[("bert-bge", "bert")];

fn models() -> PathBuf {
    zinfer_fetch::llama_cpp_reference().unwrap().join("models")
}

fn load(models: &Path, name: &str) -> Result<ModelTokenizer, TextError> {
    ModelTokenizer::from_gguf_file(&models.join(format!("ggml-vocab-{name}.gguf")))
}

/// The inputs of a `.inp` file and the expected ids of its `.out` file.
fn cases(models: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let base = models.join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    // As test-tokenizer-0.cpp: inputs end at "\n__ggml_vocab_test__\n".
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.split_once("\n__ggml_vocab_test__\n") {
            Some((case, tail)) => {
                inputs.push(case.to_string());
                rest = tail;
            }
            None => {
                inputs.push(rest.to_string());
                rest = "";
            }
        }
    }
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        expected.len(),
        "{name}: .inp and .out disagree"
    );
    inputs.into_iter().zip(expected).collect()
}

/// Names of the vocabularies with test cases.
fn tested_vocabularies(models: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(models)
        .unwrap()
        .filter_map(|e| {
            let file = e.unwrap().file_name().into_string().ok()?;
            Some(
                file.strip_prefix("ggml-vocab-")?
                    .strip_suffix(".gguf.inp")?
                    .to_string(),
            )
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_test_vocabulary_gives_llama_cpp_ids() {
    let models = models();
    let names = tested_vocabularies(&models);
    assert!(names.len() >= 15, "only {names:?}");
    let mut failures = Vec::new();
    let mut passed = 0;
    let mut total = 0;
    for name in &names {
        if let Some((_, model)) = REFUSED.iter().find(|(n, _)| n == name) {
            let err = load(&models, name).unwrap_err();
            assert!(
                matches!(&err, TextError::Tokenizer(TokenizerError::UnsupportedModel(m)) if m == model),
                "{name}: {err}"
            );
            continue;
        }
        let tok = load(&models, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, (input, expected)) in cases(&models, name).into_iter().enumerate() {
            total += 1;
            let got = tok.tokenize(&input, false, false).unwrap();
            let known = KNOWN_DIFFERENCES
                .iter()
                .any(|&(n, k, _)| n == name && k == i);
            match (got == expected, known) {
                (true, false) => passed += 1,
                (false, true) => {}
                (true, true) => failures.push(format!(
                    "{name} #{i}: listed as a known difference but now matches; remove it"
                )),
                (false, false) => failures.push(format!(
                    "{name} #{i} {input:?}:\n  llama.cpp {expected:?}\n  zinfer    {got:?}"
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(passed + KNOWN_DIFFERENCES.len(), total);
}

/// BOS/EOS with `add_special`, special tokens when parsed, and the
/// end-of-generation set, as llama.cpp 0.3.36's loader gives them
/// (`llama_tokenize(.., add_special = true, parse_special = true)`,
/// `llama_vocab_is_eog` over every id).
#[test]
fn special_tokens_and_end_of_generation_follow_llama_cpp() {
    let models = models();
    struct Expect {
        name: &'static str,
        text: &'static str,
        ids: &'static [u32],
        eog: &'static [u32],
    }
    let expect = [
        Expect {
            name: "llama-bpe",
            text: "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
            ids: &[128000, 128006, 882, 128007, 271, 13347, 128009],
            eog: &[128001, 128009],
        },
        Expect {
            name: "qwen2",
            text: "<|im_start|>user\nHi<|im_end|>",
            ids: &[151644, 872, 198, 13048, 151645],
            // 128247 is `</s>`, an end-of-turn text.
            eog: &[128247, 151643, 151645],
        },
        Expect {
            name: "llama-spm",
            text: "<s>Hi</s> there",
            ids: &[1, 1, 6324, 2, 29871, 727],
            eog: &[2],
        },
        Expect {
            name: "phi-3",
            text: "<|user|>\nHi<|end|>\n<|assistant|>",
            // Phi-3's special tokens eat the whitespace after them.
            ids: &[1, 32010, 6324, 32007, 32001],
            eog: &[2, 32000, 32007],
        },
        Expect {
            name: "gemma-4",
            text: "<|turn>user\nHi<turn|>",
            ids: &[2, 105, 2364, 107, 10979, 106],
            // `</s>` is a normal token in Gemma 4; `<|tool_response>` ends a turn.
            eog: &[1, 50, 106],
        },
        Expect {
            name: "command-r",
            text: "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>",
            ids: &[5, 255000, 255006, 37535, 255001],
            // `<PAD>` (0) reads as a fill-in-the-middle pad, which llama.cpp counts.
            eog: &[0, 255001],
        },
        Expect {
            name: "deepseek-coder",
            text: "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>",
            ids: &[32013, 32013, 11041, 32014],
            eog: &[32014],
        },
    ];
    for e in expect {
        let tok = load(&models, e.name).unwrap();
        assert_eq!(
            tok.tokenize(e.text, true, true).unwrap(),
            e.ids,
            "{}",
            e.name
        );
        assert_eq!(tok.eos_token_ids(), e.eog, "{}", e.name);
    }
}

/// Decoding inverts tokenizing on every test case, and decoding any prefix
/// of the ids gives a prefix of the text, with U+FFFD only where a
/// character is cut between byte tokens: what streaming relies on.
#[test]
fn decoding_inverts_tokenizing_and_streams_whole_characters() {
    let models = models();
    let mut failures = Vec::new();
    for name in tested_vocabularies(&models) {
        if REFUSED.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let tok = load(&models, &name).unwrap();
        for (i, (input, _)) in cases(&models, &name).into_iter().enumerate() {
            let ids = tok.tokenize(&input, false, false).unwrap();
            let full = tok.decode(&ids).unwrap();
            if full != input {
                failures.push(format!("{name} #{i}: {input:?} decodes as {full:?}"));
                continue;
            }
            for k in 1..ids.len() {
                let part = tok.decode(&ids[..k]).unwrap();
                let whole = part.trim_end_matches('\u{FFFD}');
                if !full.starts_with(whole) {
                    failures.push(format!("{name} #{i}: prefix {k} decodes as {part:?}"));
                    break;
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
