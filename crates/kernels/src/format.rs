//! What the kernels compute on, with no behaviour: ggml block formats,
//! the int8 activations, and the tile of work a row-major matmul kernel
//! takes. A leaf: every other kernel module reads these, and this one reads
//! none of them.

/// Values per quantization block (and per block of int8 activations).
pub(crate) const QK: usize = 32;
/// Values per K-quant super-block: eight 32-value sub-blocks.
pub(crate) const QK_K: usize = 256;
/// Most activation rows sharing one pass over a weight row.
pub(crate) const ACT_TILE: usize = 4;
/// Most weight rows sharing one pass over the activations.
pub(crate) const ROW_TILE: usize = 4;
/// Dot products of one tile: `[weight row][activation row]`.
pub(crate) type TileOut = [[f32; ACT_TILE]; ROW_TILE];

/// Weight formats with kernels here (ggml block layouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QKind {
    /// `{d: f16, m: f16, qs: [u8; 16]}`: value = d * nibble + m.
    Q4_1,
    /// `{d: f16, qs: [i8; 32]}`: value = d * q.
    Q8_0,
    /// `{d: f16, m: f16, qh: u32, qs: [u8; 16]}`: value = d * q + m with
    /// 5-bit q (bit j of `qh` is value j's fifth). Q5_0 files load as this,
    /// with m = -16d ([`crate::q5_0_as_q5_1`]).
    Q5_1,
    /// `{d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]}` per 256
    /// values: 4-bit quants, a 6-bit scale and min per 32 values.
    Q4K,
    /// Q4K's layout with `qh: [u8; 32]` (the fifth bit) before `qs`.
    Q5K,
    /// `{ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}` per 256
    /// values: 6-bit quants less 32, an 8-bit scale per 16 values.
    Q6K,
    /// `{e: u8, qs: [u8; 16]}` (ggml type 39, gpt-oss's experts): E2M1
    /// values (ggml's doubled table, [`MXFP4_VALUES`]) times an E8M0 scale
    /// halved, `2^(e - 128)`; low nibbles are values 0-15, high ones 16-31.
    Mxfp4,
    /// `{d: f16, qs: [u8; 16]}` (ggml type 20): 4-bit indices into the
    /// non-linear table [`IQ4NL_VALUES`] times `d`; low nibbles are values
    /// 0-15, high ones 16-31.
    Iq4Nl,
    /// `{d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]}` per 256
    /// values (ggml type 23): IQ4_NL's indices per 32 values, scaled by
    /// `d * (ls - 32)` with a 6-bit `ls` per 32 values (low four bits in
    /// `scales_l`, two per byte; high two in `scales_h`).
    Iq4Xs,
}

/// ggml's `kvalues_iq4nl`: the IQ4 types' 16 values, denser near zero.
pub(crate) const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `kvalues_mxfp4`: each 4-bit E2M1 code's value, doubled so that
/// all are integers (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives).
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `x` (a multiple of 32 values) as MXFP4 blocks, as ggml's
/// `quantize_row_mxfp4_ref`: per block the scale `floor(log2(max|x|)) - 2`
/// (E8M0, 0 for an all-zero block), then each value's nearest table entry,
/// the first among equals.
pub fn quantize_mxfp4(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 17);
    for blk in x.chunks_exact(QK) {
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let nearest = |v: f32| {
            let mut best = 0;
            for (i, &k) in MXFP4_VALUES.iter().enumerate() {
                if (f32::from(k) * d - v).abs() < (f32::from(MXFP4_VALUES[best]) * d - v).abs() {
                    best = i;
                }
            }
            best as u8
        };
        out.push(e);
        out.extend((0..QK / 2).map(|j| nearest(blk[j]) | (nearest(blk[j + QK / 2]) << 4)));
    }
    out
}

/// The index of the entry of `table` nearest `v` (the first among equals).
fn nearest_index(table: &[i8; 16], v: f32) -> u8 {
    let mut best = 0;
    for (i, &k) in table.iter().enumerate() {
        if (f32::from(k) - v).abs() < (f32::from(table[best]) - v).abs() {
            best = i;
        }
    }
    best as u8
}

