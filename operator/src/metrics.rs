//! The operator's Prometheus metrics (prometheus-client), served on
//! `/metrics`. Names are fixed (the Helm chart's dashboards use them) and
//! labels are bounded: namespace/task/variant exist per task and are
//! removed when the task is deleted; `phase`, `state`, `category` and
//! `operation` take a fixed set of values.
//!
//! - gauges per variant: `basecamp_task_tool_call_accuracy`,
//!   `basecamp_task_plan_step_f1`, `basecamp_task_memory_consistency`,
//!   `basecamp_task_error_rate`, `basecamp_task_success_rate`,
//!   `basecamp_task_resolution_seconds_p95`, `basecamp_task_episodes`,
//!   `basecamp_task_not_measured_episodes` (episodes the policy's server or a
//!   sandbox service failed, left out of the means), `basecamp_task_logit_divergence` (when the
//!   policy sent reference logits), `basecamp_task_criteria_met` (1/0);
//! - `basecamp_tasks{phase}`, `basecamp_shards{namespace,task,variant,state}`;
//! - training tasks: `basecamp_checkpoint_step{namespace,task}`, the newest
//!   evaluated step, and that step's metrics per variant,
//!   `basecamp_checkpoint_tool_call_accuracy`, ... (the step is a gauge,
//!   never a label, so series stay bounded);
//! - `basecamp_reconcile_duration_seconds` (histogram),
//!   `basecamp_reconcile_errors_total{category}`;
//! - `basecamp_s3_operation_errors_total{operation}`,
//!   `basecamp_s3_operation_duration_seconds{operation}` (histogram).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use basecamp_api::task::{HarnessTaskStatus, TaskPhase};
use basecamp_trace::metrics::NOT_MEASURED_EPISODES;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// `application/openmetrics-text`.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `text/plain; version=0.0.4`.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every task phase, for `basecamp_tasks{phase}`.
pub const PHASES: [TaskPhase; 5] =
    [TaskPhase::Pending, TaskPhase::Running, TaskPhase::Succeeded, TaskPhase::Failed, TaskPhase::Suspended];
/// Every shard state, for `basecamp_shards{state}`.
pub const SHARD_STATES: [&str; 4] = ["pending", "running", "succeeded", "failed"];
/// S3 operations, for the `operation` label.
pub const S3_OPERATIONS: [&str; 4] = ["list", "get", "put", "delete"];

/// Labels of per-variant series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VariantLabels {
    /// The task's namespace.
    pub namespace: String,
    /// The task.
    pub task: String,
    /// The variant.
    pub variant: String,
}

