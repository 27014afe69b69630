//! llama-server's `/tokenize`, `/detokenize` and `/apply-template`, with
//! its request and response shapes (plus an optional `model`), translated
//! to and from the protocol's text requests (pure).
//!
//! `/tokenize` keeps llama-server's defaults, `add_special` false
//! included, so a client written for llama-server gets the same ids;
//! `/apply-template` reads `messages` exactly as `/v1/chat/completions`
//! does (it goes through the same translation), so its prompt is the one
//! a chat completion would feed the model.

use serde::Deserialize;
use serde_json::{Value, json};
use zinfer_protocol::{
    ApplyTemplateRequest, ClientReply, DecodeError, DetokenizeRequest, Piece, TokenizeRequest,
};

use crate::error::ApiError;
use crate::translate::{self, Context};

/// `POST /tokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeBody {
    content: String,
    #[serde(default)]
    add_special: Option<bool>,
    #[serde(default)]
    parse_special: Option<bool>,
    #[serde(default)]
    with_pieces: Option<bool>,
    #[serde(default)]
    model: Option<String>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeBody {
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    model: Option<String>,
}

/// `POST /apply-template`: `messages` and `model` as in a chat completion.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyTemplateBody {
    messages: Value,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    model: Option<Value>,
}

fn parse<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let message = e.to_string();
        // serde names the field in these two; they are the usual mistakes.
        let field = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|prefix| message.strip_prefix(prefix))
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string);
        match (message.starts_with("unknown field"), field) {
            (true, Some(field)) => ApiError::UnknownField(field),
            (_, param) => ApiError::InvalidRequest {
                message: format!("invalid request body: {message}"),
                param,
            },
        }
    })
}

/// `model` as the router takes it: the alias (`--served-model-name`) or
/// an empty name mean the default model.
fn model(model: Option<String>, ctx: &Context<'_>) -> Option<String> {
    model.filter(|m| !m.is_empty() && Some(m.as_str()) != ctx.alias)
}

fn checked(result: Result<(), DecodeError>) -> Result<(), ApiError> {
    result.map_err(|error| {
        let message = error.to_string();
        match error {
            DecodeError::OverLimit { field, .. } | DecodeError::Invalid { field, .. } => {
                ApiError::invalid(field, message)
            }
            _ => ApiError::InvalidRequest {
                message,
                param: None,
            },
        }
    })
}

/// The protocol `tokenize` of a `/tokenize` body.
pub fn tokenize(bytes: &[u8], ctx: Context<'_>) -> Result<TokenizeRequest, ApiError> {
    let body: TokenizeBody = parse(bytes)?;
    let request = TokenizeRequest {
        id: ctx.id.to_string(),
        model: model(body.model, &ctx),
        content: body.content,
        add_special: body.add_special.unwrap_or(false),
        parse_special: body.parse_special.unwrap_or(true),
        with_pieces: body.with_pieces.unwrap_or(false),
    };
    checked(request.validate(ctx.limits))?;
    Ok(request)
}

/// The protocol `detokenize` of a `/detokenize` body.
pub fn detokenize(bytes: &[u8], ctx: Context<'_>) -> Result<DetokenizeRequest, ApiError> {
    let body: DetokenizeBody = parse(bytes)?;
    let request = DetokenizeRequest {
        id: ctx.id.to_string(),
        model: model(body.model, &ctx),
        tokens: body.tokens.unwrap_or_default(),
    };
    checked(request.validate(ctx.limits))?;
    Ok(request)
}

/// The protocol `apply_template` of an `/apply-template` body; `messages`
/// and `model` are read by the chat completion's own translation.
pub fn apply_template(bytes: &[u8], ctx: Context<'_>) -> Result<ApplyTemplateRequest, ApiError> {
    let body: ApplyTemplateBody = parse(bytes)?;
    let mut chat = json!({ "messages": body.messages });
    if let Some(model) = body.model {
        chat["model"] = model;
    }
    let translated = translate::chat(chat.to_string().as_bytes(), ctx)?;
    let request = ApplyTemplateRequest {
        id: ctx.id.to_string(),
        model: translated.request.model,
        messages: translated.request.messages.unwrap_or_default(),
        add_generation_prompt: body.add_generation_prompt.unwrap_or(true),
    };
    checked(request.validate(ctx.limits))?;
    Ok(request)
}

