//! Row-interleaved tile layouts of the int8 matmuls (`x86::avx512`,
//! `x86::avx2`).
//!
//! The row-major kernels in [`super::matrix`] spend most of their
//! instructions on per-block scale handling, one row at a time. Here the
//! weight rows of a tile are interleaved so that each 32-bit lane of a vector
//! holds 4 k-values of one row: one `vpdpbusd` (AVX-512 VNNI, 16 rows) or
//! `maddubs` + `madd` (AVX2, 8 rows) multiplies them with 4 broadcast
//! activation bytes, the lanes add up in integers over a whole 32-value
//! block, and then one scale FMA per block covers every row, with the row
//! scales in one vector. Weights keep their size (the repack only reorders
//! bytes), so this replaces the ggml layout at load.
//!
//! Layout per (tile, block), tiles outermost, `R` rows per tile:
//! - Q4_1: `d[R]` f16, `m[R]` f16, then 4 groups of `4R` bytes; byte
//!   `g*4R + row*4 + t` holds k = `8g + t` (low nibble) and `8g + 4 + t` (high).
//! - Q8_0: `d[R]` f16, then 8 groups of `4R` bytes; byte `g*4R + row*4 + t`
//!   is `q[4g + t]`, stored `+ 128` (unsigned, as `vpdpbusd` wants, and
//!   corrected with the activation block sums) for VNNI and signed for AVX2
//!   (whose `maddubs` would saturate on unsigned bytes; it uses the sign trick).

use super::matrix::{Q8Acts, QK, QKind};

/// One int8 matmul over a tiled matrix, `out[m, n_rows] = acts @ W^T`:
/// what every tile kernel reads.
pub(crate) struct TiledMatmul<'a> {
    pub(crate) kind: QKind,
    pub(crate) cols: usize,
    pub(crate) n_rows: usize,
    /// The tiles, as [`Tiling::repack`] wrote them.
    pub(crate) data: &'a [u8],
    /// `m` rows of `cols` quantized activations.
    pub(crate) acts: &'a Q8Acts,
    pub(crate) m: usize,
    /// `m * n_rows` floats; each unit of work writes only its tiles' columns.
    pub(crate) out: *mut f32,
}

/// Which kernel a tiled matrix was laid out for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tiling {
    /// 16-row tiles, Q8_0 bytes unsigned, for AVX-512 VNNI.
    Vnni16,
    /// 8-row tiles, Q8_0 bytes signed, for AVX2.
    Avx2x8,
}

impl Tiling {
    /// Rows per tile.
    pub(crate) fn rows(self) -> usize {
        match self {
            Self::Vnni16 => 16,
            Self::Avx2x8 => 8,
        }
    }

    /// Bytes of one 32-value block of a whole tile.
    pub(super) fn block_bytes(self, kind: QKind) -> usize {
        let rows = self.rows();
        match kind {
            QKind::Q4_1 => 4 * rows + 16 * rows,
            QKind::Q8_0 => 2 * rows + 32 * rows,
            QKind::Q4K | QKind::Q5K | QKind::Q6K => unreachable!("{kind:?} is never tiled"),
        }
    }

    /// What Q8_0 stores for the signed quant byte `q`.
    fn q8_byte(self, q: u8) -> u8 {
        match self {
            Self::Vnni16 => q ^ 0x80,
            Self::Avx2x8 => q,
        }
    }

    /// Reorders ggml row-major blocks (`rows` a multiple of [`Self::rows`]) into tiles.
    pub(crate) fn repack(self, kind: QKind, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
        let nb = cols / QK;
        let bb = kind.block_bytes();
        let tb = self.block_bytes(kind);
        let tr = self.rows();
        let mut out = vec![0u8; rows / tr * nb * tb];
        for t in 0..rows / tr {
            for b in 0..nb {
                let dst = &mut out[(t * nb + b) * tb..(t * nb + b + 1) * tb];
                for rr in 0..tr {
                    let blk = &data[((t * tr + rr) * nb + b) * bb..][..bb];
                    dst[2 * rr..2 * rr + 2].copy_from_slice(&blk[..2]);
                    match kind {
                        QKind::Q4_1 => {
                            dst[2 * tr + 2 * rr..2 * tr + 2 * rr + 2].copy_from_slice(&blk[2..4]);
                            let q = |k: usize| {
                                if k < 16 {
                                    blk[4 + k] & 15
                                } else {
                                    blk[4 + k - 16] >> 4
                                }
                            };
                            for g in 0..4 {
                                for tt in 0..4 {
                                    dst[4 * tr + g * 4 * tr + rr * 4 + tt] =
                                        q(8 * g + tt) | (q(8 * g + 4 + tt) << 4);
                                }
                            }
                        }
                        QKind::Q8_0 => {
                            for g in 0..8 {
                                for tt in 0..4 {
                                    dst[2 * tr + g * 4 * tr + rr * 4 + tt] =
                                        self.q8_byte(blk[2 + 4 * g + tt]);
                                }
                            }
                        }
                        QKind::Q4K | QKind::Q5K | QKind::Q6K => unreachable!("never tiled"),
                    }
                }
            }
        }
        out
    }

    /// Row `r` of a tiled matrix as f32.
    pub(crate) fn dequantize_row(
        self,
        kind: QKind,
        cols: usize,
        data: &[u8],
        r: usize,
        out: &mut [f32],
    ) {
        let nb = cols / QK;
        let tb = self.block_bytes(kind);
        let tr = self.rows();
        let (t, rr) = (r / tr, r % tr);
        let f16 =
            |bytes: &[u8], at: usize| half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32();
        for (b, o) in out.chunks_exact_mut(QK).take(nb).enumerate() {
            let blk = &data[(t * nb + b) * tb..(t * nb + b + 1) * tb];
            let d = f16(blk, 2 * rr);
            match kind {
                QKind::Q4_1 => {
                    let mn = f16(blk, 2 * tr + 2 * rr);
                    for g in 0..4 {
                        for tt in 0..4 {
                            let byte = blk[4 * tr + g * 4 * tr + rr * 4 + tt];
                            o[8 * g + tt] = d * f32::from(byte & 15) + mn;
                            o[8 * g + 4 + tt] = d * f32::from(byte >> 4) + mn;
                        }
                    }
                }
                QKind::Q8_0 => {
                    for g in 0..8 {
                        for tt in 0..4 {
                            let byte = blk[2 * tr + g * 4 * tr + rr * 4 + tt];
                            // Undo `q8_byte`: both encodings read back as i8 after it.
                            let q = self.q8_byte(byte) as i8;
                            o[4 * g + tt] = d * f32::from(q);
                        }
                    }
                }
                QKind::Q4K | QKind::Q5K | QKind::Q6K => unreachable!("never tiled"),
            }
        }
    }
}
