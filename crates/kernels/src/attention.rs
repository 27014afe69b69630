//! What an attention kernel is asked to compute: the head layout, one query
//! row's job over the KV pool, and the element types pool rows are stored
//! in. A leaf, like [`crate::format`].

use half::f16;
use half::slice::HalfFloatSliceExt;

/// An element type of the KV pool's rows (f32, or f16 to halve the bytes).
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Copies `src` into `dst` (same length) as f32.
    fn load(src: &[Self], dst: &mut [f32]);
    /// `src` itself when it already is f32, so readers can skip the copy.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
}

impl KvElem for f32 {
    #[inline(always)]
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    #[inline(always)]
    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn load(src: &[f16], dst: &mut [f32]) {
        // Uses F16C when the CPU has it (checked once by `half`).
        src.convert_to_f32_slice(dst);
    }

    #[inline(always)]
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
}

/// The sigmoid's slope in gpt-oss's clamped SwiGLU ([`crate::swiglu_oai_mul`]).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
/// The clamp of gpt-oss's SwiGLU inputs.
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// Head layout of the attention.
#[derive(Clone, Copy, Debug)]
pub struct HeadShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// How a query and a key make a score: `scale * q.k`, then, with a softcap
/// `c` (Gemma 2), `c * tanh(score / c)`, which bounds scores to `(-c, c)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreRule {
    /// Multiplies every dot product (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// The cap of `c * tanh(score / c)`; `None` leaves scores as they are.
    pub softcap: Option<f32>,
}

impl ScoreRule {
    /// The usual rule: `1 / sqrt(head_dim)` and no cap.
    pub fn standard(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
        }
    }
}

/// `c * tanh(x / c)` over a row of scores, with `tanh(y) = 2 sigmoid(2y) - 1`
/// on the fast exponential so the loop vectorizes.
#[inline(always)]
pub(crate) fn softcap(scores: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for s in scores {
        let y = *s * inv;
        let e = crate::fast_exp::exp_nonpositive(-2.0 * y.abs());
        let t = (1.0 - e) / (1.0 + e);
        *s = cap * if y >= 0.0 { t } else { -t };
    }
}

/// One query row's attention: `softmax(score(q, K)) V` over the pool rows
/// at `keys` (see [`ScoreRule`]). `q` is `[n_heads * head_dim]`; the pools
/// are `[slots, n_kv_heads * head_dim]`.
#[derive(Clone, Copy)]
pub struct RowJob<'a, T> {
    /// The query row, every head.
    pub q: &'a [f32],
    /// The K rows of the pool.
    pub k_pool: &'a [T],
    /// The V rows of the pool.
    pub v_pool: &'a [T],
    /// Pool rows this query attends to, in position order.
    pub keys: &'a [u32],
    /// The head layout.
    pub shape: HeadShape,
    /// How scores are made.
    pub rule: ScoreRule,
    /// Per query head, a learned logit that joins the softmax's
    /// denominator but weighs no value (gpt-oss's attention sinks).
    pub sinks: Option<&'a [f32]>,
}

/// What a head's output `sum_j e^(s_j - max) v_j` is multiplied by:
/// `1 / sum` without a sink, `1 / (sum + e^(sink - max))` with one (the
/// sink as one more score in the softmax), computed without overflow when
/// the sink is far above every score.
#[inline]
pub(crate) fn normalizer(sum: f32, max: f32, sink: Option<f32>) -> f32 {
    match sink {
        None => 1.0 / sum,
        Some(s) if s <= max => 1.0 / (sum + (s - max).exp()),
        Some(s) => {
            let shift = (max - s).exp();
            shift / (sum * shift + 1.0)
        }
    }
}
