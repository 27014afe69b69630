//! `POST /v1/rerank` (also `/rerank` and `/v1/score`), in the shape
//! llama-server, Jina and Cohere use: a `query` and `documents`, answered
//! with `results` sorted by `relevance_score`. Each document is one
//! protocol `generate` with `embed` `rank` and the query as its prompt; the
//! worker makes the pair the model's rerank prompt and scores it with the
//! model's classification head (llama.cpp's rank pooling). The parsing and
//! the response are pure; the handler in `server` sends the requests.

use serde_json::{Map, Value, json};
use zinfer_protocol::{EmbedRequest, GenerateRequest, Pooling, Usage};

use crate::error::ApiError;
use crate::translate::Context;

/// Fields of the body.
const FIELDS: &[&str] = &[
    "model",
    "query",
    "documents",
    "top_n",
    "return_documents",
    "user",
];

/// Most documents in one request.
pub const MAX_DOCUMENTS: usize = 1024;

/// A valid rerank request: one protocol request per document.
#[derive(Debug, Clone, PartialEq)]
pub struct Rerank {
    /// The requests, in document order (ids `{id}-{index}`).
    pub requests: Vec<GenerateRequest>,
    /// The documents' texts, for `return_documents`.
    pub documents: Vec<String>,
    /// Results returned: the best `top_n` (every document by default).
    pub top_n: usize,
    /// Whether each result carries its document.
    pub return_documents: bool,
    /// The model name echoed in the response.
    pub model: String,
}

/// Translates a rerank body.
pub fn request(bytes: &[u8], ctx: Context<'_>) -> Result<Rerank, ApiError> {
    let body = crate::translate::json_object(bytes, FIELDS)?;
    let query = match body.get("query") {
        Some(Value::String(q)) if !q.is_empty() => q.clone(),
        _ => {
            return Err(ApiError::invalid(
                "query",
                "\"query\" must be a non-empty string",
            ));
        }
    };
    let documents = documents(body.get("documents"))?;
    let top_n = match body.get("top_n") {
        None | Some(Value::Null) => documents.len(),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
            _ => {
                return Err(ApiError::invalid(
                    "top_n",
                    "\"top_n\" must be a positive integer",
                ));
            }
        },
    };
    let return_documents = match body.get("return_documents") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "return_documents",
                "\"return_documents\" must be a boolean",
            ));
        }
    };
    if let Some(user) = body.get("user")
        && !user.is_string()
        && !user.is_null()
    {
        return Err(ApiError::invalid("user", "\"user\" must be a string"));
    }
    let model = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid("model", "\"model\" must be a string")),
    };
    let requests = documents
        .iter()
        .enumerate()
        .map(|(index, document)| {
            let mut embed = EmbedRequest::text(format!("{}-{index}", ctx.id), query.clone());
            embed.pooling = Some(Pooling::Rank);
            embed.document = Some(document.clone());
            embed.model = model
                .clone()
                .filter(|m| !m.is_empty() && Some(m.as_str()) != ctx.alias);
            let request = embed.to_generate();
            request.validate(ctx.limits).map_err(|error| {
                ApiError::invalid("documents", format!("document {index}: {error}"))
            })?;
            Ok(request)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Rerank {
        requests,
        documents,
        top_n,
        return_documents,
        model: model
            .filter(|m| !m.is_empty())
            .or(ctx.alias.map(str::to_string))
            .unwrap_or_else(|| "default".to_string()),
    })
}

