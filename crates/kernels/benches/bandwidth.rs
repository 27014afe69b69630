//! The memory wall: how fast this machine reads memory, with 1 and 2
//! threads (STREAM's idea, reads only, as a decode step reads weights).
//!
//! `cargo bench -p zinfer-kernels --bench bandwidth` prints the median read
//! bandwidth of a 1 GiB buffer per thread count; `ZINFER_BANDWIDTH_MIB`
//! changes the size and `ZINFER_BANDWIDTH_THREADS` the counts (comma
//! separated). Decode figures are quoted as a fraction of these numbers.

// The reads are compiled per instruction set, like the kernels, and called
// behind the same runtime checks.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::time::Instant;

const REPEATS: usize = 9;

/// Sums `words`. Integer addition is associative, so the compiler
/// vectorizes this and interleaves several accumulators: the loop is bound
/// by loads, not by one dependency chain.
#[inline(always)]
fn sum(words: &[u64]) -> u64 {
    words.iter().fold(0, |a, &w| a.wrapping_add(w))
}

/// [`sum`] compiled with the widest loads the CPU has, as the kernels are.
fn read(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn wide(words: &[u64]) -> u64 {
            sum(words)
        }
        #[target_feature(enable = "avx2")]
        fn avx2(words: &[u64]) -> u64 {
            sum(words)
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, checked on the line above.
            return unsafe { wide(words) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked on the line above.
            return unsafe { avx2(words) };
        }
    }
    sum(words)
}

/// Seconds to read all of `words` once, split evenly over `threads`.
fn one_pass(words: &[u64], threads: usize) -> f64 {
    let part = words.len().div_ceil(threads);
    let start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = words
            .chunks(part)
            .map(|p| s.spawn(move || read(black_box(p))))
            .collect();
        for h in handles {
            black_box(h.join().expect("a reader thread panicked"));
        }
    });
    start.elapsed().as_secs_f64()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo test --benches` runs this binary too; one quick pass is enough there.
    if std::env::args().any(|a| a == "--test") {
        let words = vec![1u64; 1 << 16];
        assert_eq!(read(&words), 1 << 16);
        return;
    }
    let mib: usize = env_or("ZINFER_BANDWIDTH_MIB", 1024);
    let threads: Vec<usize> = std::env::var("ZINFER_BANDWIDTH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .filter(|&t| t > 0)
        .collect();
    let words: Vec<u64> = (0..mib * 1024 * 1024 / 8).map(|i| i as u64).collect();
    let bytes = (words.len() * 8) as f64;
    println!("read bandwidth of a {mib} MiB buffer, median of {REPEATS} passes");
    for &t in &threads {
        one_pass(&words, t);
        let mut secs: Vec<f64> = (0..REPEATS).map(|_| one_pass(&words, t)).collect();
        secs.sort_by(f64::total_cmp);
        let median = secs[REPEATS / 2];
        println!(
            "threads {t}: {:.1} GB/s (best {:.1})",
            bytes / median / 1e9,
            bytes / secs[0] / 1e9
        );
    }
}
