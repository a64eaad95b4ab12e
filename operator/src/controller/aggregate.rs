//! Aggregation: as shards finish, read their `summary.json` from the trace
//! destination, aggregate each variant's episodes (the same
//! `basecamp_trace::metrics::aggregate` the sandbox uses for one shard),
//! evaluate the success criteria, compute A/B deltas, and — once every
//! shard finished — write `index.json` (one row per episode: variant, shard,
//! id, metrics, failure class, trace key) and `comparison.json` under
//! `<dest>/reports/<namespace>/<task>/`.
//!
//! Never lose, never double count: summaries are immutable objects in S3
//! and the result is recomputed from all of them, deduplicated by (variant,
//! shard); status records which shards are counted, so an unchanged set is
//! not fetched again, and a restarted operator recomputes the same numbers.
//! A missing or corrupt summary, or S3 being down, is an error value that
//! becomes a Degraded condition and an Event; the previous results stay.
//!
//! Summaries live under date-partitioned prefixes
//! (`<dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/`) dated
//! by the shard's start, so the days from the task's creation to today are
//! listed: the newest [`MAX_DAYS`] of them, where a Job replaced today
//! writes.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Instant;

use basecamp_api::Criterion;
use basecamp_api::task::CriterionResult;
use basecamp_sandbox::policy::throttle::RateLimits;
use basecamp_sandbox::storage::{Destination, Storage, StorageError, UtcDate};
use basecamp_trace::metrics::{
    Aggregate, EpisodeEnd, EpisodeMetrics, NOT_MEASURED_EPISODES, NOT_MEASURED_RATE, aggregate, canonical_metric,
};
use serde::{Deserialize, Serialize};

use super::status::AggregatedStatus;
use crate::metrics::Metrics;

/// The most days of date partitions searched for a task's summaries.
pub const MAX_DAYS: i64 = 62;
/// The file each shard writes.
pub const SUMMARY_FILE: &str = basecamp_sandbox::driver::SUMMARY_FILE;

/// A shard's `summary.json` as the operator reads it (the fields of
/// `basecamp_sandbox::driver::ShardSummary` it needs).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SummaryFile {
    /// The variant.
    pub variant: String,
    /// The shard index.
    pub shard: u32,
    /// When the shard started (ns since the epoch).
    pub started_unix_nanos: i64,
    /// The episodes that ran.
    pub episodes: Vec<EpisodeRow>,
    /// Episodes lost (trace not written).
    #[serde(default)]
    pub lost: Vec<serde_json::Value>,
    /// What the policy endpoint's 429s did to the pod's requests.
    #[serde(default)]
    pub rate_limits: Option<RateLimits>,
}

/// The status metric of a variant's 429s: the sum over its pods (each its
/// own client), present once any pod met one.
pub const POLICY_ANSWERS_429: &str = "policy_answers_429";

/// One episode of a summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRow {
    /// The test-set row id.
    pub id: String,
    /// The episode's outcome.
    pub outcome: String,
    /// Its metrics.
    pub metrics: EpisodeMetrics,
    /// `ok` or the first error type seen.
    pub failure_class: String,
    /// The trace file name in the shard's directory.
    pub trace_file: String,
}

/// One row of `index.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexRow {
    /// The variant.
    pub variant: String,
    /// The shard.
    pub shard: u32,
    /// The episode id.
    pub id: String,
    /// The outcome.
    pub outcome: String,
    /// The failure class.
    pub failure_class: String,
    /// The episode's metrics.
    pub metrics: EpisodeMetrics,
    /// Where the trace is, `s3://...`.
    pub trace_key: String,
}

