//! The axum application: routes, the API-key check, and the handlers that
//! join translation, the router connection and the response encoders
//! (llama-server's `/tokenize`, `/detokenize` and `/apply-template` too).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use zinfer_protocol::{
    ChunkBody, ClientReply, DoneBody, FinishReason, Limits, ModelInfo, TextRequest, Usage,
};

use crate::backend::{Pending, RouterClient};
use crate::embeddings;
use crate::error::ApiError;
use crate::respond::{Collected, Endpoint, Meta, StreamEncoder, add_usage, full_response};
use crate::text;
use crate::translate::{self, Context};

/// How long `/v1/models` and `/ready` wait for the router.
const MODELS_TIMEOUT: Duration = Duration::from_secs(3);

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The router connection.
    pub client: RouterClient,
    /// `--served-model-name`.
    pub alias: Option<String>,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// Longest wait for the router's next reply to a request.
    pub reply_timeout: Duration,
    /// Checked before a request is sent.
    pub limits: Arc<Limits>,
}

/// Longest request body read: twice the protocol's frame limit, so every
/// body that could translate to a valid frame fits, and nothing bigger is
/// buffered.
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// A handler's body, or why it could not be read.
type Body = Result<Bytes, BytesRejection>;

/// The body, or an OpenAI-shaped 413 (over [`MAX_BODY_BYTES`]) or 400.
fn read(body: Body) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge(MAX_BODY_BYTES)
        } else {
            ApiError::BodyUnreadable(rejection.body_text())
        }
    })
}

/// The routes: `/v1/*` behind the API key when one is set; `/health` and
/// `/ready` open, for probes.
pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/embeddings", post(embeddings))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), request_id))
        .with_state(state)
}

/// Every route served, for the 404 text.
pub const ROUTES: &[&str] = &[
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/embeddings",
    "GET /v1/models",
    "GET /v1/models/{id}",
    "POST /tokenize",
    "POST /detokenize",
    "POST /apply-template",
    "GET /health",
    "GET /ready",
];

/// A request's protocol id, chosen by [`request_id`] before any handler.
#[derive(Debug, Clone)]
struct RequestId(String);

/// The header that names a request to the client and in logs.
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client `x-request-id` echoed; a longer one is replaced by the
/// request's own id.
const MAX_CLIENT_REQUEST_ID: usize = 200;

/// Gives the request a fresh protocol id (unique, so the router connection
/// can tell replies apart) and answers with `x-request-id`: the client's
/// own when it sent a usable one, else that protocol id.
async fn request_id(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let id = state.client.next_id();
    let echoed = request
        .headers()
        .get(&X_REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= MAX_CLIENT_REQUEST_ID)
        .cloned()
        .or_else(|| HeaderValue::from_str(&id).ok());
    if let Some(echoed) = &echoed {
        tracing::debug!(id, client_id = ?echoed, "request");
    }
    request.extensions_mut().insert(RequestId(id));
    let mut response = next.run(request).await;
    if let Some(echoed) = echoed {
        response.headers_mut().insert(X_REQUEST_ID.clone(), echoed);
    }
    response
}

async fn require_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|given| same_secret(given.as_bytes(), key.as_bytes())) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(request).await
}

/// Compares without stopping at the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn no_route(request: Request) -> ApiError {
    ApiError::NoRoute(request.uri().path().to_string())
}

async fn health() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

async fn ready(State(state): State<AppState>) -> Response {
    match state.client.models(MODELS_TIMEOUT).await {
        Ok(models) if models.iter().any(ModelInfo::servable) => {
            axum::Json(json!({"status": "ready", "models": models_json(&models)})).into_response()
        }
        Ok(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "not ready", "reason": "no worker serves a model yet"})),
        )
            .into_response(),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "not ready", "reason": error.to_string()})),
        )
            .into_response(),
    }
}

fn models_json(models: &[zinfer_protocol::ModelInfo]) -> serde_json::Value {
    models
        .iter()
        .map(|m| json!({"name": m.name, "workers": m.workers, "state": state_name(m)}))
        .collect()
}

/// A model's state as `/v1/models` shows it; a router too old to say
/// lists only loaded models.
fn state_name(model: &zinfer_protocol::ModelInfo) -> &'static str {
    model
        .state
        .unwrap_or(zinfer_protocol::ModelState::Loaded)
        .as_str()
}

