//! The unit of work of the blocked (flash-style) attention in
//! the model's `flash` module: one KV head's packed key blocks
//! against a few query rows, with an online softmax. Generic over the inner
//! loops ([`Micro`]): plain Rust in [`super::scalar`], AVX2 and AVX-512 in
//! `x86`, and bf16 dot products (f32 sums) in `x86::avx512bf16`.

use crate::attention::{HeadShape, ScoreRule, normalizer, softcap};
use crate::fast_exp::exp_nonpositive;

/// Keys per block.
pub const BK: usize = 64;

/// One unit of blocked attention: a few query rows of one sequence against
/// one KV head's packed keys and values.
pub struct UnitJob<'a> {
    /// `[rows][n_heads * d]`: the unit's query rows, every head.
    pub q: &'a [f32],
    /// This KV head's keys and values, packed as the unit's build reads
    /// them ([`FlashUnit::packing`]).
    pub packed: Packed<'a>,
    /// The attention's head layout.
    pub shape: HeadShape,
    /// The KV head whose keys and values these are.
    pub kv_head: usize,
    /// Query rows in the unit.
    pub rows: usize,
    /// Position of the first row; row `r` sees keys `0..=first_pos + r`
    /// (the last `window` of them with a sliding window).
    pub first_pos: usize,
    /// Position of the first packed key: a multiple of [`BK`], so a row's
    /// keys fall in the same blocks however many were packed before them.
    pub first_key: usize,
    /// Keys a row sees with a sliding window, itself included.
    pub window: Option<usize>,
    /// How scores are made.
    pub rule: ScoreRule,
    /// Per query head (all heads, not only this KV head's), a learned
    /// logit that joins the softmax's denominator (gpt-oss's sinks).
    pub sinks: Option<&'a [f32]>,
}

/// The packed keys and values of one KV head, in blocks of [`BK`] keys;
/// key `j` of block `b` is at position `first_key + b * BK + j`.
#[derive(Clone, Copy, Debug)]
pub enum Packed<'a> {
    /// f32: keys `[block][d][BK]` (transposed per block), values as [`Values`].
    F32 {
        /// `[block][d][BK]`, zero past the last key.
        kt: &'a [f32],
        /// The values.
        v: Values<'a>,
    },
    /// bf16 pairs, each `u32` two bf16 (the lower half first), made by
    /// [`crate::pack_keys_bf16`] and [`crate::pack_values_bf16`]: keys
    /// `[block][d / 2][BK]` (dimensions `2i, 2i + 1` of one key), values
    /// `[block][BK / 2][d]` (keys `2j, 2j + 1` of one column); zero past
    /// the last key.
    Bf16 {
        /// `[block][d / 2][BK]`.
        kt: &'a [u32],
        /// `[block][BK / 2][d]`.
        v: &'a [u32],
    },
}

/// How a build of the unit wants keys and values packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// [`Packed::F32`].
    F32,
    /// [`Packed::Bf16`].
    Bf16,
}

/// A build of the blocked attention unit and the packing it reads.
#[derive(Clone, Copy, Debug)]
pub struct FlashUnit {
    /// A short name for tests and logs (`avx512`, `avx512-bf16`).
    pub name: &'static str,
    /// The packing the unit reads.
    pub packing: Packing,
    /// The unit.
    pub run: UnitFn,
    /// Widest head the unit takes.
    pub max_head_dim: usize,
}

/// One f32 key block: `kt` `[d][BK]` and the block's value rows.
pub(crate) struct F32Block<'a> {
    pub(crate) kt: &'a [f32],
    pub(crate) v: [&'a [f32]; BK],
}

/// A block of keys and values as one build's loops read it.
pub(crate) trait BlockOf<'a> {
    /// Block `b` of `packed`, whose keys from `b * BK` on number `keys`
    /// (values past them are never read). Panics on the other packing.
    fn of(packed: &Packed<'a>, b: usize, keys: usize, d: usize) -> Self;
}

impl<'a> BlockOf<'a> for F32Block<'a> {
    #[inline(always)]
    fn of(packed: &Packed<'a>, b: usize, keys: usize, d: usize) -> Self {
        let Packed::F32 { kt, v } = *packed else {
            panic!("an f32 unit was handed bf16 blocks");
        };
        let mut rows: [&[f32]; BK] = [&[]; BK];
        v.block_rows(b, keys, d, &mut rows);
        F32Block {
            kt: &kt[b * BK * d..(b + 1) * BK * d],
            v: rows,
        }
    }
}

