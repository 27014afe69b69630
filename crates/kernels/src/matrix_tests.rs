//! The matmul kernels against a plain f64 product of the dequantized weights.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::*;
use crate::scalar;
use crate::test_data::random;

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

/// Raw MXFP4 blocks: E8M0 scales around 2^-6 and every nibble.
fn mxfp4_blocks(rows: usize, cols: usize) -> Vec<u8> {
    let mut data = Vec::new();
    for (b, chunk) in random(rows * cols / 2, 5, 1.0).chunks(16).enumerate() {
        data.push(118 + (b % 7) as u8);
        data.extend(chunk.iter().map(|v| ((v + 1.0) * 127.9) as u8));
    }
    data
}

/// IQ4_NL and IQ4_XS blocks from our quantizer, with values spread over
/// magnitudes per 32 so IQ4_XS's sub-block scales differ.
fn iq4_blocks(kind: QKind, rows: usize, cols: usize) -> Vec<u8> {
    let mut x = random(rows * cols, 59, 1.0);
    for (b, blk) in x.chunks_mut(QK).enumerate() {
        let mag = [0.02, 1.5, 0.3, 0.001, 0.7][b % 5];
        blk.iter_mut().for_each(|v| *v *= mag);
    }
    match kind {
        QKind::Iq4Nl => crate::format::quantize_iq4_nl(&x),
        _ => crate::format::quantize_iq4_xs(&x),
    }
}

/// Every layout and kernel this machine has: tiled (with AVX2 or AVX-512
/// VNNI) and row-major, the latter over 42 rows so 16-row units split
/// into 4-, 2- and 1-row tiles.
fn matrices() -> Vec<QMatrix> {
    let (rows, cols) = (48, 96);
    let mut out = Vec::new();
    for (kind, data) in [
        (QKind::Q4_1, q4_1_blocks(rows, cols)),
        (QKind::Q8_0, q8_0_blocks(rows, cols)),
        (QKind::Mxfp4, mxfp4_blocks(rows, cols)),
        (QKind::Iq4Nl, iq4_blocks(QKind::Iq4Nl, rows, cols)),
    ] {
        let row_bytes = cols / QK * kind.block_bytes();
        out.push(QMatrix {
            kind,
            rows: 42,
            cols,
            tiling: None,
            data: data[..42 * row_bytes].to_vec(),
        });
        out.push(QMatrix::new(kind, rows, cols, data).unwrap());
    }
    // IQ4_XS (never tiled): 1 and 2 super-blocks per row, 42 rows.
    for cols in [256, 512] {
        let data = iq4_blocks(QKind::Iq4Xs, 42, cols);
        out.push(QMatrix::new(QKind::Iq4Xs, 42, cols, data).unwrap());
    }
    // Q5_1 from candle's quantizer, row-major and tiled.
    out.push(candle_quantized(QKind::Q5_1, 42, 96, 9));
    out.extend(every_tiling(&candle_quantized(QKind::Q5_1, 48, 96, 10)));
    // Q5_0, which loads as Q5_1.
    let x = Tensor::from_vec(random(32 * 128, 11, 1.5), (32, 128), &Device::Cpu).unwrap();
    let q5_0 = QTensor::quantize(&x, GgmlDType::Q5_0).unwrap();
    out.extend(every_tiling(&QMatrix {
        kind: QKind::Q5_1,
        rows: 32,
        cols: 128,
        tiling: None,
        data: q5_0_as_q5_1(&q5_0.data().unwrap()),
    }));
    // K-quants as candle's quantizer writes them: 1 and 2 super-blocks per
    // row, row-major (42 rows) and in every tile layout this CPU runs (48
    // rows: 16-row VNNI tiles and 8-row AVX2 ones; 40 rows: AVX2 tiles only).
    for kind in K_KINDS {
        out.push(candle_quantized(kind, 42, 512, 13));
        for (rows, cols, seed) in [(48, 512, 17), (48, 256, 19), (40, 768, 29)] {
            let plain = candle_quantized(kind, rows, cols, seed);
            out.extend(every_tiling(&plain));
        }
    }
    out
}