/// A piece as llama-server writes it: a string, or its bytes as numbers.
fn piece_json(piece: &Piece) -> Value {
    match piece {
        Piece::Text(text) => Value::String(text.clone()),
        Piece::Bytes(bytes) => Value::Array(bytes.iter().map(|&b| Value::from(b)).collect()),
    }
}

/// The response body of a text request's reply, in llama-server's shape.
pub fn response(reply: &ClientReply) -> Result<Value, ApiError> {
    match reply {
        ClientReply::Tokenized {
            tokens,
            pieces: Some(pieces),
            ..
        } => {
            let entries: Vec<Value> = tokens
                .iter()
                .zip(pieces)
                .map(|(id, piece)| json!({"id": id, "piece": piece_json(piece)}))
                .collect();
            Ok(json!({ "tokens": entries }))
        }
        ClientReply::Tokenized { tokens, .. } => Ok(json!({ "tokens": tokens })),
        ClientReply::Detokenized { content, .. } => Ok(json!({ "content": content })),
        ClientReply::AppliedTemplate { prompt, .. } => Ok(json!({ "prompt": prompt })),
        other => {
            tracing::error!(?other, "unexpected reply to a text request");
            Err(ApiError::Router {
                code: zinfer_protocol::ErrorCode::Internal,
                message: "the router answered with an unexpected reply".into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use zinfer_protocol::Limits;

    use super::*;

    fn ctx(limits: &Limits) -> Context<'_> {
        Context {
            id: "h-1",
            alias: Some("gpt-4o"),
            limits,
        }
    }

    #[test]
    fn tokenize_takes_llama_servers_defaults() {
        let limits = Limits::default();
        let request = tokenize(br#"{"content": "Hi"}"#, ctx(&limits)).unwrap();
        assert!(!request.add_special && request.parse_special && !request.with_pieces);
        assert_eq!((request.id.as_str(), request.model), ("h-1", None));
        let request = tokenize(
            br#"{"content": "Hi", "add_special": true, "parse_special": false,
                 "with_pieces": true, "model": "m"}"#,
            ctx(&limits),
        )
        .unwrap();
        assert!(request.add_special && !request.parse_special && request.with_pieces);
        assert_eq!(request.model.as_deref(), Some("m"));
        // The alias is the default model.
        let request = tokenize(br#"{"content": "", "model": "gpt-4o"}"#, ctx(&limits)).unwrap();
        assert_eq!(request.model, None);
    }

    #[test]
    fn bad_bodies_are_400_naming_the_field() {
        let limits = Limits::default();
        let err = tokenize(br#"{"text": "Hi"}"#, ctx(&limits)).unwrap_err();
        assert_eq!(err, ApiError::UnknownField("text".into()));
        let err = tokenize(br#"{}"#, ctx(&limits)).unwrap_err();
        assert!(
            matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == "content"),
            "{err:?}"
        );
        let err = detokenize(br#"{"tokens": [-1]}"#, ctx(&limits)).unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        let err = apply_template(br#"{"messages": []}"#, ctx(&limits)).unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn apply_template_reads_messages_as_chat_does() {
        let limits = Limits::default();
        let request = apply_template(
            br#"{"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief"}]},
                              {"role": "user", "content": "Hi"}],
                 "add_generation_prompt": false, "model": "m"}"#,
            ctx(&limits),
        )
        .unwrap();
        assert_eq!(request.messages.len(), 2);
        assert_eq!(request.messages[0].role, "system");
        assert_eq!(
            request.messages[0]
                .content
                .as_ref()
                .map(|c| c.text())
                .as_deref(),
            Some("Be brief")
        );
        assert!(!request.add_generation_prompt);
        assert_eq!(request.model.as_deref(), Some("m"));
    }

    #[test]
    fn responses_have_llama_servers_shape() {
        let reply = ClientReply::Tokenized {
            id: "h-1".into(),
            tokens: vec![1, 195],
            pieces: Some(vec![Piece::Text("Hi".into()), Piece::Bytes(vec![195])]),
        };
        assert_eq!(
            response(&reply).unwrap(),
            json!({"tokens": [{"id": 1, "piece": "Hi"}, {"id": 195, "piece": [195]}]})
        );
        let reply = ClientReply::Tokenized {
            id: "h-1".into(),
            tokens: vec![1, 195],
            pieces: None,
        };
        assert_eq!(response(&reply).unwrap(), json!({"tokens": [1, 195]}));
        let reply = ClientReply::Detokenized {
            id: "h-1".into(),
            content: "Hi".into(),
        };
        assert_eq!(response(&reply).unwrap(), json!({"content": "Hi"}));
    }
}
