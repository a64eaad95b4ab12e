//! Episode metrics and their aggregates: the numbers a shard's
//! `summary.json` carries and the operator and `basecamp run` report.
//!
//! - `tool_call_accuracy` (strict): calls compared position by position; a
//!   call matches when the name is equal and the arguments are equal on
//!   `compare_args` (all expected arguments when absent). Divided by the
//!   longer of the two lists, so missing and extra calls both cost.
//! - `tool_call_accuracy_lenient`: the same with BFCL-style normalised
//!   values (strings case-folded with whitespace and punctuation removed,
//!   numbers compared as numbers whether sent as `1`, `1.0` or `"1"`).
//! - `plan_step_f1`: F1 of the multiset of tool names called vs expected.
//! - `memory_consistency`: the share of expected memory keys holding their
//!   expected value at the end (or 1/0 against an expected memory hash).
//! - `error_rate`: failed calls (error, timeout, fallback, refused) over calls.
//! - `logit_divergence`: mean per-token KL(policy || reference) in nats, for
//!   episodes whose policy sent raw logits with reference logits (set by the
//!   sandbox after scoring; see `basecamp_sandbox::logits`).
//!
//! A metric that cannot be computed (no expectation) is absent, never NaN.
//!
//! Over a variant: `success_rate` is the share of episodes that succeeded
//! (failure class [`NO_FAILURE`]: no tool error, every tool call right, the
//! memory as expected) and `completion_rate` the share that ran to their end
//! (outcome `completed`, whatever went wrong on the way).
//!
//! An episode that the policy's server or a sandbox service failed (failure
//! class [`POLICY_ERROR`] or [`SERVICE_EXITED`]) measured the infrastructure,
//! not the agent: an aggregate counts it in `episodes`, `outcomes`,
//! `failure_classes` and [`Aggregate::not_measured`], and leaves it out of
//! the means, the resolution-time percentiles and `success_rate`, so a model
//! server that fell over reads as episodes not measured, never as an agent
//! that got every tool call wrong. `completion_rate` stays a share of every
//! episode: a run cut short by its infrastructure did not complete.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::canonical_json;

/// An expected tool call of a test-set row.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedCall<'a> {
    pub name: &'a str,
    pub arguments: &'a serde_json::Map<String, Value>,
    pub compare_args: Option<&'a [String]>,
}

/// A call the policy made (valid JSON arguments or not).
#[derive(Debug, Clone, PartialEq)]
pub struct ActualCall<'a> {
    pub name: &'a str,
    pub arguments: Option<&'a Value>,
    pub failed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compare {
    Strict,
    Lenient,
}

fn call_matches(expected: &ExpectedCall<'_>, actual: &ActualCall<'_>, mode: Compare) -> bool {
    if expected.name != actual.name {
        return false;
    }
    let Some(Value::Object(args)) = actual.arguments else {
        return expected.arguments.is_empty() && expected.compare_args.is_none_or(|k| k.is_empty());
    };
    let keys: Vec<&str> = match expected.compare_args {
        Some(keys) => keys.iter().map(String::as_str).collect(),
        None => expected.arguments.keys().map(String::as_str).collect(),
    };
    keys.into_iter().all(|k| match (expected.arguments.get(k), args.get(k)) {
        (Some(e), Some(a)) => values_match(e, a, mode),
        (None, None) => true,
        _ => false,
    })
}

fn values_match(expected: &Value, actual: &Value, mode: Compare) -> bool {
    match mode {
        Compare::Strict => canonical_json(expected) == canonical_json(actual),
        Compare::Lenient => normalise(expected) == normalise(actual),
    }
}

/// BFCL-style normal form: case-folded alphanumerics for strings, numbers
/// (and numeric strings) as f64 text, recursively for arrays and objects.
fn normalise(v: &Value) -> Value {
    match v {
        Value::String(s) => match s.trim().parse::<f64>() {
            Ok(n) if n.is_finite() => number_form(n),
            _ => Value::String(s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()),
        },
        Value::Number(n) => n.as_f64().map_or(Value::Null, number_form),
        Value::Array(items) => Value::Array(items.iter().map(normalise).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.to_lowercase(), normalise(v))).collect()),
        other => other.clone(),
    }
}

