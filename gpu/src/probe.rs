//! What GPUs this process can see: name, compute capability and memory of
//! each CUDA device, read through the driver API (cudarc, loaded at run time).
//!
//! The build needs no CUDA: `libcuda.so` is opened only when [`probe_gpus`]
//! runs, and its absence is an answer ([`GpuProbe::NoDriver`]), not a panic.
//! cudarc's dynamic loading panics on the first call into a library it cannot
//! open, so every entry point here checks that the library is present first.
//! The sandbox feeds the answer to [`crate::requirement::check_gpu_requirement`].

use std::fmt;

use cudarc::driver::{result, sys};

/// One CUDA device as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    /// CUDA ordinal (after `CUDA_VISIBLE_DEVICES` has been applied).
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability `(major, minor)`, e.g. `(9, 0)`.
    pub compute_capability: (u32, u32),
    /// Total device memory in bytes.
    pub total_memory_bytes: u64,
}

impl fmt::Display for GpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        let gib = self.total_memory_bytes as f64 / f64::from(1u32 << 30);
        write!(f, "GPU {}: {} (compute capability {major}.{minor}, {gib:.1} GiB)", self.ordinal, self.name)
    }
}

/// The outcome of looking for GPUs. Every way of finding none is a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuProbe {
    /// `libcuda.so` could not be loaded: no NVIDIA driver in this container.
    NoDriver,
    /// The driver loaded but a call failed (e.g. `cuInit` answering
    /// `CUDA_ERROR_NO_DEVICE` or a driver/library mismatch).
    DriverFailed {
        /// The driver API call that failed.
        call: &'static str,
        /// The driver's own error text.
        message: String,
    },
    /// The driver answered; the list may be empty.
    Devices(Vec<GpuDevice>),
}

impl GpuProbe {
    /// The devices found (empty for every failure).
    pub fn devices(&self) -> &[GpuDevice] {
        match self {
            GpuProbe::Devices(devices) => devices,
            GpuProbe::NoDriver | GpuProbe::DriverFailed { .. } => &[],
        }
    }

    /// Why no device is usable, in words, or `None` when at least one is.
    pub fn why_none(&self) -> Option<String> {
        match self {
            GpuProbe::NoDriver => Some("no NVIDIA driver (libcuda.so could not be loaded)".to_string()),
            GpuProbe::DriverFailed { call, message } => Some(format!("the NVIDIA driver failed in {call}: {message}")),
            GpuProbe::Devices(devices) if devices.is_empty() => Some(
                "the NVIDIA driver reports 0 devices (check the nvidia.com/gpu request and CUDA_VISIBLE_DEVICES)"
                    .to_string(),
            ),
            GpuProbe::Devices(_) => None,
        }
    }
}

impl fmt::Display for GpuProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.why_none() {
            Some(why) => write!(f, "no GPU visible: {why}"),
            None => {
                let devices: Vec<String> = self.devices().iter().map(ToString::to_string).collect();
                write!(f, "{}", devices.join("; "))
            }
        }
    }
}

/// Whether the CUDA driver library can be loaded. Cheap after the first call.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda under its usual names; loading the
    // driver library runs no user code of ours.
    unsafe { sys::is_culib_present() }
}

/// Whether NVRTC (needed to compile the kernels) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as for `driver_present`, for libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Enumerate the visible CUDA devices without creating a context on any.
pub fn probe_gpus() -> GpuProbe {
    if !driver_present() {
        return GpuProbe::NoDriver;
    }
    let failed =
        |call: &'static str| move |e: result::DriverError| GpuProbe::DriverFailed { call, message: e.to_string() };
    if let Err(e) = result::init() {
        return failed("cuInit")(e);
    }
    let count = match result::device::get_count() {
        Ok(count) => count,
        Err(e) => return failed("cuDeviceGetCount")(e),
    };
    let mut devices = Vec::new();
    for ordinal in 0..count {
        match describe(ordinal) {
            Ok(device) => devices.push(device),
            Err(probe) => return probe,
        }
    }
    GpuProbe::Devices(devices)
}

fn describe(ordinal: i32) -> Result<GpuDevice, GpuProbe> {
    let failed =
        |call: &'static str| move |e: result::DriverError| GpuProbe::DriverFailed { call, message: e.to_string() };
    let device = result::device::get(ordinal).map_err(failed("cuDeviceGet"))?;
    let name = result::device::get_name(device).map_err(failed("cuDeviceGetName"))?;
    // SAFETY: `device` is a handle the driver just returned for this ordinal.
    let total = unsafe { result::device::total_mem(device) }.map_err(failed("cuDeviceTotalMem"))?;
    let attribute = |attribute| {
        // SAFETY: as above; the attribute is a valid enum value.
        unsafe { result::device::get_attribute(device, attribute) }.map_err(failed("cuDeviceGetAttribute"))
    };
    let major = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(GpuDevice {
        ordinal: usize::try_from(ordinal).unwrap_or_default(),
        name,
        compute_capability: (u32::try_from(major).unwrap_or_default(), u32::try_from(minor).unwrap_or_default()),
        total_memory_bytes: total as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_never_panics_and_says_why_when_there_is_no_gpu() {
        let probe = probe_gpus();
        match &probe {
            GpuProbe::NoDriver => {
                assert!(!driver_present());
                println!("skipping device checks: no NVIDIA driver (libcuda.so not found)");
            }
            GpuProbe::DriverFailed { .. } => println!("driver present but failed: {probe}"),
            GpuProbe::Devices(devices) => {
                for device in devices {
                    assert!(device.compute_capability.0 >= 3, "{device}");
                    assert!(device.total_memory_bytes > 0, "{device}");
                }
                println!("{probe}");
            }
        }
        assert_eq!(probe.why_none().is_none(), !probe.devices().is_empty());
    }

    #[test]
    fn a_probe_reads_as_a_sentence() {
        let h200 = GpuDevice {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            total_memory_bytes: 150_754_820_096,
        };
        assert_eq!(GpuProbe::Devices(vec![h200]).to_string(), "GPU 0: NVIDIA H200 (compute capability 9.0, 140.4 GiB)");
        assert_eq!(GpuProbe::NoDriver.to_string(), "no GPU visible: no NVIDIA driver (libcuda.so could not be loaded)");
        assert!(GpuProbe::Devices(vec![]).to_string().contains("0 devices"));
    }
}
