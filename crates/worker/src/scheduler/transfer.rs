//! Cache transfer support: reading the radix cache for an export, and
//! putting imported K/V into free slots.
//!
//! Lives with the scheduler because it owns the slots: an import must move
//! slots between the free pool and the cache as carefully as admission does.

use zinfer_cache::RadixCache;

use super::Scheduler;

/// Why an import took nothing.
#[derive(Debug, thiserror::Error)]
pub enum ImportError<E> {
    /// Fewer free slots than the span needs. Imports use free slots only:
    /// evicting real traffic's cache or preempting running work for a
    /// guess at future traffic would cost more than it saves.
    #[error("{needed} free slots needed for an import, {free} free")]
    NoRoom {
        /// Slots the span needs.
        needed: usize,
        /// Slots free.
        free: usize,
    },
    /// Writing the K/V into the new slots failed; they went back to the
    /// pool.
    #[error("writing imported K/V failed: {0}")]
    Fill(E),
}

impl Scheduler {
    /// The radix cache, read-only: exports select and re-check spans with
    /// it between steps.
    pub fn cache(&self) -> &RadixCache<u32> {
        &self.kv.cache
    }

    /// Caches `tokens` of `namespace` whose first `from` elements are
    /// already cached: takes `tokens.len() - from` free slots, lets `fill`
    /// write their K/V, then inserts the whole key. Returns how many
    /// tokens the cache newly holds.
    ///
    /// Never evicts or preempts. Slots the cache does not keep (a partial
    /// last page, or a race with an identical entry) go back to the pool,
    /// so slot ownership stays exact. The insert counts as inserted tokens
    /// but not as a query or hit: the hit ratio reflects real requests.
    pub fn import_prefix<E>(
        &mut self,
        namespace: &str,
        tokens: &[u32],
        from: usize,
        fill: impl FnOnce(&[u32]) -> Result<(), E>,
    ) -> Result<usize, ImportError<E>> {
        let (cached, mut slots) = self.kv.cache.cached_prefix(namespace, tokens);
        if !self.kv.keep_prefixes || cached < from || from > tokens.len() {
            // The caller checked; a mismatch means nothing can be kept.
            return Ok(0);
        }
        slots.truncate(from);
        let needed = tokens.len() - from;
        let new = self
            .kv
            .pool
            .alloc(needed)
            .map_err(|_| ImportError::NoRoom {
                needed,
                free: self.kv.pool.available(),
            })?;
        if let Err(error) = fill(&new) {
            self.kv.free(&new);
            return Err(ImportError::Fill(error));
        }
        slots.extend_from_slice(&new);
        let outcome = self.kv.cache.insert(namespace, tokens, &slots);
        self.kv.free(&outcome.duplicate_slots);
        Ok(needed - outcome.duplicate_slots.len())
    }
}
