//! Frames on the control socket: admin requests (`workers`, `drain`,
//! `resume`, `migrate`, `reload`, `scale`) and supervisors' messages.

use std::time::Instant;

use zinfer_protocol::{
    AdminReply, AdminRequest, DecodeError, ErrorCode, SupervisorToRouter, decode,
};

use super::{Addr, Core, Peer};

impl Core {
    /// A frame on the control socket, from an admin client or a supervisor.
    pub fn handle_admin(&mut self, now: Instant, from: &Addr, frame: &[u8]) {
        let to = Peer::Admin(from.clone());
        let request = match decode::<AdminRequest>(frame, &self.config.limits) {
            Ok(request) => request,
            Err(DecodeError::UnknownType { found, expected }) => {
                match decode::<SupervisorToRouter>(frame, &self.config.limits) {
                    Ok(message) => self.handle_supervisor(now, from, message),
                    Err(DecodeError::UnknownType { .. }) => {
                        let err = DecodeError::UnknownType { found, expected };
                        self.reply_admin_error(to, err.to_string());
                    }
                    Err(err) => self.reply_admin_error(to, err.to_string()),
                }
                return;
            }
            Err(err) => {
                self.reply_admin_error(to, err.to_string());
                return;
            }
        };
        match request {
            AdminRequest::Workers {} => {
                let reply = AdminReply::Workers {
                    workers: self.worker_infos(now),
                };
                self.send(to, &reply);
            }
            AdminRequest::Drain { worker, park } => self.drain(now, from, &worker, park),
            AdminRequest::Resume { worker } => self.resume(now, from, &worker),
            AdminRequest::Migrate {
                worker,
                device,
                carry_tokens,
            } => self.migrate(now, from.clone(), &worker, Some(device), carry_tokens, None),
            AdminRequest::Reload { worker, model_path } => {
                self.migrate(now, from.clone(), &worker, None, None, model_path)
            }
            AdminRequest::Scale {
                model,
                workers,
                device,
            } => self.scale(now, Some(from.clone()), &model, workers, device),
        }
    }

    fn reply_admin_error(&mut self, to: Peer, message: String) {
        let reply = AdminReply::Error {
            code: ErrorCode::BadRequest,
            message,
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
}
