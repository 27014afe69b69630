//! The RadixAttention prefix tree: which token prefixes have their KV in
//! the pool, and in which slots.
//!
//! Nodes live in an arena ([`node::Arena`]) and refer to each other by
//! index. Each namespace has its own root under one global root, so two
//! namespaces never share an entry. Unlocked leaves sit in an ordered index
//! keyed by the eviction policy, so eviction never scans the tree.

mod check;
mod evict;
mod export;
mod node;

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

use crate::config::{CacheConfig, EvictionPolicy};
pub use export::CachedSpan;
use node::{Arena, NIL, NodeId, Priority, ROOT, page_hash};

/// Refers to a node returned by a match or insert, to lock or unlock it.
///
/// A locked node's handle stays valid however the tree changes around it;
/// an unlocked node may be evicted, after which its handle is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeHandle {
    id: NodeId,
    generation: u32,
}

/// The longest cached prefix of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    /// How many leading key elements are cached (a whole number of pages).
    pub len: usize,
    /// Their KV slots, in order (empty in an index-only cache).
    pub slots: Vec<u32>,
    /// The node ending exactly at `len`: lock it while the slots are in use.
    pub node: NodeHandle,
}

/// What an insert kept and what it hands back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsertOutcome {
    /// How many leading key elements were already cached before the insert.
    pub already_cached: usize,
    /// Slots the cache did not take: the caller's copies of positions that
    /// were already cached under other slots, and in a paged cache the slots
    /// of a partial last page. The caller still owns them and should free
    /// them. Slots the caller got from a match are the cache's own and are
    /// never listed here.
    pub duplicate_slots: Vec<u32>,
    /// The node ending at the last stored element (for locking).
    pub node: NodeHandle,
}

/// Counters for metrics; token counts are key elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Elements looked up by `match_prefix`.
    pub queried_tokens: u64,
    /// Of those, elements found cached.
    pub hit_tokens: u64,
    /// Elements newly stored by `insert`.
    pub inserted_tokens: u64,
    /// Elements removed by `evict`, `clear` and `clear_all`.
    pub evicted_tokens: u64,
    /// Nodes holding at least one element.
    pub nodes: usize,
    /// Cached elements that no lock protects.
    pub evictable_tokens: usize,
    /// Cached elements on a locked path.
    pub protected_tokens: usize,
    /// Namespaces with at least one entry or lock.
    pub namespaces: usize,
}

impl CacheStats {
    /// Share of queried elements that were cached, 0 when nothing was queried.
    pub fn hit_ratio(&self) -> f64 {
        if self.queried_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.queried_tokens as f64
        }
    }
}

/// Misuse of a handle. The cache is unchanged when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// The node was evicted or cleared since the handle was made: lock a
    /// handle right after the match that returned it.
    #[error("stale node handle: the node was evicted; lock handles right after matching")]
    StaleHandle,
    /// More unlocks than locks on this node: unlock each lock exactly once.
    #[error("node is not locked; unlock each handle exactly once per lock")]
    NotLocked,
    /// An internal invariant does not hold (reported by `check_invariants`).
    #[error("radix cache inconsistent: {0}; this is a zinfer bug, please report it")]
    Inconsistent(String),
}

/// Prefix tree from keys (token ids, or bytes for a text index) to KV slots.
///
/// All work is in memory and deterministic: time is a logical clock that
/// advances once per match or insert.
#[derive(Clone, Debug)]
pub struct RadixCache<K> {
    arena: Arena<K>,
    /// Root node of each namespace that has entries or locks.
    namespaces: HashMap<Box<str>, NodeId>,
    /// The reverse of `namespaces`, to drop a namespace with its root.
    namespace_of: HashMap<NodeId, Box<str>>,
    /// Unlocked leaves ordered by eviction priority, first to go first.
    index: BTreeSet<(Priority, NodeId)>,
    policy: EvictionPolicy,
    page_size: usize,
    /// False for an index-only cache: slots are neither stored nor returned.
    store_slots: bool,
    tick: u64,
    evictable: usize,
    protected: usize,
    nodes: usize,
    counters: Counters,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    queried: u64,
    hit: u64,
    inserted: u64,
    evicted: u64,
}

