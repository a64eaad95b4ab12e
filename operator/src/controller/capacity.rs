//! The GPU capacity check: does any node satisfy a sandbox's GPU
//! requirement? Pure over a node list (the dereference step lists nodes).
//! When none does, the task's Degraded condition says what was found, e.g.
//! `0 of 6 GPU nodes satisfy compute capability >= 8.0; found Tesla-V100 (7.0) x4, T4 (7.5) x2`,
//! instead of pods pending with a bare `didn't match Pod's node affinity`.
//! A node satisfies a requirement when its labels match (the pods' node
//! affinity) and it can hold the pod's `gpu.count` GPUs (its allocatable
//! `nvidia.com/gpu`): `count: 16` on 8-GPU nodes is as unschedulable as a
//! wrong compute capability.
//! The Jobs are still created: a node pool may grow.

use std::collections::BTreeMap;

use basecamp_api::{ComputeCapability, GpuRequirement};
use k8s_openapi::api::core::v1::Node;

use crate::build::affinity::{
    COMPUTE_MAJOR_LABEL, COMPUTE_MINOR_LABEL, GPU_RESOURCE, PRODUCT_LABEL, gpu_affinity, node_matches,
};

/// The outcome of the check for one requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    /// Nodes with NVIDIA GPUs (a product label or allocatable GPUs).
    pub gpu_nodes: usize,
    /// Of those, the ones the requirement admits.
    pub satisfying: usize,
    /// What is required, e.g. `compute capability >= 8.0`.
    pub requirement: String,
    /// What was found, e.g. `Tesla-V100 (7.0) x4, T4 (7.5) x2`.
    pub found: String,
}

impl Assessment {
    /// Whether no node satisfies the requirement.
    pub fn is_unsatisfiable(&self) -> bool {
        self.satisfying == 0
    }

    /// `0 of 6 GPU nodes satisfy compute capability >= 8.0; found ...`.
    pub fn message(&self) -> String {
        let found = if self.found.is_empty() { "no GPU nodes".to_string() } else { self.found.clone() };
        format!("{} of {} GPU nodes satisfy {}; found {found}", self.satisfying, self.gpu_nodes, self.requirement)
    }
}

/// The node's allocatable GPUs (its capacity when it reports no
/// allocatable; 0 when neither is reported or the quantity is not a count).
fn gpus_of(node: &Node) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()))
        .and_then(|r| r.get(GPU_RESOURCE))
        .and_then(|q| q.0.trim().parse().ok())
        .unwrap_or(0)
}

fn is_gpu_node(node: &Node) -> bool {
    let labelled = node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(PRODUCT_LABEL));
    labelled || gpus_of(node) > 0
}

fn describe(gpu: &GpuRequirement, min: Option<ComputeCapability>) -> String {
    let mut parts = Vec::new();
    if let Some(min) = min {
        parts.push(format!("compute capability >= {min}"));
    }
    // An empty product constrains nothing (as in the pods' affinity): not
    // named, or the message read "satisfy product , GPU memory ...".
    if let Some(product) = gpu.product.as_deref().filter(|p| !p.is_empty()) {
        parts.push(format!("product {product}"));
    }
    if let Some(gib) = gpu.min_memory_gib {
        parts.push(format!("GPU memory >= {gib} GiB"));
    }
    match gpu.gpu_count() {
        0 => {}
        1 if !parts.is_empty() => {}
        1 => parts.push("1 GPU per pod".to_string()),
        count => parts.push(format!("{count} GPUs per pod")),
    }
    if parts.is_empty() { "the GPU requirement".to_string() } else { parts.join(", ") }
}

