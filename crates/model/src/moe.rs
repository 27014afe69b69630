//! Routing a step's rows to their experts, the same way on every backend:
//! the gating rule of a [`MoeSpec`] turns each row's router logits into its
//! experts and their weights (as llama.cpp's MoE graph does), and the rows
//! are then grouped by expert, so that each expert's matrices are read once
//! per step, for all its rows at once, and experts no row picked are not
//! read at all.

use std::sync::Mutex;

use crate::spec::{Gating, MoeSpec};

/// llama.cpp's floor on the sum a renormalisation divides by (the smallest
/// normal f16).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// For each expert, the rows routed to it in row order, each with its
/// weight. `logits` holds one `[experts]` row of router logits per step row.
pub(crate) fn route(spec: &MoeSpec, logits: &[f32]) -> Vec<Vec<(usize, f32)>> {
    route_parallel(spec, logits, false)
}

/// One unit's router logits and the `(expert, weight)` slots of its rows.
type RowsAndPicks<'a> = (&'a [f32], &'a mut [(usize, f32)]);

/// Step rows per unit of [`route_parallel`]'s work.
const ROWS_PER_UNIT: usize = 16;
/// Rough cost of one router logit's gating in multiply-adds (an
/// exponential), for the pool's threshold.
const COST_PER_LOGIT: usize = 16;

/// [`route`] with the rows' gating (softmax, top-k, weights) split over the
/// kernels' pool when `parallel` and the step is worth it. Each row is
/// picked alone and the rows are grouped in row order after, so the split
/// changes no bits.
pub(crate) fn route_parallel(
    spec: &MoeSpec,
    logits: &[f32],
    parallel: bool,
) -> Vec<Vec<(usize, f32)>> {
    let e = spec.experts.max(1);
    let k = spec.used.min(spec.experts);
    let mut by_expert = vec![Vec::new(); spec.experts];
    if k == 0 {
        return by_expert;
    }
    let mut picks = vec![(0usize, 0f32); logits.len() / e * k];
    let parts: Vec<Mutex<RowsAndPicks<'_>>> = logits
        .chunks(ROWS_PER_UNIT * e)
        .zip(picks.chunks_mut(ROWS_PER_UNIT * k))
        .map(Mutex::new)
        .collect();
    let cost = logits.len() * COST_PER_LOGIT;
    zinfer_kernels::run_units(parts.len(), cost, parallel, |range| {
        let mut weights = vec![0f32; spec.experts];
        let mut order = Vec::with_capacity(spec.experts);
        for part in &parts[range] {
            // Each part is handed to exactly one unit: the lock is uncontended.
            let mut part = part.lock().unwrap_or_else(|e| e.into_inner());
            let (rows, out) = &mut *part;
            for (l, o) in rows.chunks_exact(e).zip(out.chunks_exact_mut(k)) {
                pick(spec, l, &mut weights, &mut order);
                for (slot, &x) in o.iter_mut().zip(&order) {
                    *slot = (x, weights[x]);
                }
            }
        }
    });
    drop(parts);
    for (row, p) in picks.chunks_exact(k).enumerate() {
        for &(x, w) in p {
            by_expert[x].push((row, w));
        }
    }
    by_expert
}

/// One row's experts: their indices left in `order` (best first), their
/// weights in `weights` at those indices.
fn pick(spec: &MoeSpec, logits: &[f32], weights: &mut [f32], order: &mut Vec<usize>) {
    let k = spec.used.min(logits.len());
    match spec.gating {
        Gating::SoftmaxTopK { renormalize } => {
            softmax(logits, weights);
            top_k(weights, k, order);
            if renormalize {
                let sum: f32 = order.iter().map(|&e| weights[e]).sum();
                let sum = sum.max(MIN_WEIGHT_SUM);
                order.iter().for_each(|&e| weights[e] /= sum);
            }
        }
        Gating::TopKSoftmax => {
            top_k(logits, k, order);
            let max = order.first().map_or(0.0, |&e| logits[e]);
            let mut sum = 0f32;
            for &e in order.iter() {
                weights[e] = (logits[e] - max).exp();
                sum += weights[e];
            }
            order.iter().for_each(|&e| weights[e] /= sum);
        }
    }
    if spec.weights_scale != 1.0 {
        order.iter().for_each(|&e| weights[e] *= spec.weights_scale);
    }
}

/// `out = softmax(x)`, with the maximum subtracted first.
fn softmax(x: &[f32], out: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let mut sum = 0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o;
    }
    out.iter_mut().for_each(|o| *o /= sum);
}

