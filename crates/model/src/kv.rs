//! The token KV pool: per layer, one K row and one V row per slot.
//!
//! Layers that read another layer's KV (Gemma 4) have no rows here, and
//! layers may differ in row width.
//!
//! Slots are the engine's `TokenPool` ids, so a cached prefix is shared by
//! every sequence that lists its slots. Rows are plain vectors indexed by
//! `slot * kv_dim`, of f32 or (with [`KvDtype::F16`]) f16, which halves the
//! bytes per cached token; attention converts f16 rows to f32 as it reads
//! them. The vectors are zero-allocated (f16 is kept as `u16` bits for that
//! reason), so memory is only committed for slots that have been written.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use zinfer_kernels::KvElem;

use super::{KvDtype, ModelError};

/// K and V rows for every layer and slot.
#[derive(Debug)]
pub(crate) struct KvPool {
    capacity: usize,
    /// Each layer's row width.
    dims: Vec<usize>,
    layers: Vec<LayerKv>,
}

#[derive(Debug)]
enum LayerKv {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    /// f16 bits.
    F16 {
        k: Vec<u16>,
        v: Vec<u16>,
    },
}

/// One layer's K and V rows, borrowed in their stored type.
pub(crate) enum LayerView<'a> {
    F32(&'a [f32], &'a [f32]),
    F16(&'a [f16], &'a [f16]),
}

impl KvPool {
    /// An empty pool of `capacity` slots for layers of rows `dims[i]` wide.
    pub(crate) fn new(dims: &[usize], capacity: usize, dtype: KvDtype) -> Result<Self, ModelError> {
        let layers = dims
            .iter()
            .map(|&kv_dim| {
                let len = capacity.checked_mul(kv_dim).ok_or_else(|| {
                    ModelError::InvalidBatch(format!("KV pool of {capacity} slots is too large"))
                })?;
                Ok(match dtype {
                    KvDtype::F32 => LayerKv::F32 {
                        k: vec![0.0; len],
                        v: vec![0.0; len],
                    },
                    KvDtype::F16 => LayerKv::F16 {
                        k: vec![0; len],
                        v: vec![0; len],
                    },
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(Self {
            capacity,
            dims: dims.to_vec(),
            layers,
        })
    }

    /// Layers with rows.
    pub(crate) fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Width of `layer`'s rows.
    pub(crate) fn dim(&self, layer: usize) -> usize {
        self.dims[layer]
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes one slot takes over every layer, K and V.
    pub(crate) fn slot_bytes(&self) -> usize {
        let elem = match self.layers.first() {
            Some(LayerKv::F16 { .. }) => 2,
            _ => 4,
        };
        2 * self.dims.iter().sum::<usize>() * elem
    }

    /// Writes rows `k[i]`, `v[i]` (each `kv_dim` wide) to `slots[i]` of `layer`.
    pub(crate) fn write(&mut self, layer: usize, slots: &[u32], k: &[f32], v: &[f32]) {
        let d = self.dims[layer];
        for (i, &slot) in slots.iter().enumerate() {
            let (at, rows) = (slot as usize * d, i * d..(i + 1) * d);
            match &mut self.layers[layer] {
                LayerKv::F32 { k: kp, v: vp } => {
                    kp[at..at + d].copy_from_slice(&k[rows.clone()]);
                    vp[at..at + d].copy_from_slice(&v[rows]);
                }
                LayerKv::F16 { k: kp, v: vp } => {
                    let kd: &mut [f16] = kp[at..at + d].reinterpret_cast_mut();
                    kd.convert_from_f32_slice(&k[rows.clone()]);
                    let vd: &mut [f16] = vp[at..at + d].reinterpret_cast_mut();
                    vd.convert_from_f32_slice(&v[rows]);
                }
            }
        }
    }

    /// Appends the K rows of `slots` in `layer`, then their V rows, as f32.
    pub(crate) fn read_f32(&self, layer: usize, slots: &[u32], out: &mut Vec<f32>) {
        let d = self.dims[layer];
        fn rows<T: KvElem>(pool: &[T], slots: &[u32], d: usize, out: &mut Vec<f32>) {
            for &slot in slots {
                let at = slot as usize * d;
                let start = out.len();
                out.resize(start + d, 0.0);
                T::load(&pool[at..at + d], &mut out[start..]);
            }
        }
        match self.layer(layer) {
            LayerView::F32(k, v) => {
                rows(k, slots, d, out);
                rows(v, slots, d, out);
            }
            LayerView::F16(k, v) => {
                rows(k, slots, d, out);
                rows(v, slots, d, out);
            }
        }
    }

    /// The K and V rows of `layer`, indexed by `slot * kv_dim`.
    pub(crate) fn layer(&self, layer: usize) -> LayerView<'_> {
        match &self.layers[layer] {
            LayerKv::F32 { k, v } => LayerView::F32(k, v),
            LayerKv::F16 { k, v } => LayerView::F16(k.reinterpret_cast(), v.reinterpret_cast()),
        }
    }
}
