//! Read-only views of the tree for carrying cached K/V to another worker:
//! the hottest spans to export, and a lookup that changes nothing.
//!
//! Both take `&self`: a migration must not disturb the cache it reads
//! from. A lookup through [`RadixCache::match_prefix`] would count as a
//! query and a hit (skewing the hit ratio that operators watch), bump the
//! logical clock, reorder eviction and split edges.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

use super::node::NodeId;
use super::{RadixCache, common_prefix_len};

/// One cached run of key elements and the slots holding their K/V, as
/// exported by [`RadixCache::hottest_spans`].
///
/// Spans come parent before child: the first `prefix_len` elements of
/// `key` are exactly the `key` of a span listed earlier in the same
/// namespace, so a receiver that imports spans in order always finds a
/// span's prefix already in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedSpan<K> {
    /// The namespace the span is cached under.
    pub namespace: String,
    /// The full key from the namespace root to the end of this span.
    pub key: Vec<K>,
    /// Elements of `key` before this span; they belong to spans listed
    /// earlier.
    pub prefix_len: usize,
    /// The span's own slots, one per element of `key[prefix_len..]` (empty
    /// in an index-only cache).
    pub slots: Vec<u32>,
}

impl<K> CachedSpan<K> {
    /// Elements this span adds beyond its prefix.
    pub fn len(&self) -> usize {
        self.key.len().saturating_sub(self.prefix_len)
    }

    /// Whether the span adds nothing (never true for exported spans).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Heap order: more hits first, then more recent use, then the lower id
/// (so equal nodes come out in a deterministic order).
type Hotness = (u64, u64, Reverse<NodeId>);

impl<K: Copy + Eq + Hash> RadixCache<K> {
    /// The hottest cached spans, about `max_tokens` elements in all, to
    /// carry to a replacement worker.
    ///
    /// Nodes are taken greedily by hits, then by last use, starting from
    /// the first node under each namespace root; a child becomes a
    /// candidate only once its whole parent is taken, so every prefix of an
    /// exported span is exported earlier (a span whose prefix is missing is
    /// useless to the receiver: a prefix match can never reach it). Hits
    /// suit this because a node is touched whenever any request passes
    /// through it, so shared prefixes score highest. A node that does not
    /// fit the remaining budget is cut to whole pages, and its children are
    /// then left out. Long edges come as several spans of at most
    /// `max_span_tokens` elements (rounded down to whole pages, at least
    /// one page), so a receiver can copy them a bounded piece at a time.
    ///
    /// Changes nothing: no counter, clock, split or eviction order moves.
    /// Costs O(selected nodes × log candidates) plus the copied keys.
    pub fn hottest_spans(&self, max_tokens: usize, max_span_tokens: usize) -> Vec<CachedSpan<K>> {
        let page = self.page_size;
        let piece = (max_span_tokens / page * page).max(page);
        let mut heap: BinaryHeap<(Hotness, NodeId)> = BinaryHeap::new();
        // Full key from the namespace root to the end of each taken node.
        let mut full_keys: HashMap<NodeId, Vec<K>> = HashMap::new();
        let mut namespace_of_node: HashMap<NodeId, &str> = HashMap::new();
        for (name, &root) in &self.namespaces {
            for child in self.arena[root].children.ids() {
                namespace_of_node.insert(child, name);
                heap.push((self.hotness(child), child));
            }
            full_keys.insert(root, Vec::new());
        }
        let mut spans = Vec::new();
        let mut total = 0;
        while let Some((_, id)) = heap.pop() {
            let remaining = max_tokens.saturating_sub(total) / page * page;
            if remaining == 0 {
                break;
            }
            let node = &self.arena[id];
            let Some(namespace) = namespace_of_node.get(&id).copied() else {
                continue;
            };
            let Some(parent_key) = full_keys.get(&node.parent) else {
                continue;
            };
            let take = node.key.len().min(remaining);
            let mut key = parent_key.clone();
            key.reserve(take);
            let mut start = 0;
            while start < take {
                let end = (start + piece).min(take);
                let prefix_len = key.len();
                key.extend_from_slice(&node.key[start..end]);
                spans.push(CachedSpan {
                    namespace: namespace.to_string(),
                    key: key.clone(),
                    prefix_len,
                    slots: node.slots.get(start..end).unwrap_or_default().to_vec(),
                });
                start = end;
            }
            total += take;
            if take == node.key.len() {
                for child in node.children.ids() {
                    namespace_of_node.insert(child, namespace);
                    heap.push((self.hotness(child), child));
                }
                full_keys.insert(id, key);
            }
        }
        spans
    }

