//! Aggregation against a real S3 server (s3s-fs on loopback), and its pure parts.

use std::collections::{BTreeMap, BTreeSet};

use basecamp_sandbox::episode::EpisodeResult;
use basecamp_sandbox::storage::{Destination, Storage, UtcDate};
use basecamp_trace::metrics::{EpisodeEnd, EpisodeMetrics, NO_FAILURE, aggregate as aggregate_metrics};

use super::*;
use crate::metrics::Metrics;
use crate::testing::{BUCKET, S3Server, storage, storage_down};

fn episode(id: &str, accuracy: f64, seconds: f64) -> EpisodeResult {
    EpisodeResult {
        id: id.into(),
        outcome: if accuracy >= 1.0 { "final_answer".into() } else { "wrong_tool".into() },
        metrics: EpisodeMetrics {
            tool_call_accuracy: accuracy,
            plan_step_f1: accuracy,
            error_rate: 1.0 - accuracy,
            resolution_time_s: seconds,
            ..Default::default()
        },
        failure_class: if accuracy >= 1.0 { "ok".into() } else { "wrong_arguments".into() },
        trace_file: format!("{id}.trace"),
        rollbacks: 0,
        warnings: vec![],
        error: None,
    }
}

/// A `summary.json` as `basecamp_sandbox::driver::ShardSummary` serializes
/// it (its episodes are the sandbox's own `EpisodeResult`s).
fn summary(variant: &str, shard: u32, episodes: Vec<EpisodeResult>) -> serde_json::Value {
    serde_json::json!({
        "namespace": "team-a",
        "task": "eval",
        "variant": variant,
        "shard": shard,
        "shard_count": 2,
        "started_unix_nanos": 1_000,
        "wall_seconds": 1.0,
        "aggregate": aggregate_metrics(episodes.iter().map(|e| EpisodeEnd {
            metrics: &e.metrics,
            outcome: &e.outcome,
            failure_class: &e.failure_class,
        })),
        "episodes": episodes,
        "lost": [],
    })
}

fn day() -> UtcDate {
    UtcDate::new(2026, 11, 30).expect("date")
}

fn destination() -> Destination {
    Destination::parse(&format!("s3://{BUCKET}/traces")).expect("dest")
}

async fn put(storage: &Storage, key: &str, bytes: &[u8]) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("f");
    std::fs::write(&path, bytes).expect("write");
    let to = destination().join(key).expect("key");
    storage.upload_file(&path, &to).await.into_result().expect("upload");
}

async fn put_summary(storage: &Storage, s: &serde_json::Value) {
    let key = format!("2026/11/30/team-a/eval/{}/{}/summary.json", s["variant"].as_str().unwrap_or(""), s["shard"]);
    put(storage, &key, &serde_json::to_vec(s).expect("json")).await;
}

fn request<'a>(criteria: &'a [String], completed: &[(&str, &[u32])], all_finished: bool) -> Request<'a> {
    Request {
        namespace: "team-a",
        task: "eval",
        destination: destination(),
        days: (day(), day()),
        variants: vec!["a".into(), "b".into()],
        completed: completed
            .iter()
            .map(|(v, s)| (v.to_string(), s.iter().copied().collect::<BTreeSet<u32>>()))
            .collect(),
        not_before_nanos: BTreeMap::new(),
        all_finished,
        criteria,
    }
}

