//! What a local run produced, per variant: the episodes, their aggregate,
//! the success criteria, A/B deltas and root-cause hints — printed as the
//! summary table and written as `run.json` (what `report.html` shows).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use basecamp_api::criteria::{NOT_MEASURED_METRICS, not_measured_tolerated, parse_criterion};
use basecamp_sandbox::driver::{GaveUp, LostEpisode, ShardSummary};
use basecamp_sandbox::policy::throttle::RateLimits;
use basecamp_sandbox::run::ResolvedVariant;
use basecamp_sandbox::services::ServiceExit;
use basecamp_trace::metrics::{
    Aggregate, EpisodeEnd, EpisodeMetrics, NO_FAILURE, aggregate, canonical_metric, measures_the_agent,
};
use serde::Serialize;

use super::analysis::{RootCause, root_causes};

pub const RUN_FILE: &str = "run.json";

/// The metrics the table and the A/B comparison show, in order.
pub const TABLE_METRICS: [&str; 4] = ["tool_call_accuracy", "plan_step_f1", "memory_consistency", "error_rate"];

/// Mean per-token KL(policy || reference logits): shown when a variant has it.
pub const DIVERGENCE: &str = "logit_divergence";

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub task: String,
    /// The manifest paths the run was given, absolute (`trace replay` of a
    /// trace in the run directory finds them here).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<PathBuf>,
    pub out_dir: PathBuf,
    pub wall_seconds: f64,
    pub episodes_per_second: f64,
    pub stopped_early: bool,
    pub variants: Vec<VariantSummary>,
    /// The second variant against the first, when there are two or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// Shards that ended without their summary (a trace or the summary
    /// could not be written): the rest of the run is summarised without them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_shards: Vec<FailedShard>,
    /// Services that exited while the run used them (not stopped by it):
    /// the calls to each failed from then on as `service_exited` errors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_exits: Vec<ServiceExited>,
}

/// A variant's service that exited during the run.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceExited {
    pub variant: String,
    #[serde(flatten)]
    pub exit: ServiceExit,
}

impl ServiceExited {
    /// What the table and the report say of it, after the variant's name.
    pub fn consequence(&self) -> String {
        format!(
            "service {} EXITED during the run ({}): the tool calls to it failed from then on (`service_exited`, \
             not the agent's failures); see {}",
            self.exit.service,
            self.exit.status,
            self.exit.log.display()
        )
    }
}

/// A shard that ended without a summary, and why.
#[derive(Debug, Clone, Serialize)]
pub struct FailedShard {
    pub variant: String,
    pub shard: u32,
    /// The test-set rows it was to run: none is in the aggregate, and the
    /// variant's `lost_episodes` counts them.
    pub episodes: usize,
    pub error: String,
}

