//! The token KV pool: per layer, one K row and one V row per slot.
//!
//! Slots are the engine's `TokenPool` ids, so a cached prefix is shared by
//! every sequence that lists its slots. Rows are plain f32 vectors so the
//! attention kernel reads a key by `slot * kv_dim` without gathering copies;
//! the vectors are zero-allocated, so memory is only committed for slots that
//! have been written.

use super::ModelError;

/// K and V rows for every layer and slot.
#[derive(Debug)]
pub(crate) struct KvPool {
    capacity: usize,
    kv_dim: usize,
    layers: Vec<LayerKv>,
}

#[derive(Debug)]
struct LayerKv {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl KvPool {
    /// An empty pool of `capacity` slots for `n_layers` layers of `kv_dim` wide rows.
    pub(crate) fn new(n_layers: usize, capacity: usize, kv_dim: usize) -> Result<Self, ModelError> {
        let len = capacity.checked_mul(kv_dim).ok_or_else(|| {
            ModelError::InvalidBatch(format!("KV pool of {capacity} slots is too large"))
        })?;
        let layers = (0..n_layers)
            .map(|_| LayerKv {
                k: vec![0.0; len],
                v: vec![0.0; len],
            })
            .collect();
        Ok(Self {
            capacity,
            kv_dim,
            layers,
        })
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes rows `k[i]`, `v[i]` (each `kv_dim` wide) to `slots[i]` of `layer`.
    pub(crate) fn write(&mut self, layer: usize, slots: &[u32], k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let kv = &mut self.layers[layer];
        for (i, &slot) in slots.iter().enumerate() {
            let at = slot as usize * d;
            kv.k[at..at + d].copy_from_slice(&k[i * d..(i + 1) * d]);
            kv.v[at..at + d].copy_from_slice(&v[i * d..(i + 1) * d]);
        }
    }

    /// Rows per slot are `kv_dim` wide.
    pub(crate) fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Layers in the pool.
    pub(crate) fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The K and V rows of `layer`, indexed by `slot * kv_dim`.
    pub(crate) fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        let kv = &self.layers[layer];
        (&kv.k, &kv.v)
    }
}
