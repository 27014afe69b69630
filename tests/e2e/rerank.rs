//! `POST /v1/rerank` through `zinfer serve --http` on a tiny synthetic
//! Qwen3 reranker (rank pooling, a yes/no head, Qwen3-Reranker's rerank
//! template, Qwen's vocabulary): each result's score is what the model's
//! head gives the pair's rerank prompt run in-process, the results sorted
//! by it. The head and the prompts are checked against llama.cpp by
//! `scripts/llamacpp-reference.sh --rerank`.

use candle_core::quantized::gguf_file::Content;
use zinfer_model::synthetic::{Rerank, SynthShape, SynthSpec, generate_reranker};
use zinfer_model::{AttentionDtype, ChunkOutput, Classifier, LoadOptions, SeqChunk, load};
use zinfer_text::ModelTokenizer;

use crate::harness::{exclusive, http_post, serve_http};

/// What llama.cpp's converter writes for Qwen3-Reranker.
const TEMPLATE: &str = "<|im_start|>system\nJudge whether the Document meets the requirements \
based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \
\"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant \
passages that answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n\
<|im_start|>assistant\n<think>\n\n</think>\n\n";

fn reranker(dir: &std::path::Path) -> std::path::PathBuf {
    let shape = SynthShape::preset("qwen3-tiny").unwrap();
    let vocab = zinfer_fetch::vocab_file("qwen2").unwrap();
    let tokenizer = Content::read(&mut std::fs::File::open(&vocab).unwrap())
        .unwrap()
        .metadata;
    let spec = SynthSpec {
        shape: shape.fitted_to(&tokenizer).unwrap(),
        quant: "f32".parse().unwrap(),
        seed: 2,
        threads: 2,
    };
    let path = dir.join("reranker.gguf");
    let rerank = Rerank {
        template: Some(TEMPLATE.into()),
    };
    generate_reranker(&path, &spec, &tokenizer, &rerank, |_| {}).unwrap();
    path
}

/// The head's score of the pair's prompt, run in-process with f32
/// attention as the served worker is.
fn in_process(path: &std::path::Path, query: &str, document: &str) -> f32 {
    let tokens = ModelTokenizer::open(path)
        .unwrap()
        .rerank_prompt(query, document)
        .unwrap();
    let options = LoadOptions {
        kv_capacity: tokens.len(),
        threads: Some(1),
        attention: AttentionDtype::F32,
        ..LoadOptions::default()
    };
    let mut m = load(path, &options).unwrap();
    let slots: Vec<u32> = (0..tokens.len() as u32).collect();
    let rows = m
        .model
        .forward(&[SeqChunk {
            tokens: &tokens,
            slots: &slots,
            start_pos: 0,
            output: ChunkOutput::AllHidden,
        }])
        .unwrap();
    let hidden = m.model.hidden_size();
    let head = Classifier::load(path).unwrap().unwrap();
    head.score(&rows[0][(tokens.len() - 1) * hidden..]).unwrap()
}

#[test]
fn rerank_scores_documents_through_serve() {
    let _guard = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let model = reranker(dir.path());
    let (_serve, http) = serve_http(&model, 1024, &["--attention-dtype", "f32"]);
    let query = "What is the capital of France?";
    let documents = [
        "Paris is the capital of France.",
        "The mitochondria is the powerhouse of the cell.",
        "Bread rises because yeast makes gas.",
    ];
    let body = serde_json::json!({
        "query": query,
        "documents": [documents[0], {"text": documents[1]}, documents[2]],
        "return_documents": true,
    });
    let (status, reply) = http_post(&http, "/v1/rerank", &body.to_string());
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let results = reply["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{reply}");
    let mut previous = f64::INFINITY;
    for result in results {
        let index = result["index"].as_u64().unwrap() as usize;
        let score = result["relevance_score"].as_f64().unwrap();
        let want = f64::from(in_process(&model, query, documents[index]));
        assert!(
            (score - want).abs() < 1e-4,
            "document {index}: {score} vs {want}"
        );
        assert!(score <= previous, "not sorted: {reply}");
        previous = score;
        assert_eq!(result["document"]["text"], documents[index]);
    }
    assert!(
        reply["usage"]["prompt_tokens"].as_u64() > Some(60),
        "{reply}"
    );
}
