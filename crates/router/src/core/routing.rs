//! Choosing a worker (the policies), dispatching, and the router queue.

use std::time::Instant;

use zinfer_protocol::{ErrorCode, RouterToWorker};

use super::{Core, Peer, Progress, Stage, Worker, remaining_ms, seconds};
use crate::Policy;

/// Why a worker was chosen; the label of the routing-decision metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    RoundRobin,
    LeastLoad,
    /// Cache-aware: the best prefix match was good enough.
    CacheHit,
    /// Cache-aware: no good match, least loaded instead.
    CacheMiss,
    /// Cache-aware: load imbalanced, least loaded instead.
    Balance,
}

impl Decision {
    fn label(self) -> &'static str {
        match self {
            Decision::RoundRobin => "round_robin",
            Decision::LeastLoad => "least_load",
            Decision::CacheHit => "cache_hit",
            Decision::CacheMiss => "cache_miss",
            Decision::Balance => "balance",
        }
    }
}

impl Core {
    /// Whether requests for `model` can be served now or soon: some
    /// worker takes them (busy or not), or the control plane is starting
    /// one. While a dead worker's replacement loads, requests wait in the
    /// queue (up to their deadline) instead of failing at once.
    pub(super) fn any_routable(&self, model: &str) -> bool {
        self.workers
            .values()
            .any(|worker| worker.routable() && worker.serves(model))
            || self.control.scale_spawns(model) > 0
            || self.on_demand.is_loading(model)
    }

    /// Sends request `rid` to a worker if one has room; false if none has.
    pub(super) fn try_dispatch(&mut self, now: Instant, rid: u64) -> bool {
        let Some(request) = self.requests.get(&rid) else {
            return true;
        };
        let Some(model) = request.request.model.clone() else {
            return false;
        };
        let priority = request.request.priority;
        let candidates: Vec<Vec<u8>> = self
            .order
            .iter()
            .filter(|identity| {
                self.workers.get(*identity).is_some_and(|worker| {
                    worker.routable()
                        && worker.serves(&model)
                        && (worker.has_room() || self.outranks_work_on(worker, priority))
                })
            })
            .cloned()
            .collect();
        if candidates.is_empty() {
            return false;
        }
        let (chosen, decision) = self.pick(rid, &candidates);
        self.metrics
            .routing
            .with_label_values(&[decision.label()])
            .inc();
        self.dispatch(now, rid, chosen);
        true
    }

    fn pick(&mut self, rid: u64, candidates: &[Vec<u8>]) -> (Vec<u8>, Decision) {
        match self.config.policy {
            Policy::RoundRobin => {
                let chosen = candidates[self.rr_cursor % candidates.len()].clone();
                self.rr_cursor = self.rr_cursor.wrapping_add(1);
                (chosen, Decision::RoundRobin)
            }
            Policy::LeastLoad => (self.least_loaded(candidates), Decision::LeastLoad),
            Policy::CacheAware => self.pick_cache_aware(rid, candidates),
        }
    }

    pub(super) fn load_of(&self, identity: &[u8]) -> u64 {
        self.workers.get(identity).map_or(u64::MAX, |w| w.load())
    }

    fn least_loaded(&self, candidates: &[Vec<u8>]) -> Vec<u8> {
        candidates
            .iter()
            .min_by_key(|identity| self.load_of(identity))
            .cloned()
            .unwrap_or_default()
    }

    /// SGLang's gateway rule: balance first, then the longest prefix match
    /// if it covers more than `cache_threshold` of the prompt.
    fn pick_cache_aware(&mut self, rid: u64, candidates: &[Vec<u8>]) -> (Vec<u8>, Decision) {
        let loads: Vec<u64> = candidates.iter().map(|id| self.load_of(id)).collect();
        let min = loads.iter().copied().min().unwrap_or(0);
        let max = loads.iter().copied().max().unwrap_or(0);
        let imbalanced = max - min > u64::from(self.config.balance_abs)
            && max as f64 > min as f64 * self.config.balance_rel;
        let (chosen, decision) = if imbalanced {
            (self.least_loaded(candidates), Decision::Balance)
        } else {
            self.best_match(rid, candidates, &loads)
        };
        if let Some(request) = self.requests.get(&rid)
            && let Some(worker) = self.workers.get_mut(&chosen)
        {
            worker.index.insert(&request.index_namespace, &request.key);
        }
        (chosen, decision)
    }