impl<K: Copy + Eq + Hash> RadixCache<K> {
    /// An empty cache that stores a KV slot per key element.
    pub fn new(config: CacheConfig) -> Self {
        Self {
            arena: Arena::new(),
            namespaces: HashMap::new(),
            namespace_of: HashMap::new(),
            index: BTreeSet::new(),
            policy: config.policy,
            page_size: config.page_size.max(1),
            store_slots: true,
            tick: 0,
            evictable: 0,
            protected: 0,
            nodes: 0,
            counters: Counters::default(),
        }
    }

    /// An empty cache that remembers keys only, for an approximate index
    /// such as the router's view of each worker's cache: `insert` ignores
    /// its slots (pass `&[]`), matches return no slots and `evict` returns
    /// none, while every count still works.
    pub fn new_index_only(config: CacheConfig) -> Self {
        Self {
            store_slots: false,
            ..Self::new(config)
        }
    }

    /// The settings this cache was built with (page size 0 reads back as 1).
    pub fn config(&self) -> CacheConfig {
        CacheConfig {
            policy: self.policy,
            page_size: self.page_size,
        }
    }

    /// Finds the longest cached prefix of `key` in `namespace`, in whole
    /// pages, and marks it used. A match ending inside an edge splits it, so
    /// the returned node ends exactly at the match.
    pub fn match_prefix(&mut self, namespace: &str, key: &[K]) -> PrefixMatch {
        self.tick += 1;
        self.counters.queried += key.len() as u64;
        let Some(&root) = self.namespaces.get(namespace) else {
            return PrefixMatch {
                len: 0,
                slots: Vec::new(),
                node: self.handle(ROOT),
            };
        };
        let mut slots = Vec::new();
        let (node, len) = self.walk(root, key, &mut |node_slots, _| {
            slots.extend_from_slice(node_slots);
        });
        self.counters.hit += len as u64;
        PrefixMatch {
            len,
            slots,
            node: self.handle(node),
        }
    }

    /// Stores `key` with its `slots` (one per element) in `namespace`.
    ///
    /// The tree keeps the first copy of every position: where the key is
    /// already cached under other slots, the caller's slots come back in
    /// [`InsertOutcome::duplicate_slots`]. With a page size P only the first
    /// `len / P * P` elements are stored. If `slots` is shorter than `key`,
    /// only that many elements are stored; extra slots come back unused.
    pub fn insert(&mut self, namespace: &str, key: &[K], slots: &[u32]) -> InsertOutcome {
        self.tick += 1;
        let len = if self.store_slots {
            key.len().min(slots.len())
        } else {
            key.len()
        };
        let stored_len = len / self.page_size * self.page_size;
        let root = match self.namespaces.get(namespace) {
            Some(&root) => root,
            None if stored_len == 0 => {
                return InsertOutcome {
                    already_cached: 0,
                    duplicate_slots: self.unkept(slots, 0),
                    node: self.handle(ROOT),
                };
            }
            None => self.add_namespace(namespace),
        };
        let mut duplicates = Vec::new();
        let (mut node, already_cached) =
            self.walk(root, &key[..stored_len], &mut |tree_slots, pos| {
                let ours = slots.get(pos..pos + tree_slots.len()).unwrap_or_default();
                for (&theirs, &mine) in tree_slots.iter().zip(ours) {
                    if theirs != mine {
                        duplicates.push(mine);
                    }
                }
            });
        let mut kept_end = already_cached;
        if already_cached < stored_len {
            let range = already_cached..stored_len;
            let leaf_slots = slots.get(range.clone()).unwrap_or_default();
            if let Some(leaf) = self.add_leaf(node, &key[range], leaf_slots) {
                node = leaf;
                kept_end = stored_len;
                self.counters.inserted += (stored_len - already_cached) as u64;
            }
        }
        duplicates.extend(self.unkept(slots, kept_end));
        self.drop_namespace_if_empty(root);
        InsertOutcome {
            already_cached,
            duplicate_slots: duplicates,
            node: self.handle(node),
        }
    }

