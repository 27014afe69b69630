use super::*;

fn lru() -> RadixCache<u32> {
    RadixCache::new(CacheConfig::default())
}

fn with_policy(policy: EvictionPolicy) -> RadixCache<u32> {
    RadixCache::new(CacheConfig {
        policy,
        page_size: 1,
    })
}

/// Slots 100+i for a key of length n, so slots are easy to read in asserts.
fn slots(range: std::ops::Range<u32>) -> Vec<u32> {
    range.map(|i| 100 + i).collect()
}

#[test]
fn empty_cache_matches_nothing() {
    let mut cache = lru();
    let m = cache.match_prefix("", &[1, 2, 3]);
    assert_eq!((m.len, m.slots.len()), (0, 0));
    assert_eq!(cache.stats().queried_tokens, 3);
    cache.lock(m.node);
    cache.unlock(m.node).unwrap();
    assert_eq!(cache.unlock(m.node), Err(CacheError::NotLocked));
    cache.check_invariants().unwrap();
}

#[test]
fn insert_then_match_returns_the_longest_prefix_and_its_slots() {
    let mut cache = lru();
    let out = cache.insert("", &[1, 2, 3, 4], &slots(0..4));
    assert_eq!(out.already_cached, 0);
    assert!(out.duplicate_slots.is_empty());
    let m = cache.match_prefix("", &[1, 2, 3, 9, 9]);
    assert_eq!(m.len, 3);
    assert_eq!(m.slots, vec![100, 101, 102]);
    // The match ended inside the edge, so it was split there.
    assert_eq!(cache.stats().nodes, 2);
    let full = cache.match_prefix("", &[1, 2, 3, 4]);
    assert_eq!(full.slots, slots(0..4));
    assert_eq!(cache.stats().hit_tokens, 7);
    cache.check_invariants().unwrap();
}

#[test]
fn insert_hands_back_duplicates_but_not_the_trees_own_slots() {
    let mut cache = lru();
    cache.insert("", &[1, 2, 3], &[10, 11, 12]);
    // A request that matched [1, 2] passes the tree's slots for them, its
    // own slots for the rest; another one computed everything itself.
    let m = cache.match_prefix("", &[1, 2, 7]);
    assert_eq!(m.slots, vec![10, 11]);
    let out = cache.insert("", &[1, 2, 7, 8], &[10, 11, 20, 21]);
    assert_eq!(out.already_cached, 2);
    assert!(out.duplicate_slots.is_empty());
    let out = cache.insert("", &[1, 2, 3, 5], &[30, 31, 32, 33]);
    assert_eq!(out.already_cached, 3);
    assert_eq!(out.duplicate_slots, vec![30, 31, 32]);
    let mut all = cache.cached_slots();
    all.sort_unstable();
    assert_eq!(all, vec![10, 11, 12, 20, 21, 33]);
    assert_eq!(cache.stats().inserted_tokens, 6);
    cache.check_invariants().unwrap();
}

#[test]
fn namespaces_never_share_entries() {
    let mut cache = lru();
    cache.insert("a", &[1, 2, 3], &[1, 2, 3]);
    assert_eq!(cache.match_prefix("b", &[1, 2, 3]).len, 0);
    assert_eq!(cache.match_prefix("", &[1, 2, 3]).len, 0);
    let out = cache.insert("b", &[1, 2, 3], &[4, 5, 6]);
    assert_eq!(out.already_cached, 0);
    assert_eq!(cache.match_prefix("a", &[1, 2, 3]).slots, vec![1, 2, 3]);
    assert_eq!(cache.match_prefix("b", &[1, 2, 3]).slots, vec![4, 5, 6]);
    let mut cleared = cache.clear("a");
    cleared.sort_unstable();
    assert_eq!(cleared, vec![1, 2, 3]);
    assert_eq!(cache.match_prefix("b", &[1, 2, 3]).len, 3);
    assert_eq!(cache.stats().namespaces, 1);
    cache.check_invariants().unwrap();
}

