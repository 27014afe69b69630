//! `POST /v1/embeddings`: OpenAI's body to one protocol `generate` with
//! `embed` per input, and their vectors back in OpenAI's shape. The
//! parsing and the response are pure; the handler in `server` sends the
//! requests and gathers the replies.

use serde_json::{Map, Value, json};
use zinfer_protocol::{DecodeError, EmbedRequest, GenerateRequest, Pooling, Usage};

use crate::error::ApiError;
use crate::translate::Context;

/// Fields of `POST /v1/embeddings`; `pooling` is zinfer's own.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "encoding_format",
    "dimensions",
    "user",
    "pooling",
];

/// Most inputs in one request, as OpenAI allows.
pub const MAX_INPUTS: usize = 2048;

/// A valid embeddings request: one protocol request per input.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// The requests, in input order (ids `{id}-{index}`).
    pub requests: Vec<GenerateRequest>,
    /// `base64` instead of arrays of floats.
    pub base64: bool,
    /// The model name echoed in the response.
    pub model: String,
}

/// One input: text, or token ids.
enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// Translates a `/v1/embeddings` body.
pub fn request(bytes: &[u8], ctx: Context<'_>) -> Result<Embeddings, ApiError> {
    let body = crate::translate::json_object(bytes, FIELDS)?;
    let inputs = inputs(body.get("input"))?;
    if body.get("dimensions").is_some_and(|d| !d.is_null()) {
        return Err(ApiError::unsupported(
            "dimensions",
            "\"dimensions\" is not supported: the model's own width is returned",
        ));
    }
    let base64 = match body.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("\"encoding_format\" must be \"float\" or \"base64\", not {other:?}"),
            ));
        }
    };
    let pooling = match body.get("pooling") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            serde_json::from_value::<Pooling>(value.clone())
                .ok()
                .filter(|p| *p != Pooling::Rank)
                .ok_or_else(|| {
                    ApiError::invalid("pooling", "\"pooling\" must be \"mean\" or \"last\"")
                })?,
        ),
    };
    if let Some(user) = body.get("user")
        && !user.is_string()
        && !user.is_null()
    {
        return Err(ApiError::invalid("user", "\"user\" must be a string"));
    }
    let model = string(&body, "model")?;
    let requests = inputs
        .into_iter()
        .enumerate()
        .map(|(index, input)| {
            let mut embed = EmbedRequest::text(format!("{}-{index}", ctx.id), "");
            match input {
                Input::Text(text) => embed.input = Some(text),
                Input::Tokens(tokens) => {
                    embed.input = None;
                    embed.tokens = Some(tokens);
                }
            }
            embed.pooling = pooling;
            embed.model = model
                .clone()
                .filter(|m| !m.is_empty() && Some(m.as_str()) != ctx.alias);
            let request = embed.to_generate();
            request
                .validate(ctx.limits)
                .map_err(|error| decode_error(index, error))?;
            Ok(request)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Embeddings {
        requests,
        base64,
        model: model
            .filter(|m| !m.is_empty())
            .or(ctx.alias.map(str::to_string))
            .unwrap_or_else(|| "default".to_string()),
    })
}

fn string(body: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("\"{name}\" must be a string"),
        )),
    }
}

/// OpenAI's `input`: a string, an array of strings, an array of token ids,
/// or an array of arrays of token ids.
fn inputs(input: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "input",
            "\"input\" must be a string, an array of strings, an array of token ids or an \
             array of arrays of token ids, none empty",
        )
    };
    let tokens = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        if items.is_empty() {
            return Err(bad());
        }
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(bad)
            })
            .collect()
    };
    let inputs = match input {
        Some(Value::String(text)) => vec![Input::Text(text.clone())],
        Some(Value::Array(items)) => match items.first() {
            None => return Err(bad()),
            Some(Value::Number(_)) => vec![Input::Tokens(tokens(items)?)],
            Some(_) => items
                .iter()
                .map(|item| match item {
                    Value::String(text) => Ok(Input::Text(text.clone())),
                    Value::Array(ids) => Ok(Input::Tokens(tokens(ids)?)),
                    _ => Err(bad()),
                })
                .collect::<Result<_, _>>()?,
        },
        _ => return Err(bad()),
    };
    if inputs.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!(
                "at most {MAX_INPUTS} inputs per request, got {}",
                inputs.len()
            ),
        ));
    }
    if inputs
        .iter()
        .any(|input| matches!(input, Input::Text(text) if text.is_empty()))
    {
        return Err(bad());
    }
    Ok(inputs)
}

