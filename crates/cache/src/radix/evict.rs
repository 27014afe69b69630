//! Eviction: the ordered index of unlocked leaves, and removing nodes.

use std::hash::Hash;

use super::RadixCache;
use super::node::{NodeId, Priority, ROOT, page_hash};
use crate::config::EvictionPolicy;

impl<K: Copy + Eq + Hash> RadixCache<K> {
    /// Frees at least `n_tokens` cached elements (or every evictable one if
    /// there are fewer), taking unlocked leaves in policy order; a parent
    /// whose last child goes becomes a leaf and a candidate in turn. Whole
    /// nodes go, so slightly more than asked may be freed. Returns the freed
    /// slots, which the caller gives back to its pool.
    pub fn evict(&mut self, n_tokens: usize) -> Vec<u32> {
        let mut freed = Vec::new();
        let mut evicted = 0;
        while evicted < n_tokens {
            let Some((_, id)) = self.index.pop_first() else {
                break;
            };
            self.arena[id].indexed = None;
            let parent = self.arena[id].parent;
            self.detach(id);
            evicted += self.release_node(id, &mut freed);
            if self.arena[parent].parent == ROOT {
                self.drop_namespace_if_empty(parent);
            } else {
                self.refresh_index(parent);
            }
        }
        self.counters.evicted += evicted as u64;
        freed
    }

    /// Removes every unlocked entry of `namespace` and returns their slots.
    /// Locked paths stay, so running requests keep their prefix.
    pub fn clear(&mut self, namespace: &str) -> Vec<u32> {
        let Some(&root) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        let mut freed = Vec::new();
        let mut stack = self.arena[root].children.ids();
        while let Some(id) = stack.pop() {
            if self.arena[id].lock > 0 {
                stack.extend(self.arena[id].children.ids());
                continue;
            }
            // Nothing below an unlocked node is locked: it all goes.
            self.detach(id);
            self.counters.evicted += self.release_subtree_into(id, &mut freed) as u64;
        }
        self.drop_namespace_if_empty(root);
        freed
    }

    /// [`Self::clear`] for every namespace.
    pub fn clear_all(&mut self) -> Vec<u32> {
        let names: Vec<Box<str>> = self.namespaces.keys().cloned().collect();
        let mut freed = Vec::new();
        for name in names {
            freed.extend(self.clear(&name));
        }
        freed
    }

    /// Puts the node in the eviction index, moves it, or takes it out, to
    /// match its current state: only unlocked leaves holding elements are
    /// in, at their policy priority. Call after any change to the node's
    /// lock, children or use.
    pub(super) fn refresh_index(&mut self, id: NodeId) {
        let node = &self.arena[id];
        let want =
            (node.lock == 0 && node.children.is_empty() && id != ROOT && node.parent != ROOT)
                .then(|| self.priority(id));
        let had = node.indexed;
        if had != want {
            if let Some(old) = had {
                self.index.remove(&(old, id));
            }
            if let Some(new) = want {
                self.index.insert((new, id));
            }
            self.arena[id].indexed = want;
        }
    }

    pub(super) fn priority(&self, id: NodeId) -> Priority {
        let node = &self.arena[id];
        match self.policy {
            EvictionPolicy::Lru => (node.last_access, 0),
            EvictionPolicy::Lfu => (node.hits, node.last_access),
            EvictionPolicy::Fifo => (node.created, 0),
        }
    }

    /// Unhooks a node from its parent's child map.
    fn detach(&mut self, id: NodeId) {
        let node = &self.arena[id];
        let hash = page_hash(&node.key[..self.page_size]);
        let parent = node.parent;
        self.arena[parent].children.remove(hash);
    }

    /// Frees a detached, unlocked subtree of element-holding nodes,
    /// appending its slots to `freed`. Returns how many elements it held.
    fn release_subtree_into(&mut self, id: NodeId, freed: &mut Vec<u32>) -> usize {
        let mut removed = 0;
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            stack.extend(self.arena[id].children.ids());
            removed += self.release_node(id, freed);
        }
        removed
    }

    /// Frees one unlocked node whose children are already gone or being
    /// freed, appending its slots to `freed`. Returns its element count.
    fn release_node(&mut self, id: NodeId, freed: &mut Vec<u32>) -> usize {
        if let Some(priority) = self.arena[id].indexed {
            self.index.remove(&(priority, id));
        }
        let node = &self.arena[id];
        let len = node.key.len();
        freed.extend_from_slice(&node.slots);
        self.arena.release(id);
        self.nodes -= 1;
        self.evictable -= len;
        len
    }
}
