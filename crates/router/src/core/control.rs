//! The control plane: supervisors, scaling, drains and live migration.
//!
//! The router decides and the supervisors act: `scale` becomes `spawn`s
//! (and drains for scale-in), `migrate` a `spawn` of a replacement that
//! takes the old worker's cache before routing switches. All of it is
//! driven by the same events as the rest of the core (frames, `tick`), so
//! the tests run it on a virtual clock.
//!
//! Invariants: at most one scale operation per model is in flight, and
//! every waiter on it gets the one outcome; a failed spawn is reported at
//! once and the model is not spawned again before its backoff ends;
//! scale-in drains, it never kills.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use zinfer_protocol::{
    AdminReply, ModelOffer, RouterToSupervisor, RouterToWorker, SupervisorToRouter, WorkerState,
};

use super::{Addr, Core, Peer, seconds};

/// Why no supervisor could be asked for a worker of a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum SpawnError {
    /// No supervisor is connected at all.
    #[error(
        "no supervisor is connected to start workers of {model:?}: run `zinfer serve`, \
         or `zinfer supervisor --model PATH` on a worker host"
    )]
    NoSupervisor {
        /// The model asked for.
        model: String,
    },
    /// Supervisors are connected, and none offers the model.
    #[error("no supervisor offers model {model:?} ({offered}); start one with --model for it")]
    NotOffered {
        /// The model asked for.
        model: String,
        /// What each supervisor offers, for the message.
        offered: String,
    },
}

/// A connected supervisor, as its last `supervisor_status` described it.
pub(super) struct Supervisor {
    addr: Addr,
    pub(super) id: String,
    pub(super) models: Vec<ModelOffer>,
    /// Its budget less what its workers hold or reserved, as it last said,
    /// less what spawns sent since will reserve.
    pub(super) memory_free: u64,
    pub(super) memory_budget: u64,
    /// Ids of the workers it runs.
    pub(super) workers: Vec<String>,
    last_seen: Instant,
}

impl Supervisor {
    /// Memory one worker of `model` needs here, as its offer says (0 for a
    /// model it does not offer).
    pub(super) fn worker_bytes(&self, model: &str) -> u64 {
        self.models
            .iter()
            .find(|m| m.name == model)
            .map_or(0, |m| m.worker_bytes)
    }
}

/// A worker the router asked a supervisor to start, until it registers.
pub(super) struct Spawn {
    pub(super) model: String,
    supervisor: Vec<u8>,
    started: Instant,
}

/// One `scale` operation of a model and everyone waiting on it.
struct ScaleOp {
    target: u32,
    device: Option<String>,
    waiters: Vec<Addr>,
    /// Workers started for it, for the reply.
    started: Vec<String>,
}

/// A replacement worker loading, then taking its predecessor's cache.
struct Migration {
    /// Identity of the worker being replaced.
    old: Vec<u8>,
    old_id: String,
    device: String,
    carry_tokens: u64,
    waiter: Option<Addr>,
    started: Instant,
    /// When the replacement registered and the cache transfer began.
    carrying_since: Option<Instant>,
    reload: bool,
}

/// Spawns of a model failed: none before `until`.
struct Backoff {
    failures: u32,
    until: Instant,
    reason: String,
    at: Instant,
}

/// A worker draining, for its duration metric and what follows the drain.
struct Drain {
    started: Instant,
    park: bool,
}

/// Control-plane state inside [`Core`].
#[derive(Default)]
pub(super) struct ControlPlane {
    pub(super) supervisors: HashMap<Vec<u8>, Supervisor>,
    /// Wanted worker counts of the models `scale`, the autoscaler or a
    /// cold start set; kept up when workers die.
    pub(super) targets: HashMap<String, u32>,
    scales: HashMap<String, ScaleOp>,
    /// By the worker id the spawn was for.
    pub(super) spawns: HashMap<String, Spawn>,
    /// By the replacement's worker id.
    migrations: HashMap<String, Migration>,
    backoff: HashMap<String, Backoff>,
    drains: HashMap<Vec<u8>, Drain>,
    next_spawn: u64,
    pub(super) autoscaler: super::autoscale::Autoscaler,
}

