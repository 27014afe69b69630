//! Moving KV slots between their three owners: the free pool, the radix
//! cache and a running sequence. Every slot is owned by exactly one.

use zinfer_cache::{NodeHandle, RadixCache, TokenPool};

use super::Seq;

/// The pool and the cache, always changed together.
pub(super) struct Kv {
    pub(super) pool: TokenPool,
    pub(super) cache: RadixCache<u32>,
    /// Whether computed prefixes go into the cache. Off for a model that
    /// keeps a recurrent state per sequence: K/V alone cannot resume it.
    pub(super) keep_prefixes: bool,
    /// The first slots of sequences released since the engine last took
    /// them, when prefixes are not kept: the model drops their recurrent
    /// states.
    pub(super) released: Vec<u32>,
}

impl Kv {
    /// Slots that could be had now: free ones plus unlocked cache entries.
    pub(super) fn room(&self) -> usize {
        self.pool.available() + self.cache.evictable_tokens()
    }

    /// `n` fresh slots, evicting unlocked cache entries first when the pool
    /// is short; None (and nothing changed but evictions) when even that
    /// is not enough.
    pub(super) fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        let short = n.saturating_sub(self.pool.available());
        if short > 0 {
            if short > self.cache.evictable_tokens() {
                return None;
            }
            let evicted = self.cache.evict(short);
            self.free(&evicted);
        }
        self.pool.alloc(n).ok()
    }

    /// Returns slots to the pool. A failure here is a bookkeeping bug: it is
    /// logged, never a panic.
    pub(super) fn free(&mut self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        if let Err(error) = self.pool.free(slots) {
            tracing::error!(%error, count = slots.len(), "freeing KV slots failed");
        }
    }

    /// Releases one lock; a failure is a bookkeeping bug and is logged.
    pub(super) fn unlock(&mut self, node: NodeHandle) {
        if let Err(error) = self.cache.unlock(node) {
            tracing::error!(%error, "unlocking a radix cache node failed");
        }
    }

    /// Puts a sequence's computed tokens into the cache and keeps them
    /// locked under the new node, as SGLang's `cache_unfinished_req` does:
    /// requests arriving later with the same prefix hit at once.
    pub(super) fn cache_prefix(&mut self, seq: &mut Seq) {
        if !self.keep_prefixes {
            return;
        }
        let len = seq.kv_len.min(seq.slots.len());
        let outcome = self
            .cache
            .insert(&seq.namespace, &seq.tokens[..len], &seq.slots[..len]);
        let mut node = outcome.node;
        let mut cached = len;
        if !outcome.duplicate_slots.is_empty() {
            // Another sequence cached some of these positions first: use
            // the cache's slots from now on and give ours back. Slots past
            // what the cache stored (a partial page) stay ours.
            let matched = self.cache.match_prefix(&seq.namespace, &seq.tokens[..len]);
            let still_ours = seq.slots.get(matched.len..len).unwrap_or_default();
            let unused: Vec<u32> = outcome
                .duplicate_slots
                .iter()
                .copied()
                .filter(|slot| !still_ours.contains(slot))
                .collect();
            self.free(&unused);
            for (mine, theirs) in seq.slots.iter_mut().zip(&matched.slots) {
                *mine = *theirs;
            }
            node = matched.node;
            cached = matched.len.min(matched.slots.len());
        }
        self.cache.lock(node);
        if let Some(old) = seq.node.replace(node) {
            self.unlock(old);
        }
        seq.cache_len = cached;
    }

    /// Gives up a sequence's slots: with `keep`, its computed tokens go into
    /// the cache (unlocked, so evictable); otherwise all its own slots are
    /// freed. Either way its lock is released and it owns nothing after.
    pub(super) fn release(&mut self, seq: &mut Seq, keep: bool) {
        let state = std::mem::take(&mut seq.state);
        self.free(&state);
        if !self.keep_prefixes
            && let Some(&first) = seq.slots.first()
        {
            self.released.push(first);
        }
        let Some(node) = seq.node.take() else {
            seq.slots.clear();
            return;
        };
        let computed = seq.kv_len.min(seq.slots.len());
        if keep && self.keep_prefixes && computed > 0 {
            let outcome = self.cache.insert(
                &seq.namespace,
                &seq.tokens[..computed],
                &seq.slots[..computed],
            );
            self.free(&outcome.duplicate_slots);
            let spare = seq.slots.split_off(computed);
            self.free(&spare);
        } else {
            let own = seq.slots.split_off(seq.cache_len.min(seq.slots.len()));
            self.free(&own);
        }
        self.unlock(node);
        seq.slots.clear();
        seq.kv_len = 0;
        seq.cache_len = 0;
        seq.prefilled = false;
    }
}
