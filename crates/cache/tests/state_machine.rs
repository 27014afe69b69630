//! Random sequences of pool and cache operations, replayed against a plain
//! reference model and checked after every step.
//!
//! The model stores every cached page-aligned prefix of every namespace in a
//! hash map (prefix -> that page's slots): obviously right, hopelessly slow.
//! Requests follow the engine's life cycle: match and lock the cached prefix,
//! allocate the rest (evicting when the pool is short), then insert the whole
//! key, free what the cache did not keep, and unlock.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use zinfer_cache::{CacheConfig, EvictionPolicy, NodeHandle, PoolError, RadixCache, TokenPool};

const CAPACITY: usize = 48;
const NAMESPACES: [&str; 3] = ["", "tenant-a", "tenant-b"];

/// Shared stems so that random keys overlap in interesting ways.
const STEMS: [[u32; 12]; 3] = [
    [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2],
    [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1],
    [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
];

#[derive(Clone, Debug)]
enum Op {
    /// A request arrives: optionally match and lock its cached prefix, then
    /// allocate slots for the rest.
    Start {
        ns: usize,
        key: Vec<u32>,
        use_cache: bool,
    },
    /// A request ends: optionally insert its key, then release everything.
    Finish {
        seq: usize,
        insert: bool,
    },
    /// A lookup with no follow-up (the router's kind of use).
    Match {
        ns: usize,
        key: Vec<u32>,
    },
    Evict {
        n: usize,
    },
    Clear {
        ns: usize,
    },
    ClearAll,
}

fn key_strategy() -> impl Strategy<Value = Vec<u32>> {
    (
        0..STEMS.len(),
        0..=12usize,
        prop::collection::vec(0..3u32, 0..5),
    )
        .prop_map(|(stem, len, tail)| {
            let mut key = STEMS[stem][..len].to_vec();
            key.extend(tail);
            key
        })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let ns = 0..NAMESPACES.len();
    prop_oneof![
        4 => (ns.clone(), key_strategy(), any::<bool>())
            .prop_map(|(ns, key, use_cache)| Op::Start { ns, key, use_cache }),
        4 => (any::<usize>(), prop::bool::weighted(0.8))
            .prop_map(|(seq, insert)| Op::Finish { seq, insert }),
        2 => (ns.clone(), key_strategy()).prop_map(|(ns, key)| Op::Match { ns, key }),
        2 => (0..20usize).prop_map(|n| Op::Evict { n }),
        1 => ns.prop_map(|ns| Op::Clear { ns }),
        1 => Just(Op::ClearAll),
    ]
}

fn policy_strategy() -> impl Strategy<Value = EvictionPolicy> {
    prop_oneof![
        Just(EvictionPolicy::Lru),
        Just(EvictionPolicy::Lfu),
        Just(EvictionPolicy::Fifo),
    ]
}

/// A request between `Start` and `Finish`.
#[derive(Debug)]
struct Seq {
    ns: usize,
    key: Vec<u32>,
    /// Slots for every position: the cache's for the matched prefix, then
    /// the request's own.
    slots: Vec<u32>,
    /// The slots the request owns (allocated from the pool).
    owned: Vec<u32>,
    /// The locked prefix: its node and length.
    lock: Option<(NodeHandle, usize)>,
}

struct Harness {
    cache: RadixCache<u32>,
    pool: TokenPool,
    page: usize,
    /// (namespace, page-aligned prefix) -> slots of the prefix's last page.
    model: HashMap<(usize, Vec<u32>), Vec<u32>>,
    seqs: Vec<Seq>,
}

impl Harness {
    fn new(policy: EvictionPolicy, page: usize) -> Self {
        Self {
            cache: RadixCache::new(CacheConfig {
                policy,
                page_size: page,
            }),
            pool: TokenPool::new(CAPACITY),
            page,
            model: HashMap::new(),
            seqs: Vec::new(),
        }
    }

    /// The model's longest cached prefix of `key` and its slots.
    fn model_match(&self, ns: usize, key: &[u32]) -> (usize, Vec<u32>) {
        let mut slots = Vec::new();
        let mut len = 0;
        while len + self.page <= key.len() {
            let Some(page) = self.model.get(&(ns, key[..len + self.page].to_vec())) else {
                break;
            };
            slots.extend_from_slice(page);
            len += self.page;
        }
        (len, slots)
    }

    /// Every (namespace, prefix) some running request has locked.
    fn locked_prefixes(&self) -> HashSet<(usize, Vec<u32>)> {
        let mut locked = HashSet::new();
        for seq in &self.seqs {
            if let Some((_, len)) = seq.lock {
                for end in (self.page..=len).step_by(self.page) {
                    locked.insert((seq.ns, seq.key[..end].to_vec()));
                }
            }
        }
        locked
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Start { ns, key, use_cache } => self.start(ns, key, use_cache),
            Op::Finish { seq, insert } => self.finish(seq, insert),
            Op::Match { ns, key } => {
                let expected = self.model_match(ns, &key);
                let m = self.cache.match_prefix(NAMESPACES[ns], &key);
                assert_eq!((m.len, m.slots), expected, "match {key:?} in {ns}");
            }
            Op::Evict { n } => {
                let evictable = self.cache.evictable_tokens();
                let freed = self.cache.evict(n);
                assert!(freed.len() <= evictable);
                assert!(
                    freed.len() >= n || self.cache.evictable_tokens() == 0,
                    "evict({n}) freed {} with {} still evictable",
                    freed.len(),
                    self.cache.evictable_tokens()
                );
                self.remove_from_model(&freed);
                self.pool.free(&freed).unwrap();
            }
            Op::Clear { ns } => {
                let freed = self.cache.clear(NAMESPACES[ns]);
                self.remove_from_model(&freed);
                self.pool.free(&freed).unwrap();
                let locked = self.locked_prefixes();
                assert!(self.model.keys().all(|k| k.0 != ns || locked.contains(k)));
            }
            Op::ClearAll => {
                let freed = self.cache.clear_all();
                self.remove_from_model(&freed);
                self.pool.free(&freed).unwrap();
                assert_eq!(self.model.len(), self.locked_prefixes().len());
            }
        }
    }

    fn start(&mut self, ns: usize, key: Vec<u32>, use_cache: bool) {
        let (mut slots, lock) = if use_cache {
            let expected = self.model_match(ns, &key);
            let m = self.cache.match_prefix(NAMESPACES[ns], &key);
            assert_eq!((m.len, m.slots.clone()), expected, "match {key:?} in {ns}");
            self.cache.lock(m.node);
            (m.slots, Some((m.node, m.len)))
        } else {
            (Vec::new(), None)
        };
        let need = key.len() - slots.len();
        let owned = match self.pool.alloc(need) {
            Ok(owned) => owned,
            Err(PoolError::Exhausted { available, .. }) => {
                assert_eq!(available, self.pool.available());
                assert!(available < need);
                let freed = self.cache.evict(need - available);
                self.remove_from_model(&freed);
                self.pool.free(&freed).unwrap();
                match self.pool.alloc(need) {
                    Ok(owned) => owned,
                    Err(_) => {
                        assert_eq!(self.cache.evictable_tokens(), 0);
                        if let Some((node, _)) = lock {
                            self.cache.unlock(node).unwrap();
                        }
                        return;
                    }
                }
            }
            Err(other) => panic!("alloc failed with {other}"),
        };
        slots.extend_from_slice(&owned);
        self.seqs.push(Seq {
            ns,
            key,
            slots,
            owned,
            lock,
        });
    }

    fn finish(&mut self, seq: usize, insert: bool) {
        if self.seqs.is_empty() {
            return;
        }
        let seq = self.seqs.remove(seq % self.seqs.len());
        if insert {
            let (cached, tree_slots) = self.model_match(seq.ns, &seq.key);
            let out = self.cache.insert(NAMESPACES[seq.ns], &seq.key, &seq.slots);
            assert_eq!(out.already_cached, cached);
            let stored = seq.key.len() / self.page * self.page;
            let mut expected_duplicates: Vec<u32> = (0..cached)
                .filter(|&i| seq.slots[i] != tree_slots[i])
                .map(|i| seq.slots[i])
                .collect();
            expected_duplicates.extend_from_slice(&seq.slots[stored..]);
            assert_eq!(out.duplicate_slots, expected_duplicates);
            for end in (cached + self.page..=stored).step_by(self.page) {
                let page = seq.slots[end - self.page..end].to_vec();
                self.model.insert((seq.ns, seq.key[..end].to_vec()), page);
            }
            // Only the request's own slots may come back, and only once.
            self.pool.free(&out.duplicate_slots).unwrap();
        } else {
            self.pool.free(&seq.owned).unwrap();
        }
        if let Some((node, _)) = seq.lock {
            self.cache.unlock(node).unwrap();
        }
    }

    /// Drops from the model the pages whose slots were freed, checking that
    /// they were cached, unlocked, whole pages, and that what remains is
    /// still closed under prefixes.
    fn remove_from_model(&mut self, freed: &[u32]) {
        let freed_set: HashSet<u32> = freed.iter().copied().collect();
        assert_eq!(freed_set.len(), freed.len(), "a slot was freed twice");
        let locked = self.locked_prefixes();
        let mut removed = 0;
        self.model.retain(|prefix, page| {
            let gone = page.iter().filter(|s| freed_set.contains(s)).count();
            assert!(gone == 0 || gone == page.len(), "page partly evicted");
            if gone > 0 {
                assert!(!locked.contains(prefix), "locked prefix {prefix:?} evicted");
                removed += gone;
            }
            gone == 0
        });
        assert_eq!(removed, freed.len(), "freed slots that were not cached");
        for (ns, prefix) in self.model.keys() {
            if prefix.len() > self.page {
                let parent = (*ns, prefix[..prefix.len() - self.page].to_vec());
                assert!(self.model.contains_key(&parent), "orphan {prefix:?}");
            }
        }
    }

    /// Whole-system invariants, checked after every step.
    fn check(&self) {
        self.cache.check_invariants().unwrap();
        // Every slot is in exactly one place: the tree, a request, or free.
        let mut cached = self.cache.cached_slots();
        let mut held: Vec<u32> = cached.clone();
        for seq in &self.seqs {
            held.extend_from_slice(&seq.owned);
        }
        let distinct: HashSet<u32> = held.iter().copied().collect();
        assert_eq!(distinct.len(), held.len(), "a slot is in two places");
        assert!(held.iter().all(|&s| self.pool.is_allocated(s)));
        assert_eq!(held.len() + self.pool.available(), CAPACITY);
        // The tree holds exactly the model's pages.
        let mut modelled: Vec<u32> = self.model.values().flatten().copied().collect();
        cached.sort_unstable();
        modelled.sort_unstable();
        assert_eq!(cached, modelled);
        assert_eq!(self.cache.total_tokens(), modelled.len());
        let protected = self.locked_prefixes().len() * self.page;
        assert_eq!(self.cache.protected_tokens(), protected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn cache_and_pool_match_the_reference_model(
        policy in policy_strategy(),
        page in 1..=3usize,
        ops in prop::collection::vec(op_strategy(), 1..80),
    ) {
        let mut harness = Harness::new(policy, page);
        for op in ops {
            harness.apply(op);
            harness.check();
        }
        // Every request can still finish cleanly, leaving only the cache.
        while !harness.seqs.is_empty() {
            harness.finish(0, true);
            harness.check();
        }
        prop_assert_eq!(harness.cache.protected_tokens(), 0);
        let freed = harness.cache.clear_all();
        harness.remove_from_model(&freed);
        harness.pool.free(&freed).unwrap();
        harness.check();
        prop_assert_eq!(harness.pool.available(), CAPACITY);
    }
}
