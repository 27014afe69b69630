//! The GPT-4o (o200k) pre-tokenizer, `tokenizer.ggml.pre = "gpt-4o"` as
//! gpt-oss files carry it, gives llama.cpp's ids. llama.cpp ships no such
//! test vocabulary, so this rewrites the `pre` of two of its BPE test
//! vocabularies to "gpt-4o", as scripts/gpt4o-tokenizer-reference.sh did
//! when it recorded llama.cpp's ids for the same copies in
//! data/gpt4o-tokenizer.json.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::Path;

use serde::Deserialize;
use zinfer_text::ModelTokenizer;

#[derive(Deserialize)]
struct Reference {
    vocabularies: Vec<Vocabulary>,
}

#[derive(Deserialize)]
struct Vocabulary {
    vocabulary: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    input: String,
    ids: Vec<u32>,
}

/// The vocabulary file with its `tokenizer.ggml.pre` string value replaced;
/// the files have no tensors, so nothing after the header moves.
fn with_pre(file: &[u8], pre: &str) -> Vec<u8> {
    const KEY: &[u8] = b"tokenizer.ggml.pre";
    const STRING: u32 = 8;
    assert_eq!(u64::from_le_bytes(file[8..16].try_into().unwrap()), 0);
    let mut needle = (KEY.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(KEY);
    needle.extend_from_slice(&STRING.to_le_bytes());
    let at = file
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
        + needle.len();
    let old_len = u64::from_le_bytes(file[at..at + 8].try_into().unwrap()) as usize;
    let mut out = file[..at].to_vec();
    out.extend_from_slice(&(pre.len() as u64).to_le_bytes());
    out.extend_from_slice(pre.as_bytes());
    out.extend_from_slice(&file[at + 8 + old_len..]);
    out
}

fn load_as_gpt4o(models: &Path, name: &str, dir: &Path) -> ModelTokenizer {
    let file = std::fs::read(models.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
    let copy = dir.join(format!("{name}-gpt4o.gguf"));
    std::fs::write(&copy, with_pre(&file, "gpt-4o")).unwrap();
    ModelTokenizer::from_gguf_file(&copy).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn gpt4o_pre_tokenizer_gives_llama_cpp_ids() {
    let reference: Reference =
        serde_json::from_str(include_str!("data/gpt4o-tokenizer.json")).unwrap();
    let models = zinfer_fetch::llama_cpp_reference().unwrap().join("models");
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(reference.vocabularies.len(), 2);
    let mut failures = Vec::new();
    let mut total = 0;
    for vocab in &reference.vocabularies {
        let tok = load_as_gpt4o(&models, &vocab.vocabulary, dir.path());
        assert!(vocab.cases.len() > 60, "{}", vocab.vocabulary);
        for (i, case) in vocab.cases.iter().enumerate() {
            total += 1;
            let got = tok.tokenize(&case.input, false, false).unwrap();
            if got != case.ids {
                failures.push(format!(
                    "{} #{i} {:?}:\n  llama.cpp {:?}\n  zinfer    {got:?}",
                    vocab.vocabulary, case.input, case.ids
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
