//! Frames on the control socket: `workers`, `drain`, `migrate`, `scale`.

use std::time::Instant;

use zinfer_protocol::{AdminReply, AdminRequest, ErrorCode, RouterToWorker, WorkerState, decode};

use super::{Addr, Core, Peer};

impl Core {
    /// A frame from an admin client on the control socket.
    pub fn handle_admin(&mut self, now: Instant, from: &Addr, frame: &[u8]) {
        let to = Peer::Admin(from.clone());
        let request = match decode::<AdminRequest>(frame, &self.config.limits) {
            Ok(request) => request,
            Err(err) => {
                let reply = AdminReply::Error {
                    code: ErrorCode::BadRequest,
                    message: err.to_string(),
                };
                self.send(to, &reply);
                return;
            }
        };
        let reply = match request {
            AdminRequest::Workers {} => AdminReply::Workers {
                workers: self.worker_infos(now),
            },
            AdminRequest::Drain { worker } => self.control(now, &worker, None),
            AdminRequest::Migrate { worker, device } => self.control(now, &worker, Some(device)),
            AdminRequest::Scale { model, workers } => AdminReply::Ack {
                ok: false,
                message: format!(
                    "the router does not start processes: to run {workers} worker(s) for \
                     {model:?}, start or stop `zinfer worker --model {model}` processes \
                     (or scale their Deployment); they register with the router on their own"
                ),
            },
        };
        self.send(to, &reply);
    }

    /// Rejects a control message whose envelope is wrong.
    pub fn reject_admin_envelope(&mut self, from: &Addr, detail: &str) {
        let reply = AdminReply::Error {
            code: ErrorCode::BadRequest,
            message: format!("{detail}; send one MessagePack frame per message"),
        };
        self.send(Peer::Admin(from.clone()), &reply);
    }

    /// Drains (`device` None) or migrates a worker named by its id.
    fn control(&mut self, now: Instant, worker_id: &str, device: Option<String>) -> AdminReply {
        let Some(identity) = self
            .order
            .iter()
            .find(|identity| {
                self.workers
                    .get(*identity)
                    .is_some_and(|w| w.is_live() && w.id == worker_id)
            })
            .cloned()
        else {
            let known: Vec<String> = self.worker_infos(now).into_iter().map(|w| w.id).collect();
            return AdminReply::Ack {
                ok: false,
                message: format!("no live worker {worker_id:?}; known workers: {known:?}"),
            };
        };
        let Some(worker) = self.workers.get_mut(&identity) else {
            return AdminReply::Ack {
                ok: false,
                message: "worker vanished".into(),
            };
        };
        let addr = worker.addr.clone();
        let (message, reply) = match device {
            None => {
                worker.state = WorkerState::Draining;
                (
                    RouterToWorker::Drain {},
                    format!("worker {worker_id:?} is draining: no new requests go to it"),
                )
            }
            Some(device) => {
                if worker.state == WorkerState::Ready {
                    worker.state = WorkerState::Migrating;
                }
                let reply = format!("asked worker {worker_id:?} to migrate to {device:?}");
                (RouterToWorker::Migrate { device }, reply)
            }
        };
        self.send(Peer::Worker(addr), &message);
        self.refresh_gauges();
        self.fail_orphans(now);
        AdminReply::Ack {
            ok: true,
            message: reply,
        }
    }
}
