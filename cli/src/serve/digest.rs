//! One trace boiled down to what the reports compute with: per step its
//! duration, tool and status, and whether memory still held no `null` a
//! fallback or tool wrote; the last reward signal; how the episode ended.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use basecamp_trace::RecordKind;
use basecamp_trace::metrics::NO_FAILURE;
use basecamp_trace::pb::{self, Header, record::Body};

/// One plan step as the timeline shows it.
#[derive(Debug, Clone)]
pub struct StepDigest {
    pub index: u32,
    pub kind: pb::StepKind,
    pub tool: String,
    pub status: pb::StepStatus,
    pub error_type: String,
    /// Policy turn latency plus tool latency, in milliseconds.
    pub duration_ms: f64,
    /// True when no memory key held a written `null` after this step.
    pub memory_ok: bool,
}

impl StepDigest {
    pub fn is_tool_call(&self) -> bool {
        self.kind == pb::StepKind::ToolCall
    }

    pub fn succeeded(&self) -> bool {
        self.status == pb::StepStatus::Ok
    }

    /// `timeout`, `rate_limited`, ... or the status when no error type was recorded.
    pub fn failure(&self) -> String {
        if !self.error_type.is_empty() { self.error_type.clone() } else { status_name(self.status).to_string() }
    }
}

#[derive(Debug, Clone)]
pub struct TraceDigest {
    pub header: Header,
    pub steps: Vec<StepDigest>,
    /// The last reward signal of the episode (the one that scored it).
    pub reward: Option<pb::RewardSignal>,
    pub outcome: String,
    pub end_unix_nanos: Option<i64>,
    /// The first error context's type, when there is one.
    pub first_error: Option<String>,
    /// The failure class the episode end names (the sandbox's own, as its
    /// shard's summary gives it); empty in traces written before it did.
    pub end_failure_class: String,
    /// Why the trace ends early (truncated, corrupt), if it does.
    pub damage: Option<String>,
}

/// The short lowercase name of a step status.
pub fn status_name(status: pb::StepStatus) -> &'static str {
    match status {
        pb::StepStatus::Ok => "ok",
        pb::StepStatus::Error => "error",
        pb::StepStatus::Timeout => "timeout",
        pb::StepStatus::Fallback => "fallback",
        pb::StepStatus::RolledBack => "rolled_back",
        pb::StepStatus::Refused => "refused",
        pb::StepStatus::Unspecified => "unspecified",
    }
}

pub fn outcome_name(outcome: i32) -> &'static str {
    match pb::Outcome::try_from(outcome).unwrap_or(pb::Outcome::Unspecified) {
        pb::Outcome::Completed => "completed",
        pb::Outcome::MaxSteps => "max_steps",
        pb::Outcome::Error => "error",
        pb::Outcome::Cancelled => "cancelled",
        pb::Outcome::Unspecified => "unfinished",
    }
}

impl TraceDigest {
    /// Reads the trace; a damaged one yields what its readable prefix holds.
    /// Token logits (most of a policy's trace) are not read: nothing here uses them.
    pub fn load(path: &Path) -> Result<TraceDigest, String> {
        let contents =
            basecamp_trace::read_trace_without(path, &[RecordKind::TokenLogit]).map_err(|e| e.to_string())?;
        Ok(Self::from_records(contents.header.clone(), &contents.records, contents.damage().map(|e| e.to_string())))
    }

