//! Tree nodes, their child maps, and the arena that owns them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// Index of a node in the arena.
pub(crate) type NodeId = u32;

/// The global root: parent of every namespace root, never freed.
pub(crate) const ROOT: NodeId = 0;

/// "No node": the parent of the global root and of freed nodes.
pub(crate) const NIL: NodeId = u32::MAX;

/// Position of an evictable leaf in the eviction index; smaller goes first.
pub(crate) type Priority = (u64, u64);

/// One edge of the radix tree and the node it leads to.
#[derive(Clone, Debug)]
pub(crate) struct Node<K> {
    /// The key elements on the edge from the parent to this node.
    pub(crate) key: Vec<K>,
    /// One KV slot per key element (empty in index-only caches).
    pub(crate) slots: Vec<u32>,
    pub(crate) parent: NodeId,
    pub(crate) children: Children,
    /// Locks held on this node or any descendant.
    pub(crate) lock: u32,
    /// Bumped when the node is freed, so stale handles are recognised.
    pub(crate) generation: u32,
    pub(crate) last_access: u64,
    pub(crate) hits: u64,
    pub(crate) created: u64,
    /// The key this node has in the eviction index, if it is there.
    pub(crate) indexed: Option<Priority>,
}

impl<K> Node<K> {
    fn empty(parent: NodeId, tick: u64) -> Self {
        Self {
            key: Vec::new(),
            slots: Vec::new(),
            parent,
            children: Children::default(),
            lock: 0,
            generation: 0,
            last_access: tick,
            hits: 0,
            created: tick,
            indexed: None,
        }
    }

    /// Whether the node is in use (the root, or attached to a parent).
    pub(crate) fn is_live(&self, id: NodeId) -> bool {
        id == ROOT || self.parent != NIL
    }
}

/// Children keyed by the hash of their first page. Most nodes have none or
/// a few, so those live in a short vector; busy nodes switch to a map.
#[derive(Clone, Debug)]
pub(crate) enum Children {
    Few(Vec<(u64, NodeId)>),
    Many(HashMap<u64, NodeId, BuildHasherDefault<PremixedHasher>>),
}

/// Above this many children, a node switches to a hash map.
const FEW_LIMIT: usize = 8;

impl Default for Children {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

impl Children {
    pub(crate) fn get(&self, hash: u64) -> Option<NodeId> {
        match self {
            Self::Few(entries) => entries.iter().find(|e| e.0 == hash).map(|e| e.1),
            Self::Many(map) => map.get(&hash).copied(),
        }
    }

    /// Adds a child; the caller has checked that `hash` is not taken.
    pub(crate) fn insert(&mut self, hash: u64, id: NodeId) {
        match self {
            Self::Few(entries) if entries.len() < FEW_LIMIT => entries.push((hash, id)),
            Self::Few(entries) => {
                let mut map: HashMap<_, _, _> = entries.drain(..).collect();
                map.insert(hash, id);
                *self = Self::Many(map);
            }
            Self::Many(map) => {
                map.insert(hash, id);
            }
        }
    }

    /// Points an existing entry at another node (used by splits).
    pub(crate) fn replace(&mut self, hash: u64, id: NodeId) {
        match self {
            Self::Few(entries) => {
                if let Some(entry) = entries.iter_mut().find(|e| e.0 == hash) {
                    entry.1 = id;
                }
            }
            Self::Many(map) => {
                map.insert(hash, id);
            }
        }
    }

    pub(crate) fn remove(&mut self, hash: u64) {
        match self {
            Self::Few(entries) => entries.retain(|e| e.0 != hash),
            Self::Many(map) => {
                map.remove(&hash);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Few(entries) => entries.len(),
            Self::Many(map) => map.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The child ids, in no particular order.
    pub(crate) fn ids(&self) -> Vec<NodeId> {
        match self {
            Self::Few(entries) => entries.iter().map(|e| e.1).collect(),
            Self::Many(map) => map.values().copied().collect(),
        }
    }
}

/// Hashes a page of key elements (FxHash-style, then folded so the low
/// bits that pick a hash-map bucket depend on every input bit).
pub(crate) fn page_hash<K: Hash>(page: &[K]) -> u64 {
    let mut hasher = FxHasher(0);
    for element in page {
        element.hash(&mut hasher);
    }
    hasher.0.rotate_left(26)
}

const FX_SEED: u64 = 0xf135_7aea_2e62_a9c5;

/// FxHash: one multiply per word. Good enough for child lookup because a
/// hash hit is always confirmed by comparing the page itself.
struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0 ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

/// Hasher for keys that are already hashes: passes them through.
#[derive(Default)]
pub(crate) struct PremixedHasher(u64);

impl Hasher for PremixedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
}

/// Nodes in one vector, with a free list so ids are reused.
#[derive(Clone, Debug)]
pub(crate) struct Arena<K> {
    nodes: Vec<Node<K>>,
    free: Vec<NodeId>,
}

impl<K> Arena<K> {
    /// An arena holding only the global root.
    pub(crate) fn new() -> Self {
        Self {
            nodes: vec![Node::empty(NIL, 0)],
            free: Vec::new(),
        }
    }

    /// A fresh empty node under `parent`, reusing a freed id when possible.
    pub(crate) fn alloc(&mut self, parent: NodeId, tick: u64) -> NodeId {
        if let Some(id) = self.free.pop() {
            let node = &mut self.nodes[id as usize];
            let generation = node.generation;
            *node = Node::empty(parent, tick);
            node.generation = generation;
            return id;
        }
        let id = NodeId::try_from(self.nodes.len()).unwrap_or(NIL);
        // u32::MAX - 1 nodes would need far more memory than any host has.
        assert!(id != NIL, "radix cache arena is full");
        self.nodes.push(Node::empty(parent, tick));
        id
    }

    /// Drops a node's data and makes its id reusable; handles to it go stale.
    pub(crate) fn release(&mut self, id: NodeId) {
        let node = &mut self.nodes[id as usize];
        node.key = Vec::new();
        node.slots = Vec::new();
        node.children = Children::default();
        node.parent = NIL;
        node.lock = 0;
        node.indexed = None;
        node.generation = node.generation.wrapping_add(1);
        self.free.push(id);
    }

    /// Live nodes, the global root included.
    pub(crate) fn live(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Every id ever allocated, live or freed.
    pub(crate) fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len()).map(|i| i as NodeId)
    }
}

impl<K> std::ops::Index<NodeId> for Arena<K> {
    type Output = Node<K>;
    fn index(&self, id: NodeId) -> &Node<K> {
        &self.nodes[id as usize]
    }
}

impl<K> std::ops::IndexMut<NodeId> for Arena<K> {
    fn index_mut(&mut self, id: NodeId) -> &mut Node<K> {
        &mut self.nodes[id as usize]
    }
}

impl<K> Arena<K> {
    /// The node behind `id`, if `id` is in range (live or not).
    pub(crate) fn get(&self, id: NodeId) -> Option<&Node<K>> {
        self.nodes.get(id as usize)
    }
}
