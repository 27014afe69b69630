//! A draft model for speculative decoding (`--draft-model`): a smaller
//! model with the same tokenizer proposes the next tokens greedily, and the
//! target model checks them in one pass as it checks prompt-lookup drafts.
//!
//! The draft model has its own KV pool. Each sequence it drafts for keeps
//! the tokens whose K/V it holds; the next time, the longest prefix they
//! share with the sequence's tokens is kept and only the rest is fed, so a
//! rejected draft costs nothing to undo and an accepted one is not fed
//! again.

use std::collections::HashMap;

use zinfer_cache::TokenPool;
use zinfer_model::{ChunkOutput, ForwardModel, ModelError, SeqChunk, StepBatch};

use crate::sampling::argmax;

/// What a sequence asks the draft model for.
#[derive(Debug, Clone, Copy)]
pub(super) struct DraftWant<'a> {
    /// Sequence id.
    pub(super) id: u64,
    /// The sequence's tokens so far (prompt, then output).
    pub(super) tokens: &'a [u32],
    /// Most tokens to draft.
    pub(super) max: usize,
}

/// One sequence's state in the draft model.
#[derive(Debug, Default)]
struct DraftSeq {
    /// Tokens with K/V in the draft pool, from position 0.
    tokens: Vec<u32>,
    /// Their slots.
    slots: Vec<u32>,
}

/// The draft model, its KV pool and the sequences it drafts for.
pub(super) struct DraftModel {
    model: Box<dyn ForwardModel + Send>,
    pool: TokenPool,
    seqs: HashMap<u64, DraftSeq>,
    batch: StepBatch,
}

impl DraftModel {
    pub(super) fn new(model: Box<dyn ForwardModel + Send>) -> Self {
        let pool = TokenPool::new(model.kv_capacity());
        DraftModel {
            model,
            pool,
            seqs: HashMap::new(),
            batch: StepBatch::new(),
        }
    }

    /// Drafts greedily for each want, all sequences batched in each of up
    /// to `max` forward passes; returns the drafts in `wants` order (empty
    /// where the draft model had no room).
    pub(super) fn propose(&mut self, wants: &[DraftWant<'_>]) -> Result<Vec<Vec<u32>>, ModelError> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); wants.len()];
        // What each sequence feeds next: first what the draft model lacks
        // of its tokens, then each drafted token.
        let mut feeds: Vec<Option<Vec<u32>>> =
            wants.iter().map(|want| self.catch_up(want)).collect();
        let rounds = wants.iter().map(|want| want.max).max().unwrap_or(0);
        for _ in 0..rounds {
            self.batch.clear();
            let mut fed = Vec::new();
            for (index, feed) in feeds.iter_mut().enumerate() {
                let Some(tokens) = feed.take() else {
                    continue;
                };
                let id = wants[index].id;
                let Ok(slots) = self.pool.alloc(tokens.len()) else {
                    self.forget(id);
                    continue;
                };
                let Some(seq) = self.seqs.get_mut(&id) else {
                    self.free(&slots);
                    continue;
                };
                let start_pos = seq.slots.len();
                seq.slots.extend(slots);
                self.batch.push(&SeqChunk {
                    tokens: &tokens,
                    slots: &seq.slots,
                    start_pos,
                    output: ChunkOutput::LastLogits,
                });
                seq.tokens.extend_from_slice(&tokens);
                fed.push(index);
            }
            if fed.is_empty() {
                break;
            }
            let rows = match self.model.forward_batch(&self.batch) {
                Ok(rows) => rows,
                Err(error) => {
                    // The K/V of this pass may be half written: start over.
                    for &index in &fed {
                        self.forget(wants[index].id);
                    }
                    return Err(error);
                }
            };
            for (&index, row) in fed.iter().zip(&rows) {
                let Some(token) = argmax(row) else {
                    continue;
                };
                drafts[index].push(token);
                if drafts[index].len() < wants[index].max {
                    feeds[index] = Some(vec![token]);
                }
            }
        }
        Ok(drafts)
    }

    /// Keeps the K/V the draft model already has for `want`'s tokens and
    /// returns the tokens it must still feed (at least the newest); None
    /// when the sequence does not fit the draft model.
    fn catch_up(&mut self, want: &DraftWant<'_>) -> Option<Vec<u32>> {
        if want.max == 0
            || want.tokens.is_empty()
            || want.tokens.len() + want.max > self.model.max_positions()
        {
            return None;
        }
        let seq = self.seqs.entry(want.id).or_default();
        let shared = seq
            .tokens
            .iter()
            .zip(want.tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(want.tokens.len() - 1);
        seq.tokens.truncate(shared);
        let stale = seq.slots.split_off(shared);
        self.free(&stale);
        Some(want.tokens[shared..].to_vec())
    }

    /// Drops a sequence's K/V (it ended, or its state is unusable).
    pub(super) fn forget(&mut self, id: u64) {
        if let Some(seq) = self.seqs.remove(&id) {
            self.free(&seq.slots);
        }
    }

    /// Returns slots to the pool; a failure is a bookkeeping bug, logged.
    fn free(&mut self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        if let Err(error) = self.pool.free(slots) {
            tracing::error!(%error, "freeing draft KV slots failed");
        }
    }
}