    /// Protects the node and every ancestor from eviction until a matching
    /// [`Self::unlock`]. Locks nest. A stale handle is ignored here; use
    /// [`Self::try_lock`] to be told.
    pub fn lock(&mut self, node: NodeHandle) {
        // Ignoring is safe: the later unlock of the same handle reports it.
        let _ = self.try_lock(node);
    }

    /// [`Self::lock`], reporting a stale handle instead of ignoring it.
    pub fn try_lock(&mut self, node: NodeHandle) -> Result<(), CacheError> {
        let mut id = self.resolve(node)?;
        while id != NIL {
            let n = &mut self.arena[id];
            n.lock += 1;
            if n.lock == 1 {
                let len = n.key.len();
                self.evictable -= len;
                self.protected += len;
                self.refresh_index(id);
            }
            id = self.arena[id].parent;
        }
        Ok(())
    }

    /// Releases one lock taken with [`Self::lock`]; once no lock covers a
    /// node it may be evicted again.
    pub fn unlock(&mut self, node: NodeHandle) -> Result<(), CacheError> {
        let mut id = self.resolve(node)?;
        if self.arena[id].lock == 0 {
            return Err(CacheError::NotLocked);
        }
        let mut namespace_root = None;
        while id != NIL {
            let n = &mut self.arena[id];
            n.lock -= 1;
            let parent = n.parent;
            if n.lock == 0 {
                let len = n.key.len();
                self.protected -= len;
                self.evictable += len;
                self.refresh_index(id);
            }
            if parent == ROOT {
                namespace_root = Some(id);
            }
            id = parent;
        }
        if let Some(root) = namespace_root {
            self.drop_namespace_if_empty(root);
        }
        Ok(())
    }

    /// Cached elements no lock protects (all of them can be evicted).
    pub fn evictable_tokens(&self) -> usize {
        self.evictable
    }

    /// Cached elements on locked paths.
    pub fn protected_tokens(&self) -> usize {
        self.protected
    }

    /// All cached elements.
    pub fn total_tokens(&self) -> usize {
        self.evictable + self.protected
    }