impl ControlPlane {
    /// The earliest instant a control timer fires, if any; a backoff
    /// ending after `now` is one (a replacement waits for it).
    pub(super) fn next_timer(&self, config: &crate::RouterConfig, now: Instant) -> Option<Instant> {
        let spawns = self
            .spawns
            .values()
            .map(|s| s.started + config.spawn_timeout);
        let carries = self
            .migrations
            .values()
            .filter_map(|m| m.carrying_since.map(|at| at + config.carry_timeout));
        let supervisors = self
            .supervisors
            .values()
            .map(|s| s.last_seen + config.heartbeat_expiry);
        let backoffs = self
            .backoff
            .values()
            .map(|b| b.until)
            .filter(|&until| until > now);
        spawns
            .chain(carries)
            .chain(supervisors)
            .chain(backoffs)
            .min()
            .map(|at| at + Duration::from_millis(1))
    }

    /// Spawns of `model` in flight for scaling (migration targets apart).
    pub(super) fn scale_spawns(&self, model: &str) -> usize {
        self.spawns
            .iter()
            .filter(|(id, s)| s.model == model && !self.is_migration_target(id))
            .count()
    }

    /// Models with spawns in flight for scaling, each once.
    pub(super) fn spawning_models(&self) -> Vec<String> {
        let mut models: Vec<String> = self
            .spawns
            .iter()
            .filter(|(id, _)| !self.is_migration_target(id))
            .map(|(_, s)| s.model.clone())
            .collect();
        models.sort();
        models.dedup();
        models
    }

    /// Whether `worker_id` was spawned as a migration target.
    pub(super) fn is_migration_target(&self, worker_id: &str) -> bool {
        self.migrations.contains_key(worker_id)
    }
}

impl Core {
    /// A frame from a supervisor on the control socket.
    pub(super) fn handle_supervisor(
        &mut self,
        now: Instant,
        from: &Addr,
        message: SupervisorToRouter,
    ) {
        match message {
            SupervisorToRouter::SupervisorStatus {
                supervisor_id,
                models,
                memory_budget_bytes,
                memory_used_bytes,
                workers,
                ..
            } => {
                let fresh = !self.control.supervisors.contains_key(&from.identity);
                if fresh {
                    tracing::info!(supervisor = %supervisor_id, models = ?models.iter().map(|m| &m.name).collect::<Vec<_>>(), "supervisor connected");
                }
                self.control.supervisors.insert(
                    from.identity.clone(),
                    Supervisor {
                        addr: from.clone(),
                        id: supervisor_id,
                        models,
                        memory_free: memory_budget_bytes.saturating_sub(memory_used_bytes),
                        memory_budget: memory_budget_bytes,
                        workers,
                        last_seen: now,
                    },
                );
                self.metrics
                    .supervisors
                    .set(self.control.supervisors.len() as i64);
                self.wake_by(now + self.config.heartbeat_expiry + Duration::from_millis(1));
                if fresh {
                    let models: Vec<String> = self.control.targets.keys().cloned().collect();
                    for model in models {
                        self.reconcile(now, &model);
                    }
                }
                self.retry_cold_starts(now);
            }
            SupervisorToRouter::SpawnFailed { worker_id, reason } => {
                self.spawn_failed(now, &worker_id, &reason);
            }
            SupervisorToRouter::WorkerExited { worker_id, status } => {
                if self.control.spawns.contains_key(&worker_id) {
                    let reason = format!("the worker process exited before registering ({status})");
                    self.spawn_failed(now, &worker_id, &reason);
                    return;
                }
                let Some(identity) = self.identity_of(&worker_id) else {
                    return;
                };
                let stopping = self
                    .workers
                    .get(&identity)
                    .is_some_and(|w| w.state == WorkerState::Stopping);
                if stopping {
                    self.forget_worker(&identity);
                } else {
                    let reason = format!("its process exited ({status})");
                    self.lose_worker(now, &identity, &reason);
                }
                self.refresh_gauges();
            }
        }
    }

    /// `scale`: `waiter` (none for the autoscaler) gets the outcome. An
    /// operator's `scale` pins the model: it is no longer unloaded when idle.
    pub(super) fn scale(
        &mut self,
        now: Instant,
        waiter: Option<Addr>,
        model: &str,
        target: u32,
        device: Option<String>,
    ) {
        if waiter.is_some() {
            self.on_demand.pin(model);
        }
        if let Some(refusal) = self.backoff_refusal(now, model) {
            if let Some(waiter) = waiter {
                self.ack(&waiter, false, refusal);
            }
            return;
        }
        let op = self
            .control
            .scales
            .entry(model.to_string())
            .or_insert_with(|| ScaleOp {
                target,
                device: None,
                waiters: Vec::new(),
                started: Vec::new(),
            });
        if op.target != target {
            tracing::info!(model, from = op.target, to = target, "scale target changed");
        }
        op.target = target;
        if device.is_some() {
            op.device = device;
        }
        op.waiters.extend(waiter);
        self.control.targets.insert(model.to_string(), target);
        self.reconcile(now, model);
    }