#[tokio::test]
async fn aggregates_finished_shards_evaluates_criteria_and_writes_the_index() {
    let server = S3Server::start();
    let storage = storage(&server);
    put_summary(&storage, &summary("a", 0, vec![episode("e1", 1.0, 2.0), episode("e2", 0.0, 4.0)])).await;
    put_summary(&storage, &summary("a", 1, vec![episode("e3", 1.0, 6.0), episode("e4", 1.0, 8.0)])).await;
    put_summary(&storage, &summary("b", 0, vec![episode("e1", 1.0, 1.0), episode("e2", 1.0, 1.0)])).await;
    put_summary(&storage, &summary("b", 1, vec![episode("e3", 1.0, 1.0), episode("e4", 0.0, 1.0)])).await;
    // Another task's summary under the same day must not be counted.
    put(&storage, "2026/11/30/team-a/other/a/0/summary.json", b"{}").await;
    let metrics = Metrics::new();
    let criteria = vec!["tool_call_accuracy >= 0.7".to_string(), "avg_resolution_time < 3s".to_string()];

    // Half-way: shard 0 of each variant finished; nothing written yet.
    let partial =
        run(&storage, &metrics, &request(&criteria, &[("a", &[0]), ("b", &[0])], false), &AggregatedStatus::default())
            .await;
    assert_eq!(partial.error, None);
    assert_eq!(partial.metrics["a"]["tool_call_accuracy"], 0.5);
    assert_eq!(partial.metrics["a"]["episodes"], 2.0);
    assert!(partial.criteria.is_empty() && !partial.complete && partial.trace_location.is_none());

    let full = run(&storage, &metrics, &request(&criteria, &[("a", &[0, 1]), ("b", &[0, 1])], true), &partial).await;
    assert_eq!(full.error, None, "{:?}", full.error);
    assert_eq!(full.metrics["a"]["tool_call_accuracy"], 0.75);
    assert_eq!(full.metrics["b"]["tool_call_accuracy"], 0.75);
    assert_eq!(full.metrics["a"]["resolution_time_s"], 5.0);
    assert_eq!(full.metrics["a"]["resolution_time_p95_s"], 8.0);
    assert_eq!(full.deltas["resolution_time_s"], -4.0, "b minus a");
    assert_eq!(full.aggregated_shards["a"], [0, 1]);
    let met: Vec<(String, String, bool)> =
        full.criteria.iter().map(|c| (c.variant.clone(), c.criterion.clone(), c.met)).collect();
    assert_eq!(
        met,
        [
            ("a".into(), criteria[0].clone(), true),
            ("a".into(), criteria[1].clone(), false),
            ("b".into(), criteria[0].clone(), true),
            ("b".into(), criteria[1].clone(), true),
        ]
    );
    assert!(full.complete);
    let reports = format!("s3://{BUCKET}/traces/reports/team-a/eval/");
    assert_eq!(full.trace_location.as_deref(), Some(reports.as_str()));

    let index =
        storage.fetch(&destination().join("reports/team-a/eval/index.json").expect("key")).await.expect("index.json");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&index).expect("rows");
    assert_eq!(rows.len(), 8, "one row per episode");
    let row = rows.iter().find(|r| r["variant"] == "a" && r["id"] == "e2").expect("row a/e2");
    assert_eq!(row["shard"], 0);
    assert_eq!(row["failure_class"], "wrong_arguments");
    assert_eq!(row["metrics"]["tool_call_accuracy"], 0.0);
    assert_eq!(row["trace_key"], format!("s3://{BUCKET}/traces/2026/11/30/team-a/eval/a/0/e2.trace"));
    let comparison = storage
        .fetch(&destination().join("reports/team-a/eval/comparison.json").expect("key"))
        .await
        .expect("comparison");
    let comparison: serde_json::Value = serde_json::from_slice(&comparison).expect("json");
    assert_eq!(comparison["deltas"]["resolution_time_s"], -4.0);
    assert_eq!(comparison["aggregates"]["b"]["episodes"], 4);

    // A restart recomputes from the same summaries: the same numbers, nothing counted twice.
    let again = run(
        &storage,
        &metrics,
        &request(&criteria, &[("a", &[0, 1]), ("b", &[0, 1])], true),
        &AggregatedStatus::default(),
    )
    .await;
    assert_eq!(again.metrics, full.metrics);
    assert!(
        metrics.encode().contains(r#"basecamp_s3_operation_duration_seconds_count{operation="put"} 4"#),
        "{}",
        metrics.encode()
    );
}

#[tokio::test]
async fn missing_and_corrupt_summaries_are_errors_that_keep_previous_results() {
    let server = S3Server::start();
    let storage = storage(&server);
    put_summary(&storage, &summary("a", 0, vec![episode("e1", 1.0, 2.0)])).await;
    let metrics = Metrics::new();
    let previous = AggregatedStatus {
        metrics: [("a".to_string(), [("tool_call_accuracy".to_string(), 1.0)].into())].into(),
        aggregated_shards: [("a".to_string(), vec![0])].into(),
        ..Default::default()
    };
    let missing = run(&storage, &metrics, &request(&[], &[("a", &[0, 1])], false), &previous).await;
    let (category, message) = missing.error.clone().expect("an error");
    assert_eq!(category, "SummaryMissing");
    assert!(message.contains("shard 1 of variant a") && message.contains("2026/11/30/team-a/eval"), "{message}");
    assert_eq!(missing.metrics, previous.metrics, "the previous results stay");

    put(&storage, "2026/11/30/team-a/eval/a/1/summary.json", b"{\"variant\": \"a\", \"shard\": ").await;
    let corrupt = run(&storage, &metrics, &request(&[], &[("a", &[0, 1])], false), &previous).await;
    let (category, message) = corrupt.error.expect("an error");
    assert_eq!(category, "SummaryCorrupt");
    assert!(message.contains("a/1/summary.json"), "{message}");
}

