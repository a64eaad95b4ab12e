//! GPU requirements of a sandbox and the compute capability they are
//! compared with.
//!
//! The operator turns [`ComputeCapability`] into node affinity on the GPU
//! feature-discovery labels `nvidia.com/gpu.compute.major` / `.minor`; the
//! sandbox compares it with what its cudarc probe finds, and refuses with
//! `GPU arch not supported for sandbox acceleration: found 7.0, need >= 8.0`.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The GPUs a sandbox pod needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuRequirement {
    /// When true, a pod on a node whose GPU is missing or below
    /// `minComputeCapability` refuses to run ("GPU arch not supported for
    /// sandbox acceleration"). When false it falls back to CPU with a warning.
    /// Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    /// The lowest CUDA compute capability accepted, as `"major.minor"` — a
    /// quoted string such as `"8.0"` (A100), `"8.6"` (RTX 3090/A10), `"8.9"`
    /// (FP8), `"9.0"` (H100). FlashAttention needs >= 8.0; V100 is 7.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // At most 3 digits a part, as the parser takes them: a pattern of `+`
    // stored "99999999999.0", which the operator then refused.
    #[schemars(regex(pattern = r"^[0-9]{1,3}\.[0-9]{1,3}$"))]
    pub min_compute_capability: Option<String>,
    /// GPUs per sandbox pod (`nvidia.com/gpu` request). Default: 1 when
    /// `required` or `minComputeCapability` is set, else 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Only nodes whose `nvidia.com/gpu.product` label equals this value,
    /// e.g. `NVIDIA-A100-SXM4-80GB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Only nodes whose GPUs have at least this much memory, in GiB
    /// (`nvidia.com/gpu.memory`).
    #[serde(default, rename = "minMemoryGiB", skip_serializing_if = "Option::is_none")]
    pub min_memory_gib: Option<u32>,
}

impl GpuRequirement {
    /// The parsed `minComputeCapability`, if any.
    pub fn min_compute_capability(&self) -> Result<Option<ComputeCapability>, ComputeCapabilityError> {
        self.min_compute_capability.as_deref().map(str::parse).transpose()
    }

    /// GPUs to request per pod, with the default applied.
    pub fn gpu_count(&self) -> u32 {
        self.count.unwrap_or(if self.required || self.min_compute_capability.is_some() { 1 } else { 0 })
    }
}

/// A CUDA compute capability, `major.minor` (e.g. 8.0, 8.6, 9.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// Major version (8 for Ampere).
    pub major: u32,
    /// Minor version (6 for an RTX 3090).
    pub minor: u32,
}

/// A compute capability that is not `major.minor`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "minComputeCapability {input:?} is not a compute capability: write it as a quoted \"major.minor\" string \
     of at most 3 digits a part, e.g. \"8.0\" (A100) or \"8.6\" (RTX 3090)"
)]
pub struct ComputeCapabilityError {
    /// What the user wrote.
    pub input: String,
}

impl ComputeCapabilityError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        "InvalidComputeCapability"
    }
}

impl ComputeCapability {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
}

impl FromStr for ComputeCapability {
    type Err = ComputeCapabilityError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let error = || ComputeCapabilityError { input: input.to_string() };
        let (major, minor) = input.trim().split_once('.').ok_or_else(error)?;
        let digits = |s: &str| !s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return Err(error());
        }
        Ok(Self { major: major.parse().map_err(|_| error())?, minor: minor.parse().map_err(|_| error())? })
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_major_dot_minor_and_orders() {
        let cc: ComputeCapability = "8.6".parse().expect("8.6");
        assert_eq!(cc, ComputeCapability::new(8, 6));
        assert!(ComputeCapability::new(7, 5) < ComputeCapability::new(8, 0));
        assert!(ComputeCapability::new(9, 0) > ComputeCapability::new(8, 9));
        assert_eq!(cc.to_string(), "8.6");
    }

    #[test]
    fn refuses_what_is_not_major_dot_minor() {
        for bad in ["8", "eight", "8.", ".0", "8.0.1", "v8.0", "", "8,0"] {
            let err = bad.parse::<ComputeCapability>().expect_err(bad);
            assert_eq!(err.category(), "InvalidComputeCapability");
            assert!(err.to_string().contains("\"8.0\""), "{err}");
        }
    }

    #[test]
    fn the_crd_pattern_takes_what_the_parser_takes() {
        // The schema's pattern, as the apiserver applies it: digits{1,3} '.' digits{1,3}.
        let schema = crate::crd::schema_of("SandboxConfig").expect("schema");
        let pattern =
            &schema["properties"]["spec"]["properties"]["gpu"]["properties"]["minComputeCapability"]["pattern"];
        assert_eq!(pattern, r"^[0-9]{1,3}\.[0-9]{1,3}$");
        for (input, parses) in [("8.0", true), ("123.456", true), ("1234.0", false), ("99999999999.0", false)] {
            assert_eq!(input.parse::<ComputeCapability>().is_ok(), parses, "{input}");
        }
    }

    #[test]
    fn gpu_count_defaults_to_one_when_a_gpu_is_asked_for() {
        assert_eq!(GpuRequirement::default().gpu_count(), 0);
        let gpu = GpuRequirement { min_compute_capability: Some("8.0".into()), ..Default::default() };
        assert_eq!(gpu.gpu_count(), 1);
        assert_eq!(GpuRequirement { count: Some(4), ..gpu }.gpu_count(), 4);
    }
}