fn number_form(n: f64) -> Value {
    Value::String(format!("#{n}"))
}

fn positional_accuracy(expected: &[ExpectedCall<'_>], actual: &[ActualCall<'_>], mode: Compare) -> f64 {
    let denominator = expected.len().max(actual.len());
    if denominator == 0 {
        return 1.0;
    }
    let matched = expected.iter().zip(actual).filter(|(e, a)| call_matches(e, a, mode)).count();
    matched as f64 / denominator as f64
}

fn plan_step_f1(expected: &[ExpectedCall<'_>], actual: &[ActualCall<'_>]) -> f64 {
    if expected.is_empty() && actual.is_empty() {
        return 1.0;
    }
    let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
    for e in expected {
        *wanted.entry(e.name).or_default() += 1;
    }
    let mut overlap = 0usize;
    for a in actual {
        if let Some(n) = wanted.get_mut(a.name).filter(|n| **n > 0) {
            *n -= 1;
            overlap += 1;
        }
    }
    if overlap == 0 {
        return 0.0;
    }
    let precision = overlap as f64 / actual.len() as f64;
    let recall = overlap as f64 / expected.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Per-episode metrics, as written to `summary.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpisodeMetrics {
    pub tool_call_accuracy: f64,
    pub tool_call_accuracy_lenient: f64,
    pub plan_step_f1: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_consistency: Option<f64>,
    pub error_rate: f64,
    pub resolution_time_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// Mean per-token KL(policy || reference) over the tokens whose policy
    /// sent reference logits with its raw logits; absent without any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_divergence: Option<f64>,
    pub tool_calls: u32,
    pub steps: u32,
}

/// What memory should look like at the end of an episode.
#[derive(Debug, Clone, Copy)]
pub enum MemoryExpectation<'a> {
    None,
    Values(&'a serde_json::Map<String, Value>),
    /// Hex sha256 of the canonical JSON of the whole memory.
    Hash(&'a str),
}

/// Everything the metrics of one episode are computed from.
#[derive(Debug, Clone)]
pub struct EpisodeObservation<'a> {
    pub expected: &'a [ExpectedCall<'a>],
    pub actual: &'a [ActualCall<'a>],
    pub memory_expectation: MemoryExpectation<'a>,
    pub final_memory: &'a serde_json::Map<String, Value>,
    pub final_memory_hash_hex: &'a str,
    pub resolution_time_s: f64,
    pub reward: Option<f64>,
    pub steps: u32,
}

pub fn score_episode(obs: &EpisodeObservation<'_>) -> EpisodeMetrics {
    let memory_consistency = match obs.memory_expectation {
        MemoryExpectation::None => None,
        MemoryExpectation::Hash(hex) => {
            Some(if hex.eq_ignore_ascii_case(obs.final_memory_hash_hex) { 1.0 } else { 0.0 })
        }
        MemoryExpectation::Values(want) if want.is_empty() => Some(1.0),
        MemoryExpectation::Values(want) => {
            let held = want
                .iter()
                .filter(|(k, v)| obs.final_memory.get(*k).is_some_and(|got| canonical_json(got) == canonical_json(v)))
                .count();
            Some(held as f64 / want.len() as f64)
        }
    };
    let calls = obs.actual.len();
    let failed = obs.actual.iter().filter(|a| a.failed).count();
    EpisodeMetrics {
        tool_call_accuracy: positional_accuracy(obs.expected, obs.actual, Compare::Strict),
        tool_call_accuracy_lenient: positional_accuracy(obs.expected, obs.actual, Compare::Lenient),
        plan_step_f1: plan_step_f1(obs.expected, obs.actual),
        memory_consistency,
        error_rate: if calls == 0 { 0.0 } else { failed as f64 / calls as f64 },
        resolution_time_s: obs.resolution_time_s,
        reward: obs.reward.filter(|r| r.is_finite()),
        logit_divergence: None,
        tool_calls: calls as u32,
        steps: obs.steps,
    }
}

/// Aggregates over many episodes (one variant of a task, or one shard).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub episodes: u32,
    /// Mean of each metric over the episodes that have it.
    pub means: BTreeMap<String, f64>,
    pub resolution_time_p50_s: f64,
    pub resolution_time_p95_s: f64,
    /// Episode outcome name -> count.
    pub outcomes: BTreeMap<String, u32>,
    /// Failure class -> count, [`NO_FAILURE`] included (absent from
    /// aggregates written before it was counted).
    #[serde(default)]
    pub failure_classes: BTreeMap<String, u32>,
    /// Of `episodes`, those that measured the infrastructure, not the agent
    /// (see [`measures_the_agent`]): left out of the means, the percentiles
    /// and `success_rate`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_measured: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The failure class of an episode that succeeded.
pub const NO_FAILURE: &str = "ok";

/// The failure class of an episode that ended because the policy failed to
/// answer (its server unreachable, an error status, a malformed response,
/// a script that ran out).
pub const POLICY_ERROR: &str = "policy_error";

/// The failure class of an episode in which a tool call failed because a
/// service the tool calls had exited (and the error type of that call).
pub const SERVICE_EXITED: &str = "service_exited";

/// The name of [`Aggregate::not_measured`] as a criterion, a status metric
/// and a gauge read it.
pub const NOT_MEASURED_EPISODES: &str = "not_measured_episodes";

/// [`Aggregate::not_measured`] as a share of every episode run, as a
/// criterion (e.g. `not_measured_rate <= 1%`, which lets a run lose that
/// many episodes to its infrastructure) and a status metric read it.
pub const NOT_MEASURED_RATE: &str = "not_measured_rate";

/// Whether an episode of this failure class measured the agent: false for
/// the failures of the infrastructure around it ([`POLICY_ERROR`],
/// [`SERVICE_EXITED`]), which aggregates count but leave out of the means.
pub fn measures_the_agent(failure_class: &str) -> bool {
    !matches!(failure_class, POLICY_ERROR | SERVICE_EXITED)
}

/// Whether an episode that ended this way (cancelled or not, its failure
/// class) was cut off by something other than the agent: cancelled (Ctrl-C,
/// SIGTERM, a gym client's close) or failed by the infrastructure. Its
/// reward is then no score of the agent's actions: training rows and the
/// gym's result call it `truncated`.
pub fn ended_by_other_than_the_agent(cancelled: bool, failure_class: &str) -> bool {
    cancelled || !measures_the_agent(failure_class)
}

/// How one episode ended, as an aggregate counts it.
#[derive(Debug, Clone, Copy)]
pub struct EpisodeEnd<'a> {
    pub metrics: &'a EpisodeMetrics,
    /// The outcome name (`completed`, `max_steps`, `error`, ...).
    pub outcome: &'a str,
    /// [`NO_FAILURE`] or what went wrong first.
    pub failure_class: &'a str,
}

/// The one name of a metric a success criterion or a report may name in
/// several ways: an `avg_`/`mean_` prefix is dropped (metrics are means),
/// `resolution_time` and `resolution_time_avg` are `resolution_time_s`,
/// `p50_resolution_time` and `resolution_time_p50` are
/// `resolution_time_p50_s` (p95 alike). `basecamp run` and the operator
/// both look criteria up by it, so a criterion means the same on a laptop
/// and in the cluster.
pub fn canonical_metric(metric: &str) -> &str {
    let name = metric.strip_prefix("avg_").or_else(|| metric.strip_prefix("mean_")).unwrap_or(metric);
    match name {
        "resolution_time" | "resolution_time_avg" => "resolution_time_s",
        "p50_resolution_time" | "resolution_time_p50" => "resolution_time_p50_s",
        "p95_resolution_time" | "resolution_time_p95" => "resolution_time_p95_s",
        other => other,
    }
}

impl Aggregate {
    /// The value a success criterion or a report names (any name
    /// [`canonical_metric`] knows): a metric's mean, `episodes`,
    /// `not_measured_episodes` and `not_measured_rate`, the resolution-time percentiles,
    /// `success_rate` (the share of the measured episodes that succeeded)
    /// and `completion_rate` (the share of all that ran to their end).
    /// `None` for a name no measured episode had.
    pub fn value_of(&self, metric: &str) -> Option<f64> {
        match canonical_metric(metric) {
            "episodes" => Some(f64::from(self.episodes)),
            NOT_MEASURED_EPISODES => Some(f64::from(self.not_measured)),
            NOT_MEASURED_RATE => (self.episodes > 0).then(|| f64::from(self.not_measured) / f64::from(self.episodes)),
            "resolution_time_p50_s" => (self.measured() > 0).then_some(self.resolution_time_p50_s),
            "resolution_time_p95_s" => (self.measured() > 0).then_some(self.resolution_time_p95_s),
            "success_rate" => (self.measured() > 0 && !self.failure_classes.is_empty())
                .then(|| share(self.failure_classes.get(NO_FAILURE), self.measured())),
            "completion_rate" => (self.episodes > 0).then(|| share(self.outcomes.get("completed"), self.episodes)),
            name => self.means.get(name).copied(),
        }
    }

    /// The episodes that measured the agent: those the means are over.
    pub fn measured(&self) -> u32 {
        self.episodes.saturating_sub(self.not_measured)
    }
}

fn share(count: Option<&u32>, of: u32) -> f64 {
    f64::from(count.copied().unwrap_or(0)) / f64::from(of)
}

/// Mean of every metric, resolution-time percentiles, outcome and failure
/// class counts.
pub fn aggregate<'a>(episodes: impl IntoIterator<Item = EpisodeEnd<'a>>) -> Aggregate {
    let mut sums: BTreeMap<&str, (f64, u32)> = BTreeMap::new();
    let mut times = Vec::new();
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    let mut failure_classes: BTreeMap<String, u32> = BTreeMap::new();
    let mut n = 0u32;
    let mut not_measured = 0u32;
    for EpisodeEnd { metrics: m, outcome, failure_class } in episodes {
        n += 1;
        *outcomes.entry(outcome.to_string()).or_default() += 1;
        *failure_classes.entry(failure_class.to_string()).or_default() += 1;
        if !measures_the_agent(failure_class) {
            not_measured += 1;
            continue;
        }
        times.push(m.resolution_time_s);
        let mut add = |name, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                let e = sums.entry(name).or_insert((0.0, 0));
                e.0 += v;
                e.1 += 1;
            }
        };
        add("tool_call_accuracy", Some(m.tool_call_accuracy));
        add("tool_call_accuracy_lenient", Some(m.tool_call_accuracy_lenient));
        add("plan_step_f1", Some(m.plan_step_f1));
        add("memory_consistency", m.memory_consistency);
        add("error_rate", Some(m.error_rate));
        add("resolution_time_s", Some(m.resolution_time_s));
        add("reward", m.reward);
        add("logit_divergence", m.logit_divergence);
    }
    times.sort_by(f64::total_cmp);
    Aggregate {
        episodes: n,
        means: sums.into_iter().map(|(k, (s, c))| (k.to_string(), s / c as f64)).collect(),
        resolution_time_p50_s: percentile(&times, 0.50),
        resolution_time_p95_s: percentile(&times, 0.95),
        outcomes,
        failure_classes,
        not_measured,
    }
}

/// Nearest-rank percentile of sorted values (0 for none).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn strict_accuracy_compares_names_and_compare_args_in_order() {
        let a1 = obj(json!({"order_id": "A-1", "verbose": true}));
        let a2 = obj(json!({"order_id": "A-1"}));
        let only_order = vec!["order_id".to_string()];
        let expected = [
            ExpectedCall { name: "track", arguments: &a1, compare_args: Some(&only_order) },
            ExpectedCall { name: "reply", arguments: &a2, compare_args: None },
        ];
        let good1 = json!({"order_id": "A-1", "verbose": false});
        let bad2 = json!({"order_id": "a-1"});
        let actual = [
            ActualCall { name: "track", arguments: Some(&good1), failed: false },
            ActualCall { name: "reply", arguments: Some(&bad2), failed: true },
        ];
        let m = score_episode(&EpisodeObservation {
            expected: &expected,
            actual: &actual,
            memory_expectation: MemoryExpectation::None,
            final_memory: &serde_json::Map::new(),
            final_memory_hash_hex: "",
            resolution_time_s: 1.5,
            reward: None,
            steps: 2,
        });
        assert_eq!(m.tool_call_accuracy, 0.5, "verbose is not compared, the case of a-1 is");
        assert_eq!(m.tool_call_accuracy_lenient, 1.0, "lenient folds case and punctuation");
        assert_eq!(m.plan_step_f1, 1.0);
        assert_eq!(m.error_rate, 0.5);
        assert_eq!(m.memory_consistency, None);
    }

    #[test]
    fn extra_and_missing_calls_cost_accuracy() {
        let args = obj(json!({}));
        let expected = [ExpectedCall { name: "a", arguments: &args, compare_args: None }];
        let actual = [
            ActualCall { name: "a", arguments: Some(&json!({})), failed: false },
            ActualCall { name: "b", arguments: Some(&json!({})), failed: false },
        ];
        assert_eq!(positional_accuracy(&expected, &actual, Compare::Strict), 0.5);
        assert_eq!(positional_accuracy(&expected, &[], Compare::Strict), 0.0);
        assert_eq!(positional_accuracy(&[], &[], Compare::Strict), 1.0);
        let f1 = plan_step_f1(&expected, &actual);
        assert!((f1 - 2.0 / 3.0).abs() < 1e-12, "{f1}");
    }

    #[test]
    fn lenient_numbers_match_across_spellings() {
        assert!(values_match(&json!(1), &json!("1.0"), Compare::Lenient));
        assert!(!values_match(&json!(1), &json!("1.0"), Compare::Strict));
        assert!(values_match(&json!({"City": "New York"}), &json!({"city": "new-york"}), Compare::Lenient));
        assert!(!values_match(&json!(2), &json!(3), Compare::Lenient));
    }

    #[test]
    fn memory_consistency_counts_held_keys_or_checks_the_hash() {
        let want = obj(json!({"shipping_status": "pending", "order_id": "A-1"}));
        let got = obj(json!({"shipping_status": null, "order_id": "A-1", "other": 1}));
        let base = EpisodeObservation {
            expected: &[],
            actual: &[],
            memory_expectation: MemoryExpectation::Values(&want),
            final_memory: &got,
            final_memory_hash_hex: "ABCD",
            resolution_time_s: 0.0,
            reward: Some(f64::NAN),
            steps: 0,
        };
        let m = score_episode(&base);
        assert_eq!(m.memory_consistency, Some(0.5));
        assert_eq!(m.reward, None, "a NaN reward is absent, not NaN");
        let m = score_episode(&EpisodeObservation { memory_expectation: MemoryExpectation::Hash("abcd"), ..base });
        assert_eq!(m.memory_consistency, Some(1.0));
    }

    #[test]
    fn aggregate_means_skip_absent_metrics_and_percentiles_use_nearest_rank() {
        let mut ms = Vec::new();
        for i in 0..20 {
            ms.push(EpisodeMetrics {
                tool_call_accuracy: if i < 15 { 1.0 } else { 0.0 },
                resolution_time_s: (i + 1) as f64,
                memory_consistency: (i % 2 == 0).then_some(1.0),
                ..Default::default()
            });
        }
        let agg =
            aggregate(ms.iter().map(|m| EpisodeEnd { metrics: m, outcome: "completed", failure_class: NO_FAILURE }));
        assert_eq!(agg.episodes, 20);
        assert_eq!(agg.means["tool_call_accuracy"], 0.75);
        assert_eq!(agg.means["memory_consistency"], 1.0);
        assert!(!agg.means.contains_key("reward"));
        assert_eq!(agg.resolution_time_p50_s, 10.0);
        assert_eq!(agg.resolution_time_p95_s, 19.0);
        assert_eq!(agg.outcomes["completed"], 20);
    }

    #[test]
    fn success_counts_episodes_without_a_failure_and_completion_those_that_ran_to_their_end() {
        let m = EpisodeMetrics::default();
        let ends = [
            ("completed", NO_FAILURE),
            ("completed", "timeout"),
            ("completed", "memory_mismatch"),
            ("max_steps", NO_FAILURE),
        ];
        let agg =
            aggregate(ends.iter().map(|&(outcome, failure_class)| EpisodeEnd { metrics: &m, outcome, failure_class }));
        assert_eq!(agg.value_of("success_rate"), Some(0.5), "two of four episodes had no failure");
        assert_eq!(agg.value_of("completion_rate"), Some(0.75), "three of four ran to their end");
        assert_eq!(agg.failure_classes["timeout"], 1);

        let none = aggregate([]);
        assert_eq!((none.value_of("success_rate"), none.value_of("completion_rate")), (None, None));
        let older: Aggregate = serde_json::from_value(json!({
            "episodes": 2, "means": {}, "resolution_time_p50_s": 1.0, "resolution_time_p95_s": 1.0,
            "outcomes": {"completed": 2}
        }))
        .expect("an aggregate written before failure classes were counted");
        assert_eq!(older.value_of("success_rate"), None, "unknown, not 0");
        assert_eq!(older.value_of("completion_rate"), Some(1.0));
    }

    #[test]
    fn episodes_the_infrastructure_failed_are_counted_but_left_out_of_the_agents_numbers() {
        let right =
            EpisodeMetrics { tool_call_accuracy: 1.0, error_rate: 0.0, resolution_time_s: 2.0, ..Default::default() };
        let cut =
            EpisodeMetrics { tool_call_accuracy: 0.0, error_rate: 1.0, resolution_time_s: 90.0, ..Default::default() };
        let ends = [
            (&right, "completed", NO_FAILURE),
            (&right, "completed", NO_FAILURE),
            (&cut, "error", POLICY_ERROR),
            (&cut, "completed", SERVICE_EXITED),
        ];
        let agg =
            aggregate(ends.map(|(metrics, outcome, failure_class)| EpisodeEnd { metrics, outcome, failure_class }));
        assert_eq!((agg.episodes, agg.not_measured, agg.measured()), (4, 2, 2));
        assert_eq!(agg.means["tool_call_accuracy"], 1.0, "the server's failures are not the agent's wrong calls");
        assert_eq!(agg.means["error_rate"], 0.0);
        assert_eq!(agg.resolution_time_p95_s, 2.0);
        assert_eq!(agg.value_of("success_rate"), Some(1.0), "both measured episodes succeeded");
        assert_eq!(agg.value_of("completion_rate"), Some(0.75), "a share of every episode run");
        assert_eq!(agg.value_of("not_measured_episodes"), Some(2.0));
        assert_eq!(agg.value_of("not_measured_rate"), Some(0.5), "a share of every episode run");
        assert_eq!(aggregate([]).value_of("not_measured_rate"), None, "no episode, no share");
        assert_eq!((agg.failure_classes[POLICY_ERROR], agg.outcomes["error"]), (1, 1));

        let nothing_measured = aggregate([EpisodeEnd { metrics: &cut, outcome: "error", failure_class: POLICY_ERROR }]);
        assert_eq!(nothing_measured.value_of("tool_call_accuracy"), None, "not measured is not 0");
        assert_eq!(nothing_measured.value_of("success_rate"), None);
        assert_eq!(nothing_measured.value_of("resolution_time_p50_s"), None);
        assert_eq!(nothing_measured.value_of("completion_rate"), Some(0.0));
        let json = serde_json::to_value(&nothing_measured).unwrap();
        assert_eq!(json["not_measured"], 1);
        assert!(serde_json::to_value(aggregate([])).unwrap().get("not_measured").is_none(), "absent when 0");
    }
}