/// Row-major `w` repacked into each tile layout this CPU runs that fits
/// its rows: [`QMatrix::new`] keeps only the widest, so this is how the
/// narrower kernels are tested on wider CPUs.
fn every_tiling(w: &QMatrix) -> Vec<QMatrix> {
    assert!(w.tiling.is_none());
    [Tiling::Vnni16, Tiling::Avx2x8]
        .into_iter()
        .filter(|t| t.runs_on(level()) && w.rows.is_multiple_of(t.rows()))
        .map(|tiling| QMatrix {
            kind: w.kind,
            rows: w.rows,
            cols: w.cols,
            tiling: Some(tiling),
            data: tiling.repack(w.kind, w.rows, w.cols, &w.data),
        })
        .collect()
}

/// Whether `w`'s kernel reads the activations with one step per super-block.
fn uses_k_acts(w: &QMatrix) -> bool {
    w.reads_k_acts()
}

const K_KINDS: [QKind; 3] = [QKind::Q4K, QKind::Q5K, QKind::Q6K];

fn ggml_dtype(kind: QKind) -> GgmlDType {
    match kind {
        QKind::Q4_1 => GgmlDType::Q4_1,
        QKind::Q5_1 => GgmlDType::Q5_1,
        QKind::Q8_0 => GgmlDType::Q8_0,
        QKind::Q4K => GgmlDType::Q4K,
        QKind::Q5K => GgmlDType::Q5K,
        QKind::Q6K => GgmlDType::Q6K,
        QKind::Mxfp4 | QKind::Iq4Nl | QKind::Iq4Xs => unreachable!("candle has no {kind:?}"),
    }
}

/// `rows x cols` seeded values quantized by candle (ggml's reference
/// quantizer), wrapped as our matrix.
fn candle_quantized(kind: QKind, rows: usize, cols: usize, seed: u32) -> QMatrix {
    let x = Tensor::from_vec(random(rows * cols, seed, 1.5), (rows, cols), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&x, ggml_dtype(kind)).unwrap();
    QMatrix {
        kind,
        rows,
        cols,
        tiling: None,
        data: qt.data().unwrap().into_owned(),
    }
}

/// Block for block, our dequantization of K-quants (scalar and SIMD)
/// gives candle's values to the bit.
#[test]
fn k_quants_dequantize_exactly_like_candle() {
    // 6 rows stay row-major; 16 are tiled where this CPU has a kernel.
    for (kind, rows) in K_KINDS.into_iter().flat_map(|kind| [(kind, 6), (kind, 16)]) {
        let cols = 768;
        let x = Tensor::from_vec(random(rows * cols, 21, 3.0), (rows, cols), &Device::Cpu).unwrap();
        let qt = QTensor::quantize(&x, ggml_dtype(kind)).unwrap();
        let want = qt.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
        let want = want.to_vec1::<f32>().unwrap();
        let w = QMatrix::new(kind, rows, cols, qt.data().unwrap().into_owned()).unwrap();
        assert_eq!(w.tiling.is_some(), rows == 16 && level() != Level::Scalar);
        let mut got = vec![0f32; cols];
        for r in 0..rows {
            let want = &want[r * cols..(r + 1) * cols];
            w.dequantize_row(r, &mut got);
            assert_eq!(got, want, "{kind:?} scalar row {r}");
            w.dequantize_row_fast(r, &mut got);
            assert_eq!(got, want, "{kind:?} {:?} row {r}", level());
        }
    }
}

/// Q5_1 blocks (row-major and tiled) give candle's values to the bit; Q5_0
/// blocks, loaded as Q5_1 with min -16d, give them to a rounding step.
#[test]
fn q5_blocks_dequantize_like_candle() {
    let (rows, cols) = (16, 96);
    let x = Tensor::from_vec(random(rows * cols, 23, 2.0), (rows, cols), &Device::Cpu).unwrap();
    for dtype in [GgmlDType::Q5_1, GgmlDType::Q5_0] {
        let qt = QTensor::quantize(&x, dtype).unwrap();
        let want = qt.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
        let want = want.to_vec1::<f32>().unwrap();
        let bytes = qt.data().unwrap().into_owned();
        let bytes = match dtype {
            GgmlDType::Q5_0 => q5_0_as_q5_1(&bytes),
            _ => bytes,
        };
        let plain = QMatrix {
            kind: QKind::Q5_1,
            rows,
            cols,
            tiling: None,
            data: bytes.clone(),
        };
        let tiled = QMatrix::new(QKind::Q5_1, rows, cols, bytes).unwrap();
        assert_eq!(tiled.tiling.is_some(), level() != Level::Scalar);
        let mut got = vec![0f32; cols];
        for r in 0..rows {
            let want = &want[r * cols..(r + 1) * cols];
            for w in [&plain, &tiled] {
                w.dequantize_row(r, &mut got);
                for (g, e) in got.iter().zip(want) {
                    let tolerance = if dtype == GgmlDType::Q5_1 {
                        0.0
                    } else {
                        1e-6 * e.abs().max(1.0)
                    };
                    assert!(
                        (g - e).abs() <= tolerance,
                        "{dtype:?} {:?} row {r}: {g} vs {e}",
                        w.tiling
                    );
                }
            }
        }
    }
}

