//! A fixed pool of KV slots handed out by id.

/// Why the pool refused an `alloc` or a `free`. The pool is unchanged
/// whenever one of these is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Fewer free slots than asked for: evict from the cache or wait for
    /// running sequences to finish, then retry.
    #[error(
        "KV pool exhausted: {requested} slots requested, {available} free; evict or retry later"
    )]
    Exhausted {
        /// Slots asked for.
        requested: usize,
        /// Slots free at the time of the call.
        available: usize,
    },
    /// A slot id the pool never had: the caller mixed up pools or ids.
    #[error(
        "slot {slot} is outside this pool (capacity {capacity}); free only ids this pool handed out"
    )]
    OutOfRange {
        /// The offending id.
        slot: u32,
        /// The pool's capacity.
        capacity: usize,
    },
    /// A slot that is already free: a double free, or a slot that was never
    /// handed out (possibly listed twice in one call).
    #[error("slot {slot} is not allocated (double free?); free each slot exactly once")]
    NotAllocated {
        /// The offending id.
        slot: u32,
    },
}

/// KV slots `0..capacity`, each either free or held by exactly one owner.
///
/// The engine allocates slots for the uncached part of a prompt and for
/// generated tokens; the radix cache takes ownership of the ones it keeps.
/// Every operation costs O(1) per slot, and misuse (double free, foreign
/// ids) is reported instead of corrupting the free list.
#[derive(Clone, Debug)]
pub struct TokenPool {
    /// Free slot ids; `alloc` pops from the end.
    free: Vec<u32>,
    /// `allocated[slot]` is true while the slot is handed out.
    allocated: Vec<bool>,
}

impl TokenPool {
    /// The largest capacity slot ids can address (ids are `u32`).
    pub const MAX_CAPACITY: usize = u32::MAX as usize + 1;

    /// A pool of slot ids `0..capacity`, all free. A capacity above
    /// [`Self::MAX_CAPACITY`] is clamped to it, since ids are `u32`.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(Self::MAX_CAPACITY);
        // Reversed so that the first allocations get the lowest ids.
        let free = (0..capacity).rev().map(slot_id).collect();
        Self {
            free,
            allocated: vec![false; capacity],
        }
    }

    /// Hands out `n` slots, or none at all when fewer than `n` are free.
    pub fn alloc(&mut self, n: usize) -> Result<Vec<u32>, PoolError> {
        if n > self.free.len() {
            return Err(PoolError::Exhausted {
                requested: n,
                available: self.free.len(),
            });
        }
        let slots = self.free.split_off(self.free.len() - n);
        for &slot in &slots {
            self.allocated[slot as usize] = true;
        }
        Ok(slots)
    }

    /// Returns `slots` to the pool. Either every slot is freed or, on the
    /// first bad id, none is.
    pub fn free(&mut self, slots: &[u32]) -> Result<(), PoolError> {
        for (i, &slot) in slots.iter().enumerate() {
            let error = match self.allocated.get(slot as usize) {
                None => Some(PoolError::OutOfRange {
                    slot,
                    capacity: self.capacity(),
                }),
                Some(false) => Some(PoolError::NotAllocated { slot }),
                Some(true) => None,
            };
            if let Some(error) = error {
                // Undo the marks of this call so the pool is unchanged.
                for &done in &slots[..i] {
                    self.allocated[done as usize] = true;
                }
                return Err(error);
            }
            // Marked now so that a slot listed twice fails the second time.
            self.allocated[slot as usize] = false;
        }
        self.free.extend_from_slice(slots);
        Ok(())
    }

    /// Slots free right now.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Total slots, free or not.
    pub fn capacity(&self) -> usize {
        self.allocated.len()
    }

    /// Slots handed out and not yet freed.
    pub fn in_use(&self) -> usize {
        self.capacity() - self.available()
    }

    /// Whether `slot` is currently handed out (false for ids out of range).
    pub fn is_allocated(&self, slot: u32) -> bool {
        self.allocated.get(slot as usize).copied().unwrap_or(false)
    }
}

/// `i < MAX_CAPACITY` always holds here, so the cast is lossless.
fn slot_id(i: usize) -> u32 {
    i as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_all_or_nothing() {
        let mut pool = TokenPool::new(4);
        let a = pool.alloc(3).unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(
            pool.alloc(2),
            Err(PoolError::Exhausted {
                requested: 2,
                available: 1
            })
        );
        assert_eq!(pool.available(), 1);
        assert_eq!(pool.alloc(1).unwrap().len(), 1);
        assert_eq!(pool.available(), 0);
        assert_eq!(pool.alloc(0).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn first_allocations_get_low_ids_and_ids_are_distinct() {
        let mut pool = TokenPool::new(8);
        let mut all = pool.alloc(3).unwrap();
        all.extend(pool.alloc(5).unwrap());
        let mut sorted = all.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..8).collect::<Vec<u32>>());
        assert!(all[..3].iter().all(|&s| s < 3));
    }

    #[test]
    fn double_free_is_an_error_and_leaves_the_pool_unchanged() {
        let mut pool = TokenPool::new(4);
        let slots = pool.alloc(2).unwrap();
        pool.free(&slots).unwrap();
        assert_eq!(
            pool.free(&slots[..1]),
            Err(PoolError::NotAllocated { slot: slots[0] })
        );
        assert_eq!(pool.available(), 4);
        // Still four distinct slots to hand out.
        let mut again = pool.alloc(4).unwrap();
        again.sort_unstable();
        assert_eq!(again, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_failed_free_rolls_back_the_slots_before_the_bad_one() {
        let mut pool = TokenPool::new(4);
        let slots = pool.alloc(3).unwrap();
        let bad = [slots[0], slots[1], 99];
        assert_eq!(
            pool.free(&bad),
            Err(PoolError::OutOfRange {
                slot: 99,
                capacity: 4
            })
        );
        assert_eq!(pool.available(), 1);
        assert!(slots.iter().all(|&s| pool.is_allocated(s)));
        // The same slot twice in one call is a double free too.
        let twice = [slots[2], slots[2]];
        assert_eq!(
            pool.free(&twice),
            Err(PoolError::NotAllocated { slot: slots[2] })
        );
        assert!(pool.is_allocated(slots[2]));
        pool.free(&slots).unwrap();
        assert_eq!(pool.available(), 4);
    }

    #[test]
    fn freeing_a_slot_never_handed_out_is_an_error() {
        let mut pool = TokenPool::new(4);
        let held = pool.alloc(1).unwrap();
        let never = (0..4u32).find(|s| !held.contains(s)).unwrap();
        assert_eq!(
            pool.free(&[never]),
            Err(PoolError::NotAllocated { slot: never })
        );
        assert_eq!(pool.in_use(), 1);
    }
}
