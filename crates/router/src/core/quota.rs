//! Per-client limits: requests in flight and generated tokens per second,
//! keyed by the client's connection identity, or with CURVE by its
//! tenant, so a reconnect does not reset them. A client over a limit gets
//! `overloaded` at once, so one client cannot fill the queue or the
//! workers for everyone else.

use std::time::Instant;

use super::Core;

/// What one client is using.
pub(super) struct ClientQuota {
    inflight: u32,
    /// Token bucket level: up to one second of the rate; generated tokens
    /// are taken out as they are relayed, so it may go below zero.
    tokens: f64,
    refilled: Instant,
}

impl ClientQuota {
    fn refill(&mut self, now: Instant, rate: Option<f64>) {
        if let Some(rate) = rate {
            let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
            self.tokens = (self.tokens + rate * elapsed).min(rate.max(1.0));
        }
        self.refilled = now;
    }

    fn idle(&self, rate: Option<f64>) -> bool {
        self.inflight == 0 && rate.is_none_or(|rate| self.tokens >= rate.max(1.0))
    }
}

impl Core {
    /// Why the client on `identity` may not start another request now:
    /// the metrics label and a message, or `None`.
    pub(super) fn client_limit(
        &mut self,
        now: Instant,
        identity: &[u8],
    ) -> Option<(&'static str, String)> {
        let rate = self.config.max_tokens_per_second_per_client;
        let quota = self.quotas.get_mut(identity)?;
        quota.refill(now, rate);
        if let Some(max) = self.config.max_inflight_per_client
            && quota.inflight >= max
        {
            return Some((
                "inflight",
                format!(
                    "this client already has {max} requests in flight, its limit; \
                     wait for one to end, then retry with backoff"
                ),
            ));
        }
        if let Some(rate) = rate
            && quota.tokens <= 0.0
        {
            return Some((
                "tokens_per_second",
                format!(
                    "this client is over its limit of {rate} generated tokens per second; \
                     retry with backoff"
                ),
            ));
        }
        None
    }

    pub(super) fn quota_started(&mut self, now: Instant, identity: &[u8]) {
        let rate = self.config.max_tokens_per_second_per_client;
        let quota = self
            .quotas
            .entry(identity.to_vec())
            .or_insert_with(|| ClientQuota {
                inflight: 0,
                tokens: rate.map_or(0.0, |rate| rate.max(1.0)),
                refilled: now,
            });
        quota.inflight += 1;
    }

    pub(super) fn quota_ended(&mut self, identity: &[u8]) {
        let rate = self.config.max_tokens_per_second_per_client;
        if let Some(quota) = self.quotas.get_mut(identity) {
            quota.inflight = quota.inflight.saturating_sub(1);
            if quota.idle(rate) {
                self.quotas.remove(identity);
            }
        }
    }

    pub(super) fn quota_charge(&mut self, now: Instant, identity: &[u8], tokens: usize) {
        let rate = self.config.max_tokens_per_second_per_client;
        if rate.is_some()
            && let Some(quota) = self.quotas.get_mut(identity)
        {
            quota.refill(now, rate);
            quota.tokens -= tokens as f64;
        }
    }

    /// Forgets clients with nothing in flight and a full bucket.
    pub(super) fn forget_idle_quotas(&mut self, now: Instant) {
        let rate = self.config.max_tokens_per_second_per_client;
        self.quotas.retain(|_, quota| {
            quota.refill(now, rate);
            !quota.idle(rate)
        });
    }
}
