//! The Gated DeltaNet layer of hybrid models (Qwen3.5), as llama.cpp's
//! `qwen35` graph and its `ssm_conv` and `gated_delta_net` ops compute it,
//! in its recurrent form: one row at a time against a fixed-size state per
//! sequence (the last `conv_kernel - 1` inputs of the causal convolution,
//! and one `head_k x head_v` matrix per value head).
//!
//! Per row: the `attn_qkv` projection goes through a causal depthwise
//! convolution and SiLU and splits into q, k (one per key head) and v (one
//! per value head); q and k are L2-normalised; each value head `h` reads
//! key head `h % k_heads` (llama.cpp tiles the key heads); with
//! `beta = sigmoid(ssm_beta x)` and `g = softplus(ssm_alpha x + dt_bias) *
//! ssm_a`, the state decays by `exp(g)` and takes the delta rule's update
//! `S += k (beta (v - S^T k))^T`; the output `S^T q / sqrt(head_k)` is
//! RMS-normed per head, scaled by `ssm_norm` and by `silu(z)` of the
//! `attn_gate` projection, and goes through `ssm_out`.

/// What a hybrid model's layers hold besides a transformer's: which layers
/// are Gated DeltaNet layers and their widths, and the attention layers'
/// partial RoPE and output gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HybridSpec {
    /// Per layer: a Gated DeltaNet layer (`true`) or full attention.
    pub recurrent: Vec<bool>,
    /// Leading dimensions of an attention head that RoPE rotates
    /// (`rope.dimension_count`), NeoX pairs `(i, i + rope_dims / 2)`.
    pub rope_dims: usize,
    /// Taps of the causal convolution (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Key heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`); a multiple of `k_heads`.
    pub v_heads: usize,
    /// Width of a key and of a value head (`ssm.state_size`).
    pub head_dim: usize,
}

impl HybridSpec {
    /// Width of all key heads together (q's too).
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    /// Width of all value heads together.
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Channels of the convolution: q, k and v end to end.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of one sequence's state in one recurrent layer.
    pub fn state_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.v_heads * self.head_dim * self.head_dim
    }

    /// Whether the widths can run: none zero, value heads a multiple of key heads.
    pub(crate) fn valid(&self) -> bool {
        self.conv_kernel > 0
            && self.k_heads > 0
            && self.head_dim > 0
            && self.v_heads.is_multiple_of(self.k_heads)
            && self.v_heads > 0
            && self.rope_dims.is_multiple_of(2)
    }
}

/// One Gated DeltaNet layer's weights. `M` is a matrix, `V` a vector.
#[derive(Debug)]
pub(crate) struct DeltaNetWeights<M, V> {
    /// `[conv_dim, hidden]`: q, k, v before the convolution.
    pub(crate) qkv: M,
    /// `[value_dim, hidden]`: the output gate z.
    pub(crate) gate: M,
    /// `[v_heads, hidden]`.
    pub(crate) beta: M,
    /// `[v_heads, hidden]`.
    pub(crate) alpha: M,
    /// `[conv_dim, conv_kernel]`: each channel's taps, oldest first.
    pub(crate) conv: V,
    /// `[v_heads]`, added to alpha before the softplus.
    pub(crate) dt_bias: V,
    /// `[v_heads]`, the decay rate (negative: `-exp(A_log)`).
    pub(crate) a: V,
    /// `[head_dim]`, the gated RMSNorm's weight.
    pub(crate) norm: V,
    /// `[hidden, value_dim]`.
    pub(crate) out: M,
}

/// One sequence's state in one recurrent layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LayerState {
    /// The last `conv_kernel - 1` convolution inputs, oldest first,
    /// `[conv_kernel - 1, conv_dim]`.
    taps: Vec<f32>,
    /// Per value head, the state transposed: `m[j * head_dim + i] = S[i][j]`
    /// (row j of m is value dimension j), `[v_heads, head_dim, head_dim]`.
    m: Vec<f32>,
}