/// A scale `d` and table indices for 32 values, `x ≈ d * IQ4NL_VALUES[q]`:
/// the indices nearest `x / d` for a few trial steps around the one that
/// maps the largest magnitude onto the table's end, each refitted by least
/// squares; the trial with the smallest error wins (ggml's search, simpler).
fn fit_iq4(x: &[f32]) -> (f32, [u8; QK]) {
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let mut best = (0f32, [8u8; QK], f32::INFINITY);
    if max == 0.0 {
        return (best.0, best.1);
    }
    for t in -6..=6 {
        let id = (t as f32 * 0.1 + f32::from(IQ4NL_VALUES[0])) / max;
        let mut q = [0u8; QK];
        let (mut sqx, mut sqq) = (0f32, 0f32);
        for (qv, &v) in q.iter_mut().zip(x) {
            *qv = nearest_index(&IQ4NL_VALUES, id * v);
            let k = f32::from(IQ4NL_VALUES[usize::from(*qv)]);
            sqx += k * v;
            sqq += k * k;
        }
        let d = if sqq > 0.0 { sqx / sqq } else { 0.0 };
        let err: f32 = q
            .iter()
            .zip(x)
            .map(|(&qv, &v)| (v - d * f32::from(IQ4NL_VALUES[usize::from(qv)])).powi(2))
            .sum();
        if err < best.2 {
            best = (d, q, err);
        }
    }
    (best.0, best.1)
}

/// The indices nearest `x / d` (all of value 1, index 8, for `d == 0`).
fn iq4_indices(x: &[f32], d: f32) -> [u8; QK] {
    let mut q = [8u8; QK];
    if d != 0.0 {
        for (qv, &v) in q.iter_mut().zip(x) {
            *qv = nearest_index(&IQ4NL_VALUES, v / d);
        }
    }
    q
}

/// 32 indices packed as ggml stores them: value `t` in the low nibble of
/// byte `t`, value `t + 16` in its high nibble.
fn pack_nibbles(q: &[u8; QK], out: &mut Vec<u8>) {
    out.extend((0..QK / 2).map(|t| q[t] | (q[t + QK / 2] << 4)));
}

/// `x` (a multiple of 32 values) as IQ4_NL blocks (ggml type 20): per block
/// [`fit_iq4`]'s scale as f16, then each value's nearest index for the
/// stored scale. Valid blocks, not ggml's quantizer's bytes.
pub fn quantize_iq4_nl(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 18);
    for blk in x.chunks_exact(QK) {
        let d = half::f16::from_f32(fit_iq4(blk).0);
        out.extend_from_slice(&d.to_le_bytes());
        pack_nibbles(&iq4_indices(blk, d.to_f32()), &mut out);
    }
    out
}

/// `x` (a multiple of 256 values) as IQ4_XS blocks (ggml type 23): each
/// 32 values' [`fit_iq4`] scale as a 6-bit multiple `ls - 32` of the
/// super-block's f16 `d` (the largest scale's magnitude is `32 d`), then
/// each value's nearest index for its stored scale.
pub fn quantize_iq4_xs(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK_K * 136);
    for sb in x.chunks_exact(QK_K) {
        let scales: Vec<f32> = sb.chunks_exact(QK).map(|b| fit_iq4(b).0).collect();
        let max = scales
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = half::f16::from_f32(-max / 32.0);
        let df = d.to_f32();
        let ls: Vec<i32> = scales
            .iter()
            .map(|&s| {
                if df == 0.0 {
                    0
                } else {
                    ((s / df).round() as i32).clamp(-32, 31)
                }
            })
            .collect();
        let mut h = 0u16;
        let mut l = [0u8; 4];
        for (j, &v) in ls.iter().enumerate() {
            let u = (v + 32) as u8;
            l[j / 2] |= (u & 0xF) << (4 * (j % 2));
            h |= u16::from(u >> 4) << (2 * j);
        }
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&h.to_le_bytes());
        out.extend_from_slice(&l);
        for (b, &v) in sb.chunks_exact(QK).zip(&ls) {
            pack_nibbles(&iq4_indices(b, df * v as f32), &mut out);
        }
    }
    out
}

