//! Attention of packed query rows over keys and values in the KV pool.
//!
//! Each query row attends to its own sequence's slots up to and including
//! its position, which gives causal attention within a prefill chunk and
//! attention over the cached prefix in one rule. When the model runs on
//! several threads and the step is big enough, rows run in parallel on
//! the kernels' thread pool, shared with the matmuls.

use std::sync::Mutex;

pub(crate) use zinfer_kernels::HeadShape;
use zinfer_kernels::{self as kernels, KvElem, RowJob, ScoreRule};

/// Computes `out[r] = softmax(score(q[r], K)) V` for every row `r`, where
/// K and V are the pool rows at `keys[r]` (the slots row `r` may attend to),
/// with each head's sink logit in the softmax's denominator when given.
/// Rows with no keys are left alone (the blocked kernel in [`super::flash`]
/// computes them).
///
/// `q` and `out` are `[rows, n_heads * head_dim]`; the pools are
/// `[slots, n_kv_heads * head_dim]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    keys: &[&[u32]],
    shape: HeadShape,
    rule: ScoreRule,
    sinks: Option<&[f32]>,
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
            let job = RowJob {
                q: &q[r * row_len..(r + 1) * row_len],
                k_pool,
                v_pool,
                keys: keys[r],
                shape,
                rule,
                sinks,
            };
            kernels::attend_row(&job, &mut scores, &mut o);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_kernels::test_data::random;

    /// Grouped heads, scattered slots and causal prefixes against a plain
    /// f64 softmax attention, without and with sinks (one far above the
    /// scores).
    #[test]
    fn matches_naive_attention() {
        for sinks in [None, Some([-1.0, 0.0, 0.7, 2.0, 90.0, -30.0])] {
            check_naive(sinks.as_ref().map(|s| &s[..]));
        }
    }

    fn check_naive(sinks: Option<&[f32]>) {
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
        let rule = ScoreRule::standard(16);
        attend(
            &q,
            &k[..],
            &v[..],
            &keys,
            shape,
            rule,
            sinks,
            &mut out,
            true,
        );
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
                let sink = sinks.map(|s| f64::from(s[h]));
                let m = s.iter().copied().chain(sink).fold(f64::MIN, f64::max);
                let z: f64 = s.iter().chain(&sink).map(|x| (x - m).exp()).sum();
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
