//! The sandbox's GPU decision: given what [`crate::probe`] found and what the
//! SandboxConfig asks for (`gpu.required`, `minComputeCapability`), run on a
//! GPU, fall back to CPU with a warning, or refuse.
//!
//! A pure function of its inputs, so every case is unit-tested with injected
//! probe results. The refusal reads
//! `GPU arch not supported for sandbox acceleration: found 7.0, need >= 8.0`
//! (the node advertised a GPU the pod does not have: its labels lied), and
//! `no GPU visible for sandbox acceleration: …` when nothing usable is there.

use crate::probe::{GpuDevice, GpuProbe};

/// What the sandbox should do about GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuDecision {
    /// Use this device (the lowest ordinal that meets the requirement).
    Gpu(GpuDevice),
    /// Run on the CPU. `warning` says why, when a GPU was asked for.
    Cpu {
        /// The refusal that `gpu.required: false` turned into a fallback.
        warning: Option<String>,
    },
    /// Refuse to run: `gpu.required` is true and no device qualifies.
    Refuse(GpuRequirementError),
}

impl GpuDecision {
    /// The decision as a result: `Err` for a refusal, `Ok(None)` for the CPU.
    pub fn into_result(self) -> Result<Option<GpuDevice>, GpuRequirementError> {
        match self {
            GpuDecision::Gpu(device) => Ok(Some(device)),
            GpuDecision::Cpu { .. } => Ok(None),
            GpuDecision::Refuse(error) => Err(error),
        }
    }
}

/// Why the sandbox cannot accelerate on the GPUs it sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuRequirementError {
    /// Devices are there, but all are older than `minComputeCapability`.
    #[error(
        "GPU arch not supported for sandbox acceleration: found {}.{}, need >= {}.{}",
        found.0, found.1, need.0, need.1
    )]
    ArchNotSupported {
        /// The highest compute capability among the visible devices.
        found: (u32, u32),
        /// `minComputeCapability`.
        need: (u32, u32),
    },
    /// No device at all: no driver, a failing driver, or zero devices.
    #[error("no GPU visible for sandbox acceleration{}: {why}", need_suffix(*need))]
    NoGpuVisible {
        /// What the probe said.
        why: String,
        /// `minComputeCapability`, if set.
        need: Option<(u32, u32)>,
    },
}

fn need_suffix(need: Option<(u32, u32)>) -> String {
    need.map(|(major, minor)| format!(" (need >= {major}.{minor})")).unwrap_or_default()
}

impl GpuRequirementError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            GpuRequirementError::ArchNotSupported { .. } => "GpuArchNotSupported",
            GpuRequirementError::NoGpuVisible { .. } => "NoGpuVisible",
        }
    }
}