/// Every model the router lists: loaded, loading, or offered and loaded on
/// its first request (`state`, as Ollama's `ps` tells).
async fn models(State(state): State<AppState>) -> Result<Response, ApiError> {
    let data = model_entries(&state).await?;
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

/// OpenAI's `GET /v1/models/{id}`: the entry `/v1/models` lists under
/// that id, or a 404 naming it.
async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    model_entries(&state)
        .await?
        .into_iter()
        .find(|entry| entry["id"] == id.as_str())
        .map(|entry| axum::Json(entry).into_response())
        .ok_or(ApiError::ModelNotFound(id))
}

/// The entries of `/v1/models`: the alias first, then every servable model.
async fn model_entries(state: &AppState) -> Result<Vec<serde_json::Value>, ApiError> {
    let served = state.client.models(MODELS_TIMEOUT).await?;
    let created = now_unix();
    let entry = |id: &str, model_state: &str| {
        json!({"id": id, "object": "model", "created": created, "owned_by": "zinfer",
               "state": model_state})
    };
    let mut data: Vec<_> = state
        .alias
        .iter()
        .map(|alias| entry(alias, "loaded"))
        .collect();
    data.extend(
        served
            .iter()
            .filter(|m| m.servable() && Some(&m.name) != state.alias.as_ref())
            .map(|m| entry(&m.name, state_name(m))),
    );
    Ok(data)
}

async fn completions(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    generate(state, id, Endpoint::Completions, body).await
}

async fn chat_completions(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    generate(state, id, Endpoint::Chat, body).await
}

/// llama-server's `/tokenize`.
async fn tokenize(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let request = text::tokenize(&body, text_context(&state, &id))?;
    answer_text(&state, TextRequest::Tokenize(request)).await
}

/// OpenAI's `/v1/embeddings`: one protocol request per input, all sent
/// at once so the worker batches them; the vectors in input order.
async fn embeddings(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let request = embeddings::request(&body, text_context(&state, &id))?;
    let mut pending = Vec::with_capacity(request.requests.len());
    for generate in request.requests {
        let model = generate.model.clone();
        pending.push((state.client.generate(generate)?, model));
    }
    let mut vectors = Vec::with_capacity(pending.len());
    let mut used = Vec::with_capacity(pending.len());
    // Dropping what is left (on an error) cancels it in the router.
    for (mut input, model) in pending {
        loop {
            match input.next(state.reply_timeout).await? {
                ClientReply::Done {
                    body:
                        DoneBody {
                            embedding: Some(vector),
                            usage,
                            ..
                        },
                    ..
                } => {
                    vectors.push(vector);
                    used.push(usage);
                    break;
                }
                ClientReply::Done {
                    body: DoneBody { finish_reason, .. },
                    ..
                } => {
                    return Err(ApiError::Router {
                        code: zinfer_protocol::ErrorCode::Internal,
                        message: format!(
                            "the embedding ended ({}) without a vector",
                            finish_reason.as_str()
                        ),
                    });
                }
                ClientReply::Error { code, message, .. } => {
                    return Err(ApiError::from_router(code, message, model.as_deref()));
                }
                _ => {}
            }
        }
    }
    let body = embeddings::response(&request.model, &vectors, &used, request.base64);
    Ok(axum::Json(body).into_response())
}

/// llama-server's `/detokenize`.
async fn detokenize(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let request = text::detokenize(&body, text_context(&state, &id))?;
    answer_text(&state, TextRequest::Detokenize(request)).await
}

/// llama-server's `/apply-template`.
async fn apply_template(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let request = text::apply_template(&body, text_context(&state, &id))?;
    answer_text(&state, TextRequest::ApplyTemplate(request)).await
}

fn text_context<'a>(state: &'a AppState, id: &'a str) -> Context<'a> {
    Context {
        id,
        alias: state.alias.as_deref(),
        limits: &state.limits,
    }
}