/// Both tile layouts hold exactly the values of the row-major blocks they
/// were repacked from (repacking runs on any CPU); Q4_1 and Q8_0 tiles keep
/// the size, K-quant ones grow only by their unpacked scales.
#[test]
fn tiles_dequantize_like_the_row_major_layout() {
    let (rows, cols) = (48, 96);
    let mut plain = vec![
        QMatrix {
            kind: QKind::Q4_1,
            rows,
            cols,
            tiling: None,
            data: q4_1_blocks(rows, cols),
        },
        QMatrix {
            kind: QKind::Q8_0,
            rows,
            cols,
            tiling: None,
            data: q8_0_blocks(rows, cols),
        },
    ];
    plain.push(candle_quantized(QKind::Q5_1, rows, cols, 43));
    for kind in K_KINDS {
        plain.push(candle_quantized(kind, rows, 512, 31));
    }
    for w in plain {
        let (kind, cols, data) = (w.kind, w.cols, &w.data);
        for tiling in [Tiling::Vnni16, Tiling::Avx2x8] {
            let tiles = tiling.repack(kind, rows, cols, data);
            let growth = tiles.len() as f64 / data.len() as f64;
            match kind {
                QKind::Q4K => assert!((growth - 148.0 / 144.0).abs() < 1e-9, "{growth}"),
                QKind::Q5K => assert!((growth - 180.0 / 176.0).abs() < 1e-9, "{growth}"),
                _ => assert_eq!(
                    tiles.len(),
                    data.len(),
                    "{kind:?} {tiling:?} keeps the size"
                ),
            }
            let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                w.dequantize_row(r, &mut want);
                tiling.dequantize_row(kind, cols, &tiles, r, &mut got);
                assert_eq!(got, want, "{kind:?} {tiling:?} row {r}");
            }
        }
    }
}

/// The one-step-per-super-block quantizer (the build this CPU runs and the
/// portable one) gives the same bytes, steps and sums, and the sums are
/// those of the bytes.
#[test]
fn k_quantizers_agree() {
    let (m, k) = (3, 512);
    let mut x = random(m * k, 37, 3.0);
    x[256..512].fill(0.0);
    let mut acts = Q8Acts::default();
    acts.quantize_k(&x, m, k);
    let sb = m * k / QK_K;
    let (mut q, mut d) = (vec![0i8; m * k], vec![0f32; sb]);
    let (mut s16, mut s32) = (vec![0i16; 16 * sb], vec![0i16; 8 * sb]);
    scalar::quantize_k(&x, &mut q, &mut d, &mut s16, &mut s32);
    assert_eq!((&acts.kq, &acts.kd), (&q, &d));
    assert_eq!((&acts.ksum16, &acts.ksum32), (&s16, &s32));
    assert_eq!(d[1], 0.0);
    for (chunk, &sum) in q.chunks_exact(16).zip(&s16) {
        assert_eq!(
            chunk.iter().map(|&v| i32::from(v)).sum::<i32>(),
            i32::from(sum)
        );
    }
    for (i, &v) in x.iter().enumerate() {
        let step = d[i / QK_K];
        assert!((f32::from(q[i]) * step - v).abs() <= 0.5 * step * 1.0001);
    }
}

