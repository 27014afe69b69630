//! Blocked (flash-style) attention for multi-token chunks of one sequence.
//!
//! The row kernel in [`super::attention`] reads every key of a row's prefix
//! by slot, once per query row: a prefill chunk of `n` rows over `p` keys
//! gathers `n * p` scattered K and V rows and keeps a `p`-long score row
//! per head. Here the chunk's keys are first packed once per KV head into
//! contiguous blocks of [`BK`] keys (K transposed, so one key block's scores
//! are broadcast-FMAs over whole vectors), then every unit of work (one KV
//! head, [`BR`] query rows, all the query heads of that KV head's group)
//! walks the blocks with an online softmax: a running max and sum per query
//! vector, the accumulated V rescaled when the max grows. Scores never
//! outlive one block, so the working set stays in cache at any length.
//! Values need no transpose: from an f32 pool the unit reads them in place
//! through the slot list ([`Values::Pool`]), so a decode step copies only
//! its keys; an f16 pool's values are packed (converted) with the keys.
//! A bf16 unit (CPUs with AVX512_BF16) reads keys and values packed as
//! bf16 pairs instead ([`Packed::Bf16`]), both per block.
//!
//! This module packs and schedules; the unit's loops are in
//! `zinfer_kernels` (AVX-512, bf16 or AVX2 where the CPU has them, plain
//! Rust otherwise).

use std::cell::RefCell;
use std::sync::Mutex;

use zinfer_kernels::{
    BK, FlashUnit, HeadShape, KvElem, Packed, Packing, ScoreRule, UnitBuf, UnitJob, Values,
    first_packed_key,
};
/// Query rows (each with all heads of one KV group) per unit of work.
const BR: usize = 32;

/// The rows of one sequence's chunk in a step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkRows<'a> {
    /// Index of the chunk's first row in the step's `q` / `out`.
    pub(crate) first_row: usize,
    /// Rows in the chunk.
    pub(crate) len: usize,
    /// Position of the first row (keys before it are the cached prefix).
    pub(crate) start_pos: usize,
    /// Slots of positions `0..start_pos + len`.
    pub(crate) slots: &'a [u32],
}

/// Whether the blocked kernel handles this head width: whole vectors of 16.
pub(crate) fn supports(shape: HeadShape) -> bool {
    shape.head_dim.is_multiple_of(16) && shape.n_heads.is_multiple_of(shape.n_kv_heads)
}

/// Which keys a row sees and how its scores are made: every key up to its
/// own position, or with a sliding window only the last `window`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keys<'a> {
    pub(crate) window: Option<usize>,
    pub(crate) rule: ScoreRule,
    /// Per query head, a logit that joins the softmax's denominator (gpt-oss).
    pub(crate) sinks: Option<&'a [f32]>,
}

/// Packed keys and values of one chunk, reused between layers.
#[derive(Debug, Default)]
pub(crate) struct FlashScratch {
    /// `[kv_head][block][d][BK]`: K transposed per block, zero past the last key.
    kt: Vec<f32>,
    /// `[kv_head][block * BK + j][d]`: V rows, zero past the last key; only
    /// for pools that are not f32 (those are read in place).
    v: Vec<f32>,
    /// For a bf16 unit: `[kv_head][block]` key blocks of [`Packed::Bf16`].
    kt16: Vec<u32>,
    /// For a bf16 unit: `[kv_head][block]` value blocks of [`Packed::Bf16`].
    v16: Vec<u32>,
}

/// Whether `unit` takes this head width; else the f32 unit runs.
pub(crate) fn unit_for(unit: FlashUnit, shape: HeadShape) -> FlashUnit {
    if shape.head_dim <= unit.max_head_dim {
        unit
    } else {
        zinfer_kernels::flash_unit()
    }
}

