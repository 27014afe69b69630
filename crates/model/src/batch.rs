//! One forward step's inputs as flat arrays: what a GPU backend uploads in
//! one buffer, and what the CPU backend reads as [`SeqChunk`]s without a
//! copy.

use super::{ChunkOutput, SeqChunk};

/// Every sequence of one forward step, laid out flat (CSR style).
///
/// Sequence `i` feeds `tokens[token_indptr[i]..token_indptr[i + 1]]` at
/// `positions` of the same range, and reads or writes the KV slots
/// `slots[slot_indptr[i]..slot_indptr[i + 1]]`: one per position from 0 to
/// its last fed token, so the last `tokens` of them are written this step.
/// Its [`SeqChunk::start_pos`] is its slot count less its token count.
///
/// The engine keeps one and refills it every step: [`StepBatch::clear`]
/// keeps the buffers, so a step no larger than an earlier one allocates
/// nothing here (in decode the slots grow by one per sequence and step,
/// so the slot buffer reallocates only when it doubles).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepBatch {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
    token_indptr: Vec<u32>,
    slot_indptr: Vec<u32>,
    outputs: Vec<ChunkOutput>,
}

impl StepBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties the batch, keeping its buffers for the next step.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.slots.clear();
        self.token_indptr.clear();
        self.slot_indptr.clear();
        self.outputs.clear();
    }

    /// Appends one sequence's chunk: its tokens, their positions and its
    /// slots are copied in. The model checks the [`SeqChunk`] contract
    /// (`slots.len() == start_pos + tokens.len()`), not this.
    pub fn push(&mut self, chunk: &SeqChunk<'_>) {
        if self.token_indptr.is_empty() {
            self.token_indptr.push(0);
            self.slot_indptr.push(0);
        }
        self.tokens.extend_from_slice(chunk.tokens);
        let start = chunk.start_pos as u32;
        self.positions.extend((start..).take(chunk.tokens.len()));
        self.slots.extend_from_slice(chunk.slots);
        self.token_indptr.push(self.tokens.len() as u32);
        self.slot_indptr.push(self.slots.len() as u32);
        self.outputs.push(chunk.output);
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    /// Whether the batch holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// Every fed token, sequence after sequence.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The absolute position of each fed token.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// Each sequence's KV slots, positions 0 to its last fed token,
    /// sequence after sequence.
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// Where each sequence's tokens start in [`Self::tokens`]; one more
    /// entry than sequences (none when empty).
    pub fn token_indptr(&self) -> &[u32] {
        &self.token_indptr
    }

    /// Where each sequence's slots start in [`Self::slots`]; one more
    /// entry than sequences (none when empty).
    pub fn slot_indptr(&self) -> &[u32] {
        &self.slot_indptr
    }

    /// What the step returns for each sequence.
    pub fn outputs(&self) -> &[ChunkOutput] {
        &self.outputs
    }

    /// Sequence `index` as a [`SeqChunk`] borrowing from the batch.
    pub fn chunk(&self, index: usize) -> Option<SeqChunk<'_>> {
        (index < self.len()).then(|| self.chunk_at(index))
    }

    /// Every sequence as a [`SeqChunk`], in batch order, without copying.
    pub fn chunks(&self) -> impl ExactSizeIterator<Item = SeqChunk<'_>> {
        (0..self.len()).map(|index| self.chunk_at(index))
    }

    /// Sequence `index < len()`: `push` wrote both offsets of every
    /// sequence, each range within its buffer.
    fn chunk_at(&self, index: usize) -> SeqChunk<'_> {
        let range = |indptr: &[u32]| indptr[index] as usize..indptr[index + 1] as usize;
        let tokens = &self.tokens[range(&self.token_indptr)];
        let slots = &self.slots[range(&self.slot_indptr)];
        SeqChunk {
            tokens,
            slots,
            start_pos: slots.len().saturating_sub(tokens.len()),
            output: self.outputs[index],
        }
    }

    /// Elements the buffers hold without growing, all of them together:
    /// flat once the batch has seen its largest step.
    pub fn capacity(&self) -> usize {
        self.tokens.capacity()
            + self.positions.capacity()
            + self.slots.capacity()
            + self.token_indptr.capacity()
            + self.slot_indptr.capacity()
            + self.outputs.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_through_the_flat_layout() {
        let slots_a: Vec<u32> = (100..110).collect();
        let slots_b = [7, 3, 9];
        let chunks = [
            SeqChunk {
                tokens: &[1, 2, 3, 4],
                slots: &slots_a[..4],
                start_pos: 0,
                output: ChunkOutput::AllLogits,
            },
            SeqChunk {
                tokens: &[5],
                slots: &slots_b,
                start_pos: 2,
                output: ChunkOutput::LastLogits,
            },
            SeqChunk {
                tokens: &[6, 7],
                slots: &slots_a,
                start_pos: 8,
                output: ChunkOutput::AllHidden,
            },
        ];
        let mut batch = StepBatch::new();
        for chunk in &chunks {
            batch.push(chunk);
        }
        assert_eq!(batch.len(), 3);
        assert_eq!(batch.tokens(), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(batch.positions(), [0, 1, 2, 3, 2, 8, 9]);
        assert_eq!(batch.token_indptr(), [0, 4, 5, 7]);
        assert_eq!(batch.slot_indptr(), [0, 4, 7, 17]);
        assert_eq!(&batch.slots()[4..7], slots_b);
        let back: Vec<SeqChunk> = batch.chunks().collect();
        for (got, want) in back.iter().zip(&chunks) {
            assert_eq!(got.tokens, want.tokens);
            assert_eq!(got.slots, want.slots);
            assert_eq!(got.start_pos, want.start_pos);
            assert_eq!(got.output, want.output);
        }
        assert!(batch.chunk(3).is_none());
    }

    #[test]
    fn clearing_keeps_the_buffers() {
        let slots: Vec<u32> = (0..64).collect();
        let chunk = SeqChunk {
            tokens: &[1; 8],
            slots: &slots,
            start_pos: 56,
            output: ChunkOutput::LastLogits,
        };
        let mut batch = StepBatch::new();
        batch.push(&chunk);
        let capacity = batch.capacity();
        for _ in 0..10 {
            batch.clear();
            assert!(batch.is_empty() && batch.token_indptr().is_empty());
            batch.push(&chunk);
        }
        assert_eq!(batch.capacity(), capacity);
    }
}
