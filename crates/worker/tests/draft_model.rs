//! Speculative decoding with a draft model (`--draft-model`) on the real
//! default model: a draft of the same model is almost always right, a
//! random-weight draft with the same tokenizer almost never, and neither
//! changes a greedy token; a draft model with another vocabulary is refused.
#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::quantized::gguf_file::Content;
use zinfer_fetch::test_model_path;
use zinfer_model::synthetic::{SynthShape, SynthSpec, generate};
use zinfer_model::{LoadOptions, LoadedModel, load};
use zinfer_protocol::{ChunkBody, GenerateRequest, Speculative};
use zinfer_text::ModelTokenizer;
use zinfer_worker::engine::{DraftModelError, Engine, EngineConfig, EngineEvent, EngineHandle};

/// A model and its tokenizer.
fn model(path: &Path) -> (LoadedModel, ModelTokenizer) {
    let options = LoadOptions {
        kv_capacity: 4096,
        ..LoadOptions::default()
    };
    (
        load(path, &options).unwrap(),
        ModelTokenizer::open(path).unwrap(),
    )
}

/// A tiny random-weight llama with the default model's tokenizer, or with
/// a vocabulary cut to 1,000 tokens.
fn synthetic(dir: &Path, same_vocab: bool) -> PathBuf {
    let mut shape = SynthShape::preset("llama-swa-tiny").unwrap();
    shape.vocab_from_tokenizer = same_vocab;
    if !same_vocab {
        shape.vocab = 1000;
    }
    let source = Content::read(&mut std::fs::File::open(test_model_path().unwrap()).unwrap())
        .unwrap()
        .metadata;
    let path = dir.join(format!("draft-{same_vocab}.gguf"));
    let spec = SynthSpec {
        shape,
        quant: "q8_0".parse().unwrap(),
        seed: 5,
        threads: 2,
    };
    generate(&path, &spec, &source, |_| {}).unwrap();
    path
}

fn request(prompt: &str, draft: u32) -> GenerateRequest {
    GenerateRequest {
        temperature: 0.0,
        max_tokens: 40,
        speculative: Some(Speculative {
            ngram: 3,
            max_draft: draft,
        }),
        ..GenerateRequest::from_prompt("t", prompt)
    }
}

fn tokens(handle: &EngineHandle, rid: u64, request: GenerateRequest) -> Vec<u32> {
    handle.submit(request, rid).unwrap();
    let mut out = Vec::new();
    loop {
        match handle
            .events()
            .recv_timeout(Duration::from_secs(300))
            .unwrap()
        {
            EngineEvent::Chunk {
                body: ChunkBody { tokens, .. },
                ..
            } => out.extend(tokens),
            EngineEvent::Done { .. } => return out,
            EngineEvent::Error { code, message, .. } => panic!("{code}: {message}"),
        }
    }
}

const PROMPTS: [&str; 2] = [
    "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is a prime number?<|im_end|>\n<|im_start|>assistant\n",
];

/// The default model served with the draft model at `draft`.
fn start_with_draft(draft: &Path) -> Result<EngineHandle, DraftModelError> {
    let (loaded, tokenizer) = model(&test_model_path().unwrap());
    let (draft, draft_tokenizer) = model(draft);
    Engine::start_with_draft(
        loaded,
        tokenizer,
        draft,
        &draft_tokenizer,
        EngineConfig::default(),
    )
}

/// Greedy tokens of each prompt with no speculation, then with a draft
/// model; returns the share of draft tokens accepted.
fn check_unchanged(draft: &Path) -> f64 {
    let handle = start_with_draft(draft).unwrap();
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let rid = 10 * i as u64;
        let plain = tokens(&handle, rid, request(prompt, 0));
        handle.flush_cache(None);
        let speculated = tokens(&handle, rid + 1, request(prompt, 6));
        assert_eq!(plain, speculated, "prompt {i}");
    }
    let stats = handle.stats();
    assert!(stats.draft_tokens > 0);
    assert!(stats.draft_s > 0.0);
    stats.accepted_draft_tokens as f64 / stats.draft_tokens as f64
}

#[test]
fn drafts_of_the_same_model_are_accepted_and_change_nothing() {
    let accepted = check_unchanged(&test_model_path().unwrap());
    assert!(accepted > 0.9, "{accepted:.2} of the draft accepted");
}

#[test]
fn drafts_of_a_random_model_are_rejected_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let accepted = check_unchanged(&synthetic(dir.path(), true));
    assert!(accepted < 0.5, "{accepted:.2} of the draft accepted");
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = start_with_draft(&synthetic(dir.path(), false));
    assert!(matches!(
        refused,
        Err(DraftModelError::OtherTokenizer { .. })
    ));
}