#[tokio::test]
async fn s3_down_is_a_retryable_error() {
    let metrics = Metrics::new();
    let down = run(&storage_down(), &metrics, &request(&[], &[("a", &[0])], false), &AggregatedStatus::default()).await;
    let (category, message) = down.error.expect("an error");
    assert_eq!(category, "S3Unavailable");
    assert!(message.contains("list"), "{message}");
    assert!(metrics.encode().contains(r#"basecamp_s3_operation_errors_total{operation="list"} 1"#));
}

#[test]
fn the_summary_file_reads_what_the_sandbox_writes() {
    let written = serde_json::to_string(&summary("a", 1, vec![episode("e1", 1.0, 2.0)])).expect("json");
    let read: SummaryFile = serde_json::from_str(&written).expect("the operator reads the sandbox's summary.json");
    assert_eq!((read.variant.as_str(), read.shard, read.episodes.len()), ("a", 1, 1));
    assert_eq!(read.episodes[0].trace_file, "e1.trace");
}

/// A variant's 429s in its status are the sum of its pods' (each pod its
/// own client), read from the `rate_limits` the sandbox writes; a variant
/// that met none has no such metric.
#[test]
fn a_variant_s_429s_are_the_sum_of_its_pods() {
    let read = |variant: &str, shard, answers_429| {
        let mut written = summary(variant, shard, vec![episode("e1", 1.0, 1.0)]);
        if answers_429 > 0 {
            let rate_limits = RateLimits { answers_429, lowest_requests_at_once: 2, requests_at_once_at_end: 3 };
            written["rate_limits"] = serde_json::to_value(rate_limits).expect("json");
        }
        let read: SummaryFile = serde_json::from_value(written).expect("the operator reads the sandbox's summary");
        ((variant.to_string(), shard), (destination(), read))
    };
    let found: Found = [read("a", 0, 0), read("b", 0, 12), read("b", 1, 5)].into();
    let (metrics, _, _) = combine(&found, &["a".into(), "b".into()]);
    assert_eq!(metrics["b"].get(POLICY_ANSWERS_429), Some(&17.0));
    assert_eq!(metrics["a"].get(POLICY_ANSWERS_429), None);
}

#[test]
fn day_prefixes_span_creation_to_today_with_a_cap() {
    let mut req = request(&[], &[], false);
    req.days = (UtcDate::new(2026, 2, 27).expect("d"), UtcDate::new(2026, 3, 2).expect("d"));
    let days: Vec<String> = day_prefixes(&req).iter().map(ToString::to_string).collect();
    assert_eq!(days.len(), 4);
    assert_eq!(days[0], format!("s3://{BUCKET}/traces/2026/02/27/team-a/eval"));
    assert_eq!(days[3], format!("s3://{BUCKET}/traces/2026/03/02/team-a/eval"));
    req.days = (UtcDate::new(2025, 1, 1).expect("d"), UtcDate::new(2026, 1, 1).expect("d"));
    assert_eq!(day_prefixes(&req).len(), MAX_DAYS as usize);
}

#[test]
fn criteria_name_missing_metrics() {
    let metrics: BTreeMap<String, BTreeMap<String, f64>> =
        [("a".to_string(), [("tool_call_accuracy".to_string(), 0.9)].into())].into();
    let results = evaluate_criteria(&["user_satisfaction_score > 0.85".into()], &metrics, &["a".into()]);
    assert!(!results[0].met);
    assert!(
        results[0].message.as_deref().is_some_and(|m| m.contains("no data for user_satisfaction_score")),
        "{:?}",
        results[0]
    );
}

#[test]
fn every_metric_a_criterion_may_name_is_in_a_variants_metrics_as_basecamp_run_reads_it() {
    let measured = EpisodeMetrics {
        tool_call_accuracy: 0.9,
        tool_call_accuracy_lenient: 0.95,
        memory_consistency: Some(1.0),
        resolution_time_s: 1.5,
        reward: Some(0.5),
        logit_divergence: Some(0.01),
        ..Default::default()
    };
    let ends = [("completed", NO_FAILURE), ("completed", "timeout"), ("max_steps", "wrong_tool_calls")];
    let aggregate = aggregate_metrics(ends.map(|(outcome, failure_class)| EpisodeEnd {
        metrics: &measured,
        outcome,
        failure_class,
    }));
    let metrics = variant_metrics(&aggregate, 1);
    for (metric, _) in basecamp_api::criteria::CRITERION_METRICS {
        for name in [metric.to_string(), format!("avg_{metric}"), format!("mean_{metric}")] {
            let value = metric_value(&metrics, &name);
            assert!(value.is_some(), "{name}: the metrics hold {:?}", metrics.keys().collect::<Vec<_>>());
            if *metric != "lost_episodes" {
                assert_eq!(value, aggregate.value_of(&name), "{name}: basecamp run reads the same value");
            }
        }
    }
    assert_eq!(metric_value(&metrics, "success_rate"), Some(1.0 / 3.0), "one of three episodes had no failure");
    assert_eq!(metric_value(&metrics, "completion_rate"), Some(2.0 / 3.0), "two of three ran to their end");
    assert_eq!(metric_value(&metrics, "p95_resolution_time"), Some(1.5));
}
