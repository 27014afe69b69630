//! A hybrid (Gated DeltaNet) model through the engine, on the tiny
//! synthetic qwen35 file: a repeated prompt gives the first answer again
//! (the prefix cache must not resume its recurrent state from K/V alone:
//! nothing is cached and every prompt is computed whole), so do `n > 1`
//! choices and concurrent requests; speculation is refused with a clear
//! error, per request and with a draft model.
#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::quantized::gguf_file::Content;
use zinfer_fetch::test_model_path;
use zinfer_model::synthetic::{SynthShape, SynthSpec, generate};
use zinfer_model::{LoadOptions, LoadedModel, load};
use zinfer_protocol::{ChunkBody, ErrorCode, GenerateRequest, Speculative};
use zinfer_text::ModelTokenizer;
use zinfer_worker::engine::{DraftModelError, Engine, EngineConfig, EngineEvent, EngineHandle};

fn qwen35(dir: &Path) -> PathBuf {
    let source = Content::read(&mut std::fs::File::open(test_model_path().unwrap()).unwrap())
        .unwrap()
        .metadata;
    let path = dir.join("qwen35-tiny.gguf");
    let spec = SynthSpec {
        shape: SynthShape::preset("qwen35-tiny").unwrap(),
        quant: "f32".parse().unwrap(),
        seed: 3,
        threads: 2,
    };
    generate(&path, &spec, &source, |_| {}).unwrap();
    path
}

fn model(path: &Path) -> (LoadedModel, ModelTokenizer) {
    let options = LoadOptions {
        kv_capacity: 1024,
        ..LoadOptions::default()
    };
    (
        load(path, &options).unwrap(),
        ModelTokenizer::open(path).unwrap(),
    )
}

/// A prompt of 170 tokens (past 150, so the state carries far), greedy.
fn request(n: u32) -> GenerateRequest {
    let prompt: Vec<u32> = (0..170).map(|i| 200 + (i * 7919) % 20_000).collect();
    GenerateRequest {
        temperature: 0.0,
        max_tokens: 12,
        ignore_eos: true,
        n,
        prompt: None,
        tokens: Some(prompt),
        ..GenerateRequest::from_prompt("t", "")
    }
}

/// Each choice's tokens, by choice index, once the request is done; or
/// the error it failed with.
fn run(
    handle: &EngineHandle,
    rid: u64,
    request: GenerateRequest,
) -> Result<Vec<Vec<u32>>, (ErrorCode, String)> {
    let n = request.n.max(1) as usize;
    handle.submit(request, rid).unwrap();
    let mut out = vec![Vec::new(); n];
    let mut done = 0;
    while done < n {
        match handle
            .events()
            .recv_timeout(Duration::from_secs(120))
            .unwrap()
        {
            EngineEvent::Chunk {
                body: ChunkBody { tokens, choice, .. },
                ..
            } => out[choice as usize].extend(tokens),
            EngineEvent::Done { .. } => done += 1,
            EngineEvent::Error { code, message, .. } => return Err((code, message)),
        }
    }
    Ok(out)
}

#[test]
fn repeated_prompts_choices_and_refused_speculation() {
    let dir = tempfile::tempdir().unwrap();
    let path = qwen35(dir.path());
    let (loaded, tokenizer) = model(&path);
    let handle = Engine::start(loaded, tokenizer, EngineConfig::default());

    let first = run(&handle, 1, request(1)).unwrap();
    assert_eq!(first[0].len(), 12);
    // The same prompt again: with a prefix cache that resumed from K/V
    // alone, the recurrent layers would start from a zero state here.
    let again = run(&handle, 2, request(1)).unwrap();
    assert_eq!(first, again);
    assert_eq!(
        handle.stats().kv_cached,
        0,
        "a hybrid model caches no prefix"
    );
    // Three greedy choices each compute the prompt and agree with it.
    let choices = run(&handle, 3, request(3)).unwrap();
    assert!(choices.iter().all(|c| *c == first[0]), "{choices:?}");

    let mut speculating = request(1);
    speculating.speculative = Some(Speculative {
        ngram: 3,
        max_draft: 4,
    });
    let (code, message) = run(&handle, 4, speculating).unwrap_err();
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(
        message.contains("speculative decoding is not supported"),
        "{message}"
    );
    // The engine goes on serving.
    assert_eq!(run(&handle, 5, request(1)).unwrap(), first);

    let (loaded, tokenizer) = model(&path);
    let (draft, draft_tokenizer) = model(&path);
    let refused = Engine::start_with_draft(
        loaded,
        tokenizer,
        draft,
        &draft_tokenizer,
        EngineConfig::default(),
    );
    assert!(matches!(refused, Err(DraftModelError::Recurrent { .. })));
}