/// `out[r] = softmax(score(q[r], K)) V` for the rows of `chunk`, each
/// attending to the keys at positions `0..=` its own (the last `window` of
/// them with a sliding window). Key blocks before the first row's window
/// are not packed.
///
/// `q` and `out` are `[step_rows, n_heads * d]`; the pools are
/// `[slots, n_kv_heads * d]`. `unit` is a build of the blocked unit
/// ([`zinfer_kernels::flash_unit`]); keys and values are packed as it reads them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_chunk<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    chunk: ChunkRows<'_>,
    shape: HeadShape,
    keys: Keys<'_>,
    out: &mut [f32],
    scratch: &mut FlashScratch,
    parallel: bool,
    unit: FlashUnit,
) {
    let d = shape.head_dim;
    let (n_kv, q_len) = (shape.n_kv_heads, shape.n_heads * d);
    let kv_dim = n_kv * d;
    let n_keys = chunk.start_pos + chunk.len;
    assert!(chunk.slots.len() >= n_keys && supports(shape) && d <= unit.max_head_dim);
    assert!(q.len() >= (chunk.first_row + chunk.len) * q_len);
    assert!(out.len() >= (chunk.first_row + chunk.len) * q_len);
    let first_key = first_packed_key(chunk.start_pos, keys.window);
    let blocks = (n_keys - first_key).div_ceil(BK);
    let block_len = BK * d;
    let bf16 = unit.packing == Packing::Bf16;
    let v_len = if bf16 || T::as_f32(v_pool).is_some() {
        0
    } else {
        block_len
    };
    let (kt_len, pair_len) = if bf16 {
        (0, block_len / 2)
    } else {
        (block_len, 0)
    };
    scratch.kt.resize(n_kv * blocks * kt_len, 0.0);
    scratch.v.resize(n_kv * blocks * v_len, 0.0);
    scratch.kt16.resize(n_kv * blocks * pair_len, 0);
    scratch.v16.resize(n_kv * blocks * pair_len, 0);

    if bf16 {
        // Pack: one unit per (KV head, key block), as below.
        let parts: Vec<Mutex<(&mut [u32], &mut [u32])>> = scratch
            .kt16
            .chunks_mut(pair_len)
            .zip(scratch.v16.chunks_mut(pair_len))
            .map(Mutex::new)
            .collect();
        let copies = n_kv * n_keys * d * 2;
        zinfer_kernels::run_units(n_kv * blocks, copies * 8, parallel, |range| {
            let mut rows = Vec::new();
            for u in range {
                let (g, b) = (u / blocks, u % blocks);
                // Each part is handed to exactly one unit: the lock is uncontended.
                let mut part = parts[u].lock().unwrap_or_else(|e| e.into_inner());
                let (kt, v) = &mut *part;
                let from = first_key + b * BK;
                let slots = &chunk.slots[from..n_keys.min(from + BK)];
                let pools = (k_pool, v_pool);
                pack_block_bf16(pools, slots, g * d, kv_dim, d, kt, v, &mut rows);
            }
        });
    } else {
        // Pack: one unit per (KV head, key block).
        let kt_parts: Vec<Mutex<&mut [f32]>> =
            scratch.kt.chunks_mut(block_len).map(Mutex::new).collect();
        let mut v_parts: Vec<Mutex<&mut [f32]>> = match v_len {
            0 => Vec::new(),
            len => scratch.v.chunks_mut(len).map(Mutex::new).collect(),
        };
        v_parts.resize_with(n_kv * blocks, || Mutex::new(&mut []));
        let copies = n_kv * n_keys * d * 2;
        zinfer_kernels::run_units(n_kv * blocks, copies * 8, parallel, |range| {
            let mut row = vec![0f32; d];
            for u in range {
                let (g, b) = (u / blocks, u % blocks);
                // Each part is handed to exactly one unit: the locks are uncontended.
                let mut kt = kt_parts[u].lock().unwrap_or_else(|e| e.into_inner());
                let mut v = v_parts[u].lock().unwrap_or_else(|e| e.into_inner());
                let from = first_key + b * BK;
                let slots = &chunk.slots[from..n_keys.min(from + BK)];
                pack_block(
                    k_pool,
                    v_pool,
                    slots,
                    g * d,
                    kv_dim,
                    &mut kt,
                    &mut v,
                    &mut row,
                );
            }
        });
    }

    // Attend: one unit per (KV head, block of at most BR rows), the latest
    // rows (the most keys) first so the tail of the parallel region is
    // short. Blocks are of equal size, so a 50-row chunk is two units of
    // 25 rows per head rather than 32 + 18, which would leave one thread idle.
    let row_blocks = chunk.len.div_ceil(BR);
    let br = chunk.len.div_ceil(row_blocks.max(1));
    let out_rows: Vec<Mutex<&mut [f32]>> = out[chunk.first_row * q_len..]
        .chunks_mut(q_len)
        .take(chunk.len)
        .map(Mutex::new)
        .collect();
    let macs = n_keys * chunk.len * q_len * 2;
    let (kt, v) = (&scratch.kt[..], &scratch.v[..]);
    let (kt16, v16) = (&scratch.kt16[..], &scratch.v16[..]);
    zinfer_kernels::run_units(n_kv * row_blocks, macs, parallel, |range| {
        let mut buf = UnitBuf::default();
        for u in range {
            let (rb, g) = (row_blocks - 1 - u / n_kv, u % n_kv);
            let rows = rb * br..chunk.len.min((rb + 1) * br);
            let head = |len: usize| g * blocks * len..(g + 1) * blocks * len;
            let packed = if bf16 {
                Packed::Bf16 {
                    kt: &kt16[head(pair_len)],
                    v: &v16[head(pair_len)],
                }
            } else {
                Packed::F32 {
                    kt: &kt[head(kt_len)],
                    v: values(v_pool, chunk.slots, first_key, g, shape, &v[head(v_len)]),
                }
            };
            let job = UnitJob {
                q: &q[(chunk.first_row + rows.start) * q_len..(chunk.first_row + rows.end) * q_len],
                packed,
                shape,
                kv_head: g,
                rows: rows.len(),
                first_pos: chunk.start_pos + rows.start,
                first_key,
                window: keys.window,
                rule: keys.rule,
                sinks: keys.sinks,
            };
            (unit.run)(&job, &mut buf);
            let group = shape.n_heads / n_kv;
            for (i, r) in rows.enumerate() {
                // Each unit writes only its own heads of a row; locks are held briefly.
                let mut o = out_rows[r].lock().unwrap_or_else(|e| e.into_inner());
                let heads = g * group * d..(g + 1) * group * d;
                o[heads].copy_from_slice(&buf.out[i * group * d..(i + 1) * group * d]);
            }
        }
    });
}