    pub fn from_records(header: Header, records: &[pb::Record], damage: Option<String>) -> TraceDigest {
        let mut steps: BTreeMap<u32, StepDigest> = BTreeMap::new();
        let mut policy_ms: BTreeMap<u32, f64> = BTreeMap::new();
        let mut null_keys: BTreeSet<String> = BTreeSet::new();
        let mut memory_ok_after: BTreeMap<u32, bool> = BTreeMap::new();
        let mut digest = TraceDigest {
            header,
            steps: Vec::new(),
            reward: None,
            outcome: "unfinished".into(),
            end_unix_nanos: None,
            first_error: None,
            end_failure_class: String::new(),
            damage,
        };
        for record in records {
            match &record.body {
                Some(Body::PlanStep(step)) => {
                    steps.insert(
                        record.step,
                        StepDigest {
                            index: record.step,
                            kind: pb::StepKind::try_from(step.kind).unwrap_or(pb::StepKind::Unspecified),
                            tool: step.tool.clone(),
                            status: pb::StepStatus::try_from(step.status).unwrap_or(pb::StepStatus::Unspecified),
                            error_type: step.error_type.clone(),
                            duration_ms: step.latency_micros as f64 / 1000.0,
                            memory_ok: true,
                        },
                    );
                }
                Some(Body::PolicyTurn(turn)) => {
                    *policy_ms.entry(record.step).or_default() += turn.latency_micros as f64 / 1000.0;
                }
                Some(Body::MemoryDelta(delta)) => {
                    let initial = delta.source == pb::MemorySource::Initial as i32;
                    if delta.after_json.as_deref() == Some("null") && !initial {
                        null_keys.insert(delta.key.clone());
                    } else {
                        null_keys.remove(&delta.key);
                    }
                }
                Some(Body::RewardSignal(reward)) => digest.reward = Some(reward.clone()),
                Some(Body::ErrorContext(error)) if digest.first_error.is_none() => {
                    digest.first_error = Some(error.error_type.clone());
                }
                Some(Body::EpisodeEnd(end)) => {
                    digest.outcome = outcome_name(end.outcome).to_string();
                    digest.end_unix_nanos = Some(end.end_time_unix_nanos);
                    digest.end_failure_class.clone_from(&end.failure_class);
                }
                _ => {}
            }
            if record.step > 0 {
                memory_ok_after.insert(record.step, null_keys.is_empty());
            }
        }
        for (index, ms) in policy_ms {
            if let Some(step) = steps.get_mut(&index) {
                step.duration_ms += ms;
            }
        }
        for (index, ok) in memory_ok_after {
            if let Some(step) = steps.get_mut(&index) {
                step.memory_ok = ok;
            }
        }
        digest.steps = steps.into_values().collect();
        digest
    }

    /// What a report groups this episode's failure by: the class the
    /// episode end names (the sandbox's, so a policy failure after a tool
    /// error reads `policy_error` as in the shard's summary), else the
    /// first error seen, else an outcome other than completed, else `ok`.
    pub fn failure_class(&self) -> String {
        if self.damage.is_none() && !self.end_failure_class.is_empty() {
            return self.end_failure_class.clone();
        }
        if let Some(step) = self.steps.iter().find(|s| !s.succeeded() && s.status != pb::StepStatus::Unspecified) {
            return step.failure();
        }
        if let Some(error) = self.first_error.as_ref().filter(|e| !e.is_empty()) {
            return error.clone();
        }
        if self.damage.is_some() {
            return "damaged_trace".into();
        }
        if self.outcome != "completed" {
            return self.outcome.clone();
        }
        NO_FAILURE.into()
    }

