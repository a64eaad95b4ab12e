//! Basecamp's API: the `HarnessTask` and `SandboxConfig` custom resources,
//! the harness spec, and the one validation function shared by the sandbox,
//! the operator and the CLI.
//!
//! - [`sandbox`], [`tool`], [`service`], [`timeouts`], [`gpu`], [`profile`]: the
//!   `SandboxConfig` resource and how a profile is applied.
//! - [`task`]: the `HarnessTask` resource and its status.
//! - [`duration`], [`criteria`], [`storage`], [`preprocessor`]: the small
//!   languages inside specs (durations, success criteria, S3 URIs,
//!   preprocessor names).
//! - [`testset`], [`fixture`], [`jsonl`]: JSONL files the spec points to.
//! - [`crd`]: the generated CRDs and a structural-schema check.
//! - [`manifest`]: reading multi-document YAML manifests from files;
//!   [`harness_json`]: the JSON harness form, converted to a manifest.
//! - [`validate`]: every check, returning a [`Report`] of [`Problem`]s.

pub mod crd;
pub mod criteria;
pub mod duration;
pub mod fixture;
pub mod gpu;
pub mod harness_json;
pub mod jsonl;
pub mod manifest;
pub mod preprocessor;
pub mod problem;
pub mod profile;
pub mod sandbox;
pub mod schema;
pub mod service;
pub mod storage;
pub mod task;
pub mod testset;
pub mod timeouts;
pub mod tool;
pub mod validate;

pub use criteria::{Comparison, Criterion, CriterionError, Threshold};
pub use duration::{Duration, DurationError};
pub use gpu::{ComputeCapability, ComputeCapabilityError, GpuRequirement};
pub use manifest::{Loaded, ManifestError, Manifests, ObjectReport, SandboxRefError, Source};
pub use problem::{Location, Problem, Report, Rule, Severity};
pub use profile::{ProfileError, SandboxProfile, resolve_profile};
pub use sandbox::{SandboxConfig, SandboxConfigSpec};
pub use service::ServiceSpec;
pub use task::{HarnessTask, HarnessTaskSpec, HarnessTaskStatus};
pub use testset::{Episode, ExpectedToolCall, TestSet, TestSetError, TestSetLoadError};
pub use timeouts::ToolTimeouts;
pub use tool::ToolSpec;
pub use validate::{FixtureMemo, ValidationContext, validate_sandbox, validate_task};

/// The API group of Basecamp's resources.
pub const GROUP: &str = "basecamp.dev";
/// The API version of Basecamp's resources.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of Basecamp's resources.
pub const API_VERSION: &str = "basecamp.dev/v1alpha1";
