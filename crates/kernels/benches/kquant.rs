//! K-quant matmul kernels timed against each other in one process: the
//! widest tiles this CPU runs (16-row VNNI on AVX-512), the 8-row AVX2
//! tiles, and the row-major blocks (int8 row kernels for one row,
//! dequantize + f32 GEMM for prefill chunks), for Q4_K and Q6_K matrices.
//!
//! `cargo bench -p zinfer-kernels --bench kquant`; `KQ_THREADS` sets the
//! kernels' pool (default 1: steadier on a shared machine), `KQ_REPEATS`
//! the repeats (default 9), `KQ_KINDS` / `KQ_SHAPES` / `KQ_M` narrow the
//! run (e.g. `q4k,q6k`, `2048x2048,8192x2048` and `1,64,128`). Each
//! repeat runs every variant once, interleaved and starting at another
//! each time, so load from other processes falls on all of them; the
//! figures are medians. One-row (decode) runs cycle through copies of
//! the matrix totalling at least `KQ_STREAM_MB` (default 96), so the
//! weights come from memory, not the 32 MB L3 (0: one copy, hot in cache,
//! to time the kernels' own work); chunk (prefill) runs reuse one copy.

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use zinfer_kernels::test_data::random;
use zinfer_kernels::{Layout, Q8Acts, QKind, QMatrix, pool_threads};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Variant {
    name: String,
    mats: Vec<QMatrix>,
    /// Dequantize + f32 GEMM instead of the int8 kernel.
    f32_gemm: bool,
}

fn main() {
    let threads = pool_threads(Some(env_or("KQ_THREADS", "1").parse().unwrap_or(1)));
    let repeats: usize = env_or("KQ_REPEATS", "9").parse().unwrap_or(9);
    let kinds = env_or("KQ_KINDS", "q4k,q6k");
    let shapes = env_or("KQ_SHAPES", "2048x2048,8192x2048");
    let ms: Vec<usize> = env_or("KQ_M", "1,64,128")
        .split(',')
        .map(|m| m.parse().expect("KQ_M as numbers"))
        .collect();
    println!("threads {threads}, {repeats} repeats, medians; times per call");
    println!(
        "{:<5} {:>10} {:>4} {:<22} {:>10} {:>8} {:>9} {:>7}",
        "kind", "rows x cols", "m", "kernel", "ms", "GB/s", "GFLOP/s", "vs old"
    );
    for kind_name in kinds.split(',') {
        let (kind, dtype) = match kind_name {
            "q4k" => (QKind::Q4K, GgmlDType::Q4K),
            "q5k" => (QKind::Q5K, GgmlDType::Q5K),
            "q6k" => (QKind::Q6K, GgmlDType::Q6K),
            other => panic!("unknown kind {other}"),
        };
        for shape in shapes.split(',') {
            let (rows, cols) = shape
                .split_once('x')
                .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)))
                .expect("shape as ROWSxCOLS");
            bench_matrix(kind, dtype, rows, cols, &ms, repeats);
        }
    }
}

fn bench_matrix(
    kind: QKind,
    dtype: GgmlDType,
    rows: usize,
    cols: usize,
    ms: &[usize],
    repeats: usize,
) {
    let x = random(rows * cols, 5, 1.0);
    let x = Tensor::from_vec(x, (rows, cols), &Device::Cpu).expect("tensor");
    let qt = QTensor::quantize(&x, dtype).expect("quantize");
    let bytes = qt.data().expect("bytes").into_owned();
    let make = |layout: Layout, copies: usize| -> Vec<QMatrix> {
        (0..copies)
            .map(|_| QMatrix::with_layout(kind, rows, cols, bytes.clone(), layout).expect("layout"))
            .collect()
    };
    // Bytes of weights one-row runs stream through per timed call.
    let stream: usize = env_or("KQ_STREAM_MB", "96").parse().unwrap_or(96);
    let copies = (stream << 20).div_ceil(bytes.len()).max(1);
    for &m in ms {
        let n = if m == 1 { copies } else { 1 };
        let mut variants = vec![
            Variant {
                name: String::new(),
                mats: make(Layout::Widest, n),
                f32_gemm: false,
            },
            Variant {
                name: String::new(),
                mats: make(Layout::Avx2Tiles, n),
                f32_gemm: false,
            },
            Variant {
                name: String::new(),
                mats: make(Layout::RowMajor, n),
                f32_gemm: m > 1,
            },
        ];
        for v in &mut variants {
            let how = if v.f32_gemm { "dequant+f32" } else { "int8" };
            v.name = format!("{} {how}", v.mats[0].layout_name());
        }
        let input = random(m * cols, 9, 1.0);
        let mut acts = Q8Acts::default();
        // Both quantizations: the variants read different ones.
        let mats = variants.iter().map(|v| &v.mats[0]);
        acts.quantize_for(&input, m, cols, mats);
        let mut out = vec![0f32; m * rows];
        let mut scratch = Vec::new();
        let mut times = vec![Vec::new(); variants.len()];
        // One untimed round to warm caches, the pool and the scratch.
        for rep in 0..=repeats {
            // Each repeat starts at another variant, so none always runs
            // first (after another variant's pass evicted the caches).
            let n = variants.len();
            for k in 0..n {
                let at = (rep + k) % n;
                let (v, t) = (&variants[at], &mut times[at]);
                let start = Instant::now();
                for w in &v.mats {
                    if v.f32_gemm {
                        w.matmul_f32(&input, m, &mut out, &mut scratch, true);
                    } else {
                        w.matmul_q8(&acts, m, &mut out, true);
                    }
                }
                let per_call = start.elapsed().as_secs_f64() / v.mats.len() as f64;
                if rep > 0 {
                    t.push(per_call);
                }
            }
        }
        // What each variant's activations cost: the new tiles' alone, then the others'.
        let mut quantize = [0.0; 2];
        for (i, q) in quantize.iter_mut().enumerate() {
            let mut t = Vec::new();
            for _ in 0..repeats {
                let start = Instant::now();
                acts.quantize_for(&input, m, cols, [&variants[i * 2].mats[0]]);
                t.push(start.elapsed().as_secs_f64());
            }
            *q = median(t);
        }
        let old = median(times[1].clone());
        for (v, t) in variants.iter().zip(times) {
            let s = median(t);
            let gbs = v.mats[0].stored_bytes() as f64 / s / 1e9;
            let gflops = 2.0 * (m * rows * cols) as f64 / s / 1e9;
            println!(
                "{:<5} {:>10} {:>4} {:<22} {:>10.4} {:>8.1} {:>9.1} {:>6.2}x",
                format!("{kind:?}"),
                format!("{rows}x{cols}"),
                m,
                v.name,
                s * 1e3,
                gbs,
                gflops,
                old / s
            );
        }
        println!(
            "{:<5} {:>10} {:>4} quantize acts: {:.4} ms for {}, {:.4} ms for row-major",
            "",
            "",
            m,
            quantize[0] * 1e3,
            variants[0].name,
            quantize[1] * 1e3,
        );
    }
}
