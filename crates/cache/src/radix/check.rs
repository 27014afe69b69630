//! Whole-tree consistency checks, for tests and debugging (O(tree size)).

use std::hash::Hash;

use super::node::{NIL, NodeId, ROOT, page_hash};
use super::{CacheError, RadixCache};

impl<K: Copy + Eq + Hash> RadixCache<K> {
    /// Every slot held by the tree, in no particular order.
    pub fn cached_slots(&self) -> Vec<u32> {
        let mut slots = Vec::with_capacity(self.total_tokens());
        for &root in self.namespaces.values() {
            let mut stack = self.arena[root].children.ids();
            while let Some(id) = stack.pop() {
                slots.extend_from_slice(&self.arena[id].slots);
                stack.extend(self.arena[id].children.ids());
            }
        }
        slots
    }

    /// Walks the whole tree and checks every structural invariant and
    /// incrementally kept count. Costs O(nodes); meant for tests and for
    /// debugging a suspected corruption, not for the hot path.
    pub fn check_invariants(&self) -> Result<(), CacheError> {
        let fail = |what: String| Err(CacheError::Inconsistent(what));
        let (mut evictable, mut protected, mut nodes, mut indexed, mut live) = (0, 0, 0, 0, 1);
        let mut root_locks = 0;
        for (name, &root) in &self.namespaces {
            if self.namespace_of.get(&root) != Some(name) || self.arena[root].parent != ROOT {
                return fail(format!("namespace {name:?} root {root} is not registered"));
            }
            if self.arena[root].lock == 0 && self.arena[root].children.is_empty() {
                return fail(format!("namespace {name:?} is empty but kept"));
            }
            root_locks += self.arena[root].lock;
            live += 1;
            let mut stack = vec![root];
            while let Some(id) = stack.pop() {
                let node = &self.arena[id];
                let mut child_locks = 0;
                for child in node.children.ids() {
                    let c = &self.arena[child];
                    let first = c.key.get(..self.page_size).unwrap_or_default();
                    if c.parent != id || first.len() != self.page_size {
                        return fail(format!("node {child} is badly linked under {id}"));
                    }
                    if node.children.get(page_hash(first)) != Some(child) {
                        return fail(format!("node {child} is filed under the wrong key"));
                    }
                    child_locks += c.lock;
                    stack.push(child);
                }
                if node.lock < child_locks {
                    return fail(format!("node {id} has fewer locks than its children"));
                }
                if id != root {
                    self.check_node(id)?;
                    nodes += 1;
                    live += 1;
                    if node.lock == 0 {
                        evictable += node.key.len();
                    } else {
                        protected += node.key.len();
                    }
                }
                indexed += usize::from(node.indexed.is_some());
            }
        }
        if self.arena[ROOT].lock < root_locks {
            return fail("the global root has fewer locks than the namespaces".into());
        }
        let counted = (evictable, protected, nodes, live, indexed);
        let kept = (
            self.evictable,
            self.protected,
            self.nodes,
            self.arena.live(),
            self.index.len(),
        );
        if counted != kept {
            return fail(format!(
                "(evictable, protected, nodes, live, indexed) counted {counted:?}, kept {kept:?}"
            ));
        }
        for id in self.arena.ids() {
            let node = &self.arena[id];
            if !node.is_live(id) && (node.parent != NIL || node.indexed.is_some()) {
                return fail(format!("freed node {id} still linked"));
            }
        }
        Ok(())
    }

    /// Checks one element-holding node's own fields.
    fn check_node(&self, id: NodeId) -> Result<(), CacheError> {
        let node = &self.arena[id];
        let fail = |what: &str| Err(CacheError::Inconsistent(format!("node {id}: {what}")));
        if node.key.is_empty() || !node.key.len().is_multiple_of(self.page_size) {
            return fail("edge is not a whole, non-zero number of pages");
        }
        let slots_expected = if self.store_slots { node.key.len() } else { 0 };
        if node.slots.len() != slots_expected {
            return fail("slot count does not match the edge");
        }
        let leaf = node.lock == 0 && node.children.is_empty();
        let want = leaf.then(|| self.priority(id));
        if node.indexed != want {
            return fail("eviction index entry does not match the node's state");
        }
        if let Some(priority) = node.indexed
            && !self.index.contains(&(priority, id))
        {
            return fail("missing from the eviction index");
        }
        Ok(())
    }
}
