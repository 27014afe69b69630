//! Frames from clients: `generate`, `cancel`, `models`, `ping` (and the
//! text requests, handed to `text`).

use std::time::Instant;

use zinfer_protocol::{
    ClientReply, ClientRequest, DoneBody, ErrorCode, FinishReason, GenerateRequest, ModelInfo,
    RouterToWorker, TextRequest, Timings, Usage, decode, recover_id,
};

use super::{Addr, Core, Peer, Progress, Request, Stage, millis, seconds};
use crate::{
    Policy,
    index::{index_namespace, prefix_key},
};

/// What a request's `done` goes back to its client as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// `done`, for `generate`.
    Done,
    /// `embedding`, for `embed`.
    Embedding,
}

impl Core {
    /// A frame from a client on the front socket.
    pub fn handle_client(&mut self, now: Instant, from: &Addr, frame: &[u8]) {
        self.handle_client_as(now, from, None, frame);
    }

    /// A frame from a client authenticated as `tenant` (with CURVE on, the
    /// tenant of its public key). The tenant prefixes the request's cache
    /// namespace, so a client can only ever reach its own tenant's cached
    /// prefixes whatever `namespace` it sends, and keys its per-client
    /// limits, so a reconnect with a new routing id is the same client.
    pub fn handle_client_as(
        &mut self,
        now: Instant,
        from: &Addr,
        tenant: Option<&str>,
        frame: &[u8],
    ) {
        match decode::<ClientRequest>(frame, &self.config.limits) {
            Ok(ClientRequest::Generate(request)) => {
                self.accept(now, from, tenant, request, Reply::Done);
            }
            Ok(ClientRequest::Cancel { id }) => self.cancel(now, from, id),
            Ok(ClientRequest::Models { id }) => {
                let models = self.served_models();
                self.send(
                    Peer::Client(from.clone()),
                    &ClientReply::Models { id, models },
                );
            }
            Ok(ClientRequest::Ping { id }) => {
                self.send(Peer::Client(from.clone()), &ClientReply::Pong { id });
            }
            Ok(ClientRequest::Tokenize(request)) => {
                self.accept_text(from, TextRequest::Tokenize(request));
            }
            Ok(ClientRequest::Detokenize(request)) => {
                self.accept_text(from, TextRequest::Detokenize(request));
            }
            Ok(ClientRequest::ApplyTemplate(request)) => {
                self.accept_text(from, TextRequest::ApplyTemplate(request));
            }
            // A `generate` that computes the prompt only; its `done` goes
            // back to the client as `embedding`.
            Ok(ClientRequest::Embed(request)) => {
                self.accept(now, from, tenant, request.to_generate(), Reply::Embedding);
            }
            Err(err) => {
                let id = recover_id(frame, &self.config.limits);
                self.reply_error(from, id, ErrorCode::BadRequest, err.to_string());
            }
        }
    }

    /// Rejects a message whose envelope (frame count or shape) is wrong.
    pub fn reject_client_envelope(&mut self, from: &Addr, detail: &str) {
        self.reply_error(
            from,
            None,
            ErrorCode::BadRequest,
            format!("{detail}; send one MessagePack frame per message"),
        );
    }

    fn accept(
        &mut self,
        now: Instant,
        from: &Addr,
        tenant: Option<&str>,
        mut request: GenerateRequest,
        reply: Reply,
    ) {
        let client_key = (from.identity.clone(), request.id.clone());
        if self.by_client.contains_key(&client_key) {
            let message = format!(
                "request id {:?} is already in flight on this connection; use a new id",
                request.id
            );
            self.reply_error(from, Some(request.id), ErrorCode::BadRequest, message);
            return;
        }
        if let Some(tenant) = tenant {
            match tenant_namespace(tenant, request.namespace.as_deref(), &self.config.limits) {
                Ok(namespace) => request.namespace = Some(namespace),
                Err(error) => {
                    let message = error.to_string();
                    self.reply_error(from, Some(request.id), ErrorCode::BadRequest, message);
                    return;
                }
            }
        }
        let quota_key = tenant.map_or_else(|| from.identity.clone(), |t| t.as_bytes().to_vec());
        if let Some((limit, message)) = self.client_limit(now, &quota_key) {
            self.metrics
                .client_limited
                .with_label_values(&[limit])
                .inc();
            self.reply_error(from, Some(request.id), ErrorCode::Overloaded, message);
            return;
        }
        let model = match self.resolve_model(request.model.as_deref()) {
            Ok(model) => model,
            Err((code, message)) => {
                self.reply_error(from, Some(request.id), code, message);
                return;
            }
        };
        let routable = self.any_routable(&model);
        let cold = !routable && self.offered(&model);
        if !routable && !cold {
            let message = format!(
                "no worker is taking requests for model {model:?} (all draining or lost); \
                 retry later"
            );
            self.reply_error(from, Some(request.id), ErrorCode::Unavailable, message);
            return;
        }
        request.model = Some(model.clone());
        let key = match self.config.policy {
            Policy::CacheAware => prefix_key(&request),
            Policy::RoundRobin | Policy::LeastLoad => Vec::new(),
        };
        let rid = self.next_rid;
        self.next_rid += 1;
        let span = tracing::debug_span!("request", rid, id = %request.id);
        span.in_scope(|| tracing::debug!(%model, "accepted"));
        let choices_left = request.n.max(1);
        let entry = Request {
            client: from.clone(),
            quota_key: quota_key.clone(),
            id: request.id.clone(),
            index_namespace: index_namespace(&model, request.namespace.as_deref()),
            deadline: request.deadline_ms.map(|ms| now + millis(ms)),
            request,
            key,
            arrived: now,
            stage: Stage::Queued,
            last_chunk: None,
            choices_left,
            embedding: reply == Reply::Embedding,
            span,
        };
        self.requests.insert(rid, entry);
        self.by_client.insert(client_key, rid);
        self.quota_started(now, &quota_key);
        if !self.try_dispatch(now, rid) {
            if self.queue.len() >= self.config.queue_capacity {
                self.fail_overloaded(now, rid);
            } else {
                self.enqueue(rid);
                if cold {
                    self.cold_start(now, &model);
                }
            }
        }
    }