    /// Counters since creation, and the current sizes.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            queried_tokens: self.counters.queried,
            hit_tokens: self.counters.hit,
            inserted_tokens: self.counters.inserted,
            evicted_tokens: self.counters.evicted,
            nodes: self.nodes,
            evictable_tokens: self.evictable,
            protected_tokens: self.protected,
            namespaces: self.namespaces.len(),
        }
    }

    /// Follows `key` down from `root` in whole pages, splitting the last
    /// edge if the key ends or differs inside it, and marks every node on
    /// the way as used. Calls `visit(slots, position)` for each node passed.
    /// Returns the deepest node reached and the matched length.
    fn walk(
        &mut self,
        root: NodeId,
        key: &[K],
        visit: &mut dyn FnMut(&[u32], usize),
    ) -> (NodeId, usize) {
        let page = self.page_size;
        self.touch(root);
        let (mut node, mut pos) = (root, 0);
        while key.len() - pos >= page {
            let Some(child) = self.child(node, &key[pos..pos + page]) else {
                break;
            };
            let edge_len = self.arena[child].key.len();
            let common = common_prefix_len(&self.arena[child].key, &key[pos..]) / page * page;
            let next = if common < edge_len {
                self.split(child, common)
            } else {
                child
            };
            self.touch(next);
            visit(&self.arena[next].slots, pos);
            pos += common;
            node = next;
            if common < edge_len {
                break;
            }
        }
        (node, pos)
    }

    /// The child of `node` whose edge starts with `page`, if any.
    fn child(&self, node: NodeId, page: &[K]) -> Option<NodeId> {
        let child = self.arena[node].children.get(page_hash(page))?;
        // A hash hit is confirmed against the page itself.
        (self.arena[child].key.get(..page.len()) == Some(page)).then_some(child)
    }

    /// Splits `child`'s edge after `at` elements: a new node takes the first
    /// `at` and becomes `child`'s parent. `child` keeps its id, lock count
    /// and index entry, so handles to it stay valid. Returns the new node.
    fn split(&mut self, child: NodeId, at: usize) -> NodeId {
        let parent = self.arena[child].parent;
        let hash = page_hash(&self.arena[child].key[..self.page_size]);
        let upper = self.arena.alloc(parent, self.tick);
        let lower = &mut self.arena[child];
        let tail_key = lower.key.split_off(at);
        let mut head_key = std::mem::replace(&mut lower.key, tail_key);
        head_key.shrink_to_fit();
        let mut head_slots = Vec::new();
        if self.store_slots {
            let tail_slots = lower.slots.split_off(at);
            head_slots = std::mem::replace(&mut lower.slots, tail_slots);
            head_slots.shrink_to_fit();
        }
        lower.parent = upper;
        let (lock, last_access, hits, created) =
            (lower.lock, lower.last_access, lower.hits, lower.created);
        let lower_hash = page_hash(&lower.key[..self.page_size]);
        let u = &mut self.arena[upper];
        u.key = head_key;
        u.slots = head_slots;
        u.lock = lock;
        (u.last_access, u.hits, u.created) = (last_access, hits, created);
        u.children.insert(lower_hash, child);
        self.arena[parent].children.replace(hash, upper);
        self.nodes += 1;
        upper
    }

    /// Hangs a new unlocked leaf holding `key` and its `slots` under
    /// `parent`. Returns `None` when a
    /// sibling's first page hashes the same (the suffix is then not cached).
    fn add_leaf(&mut self, parent: NodeId, key: &[K], slots: &[u32]) -> Option<NodeId> {
        let hash = page_hash(&key[..self.page_size]);
        if self.arena[parent].children.get(hash).is_some() {
            return None;
        }
        let leaf = self.arena.alloc(parent, self.tick);
        let n = &mut self.arena[leaf];
        n.key = key.to_vec();
        if self.store_slots {
            n.slots = slots.to_vec();
        }
        self.arena[parent].children.insert(hash, leaf);
        self.touch(leaf);
        self.evictable += key.len();
        self.nodes += 1;
        self.refresh_index(leaf);
        self.refresh_index(parent);
        Some(leaf)
    }

    /// The caller's slots from `from` on, which the cache does not keep.
    fn unkept(&self, slots: &[u32], from: usize) -> Vec<u32> {
        if self.store_slots {
            slots.get(from..).unwrap_or_default().to_vec()
        } else {
            Vec::new()
        }
    }

    fn add_namespace(&mut self, namespace: &str) -> NodeId {
        let root = self.arena.alloc(ROOT, self.tick);
        self.namespaces.insert(namespace.into(), root);
        self.namespace_of.insert(root, namespace.into());
        root
    }

    /// Frees a namespace root that has neither entries nor locks.
    fn drop_namespace_if_empty(&mut self, root: NodeId) {
        let node = &self.arena[root];
        if node.lock == 0 && node.children.is_empty() {
            if let Some(name) = self.namespace_of.remove(&root) {
                self.namespaces.remove(&name);
            }
            self.arena.release(root);
        }
    }

    /// Marks a node as used now (for LRU and LFU).
    fn touch(&mut self, id: NodeId) {
        let node = &mut self.arena[id];
        node.last_access = self.tick;
        node.hits += 1;
        if node.indexed.is_some() {
            self.refresh_index(id);
        }
    }

    fn handle(&self, id: NodeId) -> NodeHandle {
        NodeHandle {
            id,
            generation: self.arena[id].generation,
        }
    }

    fn resolve(&self, handle: NodeHandle) -> Result<NodeId, CacheError> {
        match self.arena.get(handle.id) {
            Some(node) if node.generation == handle.generation && node.is_live(handle.id) => {
                Ok(handle.id)
            }
            _ => Err(CacheError::StaleHandle),
        }
    }
}

/// Length of the common prefix of `a` and `b`. Compares in blocks first,
/// which the compiler turns into wide compares for integer keys.
fn common_prefix_len<K: Eq>(a: &[K], b: &[K]) -> usize {
    const BLOCK: usize = 32;
    let max = a.len().min(b.len());
    let mut i = 0;
    while i + BLOCK <= max && a[i..i + BLOCK] == b[i..i + BLOCK] {
        i += BLOCK;
    }
    while i < max && a[i] == b[i] {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests;
