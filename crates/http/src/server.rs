//! The axum application: routes, the API-key check, and the handlers that
//! join translation, the router connection and the response encoders
//! (llama-server's `/tokenize`, `/detokenize` and `/apply-template` too).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

use crate::anthropic;
use crate::backend::{Pending, RouterClient};
use crate::embeddings;
use crate::error::ApiError;
use crate::rerank;
use crate::respond::{
    Collected, Endpoint, Meta, PartEncoder, StreamEncoder, add_usage, full_response,
};
use crate::responses;
use crate::store::ResponseStore;
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
    /// `/v1/responses` results, for `previous_response_id` and `GET`.
    pub responses: Arc<std::sync::Mutex<ResponseStore>>,
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
        .route("/v1/rerank", post(rerank))
        .route("/rerank", post(rerank))
        .route("/v1/score", post(rerank))
        .route("/v1/responses", post(create_response))
        .route(
            "/v1/responses/{id}",
            get(stored_response).delete(delete_response),
        )
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
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
    "POST /v1/rerank",
    "POST /rerank",
    "POST /v1/score",
    "POST /v1/responses",
    "GET /v1/responses/{id}",
    "DELETE /v1/responses/{id}",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
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

/// The API key, as OpenAI's clients send it (`Authorization: Bearer`) or
/// Anthropic's (`x-api-key`); a missing or wrong one is a 401 in the
/// shape of the API asked.
async fn require_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let headers = request.headers();
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        if ![bearer, x_api_key]
            .into_iter()
            .flatten()
            .any(|given| same_secret(given.as_bytes(), key.as_bytes()))
        {
            if request.uri().path().starts_with("/v1/messages") {
                return anthropic_error(&ApiError::Unauthorized);
            }
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(request).await
}

fn anthropic_error(error: &ApiError) -> Response {
    let (status, body) = anthropic::error(error);
    (status, axum::Json(body)).into_response()
}

/// OpenAI's `POST /v1/responses`, whole or streamed; stored (unless
/// `store: false`) for `previous_response_id` and `GET`.
async fn create_response(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let store = state.responses.clone();
    let request = responses::request(&body, context(&state, &id), |previous| {
        lock(&store).turns(previous, Instant::now())
    })?;
    let meta = responses::ResponseMeta {
        id: format!("resp_{}", id.replace('-', "")),
        created: now_unix(),
        model: request.translated.model.clone(),
        store: request.store,
        previous: request.previous.clone(),
    };
    // Called with the finished response object.
    let keep = {
        let (id, turns) = (meta.id.clone(), request.turns);
        move |response: &serde_json::Value| {
            if let Some(mut turns) = turns {
                turns.push(responses::assistant_turn(response));
                lock(&store).put(id, turns, response.clone(), Instant::now());
            }
        }
    };
    let whole = meta.clone();
    let keep_whole = keep.clone();
    one_request(
        &state,
        request.translated,
        || responses::ResponseStream::new(meta).keeping(keep),
        move |out, reason, used| {
            let response = responses::response(&whole, out, reason, used);
            keep_whole(&response);
            response
        },
    )
    .await
}

/// The store, even if a thread panicked holding it (its data stays
/// consistent: every change is made whole before the lock is released).
fn lock(store: &std::sync::Mutex<ResponseStore>) -> std::sync::MutexGuard<'_, ResponseStore> {
    store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `GET /v1/responses/{id}`: a stored response object.
async fn stored_response(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    lock(&state.responses)
        .response(&id, Instant::now())
        .map(|response| axum::Json(response).into_response())
        .ok_or(ApiError::ResponseNotFound(id))
}

/// `DELETE /v1/responses/{id}`.
async fn delete_response(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !lock(&state.responses).remove(&id) {
        return Err(ApiError::ResponseNotFound(id));
    }
    Ok(
        axum::Json(json!({"id": id, "object": "response.deleted", "deleted": true}))
            .into_response(),
    )
}

