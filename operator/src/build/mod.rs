//! `build`: the desired state of a task — its ConfigMap, one Indexed Job per
//! variant and its NetworkPolicy — from the task, its resolved sandboxes and
//! the operator's settings. Pure: no API calls, no clock, so every object is
//! unit-tested from a spec alone.
//!
//! - [`configmap`]: manifests for `basecamp-sandbox run --config` and the
//!   resolved sandbox specs;
//! - [`job`]: the Indexed Job, its pod, the pod failure policy;
//! - [`affinity`]: GPU node affinity from `minComputeCapability`;
//! - [`security`]: the pods' secure defaults;
//! - [`policy_server`]: the policy-server sidecar (`policy.server`);
//! - [`network_policy`]: ingress to the metrics port from the configured
//!   peers only; egress to DNS, the policy, tools and S3 only;
//! - [`names`]: names, labels and the template hash.

pub mod affinity;
pub mod configmap;
pub mod job;
pub mod names;
pub mod network_policy;
pub mod policy_server;
pub mod security;

use std::collections::BTreeMap;

use basecamp_api::sandbox::SandboxConfigSpec;
use basecamp_api::{ComputeCapabilityError, HarnessTask};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use crate::settings::Settings;

/// Why the desired state cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The task lacks metadata every owned object needs.
    #[error("the HarnessTask has no metadata.{field}; it cannot own objects")]
    MissingMetadata {
        /// `name`, `namespace` or `uid`.
        field: &'static str,
    },
    /// A manifest could not be rendered.
    #[error("cannot render {what}: {message}")]
    Render {
        /// What was rendered.
        what: String,
        /// The serializer's message.
        message: String,
    },
    /// A compute capability that does not parse (validation normally catches it).
    #[error("variant {variant}: {source}")]
    InvalidComputeCapability {
        /// The variant.
        variant: String,
        /// The parse error.
        source: ComputeCapabilityError,
    },
}

impl BuildError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            BuildError::MissingMetadata { .. } => "MissingMetadata",
            BuildError::Render { .. } => "RenderFailed",
            BuildError::InvalidComputeCapability { .. } => "InvalidComputeCapability",
        }
    }
}

/// A variant with its sandbox resolved (profile applied).
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedVariant {
    /// The variant's name.
    pub name: String,
    /// The SandboxConfig it references.
    pub sandbox_name: String,
    /// The profile it selects.
    pub profile: Option<String>,
    /// The SandboxConfig's spec with the profile applied (no `profiles`).
    pub spec: SandboxConfigSpec,
}

/// Everything `build` reads.
#[derive(Debug, Clone)]
pub struct BuildInput<'a> {
    /// The task.
    pub task: &'a HarnessTask,
    /// Its name.
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// The owner reference every built object carries.
    pub owner: OwnerReference,
    /// Its variants, in spec order, resolved.
    pub variants: Vec<ResolvedVariant>,
    /// The operator's settings.
    pub settings: &'a Settings,
    /// The Services the endpoints' host names refer to, as the controller
    /// found them (none found: host names open their port to any address;
    /// see [`network_policy`]).
    pub services: BTreeMap<network_policy::ServiceRef, network_policy::ServiceTarget>,
}

impl<'a> BuildInput<'a> {
    /// The input for a task read from the API (it must have name, namespace and uid).
    pub fn new(
        task: &'a HarnessTask,
        variants: Vec<ResolvedVariant>,
        settings: &'a Settings,
    ) -> Result<Self, BuildError> {
        let name = task.metadata.name.as_deref().ok_or(BuildError::MissingMetadata { field: "name" })?;
        let namespace = task.metadata.namespace.as_deref().ok_or(BuildError::MissingMetadata { field: "namespace" })?;
        let owner = task.controller_owner_ref(&()).ok_or(BuildError::MissingMetadata { field: "uid" })?;
        Ok(Self { task, name, namespace, owner, variants, settings, services: BTreeMap::new() })
    }
}

/// The desired state of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// Manifests and resolved sandbox specs.
    pub config_map: ConfigMap,
    /// Ingress and egress limits of the sandbox pods.
    pub network_policy: NetworkPolicy,
    /// One Job per variant, in variant order.
    pub jobs: Vec<Job>,
}

/// Builds the desired state.
pub fn build(input: &BuildInput<'_>) -> Result<Desired, BuildError> {
    let jobs = input.variants.iter().map(|variant| job::job(input, variant)).collect::<Result<Vec<_>, _>>()?;
    Ok(Desired {
        config_map: configmap::config_map(input)?,
        network_policy: network_policy::network_policy(input),
        jobs,
    })
}

#[cfg(test)]
mod tests;
