//! `embed`: the embedding of one text (or token ids) under a served
//! model: its final hidden state, pooled over the prompt and L2-normalised.
//! It runs as a `generate` that computes the prompt and generates nothing,
//! so it shares the worker's scheduler and prefix cache with generation.

use serde::{Deserialize, Serialize};

use crate::ids::RequestId;
use crate::messages::GenerateRequest;

/// How a prompt's hidden states become one vector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The mean over every prompt token (the default).
    #[default]
    Mean,
    /// The last prompt token's (for models trained to embed that way,
    /// such as Qwen3-Embedding).
    Last,
    /// A reranker's relevance (llama.cpp's `rank` pooling): the model's
    /// classification head on the last prompt token's hidden state. The
    /// vector is the head's outputs, not normalised; the first is the
    /// score (for Qwen3-Reranker, P(yes)). Only a model whose file has
    /// rank pooling takes it.
    Rank,
}

/// `embed`: one input, text or token ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedRequest {
    /// Client request id, echoed on the reply.
    pub id: RequestId,
    /// Model name; the router's default model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The text to embed, tokenized as a `generate` `prompt` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Or its token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
    /// Mean (default), last-token pooling, or a reranker's scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling: Option<Pooling>,
    /// With `rank` pooling: the document `input` (the query) is scored
    /// against, the pair made the model's rerank prompt by the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<String>,
    /// Prefix-cache namespace, as on `generate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Higher runs first when requests wait, as on `generate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Give up after this many milliseconds, as on `generate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
}

impl EmbedRequest {
    /// An `embed` of `input` with every other field at its default.
    pub fn text(id: impl Into<String>, input: impl Into<String>) -> Self {
        EmbedRequest {
            id: id.into(),
            model: None,
            input: Some(input.into()),
            tokens: None,
            pooling: None,
            document: None,
            namespace: None,
            priority: None,
            deadline_ms: None,
        }
    }

    /// The `generate` the router runs for it: the prompt computed, its
    /// hidden states pooled, nothing generated. Validating that request
    /// validates this one (one of `input` or `tokens`, the limits).
    pub fn to_generate(&self) -> GenerateRequest {
        let mut request = GenerateRequest::from_prompt(self.id.clone(), "");
        request.prompt = self.input.clone();
        request.tokens = self.tokens.clone();
        request.model = self.model.clone();
        request.namespace = self.namespace.clone();
        request.priority = self.priority.unwrap_or(0);
        request.deadline_ms = self.deadline_ms;
        request.max_tokens = 0;
        request.stream = false;
        request.embed = Some(self.pooling.unwrap_or_default());
        request.document = self.document.clone();
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embed_is_a_generate_that_generates_nothing() {
        let mut embed = EmbedRequest::text("e1", "hello");
        embed.pooling = Some(Pooling::Last);
        embed.priority = Some(2);
        let generate = embed.to_generate();
        assert_eq!(generate.prompt.as_deref(), Some("hello"));
        assert_eq!((generate.max_tokens, generate.stream), (0, false));
        assert_eq!(generate.embed, Some(Pooling::Last));
        assert_eq!(generate.priority, 2);
        let pooling: Pooling = serde_json::from_value(serde_json::json!("mean")).unwrap();
        assert_eq!(pooling, Pooling::Mean);
    }

    #[test]
    fn a_document_goes_with_rank_pooling_and_a_text_query() {
        let limits = crate::Limits::default();
        let mut embed = EmbedRequest::text("r", "a query");
        embed.document = Some("a document".into());
        let error = embed.to_generate().validate(&limits).unwrap_err();
        assert!(error.to_string().contains("document"), "{error}");
        embed.pooling = Some(Pooling::Rank);
        let generate = embed.to_generate();
        assert_eq!(generate.document.as_deref(), Some("a document"));
        assert_eq!(generate.embed, Some(Pooling::Rank));
        generate.validate(&limits).unwrap();
        embed.input = None;
        embed.tokens = Some(vec![1, 2]);
        assert!(embed.to_generate().validate(&limits).is_err());
        let rank: Pooling = serde_json::from_value(serde_json::json!("rank")).unwrap();
        assert_eq!(rank, Pooling::Rank);
    }
}