    /// Why spawning `model` is refused now, when a backoff holds.
    pub(super) fn backoff_refusal(&self, now: Instant, model: &str) -> Option<String> {
        let backoff = self.control.backoff.get(model)?;
        (backoff.until > now).then(|| {
            format!(
                "spawning a worker of {model:?} failed {:.0} s ago ({}); the next try is \
                 allowed in {:.0} s",
                seconds(backoff.at, now),
                backoff.reason,
                seconds(now, backoff.until).ceil()
            )
        })
    }

    /// Routable workers of `model` that are not draining, by identity.
    fn serving(&self, model: &str) -> Vec<Vec<u8>> {
        self.order
            .iter()
            .filter(|identity| {
                self.workers
                    .get(*identity)
                    .is_some_and(|w| w.routable() && w.serves(model))
                    && !self.control.drains.contains_key(*identity)
            })
            .cloned()
            .collect()
    }

    /// Starts or drains workers of `model` towards its target, then
    /// answers the scale operation if the target is met.
    pub(super) fn reconcile(&mut self, now: Instant, model: &str) {
        let Some(&target) = self.control.targets.get(model) else {
            return;
        };
        let serving = self.serving(model);
        let spawning = self.control.scale_spawns(model);
        let have = serving.len() + spawning;
        let target_n = target as usize;
        if have < target_n {
            if self.backoff_refusal(now, model).is_some() {
                return;
            }
            let device = self
                .control
                .scales
                .get(model)
                .and_then(|op| op.device.clone());
            for _ in have..target_n {
                match self.request_spawn(now, model, None, device.clone(), None) {
                    Ok(worker_id) => {
                        if let Some(op) = self.control.scales.get_mut(model) {
                            op.started.push(worker_id);
                        }
                    }
                    Err(error) => {
                        let reason = error.to_string();
                        if !self.control.scales.contains_key(model) {
                            self.back_off(now, model, &reason);
                        }
                        self.fail_scale(now, model, &reason);
                        return;
                    }
                }
            }
        } else if serving.len() > target_n && spawning == 0 {
            let mut surplus: Vec<(usize, Vec<u8>)> = serving
                .into_iter()
                .filter_map(|identity| {
                    let load = self.workers.get(&identity)?.inflight.len();
                    Some((load, identity))
                })
                .collect();
            surplus.sort();
            let excess = surplus.len() - target_n;
            for (_, identity) in surplus.into_iter().take(excess) {
                self.begin_drain(now, &identity, false);
            }
        }
        self.settle_scale(model);
    }

    /// Answers `model`'s scale operation once its target is met.
    fn settle_scale(&mut self, model: &str) {
        let serving = self.serving(model).len();
        let spawning = self.control.scale_spawns(model) > 0;
        let Some(op) = self.control.scales.get(model) else {
            return;
        };
        if spawning || serving != op.target as usize {
            return;
        }
        let Some(op) = self.control.scales.remove(model) else {
            return;
        };
        let message = if op.started.is_empty() {
            format!("{model}: {} worker(s) serving", op.target)
        } else {
            format!(
                "{model}: {} worker(s) serving; started {}",
                op.target,
                op.started.join(", ")
            )
        };
        for waiter in op.waiters {
            self.ack(&waiter, true, message.clone());
        }
    }

    /// Ends `model`'s scale operation with an error for every waiter, and
    /// stops aiming at its target (no retry loop: the next `scale` tries
    /// again). With no operation under way the spawn was a replacement for
    /// a worker that died: the target stays, and the next try waits for
    /// the model's backoff, so a worker killed while it loads (or a host
    /// briefly out of memory) does not shrink the fleet for good.
    fn fail_scale(&mut self, now: Instant, model: &str, reason: &str) {
        let Some(op) = self.control.scales.remove(model) else {
            tracing::warn!(
                model,
                reason,
                "replacing a worker failed; retrying after the backoff"
            );
            return;
        };
        let serving = self.serving(model).len() as u32;
        self.control.targets.insert(model.to_string(), serving);
        tracing::warn!(model, target = op.target, reason, "scale failed");
        let message = format!(
            "scaling {model} to {} worker(s) failed: {reason}; {serving} worker(s) serving",
            op.target
        );
        for waiter in op.waiters {
            self.ack(&waiter, false, message.clone());
        }
        self.wake_by(now);
    }