/// Attention of one-row chunks (decode tokens), all in one parallel region:
/// each unit packs one sequence's keys for one KV head into its thread's
/// buffers, while they are in cache, and attends to them at once. The
/// packing and the unit are [`attend_chunk`]'s, so a row gets the same bits
/// on either path; what this saves is two parallel regions per sequence
/// per layer (with 16 sequences, 32 regions of three units become one of 48)
/// and the round trip of every packed block through a shared scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_rows<T: KvElem>(
    q: &[f32],
    k_pool: &[T],
    v_pool: &[T],
    chunks: &[ChunkRows<'_>],
    shape: HeadShape,
    keys: Keys<'_>,
    out: &mut [f32],
    parallel: bool,
    unit: FlashUnit,
) {
    thread_local! {
        static PACKED: RefCell<RowPacking> = RefCell::default();
    }
    let d = shape.head_dim;
    let (n_kv, q_len) = (shape.n_kv_heads, shape.n_heads * d);
    let (kv_dim, group) = (n_kv * d, shape.n_heads / n_kv);
    assert!(supports(shape) && d <= unit.max_head_dim);
    for c in chunks {
        assert!(c.len == 1 && c.slots.len() > c.start_pos);
        assert!(q.len() >= (c.first_row + 1) * q_len && out.len() >= (c.first_row + 1) * q_len);
    }
    let bf16 = unit.packing == Packing::Bf16;
    // One lock per (row, KV head): the part of `out` one unit writes.
    let parts: Vec<Mutex<&mut [f32]>> = out.chunks_mut(group * d).map(Mutex::new).collect();
    let macs = chunks.iter().map(|c| c.start_pos + 1).sum::<usize>() * q_len * 2;
    zinfer_kernels::run_units(chunks.len() * n_kv, macs, parallel, |range| {
        PACKED.with_borrow_mut(|p| {
            let mut row = vec![0f32; d];
            for u in range {
                let (chunk, g) = (&chunks[u / n_kv], u % n_kv);
                let n_keys = chunk.start_pos + 1;
                let first_key = first_packed_key(chunk.start_pos, keys.window);
                let blocks = (n_keys - first_key).div_ceil(BK);
                let block_slots = |b: usize| {
                    let from = first_key + b * BK;
                    &chunk.slots[from..n_keys.min(from + BK)]
                };
                let packed = if bf16 {
                    let pair_len = BK * d / 2;
                    p.kt16.resize(blocks * pair_len, 0);
                    p.v16.resize(blocks * pair_len, 0);
                    let blocks_of = p.kt16.chunks_mut(pair_len).zip(p.v16.chunks_mut(pair_len));
                    for (b, (kt, v)) in blocks_of.take(blocks).enumerate() {
                        let pools = (k_pool, v_pool);
                        let slots = block_slots(b);
                        pack_block_bf16(pools, slots, g * d, kv_dim, d, kt, v, &mut p.rows);
                    }
                    Packed::Bf16 {
                        kt: &p.kt16[..blocks * pair_len],
                        v: &p.v16[..blocks * pair_len],
                    }
                } else {
                    let v_len = if T::as_f32(v_pool).is_some() {
                        0
                    } else {
                        BK * d
                    };
                    p.kt.resize(blocks * BK * d, 0.0);
                    p.v.resize(blocks * v_len, 0.0);
                    let v_parts =
                        p.v.chunks_mut(v_len.max(1))
                            .chain(std::iter::repeat_with(|| &mut [][..]));
                    let blocks_of = p.kt.chunks_mut(BK * d).zip(v_parts);
                    for (b, (kt, v)) in blocks_of.take(blocks).enumerate() {
                        let slots = block_slots(b);
                        pack_block(k_pool, v_pool, slots, g * d, kv_dim, kt, v, &mut row);
                    }
                    let v = &p.v[..blocks * v_len];
                    Packed::F32 {
                        kt: &p.kt[..blocks * BK * d],
                        v: values(v_pool, chunk.slots, first_key, g, shape, v),
                    }
                };
                let job = UnitJob {
                    q: &q[chunk.first_row * q_len..(chunk.first_row + 1) * q_len],
                    packed,
                    shape,
                    kv_head: g,
                    rows: 1,
                    first_pos: chunk.start_pos,
                    first_key,
                    window: keys.window,
                    rule: keys.rule,
                    sinks: keys.sinks,
                };
                (unit.run)(&job, &mut p.buf);
                // Each part is handed to exactly one unit: the lock is uncontended.
                let mut o = parts[chunk.first_row * n_kv + g]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                o.copy_from_slice(&p.buf.out[..group * d]);
            }
        });
    });
}