/// An E8M0 scale byte as f32, halved to match [`MXFP4_VALUES`]:
/// `2^(e - 128)`, as ggml's `ggml_e8m0_to_fp32_half` (the two smallest
/// as subnormals; 255, E8M0's NaN, as 2^127).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// The 16 values a 4-bit lookup type's nibbles index (MXFP4's doubled
/// E2M1 values, the IQ4 types' non-linear ones).
pub(crate) fn lookup_table(kind: QKind) -> &'static [i8; 16] {
    match kind {
        QKind::Iq4Nl | QKind::Iq4Xs => &IQ4NL_VALUES,
        _ => &MXFP4_VALUES,
    }
}

/// The 6-bit scale (less 32) of sub-block `j` of an IQ4_XS block.
#[inline(always)]
pub(crate) fn iq4xs_scale(blk: &[u8], j: usize) -> i32 {
    let h = u16::from_le_bytes([blk[2], blk[3]]);
    let lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 0xF;
    let hi = ((h >> (2 * j)) & 3) as u8;
    i32::from(lo | (hi << 4)) - 32
}

impl QKind {
    /// Whether the values are a 16-entry table's, indexed by nibbles
    /// ([`lookup_table`]): the types with row-major kernels only.
    pub(crate) fn is_lookup(self) -> bool {
        matches!(self, Self::Mxfp4 | Self::Iq4Nl | Self::Iq4Xs)
    }

    /// Values per block.
    pub(crate) fn block_values(self) -> usize {
        match self {
            Self::Q4_1 | Self::Q5_1 | Self::Q8_0 | Self::Mxfp4 | Self::Iq4Nl => QK,
            Self::Q4K | Self::Q5K | Self::Q6K | Self::Iq4Xs => QK_K,
        }
    }

    pub(crate) fn block_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Mxfp4 => 17,
            Self::Iq4Nl => 18,
            Self::Iq4Xs => 136,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }
}

/// One row-major tile of [`crate::QMatrix::matmul_q8`]: `rows` weight rows,
/// `row_bytes` apart in `w`, against activation rows `i0..i0 + m`.
#[derive(Clone, Copy)]
pub(crate) struct RowTile<'a> {
    pub(crate) kind: QKind,
    pub(crate) w: &'a [u8],
    pub(crate) row_bytes: usize,
    pub(crate) rows: usize,
    pub(crate) acts: &'a Q8Acts,
    pub(crate) i0: usize,
    pub(crate) m: usize,
}

/// Activations quantized to i8 per block of 32: `x ≈ d * q`, `s = d * sum(q)`.
///
/// For the K-quant tiles and IQ4_XS, instead or as well (`Q8Acts::quantize_for`), a
/// quantization with one step per 256 values (ggml's "Q8_K"):
/// `x ≈ kd * kq`, with integer sums of `kq` per 16 and per 32 values. One
/// step per super-block lets the tiles multiply the weights' sub-block
/// scales in integers, and turn mins into one integer dot per super-block.
#[derive(Debug, Default)]
pub struct Q8Acts {
    /// Blocks of 32 values per row (of either quantization).
    pub(crate) blocks: usize,
    /// Whether `d`, `s` and `q` hold the current rows.
    pub(crate) has_32: bool,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) q: Vec<i8>,
    /// Whether `kd`, `kq`, `ksum16` and `ksum32` hold the current rows.
    pub(crate) has_k: bool,
    /// One step per 256 values.
    pub(crate) kd: Vec<f32>,
    pub(crate) kq: Vec<i8>,
    /// `sum(kq)` per 16 values (at most 16 * 127).
    pub(crate) ksum16: Vec<i16>,
    /// `sum(kq)` per 32 values (at most 32 * 127).
    pub(crate) ksum32: Vec<i16>,
}