    /// How many leading elements of `key` are cached in `namespace` (whole
    /// pages), and their slots, without marking anything used.
    ///
    /// Unlike [`Self::match_prefix`] this is not a query: it moves no
    /// counter, clock or eviction order and splits no edge, so it can check
    /// cache contents for bookkeeping (an import validating that a span's
    /// prefix is in place, an export re-checking that a span survived)
    /// without those checks showing up in the hit ratio. Nothing is locked
    /// either: use the slots before the next eviction.
    pub fn cached_prefix(&self, namespace: &str, key: &[K]) -> (usize, Vec<u32>) {
        let Some(&root) = self.namespaces.get(namespace) else {
            return (0, Vec::new());
        };
        let page = self.page_size;
        let (mut node, mut pos) = (root, 0);
        let mut slots = Vec::new();
        while key.len() - pos >= page {
            let Some(child) = self.child(node, &key[pos..pos + page]) else {
                break;
            };
            let edge = &self.arena[child];
            let common = common_prefix_len(&edge.key, &key[pos..]) / page * page;
            slots.extend_from_slice(edge.slots.get(..common).unwrap_or_default());
            pos += common;
            if common < edge.key.len() {
                break;
            }
            node = child;
        }
        (pos, slots)
    }

    fn hotness(&self, id: NodeId) -> Hotness {
        let node = &self.arena[id];
        (node.hits, node.last_access, Reverse(id))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::{CacheConfig, EvictionPolicy};

    fn paged(page_size: usize) -> RadixCache<u32> {
        RadixCache::new(CacheConfig {
            policy: EvictionPolicy::Lru,
            page_size,
        })
    }

    #[test]
    fn the_most_used_branch_comes_first_and_parents_before_children() {
        let mut cache = paged(1);
        cache.insert("", &[1, 2, 3, 4], &[10, 11, 12, 13]);
        cache.insert("", &[1, 2, 7, 8], &[10, 11, 17, 18]);
        cache.insert("", &[9, 9], &[20, 21]);
        for _ in 0..3 {
            cache.match_prefix("", &[1, 2, 7, 8]);
        }
        let spans = cache.hottest_spans(100, 100);
        let keys: Vec<(&[u32], usize, &[u32])> = spans
            .iter()
            .map(|s| (s.key.as_slice(), s.prefix_len, s.slots.as_slice()))
            .collect();
        assert_eq!(
            keys,
            vec![
                (&[1, 2][..], 0, &[10, 11][..]),
                (&[1, 2, 7, 8][..], 2, &[17, 18][..]),
                // Both used once: the more recent goes first.
                (&[9, 9][..], 0, &[20, 21][..]),
                (&[1, 2, 3, 4][..], 2, &[12, 13][..]),
            ]
        );
    }

    #[test]
    fn the_budget_cuts_a_node_to_whole_pages_and_drops_its_children() {
        let mut cache = paged(2);
        cache.insert("a", &[1, 2, 3, 4, 5, 6], &[0, 1, 2, 3, 4, 5]);
        cache.insert("a", &[1, 2, 3, 4, 5, 6, 7, 8], &[0, 1, 2, 3, 4, 5, 6, 7]);
        // The root edge holds 6 elements; a budget of 5 takes 4 of them.
        let spans = cache.hottest_spans(5, 100);
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].key, vec![1, 2, 3, 4]);
        assert_eq!(spans[0].slots, vec![0, 1, 2, 3]);
        assert!(cache.hottest_spans(1, 100).is_empty(), "less than a page");
        assert!(cache.hottest_spans(0, 100).is_empty());
    }