impl LayerState {
    /// The state before the first token: all zeros.
    pub(crate) fn new(spec: &HybridSpec) -> Self {
        Self {
            taps: vec![0.0; (spec.conv_kernel - 1) * spec.conv_dim()],
            m: vec![0.0; spec.v_heads * spec.head_dim * spec.head_dim],
        }
    }
}

/// One row's per-head inputs to the recurrence, after the convolution:
/// its q|k|v (`conv_dim`), and per value head its beta and decay `g`.
pub(crate) struct RowInputs<'a> {
    pub(crate) qkv: &'a mut [f32],
    pub(crate) beta: &'a [f32],
    pub(crate) g: &'a [f32],
}

/// `softplus` as ggml computes it (linear above 20).
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// `1 / (1 + exp(-x))`.
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x * sigmoid(x)`.
pub(crate) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// Runs the causal convolution and SiLU on one row's `qkv` in place,
/// against the sequence's taps, and shifts the row into the taps.
/// `conv` is `[conv_dim, kernel]`, each channel's taps oldest first.
pub(crate) fn conv_row(spec: &HybridSpec, conv: &[f32], state: &mut LayerState, qkv: &mut [f32]) {
    let (kernel, channels) = (spec.conv_kernel, spec.conv_dim());
    let past = kernel - 1;
    for (c, x) in qkv.iter_mut().enumerate() {
        let w = &conv[c * kernel..(c + 1) * kernel];
        let mut sum = 0f32;
        for (i, wi) in w[..past].iter().enumerate() {
            sum += state.taps[i * channels + c] * wi;
        }
        sum += *x * w[past];
        if past > 0 {
            for i in 0..past - 1 {
                state.taps[i * channels + c] = state.taps[(i + 1) * channels + c];
            }
            state.taps[(past - 1) * channels + c] = *x;
        }
        *x = silu(sum);
    }
}

/// `x / sqrt(sum(x^2) + eps)` for each `d`-wide head of `x` (llama.cpp's
/// `build_gdn_l2_norm`).
pub(crate) fn l2_norm_heads(x: &mut [f32], d: usize, eps: f32) {
    for h in x.chunks_exact_mut(d) {
        let sum = h.iter().map(|v| v * v).sum::<f32>();
        let scale = 1.0 / (sum + eps).sqrt();
        h.iter_mut().for_each(|v| *v *= scale);
    }
}

/// One row of the recurrence: `input.qkv` (after [`conv_row`]) has its q
/// and k normalised here; the output of each value head goes to `out`
/// (`value_dim`), before the gated norm.
pub(crate) fn recur_row(
    spec: &HybridSpec,
    state: &mut LayerState,
    input: RowInputs<'_>,
    eps: f32,
    out: &mut [f32],
) {
    let d = spec.head_dim;
    let key_dim = spec.key_dim();
    let (q, rest) = input.qkv.split_at_mut(key_dim);
    let (k, v) = rest.split_at_mut(key_dim);
    l2_norm_heads(q, d, eps);
    l2_norm_heads(k, d, eps);
    let scale = 1.0 / (d as f32).sqrt();
    for h in 0..spec.v_heads {
        let kh = h % spec.k_heads;
        let (qh, kh) = (&q[kh * d..(kh + 1) * d], &k[kh * d..(kh + 1) * d]);
        let vh = &v[h * d..(h + 1) * d];
        let m = &mut state.m[h * d * d..(h + 1) * d * d];
        let decay = input.g[h].exp();
        let beta = input.beta[h];
        for (j, row) in m.chunks_exact_mut(d).enumerate() {
            row.iter_mut().for_each(|s| *s *= decay);
            let sk = row.iter().zip(kh).map(|(s, k)| s * k).sum::<f32>();
            let delta = (vh[j] - sk) * beta;
            row.iter_mut().zip(kh).for_each(|(s, k)| *s += k * delta);
            let sq = row.iter().zip(qh).map(|(s, q)| s * q).sum::<f32>();
            out[h * d + j] = sq * scale;
        }
    }
}

/// The gated RMSNorm of one row's output: per value head,
/// `rms_norm(o) * norm * silu(z)`, in place.
pub(crate) fn gated_norm_row(out: &mut [f32], z: &[f32], norm: &[f32], eps: f32) {
    let d = norm.len();
    for (o, z) in out.chunks_exact_mut(d).zip(z.chunks_exact(d)) {
        let mean_sq = o.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, &w), &z) in o.iter_mut().zip(norm).zip(z) {
            *o = *o * scale * w * silu(z);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> HybridSpec {
        HybridSpec {
            recurrent: vec![true],
            rope_dims: 4,
            conv_kernel: 4,
            k_heads: 1,
            v_heads: 2,
            head_dim: 3,
        }
    }

    /// A small deterministic generator for test values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The recurrence against its unrolled definition: the output at step
    /// t is `q_t^T S_t / sqrt(d)` with `S_t = exp(g_t) S_{t-1} + k_t
    /// (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T`, here written with plain
    /// `S[i][j]` indexing (not the transposed rows [`recur_row`] keeps),
    /// in f64, from the same normalised q and k.
    #[test]
    fn recurrence_matches_the_delta_rule_written_out() {
        let s = spec();
        let (d, steps) = (s.head_dim, 5);
        let mut state = LayerState::new(&s);
        let mut naive = vec![vec![vec![0f64; d]; d]; s.v_heads];
        for t in 0..steps {
            let mut qkv = values(s.conv_dim(), t as u32 + 1);
            let beta: Vec<f32> = values(s.v_heads, 100 + t as u32)
                .iter()
                .map(|&b| sigmoid(b))
                .collect();
            let g: Vec<f32> = values(s.v_heads, 200 + t as u32)
                .iter()
                .map(|&a| -softplus(a))
                .collect();
            let mut normed = qkv.clone();
            l2_norm_heads(&mut normed[..2 * d], d, 1e-6);
            let mut out = vec![0f32; s.value_dim()];
            let input = RowInputs {
                qkv: &mut qkv,
                beta: &beta,
                g: &g,
            };
            recur_row(&s, &mut state, input, 1e-6, &mut out);
            for (h, sm) in naive.iter_mut().enumerate() {
                let (q, k) = (&normed[..d], &normed[d..2 * d]);
                let v = &normed[2 * d + h * d..2 * d + (h + 1) * d];
                let decay = f64::from(g[h]).exp();
                sm.iter_mut().flatten().for_each(|x| *x *= decay);
                for j in 0..d {
                    let sk: f64 = (0..d).map(|i| sm[i][j] * f64::from(k[i])).sum();
                    let delta = (f64::from(v[j]) - sk) * f64::from(beta[h]);
                    (0..d).for_each(|i| sm[i][j] += f64::from(k[i]) * delta);
                }
                for j in 0..d {
                    let want: f64 =
                        (0..d).map(|i| sm[i][j] * f64::from(q[i])).sum::<f64>() / (d as f64).sqrt();
                    let got = f64::from(out[h * d + j]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "step {t} head {h} dim {j}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The convolution against its definition: channel c's output at step
    /// t is `silu(sum_i w[c][i] x[t - (K-1) + i])`, inputs before the
    /// first step zero.
    #[test]
    fn convolution_is_causal_over_the_last_kernel_inputs() {
        let s = spec();
        let (k, c) = (s.conv_kernel, s.conv_dim());
        let w = values(c * k, 7);
        let inputs: Vec<Vec<f32>> = (0..6).map(|t| values(c, 50 + t)).collect();
        let mut state = LayerState::new(&s);
        for (t, x) in inputs.iter().enumerate() {
            let mut row = x.clone();
            conv_row(&s, &w, &mut state, &mut row);
            for ch in 0..c {
                let sum: f32 = (0..k)
                    .map(|i| {
                        let at = t as isize - (k as isize - 1) + i as isize;
                        let x = if at < 0 { 0.0 } else { inputs[at as usize][ch] };
                        w[ch * k + i] * x
                    })
                    .sum();
                assert!((row[ch] - silu(sum)).abs() < 1e-6, "step {t} channel {ch}");
            }
        }
    }
}