#[test]
fn locked_nodes_survive_eviction_and_handles_survive_splits() {
    let mut cache = lru();
    cache.insert("", &[1, 2, 3, 4], &slots(0..4));
    let m = cache.match_prefix("", &[1, 2, 3, 4]);
    cache.lock(m.node);
    assert_eq!(cache.protected_tokens(), 4);
    // Splits above the locked node keep the handle and the lock valid.
    cache.insert("", &[1, 2, 9], &[50, 51, 52]);
    cache.insert("", &[1, 7], &[60, 61]);
    assert_eq!(cache.protected_tokens(), 4);
    assert_eq!(cache.evictable_tokens(), 2);
    let freed = cache.evict(100);
    let mut freed_sorted = freed.clone();
    freed_sorted.sort_unstable();
    assert_eq!(freed_sorted, vec![52, 61]);
    assert_eq!(cache.match_prefix("", &[1, 2, 3, 4]).len, 4);
    cache.unlock(m.node).unwrap();
    assert_eq!(cache.evictable_tokens(), 4);
    assert_eq!(cache.evict(1).len(), 2, "cascades from the leaf [3, 4]");
    assert_eq!(cache.evict(10).len(), 2);
    assert_eq!(cache.total_tokens(), 0);
    assert_eq!(cache.stats().namespaces, 0);
    assert_eq!(cache.unlock(m.node), Err(CacheError::StaleHandle));
    cache.check_invariants().unwrap();
}

#[test]
fn lru_evicts_the_least_recently_used_leaf_first() {
    let mut cache = with_policy(EvictionPolicy::Lru);
    cache.insert("", &[1, 1], &[10, 11]);
    cache.insert("", &[2, 2], &[20, 21]);
    cache.insert("", &[3, 3], &[30, 31]);
    cache.match_prefix("", &[1, 1]);
    assert_eq!(cache.evict(1), vec![20, 21]);
    assert_eq!(cache.evict(1), vec![30, 31]);
    assert_eq!(cache.evict(1), vec![10, 11]);
}

#[test]
fn lfu_evicts_the_least_used_leaf_first() {
    let mut cache = with_policy(EvictionPolicy::Lfu);
    cache.insert("", &[1], &[10]);
    cache.insert("", &[2], &[20]);
    cache.insert("", &[3], &[30]);
    for _ in 0..3 {
        cache.match_prefix("", &[1]);
    }
    cache.match_prefix("", &[2]);
    cache.match_prefix("", &[3]);
    cache.match_prefix("", &[3]);
    assert_eq!(cache.evict(1), vec![20]);
    assert_eq!(cache.evict(1), vec![30]);
    assert_eq!(cache.evict(1), vec![10]);
}

#[test]
fn fifo_evicts_the_oldest_insertion_first() {
    let mut cache = with_policy(EvictionPolicy::Fifo);
    cache.insert("", &[1], &[10]);
    cache.insert("", &[2], &[20]);
    cache.match_prefix("", &[1]);
    assert_eq!(cache.evict(1), vec![10]);
    assert_eq!(cache.evict(1), vec![20]);
}

#[test]
fn eviction_takes_whole_leaves_until_enough_is_freed() {
    let mut cache = lru();
    cache.insert("", &[1, 2, 3], &[10, 11, 12]);
    cache.insert("", &[4, 5, 6], &[13, 14, 15]);
    let freed = cache.evict(4);
    assert_eq!(freed.len(), 6);
    assert_eq!(cache.stats().evicted_tokens, 6);
    assert!(cache.evict(1).is_empty());
    assert!(cache.evict(0).is_empty());
}

