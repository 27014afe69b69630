//! Portable Rust builds of every kernel: the fallback on CPUs without
//! AVX2, and the code the x86 builds inline under their target features
//! (the compiler vectorizes the straight loops there).

use crate::attention::{KvElem, RowJob, normalizer};
use crate::blocked::{BK, F32Block, Micro, UnitBuf, UnitJob, unit_impl};
use crate::fast_exp::exp_nonpositive;
use crate::format::{
    ACT_TILE, Q8Acts, QK, QK_K, QKind, RowTile, TileOut, e8m0_half, iq4xs_scale, lookup_table,
};

/// Per 32-value block: `d = max|x| / 127`, `q = round(x / d)`, `s = d * sum(q)`.
#[inline(always)]
pub(super) fn quantize(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xs, qs), d), s) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(d).zip(s) {
        let mut amax = [0f32; 8];
        for c in xs.chunks_exact(8) {
            for (a, v) in amax.iter_mut().zip(c) {
                *a = a.max(v.abs());
            }
        }
        let scale = amax.iter().fold(0f32, |a, &v| a.max(v)) / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = [0i32; 8];
        for (qc, xc) in qs.chunks_exact_mut(8).zip(xs.chunks_exact(8)) {
            for ((qv, &v), acc) in qc.iter_mut().zip(xc).zip(sum.iter_mut()) {
                let r = (v * inv).round_ties_even() as i32;
                *qv = r as i8;
                *acc += r;
            }
        }
        *d = scale;
        *s = scale * sum.iter().sum::<i32>() as f32;
    }
}

/// Quantizes `x` to i8 with one step per 256 values (the K-quant tiles'
/// activations, [`Q8Acts`]'s `k*` fields), the per-32 quantizer's rounding.
#[inline(always)]
pub(super) fn quantize_k(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum16: &mut [i16],
    sum32: &mut [i16],
) {
    let chunks = x
        .chunks_exact(QK_K)
        .zip(q.chunks_exact_mut(QK_K))
        .zip(d)
        .zip(sum16.chunks_exact_mut(16))
        .zip(sum32.chunks_exact_mut(8));
    for ((((xs, qs), d), s16), s32) in chunks {
        let mut amax = [0f32; 8];
        for c in xs.chunks_exact(8) {
            for (a, v) in amax.iter_mut().zip(c) {
                *a = a.max(v.abs());
            }
        }
        let scale = amax.iter().fold(0f32, |a, &v| a.max(v)) / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for ((qc, xc), s) in qs
            .chunks_exact_mut(16)
            .zip(xs.chunks_exact(16))
            .zip(s16.iter_mut())
        {
            let mut sum = 0i32;
            for (qv, &v) in qc.iter_mut().zip(xc) {
                let r = (v * inv).round_ties_even() as i32;
                *qv = r as i8;
                sum += r;
            }
            // |sum| <= 16 * 127.
            *s = sum as i16;
        }
        for (s, pair) in s32.iter_mut().zip(s16.chunks_exact(2)) {
            *s = pair[0] + pair[1];
        }
        *d = scale;
    }
}

pub(super) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

pub(super) fn dequantize_row(kind: QKind, row: &[u8], out: &mut [f32]) {
    match kind {
        QKind::Mxfp4 | QKind::Iq4Nl => return dequantize_lookup(kind, row, out),
        QKind::Iq4Xs => return dequantize_iq4xs(row, out),
        QKind::Q4K | QKind::Q5K | QKind::Q6K => return dequantize_row_k(kind, row, out),
        QKind::Q4_1 | QKind::Q5_1 | QKind::Q8_0 => {}
    }
    let bb = kind.block_bytes();
    for (blk, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(blk, 0);
        match kind {
            QKind::Q4_1 => {
                let mn = f16_at(blk, 2);
                for (j, &q) in blk[4..20].iter().enumerate() {
                    o[j] = d * f32::from(q & 15) + mn;
                    o[j + 16] = d * f32::from(q >> 4) + mn;
                }
            }
            QKind::Q8_0 => {
                for (j, &q) in blk[2..34].iter().enumerate() {
                    o[j] = d * f32::from(q as i8);
                }
            }
            QKind::Q5_1 => {
                let mn = f16_at(blk, 2);
                for (j, q) in q5_values(blk).into_iter().enumerate() {
                    o[j] = d * f32::from(q) + mn;
                }
            }
            QKind::Q4K | QKind::Q5K | QKind::Q6K | QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => {
                unreachable!("returned above")
            }
        }
    }
}

