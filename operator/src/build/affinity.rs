//! GPU placement: node affinity from `minComputeCapability` on the GPU
//! feature-discovery labels, optional product and memory selectors, and the
//! toleration for GPU nodes' taint.
//!
//! Node affinity has no "version >=" operator, and the labels hold integer
//! strings (`nvidia.com/gpu.compute.major: "8"`). For `>= M.m` two terms are
//! ORed: `major Gt M`, or `major In [M]` AND `minor Gt m-1` (for `m = 0` the
//! second term is just `major In [M]`). Product and memory requirements are
//! ANDed into every term.

use basecamp_api::{ComputeCapability, GpuRequirement};
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Toleration,
};

/// GPU feature discovery: the compute capability's major version.
pub const COMPUTE_MAJOR_LABEL: &str = "nvidia.com/gpu.compute.major";
/// GPU feature discovery: the compute capability's minor version.
pub const COMPUTE_MINOR_LABEL: &str = "nvidia.com/gpu.compute.minor";
/// GPU feature discovery: the GPU model, e.g. `NVIDIA-A100-SXM4-80GB`.
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// GPU feature discovery: GPU memory in MiB.
pub const MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
/// The extended resource of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

fn requirement(key: &str, operator: &str, values: Vec<String>) -> NodeSelectorRequirement {
    NodeSelectorRequirement { key: key.to_string(), operator: operator.to_string(), values: Some(values) }
}

/// The node selector terms (ORed) for a compute capability `>= min`.
pub fn compute_capability_terms(min: ComputeCapability) -> Vec<Vec<NodeSelectorRequirement>> {
    let newer_major = vec![requirement(COMPUTE_MAJOR_LABEL, "Gt", vec![min.major.to_string()])];
    let mut same_major = vec![requirement(COMPUTE_MAJOR_LABEL, "In", vec![min.major.to_string()])];
    if min.minor > 0 {
        same_major.push(requirement(COMPUTE_MINOR_LABEL, "Gt", vec![(min.minor - 1).to_string()]));
    }
    vec![newer_major, same_major]
}

/// Requirements every term carries: product and memory.
fn common_requirements(gpu: &GpuRequirement) -> Vec<NodeSelectorRequirement> {
    let mut common = Vec::new();
    if let Some(product) = gpu.product.as_deref().filter(|p| !p.is_empty()) {
        common.push(requirement(PRODUCT_LABEL, "In", vec![product.to_string()]));
    }
    if let Some(gib) = gpu.min_memory_gib.filter(|g| *g > 0) {
        let mib = u64::from(gib) * 1024;
        common.push(requirement(MEMORY_LABEL, "Gt", vec![(mib - 1).to_string()]));
    }
    common
}

/// The pod's affinity for a GPU requirement; `None` when it asks nothing
/// of nodes. `min` is the parsed `minComputeCapability`.
pub fn gpu_affinity(gpu: &GpuRequirement, min: Option<ComputeCapability>) -> Option<Affinity> {
    let common = common_requirements(gpu);
    let terms: Vec<Vec<NodeSelectorRequirement>> = match min {
        Some(min) => compute_capability_terms(min)
            .into_iter()
            .map(|mut term| {
                term.extend(common.iter().cloned());
                term
            })
            .collect(),
        None if common.is_empty() => return None,
        None => vec![common],
    };
    Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms
                    .into_iter()
                    .map(|term| NodeSelectorTerm { match_expressions: Some(term), match_fields: None })
                    .collect(),
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        ..Default::default()
    })
}

