//! Devices as the model sees them: [`zinfer_probe::device`]'s names, core
//! groups and pinning, plus what needs the tensor library: the candle device
//! for a name, and whether a GPU is really there.

pub use zinfer_probe::device::*;

/// Resolves `auto` and checks that `device` can be used now (for a GPU, by
/// asking its driver through candle), so a worker fails at start with a
/// reason instead of at its first request.
pub fn check_device(device: Device) -> Result<Device, DeviceError> {
    device.check_with(|gpu| candle_device(gpu).map(|_| ()))
}

/// The candle device for the tensor backend (`cpu` is candle's CPU).
pub fn candle_device(device: Device) -> Result<candle_core::Device, DeviceError> {
    match device {
        Device::Cpu | Device::CpuSet(_) | Device::Auto => Ok(candle_core::Device::Cpu),
        Device::Cuda(n) => candle_core::Device::new_cuda(n).map_err(|e| DeviceError::Unavailable {
            device,
            reason: cuda_reason(&e.to_string()),
        }),
        Device::Metal(_) => Err(DeviceError::NotBuilt {
            device,
            feature: "metal",
        }),
    }
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
    fn cpu_and_auto_always_work() {
        assert_eq!(check_device(Device::Cpu), Ok(Device::Cpu));
        let auto = check_device(Device::Auto).unwrap();
        assert!(auto == Device::Cpu || auto == Device::Cuda(0));
        assert!(candle_device(Device::Cpu).unwrap().is_cpu());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_the_feature() {
        let err = check_device(Device::Cuda(0)).unwrap_err();
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn a_missing_gpu_ordinal_is_unavailable() {
        let err = check_device(Device::Cuda(999)).unwrap_err();
        assert!(matches!(err, DeviceError::Unavailable { .. }), "{err}");
    }
}
