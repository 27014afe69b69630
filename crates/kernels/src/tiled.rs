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
//! scales in one vector. The repack replaces the ggml layout at load and
//! keeps the size, but for the unpacked Q4_K / Q5_K scales (below).
//!
//! Layout per (tile, block), tiles outermost, `R` rows per tile:
//! - Q4_1: `d[R]` f16, `m[R]` f16, then 4 groups of `4R` bytes; byte
//!   `g*4R + row*4 + t` holds k = `8g + t` (low nibble) and `8g + 4 + t` (high).
//! - Q5_1: Q4_1's layout for the low 4 bits, then `4R` bytes of fifth bits: bit `2g` (k = `8g + t`) and `2g + 1` (`8g + 4 + t`)
//!   of byte `row*4 + t`.
//! - Q8_0: `d[R]` f16, then 8 groups of `4R` bytes; byte `g*4R + row*4 + t`
//!   is `q[4g + t]`, stored `+ 128` (unsigned, as `vpdpbusd` wants, and
//!   corrected with the activation block sums) for VNNI and signed for AVX2
//!   (whose `maddubs` would saturate on unsigned bytes; it uses the sign trick).
//! - K-quants (`R` = 8 for AVX2, 16 for VNNI): per 256-value super-block a
//!   header, then eight 32-value sub-blocks laid out like a Q4_1 block (4
//!   groups of `4R` bytes, low nibble k = `8g + t`, high nibble `8g + 4 + t`)
//!   followed by their high bits. Q4_K / Q5_K header: `d[R]`, `dmin[R]` f16,
//!   the 6-bit scales as bytes `[sub-block][row]`, then the mins as bytes
//!   `[sub-block / 2][row][sub-block % 2]` (unpacked: 2.8% / 2.3% larger
//!   than ggml's). Q6_K header: `d[R]`
//!   f16, the i8 scales `[16-value half][row]` (same size as ggml's). Q5_K's
//!   fifth bits: one `4R`-byte vector per sub-block, bit `2g` (k = `8g + t`)
//!   and `2g + 1` (`8g + 4 + t`) of byte `row*4 + t`. Q6_K's top two bits:
//!   two `4R`-byte vectors `v` per sub-block, bit pairs `0, 2, 4, 6` of byte
//!   `row*4 + t` for k = `16v + t`, `16v + 4 + t`, `16v + 8 + t`,
//!   `16v + 12 + t`. Q6_K's quants are stored +32 (0..=63): AVX2 subtracts
//!   it back, VNNI multiplies them unsigned and subtracts 32 times the
//!   activation sums. Both kernels read activations with one step per
//!   super-block ([`crate::Q8Acts`]'s `k*` fields).

