//! Attention of packed query rows over keys and values in the KV pool.
//!
//! Each query row attends to its own sequence's slots up to and including
//! its position, which gives causal attention within a prefill chunk and
//! attention over the cached prefix in one rule. Rows run in parallel on
//! candle's thread pool, so this shares threads with the matmuls.

use std::sync::Mutex;

use super::kernels;

/// Head layout of the attention.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadShape {
    /// Query heads.
    pub(crate) n_heads: usize,
    /// Key/value heads; query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
    pub(crate) n_kv_heads: usize,
    /// Width of one head.
    pub(crate) head_dim: usize,
}

/// Computes `out[r] = softmax(q[r] K^T / sqrt(d)) V` for every row `r`, where
/// K and V are the pool rows at `keys[r]` (the slots row `r` may attend to).
///
/// `q` and `out` are `[rows, n_heads * head_dim]`; the pools are
/// `[slots, n_kv_heads * head_dim]`.
pub(crate) fn attend(
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    keys: &[&[u32]],
    shape: HeadShape,
    out: &mut [f32],
) {
    let row_len = shape.n_heads * shape.head_dim;
    let out_rows: Vec<Mutex<&mut [f32]>> = out.chunks_mut(row_len).map(Mutex::new).collect();
    candle_core::utils::barrier_pool().execute_chunked(keys.len(), |range| {
        let mut scores = Vec::new();
        for r in range {
            // Each row index is handed to exactly one thread, so the lock is uncontended.
            let mut o = out_rows[r].lock().unwrap_or_else(|e| e.into_inner());
            let q_row = &q[r * row_len..(r + 1) * row_len];
            kernels::attend_row(q_row, k_pool, v_pool, keys[r], shape, &mut scores, &mut o);
        }
    });
}

/// One query row against its keys; inlined into each SIMD build in [`kernels`].
#[inline(always)]
pub(crate) fn attend_row_impl(
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    keys: &[u32],
    shape: HeadShape,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let kv_dim = shape.n_kv_heads * d;
    let group = shape.n_heads / shape.n_kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    scores.resize(keys.len(), 0.0);
    for h in 0..shape.n_heads {
        let kv_off = (h / group) * d;
        let qh = &q[h * d..(h + 1) * d];
        let mut max = f32::NEG_INFINITY;
        for (s, &slot) in scores.iter_mut().zip(keys) {
            let at = slot as usize * kv_dim + kv_off;
            *s = dot(qh, &k_pool[at..at + d]) * scale;
            max = max.max(*s);
        }
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let oh = &mut out[h * d..(h + 1) * d];
        oh.fill(0.0);
        for (&p, &slot) in scores.iter().zip(keys) {
            let at = slot as usize * kv_dim + kv_off;
            axpy(p, &v_pool[at..at + d], oh);
        }
        let inv = 1.0 / sum;
        oh.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Dot product with eight independent accumulators so it vectorizes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in a[chunks..].iter().zip(&b[chunks..]) {
        sum += x * y;
    }
    sum
}

/// `y += a * x`.
#[inline(always)]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}
