//! The exponential the softmaxes and SiLU use: plain arithmetic, so the
//! loops around it vectorize. A leaf: the scalar kernels and the blocked
//! attention unit both read it.

/// `e^x` for `x <= 0` (softmax after subtracting the max), within 2e-7
/// relative: a degree-6 polynomial on `x - n ln 2` scaled by `2^n`. Plain
/// arithmetic, so the softmax loop vectorizes (libm's `expf` does not).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        // Down to the clamp at -87, where e^x is already below 2e-38.
        for i in 0..8_700 {
            let x = -(i as f32) * 0.01;
            let (fast, exact) = (exp_nonpositive(x), f64::from(x).exp());
            assert!(
                (f64::from(fast) - exact).abs() <= 3e-7 * exact + 1e-38,
                "{x}: {fast} vs {exact}"
            );
        }
        assert!(exp_nonpositive(-1000.0) < 2e-38);
    }
}