    fn fail_overloaded(&mut self, now: Instant, rid: u64) {
        let message = format!(
            "every worker is busy and the router queue is full ({} waiting); \
             retry with backoff",
            self.queue.len()
        );
        self.fail(now, rid, ErrorCode::Overloaded, &message);
    }

    fn cancel(&mut self, now: Instant, from: &Addr, id: String) {
        let Some(&rid) = self.by_client.get(&(from.identity.clone(), id)) else {
            // Already finished (a race with its terminal reply): nothing to do.
            return;
        };
        let Some(request) = self.requests.get_mut(&rid) else {
            return;
        };
        match &mut request.stage {
            Stage::Queued | Stage::Requeued => self.finish_cancelled(now, rid),
            Stage::Running { progress, .. } if *progress == Progress::Cancelling => {}
            Stage::Running {
                worker, progress, ..
            } => {
                *progress = Progress::Cancelling;
                let identity = worker.clone();
                self.forward_cancel(rid, &identity);
            }
        }
    }

    /// Tells the worker `identity` to stop request `rid`.
    fn forward_cancel(&mut self, rid: u64, identity: &[u8]) {
        if let Some(worker) = self.workers.get(identity) {
            let to = Peer::Worker(worker.addr.clone());
            self.send(to, &RouterToWorker::Cancel { rid });
        }
    }

    /// Ends a request the router itself cancels (queued, or its worker is
    /// gone after a cancel was forwarded) with `done` / `cancelled`.
    pub(super) fn finish_cancelled(&mut self, now: Instant, rid: u64) {
        let Some(request) = self.take(now, rid) else {
            return;
        };
        self.metrics
            .requests
            .with_label_values(&["cancelled"])
            .inc();
        let timings = Timings {
            queue_s: if request.stage.dispatched() {
                0.0
            } else {
                seconds(request.arrived, now)
            },
            ..Timings::default()
        };
        // Every choice still owed its `done` gets one.
        let n = request.request.n.max(1);
        for choice in n - request.choices_left.min(n)..n {
            let reply = ClientReply::Done {
                id: request.id.clone(),
                body: DoneBody {
                    text: (!request.request.stream).then(String::new),
                    worker: Some(String::new()),
                    choice,
                    ..DoneBody::new(FinishReason::Cancelled, Usage::default(), timings)
                },
            };
            self.send(Peer::Client(request.client.clone()), &reply);
        }
    }

    /// A client is no longer connected: stop its work.
    pub(super) fn client_gone(&mut self, now: Instant, client: &Addr) {
        self.forget_texts_of(client);
        let rids: Vec<u64> = self
            .by_client
            .iter()
            .filter(|((identity, _), _)| *identity == client.identity)
            .map(|(_, &rid)| rid)
            .collect();
        for rid in rids {
            let Some(request) = self.requests.get_mut(&rid) else {
                continue;
            };
            match &mut request.stage {
                Stage::Queued | Stage::Requeued => {
                    self.take(now, rid);
                    self.metrics
                        .requests
                        .with_label_values(&["client_gone"])
                        .inc();
                }
                Stage::Running { progress, .. } if *progress == Progress::Cancelling => {}
                Stage::Running {
                    worker, progress, ..
                } => {
                    *progress = Progress::Cancelling;
                    let identity = worker.clone();
                    self.forward_cancel(rid, &identity);
                }
            }
        }
    }