/// Anthropic's `POST /v1/messages`, whole or streamed; errors in
/// Anthropic's shape.
async fn messages(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Response {
    let answer = async {
        let body = read(body)?;
        let request = anthropic::request(&body, context(&state, &id), false)?;
        let meta = anthropic::MessageMeta {
            id: format!("msg_{}", id.replace('-', "")),
            model: request.translated.model.clone(),
            stop_sequences: request.stop_sequences,
        };
        let whole = meta.clone();
        one_request(
            &state,
            request.translated,
            || anthropic::MessageStream::new(meta),
            |out, reason, used| anthropic::message(&whole, out, reason, used),
        )
        .await
    };
    answer.await.unwrap_or_else(|error| anthropic_error(&error))
}

/// Anthropic's `POST /v1/messages/count_tokens`: the prompt the request
/// would feed the model, counted by the worker (templated, tools shown)
/// without computing anything.
async fn count_tokens(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Response {
    let counted = async {
        let body = read(body)?;
        let mut translated = anthropic::request(&body, context(&state, &id), true)?.translated;
        translated.request.max_tokens = 0;
        translated.request.logprobs = false;
        translated.stream = false;
        let meta = anthropic::MessageMeta {
            id: String::new(),
            model: String::new(),
            stop_sequences: Vec::new(),
        };
        one_request(
            &state,
            translated,
            || anthropic::MessageStream::new(meta),
            |_, _, used| anthropic::count(used),
        )
        .await
    };
    counted
        .await
        .unwrap_or_else(|error| anthropic_error(&error))
}

/// Sends a one-prompt request; answers with an SSE stream through the
/// encoder `events` makes or, not streamed, with the JSON `whole` makes
/// of the output. The first reply is awaited first, so a request the
/// router rejects gets an HTTP error status even when streaming.
async fn one_request<E: Events>(
    state: &AppState,
    translated: translate::Translated,
    events: impl FnOnce() -> E,
    whole: impl FnOnce(&Collected, FinishReason, &Usage) -> serde_json::Value,
) -> Result<Response, ApiError> {
    let model = translated.request.model.clone();
    let timeout = state.reply_timeout;
    let mut pending = state.client.generate(translated.request)?;
    let first = pending.next(timeout).await?;
    if let ClientReply::Error { code, message, .. } = first {
        return Err(ApiError::from_router(code, message, model.as_deref()));
    }
    if translated.stream {
        return Ok(stream(vec![(pending, first)], events(), timeout, 1));
    }
    let mut outs = [(Collected::default(), FinishReason::Stop)];
    let mut used = Usage::default();
    collect(
        &mut pending,
        first,
        &mut outs,
        &mut used,
        timeout,
        model.as_deref(),
    )
    .await?;
    let [(out, reason)] = &outs;
    Ok(axum::Json(whole(out, *reason, &used)).into_response())
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
    let request = text::tokenize(&body, context(&state, &id))?;
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
    let request = embeddings::request(&body, context(&state, &id))?;
    let (vectors, used) = vectors(&state, request.requests).await?;
    let body = embeddings::response(&request.model, &vectors, &used, request.base64);
    Ok(axum::Json(body).into_response())
}

/// llama-server's, Jina's and Cohere's rerank: one protocol request per
/// document, all sent at once so the worker batches them; each one's
/// score is the first output of the model's classification head.
async fn rerank(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let mut request = rerank::request(&body, context(&state, &id))?;
    let (vectors, used) = vectors(&state, std::mem::take(&mut request.requests)).await?;
    let scores: Vec<f32> = vectors
        .iter()
        .map(|v| v.first().copied().unwrap_or(f32::NEG_INFINITY))
        .collect();
    let body = rerank::response(&request, &scores, &used);
    Ok(axum::Json(body).into_response())
}

/// Sends `requests` (each with `embed`) at once and gathers their vectors
/// and usage in order.
async fn vectors(
    state: &AppState,
    requests: Vec<zinfer_protocol::GenerateRequest>,
) -> Result<(Vec<Vec<f32>>, Vec<zinfer_protocol::Usage>), ApiError> {
    let mut pending = Vec::with_capacity(requests.len());
    for generate in requests {
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
    Ok((vectors, used))
}

/// llama-server's `/detokenize`.
async fn detokenize(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let request = text::detokenize(&body, context(&state, &id))?;
    answer_text(&state, TextRequest::Detokenize(request)).await
}

/// llama-server's `/apply-template`.
async fn apply_template(
    State(state): State<AppState>,
    Extension(RequestId(id)): Extension<RequestId>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read(body)?;
    let request = text::apply_template(&body, context(&state, &id))?;
    answer_text(&state, TextRequest::ApplyTemplate(request)).await
}

/// What a translation needs of the state, for request `id`.
fn context<'a>(state: &'a AppState, id: &'a str) -> Context<'a> {
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
/// first reply to every prompt is awaited before answering, so a request
/// the router rejects gets a proper HTTP error status even when streaming.
/// A completions body with several prompts sends one protocol request per
/// prompt, all at once (the worker batches them); prompt `p`'s choice `c`
/// is the response's choice `p * n + c`, as OpenAI numbers them.
async fn generate(
    state: AppState,
    id: String,
    endpoint: Endpoint,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ctx = context(&state, &id);
    let translated = match endpoint {
        Endpoint::Completions => translate::completion(&body, ctx)?,
        Endpoint::Chat => translate::chat(&body, ctx)?,
    };
    let requests = translated.requests();
    let model = translated.request.model.clone();
    let n = translated.request.n.max(1);
    let echo = if translated.echo {
        echoed_prompts(&state, &requests).await?
    } else {
        Vec::new()
    };
    let prompts = requests.len() as u32;
    let timeout = state.reply_timeout;
    // Dropping what was sent (on an error) cancels it in the router.
    let mut sent = Vec::with_capacity(requests.len());
    for request in requests {
        sent.push(state.client.generate(request)?);
    }
    let mut started = Vec::with_capacity(sent.len());
    for mut pending in sent {
        let first = pending.next(timeout).await?;
        if let ClientReply::Error { code, message, .. } = first {
            return Err(ApiError::from_router(code, message, model.as_deref()));
        }
        started.push((pending, first));
    }
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let meta = Meta {
        endpoint,
        id: format!("{prefix}-{id}"),
        created: now_unix(),
        model: translated.model,
        logprobs: translated.request.logprobs,
        choices: n * prompts,
        n,
        echo,
    };
    if !translated.stream {
        return whole(started, &meta, timeout, model.as_deref()).await;
    }
    let encoder = StreamEncoder::new(meta, translated.include_usage);
    Ok(stream(started, encoder, timeout, n))
}

/// Each prompt's text, for `echo`: as sent, or its token ids decoded by
/// the model's tokenizer.
async fn echoed_prompts(
    state: &AppState,
    requests: &[zinfer_protocol::GenerateRequest],
) -> Result<Vec<String>, ApiError> {
    let mut texts = Vec::with_capacity(requests.len());
    for request in requests {
        let text = match (&request.prompt, &request.tokens) {
            (Some(text), _) => text.clone(),
            (None, tokens) => {
                let detokenize = zinfer_protocol::DetokenizeRequest {
                    id: state.client.next_id(),
                    model: request.model.clone(),
                    tokens: tokens.clone().unwrap_or_default(),
                };
                match state
                    .client
                    .text(TextRequest::Detokenize(detokenize), state.reply_timeout)
                    .await?
                {
                    ClientReply::Detokenized { content, .. } => content,
                    _ => {
                        return Err(ApiError::Router {
                            code: zinfer_protocol::ErrorCode::Internal,
                            message: "the router answered a detokenize with another reply".into(),
                        });
                    }
                }
            }
        };
        texts.push(text);
    }
    Ok(texts)
}

/// What turns a streamed request's replies into server-sent events.
trait Events: Send + 'static {
    /// The events for one reply.
    fn reply(&mut self, reply: ClientReply) -> Vec<Event>;
    /// The events for a failure of the front mid-stream.
    fn error(&mut self, error: &ApiError) -> Vec<Event>;
    /// Whether the last event went out.
    fn finished(&self) -> bool;
}

impl Events for StreamEncoder {
    fn reply(&mut self, reply: ClientReply) -> Vec<Event> {
        let payloads = self.on_reply(reply);
        payloads
            .into_iter()
            .map(|p| Event::default().data(p))
            .collect()
    }

    fn error(&mut self, error: &ApiError) -> Vec<Event> {
        let payloads = self.on_error(error);
        payloads
            .into_iter()
            .map(|p| Event::default().data(p))
            .collect()
    }

    fn finished(&self) -> bool {
        StreamEncoder::finished(self)
    }
}

impl<T: PartEncoder + Send + 'static> Events for T {
    fn reply(&mut self, reply: ClientReply) -> Vec<Event> {
        named(self.on_reply(reply))
    }

    fn error(&mut self, error: &ApiError) -> Vec<Event> {
        named(self.failed(error))
    }

    fn finished(&self) -> bool {
        PartEncoder::finished(self)
    }
}

fn named(events: Vec<crate::respond::Sse>) -> Vec<Event> {
    events
        .into_iter()
        .map(|(name, data)| Event::default().event(name).data(data))
        .collect()
}

/// The SSE response: every prompt's replies as they come, their choices
/// numbered `prompt * n + choice`, through one encoder.
fn stream(
    started: Vec<(Pending, ClientReply)>,
    encoder: impl Events,
    timeout: Duration,
    n: u32,
) -> Response {
    use futures_util::StreamExt;
    let prompts = started
        .into_iter()
        .enumerate()
        .map(|(prompt, (pending, first))| {
            let offset = prompt as u32 * n;
            // Each prompt's replies until its `n` dones (or an error).
            futures_util::stream::unfold(
                (pending, Some(first), n),
                move |(mut pending, first, left)| async move {
                    if left == 0 {
                        return None;
                    }
                    let reply = match first {
                        Some(reply) => Ok(reply),
                        None => pending.next(timeout).await,
                    };
                    let left = match &reply {
                        Ok(ClientReply::Done { .. }) => left - 1,
                        Ok(ClientReply::Error { .. }) | Err(_) => 0,
                        Ok(_) => left,
                    };
                    Some((
                        reply.map(|r| shift_choice(r, offset)),
                        (pending, None, left),
                    ))
                },
            )
            .boxed()
        });
    let replies = futures_util::stream::select_all(prompts);
    let events = futures_util::stream::unfold(
        (replies, encoder, VecDeque::new()),
        |(mut replies, mut encoder, mut queue)| async move {
            loop {
                if let Some(event) = queue.pop_front() {
                    return Some((Ok::<_, Infallible>(event), (replies, encoder, queue)));
                }
                if encoder.finished() {
                    return None;
                }
                match replies.next().await {
                    Some(Ok(reply)) => queue.extend(encoder.reply(reply)),
                    Some(Err(error)) => queue.extend(encoder.error(&error)),
                    None => return None,
                }
            }
        },
    );
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `reply` with its choice moved up by `offset`.
fn shift_choice(mut reply: ClientReply, offset: u32) -> ClientReply {
    match &mut reply {
        ClientReply::Chunk { body, .. } => body.choice += offset,
        ClientReply::Done { body, .. } => body.choice += offset,
        _ => {}
    }
    reply
}

/// Collects every prompt's chunks, every choice's, into one response body.
async fn whole(
    started: Vec<(Pending, ClientReply)>,
    meta: &Meta,
    timeout: Duration,
    model: Option<&str>,
) -> Result<Response, ApiError> {
    let n = meta.n.max(1) as usize;
    let mut outs: Vec<(Collected, FinishReason)> = (0..n * started.len())
        .map(|_| (Collected::default(), FinishReason::Stop))
        .collect();
    let mut used = Usage::default();
    for ((mut pending, first), outs) in started.into_iter().zip(outs.chunks_mut(n)) {
        collect(&mut pending, first, outs, &mut used, timeout, model).await?;
    }
    let body = full_response(meta, &outs, &used);
    Ok(axum::Json(body).into_response())
}

/// Gathers one prompt's replies into `outs`, one per choice, until each
/// choice's `done`.
async fn collect(
    pending: &mut Pending,
    first: ClientReply,
    outs: &mut [(Collected, FinishReason)],
    used: &mut Usage,
    timeout: Duration,
    model: Option<&str>,
) -> Result<(), ApiError> {
    let mut left = outs.len();
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
                        stop_logprob,
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
                    out.stop = stop_logprob;
                    *reason = finish_reason;
                    add_usage(used, choice == 0, &usage);
                    left -= 1;
                }
                if left == 0 {
                    return Ok(());
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