    fn best_match(
        &mut self,
        rid: u64,
        candidates: &[Vec<u8>],
        loads: &[u64],
    ) -> (Vec<u8>, Decision) {
        let Some(request) = self.requests.get(&rid) else {
            return (self.least_loaded(candidates), Decision::CacheMiss);
        };
        let mut best: Option<(usize, u64, usize)> = None;
        for (at, identity) in candidates.iter().enumerate() {
            let Some(worker) = self.workers.get_mut(identity) else {
                continue;
            };
            let len = worker
                .index
                .match_len(&request.index_namespace, &request.key);
            let better = best.is_none_or(|(best_len, best_load, _)| {
                len > best_len || (len == best_len && loads[at] < best_load)
            });
            if better {
                best = Some((len, loads[at], at));
            }
        }
        let key_len = request.key.len();
        match best {
            Some((len, _, at))
                if key_len > 0 && len as f64 / key_len as f64 > self.config.cache_threshold =>
            {
                (candidates[at].clone(), Decision::CacheHit)
            }
            _ => (self.least_loaded(candidates), Decision::CacheMiss),
        }
    }

    fn dispatch(&mut self, now: Instant, rid: u64, identity: Vec<u8>) {
        let Some(request) = self.requests.get_mut(&rid) else {
            return;
        };
        let mut forwarded = request.request.clone();
        if let Some(deadline) = request.deadline {
            let left = remaining_ms(deadline, now);
            if left == 0 {
                self.fail(
                    now,
                    rid,
                    ErrorCode::Deadline,
                    "deadline_ms passed before a worker could take the request",
                );
                return;
            }
            forwarded.deadline_ms = Some(left);
        }
        if !request.stage.dispatched() {
            self.metrics
                .queue_time
                .observe(seconds(request.arrived, now));
        }
        request.stage = Stage::Running {
            worker: identity.clone(),
            retried: request.stage.retried(),
            progress: Progress::Silent,
        };
        let Some(worker) = self.workers.get_mut(&identity) else {
            return;
        };
        worker.inflight.insert(rid);
        self.metrics.inflight.inc();
        let to = Peer::Worker(worker.addr.clone());
        request
            .span
            .in_scope(|| tracing::debug!(worker = %worker.id, "dispatched"));
        self.send(
            to,
            &RouterToWorker::Generate {
                rid,
                request: forwarded,
            },
        );
    }

    pub(super) fn enqueue(&mut self, rid: u64) {
        if let Some(request) = self.requests.get_mut(&rid) {
            self.queue.insert(request.queue_key(rid));
            self.metrics.queue_depth.set(self.queue.len() as i64);
            if let Some(deadline) = request.deadline {
                self.wake_by(deadline);
            }
        }
    }

    /// Dispatches queued requests while workers have room, in priority
    /// order; fails those whose model no worker takes any more.
    pub(super) fn drain_queue(&mut self, now: Instant) {
        if self.queue.is_empty() {
            return;
        }
        let waiting: Vec<u64> = self.queue.iter().map(|&(_, rid)| rid).collect();
        for rid in waiting {
            let Some(request) = self.requests.get(&rid) else {
                continue;
            };
            let model = request.request.model.clone().unwrap_or_default();
            if !self.any_routable(&model) {
                let (code, message) = if request.stage.retried() {
                    (
                        ErrorCode::WorkerLost,
                        "the worker running the request was lost and no other worker \
                         serves its model; retry later",
                    )
                } else {
                    (
                        ErrorCode::Unavailable,
                        "no worker takes requests for this model any more; retry later",
                    )
                };
                self.fail(now, rid, code, message);
                continue;
            }
            let key = request.queue_key(rid);
            let priority = request.request.priority;
            // The queue is in priority order: when its head cannot go, as
            // plain work or by outranking work in flight, nothing behind it can.
            if !self.has_any_room()
                && !self
                    .workers
                    .values()
                    .any(|worker| worker.routable() && self.outranks_work_on(worker, priority))
            {
                break;
            }
            self.queue.remove(&key);
            if !self.try_dispatch(now, rid) {
                self.queue.insert(key);
            }
        }
        self.metrics.queue_depth.set(self.queue.len() as i64);
    }

    /// Whether a request of `priority` may go to `worker` past its
    /// `max_inflight`: something in flight there has a lower priority.
    fn outranks_work_on(&self, worker: &Worker, priority: i32) -> bool {
        worker.has_room_to_preempt()
            && worker.inflight.iter().any(|rid| {
                self.requests
                    .get(rid)
                    .is_some_and(|r| r.request.priority < priority)
            })
    }

    fn has_any_room(&self) -> bool {
        self.workers
            .values()
            .any(|worker| worker.routable() && worker.has_room())
    }
}