/// In the tiled kernels a row's result does not depend on its batch mates:
/// each activation row of a batch gives, to the bit, what it gives alone.
/// (The row-major K-quant kernels have a one-row build that sums in
/// another order, so they agree only to rounding.)
#[test]
fn batched_rows_match_single_rows() {
    // 19 rows: K-quant passes of 16 (two groups of 8 per super-block) and 3.
    for w in matrices().into_iter().filter(|w| w.tiling.is_some()) {
        let m = 19;
        let x = random(m * w.cols(), 41, 1.0);
        let mut acts = Q8Acts::default();
        acts.quantize_for(&x, m, w.cols(), [&w]);
        let mut batched = vec![0f32; m * w.rows()];
        w.matmul_q8(&acts, m, &mut batched, true);
        for i in 0..m {
            let mut one = Q8Acts::default();
            one.quantize_for(&x[i * w.cols()..(i + 1) * w.cols()], 1, w.cols(), [&w]);
            let mut alone = vec![0f32; w.rows()];
            w.matmul_q8(&one, 1, &mut alone, true);
            assert_eq!(
                alone,
                batched[i * w.rows()..(i + 1) * w.rows()],
                "{:?} {:?} row {i}",
                w.kind,
                w.tiling
            );
        }
    }
}

/// The SIMD activation quantizer gives the scalar one's bytes and scales,
/// for an all-zero block too.
#[test]
fn quantizers_agree() {
    let mut x = random(4 * 96, 5, 3.0);
    x[96..128].fill(0.0);
    let mut scalar_acts = Q8Acts::default();
    let nb = x.len() / QK;
    scalar_acts.q.resize(x.len(), 0);
    scalar_acts.d.resize(nb, 0.0);
    scalar_acts.s.resize(nb, 0.0);
    scalar::quantize(
        &x,
        &mut scalar_acts.q,
        &mut scalar_acts.d,
        &mut scalar_acts.s,
    );
    let mut acts = Q8Acts::default();
    acts.quantize(&x, 4, 96);
    assert_eq!(acts.q, scalar_acts.q);
    assert_eq!(acts.d, scalar_acts.d);
    assert_eq!(acts.s, scalar_acts.s);
    assert_eq!(acts.d[3], 0.0);
}

/// Rows that are not whole blocks, or bytes that are not whole rows, are
/// refused with the sizes in the message.
#[test]
fn bad_layouts_are_refused() {
    let err = QMatrix::new(QKind::Q4K, 2, 288, vec![0; 2 * 144]).unwrap_err();
    assert!(
        matches!(
            err,
            LayoutError::Columns {
                cols: 288,
                block: 256,
                ..
            }
        ),
        "{err}"
    );
    let err = QMatrix::new(QKind::Q6K, 2, 256, vec![0; 419]).unwrap_err();
    assert!(
        err.to_string().contains("needs 420 bytes, got 419"),
        "{err}"
    );
}

/// The SIMD int8 kernels, the f32 GEMM path and a plain f64 product of
/// the dequantized weights agree, for every activation tile size.
#[test]
fn matmuls_agree_with_dequantized_reference() {
    let all = matrices();
    assert_eq!(
        all.iter().any(|w| w.tiling.is_some()),
        level() != Level::Scalar
    );
    for w in all {
        for m in [1, 2, 3, 4, 5, 7, 8, 11, 16, 19] {
            let x = random(m * w.cols(), 11 + m as u32, 1.0);
            let mut dense = vec![0f32; w.rows() * w.cols()];
            for r in 0..w.rows() {
                w.dequantize_row(r, &mut dense[r * w.cols()..(r + 1) * w.cols()]);
            }
            let mut acts = Q8Acts::default();
            acts.quantize_for(&x, m, w.cols(), [&w]);
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
                    // Rounding x to int8 adds to each product w * e, e uniform
                    // in +-d/2 (d the step of x's 32-value block): allow six
                    // standard deviations of the sum.
                    let var: f64 = (0..w.cols())
                        .map(|c| {
                            let d = if uses_k_acts(&w) {
                                acts.kd[(i * w.cols() + c) / QK_K]
                            } else {
                                acts.d[i * acts.blocks + c / QK]
                            };
                            (f64::from(dense[r * w.cols() + c]) * f64::from(d)).powi(2) / 12.0
                        })
                        .sum();
                    let bound = 6.0 * var.sqrt();
                    let (a, b) = (int8[i * w.rows() + r], f32_out[i * w.rows() + r]);
                    assert!((f64::from(b) - exact).abs() < 1e-4, "f32 {b} vs {exact}");
                    assert!(
                        (f64::from(a) - exact).abs() <= bound + 1e-4,
                        "{:?} {:?} m={m} int8 {a} vs {exact}",
                        w.kind,
                        w.tiling
                    );
                }
            }
            if w.tiling.is_none() {
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

/// A matrix refuses activations quantized for another kernel (the one
/// step per 32 values a K-quant tile does not read, and the reverse)
/// instead of reading stale values.
#[test]
fn activations_must_be_quantized_for_the_kernel() {
    let plain = candle_quantized(QKind::Q4K, 16, 256, 47);
    let x = random(256, 53, 1.0);
    for w in every_tiling(&plain).into_iter().chain([plain]) {
        let mut acts = Q8Acts::default();
        let mut out = vec![0f32; 16];
        acts.quantize_for(&x, 1, 256, [&w]);
        w.matmul_q8(&acts, 1, &mut out, false);
        if uses_k_acts(&w) {
            acts.quantize(&x, 1, 256);
        } else {
            acts.quantize_k(&x, 1, 256);
            acts.has_32 = false;
        }
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.matmul_q8(&acts, 1, &mut out, false)
        }));
        assert!(refused.is_err(), "{:?}", w.tiling);
    }
}

