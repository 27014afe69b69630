//! Models loaded on demand, as Ollama and llama-server's router mode do.
//!
//! A request for a model that a supervisor offers and no worker serves
//! starts one (a cold start) and waits in the queue meanwhile, within its
//! deadline. However many first requests arrive, one worker starts: the
//! model is `loading` until it registers, and a failed load fails every
//! request waiting on it with the reason. A model loaded this way is
//! unloaded (its workers drained and stopped) once it has been idle for its
//! keep-alive. When the supervisor has no memory for a cold start, the
//! least recently used idle model loaded on demand is evicted first; if
//! evicting cannot make room, the request fails at once with `overloaded`
//! and what holds the memory.
//!
//! Models started by `scale` (or `serve`) are pinned: never unloaded for
//! idleness nor evicted. So is every model while the autoscaler keeps a
//! minimum of workers per offered model (`--autoscale-min` above 0).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use zinfer_protocol::{ErrorCode, KeepAlive, ModelState, WorkerState};

use super::{Core, seconds};

/// Every model the router loaded on demand and has not unloaded.
#[derive(Default)]
pub(super) struct OnDemand {
    models: HashMap<String, DemandModel>,
}

struct DemandModel {
    /// Loading: when its cold start began.
    loading: Option<Instant>,
    /// How long it stays loaded once idle, as its last request set it.
    keep_alive: KeepAlive,
    /// When a request for it last ended (or it finished loading).
    last_used: Instant,
}

impl OnDemand {
    /// Whether `model` is starting for a request.
    pub(super) fn is_loading(&self, model: &str) -> bool {
        self.models.get(model).is_some_and(|m| m.loading.is_some())
    }

    /// Whether the router loaded `model` on demand (it may unload it).
    pub(super) fn manages(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    /// `scale` took over `model`: it stays loaded as the operator says.
    pub(super) fn pin(&mut self, model: &str) {
        self.models.remove(model);
    }
}

/// Where a cold start stands after a placement try.
enum Placement {
    /// A supervisor was asked for the worker.
    Spawned,
    /// Memory is being freed (workers draining or exiting); try again on
    /// the next supervisor status.
    Waiting,
}

/// Freeing memory for a cold start on one supervisor.
struct MemoryPlan {
    /// Free memory if every idle model there were evicted.
    reach: u64,
    supervisor: Vec<u8>,
    /// The model's bytes there.
    need: u64,
    /// Free memory once the workers already leaving have gone.
    soon_free: u64,
    /// Idle models there and their bytes, least recently used first.
    evictable: Vec<(String, u64)>,
}

/// GiB with two decimals, for messages.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}

impl Core {
    /// Whether a connected supervisor offers `model`.
    pub(super) fn offered(&self, model: &str) -> bool {
        self.control
            .supervisors
            .values()
            .any(|s| s.models.iter().any(|m| m.name == model))
    }