/// The scale of a block of 32 table lookups: MXFP4's E8M0 byte or IQ4_NL's f16.
#[inline(always)]
pub(super) fn lookup_scale(kind: QKind, blk: &[u8]) -> f32 {
    if kind == QKind::Mxfp4 {
        e8m0_half(blk[0])
    } else {
        f16_at(blk, 0)
    }
}

/// MXFP4 or IQ4_NL blocks as f32, as ggml's `dequantize_row_mxfp4` and
/// `dequantize_row_iq4_nl`: the scale times the nibble's table value.
pub(super) fn dequantize_lookup(kind: QKind, row: &[u8], out: &mut [f32]) {
    let (bb, table) = (kind.block_bytes(), lookup_table(kind));
    for (blk, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
        let d = lookup_scale(kind, blk);
        for (j, &q) in blk[bb - 16..].iter().enumerate() {
            o[j] = d * f32::from(table[usize::from(q & 15)]);
            o[j + 16] = d * f32::from(table[usize::from(q >> 4)]);
        }
    }
}

/// IQ4_XS blocks as f32, as ggml's `dequantize_row_iq4_xs`: per 32 values
/// `d * (ls - 32)` times the nibble's table value.
pub(super) fn dequantize_iq4xs(row: &[u8], out: &mut [f32]) {
    let table = lookup_table(QKind::Iq4Xs);
    for (blk, o) in row.chunks_exact(136).zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_at(blk, 0);
        for (j, o) in o.chunks_exact_mut(QK).enumerate() {
            let dl = d * iq4xs_scale(blk, j) as f32;
            for (t, &q) in blk[8 + 16 * j..8 + 16 * (j + 1)].iter().enumerate() {
                o[t] = dl * f32::from(table[usize::from(q & 15)]);
                o[t + 16] = dl * f32::from(table[usize::from(q >> 4)]);
            }
        }
    }
}

/// Every weight row of a row-major tile, one at a time.
pub(super) fn tile_rows(job: &RowTile<'_>, vals: &mut TileOut) {
    let rb = job.row_bytes;
    for (rr, v) in vals.iter_mut().take(job.rows).enumerate() {
        tile(
            job.kind,
            &job.w[rr * rb..(rr + 1) * rb],
            job.acts,
            job.i0,
            job.m,
            v,
        );
    }
}

pub(super) fn tile(
    kind: QKind,
    w: &[u8],
    acts: &Q8Acts,
    i0: usize,
    mt: usize,
    vals: &mut [f32; ACT_TILE],
) {
    match kind {
        QKind::Mxfp4 | QKind::Iq4Nl => return tile_lookup(kind, w, acts, i0, mt, vals),
        QKind::Iq4Xs => return tile_iq4xs(w, acts, i0, mt, vals),
        QKind::Q4K | QKind::Q5K | QKind::Q6K => return tile_k(kind, w, acts, i0, mt, vals),
        QKind::Q4_1 | QKind::Q5_1 | QKind::Q8_0 => {}
    }
    let nb = acts.blocks;
    let bb = kind.block_bytes();
    for (j, v) in vals.iter_mut().take(mt).enumerate() {
        let i = i0 + j;
        let mut sum = 0f32;
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let a = &acts.q[(i * nb + b) * QK..(i * nb + b + 1) * QK];
            let d = f16_at(blk, 0);
            match kind {
                QKind::Q4_1 => {
                    let mut dot = 0i32;
                    for (t, &q) in blk[4..20].iter().enumerate() {
                        dot += i32::from(q & 15) * i32::from(a[t])
                            + i32::from(q >> 4) * i32::from(a[t + 16]);
                    }
                    sum +=
                        d * acts.d[i * nb + b] * dot as f32 + f16_at(blk, 2) * acts.s[i * nb + b];
                }
                QKind::Q5_1 => {
                    let dot: i32 = q5_values(blk)
                        .iter()
                        .zip(a)
                        .map(|(&q, &x)| i32::from(q) * i32::from(x))
                        .sum();
                    sum +=
                        d * acts.d[i * nb + b] * dot as f32 + f16_at(blk, 2) * acts.s[i * nb + b];
                }
                QKind::Q8_0 => {
                    let dot: i32 = blk[2..34]
                        .iter()
                        .zip(a)
                        .map(|(&q, &x)| i32::from(q as i8) * i32::from(x))
                        .sum();
                    sum += d * acts.d[i * nb + b] * dot as f32;
                }
                QKind::Q4K
                | QKind::Q5K
                | QKind::Q6K
                | QKind::Mxfp4
                | QKind::Iq4Nl
                | QKind::Iq4Xs => {
                    unreachable!("returned above")
                }
            }
        }
        *v = sum;
    }
}