/// MXFP4 blocks from llama.cpp's own quantizer, and its dequantization of
/// them (scripts/llamacpp-reference/mxfp4.cpp, built against the reference
/// tree, printed both): ours gives its values to the bit, on the row-major
/// layout every level runs it on. Three blocks, three E8M0 scales.
#[test]
fn mxfp4_dequantizes_like_ggml() {
    const BLOCKS: &str = "77a215447577674662511caeceedfeffce7feaca9103325456463441400a9dacdbed70bddbebca9113436566464451400b9dbc";
    // As the program printed them (%.9g).
    #[rustfmt::skip]
    #[allow(clippy::excessive_precision)]
    const GGML: [f32; 96] = [0.00390625, 0.01171875, 0.0078125, 0.01171875, 0.0234375, 0.0234375, 0.015625, 0.00390625, 0.001953125, -0.0078125, -0.015625, -0.015625, -0.01171875, -0.015625, -0.0234375, -0.015625, -0.00390625, 0.001953125, 0.0078125, 0.0234375, 0.0234375, 0.015625, 0.0078125, 0.015625, 0.01171875, 0.001953125, -0.00390625, -0.0078125, -0.015625, -0.0234375, -0.0234375, -0.0078125, -1.0, -1.0, 0.5, 1.5, 1.0, 2.0, 4.0, 4.0, 2.0, 0.5, 0.0, -1.0, -3.0, -2.0, -1.5, -3.0, -4.0, -2.0, -0.5, 0.0, 1.5, 3.0, 3.0, 2.0, 1.5, 2.0, 2.0, 0.0, -0.5, -1.0, -3.0, -4.0, -9.15527344e-5, -4.57763672e-5, -4.57763672e-5, -3.05175781e-5, 1.52587891e-5, 4.57763672e-5, 4.57763672e-5, 9.15527344e-5, 0.000122070312, 0.000122070312, 6.10351562e-5, 1.52587891e-5, 0.0, -4.57763672e-5, -9.15527344e-5, -6.10351562e-5, -4.57763672e-5, -9.15527344e-5, -0.000122070312, -6.10351562e-5, -1.52587891e-5, 1.52587891e-5, 6.10351562e-5, 0.000122070312, 0.000122070312, 6.10351562e-5, 6.10351562e-5, 9.15527344e-5, 6.10351562e-5, 0.0, -1.52587891e-5, -4.57763672e-5];
    let bytes: Vec<u8> = (0..BLOCKS.len() / 2)
        .map(|i| u8::from_str_radix(&BLOCKS[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    assert_eq!(bytes.len(), 3 * QKind::Mxfp4.block_bytes());
    let w = QMatrix::new(QKind::Mxfp4, 1, 96, bytes).unwrap();
    let mut out = vec![0f32; 96];
    w.dequantize_row(0, &mut out);
    assert_eq!(out, GGML);
    w.dequantize_row_fast(0, &mut out);
    assert_eq!(out, GGML);
    // Our quantizer (the synthetic files') writes ggml's blocks back from
    // its values, and zeros as code 0 with scale byte 0.
    assert_eq!(crate::format::quantize_mxfp4(&GGML), w.data);
    assert_eq!(crate::format::quantize_mxfp4(&[0.0; 32]), [0; 17]);
    // E8M0 as ggml reads it: 2^(e - 128), the two smallest as subnormals.
    for (e, want) in [(0u8, -128), (1, -127), (2, -126), (128, 0), (255, 127)] {
        assert_eq!(crate::format::e8m0_half(e), 2f32.powi(want), "e8m0 {e}");
    }
}

/// Every level of the row kernels this CPU runs, the widest last.
fn row_levels() -> Vec<Level> {
    let mut levels = vec![Level::Scalar];
    if level() != Level::Scalar {
        levels.push(Level::Avx2);
    }
    if level() == Level::Avx512Vnni {
        levels.push(Level::Avx512Vnni);
    }
    levels
}

/// IQ4_NL and IQ4_XS against llama.cpp (scripts/llamacpp-reference/iq4.cpp,
/// its output in iq4_ggml.txt): on the blocks ggml's quantizer wrote, our
/// dequantization gives its values to the bit, and at every CPU level our
/// int8 dot product is within 1e-5 (relative to sum |w x|) of ggml's
/// `vec_dot` (measured: 1.8e-6 for IQ4_NL, whose Q8_0 step ggml keeps in
/// f16; IQ4_XS's equal to the bit). Our quantizer's squared error on the
/// same values is within 1.1x of ggml's (measured 1.05x and 1.03x).
#[test]
fn iq4_types_match_ggml() {
    let text = include_str!("iq4_ggml.txt");
    let field = |name: &str, what: &str| -> &str {
        let key = format!("{name} {what} ");
        let line = text.lines().find(|l| l.starts_with(&key)).unwrap();
        &line[key.len()..]
    };
    let hex = |s: &str, width: usize| -> Vec<u64> {
        (0..s.len() / width)
            .map(|i| u64::from_str_radix(&s[width * i..width * (i + 1)], 16).unwrap())
            .collect()
    };
    let n = QK_K;
    let mags = [0.02, 1.5, 0.3, 3.0, 0.001, 0.7, 0.05, 2.2];
    let x: Vec<f32> = (0..n)
        .map(|i| {
            let t = f64::from((i as i32 * 29 + 7) % 61 - 30) / 30.0;
            (mags[i / 32] * (t * t * t + 0.3 * t)) as f32
        })
        .collect();
    let y: Vec<f32> = (0..n)
        .map(|i| (f64::from((i as i32 * 37) % 101 - 50) / 50.0) as f32)
        .collect();
    for (kind, name) in [(QKind::Iq4Nl, "iq4_nl"), (QKind::Iq4Xs, "iq4_xs")] {
        let bytes: Vec<u8> = hex(field(name, "blocks"), 2)
            .into_iter()
            .map(|b| b as u8)
            .collect();
        let want: Vec<f32> = hex(field(name, "values"), 8)
            .into_iter()
            .map(|b| f32::from_bits(b as u32))
            .collect();
        assert_eq!(bytes.len(), n / kind.block_values() * kind.block_bytes());
        let w = QMatrix::new(kind, 1, n, bytes).unwrap();
        let mut got = vec![0f32; n];
        w.dequantize_row(0, &mut got);
        assert_eq!(got, want, "{name} dequantized");
        w.dequantize_row_fast(0, &mut got);
        assert_eq!(got, want, "{name} dequantized, {:?}", level());
        let ggml_dot: f32 = field(name, "dot").parse().unwrap();
        let scale: f32 = want.iter().zip(&y).map(|(w, y)| (w * y).abs()).sum();
        let mut acts = Q8Acts::default();
        acts.quantize_for(&y, 1, n, [&w]);
        for lvl in row_levels() {
            let mut out = [0f32];
            // SAFETY: `out` holds one float for the one row; the level is this CPU's or lower.
            unsafe { w.matmul_rows(lvl, &acts, 1, 0..1, out.as_mut_ptr()) };
            assert!(
                (out[0] - ggml_dot).abs() <= 1e-5 * scale,
                "{name} {lvl:?}: {} vs ggml {ggml_dot} (scale {scale})",
                out[0]
            );
        }
        let ours = match kind {
            QKind::Iq4Nl => crate::format::quantize_iq4_nl(&x),
            _ => crate::format::quantize_iq4_xs(&x),
        };
        let q = QMatrix::new(kind, 1, n, ours).unwrap();
        q.dequantize_row(0, &mut got);
        let err: f64 = x
            .iter()
            .zip(&got)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let ggml_err: f64 = field(name, "sq_error").parse().unwrap();
        assert!(
            err <= 1.1 * ggml_err,
            "{name}: our error {err}, ggml's {ggml_err}"
        );
    }
}