    /// Names of every model a connected supervisor offers, sorted.
    pub(super) fn offered_models(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .control
            .supervisors
            .values()
            .flat_map(|s| s.models.iter().map(|m| m.name.clone()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// `model`'s state for the `models` list.
    pub(super) fn model_state(&self, model: &str) -> ModelState {
        let serving = self
            .workers
            .values()
            .any(|w| w.routable() && w.serves(model));
        if serving {
            ModelState::Loaded
        } else if self.on_demand.is_loading(model) || self.control.scale_spawns(model) > 0 {
            ModelState::Loading
        } else {
            ModelState::Unloaded
        }
    }

    /// The keep-alive `model` gets when no request says: its offer's, or
    /// the router's default.
    fn default_keep_alive(&self, model: &str) -> KeepAlive {
        self.control
            .supervisors
            .values()
            .flat_map(|s| s.models.iter())
            .find(|m| m.name == model)
            .and_then(|m| m.keep_alive)
            .unwrap_or(self.config.keep_alive)
    }

    /// A request for offered `model`, which nothing serves or starts:
    /// begins its cold start (once, however many requests ask). The
    /// request is queued already; on refusal every request waiting for
    /// the model fails with the reason.
    pub(super) fn cold_start(&mut self, now: Instant, model: &str) {
        if self.on_demand.is_loading(model) {
            return;
        }
        if let Some(refusal) = self.backoff_refusal(now, model) {
            self.fail_waiting(now, model, ErrorCode::Unavailable, &refusal);
            return;
        }
        let keep_alive = self.default_keep_alive(model);
        let entry = self
            .on_demand
            .models
            .entry(model.to_string())
            .or_insert(DemandModel {
                loading: None,
                keep_alive,
                last_used: now,
            });
        entry.loading = Some(now);
        tracing::info!(model, "loading on demand");
        self.place(now, model);
    }

    /// Starts `model`'s worker where it fits, evicts idle models to make it
    /// fit, or fails its requests saying what holds the memory.
    fn place(&mut self, now: Instant, model: &str) {
        match self.try_place(now, model) {
            Ok(Placement::Spawned | Placement::Waiting) => {}
            Err((code, message)) => {
                self.on_demand.models.remove(model);
                self.control.targets.remove(model);
                self.fail_waiting(now, model, code, &message);
            }
        }
    }

    fn try_place(&mut self, now: Instant, model: &str) -> Result<Placement, (ErrorCode, String)> {
        let fits = self.control.supervisors.values().any(|s| {
            s.models
                .iter()
                .any(|m| m.name == model && m.worker_bytes <= s.memory_free)
        });
        if fits {
            self.control.targets.insert(model.to_string(), 1);
            return match self.request_spawn(now, model, None, None, None) {
                Ok(_) => {
                    self.metrics.cold_starts.inc();
                    Ok(Placement::Spawned)
                }
                Err(error) => Err((ErrorCode::Unavailable, error.to_string())),
            };
        }
        // Short of memory everywhere: plan on the supervisor where freeing
        // memory gets closest to the need.
        let mut best: Option<MemoryPlan> = None;
        for (identity, supervisor) in &self.control.supervisors {
            if !supervisor.models.iter().any(|m| m.name == model) {
                continue;
            }
            let freeing: u64 = supervisor
                .workers
                .iter()
                .filter(|id| self.releasing(id))
                .filter_map(|id| self.model_of_worker(id))
                .map(|name| supervisor.worker_bytes(&name))
                .sum();
            let evictable: Vec<(String, u64)> = self
                .evictable_on(&supervisor.workers)
                .into_iter()
                .map(|name| {
                    let bytes = supervisor.worker_bytes(&name);
                    (name, bytes)
                })
                .collect();
            let evictable_bytes: u64 = evictable.iter().map(|(_, bytes)| bytes).sum();
            let reach = supervisor.memory_free + freeing + evictable_bytes;
            if best.as_ref().is_none_or(|b| reach > b.reach) {
                best = Some(MemoryPlan {
                    reach,
                    supervisor: identity.clone(),
                    need: supervisor.worker_bytes(model),
                    soon_free: supervisor.memory_free + freeing,
                    evictable,
                });
            }
        }
        let Some(MemoryPlan {
            reach,
            supervisor: identity,
            need,
            soon_free,
            evictable,
        }) = best
        else {
            return Err((
                ErrorCode::Unavailable,
                format!("no connected supervisor offers model {model:?} any more"),
            ));
        };
        if soon_free >= need {
            return Ok(Placement::Waiting);
        }
        if reach < need {
            return Err((
                ErrorCode::Overloaded,
                self.no_room_message(model, &identity),
            ));
        }
        let mut free = soon_free;
        for (victim, bytes) in evictable {
            if free >= need {
                break;
            }
            free += bytes;
            tracing::info!(model, evicted = %victim, "evicting an idle model for a cold start");
            self.unload(now, &victim, "evicted");
        }
        Ok(Placement::Waiting)
    }

    /// Whether worker `id` is on its way out: draining or stopping, or
    /// gone from the router while its supervisor still listed it.
    fn releasing(&self, id: &str) -> bool {
        let known = self.workers.values().find(|w| w.id == id);
        match known {
            Some(worker) => matches!(
                worker.state,
                WorkerState::Draining | WorkerState::Stopping | WorkerState::Lost
            ),
            None => !self.control.spawns.contains_key(id),
        }
    }

    fn model_of_worker(&self, id: &str) -> Option<String> {
        if let Some(worker) = self.workers.values().find(|w| w.id == id) {
            return worker.models.first().cloned();
        }
        self.control.spawns.get(id).map(|s| s.model.clone())
    }

    /// Whether the autoscaler keeps every offered model at a minimum of
    /// workers: then nothing is unloaded or evicted under it.
    fn autoscaler_floor(&self) -> bool {
        self.config
            .autoscale
            .as_ref()
            .is_some_and(|autoscale| autoscale.min_workers > 0)
    }

    /// Models loaded on demand with a worker among `workers`, nothing in
    /// flight or queued and not loading, least recently used first.
    fn evictable_on(&self, workers: &[String]) -> Vec<String> {
        if self.autoscaler_floor() {
            return Vec::new();
        }
        let mut idle: Vec<(Instant, String)> = self
            .on_demand
            .models
            .iter()
            .filter(|(name, m)| {
                m.loading.is_none()
                    && !self.busy(name)
                    && workers.iter().any(|id| {
                        self.workers
                            .values()
                            .any(|w| &w.id == id && w.routable() && w.serves(name))
                    })
            })
            .map(|(name, m)| (m.last_used, name.clone()))
            .collect();
        idle.sort();
        idle.into_iter().map(|(_, name)| name).collect()
    }

    /// Whether any accepted request (queued or running) is for `model`.
    fn busy(&self, model: &str) -> bool {
        self.requests
            .values()
            .any(|r| r.request.model.as_deref() == Some(model))
    }

    /// The `overloaded` message of a cold start that cannot fit: the need,
    /// the budget, and what holds it.
    fn no_room_message(&self, model: &str, supervisor: &[u8]) -> String {
        let Some(s) = self.control.supervisors.get(supervisor) else {
            return format!("no supervisor has memory for model {model:?}");
        };
        let need = s.worker_bytes(model);
        let mut holders: Vec<String> = Vec::new();
        for id in &s.workers {
            let Some(name) = self.model_of_worker(id) else {
                continue;
            };
            let bytes = s.worker_bytes(&name);
            let why = if !self.on_demand.manages(&name) {
                "pinned by scale"
            } else if self.on_demand.is_loading(&name) {
                "loading"
            } else {
                "busy"
            };
            holders.push(format!("{name} ({id}, about {}, {why})", gib(bytes)));
        }
        let held = if holders.is_empty() {
            String::new()
        } else {
            format!("; held by {}", holders.join(", "))
        };
        format!(
            "model {model:?} needs about {} and supervisor {} has {} free of its {} budget{held}; \
             nothing idle can be unloaded to make room: retry when a model is idle, unload one \
             (`zinfer ctl scale MODEL 0`) or raise --memory-budget",
            gib(need),
            s.id,
            gib(s.memory_free),
            gib(s.memory_budget),
        )
    }

    /// Unloads on-demand `model`: no worker is wanted any more, so its
    /// workers drain and stop.
    fn unload(&mut self, now: Instant, model: &str, reason: &'static str) {
        if self.on_demand.models.remove(model).is_none() {
            return;
        }
        self.metrics.unloads.with_label_values(&[reason]).inc();
        tracing::info!(model, reason, "unloading");
        self.control.targets.insert(model.to_string(), 0);
        self.reconcile(now, model);
        self.control.targets.remove(model);
    }

    /// Fails every queued request for `model` (a cold start that cannot
    /// happen).
    fn fail_waiting(&mut self, now: Instant, model: &str, code: ErrorCode, message: &str) {
        let waiting: Vec<u64> = self
            .queue
            .iter()
            .map(|&(_, rid)| rid)
            .filter(|rid| {
                self.requests
                    .get(rid)
                    .is_some_and(|r| r.request.model.as_deref() == Some(model))
            })
            .collect();
        for rid in waiting {
            self.fail(now, rid, code, message);
        }
    }

    /// A spawn of `model` failed: a cold start ends, its requests failed
    /// with the reason (no retry until the next request after the backoff).
    pub(super) fn cold_start_failed(&mut self, now: Instant, model: &str, reason: &str) {
        if !self.on_demand.is_loading(model) {
            return;
        }
        self.on_demand.models.remove(model);
        self.control.targets.remove(model);
        let message = format!("loading model {model:?} failed: {reason}");
        self.fail_waiting(now, model, ErrorCode::Unavailable, &message);
    }

    /// A worker of `model` registered: a cold start is done.
    pub(super) fn cold_start_done(&mut self, now: Instant, model: &str) {
        let Some(entry) = self.on_demand.models.get_mut(model) else {
            return;
        };
        if let Some(since) = entry.loading.take() {
            entry.last_used = now;
            self.metrics.cold_start_time.observe(seconds(since, now));
            tracing::info!(model, seconds = seconds(since, now), "loaded on demand");
        }
    }

    /// Cold starts waiting for memory try again (a supervisor reported).
    pub(super) fn retry_cold_starts(&mut self, now: Instant) {
        let waiting: Vec<String> = self
            .on_demand
            .models
            .iter()
            .filter(|(name, m)| m.loading.is_some() && self.control.scale_spawns(name) == 0)
            .map(|(name, _)| name.clone())
            .collect();
        for model in waiting {
            let serving = self
                .workers
                .values()
                .any(|w| w.routable() && w.serves(&model));
            if serving {
                self.cold_start_done(now, &model);
            } else {
                self.place(now, &model);
            }
        }
    }

    /// A request for `model` ended: its keep-alive (the request's own, or
    /// the model's default) counts from now.
    pub(super) fn model_used(&mut self, now: Instant, model: &str, keep_alive: Option<KeepAlive>) {
        // Every request ends here: most are for models nobody unloads.
        if !self.on_demand.manages(model) {
            return;
        }
        let keep_alive = keep_alive.unwrap_or_else(|| self.default_keep_alive(model));
        let Some(entry) = self.on_demand.models.get_mut(model) else {
            return;
        };
        entry.last_used = now;
        entry.keep_alive = keep_alive;
        if let Some(at) = entry.keep_alive.duration().and_then(|d| now.checked_add(d)) {
            self.wake_by(at + Duration::from_millis(1));
        }
    }

    /// When an idle model's keep-alive next runs out, if any does.
    pub(super) fn next_unload(&self) -> Option<Instant> {
        if self.autoscaler_floor() {
            return None;
        }
        self.on_demand
            .models
            .iter()
            .filter_map(|(name, m)| self.unload_at(name, m))
            .min()
            .map(|at| at + Duration::from_millis(1))
    }

    /// When on-demand `name` is to be unloaded: its keep-alive after its
    /// last use, once it is loaded and idle; `None` while loading, busy or
    /// kept for ever.
    fn unload_at(&self, name: &str, model: &DemandModel) -> Option<Instant> {
        if model.loading.is_some() || self.busy(name) {
            return None;
        }
        model
            .keep_alive
            .duration()
            .and_then(|d| model.last_used.checked_add(d))
    }

    /// Unloads every on-demand model idle past its keep-alive.
    pub(super) fn unload_idle(&mut self, now: Instant) {
        if self.autoscaler_floor() {
            return;
        }
        let expired: Vec<String> = self
            .on_demand
            .models
            .iter()
            .filter(|(name, m)| self.unload_at(name, m).is_some_and(|at| at <= now))
            .map(|(name, _)| name.clone())
            .collect();
        for model in expired {
            self.unload(now, &model, "idle");
        }
    }
}
