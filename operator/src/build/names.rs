//! Names and labels of the objects a task owns. Kubernetes caps names of
//! Jobs (their pods carry the name in a label) and label values at 63
//! characters; longer names keep a readable prefix and a hash suffix, so
//! two long names never collide.

use std::collections::BTreeMap;

/// Label: the task's name.
pub const TASK_LABEL: &str = "basecamp.dev/task";
/// Label: the variant's name.
pub const VARIANT_LABEL: &str = "basecamp.dev/variant";
/// Label: what a pod does for the task: `trainer` or `evaluation` (the
/// variants' own sandbox pods carry none).
pub const ROLE_LABEL: &str = "basecamp.dev/role";
/// Label: the training step a checkpoint evaluation evaluates.
pub const STEP_LABEL: &str = "basecamp.dev/step";
/// Role of the trainer Job and its pod.
pub const ROLE_TRAINER: &str = "trainer";
/// Role of checkpoint evaluation Jobs and their pods.
pub const ROLE_EVALUATION: &str = "evaluation";
/// Annotation on an evaluation Job: the checkpoint it evaluates (`C/step-N/`).
pub const CHECKPOINT_ANNOTATION: &str = "basecamp.dev/checkpoint";
/// Annotation on a Job: the hash of everything immutable in it; a Job whose
/// hash differs from the desired one is replaced.
pub const TEMPLATE_HASH_ANNOTATION: &str = "basecamp.dev/template-hash";
/// The Kueue queue label.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// FNV-1a, 64 bits, as 16 hex digits: stable across builds and platforms.
pub fn stable_hash(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// `text` if it has at most `max` characters, else a prefix, `-` and 8 hex
/// digits of its hash (a valid DNS label when `text` is one).
pub fn fit(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let hash = &stable_hash(text.as_bytes())[..8];
    let prefix: String = text.chars().take(max.saturating_sub(9)).collect();
    format!("{}-{hash}", prefix.trim_end_matches(['-', '.']))
}

/// A label value for a name (at most 63 characters).
pub fn label_value(name: &str) -> String {
    fit(name, 63)
}

/// The ConfigMap holding the manifests and resolved sandbox specs.
pub fn config_map_name(task: &str) -> String {
    fit(&format!("{task}-sandbox"), 253)
}

/// The NetworkPolicy of the task's sandbox pods.
pub fn network_policy_name(task: &str) -> String {
    fit(&format!("{task}-sandbox"), 253)
}

/// A Job of the task: `<task>-<suffix>`, at most 63 characters (the
/// trainer's; an Indexed Job's name is [`indexed_job_name`]).
pub fn job_name(task: &str, suffix: &str) -> String {
    fit(&format!("{task}-{suffix}"), 63)
}

/// An Indexed Job of `completions` pods named after `base` (`<task>-<variant>`,
/// `<task>-s<N>-<variant>`): short enough that each pod's hostname,
/// `<job>-<index>`, is a DNS label of at most 63 characters, which
/// Kubernetes requires of the Job (a 63-character name was refused, "will
/// not able to create pod with invalid DNS label", and its task never ran).
/// A name that fits with its highest index is kept as it is.
pub fn indexed_job_name(base: &str, completions: i32) -> String {
    let highest_index = completions.max(1) - 1;
    let max = 63 - 1 - highest_index.to_string().len();
    if base.contains('.') {
        // A task name may have dots; a DNS label may not. The hash keeps
        // `a.b`'s Job apart from `a-b`'s.
        let hash = &stable_hash(base.as_bytes())[..8];
        let prefix: String = base.replace('.', "-").chars().take(max - 9).collect();
        return format!("{}-{hash}", prefix.trim_end_matches('-'));
    }
    fit(base, max)
}

/// Labels on everything a task owns (and on its pods).
pub fn labels(task: &str, variant: Option<&str>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "basecamp-sandbox".to_string()),
        ("app.kubernetes.io/instance".to_string(), label_value(task)),
        ("app.kubernetes.io/component".to_string(), "sandbox".to_string()),
        ("app.kubernetes.io/part-of".to_string(), "basecamp".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), crate::FIELD_MANAGER.to_string()),
        (TASK_LABEL.to_string(), label_value(task)),
    ]);
    if let Some(variant) = variant {
        labels.insert(VARIANT_LABEL.to_string(), label_value(variant));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_indexed_job_leaves_room_for_its_highest_pod_index() {
        assert_eq!(indexed_job_name("eval-a", 2), "eval-a");
        // 61 characters + "-9" is 63: kept as it is.
        let kept = "k".repeat(61);
        assert_eq!(indexed_job_name(&kept, 10), kept);
        for completions in [1, 10, 11, 100_000] {
            let name = indexed_job_name(&"x".repeat(70), completions);
            let hostname = format!("{name}-{}", completions - 1);
            assert_eq!(hostname.len(), 63, "{hostname}");
        }
        assert_ne!(indexed_job_name(&"x".repeat(70), 2), indexed_job_name(&format!("{}y", "x".repeat(69)), 2));
        // A dot is valid in a task name, not in a hostname: `dot.task-a-0` was refused.
        let dotted = indexed_job_name("dot.task-a", 2);
        assert!(dotted.starts_with("dot-task-a-") && !dotted.contains('.'), "{dotted}");
        assert_ne!(dotted, indexed_job_name("dot-task-a", 2));
    }

    #[test]
    fn long_names_keep_a_prefix_and_a_hash() {
        assert_eq!(job_name("eval", "a"), "eval-a");
        let long = "x".repeat(70);
        let name = job_name(&long, "baseline");
        assert_eq!(name.len(), 63);
        assert_ne!(name, job_name(&long, "candidate"));
        assert!(name.starts_with("xxxx"));
        assert_eq!(label_value(&"y".repeat(64)).len(), 63);
        assert_eq!(stable_hash(b""), "cbf29ce484222325");
    }
}
