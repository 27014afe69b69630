//! Requests with `n` > 1: which sequences are a request's choices, the
//! choices not started yet, and when the request is over.
//!
//! Choice 0 runs first; when its prompt is computed (its first token) the
//! other choices start with the same prompt, which the radix cache then
//! holds, so the prompt is computed once. Choice 0's sequence id is the
//! request's rid; the others get ids of their own.

use std::collections::HashMap;
use std::time::Instant;

use zinfer_protocol::GenerateRequest;

use super::valid::OutputPlan;
use crate::constraint::CompiledConstraint;

/// What starting one more choice needs.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) request: GenerateRequest,
    pub(super) prompt: Vec<u32>,
    pub(super) arrival: Instant,
    pub(super) output: OutputPlan,
    /// One per choice still to start, when the request is constrained.
    pub(super) constraints: Vec<CompiledConstraint>,
    /// The seed choice `i` mixes with `i`.
    pub(super) seed: u64,
}

/// The choices of one request.
#[derive(Debug)]
struct Entry {
    /// Choices not yet ended.
    left: u32,
    /// Sequence ids of the choices started and not ended.
    ids: Vec<u64>,
    pending: Option<Box<Pending>>,
}

/// Every multi-choice request in the engine, by rid.
#[derive(Debug, Default)]
pub(super) struct Choices {
    entries: HashMap<u64, Entry>,
    /// The next id handed to a choice past the first: far above the
    /// router's rids, which count up from 1.
    next_id: u64,
}

impl Choices {
    /// Registers request `rid` of `n` choices, choice 0 running as `rid`.
    pub(super) fn add(&mut self, rid: u64, n: u32, pending: Pending) {
        self.entries.insert(
            rid,
            Entry {
                left: n,
                ids: vec![rid],
                pending: Some(Box::new(pending)),
            },
        );
    }

    /// The choices still to start once choice 0 has its first token.
    pub(super) fn take_pending(&mut self, rid: u64) -> Option<Box<Pending>> {
        self.entries.get_mut(&rid)?.pending.take()
    }

    /// A fresh sequence id for a choice of `rid`, not `in_use`.
    pub(super) fn new_id(&mut self, rid: u64, in_use: impl Fn(u64) -> bool) -> u64 {
        if self.next_id == 0 {
            self.next_id = 1 << 62;
        }
        while in_use(self.next_id) {
            self.next_id += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Some(entry) = self.entries.get_mut(&rid) {
            entry.ids.push(id);
        }
        id
    }

    /// The running sequences of request `rid` (just `rid` for one choice).
    pub(super) fn ids(&self, rid: u64) -> Vec<u64> {
        self.entries
            .get(&rid)
            .map_or_else(|| vec![rid], |entry| entry.ids.clone())
    }

    /// Sequence `id` of `rid` ended. Returns the choices that were never
    /// started (they end with it, when choice 0 ends before its first
    /// token) and whether the request is now over.
    pub(super) fn ended(&mut self, rid: u64, id: u64) -> (Option<Box<Pending>>, bool) {
        let Some(entry) = self.entries.get_mut(&rid) else {
            return (None, true);
        };
        entry.ids.retain(|&other| other != id);
        entry.left = entry.left.saturating_sub(1);
        let pending = entry.pending.take();
        if let Some(pending) = &pending {
            let unstarted = pending.request.n.saturating_sub(1);
            entry.left = entry.left.saturating_sub(unstarted);
        }
        let over = entry.left == 0;
        if over {
            self.entries.remove(&rid);
        }
        (pending, over)
    }

    /// Forgets request `rid` (it failed): its sequence ids.
    pub(super) fn remove(&mut self, rid: u64) -> Vec<u64> {
        self.entries
            .remove(&rid)
            .map_or_else(|| vec![rid], |entry| entry.ids)
    }
}

/// The sampling seed of choice `index`: the request's own for choice 0,
/// a well-mixed one (splitmix64) for the others.
pub(super) fn choice_seed(seed: u64, index: u32) -> u64 {
    if index == 0 {
        return seed;
    }
    let mut x = seed.wrapping_add(u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(n: u32) -> Pending {
        Pending {
            request: GenerateRequest {
                n,
                ..GenerateRequest::from_prompt("c", "x")
            },
            prompt: vec![1],
            arrival: Instant::now(),
            output: OutputPlan {
                tools: None,
                thinking: zinfer_text::tools::Thinking::Off,
                markers: Vec::new(),
            },
            constraints: Vec::new(),
            seed: 7,
        }
    }

    #[test]
    fn a_request_is_over_when_its_last_choice_ends() {
        let mut choices = Choices::default();
        choices.add(5, 3, pending(3));
        assert!(choices.take_pending(5).is_some());
        let a = choices.new_id(5, |_| false);
        let b = choices.new_id(5, |id| id == a + 1);
        assert_eq!(b, a + 2, "ids in use are skipped");
        assert_eq!(choices.ids(5), vec![5, a, b]);
        assert!(!choices.ended(5, a).1);
        assert!(!choices.ended(5, 5).1);
        assert!(choices.ended(5, b).1);
        assert_eq!(choices.ids(5), vec![5], "forgotten once over");
    }

    #[test]
    fn choices_never_started_end_with_choice_zero() {
        let mut choices = Choices::default();
        choices.add(9, 4, pending(4));
        let (unstarted, over) = choices.ended(9, 9);
        assert_eq!(unstarted.map(|p| p.request.n), Some(4));
        assert!(over);
    }

    #[test]
    fn choice_zero_keeps_the_seed_and_the_others_differ() {
        assert_eq!(choice_seed(42, 0), 42);
        let seeds: std::collections::HashSet<u64> = (0..16).map(|i| choice_seed(42, i)).collect();
        assert_eq!(seeds.len(), 16);
    }
}