/// The integer dot of 16 bytes of nibbles (values `t` and `t + 16`),
/// looked up in `table`, with 32 int8 activations.
#[inline(always)]
fn lookup_dot(table: &[i8; 16], qs: &[u8], a: &[i8]) -> i32 {
    let mut dot = 0i32;
    for (t, &q) in qs.iter().enumerate() {
        dot += i32::from(table[usize::from(q & 15)]) * i32::from(a[t])
            + i32::from(table[usize::from(q >> 4)]) * i32::from(a[t + 16]);
    }
    dot
}

/// [`tile`] for MXFP4 and IQ4_NL, as ggml's `ggml_vec_dot_mxfp4_q8_0` and
/// `ggml_vec_dot_iq4_nl_q8_0`: integer dots of the table values with the
/// int8 activations, scaled by the block's scale and the activations' step.
fn tile_lookup(
    kind: QKind,
    w: &[u8],
    acts: &Q8Acts,
    i0: usize,
    mt: usize,
    vals: &mut [f32; ACT_TILE],
) {
    let (nb, bb, table) = (acts.blocks, kind.block_bytes(), lookup_table(kind));
    for (j, v) in vals.iter_mut().take(mt).enumerate() {
        let i = i0 + j;
        let mut sum = 0f32;
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let a = &acts.q[(i * nb + b) * QK..(i * nb + b + 1) * QK];
            let dot = lookup_dot(table, &blk[bb - 16..], a);
            sum += lookup_scale(kind, blk) * acts.d[i * nb + b] * dot as f32;
        }
        *v = sum;
    }
}

/// [`tile`] for IQ4_XS against activations with one step per super-block
/// (ggml's `ggml_vec_dot_iq4_xs_q8_K`): each sub-block's integer dot times
/// its integer scale, summed exactly per super-block, then scaled by `d`
/// and the activations' step.
fn tile_iq4xs(w: &[u8], acts: &Q8Acts, i0: usize, mt: usize, vals: &mut [f32; ACT_TILE]) {
    let (sbs, table) = (acts.blocks / 8, lookup_table(QKind::Iq4Xs));
    for (j, v) in vals.iter_mut().take(mt).enumerate() {
        let i = i0 + j;
        let mut sum = 0f32;
        for (sb, blk) in w.chunks_exact(136).enumerate() {
            let a = &acts.kq[(i * sbs + sb) * QK_K..(i * sbs + sb + 1) * QK_K];
            let isum: i32 = (0..8)
                .map(|k| {
                    let qs = &blk[8 + 16 * k..8 + 16 * (k + 1)];
                    iq4xs_scale(blk, k) * lookup_dot(table, qs, &a[QK * k..QK * (k + 1)])
                })
                .sum();
            sum += f16_at(blk, 0) * acts.kd[i * sbs + sb] * isum as f32;
        }
        *v = sum;
    }
}