use crate::format::{Q8Acts, QK, QK_K, QKind};
use crate::level::Level;
use crate::scalar;

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

    /// Whether the kernel that reads this layout runs at `level`.
    pub(crate) fn runs_on(self, level: Level) -> bool {
        match self {
            Self::Vnni16 => level == Level::Avx512Vnni,
            Self::Avx2x8 => level != Level::Scalar,
        }
    }

    /// Bytes of one block (32 values, or a 256-value K-quant super-block)
    /// of a whole tile.
    pub(super) fn block_bytes(self, kind: QKind) -> usize {
        let rows = self.rows();
        match kind {
            QKind::Q4_1 => 4 * rows + 16 * rows,
            QKind::Q5_1 => 4 * rows + 16 * rows + 4 * rows,
            QKind::Q8_0 => 2 * rows + 32 * rows,
            QKind::Q4K | QKind::Q5K | QKind::Q6K => {
                self.k_header(kind) + 8 * self.k_sub_bytes(kind)
            }
            QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => {
                unreachable!("lookup types are never tiled")
            }
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
        let nb = cols / kind.block_values();
        let bb = kind.block_bytes();
        let tb = self.block_bytes(kind);
        let tr = self.rows();
        let mut out = vec![0u8; rows / tr * nb * tb];
        for t in 0..rows / tr {
            for b in 0..nb {
                let dst = &mut out[(t * nb + b) * tb..(t * nb + b + 1) * tb];
                for rr in 0..tr {
                    let blk = &data[((t * tr + rr) * nb + b) * bb..][..bb];
                    if kind.block_values() == QK_K {
                        self.repack_k(kind, blk, rr, dst);
                        continue;
                    }
                    dst[2 * rr..2 * rr + 2].copy_from_slice(&blk[..2]);
                    match kind {
                        QKind::Q4_1 | QKind::Q5_1 => {
                            dst[2 * tr + 2 * rr..2 * tr + 2 * rr + 2].copy_from_slice(&blk[2..4]);
                            let q: [u8; 32] = if kind == QKind::Q5_1 {
                                scalar::q5_values(blk)
                            } else {
                                std::array::from_fn(|k| {
                                    if k < 16 {
                                        blk[4 + k] & 15
                                    } else {
                                        blk[4 + k - 16] >> 4
                                    }
                                })
                            };
                            for g in 0..4 {
                                for tt in 0..4 {
                                    let (a, b) = (q[8 * g + tt], q[8 * g + 4 + tt]);
                                    dst[4 * tr + g * 4 * tr + rr * 4 + tt] =
                                        (a & 15) | ((b & 15) << 4);
                                    if kind == QKind::Q5_1 {
                                        dst[20 * tr + rr * 4 + tt] |=
                                            ((a >> 4) << (2 * g)) | ((b >> 4) << (2 * g + 1));
                                    }
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
                        QKind::Q4K | QKind::Q5K | QKind::Q6K => unreachable!("repacked above"),
                        QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => {
                            unreachable!("lookup types are never tiled")
                        }
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
        let block_values = kind.block_values();
        let nb = cols / block_values;
        let tb = self.block_bytes(kind);
        let tr = self.rows();
        let (t, rr) = (r / tr, r % tr);
        let f16 = scalar::f16_at;
        for (b, o) in out.chunks_exact_mut(block_values).take(nb).enumerate() {
            let blk = &data[(t * nb + b) * tb..(t * nb + b + 1) * tb];
            if block_values == QK_K {
                self.dequantize_k(kind, blk, rr, o);
                continue;
            }
            let d = f16(blk, 2 * rr);
            match kind {
                QKind::Q4_1 | QKind::Q5_1 => {
                    let mn = f16(blk, 2 * tr + 2 * rr);
                    for g in 0..4 {
                        for tt in 0..4 {
                            let at = rr * 4 + tt;
                            let byte = blk[4 * tr + g * 4 * tr + at];
                            let (mut a, mut b) = (byte & 15, byte >> 4);
                            if kind == QKind::Q5_1 {
                                let top = blk[20 * tr + at];
                                a |= ((top >> (2 * g)) & 1) << 4;
                                b |= ((top >> (2 * g + 1)) & 1) << 4;
                            }
                            o[8 * g + tt] = d * f32::from(a) + mn;
                            o[8 * g + 4 + tt] = d * f32::from(b) + mn;
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
                QKind::Q4K | QKind::Q5K | QKind::Q6K => unreachable!("dequantized above"),
                QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => {
                    unreachable!("lookup types are never tiled")
                }
            }
        }
    }
}

impl Tiling {
    /// Bytes before the first sub-block of a K-quant tile block.
    pub(crate) fn k_header(self, kind: QKind) -> usize {
        let rows = self.rows();
        match kind {
            // d, dmin (f16), scales and mins (bytes).
            QKind::Q4K | QKind::Q5K => 20 * rows,
            // d (f16), 16 scales (bytes).
            QKind::Q6K => 18 * rows,
            _ => unreachable!("not a K-quant"),
        }
    }

    /// Bytes of one sub-block (32 values of a tile's rows) of a K-quant tile block.
    pub(crate) fn k_sub_bytes(self, kind: QKind) -> usize {
        let rows = self.rows();
        match kind {
            QKind::Q4K => 16 * rows,
            QKind::Q5K => 20 * rows,
            QKind::Q6K => 24 * rows,
            _ => unreachable!("not a K-quant"),
        }
    }

    /// Where the min of sub-block `j`, row `rr` of a Q4_K / Q5_K tile block
    /// sits: `[j / 2][row][j % 2]`, so that one zero-extension to i16 gives
    /// each row's lane the pair of mins that `vpmaddwd` / `vpdpwssd`
    /// multiplies with a pair of activation sums.
    fn k_min_at(self, j: usize, rr: usize) -> usize {
        let rows = self.rows();
        12 * rows + (j / 2) * 2 * rows + 2 * rr + j % 2
    }

    /// Writes row `rr` of a ggml K-quant block into the tile block `dst`.
    fn repack_k(self, kind: QKind, blk: &[u8], rr: usize, dst: &mut [u8]) {
        let rows = self.rows();
        let header = self.k_header(kind);
        let sub = self.k_sub_bytes(kind);
        match kind {
            QKind::Q4K | QKind::Q5K => {
                dst[2 * rr..2 * rr + 2].copy_from_slice(&blk[0..2]);
                dst[2 * rows + 2 * rr..2 * rows + 2 * rr + 2].copy_from_slice(&blk[2..4]);
                for j in 0..8 {
                    let (sc, mn) = scalar::scale_min_k4(j, &blk[4..16]);
                    dst[4 * rows + j * rows + rr] = sc;
                    dst[self.k_min_at(j, rr)] = mn;
                }
            }
            QKind::Q6K => {
                dst[2 * rr..2 * rr + 2].copy_from_slice(&blk[208..210]);
                for h in 0..16 {
                    dst[2 * rows + h * rows + rr] = blk[192 + h];
                }
            }
            _ => unreachable!("not a K-quant"),
        }
        let group = 4 * rows;
        for j in 0..8 {
            // Unsigned quants: Q6_K's -32..=31 stored +32.
            let q = scalar::k_quants(kind, blk, j).map(|q| {
                if kind == QKind::Q6K {
                    (q + 32) as u8
                } else {
                    q as u8
                }
            });
            let base = &mut dst[header + j * sub..][..sub];
            for g in 0..4 {
                for t in 0..4 {
                    let (a, b) = (q[8 * g + t], q[8 * g + 4 + t]);
                    let at = rr * 4 + t;
                    base[g * group + at] = (a & 15) | ((b & 15) << 4);
                    match kind {
                        QKind::Q5K => {
                            base[4 * group + at] |=
                                ((a >> 4) << (2 * g)) | ((b >> 4) << (2 * g + 1))
                        }
                        QKind::Q6K => {
                            let (v, pair) = (g / 2, g % 2);
                            base[4 * group + v * group + at] |=
                                ((a >> 4) << (4 * pair)) | ((b >> 4) << (4 * pair + 2));
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// Row `rr` of a K-quant tile block as f32, in ggml's order of
    /// operations (so the values equal candle's to the bit).
    fn dequantize_k(self, kind: QKind, blk: &[u8], rr: usize, out: &mut [f32]) {
        let rows = self.rows();
        let header = self.k_header(kind);
        let sub = self.k_sub_bytes(kind);
        let group = 4 * rows;
        for (j, o) in out.chunks_exact_mut(QK).enumerate() {
            let base = &blk[header + j * sub..][..sub];
            let q = |k: usize| -> u8 {
                let (g, high, t) = (k / 8, k % 8 >= 4, k % 4);
                let at = rr * 4 + t;
                let byte = base[g * group + at];
                let low4 = if high { byte >> 4 } else { byte & 15 };
                let top = match kind {
                    QKind::Q5K => (base[4 * group + at] >> (2 * g + usize::from(high))) & 1,
                    QKind::Q6K => {
                        let v = base[4 * group + g / 2 * group + at];
                        (v >> (4 * (g % 2) + 2 * usize::from(high))) & 3
                    }
                    _ => 0,
                };
                low4 | (top << 4)
            };
            match kind {
                QKind::Q4K | QKind::Q5K => {
                    let d = scalar::f16_at(blk, 2 * rr);
                    let dmin = scalar::f16_at(blk, 2 * rows + 2 * rr);
                    let scale = d * f32::from(blk[4 * rows + j * rows + rr]);
                    let min = dmin * f32::from(blk[self.k_min_at(j, rr)]);
                    for (k, y) in o.iter_mut().enumerate() {
                        *y = scale * f32::from(q(k)) - min;
                    }
                }
                QKind::Q6K => {
                    let d = scalar::f16_at(blk, 2 * rr);
                    for (k, y) in o.iter_mut().enumerate() {
                        let sc = blk[2 * rows + (2 * j + k / 16) * rows + rr] as i8;
                        let scale = d * f32::from(sc);
                        *y = scale * f32::from(q(k) as i8 - 32);
                    }
                }
                _ => unreachable!("not a K-quant"),
            }
        }
    }
}
