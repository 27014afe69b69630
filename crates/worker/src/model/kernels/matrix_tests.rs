//! The matmul kernels against a plain f64 product of the dequantized weights.

use super::*;
use crate::model::test_data::random;

/// Raw ggml Q4_1 blocks with varied scales and nibbles.
fn q4_1_blocks(rows: usize, cols: usize) -> Vec<u8> {
    let mut data = Vec::new();
    let vals = random(rows * cols / 2, 7, 1.0);
    for (b, chunk) in vals.chunks(16).enumerate() {
        data.extend_from_slice(&half::f16::from_f32(0.01 + b as f32 * 1e-4).to_le_bytes());
        data.extend_from_slice(&half::f16::from_f32(-0.07).to_le_bytes());
        data.extend(chunk.iter().map(|v| (v.abs() * 255.0) as u8));
    }
    data
}

/// Raw ggml Q8_0 blocks.
fn q8_0_blocks(rows: usize, cols: usize) -> Vec<u8> {
    let mut data = Vec::new();
    for (b, chunk) in random(rows * cols, 3, 1.0).chunks(32).enumerate() {
        data.extend_from_slice(&half::f16::from_f32(0.002 + b as f32 * 1e-5).to_le_bytes());
        data.extend(chunk.iter().map(|v| (v * 127.0) as i8 as u8));
    }
    data
}

/// Every layout and kernel this machine has: tiled (when AVX-512 VNNI is
/// present) and row-major, the latter over 42 rows so 16-row units split
/// into 4-, 2- and 1-row tiles.
fn matrices() -> Vec<QMatrix> {
    let (rows, cols) = (48, 96);
    let mut out = Vec::new();
    for (kind, data) in [
        (QKind::Q4_1, q4_1_blocks(rows, cols)),
        (QKind::Q8_0, q8_0_blocks(rows, cols)),
    ] {
        let row_bytes = cols / QK * kind.block_bytes();
        out.push(QMatrix {
            kind,
            rows: 42,
            cols,
            tiled: false,
            data: data[..42 * row_bytes].to_vec(),
        });
        out.push(QMatrix::new(kind, rows, cols, data).unwrap());
    }
    out
}

/// The SIMD int8 kernels, the f32 GEMM path and a plain f64 product of
/// the dequantized weights agree, for every activation tile size.
#[test]
fn matmuls_agree_with_dequantized_reference() {
    let all = matrices();
    assert_eq!(all.iter().any(|w| w.tiled), level() == Level::Avx512Vnni);
    for w in all {
        for m in [1, 2, 3, 4, 7] {
            let x = random(m * w.cols(), 11 + m as u32, 1.0);
            let mut dense = vec![0f32; w.rows() * w.cols()];
            for r in 0..w.rows() {
                w.dequantize_row(r, &mut dense[r * w.cols()..(r + 1) * w.cols()]);
            }
            let mut acts = Q8Acts::default();
            acts.quantize(&x, m, w.cols());
            let mut int8 = vec![0f32; m * w.rows()];
            w.matmul_q8(&acts, m, &mut int8, true);
            let mut f32_out = vec![0f32; m * w.rows()];
            w.matmul_f32(&x, m, &mut f32_out, &mut Vec::new(), true);
            for i in 0..m {
                for r in 0..w.rows() {
                    let exact: f64 = (0..w.cols())
                        .map(|c| {
                            f64::from(x[i * w.cols() + c]) * f64::from(dense[r * w.cols() + c])
                        })
                        .sum();
                    let (a, b) = (int8[i * w.rows() + r], f32_out[i * w.rows() + r]);
                    assert!((f64::from(b) - exact).abs() < 1e-4, "f32 {b} vs {exact}");
                    assert!(
                        (f64::from(a) - exact).abs() < 0.02 * (1.0 + exact.abs()),
                        "{:?} tiled={} m={m} int8 {a} vs {exact}",
                        w.kind,
                        w.tiled
                    );
                }
            }
            if !w.tiled {
                // Every build of the row kernels this CPU can run gives the same sums.
                let mut levels = vec![Level::Scalar];
                if level() != Level::Scalar {
                    levels.push(Level::Avx2);
                }
                for lvl in levels {
                    let mut other = vec![0f32; m * w.rows()];
                    // SAFETY: `other` holds m * rows floats and only this thread writes it;
                    // the level is one the CPU supports.
                    unsafe { w.matmul_rows(lvl, &acts, m, 0..w.rows(), other.as_mut_ptr()) };
                    for (a, b) in other.iter().zip(&int8) {
                        assert!(
                            (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                            "{lvl:?}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