/// `documents`: strings, or objects with a `text` (Jina, Cohere).
fn documents(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "documents",
            "\"documents\" must be a non-empty array of strings or of {\"text\": string} objects",
        )
    };
    let Some(Value::Array(items)) = value else {
        return Err(bad());
    };
    if items.is_empty() {
        return Err(bad());
    }
    if items.len() > MAX_DOCUMENTS {
        return Err(ApiError::invalid(
            "documents",
            format!(
                "at most {MAX_DOCUMENTS} documents per request, got {}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(text) => Ok(text.clone()),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(text)) => Ok(text.clone()),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        })
        .collect()
}

/// The response body: the best `top_n` documents by score, highest first
/// (ties in document order), each with its `index`; the usage counts every
/// document's prompt tokens.
pub fn response(rerank: &Rerank, scores: &[f32], used: &[Usage]) -> Value {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let results: Vec<Value> = order
        .into_iter()
        .take(rerank.top_n)
        .map(|index| {
            let mut result = Map::new();
            result.insert("index".into(), json!(index));
            result.insert("relevance_score".into(), json!(scores[index]));
            if rerank.return_documents {
                let text = rerank.documents.get(index).cloned().unwrap_or_default();
                result.insert("document".into(), json!({ "text": text }));
            }
            Value::Object(result)
        })
        .collect();
    let tokens: u64 = used.iter().map(|u| u64::from(u.prompt_tokens)).sum();
    json!({
        "object": "list",
        "model": rerank.model,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_protocol::Limits;

    fn parse(body: Value) -> Result<Rerank, ApiError> {
        let limits = Limits::default();
        request(
            body.to_string().as_bytes(),
            Context {
                id: "r1",
                alias: None,
                limits: &limits,
            },
        )
    }

    #[test]
    fn each_document_is_a_rank_request_with_the_query() {
        let r = parse(json!({
            "query": "q",
            "documents": ["a", {"text": "b"}],
            "top_n": 1,
            "return_documents": true
        }))
        .unwrap();
        assert_eq!(r.requests.len(), 2);
        assert_eq!(r.requests[1].id, "r1-1");
        assert_eq!(r.requests[1].prompt.as_deref(), Some("q"));
        assert_eq!(r.requests[1].document.as_deref(), Some("b"));
        assert_eq!(r.requests[0].embed, Some(Pooling::Rank));
        assert_eq!((r.top_n, r.return_documents), (1, true));
        assert_eq!(r.documents, ["a", "b"]);
    }

    #[test]
    fn bad_bodies_name_their_field() {
        for (body, param) in [
            (json!({"documents": ["a"]}), "query"),
            (json!({"query": "", "documents": ["a"]}), "query"),
            (json!({"query": "q"}), "documents"),
            (json!({"query": "q", "documents": []}), "documents"),
            (json!({"query": "q", "documents": [1]}), "documents"),
            (
                json!({"query": "q", "documents": [{"txt": "a"}]}),
                "documents",
            ),
            (
                json!({"query": "q", "documents": ["a"], "top_n": 0}),
                "top_n",
            ),
            (
                json!({"query": "q", "documents": ["a"], "return_documents": 1}),
                "return_documents",
            ),
            (
                json!({"query": "q", "documents": ["a"], "rank_fields": ["x"]}),
                "rank_fields",
            ),
        ] {
            let error = parse(body.clone()).unwrap_err();
            assert!(format!("{error:?}").contains(param), "{body}: {error:?}");
        }
    }

    #[test]
    fn results_are_sorted_cut_to_top_n_and_carry_documents_when_asked() {
        let mut r = parse(json!({"query": "q", "documents": ["a", "b", "c"], "top_n": 2})).unwrap();
        let used = vec![
            Usage {
                prompt_tokens: 5,
                ..Usage::default()
            };
            3
        ];
        let body = response(&r, &[0.25, 0.75, 0.5], &used);
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 1);
        assert_eq!(results[0]["relevance_score"], 0.75);
        assert_eq!(results[1]["index"], 2);
        assert!(results[0].get("document").is_none());
        assert_eq!(body["usage"]["prompt_tokens"], 15);
        r.return_documents = true;
        let body = response(&r, &[0.25, 0.75, 0.5], &used);
        assert_eq!(body["results"][0]["document"]["text"], "b");
    }
}