/// Decide how the sandbox uses GPUs.
///
/// - A device at or above `min_cc` (any device when `min_cc` is `None`):
///   [`GpuDecision::Gpu`] with the lowest such ordinal.
/// - None qualifies and `required`: [`GpuDecision::Refuse`].
/// - None qualifies and not `required`: [`GpuDecision::Cpu`] whose warning is
///   the refusal's message plus "falling back to CPU"; no warning when
///   nothing was asked for (`required` false and no `min_cc`).
pub fn check_gpu_requirement(probe: &GpuProbe, required: bool, min_cc: Option<(u32, u32)>) -> GpuDecision {
    let devices = probe.devices();
    if let Some(device) = devices.iter().find(|d| min_cc.is_none_or(|need| d.compute_capability >= need)) {
        return GpuDecision::Gpu(device.clone());
    }
    let error = match (devices.iter().map(|d| d.compute_capability).max(), min_cc) {
        (Some(found), Some(need)) => GpuRequirementError::ArchNotSupported { found, need },
        _ => GpuRequirementError::NoGpuVisible {
            why: probe.why_none().unwrap_or_else(|| "no device qualifies".to_string()),
            need: min_cc,
        },
    };
    if required {
        GpuDecision::Refuse(error)
    } else if min_cc.is_none() {
        GpuDecision::Cpu { warning: None }
    } else {
        GpuDecision::Cpu { warning: Some(format!("{error}; falling back to CPU because gpu.required is false")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(ordinal: usize, cc: (u32, u32)) -> GpuDevice {
        GpuDevice {
            ordinal,
            name: format!("GPU with {}.{}", cc.0, cc.1),
            compute_capability: cc,
            total_memory_bytes: 16 << 30,
        }
    }

    #[test]
    fn a_v100_refuses_when_ampere_is_required_with_the_exact_words() {
        let probe = GpuProbe::Devices(vec![device(0, (7, 0))]);
        let decision = check_gpu_requirement(&probe, true, Some((8, 0)));
        let GpuDecision::Refuse(error) = decision else { panic!("expected a refusal, got {decision:?}") };
        assert_eq!(error.to_string(), "GPU arch not supported for sandbox acceleration: found 7.0, need >= 8.0");
        assert_eq!(error.category(), "GpuArchNotSupported");
    }

    #[test]
    fn below_the_minimum_falls_back_to_cpu_with_a_warning_when_not_required() {
        let probe = GpuProbe::Devices(vec![device(0, (7, 5))]);
        let decision = check_gpu_requirement(&probe, false, Some((8, 0)));
        assert_eq!(
            decision,
            GpuDecision::Cpu {
                warning: Some(
                    "GPU arch not supported for sandbox acceleration: found 7.5, need >= 8.0; \
                     falling back to CPU because gpu.required is false"
                        .into()
                )
            }
        );
        assert_eq!(decision.into_result(), Ok(None));
    }

    #[test]
    fn the_first_device_that_qualifies_is_used() {
        let probe = GpuProbe::Devices(vec![device(0, (7, 0)), device(1, (8, 6)), device(2, (9, 0))]);
        let decision = check_gpu_requirement(&probe, true, Some((8, 0)));
        assert_eq!(decision, GpuDecision::Gpu(device(1, (8, 6))));
        // Compute capability compares as (major, minor): 8.9 >= 8.6, 9.0 >= 8.9, 8.0 < 8.6.
        let fp8 = check_gpu_requirement(&probe, true, Some((8, 9)));
        assert_eq!(fp8.into_result().expect("9.0 qualifies").map(|d| d.ordinal), Some(2));
        let exact = check_gpu_requirement(&GpuProbe::Devices(vec![device(0, (8, 0))]), true, Some((8, 0)));
        assert!(matches!(exact, GpuDecision::Gpu(_)));
    }

    #[test]
    fn the_highest_capability_found_is_reported() {
        let probe = GpuProbe::Devices(vec![device(0, (6, 1)), device(1, (7, 5))]);
        let error = check_gpu_requirement(&probe, true, Some((9, 0))).into_result().expect_err("refused");
        assert_eq!(error.to_string(), "GPU arch not supported for sandbox acceleration: found 7.5, need >= 9.0");
    }

    #[test]
    fn no_gpu_visible_is_refused_or_falls_back() {
        for probe in [
            GpuProbe::NoDriver,
            GpuProbe::Devices(vec![]),
            GpuProbe::DriverFailed { call: "cuInit", message: "CUDA_ERROR_NO_DEVICE".into() },
        ] {
            let error = check_gpu_requirement(&probe, true, Some((8, 0))).into_result().expect_err("refused");
            assert_eq!(error.category(), "NoGpuVisible");
            assert!(
                error.to_string().starts_with("no GPU visible for sandbox acceleration (need >= 8.0): "),
                "{error}"
            );
            let warning = match check_gpu_requirement(&probe, false, Some((8, 0))) {
                GpuDecision::Cpu { warning: Some(warning) } => warning,
                other => panic!("expected a CPU fallback with a warning, got {other:?}"),
            };
            assert!(warning.ends_with("falling back to CPU because gpu.required is false"), "{warning}");
        }
        let no_driver = check_gpu_requirement(&GpuProbe::NoDriver, true, None).into_result().expect_err("refused");
        assert_eq!(
            no_driver.to_string(),
            "no GPU visible for sandbox acceleration: no NVIDIA driver (libcuda.so could not be loaded)"
        );
    }

    #[test]
    fn nothing_asked_means_any_gpu_or_a_quiet_cpu() {
        assert_eq!(check_gpu_requirement(&GpuProbe::NoDriver, false, None), GpuDecision::Cpu { warning: None });
        let probe = GpuProbe::Devices(vec![device(0, (5, 2))]);
        assert_eq!(check_gpu_requirement(&probe, false, None), GpuDecision::Gpu(device(0, (5, 2))));
    }
}
