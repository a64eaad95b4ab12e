//! The task's ConfigMap: `manifests.yaml`, which the sandbox pods read with
//! `basecamp-sandbox run --config`, and the resolved sandbox spec of each
//! variant (`sandbox-<variant>.yaml`, profile applied) for people reading it.
//!
//! `manifests.yaml` holds the HarnessTask and one SandboxConfig per variant
//! with the profile already applied. A variant with a profile gets a
//! SandboxConfig named `<sandbox>.<profile>` and the task's copy refers to
//! it without a profile, so an A/B test of two profiles of one sandbox runs
//! exactly what the operator validated, and the pod resolves nothing itself.

use std::collections::BTreeMap;

use basecamp_api::sandbox::SandboxConfigSpec;
use basecamp_api::task::{HarnessTaskSpec, SandboxRef};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use serde::Serialize;

use super::{BuildError, BuildInput, ResolvedVariant};

/// The key of the manifests in the ConfigMap (and the file in the pod).
pub const MANIFESTS_KEY: &str = "manifests.yaml";

/// The name of the resolved SandboxConfig a variant runs.
pub fn resolved_sandbox_name(variant: &ResolvedVariant) -> String {
    match &variant.profile {
        Some(profile) => format!("{}.{profile}", variant.sandbox_name),
        None => variant.sandbox_name.clone(),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a, S: Serialize> {
    api_version: &'a str,
    kind: &'a str,
    metadata: Meta<'a>,
    spec: S,
}

#[derive(Serialize)]
struct Meta<'a> {
    name: &'a str,
    namespace: &'a str,
}

fn yaml(value: &impl Serialize, what: &str) -> Result<String, BuildError> {
    serde_saphyr::to_string(value).map_err(|e| BuildError::Render { what: what.to_string(), message: e.to_string() })
}

/// The task spec as the pod reads it: sandbox references point at the
/// resolved SandboxConfigs, without profiles.
pub fn pod_task_spec(spec: &HarnessTaskSpec, variants: &[ResolvedVariant]) -> HarnessTaskSpec {
    let mut spec = spec.clone();
    let resolved_ref = |variant: &ResolvedVariant| SandboxRef { name: resolved_sandbox_name(variant), profile: None };
    if spec.variants.is_empty() {
        if let (Some(sandbox_ref), Some(variant)) = (spec.sandbox_ref.as_mut(), variants.first()) {
            *sandbox_ref = resolved_ref(variant);
        }
    } else {
        for entry in &mut spec.variants {
            if let Some(variant) = variants.iter().find(|v| v.name == entry.name) {
                entry.sandbox_ref = resolved_ref(variant);
            }
        }
    }
    spec
}

/// The multi-document YAML the pods read.
pub fn manifests_yaml(input: &BuildInput<'_>) -> Result<String, BuildError> {
    let api_version = basecamp_api::API_VERSION;
    let task = Document {
        api_version,
        kind: "HarnessTask",
        metadata: Meta { name: input.name, namespace: input.namespace },
        spec: pod_task_spec(&input.task.spec, &input.variants),
    };
    let mut text = yaml(&task, "the HarnessTask manifest")?;
    let mut written: Vec<String> = Vec::new();
    for variant in &input.variants {
        let name = resolved_sandbox_name(variant);
        if written.contains(&name) {
            continue;
        }
        let sandbox = Document {
            api_version,
            kind: "SandboxConfig",
            metadata: Meta { name: &name, namespace: input.namespace },
            spec: &variant.spec,
        };
        text.push_str("---\n");
        text.push_str(&yaml(&sandbox, "a SandboxConfig manifest")?);
        written.push(name);
    }
    Ok(text)
}

/// The ConfigMap.
pub fn config_map(input: &BuildInput<'_>) -> Result<ConfigMap, BuildError> {
    let mut data = BTreeMap::from([(MANIFESTS_KEY.to_string(), manifests_yaml(input)?)]);
    for variant in &input.variants {
        let spec: &SandboxConfigSpec = &variant.spec;
        data.insert(format!("sandbox-{}.yaml", variant.name), yaml(spec, "a resolved sandbox spec")?);
    }
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(super::names::config_map_name(input.name)),
            namespace: Some(input.namespace.to_string()),
            labels: Some(super::names::labels(input.name, None)),
            owner_references: Some(vec![input.owner.clone()]),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    })
}