    /// The metrics a trace holds without the test set: error rate,
    /// resolution time, reward, steps and tool calls.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        let calls: Vec<&StepDigest> = self.steps.iter().filter(|s| s.is_tool_call()).collect();
        let failed = calls.iter().filter(|s| !s.succeeded()).count();
        out.insert("error_rate".into(), if calls.is_empty() { 0.0 } else { failed as f64 / calls.len() as f64 });
        if let Some(end) = self.end_unix_nanos.filter(|end| *end >= self.header.start_time_unix_nanos) {
            out.insert("resolution_time_s".into(), (end - self.header.start_time_unix_nanos) as f64 / 1e9);
        }
        if let Some(reward) = self.reward.as_ref().filter(|r| r.weighted_sum.is_finite()) {
            out.insert("reward".into(), reward.weighted_sum);
        }
        out.insert("steps".into(), self.steps.len() as f64);
        out.insert("tool_calls".into(), calls.len() as f64);
        out
    }

    /// Each reward component's score and weighted contribution, by name.
    pub fn reward_components(&self) -> Vec<(String, f64, f64)> {
        self.reward
            .iter()
            .flat_map(|r| r.components.iter())
            .filter(|c| c.score.is_finite() && c.weight.is_finite())
            .map(|c| (c.name.clone(), c.score, c.weight))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basecamp_trace::pb::{EpisodeEnd, MemoryDelta, PlanStep, PolicyTurn, Record, RewardComponent, RewardSignal};

    fn record(step: u32, body: Body) -> Record {
        Record { step, body: Some(body) }
    }

    fn delta(key: &str, after: &str, source: pb::MemorySource) -> Body {
        Body::MemoryDelta(MemoryDelta {
            key: key.into(),
            after_json: Some(after.into()),
            source: source as i32,
            origin: "track_order".into(),
            ..Default::default()
        })
    }

    fn call(index: u32, status: pb::StepStatus, error: &str, micros: u64) -> Body {
        Body::PlanStep(Box::new(PlanStep {
            index,
            kind: pb::StepKind::ToolCall as i32,
            tool: "track_order".into(),
            status: status as i32,
            error_type: error.into(),
            latency_micros: micros,
            ..Default::default()
        }))
    }

    #[test]
    fn a_null_counts_against_memory_until_a_real_value_replaces_it() {
        let header = Header { start_time_unix_nanos: 1_000_000_000, ..Default::default() };
        let records = [
            record(0, delta("status", "null", pb::MemorySource::Initial)),
            record(1, Body::PolicyTurn(PolicyTurn { latency_micros: 500, ..Default::default() })),
            record(1, call(1, pb::StepStatus::Fallback, "timeout", 800_000)),
            record(1, delta("shipping_status", "null", pb::MemorySource::Fallback)),
            record(2, call(2, pb::StepStatus::Ok, "", 20_000)),
            record(2, delta("shipping_status", "\"pending\"", pb::MemorySource::Tool)),
            record(
                2,
                Body::RewardSignal(RewardSignal {
                    components: vec![RewardComponent { name: "efficiency".into(), score: 2.0, weight: -0.5 }],
                    weighted_sum: -1.0,
                    ..Default::default()
                }),
            ),
            record(
                2,
                Body::EpisodeEnd(EpisodeEnd {
                    outcome: pb::Outcome::Completed as i32,
                    end_time_unix_nanos: 3_500_000_000,
                    ..Default::default()
                }),
            ),
        ];
        let d = TraceDigest::from_records(header, &records, None);
        assert_eq!(d.steps.len(), 2);
        assert!(!d.steps[0].memory_ok, "the fallback's null holds after step 1 (an initial null does not count)");
        assert!(d.steps[1].memory_ok, "step 2 replaced it");
        assert_eq!(d.steps[0].duration_ms, 800.5, "tool latency plus the policy turn");
        assert_eq!(d.failure_class(), "timeout");
        let mut named = records.clone();
        if let Some(Body::EpisodeEnd(end)) = &mut named.last_mut().unwrap().body {
            end.failure_class = "policy_error".into();
        }
        let d_named = TraceDigest::from_records(Header::default(), &named, None);
        assert_eq!(d_named.failure_class(), "policy_error", "the end's class, the sandbox's own, wins");
        let m = d.metrics();
        assert_eq!(m["error_rate"], 0.5);
        assert_eq!(m["resolution_time_s"], 2.5);
        assert_eq!(m["reward"], -1.0);
        assert_eq!(m["tool_calls"], 2.0);
        assert_eq!(d.reward_components(), vec![("efficiency".to_string(), 2.0, -0.5)]);
    }

    #[test]
    fn an_unfinished_trace_fails_as_unfinished_or_damaged() {
        let records = [record(1, call(1, pb::StepStatus::Ok, "", 10))];
        let d = TraceDigest::from_records(Header::default(), &records, None);
        assert_eq!(d.failure_class(), "unfinished");
        assert!(!d.metrics().contains_key("resolution_time_s"), "no end, no resolution time (never NaN)");
        let d = TraceDigest::from_records(Header::default(), &records, Some("truncated at byte 90".into()));
        assert_eq!(d.failure_class(), "damaged_trace");
    }
}
