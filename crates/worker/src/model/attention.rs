//! Attention of packed query rows over keys and values in the KV pool.
//!
//! Each query row attends to its own sequence's slots up to and including
//! its position, which gives causal attention within a prefill chunk and
//! attention over the cached prefix in one rule. When the model runs on
//! several threads and the step is big enough, rows run in parallel on
//! candle's thread pool, shared with the matmuls.

use std::sync::Mutex;

use super::kernels;
use super::kv::KvElem;

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
/// Rows with no keys are left alone (the blocked kernel in [`super::flash`]
/// computes them).
///
/// `q` and `out` are `[rows, n_heads * head_dim]`; the pools are
/// `[slots, n_kv_heads * head_dim]`.
pub(crate) fn attend<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    keys: &[&[u32]],
    shape: HeadShape,
    out: &mut [f32],
    parallel: bool,
) {
    let row_len = shape.n_heads * shape.head_dim;
    let out_rows: Vec<Mutex<&mut [f32]>> = out.chunks_mut(row_len).map(Mutex::new).collect();
    let macs = keys.iter().map(|k| k.len()).sum::<usize>() * 2 * row_len;
    kernels::run_units(keys.len(), macs, parallel, |range| {
        let mut scores = Vec::new();
        for r in range {
            if keys[r].is_empty() {
                continue;
            }
            // Each row index is handed to exactly one thread, so the lock is uncontended.
            let mut o = out_rows[r].lock().unwrap_or_else(|e| e.into_inner());
            let q_row = &q[r * row_len..(r + 1) * row_len];
            kernels::attend_row(q_row, k_pool, v_pool, keys[r], shape, &mut scores, &mut o);
        }
    });
}

/// One query row against its keys; inlined into each SIMD build in [`kernels`].
#[inline(always)]
pub(crate) fn attend_row_impl<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    keys: &[u32],
    shape: HeadShape,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let kv_dim = shape.n_kv_heads * d;
    let group = shape.n_heads / shape.n_kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let n = keys.len();
    // Scores, then one row of room to convert an f16 K or V row into.
    scores.resize(group * n + d, 0.0);
    let (scores, row_buf) = scores.split_at_mut(group * n);
    // The query heads of one KV head read each K and V row once together.
    for g in 0..shape.n_kv_heads {
        let kv_off = g * d;
        let heads = g * group..(g + 1) * group;
        for (j, &slot) in keys.iter().enumerate() {
            let at = slot as usize * kv_dim + kv_off;
            let k_row = as_f32_row(&k_pool[at..at + d], row_buf);
            for (hh, h) in heads.clone().enumerate() {
                scores[hh * n + j] = dot(&q[h * d..(h + 1) * d], k_row) * scale;
            }
        }
        let mut inv_sums = [0f32; MAX_GROUP];
        for (hh, row) in scores.chunks_exact_mut(n).enumerate() {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            row.iter_mut().for_each(|v| *v = exp_nonpositive(*v - max));
            if let Some(inv) = inv_sums.get_mut(hh) {
                *inv = 1.0 / sum(row);
            }
        }
        for h in heads.clone() {
            out[h * d..(h + 1) * d].fill(0.0);
        }
        for (j, &slot) in keys.iter().enumerate() {
            let at = slot as usize * kv_dim + kv_off;
            let v_row = as_f32_row(&v_pool[at..at + d], row_buf);
            for (hh, h) in heads.clone().enumerate() {
                axpy(scores[hh * n + j], v_row, &mut out[h * d..(h + 1) * d]);
            }
        }
        for (hh, h) in heads.enumerate() {
            let inv = inv_sums
                .get(hh)
                .copied()
                .unwrap_or_else(|| 1.0 / sum(&scores[hh * n..(hh + 1) * n]));
            out[h * d..(h + 1) * d].iter_mut().for_each(|x| *x *= inv);
        }
    }
}

/// A pool row as f32: the row itself for an f32 pool, else converted into `buf`.
#[inline(always)]
fn as_f32_row<'a, T: KvElem>(row: &'a [T], buf: &'a mut [f32]) -> &'a [f32] {
    match T::as_f32(row) {
        Some(r) => r,
        None => {
            T::load(row, buf);
            buf
        }
    }
}

/// Query heads per KV head whose softmax sums are kept on the stack.
const MAX_GROUP: usize = 16;

/// `e^x` for `x <= 0` (softmax after subtracting the max), within 2e-7
/// relative: a degree-6 polynomial on `x - n ln 2` scaled by `2^n`. Plain
/// arithmetic, so the softmax loop vectorizes (libm's `expf` does not).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// Sum with eight independent accumulators so it vectorizes.
#[inline(always)]
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let whole = v.len() / 8 * 8;
    for c in v[..whole].chunks_exact(8) {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + v[whole..].iter().sum::<f32>()
}

/// Dot product with independent accumulators so it vectorizes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Sixteen lanes: one AVX-512 register or two AVX2 ones.
    let mut acc = [0.0f32; 16];
    let chunks = a.len() / 16 * 16;
    for (ca, cb) in a[..chunks]
        .chunks_exact(16)
        .zip(b[..chunks].chunks_exact(16))
    {
        for i in 0..16 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_data::random;

    #[test]
    fn fast_exp_is_accurate() {
        // Down to the clamp at -87, where e^x is already below 2e-38.
        for i in 0..8_700 {
            let x = -(i as f32) * 0.01;
            let (fast, exact) = (exp_nonpositive(x), f64::from(x).exp());
            assert!(
                (f64::from(fast) - exact).abs() <= 3e-7 * exact + 1e-38,
                "{x}: {fast} vs {exact}"
            );
        }
        assert!(exp_nonpositive(-1000.0) < 2e-38);
    }

    /// Grouped heads, scattered slots and causal prefixes against a plain
    /// f64 softmax attention.
    #[test]
    fn matches_naive_attention() {
        let shape = HeadShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 16,
        };
        let (rows, pool) = (5, 40);
        let (qd, kvd) = (6 * 16, 2 * 16);
        let q = random(rows * qd, 1, 2.0);
        let (k, v) = (random(pool * kvd, 2, 2.0), random(pool * kvd, 3, 2.0));
        let slots: Vec<u32> = (0..rows as u32).map(|i| 37 - 7 * i).collect();
        let keys: Vec<&[u32]> = (0..rows).map(|r| &slots[..=r]).collect();
        let mut out = vec![0f32; rows * qd];
        attend(&q, &k[..], &v[..], &keys, shape, &mut out, true);
        for r in 0..rows {
            for h in 0..6 {
                let g = h / 3;
                let s: Vec<f64> = keys[r]
                    .iter()
                    .map(|&slot| {
                        (0..16)
                            .map(|c| {
                                f64::from(q[r * qd + h * 16 + c])
                                    * f64::from(k[slot as usize * kvd + g * 16 + c])
                            })
                            .sum::<f64>()
                            / 4.0
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for c in 0..16 {
                    let want: f64 = keys[r]
                        .iter()
                        .zip(&s)
                        .map(|(&slot, x)| {
                            (x - m).exp() / z * f64::from(v[slot as usize * kvd + g * 16 + c])
                        })
                        .sum();
                    let got = f64::from(out[r * qd + h * 16 + c]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "row {r} head {h}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
