//! A fast, non-cryptographic hash for the tokenizer's lookup tables: keys
//! are token texts and id pairs from the model file, looked up millions of
//! times per prompt, and SipHash's flood resistance buys nothing there.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

const K: u64 = 0xf135_7aea_2e62_a9c5;

/// Builds [`FxHasher`]s.
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct Fx;

/// The multiply-rotate hash rustc uses (`rustc-hash`).
#[derive(Default)]
pub(super) struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = self.0.wrapping_add(word).wrapping_mul(K);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, i: u8) {
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

    fn finish(&self) -> u64 {
        // The multiply leaves the entropy in the high bits; the table indexes by the low ones.
        self.0.rotate_left(26)
    }
}

impl BuildHasher for Fx {
    type Hasher = FxHasher;

    fn build_hasher(&self) -> FxHasher {
        FxHasher::default()
    }
}

/// A `HashMap` with [`Fx`].
pub(super) type FxMap<K, V> = HashMap<K, V, Fx>;
