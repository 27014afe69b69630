//! The 16-row tile layout of the AVX-512 VNNI matmul (`x86::avx512`).
//!
//! The row-major kernels in [`super::matrix`] spend most of their
//! instructions on per-block scale handling, one row at a time. Here 16
//! weight rows are interleaved so that one `vpdpbusd` multiplies 4 k-values
//! of all 16 rows with 4 broadcast activation bytes: a 32-value block of 16
//! rows is 8 instructions into integer lanes, then one scale FMA per block,
//! with the 16 row scales in one vector. Weights keep their size (the repack
//! only reorders bytes), so this replaces the ggml layout at load.
//!
//! Layout per (tile, block), tiles outermost:
//! - Q4_1: `d[16]` f16, `m[16]` f16, then 4 groups of 64 bytes; byte
//!   `g*64 + row*4 + t` holds k = `8g + t` (low nibble) and `8g + 4 + t` (high).
//! - Q8_0: `d[16]` f16, then 8 groups of 64 bytes; byte `g*64 + row*4 + t`
//!   is `q[4g + t] + 128` (unsigned, as `vpdpbusd` wants), corrected with
//!   the activation block sums.

use super::matrix::{QK, QKind};

/// Rows per tile.
pub(crate) const TILE: usize = 16;

pub(super) fn tile_block_bytes(kind: QKind) -> usize {
    match kind {
        QKind::Q4_1 => 64 + 256,
        QKind::Q8_0 => 32 + 512,
        QKind::Q4K | QKind::Q5K | QKind::Q6K => unreachable!("{kind:?} is never tiled"),
    }
}

/// Reorders ggml row-major blocks (`rows` a multiple of 16) into tiles.
pub(crate) fn repack(kind: QKind, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    let nb = cols / QK;
    let bb = kind.block_bytes();
    let tb = tile_block_bytes(kind);
    let mut out = vec![0u8; rows / TILE * nb * tb];
    for t in 0..rows / TILE {
        for b in 0..nb {
            let dst = &mut out[(t * nb + b) * tb..(t * nb + b + 1) * tb];
            for rr in 0..TILE {
                let blk = &data[((t * TILE + rr) * nb + b) * bb..][..bb];
                dst[2 * rr..2 * rr + 2].copy_from_slice(&blk[..2]);
                match kind {
                    QKind::Q4_1 => {
                        dst[32 + 2 * rr..34 + 2 * rr].copy_from_slice(&blk[2..4]);
                        let q = |k: usize| {
                            if k < 16 {
                                blk[4 + k] & 15
                            } else {
                                blk[4 + k - 16] >> 4
                            }
                        };
                        for g in 0..4 {
                            for tt in 0..4 {
                                dst[64 + g * 64 + rr * 4 + tt] =
                                    q(8 * g + tt) | (q(8 * g + 4 + tt) << 4);
                            }
                        }
                    }
                    QKind::Q8_0 => {
                        for g in 0..8 {
                            for tt in 0..4 {
                                dst[32 + g * 64 + rr * 4 + tt] = blk[2 + 4 * g + tt] ^ 0x80;
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
pub(crate) fn dequantize_row(kind: QKind, cols: usize, data: &[u8], r: usize, out: &mut [f32]) {
    let nb = cols / QK;
    let tb = tile_block_bytes(kind);
    let (t, rr) = (r / TILE, r % TILE);
    let f16 =
        |bytes: &[u8], at: usize| half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32();
    for (b, o) in out.chunks_exact_mut(QK).take(nb).enumerate() {
        let blk = &data[(t * nb + b) * tb..(t * nb + b + 1) * tb];
        let d = f16(blk, 2 * rr);
        match kind {
            QKind::Q4_1 => {
                let mn = f16(blk, 32 + 2 * rr);
                for g in 0..4 {
                    for tt in 0..4 {
                        let byte = blk[64 + g * 64 + rr * 4 + tt];
                        o[8 * g + tt] = d * f32::from(byte & 15) + mn;
                        o[8 * g + 4 + tt] = d * f32::from(byte >> 4) + mn;
                    }
                }
            }
            QKind::Q8_0 => {
                for g in 0..8 {
                    for tt in 0..4 {
                        let q = i32::from(blk[32 + g * 64 + rr * 4 + tt]) - 128;
                        o[4 * g + tt] = d * q as f32;
                    }
                }
            }
            QKind::Q4K | QKind::Q5K | QKind::Q6K => unreachable!("never tiled"),
        }
    }
}