/// Where a unit reads its values: V rows need no transpose, so an f32
/// pool is read in place through the slot list instead of being copied.
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    /// `[block * BK + j][d]`: packed rows, in the blocks of the keys.
    Packed(&'a [f32]),
    /// Rows of a `[slot][stride]` pool: key position `first_key + i` is at
    /// `pool[slots[i] * stride + offset..][..d]`.
    Pool {
        /// The V pool, `[slot][stride]`.
        pool: &'a [f32],
        /// Slots of key positions `first_key..`.
        slots: &'a [u32],
        /// Floats per slot (every KV head).
        stride: usize,
        /// This KV head's first column.
        offset: usize,
    },
}

impl<'a> Values<'a> {
    /// The rows of block `b` that hold keys (at most `keys` of them) into
    /// `rows`; the rest are left empty, as `pv` never reads them.
    #[inline(always)]
    fn block_rows(&self, b: usize, keys: usize, d: usize, rows: &mut [&'a [f32]; BK]) {
        let n = keys.min(BK);
        match *self {
            Values::Packed(v) => {
                let block = &v[b * BK * d..(b + 1) * BK * d];
                for (r, row) in rows.iter_mut().zip(block.chunks_exact(d)).take(n) {
                    *r = row;
                }
            }
            Values::Pool {
                pool,
                slots,
                stride,
                offset,
            } => {
                for (r, &slot) in rows.iter_mut().zip(&slots[b * BK..]).take(n) {
                    let at = slot as usize * stride + offset;
                    *r = &pool[at..at + d];
                }
            }
        }
        rows[n..].fill(&[]);
    }
}

impl UnitJob<'_> {
    /// Keys `lo..=pos` that a row at `pos` sees.
    #[inline(always)]
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// The first key position to pack for rows from `first_pos` on: the
/// start of the block holding the earliest key the first row sees.
pub fn first_packed_key(first_pos: usize, window: Option<usize>) -> usize {
    let lo = window.map_or(0, |w| (first_pos + 1).saturating_sub(w));
    lo / BK * BK
}

/// Per-thread buffers of a unit; `out` holds its result `[rows][group][d]`.
#[derive(Default)]
pub struct UnitBuf {
    q: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    /// The unit's result, `[rows][group][d]`.
    pub out: Vec<f32>,
}

/// A SIMD build of [`unit_impl`].
pub type UnitFn = fn(&UnitJob<'_>, &mut UnitBuf);

/// The inner loops of a unit: scores of `R` query vectors against one key
/// block, and their weighted sum of the block's values.
pub(crate) trait Micro {
    /// One block of keys and values as the loops read it.
    type Block<'a>: BlockOf<'a>;

    /// `s[r][j] = q[r] . k_j` for the `BK` keys of a block.
    ///
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn qk<const R: usize>(
        q: &[f32],
        d: usize,
        block: &Self::Block<'_>,
        s: &mut [[f32; BK]; R],
    );

    /// Rounds softmax weights to the precision `pv` multiplies them in, so
    /// that the running sum is the sum of the weights actually applied
    /// (the output's weights then add up to one). f32 builds keep them.
    ///
    /// # Safety
    /// As for [`Micro::qk`].
    #[inline(always)]
    unsafe fn round_weights(_p: &mut [f32; BK]) {}

    /// `acc[r] += sum_j p[r][j] * v[j]` over the first `n` keys of a block
    /// (`p[r][j]` is zero for `n <= j`).
    ///
    /// # Safety
    /// As for [`Micro::qk`].
    unsafe fn pv<const R: usize>(
        p: &[[f32; BK]; R],
        block: &Self::Block<'_>,
        d: usize,
        n: usize,
        acc: &mut [f32],
    );
}

/// Attention of one unit's query vectors over every key block they may see,
/// `R` query vectors per pass over a block.
///
/// # Safety
/// The CPU must have the instructions `M` uses.
#[inline(always)]
pub(crate) unsafe fn unit_impl<'a, M: Micro, const R: usize>(job: &UnitJob<'a>, buf: &mut UnitBuf) {
    let d = job.shape.head_dim;
    let group = job.shape.n_heads / job.shape.n_kv_heads;
    let nq = job.rows * group;
    let scale = job.rule.scale;
    debug_assert!(job.first_key.is_multiple_of(BK) && job.first_key <= job.first_pos);
    // Query vectors in order (row, head of the group), pre-scaled.
    buf.q.clear();
    for r in 0..job.rows {
        let heads = job.kv_head * group * d..(job.kv_head + 1) * group * d;
        let row = &job.q[r * job.shape.n_heads * d..][heads];
        buf.q.extend(row.iter().map(|x| x * scale));
    }
    buf.m.clear();
    buf.m.resize(nq, f32::NEG_INFINITY);
    buf.l.clear();
    buf.l.resize(nq, 0.0);
    buf.out.clear();
    buf.out.resize(nq * d, 0.0);

    let last_pos = job.first_pos + job.rows - 1;
    let blocks = (last_pos - job.first_key) / BK + 1;
    let mut p = [[0f32; BK]; R];
    for b in 0..blocks {
        let first_key = job.first_key + b * BK;
        let block = M::Block::<'a>::of(&job.packed, b, last_pos + 1 - first_key, d);
        let mut i = 0;
        while i < nq {
            let take = R.min(nq - i);
            // Keys `from..valid` of this block that vector i + t may see
            // (the causal mask, and the sliding window's lower bound).
            let (mut from, mut valid) = ([0usize; R], [0usize; R]);
            for t in 0..take {
                let pos = job.first_pos + (i + t) / group;
                valid[t] = (pos + 1).saturating_sub(first_key).min(BK);
                from[t] = job
                    .first_visible(pos)
                    .saturating_sub(first_key)
                    .min(valid[t]);
            }
            let most = valid.iter().copied().max().unwrap_or(0);
            let any = (0..take).any(|t| from[t] < valid[t]);
            if any {
                let q = &buf.q[i * d..(i + take) * d];
                if take == R {
                    // SAFETY: the caller vouches for M's instructions.
                    unsafe { M::qk::<R>(q, d, &block, &mut p) };
                } else {
                    for t in 0..take {
                        let mut one = [[0f32; BK]; 1];
                        // SAFETY: as above.
                        unsafe { M::qk::<1>(&q[t * d..(t + 1) * d], d, &block, &mut one) };
                        p[t] = one[0];
                    }
                }
                if let Some(cap) = job.rule.softcap {
                    for row in p.iter_mut().take(take) {
                        softcap(&mut row[..most], cap);
                    }
                }
                for t in 0..take {
                    softmax_step::<M>(
                        &mut p[t],
                        from[t],
                        valid[t],
                        &mut buf.m[i + t],
                        &mut buf.l[i + t],
                        &mut buf.out[(i + t) * d..(i + t + 1) * d],
                    );
                }
                let out = &mut buf.out[i * d..(i + take) * d];
                if take == R {
                    // SAFETY: as above.
                    unsafe { M::pv::<R>(&p, &block, d, most, out) };
                } else {
                    for t in 0..take {
                        let one = [p[t]; 1];
                        let o = &mut out[t * d..(t + 1) * d];
                        // SAFETY: as above.
                        unsafe { M::pv::<1>(&one, &block, d, most, o) };
                    }
                }
            }
            i += take;
        }
    }
    for (i, ((o, &l), &m)) in buf
        .out
        .chunks_exact_mut(d)
        .zip(&buf.l)
        .zip(&buf.m)
        .enumerate()
    {
        // Vector i is head `i % group` of the KV head's group.
        let sink = job
            .sinks
            .and_then(|s| s.get(job.kv_head * group + i % group).copied());
        let inv = normalizer(l, m, sink);
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Online softmax over one block: turns scores `s[from..valid]` into
/// weights relative to the new running max (zero outside; rounded as `M`
/// applies them), and rescales the
/// running sum `l` and output `acc` when the max grew. Straight loops over
/// the whole block so that they vectorize.
#[inline(always)]
fn softmax_step<M: Micro>(
    s: &mut [f32; BK],
    from: usize,
    valid: usize,
    m: &mut f32,
    l: &mut f32,
    acc: &mut [f32],
) {
    if from >= valid {
        s.fill(0.0);
        return;
    }
    s[..from].fill(f32::NEG_INFINITY);
    s[valid..].fill(f32::NEG_INFINITY);
    let mut lanes = [f32::NEG_INFINITY; 8];
    for c in s.chunks_exact(8) {
        for (a, &x) in lanes.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let block_max = lanes.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    let new_max = m.max(block_max);
    for x in s.iter_mut() {
        *x = exp_nonpositive(*x - new_max);
    }
    s[..from].fill(0.0);
    s[valid..].fill(0.0);
    // SAFETY: the unit's caller vouches for M's instructions.
    unsafe { M::round_weights(s) };
    let mut sums = [0f32; 8];
    for c in s.chunks_exact(8) {
        for (a, &x) in sums.iter_mut().zip(c) {
            *a += x;
        }
    }
    let block_sum: f32 = sums.iter().sum();
    if new_max > *m {
        // The first block has m = -inf: the factor is ~0 on an empty sum and output.
        let factor = exp_nonpositive(*m - new_max);
        *l *= factor;
        acc.iter_mut().for_each(|x| *x *= factor);
        *m = new_max;
    }
    *l += block_sum;
}