/// Why aggregation stopped this time.
#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    /// The trace destination cannot be read or written.
    #[error("failed to {action} the shard summaries: {source}")]
    Storage {
        /// What was attempted.
        action: &'static str,
        /// The cause.
        source: StorageError,
    },
    /// A shard finished but its summary is not in the destination.
    #[error(
        "shard {shard} of variant {variant} finished but no {SUMMARY_FILE} was found under {searched}; \
         the pod's upload may have failed (see its logs); will look again"
    )]
    MissingSummary {
        /// The variant.
        variant: String,
        /// The shard.
        shard: u32,
        /// The prefixes searched.
        searched: String,
    },
    /// A summary that does not parse.
    #[error("{location} is not a valid shard summary: {message}; will read it again")]
    CorruptSummary {
        /// Where it is.
        location: String,
        /// The parser's message.
        message: String,
    },
}

impl AggregateError {
    /// A fixed name for this kind of error (the Degraded reason).
    pub fn category(&self) -> &'static str {
        match self {
            AggregateError::Storage { source, .. } if source.is_retryable() => "S3Unavailable",
            AggregateError::Storage { .. } => "S3Refused",
            AggregateError::MissingSummary { .. } => "SummaryMissing",
            AggregateError::CorruptSummary { .. } => "SummaryCorrupt",
        }
    }
}

/// What to aggregate.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The task's namespace.
    pub namespace: &'a str,
    /// The task's name.
    pub task: &'a str,
    /// The trace destination (S3).
    pub destination: Destination,
    /// The first and last day whose partitions may hold summaries.
    pub days: (UtcDate, UtcDate),
    /// Variants in spec order.
    pub variants: Vec<String>,
    /// Finished-successfully shard indexes by variant.
    pub completed: BTreeMap<String, BTreeSet<u32>>,
    /// Summaries of a variant older than this (ns) belong to a replaced Job.
    pub not_before_nanos: BTreeMap<String, i64>,
    /// Whether every shard of every variant finished.
    pub all_finished: bool,
    /// The success criteria.
    pub criteria: &'a [String],
}

/// The day prefixes to search: `<dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>`
/// for the newest [`MAX_DAYS`] days of `request.days` (a task older than
/// that whose Job is replaced writes its summaries under today's date).
pub fn day_prefixes(request: &Request<'_>) -> Vec<Destination> {
    let (first, last) = request.days;
    let newest_first = days_from_civil(last) - (MAX_DAYS - 1);
    let first = if days_from_civil(first) < newest_first {
        UtcDate::from_unix_seconds(newest_first * 86_400).unwrap_or(first)
    } else {
        first
    };
    namespace_day_prefixes(&request.destination, request.namespace, (first, last))
        .into_iter()
        .filter_map(|prefix| prefix.join(request.task).ok())
        .collect()
}

/// The partitions of one namespace, a day each from `days.0` to `days.1`
/// (both included): `<dest>/<yyyy>/<mm>/<dd>/<namespace>`. Their
/// directories are the runs: `<task>`, `<task>@step-N`.
pub fn namespace_day_prefixes(
    destination: &Destination,
    namespace: &str,
    days: (UtcDate, UtcDate),
) -> Vec<Destination> {
    (days_from_civil(days.0)..=days_from_civil(days.1))
        .filter_map(|day| UtcDate::from_unix_seconds(day * 86_400).ok())
        .filter_map(|d| destination.join(&format!("{:04}/{:02}/{:02}/{namespace}", d.year(), d.month(), d.day())).ok())
        .collect()
}

/// The reports of one namespace: `<dest>/reports/<namespace>` (its
/// directories are the runs, as in a day's partition).
pub fn namespace_reports_prefix(destination: &Destination, namespace: &str) -> Result<Destination, StorageError> {
    destination.join(&format!("reports/{namespace}"))
}

/// Where index.json and comparison.json go: `<dest>/reports/<namespace>/<task>`.
pub fn reports_prefix(destination: &Destination, namespace: &str, task: &str) -> Result<Destination, StorageError> {
    namespace_reports_prefix(destination, namespace)?.join(task)
}