    /// Asks the best supervisor for a worker of `model`; its id, or why not.
    /// `import` is `Some` for a migration target, holding the exporter's
    /// CURVE key when the router knows it.
    pub(super) fn request_spawn(
        &mut self,
        now: Instant,
        model: &str,
        model_path: Option<String>,
        device: Option<String>,
        import: Option<Option<String>>,
    ) -> Result<String, SpawnError> {
        let Some(supervisor) = self
            .control
            .supervisors
            .values()
            .filter(|s| s.models.iter().any(|m| m.name == model))
            .max_by_key(|s| s.memory_free)
        else {
            let offered: Vec<String> = self
                .control
                .supervisors
                .values()
                .map(|s| {
                    let models: Vec<&str> = s.models.iter().map(|m| m.name.as_str()).collect();
                    format!("{} offers {models:?}", s.id)
                })
                .collect();
            return Err(if offered.is_empty() {
                SpawnError::NoSupervisor {
                    model: model.to_string(),
                }
            } else {
                SpawnError::NotOffered {
                    model: model.to_string(),
                    offered: offered.join("; "),
                }
            });
        };
        self.control.next_spawn += 1;
        let worker_id = format!(
            "{model}-{:08x}-{}",
            self.config.spawn_nonce, self.control.next_spawn
        );
        let to = Peer::Admin(supervisor.addr.clone());
        let supervisor = supervisor.addr.identity.clone();
        // Its memory and the worker are the supervisor's from now on, as its
        // next status will say.
        if let Some(s) = self.control.supervisors.get_mut(&supervisor) {
            s.memory_free = s.memory_free.saturating_sub(s.worker_bytes(model));
            s.workers.push(worker_id.clone());
        }
        let import_cache = import.is_some();
        tracing::info!(model, worker = %worker_id, ?device, import_cache, "spawning a worker");
        self.send(
            to,
            &RouterToSupervisor::Spawn {
                worker_id: worker_id.clone(),
                model: model.to_string(),
                model_path,
                device,
                import_cache,
                exporter_key: import.flatten(),
            },
        );
        self.metrics.spawns.inc();
        self.control.spawns.insert(
            worker_id.clone(),
            Spawn {
                model: model.to_string(),
                supervisor,
                started: now,
            },
        );
        self.wake_by(now + self.config.spawn_timeout + Duration::from_millis(1));
        Ok(worker_id)
    }

    /// A spawn produced no worker: report it to whoever waits, back off.
    fn spawn_failed(&mut self, now: Instant, worker_id: &str, reason: &str) {
        let Some(spawn) = self.control.spawns.remove(worker_id) else {
            return;
        };
        self.metrics.spawn_failures.inc();
        tracing::warn!(model = %spawn.model, worker = worker_id, reason, "spawn failed");
        if let Some(migration) = self.control.migrations.remove(worker_id) {
            // One operator request, answered at once: no backoff for the
            // model, whose other spawns may well work (a bad target device
            // says nothing about them).
            let what = if migration.reload {
                "reload"
            } else {
                "migration"
            };
            let message = format!(
                "{what} of {} to {} failed: {reason}; {} keeps serving",
                migration.old_id, migration.device, migration.old_id
            );
            self.abort_migration(migration, &message);
            return;
        }
        self.back_off(now, &spawn.model, reason);
        self.cold_start_failed(now, &spawn.model, reason);
        self.fail_scale(now, &spawn.model, reason);
        // Requests held for this spawn fail unless another worker can take them.
        self.fail_orphans(now);
    }

    /// Pauses spawns of `model` after a failure: 1 s, doubling per failure
    /// in a row up to `spawn_backoff_max`.
    fn back_off(&mut self, now: Instant, model: &str, reason: &str) {
        let backoff = self
            .control
            .backoff
            .entry(model.to_string())
            .or_insert(Backoff {
                failures: 0,
                until: now,
                reason: String::new(),
                at: now,
            });
        backoff.failures += 1;
        let pause = Duration::from_secs(1 << backoff.failures.min(6).saturating_sub(1))
            .min(self.config.spawn_backoff_max);
        backoff.until = now + pause;
        backoff.reason = reason.to_string();
        backoff.at = now;
        tracing::debug!(model, ?pause, "spawns of the model paused");
    }