/// The 32 five-bit quants of a Q5_1 block.
pub(super) fn q5_values(blk: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
    let mut q = [0u8; 32];
    for (j, &byte) in blk[8..24].iter().enumerate() {
        q[j] = (byte & 15) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (byte >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Scales (per 16 values) and mins (per 32) of a K-quant block: value `i`
/// of sub-block `j` is `scale[2j + i / 16] * q[i] - min[j]`.
pub(super) fn k_scales(kind: QKind, blk: &[u8]) -> ([f32; 16], [f32; 8]) {
    let (mut scale, mut min) = ([0f32; 16], [0f32; 8]);
    match kind {
        QKind::Q4K | QKind::Q5K => {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &blk[4..16]);
                scale[2 * j] = d * f32::from(sc);
                scale[2 * j + 1] = scale[2 * j];
                min[j] = dmin * f32::from(m);
            }
        }
        QKind::Q6K => {
            let d = f16_at(blk, 208);
            for (s, &sc) in scale.iter_mut().zip(&blk[192..208]) {
                *s = d * f32::from(sc as i8);
            }
        }
        QKind::Q4_1 | QKind::Q5_1 | QKind::Q8_0 | QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => {
            unreachable!("not a K-quant")
        }
    }
    (scale, min)
}

/// The 6-bit scale and min of sub-block `j` of Q4_K / Q5_K, packed in 12 bytes.
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The quants of sub-block `j` (values `32j..32j + 32`) of a K-quant block:
/// 0..=15 (Q4_K), 0..=31 (Q5_K) or -32..=31 (Q6_K).
pub(super) fn k_quants(kind: QKind, blk: &[u8], j: usize) -> [i8; 32] {
    let mut q = [0i8; 32];
    let shift = if j.is_multiple_of(2) { 0 } else { 4 };
    match kind {
        QKind::Q4K => {
            for (v, &b) in q.iter_mut().zip(&blk[16 + 32 * (j / 2)..][..32]) {
                *v = ((b >> shift) & 0xF) as i8;
            }
        }
        QKind::Q5K => {
            let (qh, qs) = (&blk[16..48], &blk[48 + 32 * (j / 2)..][..32]);
            for ((v, &b), &h) in q.iter_mut().zip(qs).zip(qh) {
                *v = (((b >> shift) & 0xF) | (((h >> j) & 1) << 4)) as i8;
            }
        }
        QKind::Q6K => {
            let (half, t) = (j / 4, j % 4);
            let ql = &blk[64 * half + 32 * (t % 2)..][..32];
            let qh = &blk[128 + 32 * half..][..32];
            let shift = if t < 2 { 0 } else { 4 };
            for ((v, &l), &h) in q.iter_mut().zip(ql).zip(qh) {
                *v = (((l >> shift) & 0xF) | (((h >> (2 * t)) & 3) << 4)) as i8 - 32;
            }
        }
        QKind::Q4_1 | QKind::Q5_1 | QKind::Q8_0 | QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => {
            unreachable!("not a K-quant")
        }
    }
    q
}

/// [`dequantize_row`] for K-quants, in the order of operations ggml uses.
fn dequantize_row_k(kind: QKind, row: &[u8], out: &mut [f32]) {
    let bb = kind.block_bytes();
    for (blk, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
        let (scale, min) = k_scales(kind, blk);
        for (j, o) in o.chunks_exact_mut(QK).enumerate() {
            let q = k_quants(kind, blk, j);
            for (i, (y, &q)) in o.iter_mut().zip(&q).enumerate() {
                *y = scale[2 * j + i / 16] * f32::from(q) - min[j];
            }
        }
    }
}

/// [`tile`] for K-quants: each 32-value sub-block against one activation block.
fn tile_k(kind: QKind, w: &[u8], acts: &Q8Acts, i0: usize, mt: usize, vals: &mut [f32; ACT_TILE]) {
    let nb = acts.blocks;
    let bb = kind.block_bytes();
    for (jj, v) in vals.iter_mut().take(mt).enumerate() {
        let i = i0 + jj;
        let mut sum = 0f32;
        for (sb, blk) in w.chunks_exact(bb).enumerate() {
            let (scale, min) = k_scales(kind, blk);
            for j in 0..8 {
                let b = i * nb + sb * 8 + j;
                let a = &acts.q[b * QK..(b + 1) * QK];
                let q = k_quants(kind, blk, j);
                let dot = |h: usize| -> i32 {
                    q[16 * h..16 * h + 16]
                        .iter()
                        .zip(&a[16 * h..16 * h + 16])
                        .map(|(&q, &x)| i32::from(q) * i32::from(x))
                        .sum()
                };
                let (lo, hi) = (dot(0) as f32, dot(1) as f32);
                sum += acts.d[b] * (scale[2 * j] * lo + scale[2 * j + 1] * hi) - min[j] * acts.s[b];
            }
        }
        *v = sum;
    }
}

/// `silu(g) = g * sigmoid(g)`, with `e^-|g|` so the exponent never overflows.
#[inline(always)]
pub(super) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        let e = exp_nonpositive(-g.abs());
        let sigmoid = if *g >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        };
        *g = *g * sigmoid * u;
    }
}