fn days_from_civil(date: UtcDate) -> i64 {
    // Howard Hinnant's days_from_civil.
    let (y, m, d) = (i64::from(date.year()), i64::from(date.month()), i64::from(date.day()));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The value of a criterion's metric in a variant's metrics, by the names
/// `basecamp run` reads too ([`canonical_metric`]: `avg_resolution_time`,
/// `p95_resolution_time`, `completion_rate`, ...).
pub fn metric_value(metrics: &BTreeMap<String, f64>, name: &str) -> Option<f64> {
    metrics.get(canonical_metric(name)).copied()
}

/// Each criterion for each variant.
pub fn evaluate_criteria(
    criteria: &[String],
    metrics: &BTreeMap<String, BTreeMap<String, f64>>,
    variants: &[String],
) -> Vec<CriterionResult> {
    let empty = BTreeMap::new();
    let mut results = Vec::new();
    for variant in variants {
        let values = metrics.get(variant).unwrap_or(&empty);
        for text in criteria {
            let result = match text.parse::<Criterion>() {
                Err(error) => CriterionResult {
                    variant: variant.clone(),
                    criterion: text.clone(),
                    met: false,
                    observed: None,
                    message: Some(error.to_string().lines().next().unwrap_or("").to_string()),
                },
                Ok(criterion) => match metric_value(values, &criterion.metric) {
                    None => CriterionResult {
                        variant: variant.clone(),
                        criterion: text.clone(),
                        met: false,
                        observed: None,
                        message: Some(format!(
                            "no data for {}: the summaries report {}",
                            criterion.metric,
                            values.keys().cloned().collect::<Vec<_>>().join(", ")
                        )),
                    },
                    Some(observed) => {
                        let met = criterion.is_met_by(observed);
                        CriterionResult {
                            variant: variant.clone(),
                            criterion: text.clone(),
                            met,
                            observed: Some(observed),
                            message: (!met).then(|| format!("{text} is not met: observed {observed:.4}")),
                        }
                    }
                },
            };
            results.push(result);
        }
    }
    results
}

/// Second variant minus first, for every metric both have.
pub fn deltas(metrics: &BTreeMap<String, BTreeMap<String, f64>>, variants: &[String]) -> BTreeMap<String, f64> {
    let (Some(a), Some(b)) =
        (variants.first().and_then(|v| metrics.get(v)), variants.get(1).and_then(|v| metrics.get(v)))
    else {
        return BTreeMap::new();
    };
    a.iter().filter_map(|(k, va)| b.get(k).map(|vb| (k.clone(), vb - va))).filter(|(_, d)| d.is_finite()).collect()
}

/// A variant's status metrics from its aggregate.
pub fn variant_metrics(aggregate: &Aggregate, lost: usize) -> BTreeMap<String, f64> {
    let mut metrics: BTreeMap<String, f64> =
        aggregate.means.iter().filter(|(_, v)| v.is_finite()).map(|(k, v)| (k.clone(), *v)).collect();
    metrics.insert("episodes".into(), f64::from(aggregate.episodes));
    metrics.insert("lost_episodes".into(), lost as f64);
    metrics.insert(NOT_MEASURED_EPISODES.into(), f64::from(aggregate.not_measured));
    for name in ["resolution_time_p50_s", "resolution_time_p95_s", "success_rate", "completion_rate", NOT_MEASURED_RATE]
    {
        if let Some(value) = aggregate.value_of(name) {
            metrics.insert(name.into(), value);
        }
    }
    metrics
}

pub(crate) async fn timed<T>(
    metrics: &Metrics,
    operation: &'static str,
    future: impl Future<Output = Result<T, StorageError>>,
) -> Result<T, StorageError> {
    let started = Instant::now();
    let result = future.await;
    metrics.observe_s3(operation, started.elapsed(), result.is_err());
    result
}

/// Everything found, parsed: (variant, shard) -> (summary dir, summary).
type Found = BTreeMap<(String, u32), (Destination, SummaryFile)>;

async fn read_summaries(storage: &Storage, metrics: &Metrics, request: &Request<'_>) -> Result<Found, AggregateError> {
    let prefixes = day_prefixes(request);
    let mut locations: BTreeMap<(String, u32), Destination> = BTreeMap::new();
    for prefix in &prefixes {
        let objects = timed(metrics, "list", storage.list(prefix))
            .await
            .map_err(|source| AggregateError::Storage { action: "list", source })?;
        for object in objects {
            let parts: Vec<&str> = object.relative.split('/').collect();
            if let [variant, shard, file] = parts.as_slice()
                && *file == SUMMARY_FILE
                && let Ok(shard) = shard.parse::<u32>()
                && request.completed.get(*variant).is_some_and(|s| s.contains(&shard))
            {
                // Later days win: a shard retried after midnight wrote a newer summary.
                locations.insert((variant.to_string(), shard), object.location);
            }
        }
    }
    let mut found = Found::new();
    for (variant, shards) in &request.completed {
        for shard in shards {
            let key = (variant.clone(), *shard);
            let Some(location) = locations.get(&key) else {
                let searched = prefixes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                return Err(AggregateError::MissingSummary { variant: variant.clone(), shard: *shard, searched });
            };
            let bytes = timed(metrics, "get", storage.fetch(location))
                .await
                .map_err(|source| AggregateError::Storage { action: "read", source })?;
            let summary: SummaryFile = serde_json::from_slice(&bytes).map_err(|e| AggregateError::CorruptSummary {
                location: location.to_string(),
                message: e.to_string(),
            })?;
            if summary.variant != *variant || summary.shard != *shard {
                return Err(AggregateError::CorruptSummary {
                    location: location.to_string(),
                    message: format!("it describes variant {} shard {}", summary.variant, summary.shard),
                });
            }
            if request.not_before_nanos.get(variant).is_some_and(|t| summary.started_unix_nanos < *t) {
                return Err(AggregateError::MissingSummary {
                    variant: variant.clone(),
                    shard: *shard,
                    searched: format!("{location} (only a summary from before the Job was replaced)"),
                });
            }
            let dir = location.to_string();
            let dir = dir.strip_suffix(&format!("/{SUMMARY_FILE}")).unwrap_or(&dir).to_string();
            let dir = Destination::parse(&dir).map_err(|source| AggregateError::Storage { action: "read", source })?;
            found.insert(key, (dir, summary));
        }
    }
    Ok(found)
}

/// Metrics by variant (metric name -> value).
pub type VariantMetrics = BTreeMap<String, BTreeMap<String, f64>>;

/// The index rows and per-variant metrics of what was found (pure).
pub fn combine(found: &Found, variants: &[String]) -> (VariantMetrics, Vec<IndexRow>, BTreeMap<String, Aggregate>) {
    let mut metrics = BTreeMap::new();
    let mut aggregates = BTreeMap::new();
    let mut rows = Vec::new();
    for variant in variants {
        let summaries: Vec<&(Destination, SummaryFile)> =
            found.iter().filter(|((v, _), _)| v == variant).map(|(_, s)| s).collect();
        if summaries.is_empty() {
            continue;
        }
        let episodes: Vec<&EpisodeRow> = summaries.iter().flat_map(|(_, s)| s.episodes.iter()).collect();
        let lost: usize = summaries.iter().map(|(_, s)| s.lost.len()).sum();
        let aggregate = aggregate(episodes.iter().map(|e| EpisodeEnd {
            metrics: &e.metrics,
            outcome: &e.outcome,
            failure_class: &e.failure_class,
        }));
        let mut of_variant = variant_metrics(&aggregate, lost);
        let answers_429: u64 =
            summaries.iter().filter_map(|(_, s)| s.rate_limits.as_ref()).map(|r| r.answers_429).sum();
        if answers_429 > 0 {
            of_variant.insert(POLICY_ANSWERS_429.into(), answers_429 as f64);
        }
        metrics.insert(variant.clone(), of_variant);
        aggregates.insert(variant.clone(), aggregate);
        for (dir, summary) in &summaries {
            for episode in &summary.episodes {
                let trace_key = dir
                    .join(&episode.trace_file)
                    .map_or_else(|_| format!("{dir}/{}", episode.trace_file), |d| d.to_string());
                rows.push(IndexRow {
                    variant: variant.clone(),
                    shard: summary.shard,
                    id: episode.id.clone(),
                    outcome: episode.outcome.clone(),
                    failure_class: episode.failure_class.clone(),
                    metrics: episode.metrics.clone(),
                    trace_key,
                });
            }
        }
    }
    (metrics, rows, aggregates)
}

/// Writes `value` as pretty JSON to `to` (through a temporary file).
pub(crate) async fn write_json(
    storage: &Storage,
    metrics: &Metrics,
    to: &Destination,
    value: &impl Serialize,
) -> Result<(), AggregateError> {
    let dir = tempfile::tempdir().map_err(|e| AggregateError::Storage {
        action: "write",
        source: StorageError::InvalidDestination {
            input: to.to_string(),
            reason: format!("cannot create a temporary file: {e}"),
        },
    })?;
    let path = dir.path().join("report.json");
    let bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    std::fs::write(&path, bytes).map_err(|e| AggregateError::Storage {
        action: "write",
        source: StorageError::InvalidDestination {
            input: to.to_string(),
            reason: format!("cannot write a temporary file: {e}"),
        },
    })?;
    let upload = timed(metrics, "put", async { storage.upload_file(&path, to).await.into_result().map(|_| ()) }).await;
    upload.map_err(|source| AggregateError::Storage { action: "write", source })
}

/// Aggregates what finished. Errors come back inside the result (as
/// `error`), with `previous` kept for everything not recomputed.
pub async fn run(
    storage: &Storage,
    metrics: &Metrics,
    request: &Request<'_>,
    previous: &AggregatedStatus,
) -> AggregatedStatus {
    match try_run(storage, metrics, request).await {
        Ok(result) => result,
        Err(error) => {
            AggregatedStatus { error: Some((error.category(), error.to_string())), complete: false, ..previous.clone() }
        }
    }
}

async fn try_run(
    storage: &Storage,
    metrics: &Metrics,
    request: &Request<'_>,
) -> Result<AggregatedStatus, AggregateError> {
    let found = read_summaries(storage, metrics, request).await?;
    let (variant_metrics, rows, aggregates) = combine(&found, &request.variants);
    let mut result = AggregatedStatus {
        metrics: variant_metrics,
        aggregated_shards: request.completed.iter().map(|(v, s)| (v.clone(), s.iter().copied().collect())).collect(),
        ..Default::default()
    };
    result.deltas = deltas(&result.metrics, &request.variants);
    if request.all_finished {
        result.criteria = evaluate_criteria(request.criteria, &result.metrics, &request.variants);
        let reports = reports_prefix(&request.destination, request.namespace, request.task)
            .map_err(|source| AggregateError::Storage { action: "write", source })?;
        let join =
            |file: &str| reports.join(file).map_err(|source| AggregateError::Storage { action: "write", source });
        write_json(storage, metrics, &join("index.json")?, &rows).await?;
        let comparison = serde_json::json!({
            "namespace": request.namespace,
            "task": request.task,
            "variants": request.variants,
            "aggregates": aggregates,
            "metrics": result.metrics,
            "deltas": result.deltas,
            "criteria": result.criteria,
        });
        write_json(storage, metrics, &join("comparison.json")?, &comparison).await?;
        result.trace_location = Some(format!("{reports}/"));
        result.complete = true;
    }
    Ok(result)
}

#[cfg(test)]
mod tests;