/// The indices of the `k` highest `scores`, highest first (the lower index
/// first among equals). Runs per row and layer: the `k` are selected in
/// linear time and only they are sorted (the order is total, so the result
/// is that of a full sort).
fn top_k(scores: &[f32], k: usize, order: &mut Vec<usize>) {
    let higher = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b));
    order.clear();
    if k == 0 {
        return;
    }
    order.extend(0..scores.len());
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, higher);
        order.truncate(k);
    }
    order.sort_unstable_by(higher);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gating: Gating, used: usize) -> MoeSpec {
        MoeSpec {
            experts: 4,
            used,
            expert_ffn: 8,
            gating,
            router_bias: false,
            expert_bias: false,
            weights_scale: 1.0,
            shared_ffn: None,
        }
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() < 1e-6
    }

    /// Logits [0, ln 2, ln 4, ln 1] give probabilities [1, 2, 4, 1] / 8:
    /// experts 2 and 1 win with 4/8 and 2/8, or 4/6 and 2/6 renormalised.
    #[test]
    fn softmax_then_top_k_with_and_without_renormalising() {
        let logits = [0.0, 2f32.ln(), 4f32.ln(), 0.0];
        let plain = route(
            &spec(Gating::SoftmaxTopK { renormalize: false }, 2),
            &logits,
        );
        assert_eq!(plain[0], []);
        assert_eq!(plain[3], []);
        assert!(close(plain[2][0].1, 0.5) && close(plain[1][0].1, 0.25));
        let renorm = route(&spec(Gating::SoftmaxTopK { renormalize: true }, 2), &logits);
        assert!(close(renorm[2][0].1, 4.0 / 6.0) && close(renorm[1][0].1, 2.0 / 6.0));
    }

    /// The selection picks what a full sort would, ties to the lower index.
    #[test]
    fn top_k_agrees_with_a_full_sort() {
        let scores: Vec<f32> = (0..128u32).map(|i| ((i * 37) % 11) as f32).collect();
        for k in [0, 1, 2, 8, 127, 128, 130] {
            let mut full: Vec<usize> = (0..scores.len()).collect();
            full.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            full.truncate(k);
            let mut order = Vec::new();
            top_k(&scores, k, &mut order);
            assert_eq!(order, full, "k = {k}");
        }
    }

    /// Top-k of the logits then softmax over those alone: only the chosen
    /// logits' differences matter, so adding a far lower expert changes nothing.
    #[test]
    fn top_k_then_softmax_over_the_chosen() {
        let s = spec(Gating::TopKSoftmax, 2);
        let r = route(&s, &[1.0, 3.0, -50.0, 1.0 + 2f32.ln()]);
        // Experts 1 (3.0) and 3 (1.69): weights e^3 and e^1.69 over their sum.
        let (a, b) = (3f32.exp(), (1.0 + 2f32.ln()).exp());
        assert!(close(r[1][0].1, a / (a + b)) && close(r[3][0].1, b / (a + b)));
        assert!(r[0].is_empty() && r[2].is_empty());
        let scaled = route(
            &MoeSpec {
                weights_scale: 2.5,
                ..s
            },
            &[1.0, 3.0, -50.0, 1.0 + 2f32.ln()],
        );
        assert!(close(scaled[1][0].1, 2.5 * a / (a + b)));
    }

    /// Rows are grouped by expert in row order; ties go to the lower index.
    #[test]
    fn rows_are_grouped_by_expert() {
        let s = spec(Gating::SoftmaxTopK { renormalize: true }, 1);
        let logits = [
            0.0, 0.0, 0.0, 0.0, // a tie: expert 0
            0.0, 0.0, 5.0, 0.0, // expert 2
            9.0, 0.0, 0.0, 0.0, // expert 0
        ];
        let r = route(&s, &logits);
        let rows: Vec<Vec<usize>> = r.iter().map(|e| e.iter().map(|p| p.0).collect()).collect();
        assert_eq!(rows, [vec![0, 2], vec![], vec![1], vec![]]);
        assert!(r.iter().flatten().all(|&(_, w)| close(w, 1.0)));
    }

    /// The rows' gating split over the pool (300 rows of 64 experts: past
    /// its threshold) gives, row for row, what each row's gating gives
    /// alone on one thread, grouped by expert in row order.
    #[test]
    fn the_pool_routes_as_one_thread_does() {
        let (n, e) = (300, 64);
        let logits = zinfer_kernels::test_data::random(n * e, 61, 4.0);
        for gating in [
            Gating::SoftmaxTopK { renormalize: true },
            Gating::SoftmaxTopK { renormalize: false },
            Gating::TopKSoftmax,
        ] {
            let s = MoeSpec {
                experts: e,
                used: 8,
                ..spec(gating, 8)
            };
            let mut want = vec![Vec::new(); e];
            let (mut weights, mut order) = (vec![0f32; e], Vec::new());
            for (row, l) in logits.chunks_exact(e).enumerate() {
                pick(&s, l, &mut weights, &mut order);
                assert_eq!(order.len(), 8);
                for &x in &order {
                    want[x].push((row, weights[x]));
                }
            }
            assert_eq!(route_parallel(&s, &logits, true), want, "{gating:?}");
            assert_eq!(route(&s, &logits), want, "{gating:?}");
        }
    }
}