/// A thread's buffers for [`attend_rows`]: one sequence's packed keys and
/// values for one KV head, and the unit's buffers.
#[derive(Default)]
struct RowPacking {
    kt: Vec<f32>,
    v: Vec<f32>,
    kt16: Vec<u32>,
    v16: Vec<u32>,
    /// f16 rows converted to f32 on their way to bf16.
    rows: Vec<f32>,
    buf: UnitBuf,
}

/// Packs the keys and values at `slots` (at most [`BK`]) of the KV head at
/// column `offset` for a bf16 unit ([`Packed::Bf16`]); rows of an f16 pool
/// go through f32 in `rows`.
#[allow(clippy::too_many_arguments)]
fn pack_block_bf16<T: KvElem>(
    (k_pool, v_pool): (&[T], &[T]),
    slots: &[u32],
    offset: usize,
    kv_dim: usize,
    d: usize,
    kt: &mut [u32],
    v: &mut [u32],
    rows: &mut Vec<f32>,
) {
    with_rows(k_pool, slots, offset, kv_dim, d, rows, |r| {
        zinfer_kernels::pack_keys_bf16(r, d, kt)
    });
    with_rows(v_pool, slots, offset, kv_dim, d, rows, |r| {
        zinfer_kernels::pack_values_bf16(r, d, v)
    });
}

/// Hands `f` the rows at `slots` of the KV head at column `offset` as f32:
/// in place from an f32 pool, else converted into `buf`.
fn with_rows<T: KvElem>(
    pool: &[T],
    slots: &[u32],
    offset: usize,
    kv_dim: usize,
    d: usize,
    buf: &mut Vec<f32>,
    f: impl FnOnce(&[&[f32]]),
) {
    let mut rows: [&[f32]; BK] = [&[]; BK];
    let n = slots.len().min(BK);
    match T::as_f32(pool) {
        Some(pool) => {
            for (r, &slot) in rows.iter_mut().zip(slots) {
                let at = slot as usize * kv_dim + offset;
                *r = &pool[at..at + d];
            }
            f(&rows[..n]);
        }
        None => {
            buf.resize(n * d, 0.0);
            for (row, &slot) in buf.chunks_exact_mut(d).zip(slots) {
                let at = slot as usize * kv_dim + offset;
                T::load(&pool[at..at + d], row);
            }
            for (r, row) in rows.iter_mut().zip(buf.chunks_exact(d)) {
                *r = row;
            }
            f(&rows[..n]);
        }
    }
}

/// Keys [`pack_block`] transposes together from an f32 pool (8 and 32
/// measured slower on a 2-core AVX-512 machine).
const KEYS_AT_ONCE: usize = 16;

