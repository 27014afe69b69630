//! Devices a worker can run its model on, as one value parsed in one place.
//!
//! `cpu` runs zinfer's own kernels; `cuda:N` runs the same engine on
//! candle's CUDA backend when the binary was built with the `cuda` feature.
//! `auto` picks the best device present. Metal is parsed so that an error
//! can say what is missing. Whether a GPU is actually there is asked of its
//! driver, which this crate does not link: [`Device::check_with`] takes that
//! probe (`zinfer_model::check_device` passes candle's).
//!
//! `cpu:N` is the N-th group of `--threads` cores of this host: a worker on
//! it is pinned there, so two CPU workers on one host never share a core
//! (the kernels' helper threads spin while a step runs, and sharing halves both).

use std::fmt;
use std::str::FromStr;

/// Where a worker's model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU, on zinfer's own kernels.
    Cpu,
    /// Core group N of the CPU (`--threads` cores each), pinned.
    CpuSet(usize),
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
    #[error("unknown device `{0}`: use auto, cpu, cpu:N, cuda, cuda:N, metal or metal:N")]
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
    /// A core group beyond the cores this process may use.
    #[error(
        "device `{device}` is core group {group} of {threads} thread(s), cores {first}..{end}, but this process may use {available} core(s): pick a lower N or fewer --threads"
    )]
    NoSuchCores {
        /// The device asked for.
        device: Device,
        /// Its group number.
        group: usize,
        /// Cores per group.
        threads: usize,
        /// The group's first core (position in the usable-core list).
        first: usize,
        /// One past its last.
        end: usize,
        /// Cores the process may use.
        available: usize,
    },
    /// The OS refused to pin the process to the group's cores.
    #[error("cannot pin to the cores of `{device}`: {reason}")]
    Affinity {
        /// The device asked for.
        device: Device,
        /// What the OS said.
        reason: String,
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
            ("cpu", Some(n)) => Ok(Self::CpuSet(n)),
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
            Self::CpuSet(n) => write!(f, "cpu:{n}"),
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
            Self::Cpu | Self::CpuSet(_) | Self::Auto => true,
            Self::Cuda(_) => cfg!(feature = "cuda"),
            Self::Metal(_) => false,
        }
    }

    /// Resolves `auto` and checks that the device can be used now, so a
    /// worker fails at start with a reason instead of at its first request.
    /// `gpu` says whether a GPU device this build has is present (it asks
    /// the driver); it is called for `cuda:N` and for `auto` only.
    pub fn check_with(
        self,
        gpu: impl Fn(Self) -> Result<(), DeviceError>,
    ) -> Result<Self, DeviceError> {
        match self {
            Self::Cpu | Self::CpuSet(_) => Ok(self),
            Self::Auto => Ok(if Self::Cuda(0).is_built() && gpu(Self::Cuda(0)).is_ok() {
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
            Self::Cuda(_) => gpu(self).map(|()| self),
        }
    }
}

impl Device {
    /// Whether the model runs on the CPU kernels.
    pub fn is_cpu(self) -> bool {
        matches!(self, Self::Cpu | Self::CpuSet(_))
    }

    /// The usable cores (positions in [`usable_cores`]) of `cpu:N` with
    /// `threads` cores per group; `None` for other devices.
    pub fn core_group(self, threads: usize) -> Option<std::ops::Range<usize>> {
        match self {
            Self::CpuSet(n) => {
                let threads = threads.max(1);
                Some(n * threads..(n + 1) * threads)
            }
            _ => None,
        }
    }

    /// Pins this process to the cores of `cpu:N` (a no-op for any other
    /// device). Call it before starting threads: they inherit the mask.
    pub fn pin(self, threads: usize) -> Result<(), DeviceError> {
        let Some(group) = self.core_group(threads) else {
            return Ok(());
        };
        let cores = usable_cores();
        let Some(chosen) = cores.get(group.clone()) else {
            return Err(DeviceError::NoSuchCores {
                device: self,
                group: group.start / threads.max(1),
                threads: threads.max(1),
                first: group.start,
                end: group.end,
                available: cores.len(),
            });
        };
        let affinity = |reason: nix::Error| DeviceError::Affinity {
            device: self,
            reason: reason.to_string(),
        };
        let mut set = nix::sched::CpuSet::new();
        for &core in chosen {
            set.set(core).map_err(affinity)?;
        }
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(affinity)?;
        tracing::info!(device = %self, cores = ?chosen, "pinned to cores");
        Ok(())
    }
}

/// The cores this process may run on, in order (its affinity mask; every
/// core when the mask cannot be read).
pub fn usable_cores() -> Vec<usize> {
    let all = || (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => {
            let cores: Vec<usize> = (0..nix::sched::CpuSet::count())
                .filter(|&core| set.is_set(core).unwrap_or(false))
                .collect();
            if cores.is_empty() { all() } else { cores }
        }
        Err(_) => all(),
    }
}

/// The device the model and engine tests run on: `ZINFER_TEST_DEVICE`
/// (e.g. `cuda:0` on a GPU machine), else `cpu`.
pub fn test_device() -> String {
    std::env::var("ZINFER_TEST_DEVICE").unwrap_or_else(|_| "cpu".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (s, d) in [
            ("cpu", Device::Cpu),
            ("cpu:1", Device::CpuSet(1)),
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
        for s in ["tpu", "cuda:x", "cpu:0:1", "", "cuda:-1", "CPU", "cpu:"] {
            let err = s.parse::<Device>().unwrap_err();
            assert_eq!(err, DeviceError::Unknown(s.to_string()));
            assert!(err.to_string().contains("cuda:N"), "{err}");
        }
    }

    /// A GPU probe that finds no GPU.
    fn no_gpu(device: Device) -> Result<(), DeviceError> {
        Err(DeviceError::Unavailable {
            device,
            reason: "no GPU here".to_string(),
        })
    }

    #[test]
    fn cpu_and_auto_always_work() {
        assert_eq!(Device::Cpu.check_with(no_gpu), Ok(Device::Cpu));
        assert_eq!(Device::CpuSet(1).check_with(no_gpu), Ok(Device::CpuSet(1)));
        assert_eq!(Device::Auto.check_with(no_gpu), Ok(Device::Cpu));
    }

    #[test]
    fn auto_takes_the_first_gpu_only_where_the_build_has_it() {
        let auto = Device::Auto.check_with(|_| Ok(())).unwrap();
        let want = if cfg!(feature = "cuda") {
            Device::Cuda(0)
        } else {
            Device::Cpu
        };
        assert_eq!(auto, want);
    }

    #[test]
    fn core_groups_split_the_usable_cores() {
        assert_eq!(Device::CpuSet(0).core_group(2), Some(0..2));
        assert_eq!(Device::CpuSet(3).core_group(1), Some(3..4));
        assert_eq!(Device::Cpu.core_group(2), None);
        assert!(Device::CpuSet(0).is_cpu() && !Device::Cuda(0).is_cpu());
        let cores = usable_cores();
        assert!(!cores.is_empty());
        let err = Device::CpuSet(cores.len()).pin(1).unwrap_err();
        assert!(
            matches!(err, DeviceError::NoSuchCores { available, .. } if available == cores.len()),
            "{err}"
        );
        assert!(err.to_string().contains("pick a lower N"), "{err}");
    }

    #[test]
    fn metal_is_reported_as_not_built() {
        let err = Device::Metal(0).check_with(|_| Ok(())).unwrap_err();
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
        let err = Device::Cuda(0).check_with(|_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_asks_the_gpu_probe() {
        assert_eq!(Device::Cuda(1).check_with(|_| Ok(())), Ok(Device::Cuda(1)));
        let err = Device::Cuda(1).check_with(no_gpu).unwrap_err();
        assert!(matches!(err, DeviceError::Unavailable { .. }), "{err}");
    }
}
