//! The instruction sets the kernels are built for, and which one this CPU
//! has. A leaf: the dispatch and the tile layouts read it.

use std::sync::OnceLock;

/// The instruction sets the kernels are built for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Level {
    Scalar,
    /// AVX2, FMA and F16C.
    Avx2,
    /// AVX2 and AVX-512 F, BW, VL and VNNI.
    Avx512Vnni,
}

/// The level of this CPU, or a lower one named by `ZINFER_CPU_LEVEL`
/// (`scalar`, `avx2`, `avx512`), so one machine can time and test the
/// builds of lower levels; a name above the CPU's level changes nothing.
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let detected = detected();
        match std::env::var("ZINFER_CPU_LEVEL").as_deref() {
            Ok("scalar") => Level::Scalar,
            Ok("avx2") if detected != Level::Scalar => Level::Avx2,
            _ => detected,
        }
    })
}

/// The widest level this CPU has.
fn detected() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        // Every feature a `target_feature` of the AVX-512 builds enables.
        let avx512 = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        if avx2 && avx512 {
            return Level::Avx512Vnni;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    Level::Scalar
}

/// Whether this CPU has AVX512_BF16 besides [`Level::Avx512Vnni`]: the
/// bf16 attention unit's instructions.
pub(crate) fn has_avx512_bf16() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            level() == Level::Avx512Vnni && is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

#[cfg(test)]
mod tests {
    use crate::dispatch::{flash_unit_bf16, flash_units};

    /// `make test` runs this under `ZINFER_CPU_LEVEL=avx2` and `scalar`
    /// too: a cap must hide every wider build, and no cap hide none.
    #[test]
    fn the_level_cap_hides_the_wider_builds() {
        let names: Vec<&str> = flash_units().iter().map(|u| u.name).collect();
        match std::env::var("ZINFER_CPU_LEVEL").as_deref() {
            Ok("scalar") => assert_eq!(names, ["portable"]),
            Ok("avx2") => {
                assert!(!names.iter().any(|n| n.starts_with("avx512")), "{names:?}");
                assert!(flash_unit_bf16().is_none());
            }
            _ => {
                #[cfg(target_arch = "x86_64")]
                if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw") {
                    assert!(names.contains(&"avx512"), "{names:?}");
                }
                #[cfg(target_arch = "x86_64")]
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    assert!(names.contains(&"avx2"), "{names:?}");
                }
            }
        }
    }
}