/// Packs the keys at `slots` (at most [`BK`]) of the KV head at column
/// `offset`: K transposed into `kt` (`[d][BK]`) and, unless the values are
/// read in place from an f32 pool ([`values`]), V rows into `v` (`[BK][d]`);
/// zeros past the last key.
#[allow(clippy::too_many_arguments)]
fn pack_block<T: KvElem>(
    k_pool: &[T],
    v_pool: &[T],
    slots: &[u32],
    offset: usize,
    kv_dim: usize,
    kt: &mut [f32],
    v: &mut [f32],
    row: &mut [f32],
) {
    let d = row.len();
    // From an f32 pool, 16 keys at a time: each column of the 16 is one
    // contiguous store instead of 16 strided ones. The same values land in
    // the same places as below.
    let mut packed = 0;
    if let (Some(pool), true) = (T::as_f32(k_pool), T::as_f32(v_pool).is_some()) {
        packed = slots.len() / KEYS_AT_ONCE * KEYS_AT_ONCE;
        for (group, keys) in slots[..packed].chunks_exact(KEYS_AT_ONCE).enumerate() {
            let rows: [&[f32]; KEYS_AT_ONCE] = std::array::from_fn(|i| {
                let at = keys[i] as usize * kv_dim + offset;
                &pool[at..at + d]
            });
            let first = group * KEYS_AT_ONCE;
            for (c, column) in kt.chunks_exact_mut(BK).take(d).enumerate() {
                let out = &mut column[first..first + KEYS_AT_ONCE];
                for (x, row) in out.iter_mut().zip(&rows) {
                    *x = row[c];
                }
            }
        }
    }
    for (j, &slot) in slots.iter().enumerate().skip(packed) {
        let at = slot as usize * kv_dim + offset;
        let k = match T::as_f32(&k_pool[at..at + d]) {
            Some(k) => k,
            None => {
                T::load(&k_pool[at..at + d], row);
                &*row
            }
        };
        for (c, &x) in k.iter().enumerate() {
            kt[c * BK + j] = x;
        }
        if T::as_f32(v_pool).is_none() {
            T::load(&v_pool[at..at + d], &mut v[j * d..(j + 1) * d]);
        }
    }
    for j in slots.len()..BK {
        for c in 0..d {
            kt[c * BK + j] = 0.0;
        }
    }
    if T::as_f32(v_pool).is_none() {
        v[slots.len() * d..BK * d].fill(0.0);
    }
}