    /// Undoes a migration that did not finish: the old worker serves on.
    fn abort_migration(&mut self, migration: Migration, message: &str) {
        self.metrics.migrations.with_label_values(&["failed"]).inc();
        if let Some(old) = self.workers.get_mut(&migration.old)
            && old.state == WorkerState::Migrating
        {
            old.state = WorkerState::Ready;
        }
        tracing::warn!(worker = %migration.old_id, message, "migration failed");
        if let Some(waiter) = migration.waiter {
            self.ack(&waiter, false, message.to_string());
        }
        self.refresh_gauges();
    }

    /// Called by `register` for every accepted `ready`: settles the spawn
    /// it answers and starts a migration target's cache transfer.
    pub(super) fn on_registered(
        &mut self,
        now: Instant,
        identity: &[u8],
        import_endpoint: Option<String>,
        import_key: Option<String>,
    ) {
        let Some(worker) = self.workers.get(identity) else {
            return;
        };
        let worker_id = worker.id.clone();
        let spawn = self.control.spawns.remove(&worker_id);
        if let Some(spawn) = &spawn {
            self.control.backoff.remove(&spawn.model);
        }
        let carry = self
            .control
            .migrations
            .get(&worker_id)
            .map(|m| (m.old.clone(), m.carry_tokens));
        match carry {
            Some((old, carry_tokens)) => {
                let old_addr = self
                    .workers
                    .get(&old)
                    .filter(|w| w.is_live())
                    .map(|w| w.addr.clone());
                match (old_addr, import_endpoint) {
                    (Some(old_addr), Some(endpoint)) if carry_tokens > 0 => {
                        if let Some(m) = self.control.migrations.get_mut(&worker_id) {
                            m.carrying_since = Some(now);
                        }
                        self.wake_by(now + self.config.carry_timeout + Duration::from_millis(1));
                        self.send(
                            Peer::Worker(old_addr),
                            &RouterToWorker::ExportCache {
                                endpoint,
                                max_tokens: carry_tokens,
                                key: import_key,
                            },
                        );
                    }
                    _ => self.switch(now, &worker_id, None),
                }
            }
            None => {
                if let Some(spawn) = spawn {
                    self.cold_start_done(now, &spawn.model);
                    self.reconcile(now, &spawn.model);
                }
            }
        }
    }

    /// A migration target reports the cache it took: switch routing.
    pub(super) fn cache_imported(
        &mut self,
        now: Instant,
        identity: &[u8],
        tokens: u64,
        seconds_taken: f64,
    ) {
        let Some(worker_id) = self.workers.get(identity).map(|w| w.id.clone()) else {
            return;
        };
        if self.control.migrations.contains_key(&worker_id) {
            self.switch(now, &worker_id, Some((tokens, seconds_taken)));
        }
    }

    /// The old worker could not export: switch without its cache.
    pub(super) fn export_failed(&mut self, now: Instant, identity: &[u8], message: &str) {
        let target = self
            .control
            .migrations
            .iter()
            .find(|(_, m)| m.old == identity && m.carrying_since.is_some())
            .map(|(id, _)| id.clone());
        if let Some(target) = target {
            tracing::warn!(message, "cache export failed; switching without the cache");
            self.switch(now, &target, None);
        }
    }

    /// Routes to the replacement `new_id` instead of its predecessor, in
    /// one step, and drains the predecessor.
    fn switch(&mut self, now: Instant, new_id: &str, carried: Option<(u64, f64)>) {
        let Some(migration) = self.control.migrations.remove(new_id) else {
            return;
        };
        let Some(new_identity) = self.identity_of(new_id) else {
            self.abort_migration(
                migration,
                "the replacement worker vanished before the switch",
            );
            return;
        };
        let index = self.workers.get(&migration.old).map(|w| w.index.clone());
        if let Some(new) = self.workers.get_mut(&new_identity) {
            new.state = WorkerState::Ready;
            if let Some(index) = index {
                new.index = index;
            }
        }
        if self
            .workers
            .get(&migration.old)
            .is_some_and(|w| w.is_live())
        {
            self.begin_drain(now, &migration.old, false);
        }
        let took = seconds(migration.started, now);
        self.metrics.migrations.with_label_values(&["ok"]).inc();
        self.metrics.migration_time.observe(took);
        let carried_text = match carried {
            Some((tokens, secs)) => {
                self.metrics.migration_kv_tokens.inc_by(tokens);
                format!("carried {tokens} cached tokens in {secs:.2} s")
            }
            None if migration.carry_tokens == 0 => "carried no cache (as asked)".to_string(),
            None => "carried no cache".to_string(),
        };
        let what = if migration.reload {
            "reloaded"
        } else {
            "migrated"
        };
        let message = format!(
            "{what} {} to {new_id} on {} in {took:.2} s; {carried_text}; {} drains and stops",
            migration.old_id, migration.device, migration.old_id
        );
        tracing::info!(message, "migration done");
        if let Some(waiter) = migration.waiter {
            self.ack(&waiter, true, message);
        }
        self.refresh_gauges();
        self.drain_queue(now);
    }