/// GPU nodes are usually tainted `nvidia.com/gpu:NoSchedule`; pods that
/// request GPUs tolerate it.
pub fn gpu_tolerations() -> Vec<Toleration> {
    vec![Toleration {
        key: Some(GPU_RESOURCE.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some("NoSchedule".to_string()),
        ..Default::default()
    }]
}

/// Whether a node with these labels satisfies the terms (the scheduler's
/// rule for `In` and `Gt`), for tests and the capacity check.
pub fn node_matches(labels: &std::collections::BTreeMap<String, String>, affinity: &Affinity) -> bool {
    let Some(selector) =
        affinity.node_affinity.as_ref().and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return true;
    };
    selector.node_selector_terms.iter().any(|term| {
        term.match_expressions.iter().flatten().all(|req| {
            let value = labels.get(&req.key);
            let values = req.values.as_deref().unwrap_or_default();
            match req.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "Gt" => match (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    values.first().and_then(|v| v.parse::<i64>().ok()),
                ) {
                    (Some(have), Some(bound)) => have > bound,
                    _ => false,
                },
                _ => false,
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn cc(text: &str) -> ComputeCapability {
        text.parse().expect("cc")
    }

    fn terms_as_text(affinity: &Affinity) -> Vec<Vec<String>> {
        affinity
            .node_affinity
            .as_ref()
            .expect("node affinity")
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .expect("required")
            .node_selector_terms
            .iter()
            .map(|t| {
                t.match_expressions
                    .iter()
                    .flatten()
                    .map(|r| format!("{} {} {}", r.key, r.operator, r.values.as_deref().unwrap_or_default().join(",")))
                    .collect()
            })
            .collect()
    }

    fn with_cc(min: &str) -> Affinity {
        let gpu = GpuRequirement { min_compute_capability: Some(min.into()), ..Default::default() };
        gpu_affinity(&gpu, Some(cc(min))).expect("affinity")
    }

    #[test]
    fn terms_for_each_compute_capability() {
        let major = COMPUTE_MAJOR_LABEL;
        let minor = COMPUTE_MINOR_LABEL;
        let cases: [(&str, Vec<Vec<String>>); 5] = [
            ("7.0", vec![vec![format!("{major} Gt 7")], vec![format!("{major} In 7")]]),
            ("7.5", vec![vec![format!("{major} Gt 7")], vec![format!("{major} In 7"), format!("{minor} Gt 4")]]),
            ("8.0", vec![vec![format!("{major} Gt 8")], vec![format!("{major} In 8")]]),
            ("8.6", vec![vec![format!("{major} Gt 8")], vec![format!("{major} In 8"), format!("{minor} Gt 5")]]),
            ("9.0", vec![vec![format!("{major} Gt 9")], vec![format!("{major} In 9")]]),
        ];
        for (min, expected) in cases {
            assert_eq!(terms_as_text(&with_cc(min)), expected, "{min}");
        }
        assert!(gpu_affinity(&GpuRequirement::default(), None).is_none());
    }

    #[test]
    fn the_terms_admit_exactly_the_nodes_at_or_above_the_minimum() {
        let gpus = ["6.1", "7.0", "7.2", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.1"];
        for min in ["7.0", "7.5", "8.0", "8.6", "9.0"] {
            let affinity = with_cc(min);
            for gpu in gpus {
                let have = cc(gpu);
                let labels = BTreeMap::from([
                    (COMPUTE_MAJOR_LABEL.to_string(), have.major.to_string()),
                    (COMPUTE_MINOR_LABEL.to_string(), have.minor.to_string()),
                ]);
                assert_eq!(node_matches(&labels, &affinity), have >= cc(min), "node {gpu} vs >= {min}");
            }
            assert!(!node_matches(&BTreeMap::new(), &affinity), "a node without GPU labels never matches");
        }
    }

    #[test]
    fn product_and_memory_are_required_in_every_term() {
        let gpu = GpuRequirement {
            min_compute_capability: Some("8.0".into()),
            product: Some("NVIDIA-A100-SXM4-80GB".into()),
            min_memory_gib: Some(40),
            ..Default::default()
        };
        let terms = terms_as_text(&gpu_affinity(&gpu, Some(cc("8.0"))).expect("affinity"));
        assert_eq!(terms.len(), 2);
        for term in &terms {
            assert!(term.contains(&format!("{PRODUCT_LABEL} In NVIDIA-A100-SXM4-80GB")), "{term:?}");
            assert!(term.contains(&format!("{MEMORY_LABEL} Gt 40959")), "{term:?}");
        }
        let only_product = GpuRequirement { product: Some("Tesla-T4".into()), ..Default::default() };
        assert_eq!(
            terms_as_text(&gpu_affinity(&only_product, None).expect("affinity")),
            [[format!("{PRODUCT_LABEL} In Tesla-T4")]]
        );
    }
}