async fn answer_text(state: &AppState, request: TextRequest) -> Result<Response, ApiError> {
    let reply = state.client.text(request, state.reply_timeout).await?;
    Ok(axum::Json(text::response(&reply)?).into_response())
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Translates, sends, and answers with one JSON body or an SSE stream. The
/// first reply is awaited before answering, so a request the router rejects
/// gets a proper HTTP error status even when streaming.
async fn generate(
    state: AppState,
    id: String,
    endpoint: Endpoint,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ctx = Context {
        id: &id,
        alias: state.alias.as_deref(),
        limits: &state.limits,
    };
    let translated = match endpoint {
        Endpoint::Completions => translate::completion(&body, ctx)?,
        Endpoint::Chat => translate::chat(&body, ctx)?,
    };
    let model = translated.request.model.clone();
    let logprobs = translated.request.logprobs;
    let choices = translated.request.n.max(1);
    let mut pending = state.client.generate(translated.request)?;
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let meta = Meta {
        endpoint,
        id: format!("{prefix}-{id}"),
        created: now_unix(),
        model: translated.model,
        logprobs,
        choices,
        echo: translated.echo,
    };
    let timeout = state.reply_timeout;
    let first = pending.next(timeout).await?;
    if let ClientReply::Error { code, message, .. } = first {
        return Err(ApiError::from_router(code, message, model.as_deref()));
    }
    if !translated.stream {
        return whole(pending, first, &meta, timeout, model.as_deref()).await;
    }
    let mut encoder = StreamEncoder::new(meta, translated.include_usage);
    let queue: VecDeque<String> = encoder.on_reply(first).into();
    let stream = futures_util::stream::unfold(
        (pending, encoder, queue),
        move |(mut pending, mut encoder, mut queue)| async move {
            loop {
                if let Some(payload) = queue.pop_front() {
                    let event = Ok::<_, Infallible>(Event::default().data(payload));
                    return Some((event, (pending, encoder, queue)));
                }
                if encoder.finished() {
                    return None;
                }
                match pending.next(timeout).await {
                    Ok(reply) => queue.extend(encoder.on_reply(reply)),
                    Err(error) => queue.extend(encoder.on_error(&error)),
                }
            }
        },
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Collects a request's chunks, every choice's, into one response body.
async fn whole(
    mut pending: Pending,
    first: ClientReply,
    meta: &Meta,
    timeout: Duration,
    model: Option<&str>,
) -> Result<Response, ApiError> {
    let n = meta.choices.max(1) as usize;
    let mut outs: Vec<(Collected, FinishReason)> = (0..n)
        .map(|_| (Collected::default(), FinishReason::Stop))
        .collect();
    let mut used = Usage::default();
    let mut left = n;
    let mut reply = first;
    loop {
        match reply {
            ClientReply::Chunk {
                body:
                    ChunkBody {
                        text,
                        logprobs,
                        reasoning,
                        tool_calls,
                        choice,
                        ..
                    },
                ..
            } => {
                if let Some((out, _)) = outs.get_mut(choice as usize) {
                    out.add(&text, &reasoning, tool_calls, logprobs);
                }
            }
            ClientReply::Done {
                body:
                    DoneBody {
                        finish_reason,
                        usage,
                        text,
                        logprobs,
                        reasoning,
                        tool_calls,
                        choice,
                        prompt_logprobs,
                        ..
                    },
                ..
            } => {
                // The prompt's entries come once, on choice 0's done; every
                // echoed choice shows them.
                if let Some(prompt) = prompt_logprobs {
                    for (out, _) in outs.iter_mut() {
                        out.prompt.clone_from(&prompt);
                    }
                }
                if let Some((out, reason)) = outs.get_mut(choice as usize) {
                    out.add(
                        &text.unwrap_or_default(),
                        &reasoning.unwrap_or_default(),
                        tool_calls.unwrap_or_default(),
                        logprobs,
                    );
                    *reason = finish_reason;
                    add_usage(&mut used, choice, &usage);
                    left -= 1;
                }
                if left == 0 {
                    let body = full_response(meta, &outs, &used);
                    return Ok(axum::Json(body).into_response());
                }
            }
            ClientReply::Error { code, message, .. } => {
                return Err(ApiError::from_router(code, message, model));
            }
            ClientReply::Models { .. }
            | ClientReply::Pong { .. }
            | ClientReply::Tokenized { .. }
            | ClientReply::Detokenized { .. }
            | ClientReply::AppliedTemplate { .. }
            | ClientReply::Embedding { .. } => {}
        }
        reply = pending.next(timeout).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
}
