//! Devices a worker can run its model on, as one value parsed in one place.
//!
//! `cpu` runs our own kernels ([`crate::model::Llama`]); `cuda:N` runs the
//! same engine on candle's CUDA backend ([`crate::model::CandleLlama`]) when
//! the binary was built with the `cuda` feature. `auto` picks the best device
//! present. Metal is parsed so that an error can say what is missing.

use std::fmt;
use std::str::FromStr;

/// Where a worker's model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU, on zinfer's own kernels.
    Cpu,
    /// NVIDIA GPU number N (`cuda` alone means `cuda:0`).
    Cuda(usize),
    /// Apple GPU number N (not built yet; always reported unavailable).
    Metal(usize),
    /// The best device present: `cuda:0` in a CUDA build with a usable GPU,
    /// else the CPU.
    Auto,
}

/// Why a device string cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    /// Not a device name at all.
    #[error("unknown device `{0}`: use auto, cpu, cuda, cuda:N, metal or metal:N")]
    Unknown(String),
    /// A GPU device in a binary built without its cargo feature.
    #[error(
        "device `{device}` needs a zinfer built with the `{feature}` feature (cargo build --release --features {feature}); this binary runs on the CPU only: use --device cpu"
    )]
    NotBuilt {
        /// The device asked for.
        device: Device,
        /// The cargo feature that adds it.
        feature: &'static str,
    },
    /// The feature is there but the device is not (no driver, no such ordinal).
    #[error("device `{device}` is not usable: {reason}")]
    Unavailable {
        /// The device asked for.
        device: Device,
        /// What the driver said.
        reason: String,
    },
}

impl FromStr for Device {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || DeviceError::Unknown(s.to_string());
        let (kind, ordinal) = match s.split_once(':') {
            Some((kind, n)) => (kind, Some(n.parse::<usize>().map_err(|_| unknown())?)),
            None => (s, None),
        };
        match (kind, ordinal) {
            ("cpu", None) => Ok(Self::Cpu),
            ("auto", None) => Ok(Self::Auto),
            ("cuda", n) => Ok(Self::Cuda(n.unwrap_or(0))),
            ("metal", n) => Ok(Self::Metal(n.unwrap_or(0))),
            _ => Err(unknown()),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Metal(n) => write!(f, "metal:{n}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

impl Device {
    /// Whether this build has the backend for the device at all.
    pub fn is_built(self) -> bool {
        match self {
            Self::Cpu | Self::Auto => true,
            Self::Cuda(_) => cfg!(feature = "cuda"),
            Self::Metal(_) => false,
        }
    }

    /// Resolves `auto` and checks that the device can be used now, so a
    /// worker fails at start with a reason instead of at its first request.
    pub fn check(self) -> Result<Self, DeviceError> {
        match self {
            Self::Cpu => Ok(Self::Cpu),
            Self::Auto => Ok(if Self::Cuda(0).check().is_ok() {
                Self::Cuda(0)
            } else {
                Self::Cpu
            }),
            Self::Cuda(_) if !self.is_built() => Err(DeviceError::NotBuilt {
                device: self,
                feature: "cuda",
            }),
            Self::Metal(_) => Err(DeviceError::NotBuilt {
                device: self,
                feature: "metal",
            }),
            Self::Cuda(_) => self.candle().map(|_| self),
        }
    }

    /// The candle device for the tensor backend (`cpu` is candle's CPU).
    pub fn candle(self) -> Result<candle_core::Device, DeviceError> {
        match self {
            Self::Cpu | Self::Auto => Ok(candle_core::Device::Cpu),
            Self::Cuda(n) => {
                candle_core::Device::new_cuda(n).map_err(|e| DeviceError::Unavailable {
                    device: self,
                    reason: cuda_reason(&e.to_string()),
                })
            }
            Self::Metal(_) => Err(DeviceError::NotBuilt {
                device: self,
                feature: "metal",
            }),
        }
    }
}

/// The device the model and engine tests run on: `ZINFER_TEST_DEVICE`
/// (e.g. `cuda:0` on a GPU machine), else `cpu`.
pub fn test_device() -> String {
    std::env::var("ZINFER_TEST_DEVICE").unwrap_or_else(|_| "cpu".to_string())
}

/// Turns candle's driver errors into a sentence an operator can act on.
fn cuda_reason(err: &str) -> String {
    if err.contains("INVALID_DEVICE") {
        format!("no such GPU on this host ({err}); `nvidia-smi -L` lists the GPUs")
    } else if err.contains("NO_DEVICE") || err.contains("NOT_INITIALIZED") {
        format!("no NVIDIA GPU or driver found ({err})")
    } else if err.contains("not compiled with cuda") {
        "this binary was built without the `cuda` feature".to_string()
    } else {
        err.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (s, d) in [
            ("cpu", Device::Cpu),
            ("auto", Device::Auto),
            ("cuda:0", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
            ("metal:1", Device::Metal(1)),
        ] {
            assert_eq!(s.parse::<Device>(), Ok(d));
            assert_eq!(d.to_string(), s);
        }
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("metal".parse::<Device>(), Ok(Device::Metal(0)));
    }

    #[test]
    fn bad_names_say_what_is_accepted() {
        for s in ["tpu", "cuda:x", "cpu:0:1", "", "cuda:-1", "CPU"] {
            let err = s.parse::<Device>().unwrap_err();
            assert_eq!(err, DeviceError::Unknown(s.to_string()));
            assert!(err.to_string().contains("cuda:N"), "{err}");
        }
    }

    #[test]
    fn cpu_and_auto_always_work() {
        assert_eq!(Device::Cpu.check(), Ok(Device::Cpu));
        let auto = Device::Auto.check().unwrap();
        assert!(auto == Device::Cpu || auto == Device::Cuda(0));
    }

    #[test]
    fn metal_is_reported_as_not_built() {
        let err = Device::Metal(0).check().unwrap_err();
        assert!(matches!(
            err,
            DeviceError::NotBuilt {
                feature: "metal",
                ..
            }
        ));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_the_feature() {
        let err = Device::Cuda(0).check().unwrap_err();
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn a_missing_gpu_ordinal_is_unavailable() {
        let err = Device::Cuda(999).check().unwrap_err();
        assert!(matches!(err, DeviceError::Unavailable { .. }), "{err}");
    }
}