/// `gelu(g) * u` with the tanh approximation (Gemma's MLP):
/// `0.5 g (1 + tanh(a)) = g sigmoid(2a)`, `a = sqrt(2/pi) (g + 0.044715 g^3)`,
/// with `e^-|2a|` so the exponent never overflows.
#[inline(always)]
pub(super) fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, u) in gate.iter_mut().zip(up) {
        let a2 = 2.0 * SQRT_2_OVER_PI * (*g + 0.044_715 * *g * *g * *g);
        let e = exp_nonpositive(-a2.abs());
        let sigmoid = if a2 >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        };
        *g = *g * sigmoid * u;
    }
}

/// gpt-oss's clamped SwiGLU (llama.cpp's `swiglu_oai`): the gate capped
/// at `limit` from above, up clamped to `[-limit, limit]`, then
/// `g sigmoid(alpha g) (u + 1)`.
#[inline(always)]
pub(super) fn swiglu_oai_mul(gate: &mut [f32], up: &[f32]) {
    use crate::attention::{SWIGLU_OAI_ALPHA as ALPHA, SWIGLU_OAI_LIMIT as LIMIT};
    for (g, u) in gate.iter_mut().zip(up) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        let a = ALPHA * x;
        let e = exp_nonpositive(-a.abs());
        let sigmoid = if a >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        };
        *g = x * sigmoid * (y + 1.0);
    }
}