    #[test]
    fn long_edges_come_in_pieces_of_whole_pages() {
        let mut cache = paged(4);
        let key: Vec<u32> = (0..20).collect();
        let slots: Vec<u32> = (100..120).collect();
        cache.insert("", &key, &slots);
        // 10 rounds down to 8; 1 rounds up to one page.
        let spans = cache.hottest_spans(100, 10);
        let shape: Vec<(usize, usize)> = spans.iter().map(|s| (s.prefix_len, s.len())).collect();
        assert_eq!(shape, vec![(0, 8), (8, 8), (16, 4)]);
        assert_eq!(spans[2].key, key);
        assert_eq!(spans[2].slots, slots[16..].to_vec());
        assert_eq!(cache.hottest_spans(100, 1).len(), 5);
    }

    #[test]
    fn cached_prefix_reads_without_counting_or_splitting() {
        let mut cache = paged(2);
        cache.insert("n", &[1, 2, 3, 4], &[10, 11, 12, 13]);
        let before = cache.stats();
        assert_eq!(cache.cached_prefix("n", &[1, 2, 3, 9]), (2, vec![10, 11]));
        assert_eq!(cache.cached_prefix("n", &[1, 2, 3]), (2, vec![10, 11]));
        assert_eq!(
            cache.cached_prefix("n", &[1, 2, 3, 4, 5, 6]),
            (4, vec![10, 11, 12, 13])
        );
        assert_eq!(cache.cached_prefix("other", &[1, 2]), (0, vec![]));
        assert_eq!(cache.stats(), before, "no query, hit or split counted");
        cache.check_invariants().unwrap();
    }

    /// A random workload of inserts and matches over a small alphabet, so
    /// keys share prefixes and edges split.
    fn workload() -> impl Strategy<Value = (usize, Vec<(bool, u8, Vec<u32>)>)> {
        let op = (any::<bool>(), 0u8..2, prop::collection::vec(0u32..3, 1..24));
        (1usize..4, prop::collection::vec(op, 1..40))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn exported_spans_are_prefix_closed_within_budget_and_change_nothing(
            (page, ops) in workload(),
            max_tokens in 0usize..120,
            max_span in 0usize..12,
        ) {
            let mut cache = paged(page);
            let mut next_slot = 0u32;
            for (is_insert, ns, key) in &ops {
                let ns = if *ns == 0 { "a" } else { "b" };
                if *is_insert {
                    let slots: Vec<u32> = (next_slot..next_slot + key.len() as u32).collect();
                    next_slot += key.len() as u32;
                    cache.insert(ns, key, &slots);
                } else {
                    cache.match_prefix(ns, key);
                }
            }
            let mut untouched = cache.clone();
            let stats = cache.stats();
            let spans = cache.hottest_spans(max_tokens, max_span);
            prop_assert_eq!(cache.stats(), stats);
            let piece = (max_span / page * page).max(page);
            let mut total = 0;
            for (i, span) in spans.iter().enumerate() {
                prop_assert!(!span.is_empty());
                prop_assert!(span.len() <= piece);
                prop_assert_eq!(span.len() % page, 0);
                prop_assert_eq!(span.slots.len(), span.len());
                if span.prefix_len > 0 {
                    let prefix = &span.key[..span.prefix_len];
                    prop_assert!(
                        spans[..i]
                            .iter()
                            .any(|s| s.namespace == span.namespace && s.key == prefix),
                        "span {} has no earlier span for its prefix", i
                    );
                }
                let (len, slots) = cache.cached_prefix(&span.namespace, &span.key);
                prop_assert_eq!(len, span.key.len());
                prop_assert_eq!(&slots[span.prefix_len..], span.slots.as_slice());
                total += span.len();
            }
            prop_assert!(total <= max_tokens);
            if max_tokens >= cache.total_tokens() {
                prop_assert_eq!(total, cache.total_tokens(), "everything fits");
            }
            // Same eviction order as a copy that was never exported from.
            prop_assert_eq!(cache.evict(usize::MAX), untouched.evict(usize::MAX));
            cache.check_invariants().unwrap();
        }
    }
}