    /// The model a request runs on, or why it cannot run. Without `model`,
    /// the model served by the most workers (ties: the first by name), or
    /// the only model offered when none is loaded.
    pub(super) fn resolve_model(&self, model: Option<&str>) -> Result<String, (ErrorCode, String)> {
        let served = self.known_models();
        let offered = self.offered_models();
        if served.is_empty() && offered.is_empty() {
            return Err((
                ErrorCode::Unavailable,
                "no worker is registered; start `zinfer worker` and retry".into(),
            ));
        }
        match model {
            Some(name) if served.iter().any(|info| info.name == name) => Ok(name.to_string()),
            Some(name) if offered.iter().any(|offer| offer == name) => Ok(name.to_string()),
            Some(name) => {
                let mut names: Vec<&str> = served.iter().map(|info| info.name.as_str()).collect();
                names.extend(offered.iter().map(String::as_str));
                names.sort_unstable();
                names.dedup();
                Err((
                    ErrorCode::UnknownModel,
                    format!("model {name:?} is not served; models served: {names:?}"),
                ))
            }
            None if served.is_empty() => match offered.as_slice() {
                [only] => Ok(only.clone()),
                _ => Err((
                    ErrorCode::BadRequest,
                    format!(
                        "field \"model\" is required while no model is loaded; models offered: \
                         {offered:?}"
                    ),
                )),
            },
            None => {
                let best = served.iter().fold(&served[0], |best, info| {
                    if info.workers > best.workers {
                        info
                    } else {
                        best
                    }
                });
                Ok(best.name.clone())
            }
        }
    }

    /// Models of every live worker (draining ones included), by name, and
    /// models whose first or replacement worker is being started (with 0
    /// workers): requests for those wait for it.
    fn known_models(&self) -> Vec<ModelInfo> {
        let mut models = self.count_models(|worker| worker.is_live());
        for model in self.control.spawning_models() {
            if !models.iter().any(|info| info.name == model) {
                models.push(ModelInfo {
                    name: model,
                    workers: 0,
                    context_length: None,
                    vocab_size: None,
                    state: None,
                });
            }
        }
        models
    }

    /// Models of workers taking requests, then the models supervisors
    /// offer that none serves, each with its state, for the `models` reply.
    pub(super) fn served_models(&self) -> Vec<ModelInfo> {
        let mut models = self.count_models(|worker| worker.routable());
        for name in self.offered_models() {
            if !models.iter().any(|info| info.name == name) {
                models.push(ModelInfo {
                    name,
                    workers: 0,
                    context_length: None,
                    vocab_size: None,
                    state: None,
                });
            }
        }
        for info in &mut models {
            info.state = Some(self.model_state(&info.name));
        }
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }

    fn count_models(&self, include: impl Fn(&super::Worker) -> bool) -> Vec<ModelInfo> {
        let mut models: Vec<ModelInfo> = Vec::new();
        for worker in self.workers.values().filter(|worker| include(worker)) {
            for name in &worker.models {
                match models.iter_mut().find(|info| &info.name == name) {
                    Some(info) => {
                        info.workers += 1;
                        // The smallest context any of its workers holds.
                        info.context_length = match (info.context_length, worker.context_length) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        info.vocab_size = info.vocab_size.or(worker.vocab_size);
                    }
                    None => models.push(ModelInfo {
                        name: name.clone(),
                        workers: 1,
                        context_length: worker.context_length,
                        vocab_size: worker.vocab_size,
                        state: None,
                    }),
                }
            }
        }
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }
}

/// A namespace too long once the router prefixed it with the tenant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "field \"namespace\": with CURVE the router prefixes it with your tenant \
     ({prefix} bytes), leaving at most {left} bytes of the {max}-byte limit; use a shorter namespace"
)]
pub(super) struct NamespaceTooLong {
    /// Bytes of the tenant and its `/`.
    prefix: usize,
    /// Bytes left for the client's namespace.
    left: usize,
    /// The name limit.
    max: usize,
}

/// The cache namespace of a request from `tenant`: the tenant, then `/`
/// and the client's own namespace when it sent one. The tenant has no `/`,
/// so no client namespace can spell another tenant's.
pub(super) fn tenant_namespace(
    tenant: &str,
    namespace: Option<&str>,
    limits: &zinfer_protocol::Limits,
) -> Result<String, NamespaceTooLong> {
    let namespace = match namespace {
        Some(namespace) if !namespace.is_empty() => format!("{tenant}/{namespace}"),
        _ => tenant.to_string(),
    };
    if namespace.len() > limits.max_name_bytes {
        return Err(NamespaceTooLong {
            prefix: tenant.len() + 1,
            left: limits.max_name_bytes.saturating_sub(tenant.len() + 1),
            max: limits.max_name_bytes,
        });
    }
    Ok(namespace)
}