    /// `migrate` (`model_path` None) or `reload`.
    pub(super) fn migrate(
        &mut self,
        now: Instant,
        waiter: Addr,
        worker_id: &str,
        device: Option<String>,
        carry_tokens: Option<u64>,
        model_path: Option<String>,
    ) {
        let reload = device.is_none();
        let Some(identity) = self.identity_of(worker_id) else {
            let message = self.unknown_worker(now, worker_id);
            self.ack(&waiter, false, message);
            return;
        };
        let Some(worker) = self.workers.get(&identity) else {
            return;
        };
        if worker.state != WorkerState::Ready {
            let message = format!(
                "worker {worker_id:?} is {}; only a ready worker can be migrated or reloaded",
                worker.state.as_str()
            );
            self.ack(&waiter, false, message);
            return;
        }
        let Some(model) = worker.models.first().cloned() else {
            return;
        };
        let device = device.unwrap_or_else(|| worker.device.clone());
        let carry_tokens = if reload {
            0
        } else {
            carry_tokens.unwrap_or(self.config.carry_tokens)
        };
        // With CURVE the replacement admits only this worker's key.
        let import = (carry_tokens > 0).then(|| worker.curve_key.clone());
        match self.request_spawn(now, &model, model_path, Some(device.clone()), import) {
            Ok(new_id) => {
                if let Some(worker) = self.workers.get_mut(&identity) {
                    worker.state = WorkerState::Migrating;
                }
                self.control.migrations.insert(
                    new_id,
                    Migration {
                        old: identity,
                        old_id: worker_id.to_string(),
                        device,
                        carry_tokens,
                        waiter: Some(waiter),
                        started: now,
                        carrying_since: None,
                        reload,
                    },
                );
                self.refresh_gauges();
            }
            Err(error) => {
                self.metrics.migrations.with_label_values(&["failed"]).inc();
                self.ack(&waiter, false, error.to_string());
            }
        }
    }

    /// `drain`: no new requests; when its last one ends, stop or park it.
    pub(super) fn drain(&mut self, now: Instant, waiter: &Addr, worker_id: &str, park: bool) {
        let Some(identity) = self.identity_of(worker_id) else {
            let message = self.unknown_worker(now, worker_id);
            self.ack(waiter, false, message);
            return;
        };
        let state = self.workers.get(&identity).map(|w| w.state);
        if matches!(state, Some(WorkerState::Warming | WorkerState::Stopping)) {
            let message = format!(
                "worker {worker_id:?} is {}; it cannot be drained now",
                state.map_or("gone", WorkerState::as_str)
            );
            self.ack(waiter, false, message);
            return;
        }
        self.begin_drain(now, &identity, park);
        let after = if park { "park" } else { "stop" };
        let message = format!(
            "worker {worker_id:?} is draining: no new requests go to it; it will {after} \
             when its last request ends"
        );
        self.ack(waiter, true, message);
        // A drained worker is not replaced: the count it leaves is the target.
        let models = self
            .workers
            .get(&identity)
            .map(|w| w.models.clone())
            .unwrap_or_default();
        for model in models {
            let serving = self.serving(&model).len() as u32;
            if let Some(target) = self.control.targets.get_mut(&model) {
                *target = (*target).min(serving);
            }
        }
    }