#[test]
fn pages_match_and_store_whole_pages_only() {
    let mut cache: RadixCache<u32> = RadixCache::new(CacheConfig {
        policy: EvictionPolicy::Lru,
        page_size: 2,
    });
    let out = cache.insert("", &[1, 2, 3, 4, 5], &[10, 11, 12, 13, 14]);
    assert_eq!(out.duplicate_slots, vec![14], "the partial page comes back");
    assert_eq!(cache.total_tokens(), 4);
    let m = cache.match_prefix("", &[1, 2, 3, 9]);
    assert_eq!((m.len, m.slots), (2, vec![10, 11]));
    // Same first token, different first page: a separate child.
    let out = cache.insert("", &[1, 7, 8, 8], &[20, 21, 22, 23]);
    assert_eq!(out.already_cached, 0);
    assert_eq!(cache.match_prefix("", &[1, 7, 8, 8]).len, 4);
    assert_eq!(cache.match_prefix("", &[1, 2, 3, 4, 5]).len, 4);
    assert_eq!(cache.match_prefix("", &[1]).len, 0);
    cache.check_invariants().unwrap();
}

#[test]
fn clear_keeps_locked_paths() {
    let mut cache = lru();
    cache.insert("", &[1, 2, 3], &[10, 11, 12]);
    cache.insert("", &[1, 2, 4], &[10, 11, 13]);
    cache.insert("x", &[5], &[14]);
    let m = cache.match_prefix("", &[1, 2, 3]);
    cache.lock(m.node);
    let mut freed = cache.clear_all();
    freed.sort_unstable();
    assert_eq!(freed, vec![13, 14]);
    assert_eq!(cache.total_tokens(), 3);
    assert_eq!(cache.match_prefix("", &[1, 2, 3]).len, 3);
    cache.unlock(m.node).unwrap();
    assert_eq!(cache.clear("").len(), 3);
    assert_eq!(
        cache.stats(),
        CacheStats {
            queried_tokens: 6,
            hit_tokens: 6,
            inserted_tokens: 5,
            evicted_tokens: 5,
            ..CacheStats::default()
        }
    );
    cache.check_invariants().unwrap();
}

#[test]
fn stale_handles_are_reported_not_misapplied() {
    let mut cache = lru();
    cache.insert("", &[1], &[10]);
    let m = cache.match_prefix("", &[1]);
    cache.evict(1);
    // The freed node id is reused by the next insert.
    cache.insert("", &[2], &[20]);
    assert_eq!(cache.try_lock(m.node), Err(CacheError::StaleHandle));
    cache.lock(m.node);
    assert_eq!(cache.protected_tokens(), 0);
    assert_eq!(cache.unlock(m.node), Err(CacheError::StaleHandle));
    cache.check_invariants().unwrap();
}

#[test]
fn index_only_cache_counts_without_slots() {
    let mut cache: RadixCache<u8> = RadixCache::new_index_only(CacheConfig::default());
    cache.insert("w", b"You are a helpful assistant. Hi", &[]);
    let out = cache.insert("w", b"You are a helpful assistant. Bye", &[]);
    assert_eq!(out.already_cached, 29);
    assert!(out.duplicate_slots.is_empty());
    let m = cache.match_prefix("w", b"You are a helpful bot");
    assert_eq!((m.len, m.slots.len()), (18, 0));
    assert_eq!(cache.total_tokens(), 34);
    assert!(cache.evict(1).is_empty());
    assert_eq!(cache.total_tokens(), 32);
    cache.check_invariants().unwrap();
}

#[test]
fn many_children_switch_to_a_map_and_stay_reachable() {
    let mut cache = lru();
    for t in 0..100u32 {
        cache.insert("", &[7, t, t], &[1000 + 3 * t, 1001 + 3 * t, 1002 + 3 * t]);
    }
    for t in 0..100u32 {
        assert_eq!(cache.match_prefix("", &[7, t, t, 5]).len, 3);
    }
    for _ in 0..50 {
        cache.evict(1);
    }
    assert_eq!(cache.stats().nodes, 51);
    cache.check_invariants().unwrap();
}