impl FailedShard {
    /// What the table and the report say of it, after the variant's name.
    pub fn consequence(&self) -> String {
        format!("shard {} wrote no summary, its {} episodes are not counted: {}", self.shard, self.episodes, self.error)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct VariantSummary {
    pub name: String,
    pub sandbox: String,
    pub shards: usize,
    pub aggregate: Aggregate,
    pub failed: usize,
    pub criteria: Vec<CriterionResult>,
    pub root_causes: Vec<RootCause>,
    pub episodes: Vec<EpisodeRow>,
    pub lost: Vec<LostEpisode>,
    pub interrupted: Vec<String>,
    /// The traces of the `interrupted` episodes (each ends as cancelled),
    /// relative to the run directory as [`EpisodeRow::trace`] is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interrupted_traces: Vec<String>,
    pub not_started: Vec<String>,
    /// Not run now (`basecamp run --variant` of another): its shards are an
    /// earlier run's, kept in the directory ([`RunSummary::mark_kept`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kept_from_earlier_run: bool,
    /// Episodes with warnings in their shard's `summary.json` (raw logits
    /// that could not be used, a turn without logprobs, ...), and the first
    /// of them as `episode: warning`: the table says so, since a metric such
    /// as `logit_divergence` may rest on fewer episodes than ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warned: Option<Warned>,
    /// Shards that stopped starting episodes because the policy's server or
    /// a service failed episode after episode ([`GaveUp`]): the run did not
    /// cover the test set, whatever the criteria tolerate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gave_up: Vec<ShardGaveUp>,
    /// What the policy endpoint's 429s did, when it answered any: the
    /// counts of the shard that saw most (the shards of one `basecamp run`
    /// variant share one client, and so one count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<RateLimits>,
}

/// See [`VariantSummary::gave_up`].
#[derive(Debug, Clone, Serialize)]
pub struct ShardGaveUp {
    pub shard: u32,
    #[serde(flatten)]
    pub gave_up: GaveUp,
}

impl ShardGaveUp {
    /// What the table and the report say of it, after the variant's name.
    pub fn sentence(&self) -> String {
        format!(
            "shard {} GAVE UP: {}; {} episode(s) not started",
            self.shard,
            self.gave_up.reason,
            self.gave_up.not_started.len()
        )
    }
}

/// See [`VariantSummary::warned`].
#[derive(Debug, Clone, Serialize)]
pub struct Warned {
    pub episodes: usize,
    pub first: String,
}

impl Warned {
    /// What the table and the report say of it, after the variant's name,
    /// for a variant of `of` episodes.
    pub fn sentence(&self, of: u32) -> String {
        format!(
            "{} of {of} episodes have warnings (each shard's summary.json lists them), the first: {}",
            self.episodes, self.first
        )
    }
}

/// One episode, with its trace path relative to the run directory.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeRow {
    pub id: String,
    pub shard: u32,
    pub outcome: String,
    pub failure_class: String,
    pub metrics: EpisodeMetrics,
    pub trace: String,
}

impl EpisodeRow {
    pub fn failed(&self) -> bool {
        self.failure_class != NO_FAILURE
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CriterionResult {
    pub criterion: String,
    pub metric: String,
    pub observed: Option<f64>,
    pub met: bool,
    /// Why it could not be evaluated (does not parse, metric not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub baseline: String,
    pub candidate: String,
    pub rows: Vec<Delta>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    pub metric: String,
    pub baseline: Option<f64>,
    pub candidate: Option<f64>,
    /// (candidate - baseline) / |baseline| in percent; `None` when the baseline is 0 or missing.
    pub delta_percent: Option<f64>,
}

/// Evaluates each success criterion against a variant's aggregate and the
/// count of its episodes lost (`lost_episodes`, as the operator reports it).
pub fn evaluate_criteria(criteria: &[String], aggregate: &Aggregate, lost: usize) -> Vec<CriterionResult> {
    criteria
        .iter()
        .map(|text| match parse_criterion(text) {
            Err(e) => CriterionResult {
                criterion: text.clone(),
                metric: String::new(),
                observed: None,
                met: false,
                problem: Some(e.to_string()),
            },
            Ok(criterion) => {
                let observed = match canonical_metric(&criterion.metric) {
                    "lost_episodes" => Some(lost as f64),
                    _ => aggregate.value_of(&criterion.metric),
                };
                CriterionResult {
                    criterion: criterion.text.clone(),
                    metric: criterion.metric.clone(),
                    observed,
                    met: observed.is_some_and(|v| criterion.is_met_by(v)),
                    problem: observed.is_none().then(|| format!("{} was not measured in this run", criterion.metric)),
                }
            }
        })
        .collect()
}

impl VariantSummary {
    /// What the table and the report say of the episodes that measured the
    /// policy's server or a service, not the agent (after the variant's
    /// name); `None` when every episode measured the agent.
    pub fn not_measured_sentence(&self) -> Option<String> {
        let a = &self.aggregate;
        if a.not_measured == 0 {
            return None;
        }
        let classes: Vec<String> = a
            .failure_classes
            .iter()
            .filter(|(class, _)| !measures_the_agent(class))
            .map(|(class, n)| format!("{class} x{n}"))
            .collect();
        let rest = match a.measured() {
            0 => "no metric measured the agent".to_string(),
            n => format!("the metrics are over the other {n}"),
        };
        let tolerance = self.tolerance_criteria();
        let judged = if tolerance.is_empty() {
            String::new()
        } else if self.not_measured_tolerated() {
            format!(" (within the tolerance the criteria set: {})", tolerance.join(", "))
        } else {
            format!(" (beyond the tolerance the criteria set: {})", tolerance.join(", "))
        };
        Some(format!(
            "{} of {} episodes NOT MEASURED: the policy or a service failed, not the agent ({}); {rest}{judged}",
            a.not_measured,
            a.episodes,
            classes.join(", ")
        ))
    }

    /// The success criteria that bound the episodes not measured, as
    /// written (see [`NOT_MEASURED_METRICS`]).
    fn tolerance_criteria(&self) -> Vec<&str> {
        self.criteria
            .iter()
            .filter(|c| NOT_MEASURED_METRICS.contains(&c.metric.as_str()))
            .map(|c| c.criterion.as_str())
            .collect()
    }

    /// Whether this variant's episodes not measured (and the exits of its
    /// services) are within the tolerance its success criteria set: false
    /// when no criterion sets one ([`not_measured_tolerated`]).
    pub fn not_measured_tolerated(&self) -> bool {
        not_measured_tolerated(self.criteria.iter().map(|c| (c.metric.as_str(), c.met)))
    }

    /// One variant from its shards' summaries; `shards` pairs each summary
    /// with its directory relative to `root` (where its traces are).
    pub fn from_shards(
        name: &str,
        sandbox: &str,
        mut shards: Vec<(ShardSummary, PathBuf)>,
        criteria: &[String],
        root: &Path,
    ) -> Self {
        shards.sort_by_key(|(s, _)| s.shard);
        let mut episodes = Vec::new();
        let (mut lost, mut interrupted, mut not_started) = (Vec::new(), Vec::new(), Vec::new());
        let mut interrupted_traces = Vec::new();
        let mut warned: Option<Warned> = None;
        let mut gave_up = Vec::new();
        let rate_limits =
            shards.iter().filter_map(|(shard, _)| shard.rate_limits.clone()).max_by_key(|r| r.answers_429);
        for (shard, dir) in &shards {
            if let Some(g) = &shard.gave_up {
                gave_up.push(ShardGaveUp { shard: shard.shard, gave_up: g.clone() });
            }
            for e in &shard.episodes {
                if let Some(warning) = e.warnings.first() {
                    warned
                        .get_or_insert_with(|| Warned { episodes: 0, first: format!("{}: {warning}", e.id) })
                        .episodes += 1;
                }
                let trace = dir.join(&e.trace_file).to_string_lossy().into_owned();
                episodes.push(EpisodeRow {
                    id: e.id.clone(),
                    shard: shard.shard,
                    outcome: e.outcome.clone(),
                    failure_class: e.failure_class.clone(),
                    metrics: e.metrics.clone(),
                    trace,
                });
            }
            lost.extend(shard.lost.iter().cloned());
            interrupted.extend(shard.interrupted.iter().cloned());
            interrupted_traces
                .extend(shard.interrupted_traces.iter().map(|t| dir.join(t).to_string_lossy().into_owned()));
            not_started.extend(shard.not_started.iter().cloned());
        }
        let aggregate = aggregate(episodes.iter().map(|e| EpisodeEnd {
            metrics: &e.metrics,
            outcome: &e.outcome,
            failure_class: &e.failure_class,
        }));
        let failed: Vec<(&EpisodeRow, PathBuf)> =
            episodes.iter().filter(|e| e.failed()).map(|e| (e, root.join(&e.trace))).collect();
        VariantSummary {
            name: name.to_string(),
            sandbox: sandbox.to_string(),
            shards: shards.len(),
            criteria: evaluate_criteria(criteria, &aggregate, lost.len()),
            root_causes: root_causes(&failed),
            failed: failed.len(),
            aggregate,
            episodes,
            lost,
            interrupted,
            interrupted_traces,
            not_started,
            kept_from_earlier_run: false,
            warned,
            gave_up,
            rate_limits,
        }
    }
}

impl RunSummary {
    pub fn new(
        task: &str,
        out_dir: &Path,
        variants: &[ResolvedVariant],
        shards: Vec<Vec<ShardSummary>>,
        failed_shards: Vec<FailedShard>,
        criteria: &[String],
        wall_seconds: f64,
    ) -> Self {
        let mut summaries = Vec::new();
        let mut stopped_early = false;
        for (variant, shard_summaries) in variants.iter().zip(shards) {
            stopped_early |= shard_summaries.iter().any(|s| s.stopped_early);
            let with_dirs = shard_summaries
                .into_iter()
                .map(|s| {
                    let dir = Path::new(&variant.name).join(format!("shard-{}", s.shard));
                    (s, dir)
                })
                .collect();
            summaries.push(VariantSummary::from_shards(
                &variant.name,
                &variant.sandbox_name,
                with_dirs,
                criteria,
                out_dir,
            ));
        }
        // A failed shard's episodes ran nowhere: `lost_episodes` counts them.
        for v in &mut summaries {
            let unrun: usize = failed_shards.iter().filter(|f| f.variant == v.name).map(|f| f.episodes).sum();
            if unrun > 0 {
                v.criteria = evaluate_criteria(criteria, &v.aggregate, v.lost.len() + unrun);
            }
        }
        let episodes: u32 = summaries.iter().map(|v| v.aggregate.episodes).sum();
        let comparison = (summaries.len() >= 2).then(|| compare(&summaries[0], &summaries[1]));
        RunSummary {
            task: task.to_string(),
            manifests: Vec::new(),
            out_dir: out_dir.to_path_buf(),
            wall_seconds,
            episodes_per_second: if wall_seconds > 0.0 { f64::from(episodes) / wall_seconds } else { 0.0 },
            stopped_early,
            variants: summaries,
            comparison,
            failed_shards,
            service_exits: Vec::new(),
        }
    }

    pub fn lost_episodes(&self) -> usize {
        self.ran().map(|v| v.lost.len()).sum()
    }

    /// Whether the infrastructure failed a variant this run ran beyond what
    /// its criteria tolerate: a service exited, or the policy's server or a
    /// service failed episodes, and no criterion on
    /// [`NOT_MEASURED_METRICS`] lets it; or a shard gave up, leaving
    /// episodes unrun, which no criterion tolerates (`basecamp run` exits 3).
    pub fn infrastructure_failed(&self) -> bool {
        self.ran().any(|v| {
            let failed = v.aggregate.not_measured > 0 || self.service_exits.iter().any(|e| e.variant == v.name);
            (failed && !v.not_measured_tolerated()) || !v.gave_up.is_empty()
        })
    }

    /// Every criterion of every variant this run ran met.
    pub fn criteria_met(&self) -> bool {
        self.ran().all(|v| v.criteria.iter().all(|c| c.met))
    }

    /// The variants this run ran (not those kept from an earlier one).
    fn ran(&self) -> impl Iterator<Item = &VariantSummary> {
        self.variants.iter().filter(|v| !v.kept_from_earlier_run)
    }

    /// Marks the variants named in `kept` as an earlier run's, kept in the
    /// directory: they are in `run.json` and the report, but this run's exit
    /// status, rate and "stopped early" speak of what it ran.
    pub fn mark_kept(&mut self, kept: &[String]) {
        for v in &mut self.variants {
            v.kept_from_earlier_run = kept.contains(&v.name);
        }
        let stopped_early = self.ran().any(|v| !v.interrupted.is_empty() || !v.not_started.is_empty());
        self.stopped_early = stopped_early;
        let episodes: u32 = self.ran().map(|v| v.aggregate.episodes).sum();
        self.episodes_per_second = if self.wall_seconds > 0.0 { f64::from(episodes) / self.wall_seconds } else { 0.0 };
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RUN_FILE);
        let text = serde_json::to_vec_pretty(self).expect("the summary serialises");
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    /// The summary table, A/B comparison and root-cause hints as text.
    pub fn table(&self) -> String {
        let mut out = String::new();
        // Only runs whose policy sent reference logits have a divergence.
        let divergence = self.variants.iter().any(|v| v.aggregate.value_of(DIVERGENCE).is_some());
        let mut header = vec!["variant", "episodes"];
        header.extend(TABLE_METRICS);
        if divergence {
            header.push(DIVERGENCE);
        }
        header.extend(["p50", "p95", "criteria"]);
        let mut rows = vec![header.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
        for v in &self.variants {
            let a = &v.aggregate;
            let met = v.criteria.iter().filter(|c| c.met).count();
            let criteria = if v.criteria.is_empty() {
                "-".to_string()
            } else if met == v.criteria.len() {
                format!("met ({met}/{})", v.criteria.len())
            } else {
                format!("NOT met ({met}/{})", v.criteria.len())
            };
            let mut row = vec![v.name.clone(), a.episodes.to_string()];
            row.extend(TABLE_METRICS.iter().map(|m| fmt_value(a.value_of(m))));
            if divergence {
                row.push(fmt_nats(a.value_of(DIVERGENCE)));
            }
            row.push(fmt_latency(a, a.resolution_time_p50_s));
            row.push(fmt_latency(a, a.resolution_time_p95_s));
            row.push(criteria);
            rows.push(row);
        }
        // The headline speaks of this run: a variant kept from an earlier run
        // is in the table, not in the count the rate is made of.
        let kept = self.variants.iter().filter(|v| v.kept_from_earlier_run).count();
        out.push_str(&format!(
            "\n{}: {} episodes in {:.1}s ({:.1} episodes/s){}{}\n\n",
            self.task,
            self.variants.iter().filter(|v| !v.kept_from_earlier_run).map(|v| v.aggregate.episodes).sum::<u32>(),
            self.wall_seconds,
            self.episodes_per_second,
            if kept > 0 { format!(", plus {kept} variant(s) from an earlier run") } else { String::new() },
            if self.stopped_early { " — STOPPED EARLY, partial results" } else { "" }
        ));
        out.push_str(&columns(&rows));
        if let Some(c) = &self.comparison {
            out.push_str(&format!("\n{} vs {}:\n", c.candidate, c.baseline));
            out.push_str(&c.table());
        }
        for v in &self.variants {
            if v.kept_from_earlier_run {
                out.push_str(&format!("\n{}: from an earlier run in this directory (not run now)", v.name));
            }
            for c in v.criteria.iter().filter(|c| !c.met) {
                let why = c.problem.clone().unwrap_or_else(|| format!("observed {}", fmt_value(c.observed)));
                out.push_str(&format!("\n{}: criterion `{}` not met: {why}", v.name, c.criterion));
            }
            if v.failed > 0 {
                out.push_str(&format!("\n{}: {} of {} episodes failed", v.name, v.failed, v.aggregate.episodes));
                for cause in &v.root_causes {
                    out.push_str(&format!("\n  - {}", cause.hint));
                }
            }
            if let Some(said) = v.not_measured_sentence() {
                out.push_str(&format!("\n{}: {said}", v.name));
            }
            if !v.lost.is_empty() {
                out.push_str(&format!("\n{}: {} episode(s) LOST (trace not written)", v.name, v.lost.len()));
            }
            if let Some(warned) = &v.warned {
                out.push_str(&format!("\n{}: {}", v.name, warned.sentence(v.aggregate.episodes)));
            }
            for failed in self.failed_shards.iter().filter(|f| f.variant == v.name) {
                out.push_str(&format!("\n{}: {}", v.name, failed.consequence()));
            }
            for exited in self.service_exits.iter().filter(|e| e.variant == v.name) {
                out.push_str(&format!("\n{}: {}", v.name, exited.consequence()));
            }
            for gave_up in &v.gave_up {
                out.push_str(&format!("\n{}: {}", v.name, gave_up.sentence()));
            }
            if let Some(rate_limits) = &v.rate_limits {
                out.push_str(&format!("\n{}: {}", v.name, rate_limits.sentence()));
            }
            if !v.interrupted.is_empty() || !v.not_started.is_empty() {
                out.push_str(&format!(
                    "\n{}: stopped early: {} cut off (their traces end as cancelled), {} not started",
                    v.name,
                    v.interrupted.len(),
                    v.not_started.len()
                ));
            }
        }
        out.push('\n');
        out
    }
}

impl Comparison {
    /// metric | baseline | candidate | delta %, as aligned text.
    pub fn table(&self) -> String {
        let mut rows =
            vec![vec!["metric".to_string(), self.baseline.clone(), self.candidate.clone(), "delta".to_string()]];
        for d in &self.rows {
            rows.push(vec![
                d.metric.clone(),
                fmt_metric(&d.metric, d.baseline),
                fmt_metric(&d.metric, d.candidate),
                d.delta_percent.map_or("-".into(), |p| format!("{p:+.1}%")),
            ]);
        }
        columns(&rows)
    }
}

pub fn compare(baseline: &VariantSummary, candidate: &VariantSummary) -> Comparison {
    let divergence = [baseline, candidate].iter().any(|v| v.aggregate.value_of(DIVERGENCE).is_some());
    let metrics = TABLE_METRICS
        .iter()
        .chain(divergence.then_some(&DIVERGENCE))
        .chain(["p95_resolution_time", "success_rate"].iter());
    Comparison {
        baseline: baseline.name.clone(),
        candidate: candidate.name.clone(),
        rows: metrics
            .map(|m| {
                let (a, b) = (baseline.aggregate.value_of(m), candidate.aggregate.value_of(m));
                let delta_percent = match (a, b) {
                    (Some(a), Some(b)) if a != 0.0 => Some((b - a) / a.abs() * 100.0),
                    _ => None,
                };
                Delta { metric: m.to_string(), baseline: a, candidate: b, delta_percent }
            })
            .collect(),
    }
}

pub fn fmt_value(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// A resolution-time percentile of `aggregate` in seconds; `-` when no
/// episode was measured (the aggregate's 0.0 is no latency).
pub fn fmt_latency(aggregate: &Aggregate, seconds: f64) -> String {
    if aggregate.measured() == 0 { "-".into() } else { format!("{seconds:.2}s") }
}

/// A metric's value as the tables show it: the divergence in nats (see
/// [`fmt_nats`]), every other metric with three decimals.
pub fn fmt_metric(metric: &str, v: Option<f64>) -> String {
    if metric == DIVERGENCE { fmt_nats(v) } else { fmt_value(v) }
}

/// A divergence in nats: often far below 0.001, so small values keep
/// their digits (`4.21e-4`) instead of printing as 0.000.
pub fn fmt_nats(v: Option<f64>) -> String {
    match v {
        Some(v) if v != 0.0 && v.abs() < 0.01 => format!("{v:.2e}"),
        other => fmt_value(other),
    }
}

/// Left-aligned columns separated by two spaces.
pub fn columns(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aggregate_with(accuracy: f64) -> Aggregate {
        Aggregate {
            episodes: 10,
            means: [("tool_call_accuracy".to_string(), accuracy)].into(),
            resolution_time_p50_s: 0.5,
            resolution_time_p95_s: 2.0,
            outcomes: [("completed".to_string(), 10)].into(),
            failure_classes: [("ok".to_string(), 8), ("timeout".to_string(), 2)].into(),
            not_measured: 0,
        }
    }

    #[test]
    fn criteria_are_evaluated_on_the_aggregate_and_explain_what_is_missing() {
        let criteria = [
            "tool_call_accuracy >= 0.9".to_string(),
            "p95_resolution_time < 3s".to_string(),
            "success_rate > 0.9".to_string(),
            "user_satisfaction_score > 0.85".to_string(),
        ];
        let results = evaluate_criteria(&criteria, &aggregate_with(0.95), 0);
        assert_eq!(results.iter().map(|r| r.met).collect::<Vec<_>>(), [true, true, false, false]);
        assert_eq!(results[2].observed, Some(0.8));
        assert!(results[3].problem.as_deref().unwrap().contains("user_satisfaction_score was not measured"));
        let missed = evaluate_criteria(&criteria[..1], &aggregate_with(0.5), 0);
        assert!(!missed[0].met);
    }

    #[test]
    fn every_metric_a_criterion_may_name_is_measured_here_as_in_the_operator() {
        let mut aggregate = aggregate_with(0.95);
        for name in ["tool_call_accuracy_lenient", "plan_step_f1", "memory_consistency", "error_rate", "reward"] {
            aggregate.means.insert(name.into(), 0.5);
        }
        aggregate.means.insert("resolution_time_s".into(), 1.5);
        aggregate.means.insert("logit_divergence".into(), 0.01);
        for (metric, _) in basecamp_api::criteria::CRITERION_METRICS {
            for name in [metric.to_string(), format!("avg_{metric}"), format!("mean_{metric}")] {
                let [result] = evaluate_criteria(&[format!("{name} >= 0")], &aggregate, 2).try_into().expect("one");
                assert!(result.observed.is_some(), "{name}: {:?}", result.problem);
            }
        }
        let lost = evaluate_criteria(&["lost_episodes == 0".to_string()], &aggregate, 2);
        assert_eq!((lost[0].observed, lost[0].met), (Some(2.0), false));
    }

    fn variant(name: &str, aggregate: Aggregate) -> VariantSummary {
        VariantSummary {
            name: name.into(),
            sandbox: format!("sandbox-{name}"),
            shards: 1,
            aggregate,
            failed: 0,
            criteria: Vec::new(),
            root_causes: Vec::new(),
            episodes: Vec::new(),
            lost: Vec::new(),
            interrupted: Vec::new(),
            interrupted_traces: Vec::new(),
            not_started: Vec::new(),
            kept_from_earlier_run: false,
            warned: None,
            gave_up: Vec::new(),
            rate_limits: None,
        }
    }

    #[test]
    fn the_divergence_column_appears_only_when_a_variant_has_one() {
        let plain = variant("a", aggregate_with(0.9));
        let mut with_kl = variant("b", aggregate_with(0.8));
        with_kl.aggregate.means.insert(DIVERGENCE.into(), 0.000_421);
        let summary = |variants: Vec<VariantSummary>| RunSummary {
            manifests: Vec::new(),
            task: "t".into(),
            out_dir: PathBuf::from("out"),
            wall_seconds: 1.0,
            episodes_per_second: 20.0,
            stopped_early: false,
            comparison: (variants.len() == 2).then(|| compare(&variants[0], &variants[1])),
            variants,
            failed_shards: Vec::new(),
            service_exits: Vec::new(),
        };
        let without = summary(vec![plain.clone()]).table();
        assert!(!without.contains(DIVERGENCE), "{without}");

        let both = summary(vec![plain, with_kl]);
        let table = both.table();
        let header = table.lines().find(|l| l.starts_with("variant")).expect("header");
        assert!(header.contains("error_rate  logit_divergence  p50"), "{table}");
        let b = table.lines().find(|l| l.starts_with("b ")).expect("row b");
        assert!(b.contains("4.21e-4"), "small KL keeps its digits: {table}");
        let a = table.lines().find(|l| l.starts_with("a ")).expect("row a");
        assert_eq!(a.split_whitespace().nth(6), Some("-"), "{table}");
        let rows = &both.comparison.as_ref().expect("two variants").rows;
        assert!(rows.iter().any(|d| d.metric == DIVERGENCE && d.candidate == Some(0.000_421) && d.baseline.is_none()));
        // The A/B table (`basecamp run`'s and `ab compare`'s) and report.html keep its digits too.
        let ab = table.lines().find(|l| l.starts_with(DIVERGENCE)).expect("A/B divergence row");
        assert_eq!(ab.split_whitespace().collect::<Vec<_>>(), [DIVERGENCE, "-", "4.21e-4", "-"], "{table}");
        let html = super::super::report::render(&both);
        let row = format!("<tr><td>{DIVERGENCE}</td><td>-</td><td>4.21e-4</td>");
        assert!(html.contains(&row), "{html}");
    }

    #[test]
    fn a_failed_shards_episodes_count_as_lost() {
        let variants = [basecamp_sandbox::run::ResolvedVariant {
            name: "a".into(),
            sandbox_name: "s".into(),
            sandbox: Default::default(),
        }];
        let failed = FailedShard { variant: "a".into(), shard: 1, episodes: 4, error: "disk full".into() };
        let criteria = ["lost_episodes == 0".to_string()];
        let summary = RunSummary::new("t", Path::new("out"), &variants, vec![Vec::new()], vec![failed], &criteria, 1.0);
        // Before: met, observed 0, though none of the shard's 4 episodes ran.
        let lost = &summary.variants[0].criteria[0];
        assert_eq!((lost.met, lost.observed), (false, Some(4.0)), "{lost:?}");
        assert_eq!(
            summary.failed_shards[0].consequence(),
            "shard 1 wrote no summary, its 4 episodes are not counted: disk full"
        );
    }

    #[test]
    fn a_variant_without_episodes_shows_no_latency() {
        let mut empty = variant("a", aggregate_with(0.9));
        empty.aggregate = Aggregate::default();
        let summary = RunSummary {
            manifests: Vec::new(),
            task: "t".into(),
            out_dir: PathBuf::from("out"),
            wall_seconds: 1.0,
            episodes_per_second: 0.0,
            stopped_early: false,
            comparison: None,
            variants: vec![empty],
            failed_shards: Vec::new(),
            service_exits: Vec::new(),
        };
        // Before: p50 and p95 `0.00s`, a latency nothing measured.
        let table = summary.table();
        let a = table.lines().find(|l| l.starts_with("a ")).expect("row a");
        let cells: Vec<&str> = a.split_whitespace().collect();
        assert_eq!(cells[cells.len() - 3..cells.len() - 1], ["-", "-"], "{table}");
        let html = super::super::report::render(&summary);
        assert!(html.contains("<td>-</td><td>-</td><td class=\"good\">0/0 met</td>"), "{html}");
    }
}
