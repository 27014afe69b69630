//! Seeded test inputs shared by the kernel, attention and model tests.

/// `n` values spread evenly over `[-scale, scale)` by a 32-bit LCG: the
/// same numbers on every run and platform, no `rand` needed.
pub fn random(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}
