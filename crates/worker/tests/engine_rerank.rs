//! `rank` pooling through the engine on a synthetic Qwen3 reranker: the
//! `done`'s vector is the model's classification head on the last prompt
//! token's hidden state, as the model and head give it run by hand (the
//! head itself is checked against llama.cpp by
//! `scripts/llamacpp-reference.sh --rerank`); an engine without a head
//! refuses such requests.
#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use candle_core::quantized::gguf_file::Content;
use zinfer_fetch::test_model_path;
use zinfer_model::synthetic::{Rerank, SynthShape, SynthSpec, generate_reranker};
use zinfer_model::{ChunkOutput, Classifier, LoadOptions, LoadedModel, SeqChunk, load};
use zinfer_protocol::{DoneBody, EmbedRequest, Pooling};
use zinfer_text::ModelTokenizer;
use zinfer_worker::engine::{Engine, EngineConfig, EngineError, EngineEvent, EngineHandle};

fn reranker(dir: &Path) -> PathBuf {
    let mut shape = SynthShape::preset("qwen3-tiny").unwrap();
    shape.n_layers = 1;
    let source = Content::read(&mut std::fs::File::open(test_model_path().unwrap()).unwrap())
        .unwrap()
        .metadata;
    let path = dir.join("rerank.gguf");
    let spec = SynthSpec {
        shape,
        quant: "f32".parse().unwrap(),
        seed: 11,
        threads: 1,
    };
    let rerank = Rerank {
        template: Some("<|im_start|>user\nQ: {query}\nD: {document}<|im_end|>\n".into()),
    };
    generate_reranker(&path, &spec, &source, &rerank, |_| {}).unwrap();
    path
}

fn model(path: &Path) -> LoadedModel {
    let options = LoadOptions {
        kv_capacity: 256,
        ..LoadOptions::default()
    };
    load(path, &options).unwrap()
}

fn rank(tokens: &[u32]) -> zinfer_protocol::GenerateRequest {
    EmbedRequest {
        input: None,
        tokens: Some(tokens.to_vec()),
        pooling: Some(Pooling::Rank),
        ..EmbedRequest::text("r", "")
    }
    .to_generate()
}

fn scores(handle: &EngineHandle, rid: u64, tokens: &[u32]) -> Vec<f32> {
    done_vector(handle, rid, rank(tokens))
}

fn done_vector(
    handle: &EngineHandle,
    rid: u64,
    request: zinfer_protocol::GenerateRequest,
) -> Vec<f32> {
    handle.submit(request, rid).unwrap();
    match handle
        .events()
        .recv_timeout(Duration::from_secs(60))
        .unwrap()
    {
        EngineEvent::Done {
            body: DoneBody {
                embedding: Some(v), ..
            },
            ..
        } => v,
        other => panic!("expected done with scores: {other:?}"),
    }
}

/// The head on the last hidden state of `tokens`, run by hand.
fn by_hand(m: &mut LoadedModel, head: &Classifier, tokens: &[u32]) -> Vec<f32> {
    let slots: Vec<u32> = (0..tokens.len() as u32).collect();
    let rows = m
        .model
        .forward(&[SeqChunk {
            tokens,
            slots: &slots,
            start_pos: 0,
            output: ChunkOutput::AllHidden,
        }])
        .unwrap();
    let hidden = m.model.hidden_size();
    head.scores(&rows[0][(tokens.len() - 1) * hidden..])
        .unwrap()
}

/// An engine with the file's head, the head, and the model again to run
/// by hand.
fn reranking(path: &Path) -> (EngineHandle, Arc<Classifier>, LoadedModel) {
    let head = Arc::new(Classifier::load(path).unwrap().unwrap());
    let config = EngineConfig {
        classifier: Some(head.clone()),
        ..EngineConfig::default()
    };
    let tokenizer = ModelTokenizer::open(path).unwrap();
    (
        Engine::start(model(path), tokenizer, config),
        head,
        model(path),
    )
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn rank_pooling_is_the_head_on_the_last_hidden_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = reranker(dir.path());
    let (handle, head, mut reference) = reranking(&path);
    let prompts: [&[u32]; 3] = [
        &[1, 2, 3, 4, 5, 6],
        &[40, 900, 7],
        &[1, 2, 3, 4, 5, 6, 7, 8],
    ];
    let mut firsts = Vec::new();
    for (rid, tokens) in prompts.iter().enumerate() {
        let got = scores(&handle, rid as u64 + 1, tokens);
        let want = by_hand(&mut reference, &head, tokens);
        assert_eq!(got.len(), 2);
        assert!(
            max_diff(&got, &want) < 1e-5,
            "prompt {rid}: {got:?} vs {want:?}"
        );
        assert!((got[0] + got[1] - 1.0).abs() < 1e-5);
        firsts.push(got[0]);
    }
    // The third prompt extends the first, whose rows are cached: its
    // score is still its own last row's.
    assert!((firsts[0] - firsts[2]).abs() > 1e-4, "{firsts:?}");
    assert!((firsts[0] - firsts[1]).abs() > 1e-4, "{firsts:?}");
}

/// A query and a document become the rerank template's prompt, as the
/// tokenizer makes it (checked against llama.cpp's by
/// `scripts/llamacpp-reference.sh --rerank`).
#[test]
fn a_query_and_document_are_scored_through_the_rerank_template() {
    let dir = tempfile::tempdir().unwrap();
    let path = reranker(dir.path());
    let (handle, head, mut reference) = reranking(&path);
    let tokenizer = ModelTokenizer::open(&path).unwrap();
    let mut pair = |rid: u64, query: &str, document: &str| {
        let request = EmbedRequest {
            pooling: Some(Pooling::Rank),
            document: Some(document.into()),
            ..EmbedRequest::text("r", query)
        };
        let got = done_vector(&handle, rid, request.to_generate());
        let tokens = tokenizer.rerank_prompt(query, document).unwrap();
        let text = tokenizer.decode(&tokens).unwrap();
        assert!(text.contains("Q: the query\nD: "), "{text:?}");
        let want = by_hand(&mut reference, &head, &tokens);
        assert!(max_diff(&got, &want) < 1e-5, "{got:?} vs {want:?}");
        got[0]
    };
    let a = pair(1, "the query", "a first document");
    let b = pair(
        2,
        "the query",
        "another, longer document about something else",
    );
    assert!((a - b).abs() > 1e-4, "{a} {b}");
}

#[test]
fn an_engine_without_a_head_refuses_rank_pooling() {
    let dir = tempfile::tempdir().unwrap();
    let path = reranker(dir.path());
    let tokenizer = ModelTokenizer::open(&path).unwrap();
    let handle = Engine::start(model(&path), tokenizer, EngineConfig::default());
    match handle.submit(rank(&[1, 2, 3]), 1) {
        Err(EngineError::BadRequest(message)) => {
            assert!(message.contains("not a reranker"), "{message}")
        }
        other => panic!("expected a bad request: {other:?}"),
    }
}