/// Labels of per-task series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// The task's namespace.
    pub namespace: String,
    /// The task.
    pub task: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    namespace: String,
    task: String,
    variant: String,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabels {
    category: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApplyLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Gauge name -> status metric it shows.
const VARIANT_GAUGES: [(&str, &str, &str); 9] = [
    (
        "basecamp_task_tool_call_accuracy",
        "tool_call_accuracy",
        "Mean strict tool-call accuracy of the variant's episodes",
    ),
    ("basecamp_task_plan_step_f1", "plan_step_f1", "Mean plan-step F1 of the variant's episodes"),
    ("basecamp_task_memory_consistency", "memory_consistency", "Mean memory consistency of the variant's episodes"),
    ("basecamp_task_error_rate", "error_rate", "Mean tool-call error rate of the variant's episodes"),
    (
        "basecamp_task_success_rate",
        "success_rate",
        "Share of the variant's episodes with no failure: no tool error, every tool call right, memory as expected",
    ),
    (
        "basecamp_task_resolution_seconds_p95",
        "resolution_time_p95_s",
        "95th percentile episode resolution time, in seconds",
    ),
    ("basecamp_task_episodes", "episodes", "Episodes aggregated for the variant"),
    (
        "basecamp_task_not_measured_episodes",
        NOT_MEASURED_EPISODES,
        "Episodes of the variant that the policy's server or a sandbox service failed (policy_error, \
         service_exited): counted in basecamp_task_episodes, left out of the means",
    ),
    (
        "basecamp_task_logit_divergence",
        "logit_divergence",
        "Mean per-token KL(policy || reference logits) of the variant's episodes, in nats",
    ),
];

/// Checkpoint gauge name -> the evaluated step's metric it shows.
const CHECKPOINT_GAUGES: [(&str, &str, &str); 8] = [
    (
        "basecamp_checkpoint_tool_call_accuracy",
        "tool_call_accuracy",
        "Mean strict tool-call accuracy of the newest evaluated checkpoint, by variant",
    ),
    ("basecamp_checkpoint_plan_step_f1", "plan_step_f1", "Mean plan-step F1 of the newest evaluated checkpoint"),
    (
        "basecamp_checkpoint_memory_consistency",
        "memory_consistency",
        "Mean memory consistency of the newest evaluated checkpoint",
    ),
    ("basecamp_checkpoint_error_rate", "error_rate", "Mean tool-call error rate of the newest evaluated checkpoint"),
    (
        "basecamp_checkpoint_success_rate",
        "success_rate",
        "Share of the newest evaluated checkpoint's episodes with no failure, by variant",
    ),
    (
        "basecamp_checkpoint_resolution_seconds_p95",
        "resolution_time_p95_s",
        "95th percentile episode resolution time of the newest evaluated checkpoint, in seconds",
    ),
    ("basecamp_checkpoint_episodes", "episodes", "Episodes of the newest evaluated checkpoint's evaluation"),
    (
        "basecamp_checkpoint_logit_divergence",
        "logit_divergence",
        "Mean per-token KL(policy || reference logits) of the newest evaluated checkpoint, in nats",
    ),
];

/// The operator's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    variant_gauges: Vec<(&'static str, Family<VariantLabels, FloatGauge>)>,
    criteria_met: Family<VariantLabels, Gauge>,
    checkpoint_step: Family<TaskLabels, Gauge>,
    checkpoint_gauges: Vec<(&'static str, Family<VariantLabels, FloatGauge>)>,
    shards: Family<ShardLabels, Gauge>,
    tasks: Family<PhaseLabels, Gauge>,
    reconcile_duration: Histogram,
    reconcile_errors: Family<CategoryLabels, Counter>,
    s3_errors: Family<OperationLabels, Counter>,
    s3_duration: Family<OperationLabels, Histogram>,
    applies: Family<ApplyLabels, Counter>,
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    phases: BTreeMap<(String, String), TaskPhase>,
    variants: BTreeMap<(String, String), BTreeSet<String>>,
    checkpoint_variants: BTreeMap<(String, String), BTreeSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let mut variant_gauges = Vec::new();
        for (name, key, help) in VARIANT_GAUGES {
            let family = Family::<VariantLabels, FloatGauge>::default();
            registry.register(name, help, family.clone());
            variant_gauges.push((key, family));
        }
        let criteria_met = Family::<VariantLabels, Gauge>::default();
        registry.register(
            "basecamp_task_criteria_met",
            "1 when every success criterion is met for the variant, else 0",
            criteria_met.clone(),
        );
        let checkpoint_step = Family::<TaskLabels, Gauge>::default();
        registry.register(
            "basecamp_checkpoint_step",
            "The training step of the newest evaluated checkpoint",
            checkpoint_step.clone(),
        );
        let mut checkpoint_gauges = Vec::new();
        for (name, key, help) in CHECKPOINT_GAUGES {
            let family = Family::<VariantLabels, FloatGauge>::default();
            registry.register(name, help, family.clone());
            checkpoint_gauges.push((key, family));
        }
        let shards = Family::<ShardLabels, Gauge>::default();
        registry.register("basecamp_shards", "Shards of a variant by state", shards.clone());
        let tasks = Family::<PhaseLabels, Gauge>::default();
        registry.register("basecamp_tasks", "HarnessTasks by phase", tasks.clone());
        // From 0.5 ms: a reconcile served from the caches takes well under 5 ms.
        let reconcile_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        registry.register_with_unit(
            "basecamp_reconcile_duration",
            "Time of one reconcile",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let reconcile_errors = Family::<CategoryLabels, Counter>::default();
        registry.register(
            "basecamp_reconcile_errors",
            "Reconciles that failed, by error category",
            reconcile_errors.clone(),
        );
        let s3_errors = Family::<OperationLabels, Counter>::default();
        registry.register(
            "basecamp_s3_operation_errors",
            "S3 operations that failed after their retries",
            s3_errors.clone(),
        );
        let s3_duration = Family::<OperationLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.005, 2.0, 14))) as fn() -> Histogram,
        );
        registry.register_with_unit(
            "basecamp_s3_operation_duration",
            "Time of S3 operations, retries included",
            Unit::Seconds,
            s3_duration.clone(),
        );
        let applies = Family::<ApplyLabels, Counter>::default();
        registry.register(
            "basecamp_applies",
            "Objects a reconcile applied (result=applied) or found up to date in its cache and did not send (result=unchanged), by kind",
            applies.clone(),
        );
        let metrics = Self {
            registry,
            variant_gauges,
            criteria_met,
            checkpoint_step,
            checkpoint_gauges,
            shards,
            tasks,
            reconcile_duration,
            reconcile_errors,
            s3_errors,
            s3_duration,
            applies,
            known: Mutex::default(),
        };
        for phase in PHASES {
            metrics.tasks.get_or_create(&PhaseLabels { phase: phase.as_str() }).set(0);
        }
        metrics
    }

    /// One reconcile's time, and its error category if it failed.
    pub fn observe_reconcile(&self, took: Duration, error_category: Option<&'static str>) {
        self.reconcile_duration.observe(took.as_secs_f64());
        if let Some(category) = error_category {
            self.reconcile_errors.get_or_create(&CategoryLabels { category }).inc();
        }
    }

    /// One object a reconcile applied (`sent`) or found up to date.
    pub fn count_apply(&self, kind: &'static str, sent: bool) {
        let result = if sent { "applied" } else { "unchanged" };
        self.applies.get_or_create(&ApplyLabels { kind, result }).inc();
    }

    /// One S3 operation (`list`, `get`, `put`, `delete`).
    pub fn observe_s3(&self, operation: &'static str, took: Duration, failed: bool) {
        self.s3_duration.get_or_create(&OperationLabels { operation }).observe(took.as_secs_f64());
        if failed {
            self.s3_errors.get_or_create(&OperationLabels { operation }).inc();
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn refresh_phase_counts(&self, known: &Known) {
        for phase in PHASES {
            let count = known.phases.values().filter(|p| **p == phase).count();
            self.tasks
                .get_or_create(&PhaseLabels { phase: phase.as_str() })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Shows a task's status: phase, shard states and metrics per variant.
    pub fn record_task(&self, namespace: &str, task: &str, status: &HarnessTaskStatus) {
        let mut known = self.known();
        let key = (namespace.to_string(), task.to_string());
        let variants: BTreeSet<String> = status.shards.keys().chain(status.metrics.keys()).cloned().collect();
        // Variants no longer in the spec lose their series.
        if let Some(old) = known.variants.get(&key) {
            for gone in old.difference(&variants) {
                self.remove_variant(namespace, task, gone);
            }
        }
        for variant in &variants {
            let labels = VariantLabels { namespace: namespace.into(), task: task.into(), variant: variant.clone() };
            let metrics = status.metrics.get(variant);
            for (key, family) in &self.variant_gauges {
                match metrics.and_then(|m| m.get(*key)) {
                    Some(value) if value.is_finite() => {
                        family.get_or_create(&labels).set(*value);
                    }
                    _ => {
                        family.remove(&labels);
                    }
                }
            }
            let results: Vec<bool> = status.criteria.iter().filter(|c| &c.variant == variant).map(|c| c.met).collect();
            if results.is_empty() {
                self.criteria_met.remove(&labels);
            } else {
                self.criteria_met.get_or_create(&labels).set(i64::from(results.iter().all(|m| *m)));
            }
            if let Some(counts) = status.shards.get(variant) {
                let pending = counts.total.saturating_sub(counts.finished()).saturating_sub(counts.running);
                for (state, value) in [
                    ("pending", pending),
                    ("running", counts.running),
                    ("succeeded", counts.succeeded),
                    ("failed", counts.failed),
                ] {
                    let labels =
                        ShardLabels { namespace: namespace.into(), task: task.into(), variant: variant.clone(), state };
                    self.shards.get_or_create(&labels).set(i64::from(value));
                }
            }
        }
        known.variants.insert(key.clone(), variants);
        self.record_checkpoint(&mut known, namespace, task, status);
        if let Some(phase) = status.phase {
            known.phases.insert(key, phase);
        }
        self.refresh_phase_counts(&known);
    }

    /// The newest evaluated checkpoint's step and metrics.
    fn record_checkpoint(&self, known: &mut Known, namespace: &str, task: &str, status: &HarnessTaskStatus) {
        let key = (namespace.to_string(), task.to_string());
        let newest = status.training.as_ref().and_then(|t| t.history.last());
        let variants: BTreeSet<String> = newest.map(|e| e.metrics.keys().cloned().collect()).unwrap_or_default();
        for gone in known.checkpoint_variants.get(&key).into_iter().flatten().filter(|v| !variants.contains(*v)) {
            self.remove_checkpoint_variant(namespace, task, gone);
        }
        let task_labels = TaskLabels { namespace: namespace.into(), task: task.into() };
        match newest {
            Some(evaluation) => {
                self.checkpoint_step
                    .get_or_create(&task_labels)
                    .set(i64::try_from(evaluation.step).unwrap_or(i64::MAX));
                for (variant, metrics) in &evaluation.metrics {
                    let labels =
                        VariantLabels { namespace: namespace.into(), task: task.into(), variant: variant.clone() };
                    for (key, family) in &self.checkpoint_gauges {
                        match metrics.get(*key) {
                            Some(value) if value.is_finite() => {
                                family.get_or_create(&labels).set(*value);
                            }
                            _ => {
                                family.remove(&labels);
                            }
                        }
                    }
                }
            }
            None => {
                self.checkpoint_step.remove(&task_labels);
            }
        }
        known.checkpoint_variants.insert(key, variants);
    }

    fn remove_checkpoint_variant(&self, namespace: &str, task: &str, variant: &str) {
        let labels = VariantLabels { namespace: namespace.into(), task: task.into(), variant: variant.into() };
        for (_, family) in &self.checkpoint_gauges {
            family.remove(&labels);
        }
    }

    fn remove_variant(&self, namespace: &str, task: &str, variant: &str) {
        let labels = VariantLabels { namespace: namespace.into(), task: task.into(), variant: variant.into() };
        for (_, family) in &self.variant_gauges {
            family.remove(&labels);
        }
        self.criteria_met.remove(&labels);
        for state in SHARD_STATES {
            self.shards.remove(&ShardLabels {
                namespace: namespace.into(),
                task: task.into(),
                variant: variant.into(),
                state,
            });
        }
    }

    /// Removes every series of a deleted task.
    pub fn forget_task(&self, namespace: &str, task: &str) {
        let mut known = self.known();
        let key = (namespace.to_string(), task.to_string());
        for variant in known.variants.remove(&key).unwrap_or_default() {
            self.remove_variant(namespace, task, &variant);
        }
        for variant in known.checkpoint_variants.remove(&key).unwrap_or_default() {
            self.remove_checkpoint_variant(namespace, task, &variant);
        }
        self.checkpoint_step.remove(&TaskLabels { namespace: namespace.into(), task: task.into() });
        known.phases.remove(&key);
        self.refresh_phase_counts(&known);
    }

    /// OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing into a String cannot fail");
        out
    }

    /// Prometheus text format 0.0.4.
    pub fn encode_prometheus_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing into a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basecamp_api::task::{CriterionResult, ShardCounts};

    fn status() -> HarnessTaskStatus {
        HarnessTaskStatus {
            phase: Some(TaskPhase::Running),
            shards: [("a".to_string(), ShardCounts { total: 4, succeeded: 2, failed: 0, running: 1 })].into(),
            metrics: [(
                "a".to_string(),
                [
                    ("tool_call_accuracy".to_string(), 0.75),
                    ("episodes".to_string(), 20.0),
                    ("logit_divergence".to_string(), 0.125),
                    ("success_rate".to_string(), 0.5),
                ]
                .into(),
            )]
            .into(),
            criteria: vec![CriterionResult {
                variant: "a".into(),
                criterion: "x".into(),
                met: false,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn task_series_appear_and_are_removed_with_the_task() {
        let metrics = Metrics::new();
        metrics.record_task("team", "eval", &status());
        let text = metrics.encode();
        assert!(
            text.contains(r#"basecamp_task_tool_call_accuracy{namespace="team",task="eval",variant="a"} 0.75"#),
            "{text}"
        );
        assert!(text.contains(r#"basecamp_task_episodes{namespace="team",task="eval",variant="a"} 20.0"#), "{text}");
        assert!(
            text.contains(r#"basecamp_task_logit_divergence{namespace="team",task="eval",variant="a"} 0.125"#),
            "{text}"
        );
        assert!(text.contains(r#"basecamp_task_success_rate{namespace="team",task="eval",variant="a"} 0.5"#), "{text}");
        assert!(text.contains(r#"basecamp_task_criteria_met{namespace="team",task="eval",variant="a"} 0"#), "{text}");
        assert!(
            text.contains(r#"basecamp_shards{namespace="team",task="eval",variant="a",state="pending"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"basecamp_tasks{phase="Running"} 1"#), "{text}");
        assert!(!text.contains("basecamp_task_plan_step_f1{"), "no data, no series: {text}");
        metrics.forget_task("team", "eval");
        let text = metrics.encode();
        assert!(!text.contains(r#"task="eval""#), "{text}");
        assert!(text.contains(r#"basecamp_tasks{phase="Running"} 0"#), "{text}");
    }

    fn training_status(steps: &[(u64, f64)]) -> HarnessTaskStatus {
        use basecamp_api::task::{CheckpointEvaluation, TrainingStatus};
        let history = steps
            .iter()
            .map(|(step, accuracy)| CheckpointEvaluation {
                step: *step,
                checkpoint: format!("s3://b/c/step-{step}/"),
                phase: TaskPhase::Succeeded,
                metrics: [("a".to_string(), [("tool_call_accuracy".to_string(), *accuracy)].into())].into(),
                criteria_met: None,
                report_url: None,
                finished_at: None,
            })
            .collect();
        HarnessTaskStatus { training: Some(TrainingStatus { history, ..Default::default() }), ..status() }
    }

    #[test]
    fn checkpoint_gauges_show_the_newest_evaluated_step_and_go_with_the_task() {
        let metrics = Metrics::new();
        metrics.record_task("team", "train", &training_status(&[]));
        assert!(!metrics.encode().contains("basecamp_checkpoint_step{"), "nothing evaluated, no series");
        metrics.record_task("team", "train", &training_status(&[(20, 0.5), (30, 0.625)]));
        let text = metrics.encode();
        assert!(text.contains(r#"basecamp_checkpoint_step{namespace="team",task="train"} 30"#), "{text}");
        assert!(
            text.contains(r#"basecamp_checkpoint_tool_call_accuracy{namespace="team",task="train",variant="a"} 0.625"#),
            "{text}"
        );
        metrics.forget_task("team", "train");
        let text = metrics.encode();
        assert!(!text.contains(r#"task="train""#), "{text}");
    }

    #[test]
    fn operational_metrics_have_the_documented_names() {
        let metrics = Metrics::new();
        metrics.observe_reconcile(Duration::from_millis(12), Some("ApplyFailed"));
        metrics.observe_s3("list", Duration::from_millis(3), true);
        let text = metrics.encode_prometheus_text();
        for name in [
            "basecamp_reconcile_duration_seconds_bucket",
            r#"basecamp_reconcile_errors_total{category="ApplyFailed"} 1"#,
            r#"basecamp_s3_operation_errors_total{operation="list"} 1"#,
            r#"basecamp_s3_operation_duration_seconds_count{operation="list"} 1"#,
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
    }

    #[test]
    fn promtool_accepts_the_metrics_when_installed() {
        let Ok(output) = std::process::Command::new("promtool").arg("--version").output() else {
            eprintln!("promtool not installed; skipping the lint (apt-get install prometheus)");
            return;
        };
        assert!(output.status.success());
        let metrics = Metrics::new();
        metrics.record_task("team", "eval", &status());
        metrics.record_task("team", "train", &training_status(&[(20, 0.5)]));
        metrics.observe_reconcile(Duration::from_millis(12), Some("ApplyFailed"));
        metrics.observe_s3("get", Duration::from_millis(3), false);
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool runs");
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(metrics.encode_prometheus_text().as_bytes()).expect("write");
        let out = child.wait_with_output().expect("promtool finishes");
        let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && report.trim().is_empty(), "promtool check metrics:\n{report}");
    }
}
