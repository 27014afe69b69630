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
}

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

impl QKind {
    /// Values per block.
    pub(crate) fn block_values(self) -> usize {
        match self {
            Self::Q4_1 | Self::Q5_1 | Self::Q8_0 | Self::Mxfp4 => QK,
            Self::Q4K | Self::Q5K | Self::Q6K => QK_K,
        }
    }

    pub(crate) fn block_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Mxfp4 => 17,
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
/// For the K-quant tiles, instead or as well (`Q8Acts::quantize_for`), a
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