    /// `resume`: a draining or parked worker takes requests again.
    pub(super) fn resume(&mut self, now: Instant, waiter: &Addr, worker_id: &str) {
        let Some(identity) = self.identity_of(worker_id) else {
            let message = self.unknown_worker(now, worker_id);
            self.ack(waiter, false, message);
            return;
        };
        let Some(worker) = self.workers.get_mut(&identity) else {
            return;
        };
        if !matches!(worker.state, WorkerState::Draining | WorkerState::Parked) {
            let message = format!(
                "worker {worker_id:?} is {}, not draining or parked",
                worker.state.as_str()
            );
            self.ack(waiter, false, message);
            return;
        }
        worker.state = WorkerState::Ready;
        let addr = worker.addr.clone();
        self.control.drains.remove(&identity);
        self.send(Peer::Worker(addr), &RouterToWorker::Resume {});
        self.ack(
            waiter,
            true,
            format!("worker {worker_id:?} takes requests again"),
        );
        self.refresh_gauges();
        self.drain_queue(now);
    }

    /// Stops routing to a worker and tells it so.
    pub(super) fn begin_drain(&mut self, now: Instant, identity: &[u8], park: bool) {
        let Some(worker) = self.workers.get_mut(identity) else {
            return;
        };
        if worker.state == WorkerState::Lost {
            return;
        }
        worker.state = WorkerState::Draining;
        let addr = worker.addr.clone();
        tracing::info!(worker = %worker.id, park, "draining");
        self.control
            .drains
            .entry(identity.to_vec())
            .or_insert(Drain { started: now, park })
            .park = park;
        self.send(Peer::Worker(addr), &RouterToWorker::Drain {});
        self.refresh_gauges();
        self.settle_drains(now);
        self.fail_orphans(now);
    }

    /// Finishes drains whose worker has nothing in flight: park it, or
    /// tell it (and its supervisor) to exit.
    pub(super) fn settle_drains(&mut self, now: Instant) {
        // Called after every terminal reply: nothing to do is the common case.
        if self.control.drains.is_empty() {
            return;
        }
        let done: Vec<Vec<u8>> = self
            .control
            .drains
            .keys()
            .filter(|identity| {
                self.workers
                    .get(*identity)
                    .is_none_or(|w| w.inflight.is_empty() || !w.is_live())
            })
            .cloned()
            .collect();
        let settled = !done.is_empty();
        for identity in done {
            let Some(drain) = self.control.drains.remove(&identity) else {
                continue;
            };
            self.metrics.drain_time.observe(seconds(drain.started, now));
            let Some(worker) = self.workers.get_mut(&identity) else {
                continue;
            };
            if !worker.is_live() {
                continue;
            }
            let (id, addr) = (worker.id.clone(), worker.addr.clone());
            if drain.park {
                worker.state = WorkerState::Parked;
                tracing::info!(worker = %id, "drained; parked");
                continue;
            }
            worker.state = WorkerState::Stopping;
            tracing::info!(worker = %id, "drained; stopping");
            let grace = Duration::from_secs(5);
            let grace_ms = grace.as_millis() as u64;
            self.send(Peer::Worker(addr), &RouterToWorker::Shutdown { grace_ms });
            let supervisor = self
                .control
                .supervisors
                .values()
                .find(|s| s.workers.contains(&id))
                .map(|s| s.addr.clone());
            if let Some(supervisor) = supervisor {
                self.send(
                    Peer::Admin(supervisor),
                    &RouterToSupervisor::Stop {
                        worker_id: id,
                        grace_ms: 2 * grace_ms,
                    },
                );
            }
        }
        if settled {
            self.refresh_gauges();
        }
    }