fn decode_error(index: usize, error: DecodeError) -> ApiError {
    ApiError::invalid("input", format!("input {index}: {error}"))
}

/// The response body: one entry per vector, in input order; the usage
/// counts every input's tokens.
pub fn response(model: &str, vectors: &[Vec<f32>], used: &[Usage], base64: bool) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(encode_base64(&bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens: u64 = used.iter().map(|u| u64::from(u.prompt_tokens)).sum();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

/// Standard base64 with padding: how OpenAI sends `encoding_format:
/// "base64"` vectors (little-endian f32 bytes).
fn encode_base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_protocol::Limits;

    fn parse(body: Value) -> Result<Embeddings, ApiError> {
        let limits = Limits::default();
        request(
            body.to_string().as_bytes(),
            Context {
                id: "h-1",
                alias: Some("smol"),
                limits: &limits,
            },
        )
    }

    fn param(error: &ApiError) -> Option<String> {
        error.body()["error"]["param"].as_str().map(str::to_string)
    }

    #[test]
    fn every_input_form_becomes_embed_requests() {
        let e = parse(json!({"model": "smol", "input": "hello"})).unwrap();
        assert_eq!(e.requests.len(), 1);
        assert_eq!(e.requests[0].prompt.as_deref(), Some("hello"));
        assert_eq!(e.requests[0].embed, Some(Pooling::Mean));
        assert_eq!(e.requests[0].model, None, "the alias is the default model");
        assert_eq!(e.model, "smol");
        let e = parse(json!({"input": ["a", "b"], "pooling": "last"})).unwrap();
        assert_eq!(e.requests.len(), 2);
        assert_eq!(e.requests[1].id, "h-1-1");
        assert_eq!(e.requests[1].embed, Some(Pooling::Last));
        let e = parse(json!({"input": [1, 2, 3], "encoding_format": "base64"})).unwrap();
        assert_eq!(e.requests[0].tokens, Some(vec![1, 2, 3]));
        assert!(e.base64);
        let e = parse(json!({"input": [[1], [2, 3]]})).unwrap();
        assert_eq!(e.requests[1].tokens, Some(vec![2, 3]));
    }

    #[test]
    fn bad_bodies_are_400_naming_the_field() {
        for (body, field) in [
            (json!({"input": ""}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": [[]]}), "input"),
            (json!({"input": [true]}), "input"),
            (json!({"model": "m"}), "input"),
            (json!({"input": "a", "dimensions": 8}), "dimensions"),
            (
                json!({"input": "a", "encoding_format": "hex"}),
                "encoding_format",
            ),
            (json!({"input": "a", "pooling": "max"}), "pooling"),
            (json!({"input": "a", "pooling": "rank"}), "pooling"),
            (json!({"input": "a", "nope": 1}), "nope"),
        ] {
            let error = parse(body.clone()).unwrap_err();
            assert_eq!(param(&error).as_deref(), Some(field), "{body}: {error}");
        }
    }

    #[test]
    fn responses_are_openai_shaped_and_base64_is_little_endian_f32() {
        let used = [
            Usage {
                prompt_tokens: 3,
                ..Usage::default()
            },
            Usage {
                prompt_tokens: 4,
                ..Usage::default()
            },
        ];
        let body = response("smol", &[vec![1.0, 0.0], vec![0.0, -1.0]], &used, false);
        assert_eq!(body["object"], "list");
        assert_eq!(body["data"][1]["index"], 1);
        assert_eq!(body["data"][1]["embedding"], json!([0.0, -1.0]));
        assert_eq!(body["usage"]["prompt_tokens"], 7);
        let body = response("smol", &[vec![1.0]], &used[..1], true);
        // 1.0f32 is 00 00 80 3f.
        assert_eq!(body["data"][0]["embedding"], "AACAPw==");
        assert_eq!(encode_base64(b"ab"), "YWI=");
        assert_eq!(encode_base64(b"abc"), "YWJj");
    }
}