/// Checks `nodes` against a GPU requirement: the labels by the same rule as
/// the pods' node affinity, and the pod's GPU count against each node's
/// allocatable GPUs. `None` when the requirement asks for nothing a node
/// could lack (no label constraint and no GPU).
pub fn assess(nodes: &[Node], gpu: &GpuRequirement, min: Option<ComputeCapability>) -> Option<Assessment> {
    let affinity = gpu_affinity(gpu, min);
    let count = u64::from(gpu.gpu_count());
    if affinity.is_none() && count == 0 {
        return None;
    }
    let empty = BTreeMap::new();
    let gpu_nodes: Vec<&Node> = nodes.iter().filter(|n| is_gpu_node(n)).collect();
    let satisfying = gpu_nodes
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.as_ref().unwrap_or(&empty);
            affinity.as_ref().is_none_or(|a| node_matches(labels, a)) && gpus_of(n) >= count
        })
        .count();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for node in &gpu_nodes {
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        let product = labels.get(PRODUCT_LABEL).map_or("unknown GPU", String::as_str);
        let cc = match (labels.get(COMPUTE_MAJOR_LABEL), labels.get(COMPUTE_MINOR_LABEL)) {
            (Some(major), Some(minor)) => format!("{major}.{minor}"),
            _ => "compute capability unlabelled".to_string(),
        };
        // The node's GPU count is named where it matters: a pod asking for
        // more than one, or a node that cannot hold even the one asked for.
        let gpus = gpus_of(node);
        let kind = if count > 1 || gpus < count {
            format!("{product} ({cc}, {gpus} GPUs allocatable)")
        } else {
            format!("{product} ({cc})")
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let mut kinds: Vec<(String, usize)> = kinds.into_iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let found = kinds.iter().map(|(kind, count)| format!("{kind} x{count}")).collect::<Vec<_>>().join(", ");
    Some(Assessment { gpu_nodes: gpu_nodes.len(), satisfying, requirement: describe(gpu, min), found })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node(product: Option<&str>, cc: Option<(u32, u32)>, gpus: Option<&str>) -> Node {
        let mut labels = BTreeMap::new();
        if let Some(product) = product {
            labels.insert(PRODUCT_LABEL.to_string(), product.to_string());
        }
        if let Some((major, minor)) = cc {
            labels.insert(COMPUTE_MAJOR_LABEL.to_string(), major.to_string());
            labels.insert(COMPUTE_MINOR_LABEL.to_string(), minor.to_string());
        }
        Node {
            metadata: kube::api::ObjectMeta { labels: Some(labels), ..Default::default() },
            status: gpus.map(|g| NodeStatus {
                allocatable: Some([(GPU_RESOURCE.to_string(), Quantity(g.to_string()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn need(cc: &str) -> (GpuRequirement, Option<ComputeCapability>) {
        (
            GpuRequirement { min_compute_capability: Some(cc.into()), ..Default::default() },
            Some(cc.parse().expect("cc")),
        )
    }

    #[test]
    fn names_what_was_found_when_no_node_qualifies() {
        let mut nodes: Vec<Node> = (0..4).map(|_| node(Some("Tesla-V100"), Some((7, 0)), Some("8"))).collect();
        nodes.extend((0..2).map(|_| node(Some("T4"), Some((7, 5)), Some("1"))));
        nodes.push(node(None, None, None)); // a CPU node
        let (gpu, min) = need("8.0");
        let assessment = assess(&nodes, &gpu, min).expect("assessed");
        assert!(assessment.is_unsatisfiable());
        assert_eq!(
            assessment.message(),
            "0 of 6 GPU nodes satisfy compute capability >= 8.0; found Tesla-V100 (7.0) x4, T4 (7.5) x2"
        );
    }

    #[test]
    fn a_gpu_count_above_every_node_is_unsatisfiable() {
        let nodes: Vec<Node> = (0..3).map(|_| node(Some("NVIDIA-A100-SXM4-80GB"), Some((8, 0)), Some("8"))).collect();
        let (gpu, min) = need("8.0");
        let sixteen = GpuRequirement { count: Some(16), ..gpu.clone() };
        let assessment = assess(&nodes, &sixteen, min).expect("assessed");
        assert_eq!(
            assessment.message(),
            "0 of 3 GPU nodes satisfy compute capability >= 8.0, 16 GPUs per pod; \
             found NVIDIA-A100-SXM4-80GB (8.0, 8 GPUs allocatable) x3"
        );
        let eight = GpuRequirement { count: Some(8), ..gpu };
        assert_eq!(assess(&nodes, &eight, min).expect("assessed").satisfying, 3);
        // A count with no label constraint is still checked.
        let count_only = GpuRequirement { count: Some(9), ..Default::default() };
        let assessment = assess(&nodes, &count_only, None).expect("a GPU count is a requirement");
        assert_eq!(
            assessment.message(),
            "0 of 3 GPU nodes satisfy 9 GPUs per pod; \
             found NVIDIA-A100-SXM4-80GB (8.0, 8 GPUs allocatable) x3"
        );
        // A labelled node without allocatable GPUs (no device plugin) cannot take one.
        let unplugged = [node(Some("T4"), Some((7, 5)), None)];
        let assessment = assess(&unplugged, &GpuRequirement { required: true, ..Default::default() }, None)
            .expect("one GPU asked for");
        assert_eq!(
            assessment.message(),
            "0 of 1 GPU nodes satisfy 1 GPU per pod; found T4 (7.5, 0 GPUs allocatable) x1"
        );
    }

    #[test]
    fn counts_satisfying_nodes() {
        let nodes = vec![
            node(Some("NVIDIA-A100-SXM4-80GB"), Some((8, 0)), Some("8")),
            node(Some("NVIDIA-H100-80GB-HBM3"), Some((9, 0)), Some("8")),
            node(Some("T4"), Some((7, 5)), Some("1")),
            node(None, None, Some("2")), // GPUs, but no discovery labels
        ];
        let (gpu, min) = need("8.6");
        let assessment = assess(&nodes, &gpu, min).expect("assessed");
        assert_eq!((assessment.satisfying, assessment.gpu_nodes), (1, 4));
        assert!(!assessment.is_unsatisfiable());
        assert!(assessment.found.contains("unknown GPU (compute capability unlabelled) x1"), "{}", assessment.found);
        assert!(assess(&[], &GpuRequirement::default(), None).is_none(), "no constraint: nothing to check");
        let empty = assess(&[], &gpu, min).expect("assessed");
        assert_eq!(empty.message(), "0 of 0 GPU nodes satisfy compute capability >= 8.6; found no GPU nodes");
        // An empty product constrains nothing and is not named (it read "satisfy product , ...").
        let no_product = GpuRequirement { product: Some(String::new()), ..gpu };
        let assessed = assess(&[], &no_product, min).expect("assessed");
        assert_eq!(assessed.message(), "0 of 0 GPU nodes satisfy compute capability >= 8.6; found no GPU nodes");
    }
}