/// The values of KV head `g` for keys `first_key..` at `slots` (the
/// sequence's whole slot list): read in place from an f32 pool, else the
/// rows packed into `packed`.
fn values<'a, T: KvElem>(
    v_pool: &'a [T],
    slots: &'a [u32],
    first_key: usize,
    g: usize,
    shape: HeadShape,
    packed: &'a [f32],
) -> Values<'a> {
    match T::as_f32(v_pool) {
        Some(pool) => Values::Pool {
            pool,
            slots: &slots[first_key..],
            stride: shape.n_kv_heads * shape.head_dim,
            offset: g * shape.head_dim,
        },
        None => Values::Packed(packed),
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use zinfer_kernels::test_data::random;

    /// Every key, `1 / sqrt(d)`, no cap.
    fn all_keys(shape: HeadShape) -> Keys<'static> {
        Keys {
            window: None,
            rule: ScoreRule::standard(shape.head_dim),
            sinks: None,
        }
    }

    /// Plain f64 softmax attention of row `r` (position `pos`) over
    /// `slots[..=pos]` (the last `window` of them with a window).
    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        slots: &[u32],
        shape: HeadShape,
        keys: Keys<'_>,
        r: usize,
        pos: usize,
    ) -> Vec<f64> {
        let d = shape.head_dim;
        let (qd, kvd) = (shape.n_heads * d, shape.n_kv_heads * d);
        let group = shape.n_heads / shape.n_kv_heads;
        let lo = keys.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let seen = &slots[lo..=pos];
        let mut out = vec![0f64; qd];
        for h in 0..shape.n_heads {
            let g = h / group;
            let s: Vec<f64> = seen
                .iter()
                .map(|&slot| {
                    let dot = (0..d)
                        .map(|c| {
                            f64::from(q[r * qd + h * d + c])
                                * f64::from(k[slot as usize * kvd + g * d + c])
                        })
                        .sum::<f64>()
                        * f64::from(keys.rule.scale);
                    match keys.rule.softcap {
                        Some(cap) => f64::from(cap) * (dot / f64::from(cap)).tanh(),
                        None => dot,
                    }
                })
                .collect();
            let sink = keys.sinks.map(|s| f64::from(s[h]));
            let m = s.iter().copied().chain(sink).fold(f64::MIN, f64::max);
            let z: f64 = s.iter().chain(&sink).map(|x| (x - m).exp()).sum();
            for c in 0..d {
                out[h * d + c] = seen
                    .iter()
                    .zip(&s)
                    .map(|(&slot, x)| {
                        (x - m).exp() / z * f64::from(v[slot as usize * kvd + g * d + c])
                    })
                    .sum();
            }
        }
        out
    }

    /// Runs one chunk of `len` rows after `start` cached positions through
    /// every SIMD build and compares with [`reference`].
    /// Returns the largest error of a bf16 unit (0 without one).
    fn check(shape: HeadShape, start: usize, len: usize, parallel: bool) -> f64 {
        check_keys(shape, all_keys(shape), start, len, parallel)
    }

    fn check_keys(
        shape: HeadShape,
        keys: Keys<'_>,
        start: usize,
        len: usize,
        parallel: bool,
    ) -> f64 {
        let d = shape.head_dim;
        let (qd, kvd) = (shape.n_heads * d, shape.n_kv_heads * d);
        let n_keys = start + len;
        let pool = n_keys + 17;
        let (k, v) = (random(pool * kvd, 2, 2.0), random(pool * kvd, 3, 2.0));
        // Scattered, non-monotonic slots, as a pool shared by many sequences has.
        let slots: Vec<u32> = (0..n_keys)
            .map(|i| ((i * 7919 + 5) % pool) as u32)
            .collect();
        let mut seen = slots.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n_keys, "slots must be distinct");
        // Two rows of another sequence before the chunk in the step.
        let first_row = 2;
        let q = random((first_row + len) * qd, 1, 2.0);
        let chunk = ChunkRows {
            first_row,
            len,
            start_pos: start,
            slots: &slots,
        };
        let mut worst_bf16 = 0f64;
        for unit in zinfer_kernels::flash_units() {
            let name = unit.name;
            // A bf16 unit against the reference on bf16 keys and values;
            // its queries and softmax weights are rounded too, which the
            // tolerance allows for.
            let bf16 = unit.packing == Packing::Bf16;
            let round = |x: &[f32]| -> Vec<f32> {
                x.iter()
                    .map(|&x| if bf16 { to_bf16(x) } else { x })
                    .collect()
            };
            let tolerance = if bf16 { BF16_TOLERANCE } else { 2e-5 };
            let (kb, vb) = (round(&k), round(&v));
            let mut out = vec![7f32; (first_row + len) * qd];
            let mut scratch = FlashScratch::default();
            attend_chunk(
                &q,
                &k,
                &v,
                chunk,
                shape,
                keys,
                &mut out,
                &mut scratch,
                parallel,
                unit,
            );
            assert!(
                out[..first_row * qd].iter().all(|&x| x == 7.0),
                "{name}: wrote other rows"
            );
            for i in 0..len {
                let want = reference(&q, &kb, &vb, &slots, shape, keys, first_row + i, start + i);
                let got = &out[(first_row + i) * qd..(first_row + i + 1) * qd];
                for (c, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let error = (f64::from(g) - w).abs();
                    if bf16 {
                        worst_bf16 = worst_bf16.max(error);
                    }
                    assert!(
                        error < tolerance,
                        "{name} start {start} len {len} row {i} col {c}: {g} vs {w}"
                    );
                }
            }
            // The f16 pool: the same, with K/V rounded to half precision first.
            let (k16, v16): (Vec<f16>, Vec<f16>) = (
                k.iter().map(|&x| f16::from_f32(x)).collect(),
                v.iter().map(|&x| f16::from_f32(x)).collect(),
            );
            let (kr, vr): (Vec<f32>, Vec<f32>) = (
                k16.iter().map(|x| x.to_f32()).collect(),
                v16.iter().map(|x| x.to_f32()).collect(),
            );
            let (kr, vr) = (round(&kr), round(&vr));
            let mut out16 = vec![0f32; (first_row + len) * qd];
            attend_chunk(
                &q,
                &k16,
                &v16,
                chunk,
                shape,
                keys,
                &mut out16,
                &mut scratch,
                parallel,
                unit,
            );
            let i = len - 1;
            let want = reference(&q, &kr, &vr, &slots, shape, keys, first_row + i, start + i);
            for (&g, &w) in out16[(first_row + i) * qd..].iter().zip(&want) {
                assert!(
                    (f64::from(g) - w).abs() < tolerance,
                    "{name} f16: {g} vs {w}"
                );
            }
        }
        worst_bf16
    }

    /// Largest difference allowed between a bf16 unit's output and the f64
    /// reference on bf16 keys and values. Queries are rounded to 8
    /// significant bits too, so each product of a score is off by up to
    /// 2^-8 relative: with these tests' values (in [-2, 2], scores of a few
    /// units) scores move by ~5e-3 and outputs by up to ~1e-2. Softmax
    /// weights are rounded as well, but their sum is that of the rounded
    /// weights. A packing or pairing mistake is off by tenths.
    const BF16_TOLERANCE: f64 = 2e-2;

    /// `x` rounded to bf16 (nearest, ties to even), as f32.
    fn to_bf16(x: f32) -> f32 {
        half::bf16::from_f32(x).to_f32()
    }

    #[test]
    fn matches_reference_attention() {
        let gqa = HeadShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 64,
        };
        // Lengths around the block sizes (BK = 64 keys, BR = 32 rows), from
        // position 0 and after a cached prefix that ends mid-block.
        let mut worst = 0f64;
        for (start, len) in [
            (0, 8),
            (0, 63),
            (0, 64),
            (0, 65),
            (0, 130),
            (37, 50),
            (100, 33),
        ] {
            worst = worst.max(check(gqa, start, len, false));
        }
        worst = worst.max(check(gqa, 950, 50, true));
        // One query head per KV head, and a head width that is not a multiple of 64.
        let mha = HeadShape {
            n_heads: 2,
            n_kv_heads: 2,
            head_dim: 48,
        };
        worst = worst.max(check(mha, 5, 70, true));
        // Three query heads per KV head (the default model's grouping).
        let smol = HeadShape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
        };
        worst = worst.max(check(smol, 129, 40, true));
        // Rounding shows: a bf16 unit that quietly ran in f32 would not.
        if zinfer_kernels::flash_unit_bf16().is_some() {
            assert!(worst > 1e-5, "bf16 error {worst}");
            eprintln!("largest bf16 error: {worst:.2e}");
        }
    }

    /// A row's output does not depend on how its sequence was chunked:
    /// the same bits in a long chunk, a short one, or alone (decode, on
    /// either path: one-row `attend_chunk`, or `attend_rows` with other
    /// sequences' rows, at block edges and the first position), so a
    /// cached or imported prefix gives exactly the tokens of a cold run.
    #[test]
    fn rows_are_independent_of_chunking() {
        let shape = HeadShape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
        };
        let (qd, kvd) = (9 * 64, 3 * 64);
        let n = 150;
        let (k, v) = (random(n * kvd, 5, 2.0), random(n * kvd, 6, 2.0));
        let q = random(n * qd, 4, 2.0);
        let slots: Vec<u32> = (0..n as u32).rev().collect();
        for unit in zinfer_kernels::flash_units() {
            rows_are_independent_with(unit, shape, &q, &k, &v, &slots);
        }
    }

    /// [`rows_are_independent_of_chunking`] for one build of the unit.
    fn rows_are_independent_with(
        unit: FlashUnit,
        shape: HeadShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        slots: &[u32],
    ) {
        let qd = shape.n_heads * shape.head_dim;
        let n = slots.len();
        let name = unit.name;
        let mut scratch = FlashScratch::default();
        let mut run = |start: usize, len: usize| {
            let mut out = vec![0f32; n * qd];
            let chunk = ChunkRows {
                first_row: start,
                len,
                start_pos: start,
                slots: &slots[..start + len],
            };
            let keys = all_keys(shape);
            attend_chunk(
                q,
                k,
                v,
                chunk,
                shape,
                keys,
                &mut out,
                &mut scratch,
                true,
                unit,
            );
            out
        };
        let whole = run(0, n);
        let row = |out: &[f32], r: usize| out[r * qd..(r + 1) * qd].to_vec();
        assert_eq!(row(&run(100, 50), n - 1), row(&whole, n - 1), "{name}");
        assert_eq!(row(&run(n - 1, 1), n - 1), row(&whole, n - 1), "{name}");

        let positions = [149, 0, 63, 64, 100, 65];
        let q_rows: Vec<f32> = positions
            .iter()
            .flat_map(|&p| q[p * qd..(p + 1) * qd].iter().copied())
            .collect();
        let chunks: Vec<ChunkRows<'_>> = positions
            .iter()
            .enumerate()
            .map(|(i, &p)| ChunkRows {
                first_row: i,
                len: 1,
                start_pos: p,
                slots: &slots[..=p],
            })
            .collect();
        let mut out = vec![0f32; positions.len() * qd];
        let keys = all_keys(shape);
        attend_rows(&q_rows, k, v, &chunks, shape, keys, &mut out, true, unit);
        for (i, &p) in positions.iter().enumerate() {
            assert_eq!(row(&out, i), row(&whole, p), "{name}: decode row at {p}");
        }
    }

    /// A sliding window (narrower and wider than a key block, ending
    /// mid-block) and a softcap, on chunks that start inside and past the
    /// first window.
    #[test]
    fn windows_and_softcaps_match_reference_attention() {
        let shape = HeadShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
        };
        for window in [1, 5, 64, 100] {
            for softcap in [None, Some(2.0)] {
                let keys = Keys {
                    window: Some(window),
                    rule: ScoreRule {
                        scale: 0.3,
                        softcap,
                    },
                    sinks: None,
                };
                for (start, len) in [(0, 40), (0, 150), (70, 1), (130, 60), (200, 1)] {
                    let _ = check_keys(shape, keys, start, len, start > 100);
                }
            }
        }
    }

    /// Attention sinks (gpt-oss): one logit per query head in the softmax's
    /// denominator, below, near and far above the scores (the last would
    /// overflow `e^(sink - max)` taken naively), with and without a window;
    /// and a decode row still gets a long chunk's bits.
    #[test]
    fn sinks_match_reference_attention() {
        let shape = HeadShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
        };
        let sinks = [-3.0, 0.5, 2.0, 120.0];
        for window in [None, Some(5), Some(100)] {
            let keys = Keys {
                window,
                rule: ScoreRule::standard(32),
                sinks: Some(&sinks),
            };
            for (start, len) in [(0, 40), (70, 1), (130, 60)] {
                let _ = check_keys(shape, keys, start, len, start > 100);
            }
        }
        let keys = Keys {
            window: Some(70),
            rule: ScoreRule::standard(32),
            sinks: Some(&sinks),
        };
        let n = 150;
        let (k, v) = (random(n * 64, 8, 2.0), random(n * 64, 9, 2.0));
        let q = random(n * 128, 7, 2.0);
        let slots: Vec<u32> = (0..n as u32).collect();
        decode_rows_match_whole_chunk(&q, &k, &v, &slots, shape, keys, &[0, 69, 149], false);
    }

    /// With a window, a row still gets the same bits however its sequence
    /// was chunked: blocks are aligned to absolute positions, so skipping
    /// the ones before the window changes no block's contents.
    #[test]
    fn windowed_rows_are_independent_of_chunking() {
        let shape = HeadShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 32,
        };
        let keys = Keys {
            window: Some(70),
            rule: ScoreRule::standard(32),
            sinks: None,
        };
        let (qd, kvd) = (64, 32);
        let n = 200;
        let (k, v) = (random(n * kvd, 8, 2.0), random(n * kvd, 9, 2.0));
        let q = random(n * qd, 7, 2.0);
        let slots: Vec<u32> = (0..n as u32).collect();
        decode_rows_match_whole_chunk(
            &q,
            &k,
            &v,
            &slots,
            shape,
            keys,
            &[0, 69, 70, 130, 199],
            false,
        );
    }

    /// An f16 pool (values packed, not read in place): a decode row on
    /// [`attend_rows`] gets the bits of the same row in a long chunk.
    #[test]
    fn f16_rows_are_independent_of_chunking() {
        let shape = HeadShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
        };
        let (qd, kvd) = (4 * 32, 2 * 32);
        let n = 140;
        let to16 = |x: Vec<f32>| -> Vec<f16> { x.into_iter().map(f16::from_f32).collect() };
        let (k, v) = (
            to16(random(n * kvd, 11, 2.0)),
            to16(random(n * kvd, 12, 2.0)),
        );
        let q = random(n * qd, 10, 2.0);
        let slots: Vec<u32> = (0..n as u32).rev().collect();
        let keys = all_keys(shape);
        decode_rows_match_whole_chunk(&q, &k, &v, &slots, shape, keys, &[0, 63, 64, 139], true);
    }

    /// With every build of the unit: the rows at `positions` attended
    /// alone on [`attend_rows`] get the bits they get in one chunk of all
    /// `slots` (attended in parallel or not).
    #[allow(clippy::too_many_arguments)]
    fn decode_rows_match_whole_chunk<T: KvElem>(
        q: &[f32],
        k: &[T],
        v: &[T],
        slots: &[u32],
        shape: HeadShape,
        keys: Keys<'_>,
        positions: &[usize],
        parallel: bool,
    ) {
        let qd = shape.n_heads * shape.head_dim;
        let n = slots.len();
        for unit in zinfer_kernels::flash_units() {
            let mut whole = vec![0f32; n * qd];
            let chunk = ChunkRows {
                first_row: 0,
                len: n,
                start_pos: 0,
                slots,
            };
            let mut scratch = FlashScratch::default();
            attend_chunk(
                q,
                k,
                v,
                chunk,
                shape,
                keys,
                &mut whole,
                &mut scratch,
                parallel,
                unit,
            );
            for &p in positions {
                let rows = [ChunkRows {
                    first_row: 0,
                    len: 1,
                    start_pos: p,
                    slots: &slots[..=p],
                }];
                let mut one = vec![0f32; qd];
                let q_row = &q[p * qd..(p + 1) * qd];
                attend_rows(q_row, k, v, &rows, shape, keys, &mut one, false, unit);
                let want = &whole[p * qd..(p + 1) * qd];
                assert_eq!(one, want, "{}: position {p}", unit.name);
            }
        }
    }

    #[test]
    fn supports_whole_vectors_only() {
        let shape = |n_heads, n_kv_heads, head_dim| HeadShape {
            n_heads,
            n_kv_heads,
            head_dim,
        };
        assert!(supports(shape(9, 3, 64)));
        assert!(supports(shape(32, 8, 128)));
        assert!(!supports(shape(9, 3, 40)));
        assert!(!supports(shape(9, 2, 64)));
    }
}