/// One query row against its keys; inlined into each SIMD build.
#[inline(always)]
pub(super) fn attend_row<T: KvElem>(job: &RowJob<'_, T>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let RowJob {
        q,
        k_pool,
        v_pool,
        keys,
        shape,
        rule,
        sinks,
    } = *job;
    let d = shape.head_dim;
    let kv_dim = shape.n_kv_heads * d;
    let group = shape.n_heads / shape.n_kv_heads;
    let scale = rule.scale;
    let n = keys.len();
    // Scores, each head's normalizer, then one row of room to convert an
    // f16 K or V row into.
    scores.resize(group * n + group + d, 0.0);
    let (scores, rest) = scores.split_at_mut(group * n);
    let (inv_sums, row_buf) = rest.split_at_mut(group);
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
        if let Some(cap) = rule.softcap {
            crate::attention::softcap(scores, cap);
        }
        for ((row, inv), h) in scores
            .chunks_exact_mut(n)
            .zip(inv_sums.iter_mut())
            .zip(heads.clone())
        {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            row.iter_mut().for_each(|v| *v = exp_nonpositive(*v - max));
            let sink = sinks.and_then(|s| s.get(h).copied());
            *inv = normalizer(sum(row), max, sink);
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
        for (&inv, h) in inv_sums.iter().zip(heads) {
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

/// Plain Rust loops; vectorized as far as the compiler manages.
pub(crate) struct Portable;

impl Micro for Portable {
    type Block<'a> = F32Block<'a>;

    #[inline(always)]
    unsafe fn qk<const R: usize>(
        q: &[f32],
        d: usize,
        block: &F32Block<'_>,
        s: &mut [[f32; BK]; R],
    ) {
        let kt = block.kt;
        assert!(q.len() >= R * d && kt.len() >= d * BK);
        let mut acc = [[0f32; BK]; R];
        for c in 0..d {
            let k = &kt[c * BK..(c + 1) * BK];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let qv = q[r * d + c];
                for (a, &kv) in acc_r.iter_mut().zip(k) {
                    *a += qv * kv;
                }
            }
        }
        *s = acc;
    }

    #[inline(always)]
    unsafe fn pv<const R: usize>(
        p: &[[f32; BK]; R],
        block: &F32Block<'_>,
        d: usize,
        n: usize,
        acc: &mut [f32],
    ) {
        let v = &block.v;
        assert!(n <= BK && acc.len() >= R * d);
        for (r, pr) in p.iter().enumerate() {
            let out = &mut acc[r * d..(r + 1) * d];
            for (&pj, row) in pr.iter().zip(v).take(n) {
                for (o, &x) in out.iter_mut().zip(&row[..d]) {
                    *o += pj * x;
                }
            }
        }
    }
}

/// [`unit_impl`] on [`Portable`] loops, for CPUs without AVX2.
pub fn flash_unit(job: &UnitJob<'_>, buf: &mut UnitBuf) {
    // SAFETY: Portable uses no instructions beyond the build's baseline.
    unsafe { unit_impl::<Portable, 1>(job, buf) }
}

#[cfg(test)]
mod tests {
    use crate::test_data::random;

    #[test]
    fn gelu_matches_the_tanh_definition() {
        let g: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.005).collect();
        let u = random(g.len(), 6, 1.0);
        let mut out = g.clone();
        crate::dispatch::gelu_mul(&mut out, &u);
        for ((&x, &y), &o) in g.iter().zip(&u).zip(&out) {
            let x64 = f64::from(x);
            let a = (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
            let want = 0.5 * x64 * (1.0 + a.tanh()) * f64::from(y);
            assert!(
                (f64::from(o) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "gelu({x}) * {y}: {o} vs {want}"
            );
        }
    }

    #[test]
    fn softcap_matches_tanh() {
        let mut s: Vec<f32> = (-400..400).map(|i| i as f32 * 0.5).collect();
        let want: Vec<f64> = s
            .iter()
            .map(|&x| 50.0 * (f64::from(x) / 50.0).tanh())
            .collect();
        crate::attention::softcap(&mut s, 50.0);
        for (&got, &w) in s.iter().zip(&want) {
            assert!((f64::from(got) - w).abs() < 1e-5, "{got} vs {w}");
        }
    }

    #[test]
    fn silu_matches_the_definition() {
        let g: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.05).collect();
        let u = random(g.len(), 5, 1.0);
        let mut out = g.clone();
        crate::dispatch::silu_mul(&mut out, &u);
        for ((&x, &y), &o) in g.iter().zip(&u).zip(&out) {
            let want = f64::from(x) / (1.0 + (-f64::from(x)).exp()) * f64::from(y);
            assert!(
                (f64::from(o) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "silu({x}) * {y}: {o} vs {want}"
            );
        }
    }

    /// llama.cpp's `swiglu_oai` (ggml-cpu ops.cpp) in f64: gate capped at
    /// 7, up clamped to [-7, 7], `x / (1 + e^(-1.702 x)) * (y + 1)`; gates
    /// and ups run past both clamps.
    #[test]
    fn swiglu_oai_matches_llama_cpps_definition() {
        let g: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.01).collect();
        let u: Vec<f32> = random(g.len(), 7, 1.0).iter().map(|v| v * 12.0).collect();
        let mut out = g.clone();
        crate::dispatch::swiglu_oai_mul(&mut out, &u);
        for ((&x, &y), &o) in g.iter().zip(&u).zip(&out) {
            let (x64, y64) = (f64::from(x).min(7.0), f64::from(y).clamp(-7.0, 7.0));
            let want = x64 / (1.0 + (-1.702 * x64).exp()) * (y64 + 1.0);
            assert!(
                (f64::from(o) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "swiglu_oai({x}, {y}): {o} vs {want}"
            );
        }
    }
}