    /// Control timers: spawn timeouts, carry timeouts, silent supervisors,
    /// and the autoscaler.
    pub(super) fn control_tick(&mut self, now: Instant) {
        let timeout = self.config.spawn_timeout;
        let late: Vec<String> = self
            .control
            .spawns
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.started) > timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for worker_id in late {
            let supervisor = self
                .control
                .spawns
                .get(&worker_id)
                .and_then(|s| self.control.supervisors.get(&s.supervisor))
                .map(|s| s.addr.clone());
            if let Some(supervisor) = supervisor {
                self.send(
                    Peer::Admin(supervisor),
                    &RouterToSupervisor::Stop {
                        worker_id: worker_id.clone(),
                        grace_ms: 0,
                    },
                );
            }
            let reason = format!(
                "the worker did not register within {} s (raise --spawn-timeout for slow loads)",
                timeout.as_secs()
            );
            self.spawn_failed(now, &worker_id, &reason);
        }
        let carry_timeout = self.config.carry_timeout;
        let slow: Vec<String> = self
            .control
            .migrations
            .iter()
            .filter(|(_, m)| {
                m.carrying_since
                    .is_some_and(|at| now.saturating_duration_since(at) > carry_timeout)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for new_id in slow {
            tracing::warn!(worker = %new_id, "cache transfer timed out; switching without it");
            self.switch(now, &new_id, None);
        }
        let expiry = self.config.heartbeat_expiry;
        let silent: Vec<Vec<u8>> = self
            .control
            .supervisors
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.last_seen) > expiry)
            .map(|(identity, _)| identity.clone())
            .collect();
        for identity in silent {
            if let Some(supervisor) = self.control.supervisors.remove(&identity) {
                tracing::warn!(supervisor = %supervisor.id, "supervisor lost");
            }
            let orphans: Vec<String> = self
                .control
                .spawns
                .iter()
                .filter(|(_, s)| s.supervisor == identity)
                .map(|(id, _)| id.clone())
                .collect();
            for worker_id in orphans {
                self.spawn_failed(now, &worker_id, "its supervisor stopped answering");
            }
            // Cold starts waiting for its memory look elsewhere, or fail.
            self.retry_cold_starts(now);
        }
        self.metrics
            .supervisors
            .set(self.control.supervisors.len() as i64);
        self.unload_idle(now);
        self.autoscale(now);
        let models: Vec<String> = self.control.targets.keys().cloned().collect();
        for model in models {
            self.reconcile(now, &model);
        }
    }

    /// Feeds the autoscaler each offered model's load; acts on its decisions.
    fn autoscale(&mut self, now: Instant) {
        let Some(config) = self.config.autoscale.clone() else {
            return;
        };
        let mut models: Vec<String> = self
            .control
            .supervisors
            .values()
            .flat_map(|s| s.models.iter().map(|m| m.name.clone()))
            .collect();
        models.sort();
        models.dedup();
        for model in models {
            if self.control.scales.contains_key(&model) {
                continue;
            }
            let serving = self.serving(&model);
            let waiting: u64 = self
                .queue
                .iter()
                .filter_map(|(_, rid)| self.requests.get(rid))
                .filter(|r| r.request.model.as_deref() == Some(model.as_str()))
                .count() as u64
                + serving
                    .iter()
                    .filter_map(|i| self.workers.get(i))
                    .map(|w| u64::from(w.load_report().waiting))
                    .sum::<u64>();
            let idle_worker = serving
                .iter()
                .filter_map(|i| self.workers.get(i))
                .any(|w| w.inflight.is_empty());
            let sample = super::autoscale::Sample {
                workers: serving.len() as u32,
                waiting,
                idle_worker,
            };
            if let Some(target) = self
                .control
                .autoscaler
                .observe(&config, now, &model, sample)
            {
                let direction = if target > sample.workers {
                    "up"
                } else {
                    "down"
                };
                self.metrics.autoscale.with_label_values(&[direction]).inc();
                tracing::info!(model, from = sample.workers, to = target, "autoscaling");
                self.scale(now, None, &model, target, None);
            }
        }
    }

    /// Removes a worker that exited as asked, without calling it lost.
    pub(super) fn forget_worker(&mut self, identity: &[u8]) {
        if let Some(worker) = self.workers.remove(identity) {
            tracing::info!(worker = %worker.id, "worker stopped");
            self.metrics.inflight.sub(worker.inflight.len() as i64);
        }
        self.order.retain(|known| known != identity);
        self.control.drains.remove(identity);
    }

    /// The identity of the live worker named `worker_id`.
    pub(super) fn identity_of(&self, worker_id: &str) -> Option<Vec<u8>> {
        self.order
            .iter()
            .find(|identity| {
                self.workers
                    .get(*identity)
                    .is_some_and(|w| w.is_live() && w.id == worker_id)
            })
            .cloned()
    }

    fn unknown_worker(&self, now: Instant, worker_id: &str) -> String {
        let known: Vec<String> = self.worker_infos(now).into_iter().map(|w| w.id).collect();
        format!("no live worker {worker_id:?}; known workers: {known:?}")
    }

    pub(super) fn ack(&mut self, to: &Addr, ok: bool, message: String) {
        self.send(Peer::Admin(to.clone()), &AdminReply::Ack { ok, message });
    }

    /// Whether the control plane has a timer or a waiter (for tests).
    #[cfg(test)]
    pub(super) fn control_idle(&self) -> bool {
        self.control.scales.is_empty()
            && self.control.spawns.is_empty()
            && self.control.migrations.is_empty()
    }
}
