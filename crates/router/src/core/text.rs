//! `tokenize`, `detokenize` and `apply_template`: routed like `generate`
//! (the client's `model`, or the default one) to a worker serving the
//! model, answered with one reply.
//!
//! They use a worker's tokenizer and template but no KV slot and no
//! forward pass, so they skip the queue, the worker's `has_room` check and
//! the per-client quotas: they go to the least loaded worker taking
//! requests for the model at once, or are answered `unavailable`.

use zinfer_protocol::{ErrorCode, TextRequest, TextResult};

use super::{Addr, Core, Peer};

/// A text request on a worker, until its one reply.
pub(super) struct TextOp {
    client: Addr,
    id: String,
    worker: Vec<u8>,
}

impl Core {
    /// A text request from a client.
    pub(super) fn accept_text(&mut self, from: &Addr, mut request: TextRequest) {
        let id = request.id().to_string();
        let client_key = (from.identity.clone(), id.clone());
        if self.by_client.contains_key(&client_key) || self.text_ids.contains_key(&client_key) {
            let message =
                format!("request id {id:?} is already in flight on this connection; use a new id");
            self.reply_error(from, Some(id), ErrorCode::BadRequest, message);
            return;
        }
        let model = match self.resolve_model(request.model()) {
            Ok(model) => model,
            Err((code, message)) => {
                self.reply_error(from, Some(id), code, message);
                return;
            }
        };
        let chosen = self
            .order
            .iter()
            .filter(|identity| {
                self.workers
                    .get(*identity)
                    .is_some_and(|worker| worker.routable() && worker.serves(&model))
            })
            .min_by_key(|identity| self.load_of(identity))
            .cloned();
        let Some(identity) = chosen else {
            let message = format!(
                "no worker is taking requests for model {model:?} yet (starting, draining or \
                 lost); retry later"
            );
            self.reply_error(from, Some(id), ErrorCode::Unavailable, message);
            return;
        };
        let Some(worker) = self.workers.get(&identity) else {
            return;
        };
        let to = Peer::Worker(worker.addr.clone());
        request.set_model(model);
        let rid = self.next_rid;
        self.next_rid += 1;
        tracing::debug!(rid, %id, worker = %worker.id, "text request dispatched");
        self.send(to, &request.to_worker(rid));
        self.text_ids.insert(client_key, rid);
        self.texts.insert(
            rid,
            TextOp {
                client: from.clone(),
                id,
                worker: identity,
            },
        );
    }

    /// Takes text request `rid` if it runs on `from`.
    fn take_text(&mut self, from: &Addr, rid: u64) -> Option<TextOp> {
        if self.texts.get(&rid)?.worker != from.identity {
            tracing::debug!(rid, "text reply from a worker not running it; dropped");
            return None;
        }
        let op = self.texts.remove(&rid)?;
        self.text_ids
            .remove(&(op.client.identity.clone(), op.id.clone()));
        Some(op)
    }

    /// A worker answered text request `rid`.
    pub(super) fn text_answered(&mut self, from: &Addr, rid: u64, result: TextResult) {
        if let Some(op) = self.take_text(from, rid) {
            self.metrics.requests.with_label_values(&["text"]).inc();
            self.send(Peer::Client(op.client), &result.to_client_reply(op.id));
        }
    }

    /// A worker's `error` for text request `rid`.
    pub(super) fn text_failed(&mut self, from: &Addr, rid: u64, code: ErrorCode, message: String) {
        if let Some(op) = self.take_text(from, rid) {
            self.reply_error(&op.client, Some(op.id), code, message);
        }
    }

    /// The worker `identity` is gone: its text requests end with a
    /// retryable `worker_lost` (sending them again is always safe).
    pub(super) fn fail_texts_on(&mut self, identity: &[u8], reason: &str) {
        let rids: Vec<u64> = self
            .texts
            .iter()
            .filter(|(_, op)| op.worker == identity)
            .map(|(&rid, _)| rid)
            .collect();
        for rid in rids {
            let Some(op) = self.texts.remove(&rid) else {
                continue;
            };
            self.text_ids
                .remove(&(op.client.identity.clone(), op.id.clone()));
            let message =
                format!("the worker answering this request was lost ({reason}); send it again");
            self.reply_error(&op.client, Some(op.id), ErrorCode::WorkerLost, message);
        }
    }

    /// A client is gone: its text requests' answers have nowhere to go.
    pub(super) fn forget_texts_of(&mut self, client: &Addr) {
        self.texts
            .retain(|_, op| op.client.identity != client.identity);
        self.text_ids
            .retain(|(identity, _), _| *identity != client.identity);
    }

    /// Text requests waiting for a worker's answer.
    pub fn active_text_requests(&self) -> usize {
        self.texts.len()
    }
}
