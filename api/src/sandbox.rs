//! The `SandboxConfig` custom resource: the execution boundary an agent runs
//! in — its tools, timeouts and fallbacks, memory policy, rollback, scheduled
//! observation injections, rewards, trace settings, GPU needs, and named
//! profiles (`dev`, `prod`) that override any of it.
//!
//! Optional scalars are `Option`s with accessors that apply the documented
//! default (`plan_step_timeout()` is 3 s): the CRD schema then carries no
//! `default`s, a profile overlay only changes what it names, and a resolved
//! spec written into a ConfigMap says exactly what the user wrote.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::gpu::GpuRequirement;
use crate::profile::SandboxProfile;
use crate::schema;
use crate::timeouts::ToolTimeouts;
use crate::tool::ToolSpec;

/// Default plan-step timeout: 3 s.
pub const DEFAULT_PLAN_STEP_TIMEOUT: Duration = Duration::from_millis(3_000);
/// Default step budget of an episode.
pub const DEFAULT_MAX_STEPS: u32 = 20;
/// Default number of top logprobs recorded per output token.
pub const DEFAULT_TOP_K: u32 = 5;
/// Default memory snapshot interval, in steps.
pub const DEFAULT_MEMORY_SNAPSHOT_INTERVAL: u32 = 10;

/// The execution boundary of an agent: tools, timeouts, fallbacks, memory
/// policy, rollback, injections, rewards, trace settings and GPU needs.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "basecamp.dev",
    version = "v1alpha1",
    kind = "SandboxConfig",
    namespaced,
    shortname = "sbc",
    category = "basecamp",
    doc = "A Basecamp sandbox: the tools an agent may call and how they are run, timed out, recorded and rewarded.",
    printcolumn(name = "GPU", type_ = "integer", json_path = ".spec.gpu.count", description = "GPUs per sandbox pod"),
    printcolumn(
        name = "MinCC",
        type_ = "string",
        json_path = ".spec.gpu.minComputeCapability",
        description = "Lowest CUDA compute capability accepted"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxConfigSpec {
    /// The tools the agent may call, by name (the name the policy model
    /// sees: letters, digits, `_` and `-`, at most 64 characters).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolSpec>,
    /// Helper processes started before the first episode and stopped after
    /// the last (a mock API the tools call), by name. Tools reach one with
    /// `$(services.NAME.url)` (also `.host`, `.port`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub services: BTreeMap<String, crate::service::ServiceSpec>,
    /// Tool-call timeouts with millisecond precision: a map with `default`
    /// and per-tool entries (`{default: 800ms, track_order: 2s}`), or one
    /// duration that applies to EVERY tool. Durations are strings such as
    /// "800ms", "1.5s", "2m" or integers in milliseconds.
    /// At most 7 days (168h) each. Default: 800ms for every tool. A
    /// timed-out call returns the tool's fallback and is traced with
    /// `error.type=timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_timeouts: Option<ToolTimeouts>,
    /// What a tool returns when it times out or fails, by tool name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fallbacks: BTreeMap<String, Fallback>,
    /// Timeout of a whole plan step. When it fires, memory rolls back to the
    /// last stable checkpoint and `rollback_trace.json` is written.
    /// At most 7 days (168h). Default: 3s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_step_timeout: Option<Duration>,
    /// Steps after which an episode stops without a final answer. Default: 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// What the trace records.
    #[serde(default, skip_serializing_if = "TraceSettings::is_default")]
    pub trace: TraceSettings,
    /// How memory writes are checked.
    #[serde(default, skip_serializing_if = "MemoryPolicy::is_default")]
    pub memory: MemoryPolicy,
    /// Checkpoints and rollback on plan-step timeouts.
    #[serde(default, skip_serializing_if = "Rollback::is_default")]
    pub rollback: Rollback,
    /// Observations injected into episodes on a schedule (at a step, after a
    /// tool, or when a memory key matches). Injected observations are marked
    /// as such in the trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injections: Vec<Injection>,
    /// Reward components and their weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards: Option<Rewards>,
    /// GPUs the sandbox pod needs (for the policy-server sidecar and
    /// GPU-hungry tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuRequirement>,
    /// CPU and memory requests and limits of the sandbox container
    /// (`nvidia.com/gpu` comes from `gpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The image holding your tools (exec tools run inside it). The sandbox
    /// binary is injected by an init container, so any image works. In a
    /// pod, relative paths of this spec (services, exec tools, fixtures)
    /// are resolved against the image's working directory (its `WORKDIR`),
    /// which is read-only: write to `/tmp`. Default: the Basecamp image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// RuntimeClass of sandbox pods, e.g. `gvisor` or `kata` for stronger
    /// isolation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Named overlays (`dev`, `prod`, ...) that override any field above when
    /// a HarnessTask selects them with `sandboxRef.profile`, merged as a JSON
    /// merge patch (RFC 7386): objects merge key by key, lists and scalars
    /// replace, and a `null` REMOVES the key — so a profile cannot set a
    /// memory patch value to null.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, SandboxProfile>,
}

impl SandboxConfigSpec {
    /// Timeout of a call of `tool`.
    pub fn tool_timeout_for(&self, tool: &str) -> Duration {
        self.tool_timeouts.as_ref().map_or(crate::timeouts::DEFAULT_TOOL_TIMEOUT, |t| t.tool_timeout_for(tool))
    }

    /// The plan-step timeout (default 3 s).
    pub fn plan_step_timeout(&self) -> Duration {
        self.plan_step_timeout.unwrap_or(DEFAULT_PLAN_STEP_TIMEOUT)
    }

    /// The step budget (default 20).
    pub fn max_steps(&self) -> u32 {
        self.max_steps.unwrap_or(DEFAULT_MAX_STEPS)
    }

    /// The fallback of `tool`, if one is configured.
    pub fn fallback_for(&self, tool: &str) -> Option<&Fallback> {
        self.fallbacks.get(tool)
    }
}

/// What a tool returns when it times out or fails.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fallback {
    /// The observation the agent sees instead of the tool's result, e.g.
    /// `{"status": "unknown", "error": "tracking timed out"}`.
    #[schemars(schema_with = "schema::any_json")]
    pub observation: serde_json::Value,
    /// Memory writes made with the fallback: key -> value. A `null` value
    /// writes null (checked against `memory.nullWrites`) — the classic bug is
    /// `shipping_status: null`; prefer a real value such as "pending".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::json_object")]
    pub memory_patch: Option<serde_json::Map<String, serde_json::Value>>,
}

/// How much the trace records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceSettings {
    /// `minimal` (plan steps and errors), `standard` (plus memory deltas and
    /// rewards) or `full` (plus every token's top-k logits and full tool
    /// payloads). Default: standard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<TraceLevel>,
    /// Top logprobs recorded per output token (the policy is asked for
    /// `top_logprobs: topK`; OpenAI-compatible servers allow at most 20).
    /// Default: 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Record the error context (cause chain, memory snapshot, last three
    /// tool payloads) when an episode fails. Without it "execution
    /// terminated due to error" comes with no explanation. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_context: Option<bool>,
    /// Write a full memory snapshot every N steps (deltas are always
    /// recorded); 0 disables snapshots. Default: 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_snapshot_interval: Option<u32>,
}

impl TraceSettings {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }

    /// The level (default standard).
    pub fn level(&self) -> TraceLevel {
        self.level.unwrap_or_default()
    }

    /// Top-k logprobs per token (default 5).
    pub fn top_k(&self) -> u32 {
        self.top_k.unwrap_or(DEFAULT_TOP_K)
    }

    /// Whether error context is recorded (default true).
    pub fn error_context(&self) -> bool {
        self.error_context.unwrap_or(true)
    }

    /// Memory snapshot interval in steps (default 10; 0 = never).
    pub fn memory_snapshot_interval(&self) -> u32 {
        self.memory_snapshot_interval.unwrap_or(DEFAULT_MEMORY_SNAPSHOT_INTERVAL)
    }
}

/// Trace detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TraceLevel {
    /// Plan steps and errors.
    Minimal,
    /// Plus memory deltas and reward signals.
    #[default]
    Standard,
    /// Plus token logits and full tool payloads.
    Full,
}

/// How memory writes are checked.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPolicy {
    /// What happens when a patch writes `null` into a key: `allow`, `warn`
    /// (written, and flagged in the trace) or `error` (the null writes are
    /// refused: those keys keep their values, the patch's other writes are
    /// applied, and the call is marked `refused` with error type
    /// `null_write_refused`: a failed call, whose error the agent sees; the
    /// episode goes on). Default: warn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub null_writes: Option<NullWrites>,
    /// Refuse writes whose JSON type differs from `schema`: those keys keep
    /// their values, the patch's other writes are applied, and the call is
    /// marked `refused` with error type `memory_type` (a failed call; the
    /// episode goes on). Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict_types: bool,
    /// Expected JSON type of memory keys: key -> `string`, `number`,
    /// `integer`, `boolean`, `object`, `array` or `null`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schema: BTreeMap<String, JsonType>,
}

impl MemoryPolicy {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }

    /// The null-write policy (default warn).
    pub fn null_writes(&self) -> NullWrites {
        self.null_writes.unwrap_or_default()
    }
}

/// What to do with a `null` written into memory: `allow` writes it, `warn`
/// writes it and flags it in the trace, `error` refuses the null writes —
/// those keys keep their values, the patch's other writes are applied, and
/// the call is marked `refused` (error type `null_write_refused`; a failed
/// call whose error the agent sees, the episode goes on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NullWrites {
    /// Write it silently.
    Allow,
    /// Write it and flag it in the trace.
    #[default]
    Warn,
    /// Refuse the null writes (the patch's other writes are applied); the
    /// call is marked refused.
    Error,
}

/// A JSON type, for the memory schema. `integer` also takes a float
/// without a fraction below 2^53 in magnitude (`3.0`, as Python writes a
/// float), kept as `3` when `strictTypes` is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum JsonType {
    /// A string.
    String,
    /// Any number.
    Number,
    /// A whole number: `3`, or a float without a fraction below 2^53 in
    /// magnitude (`3.0`, as Python's json writes a float), kept as `3` with
    /// `strictTypes` — as JSON Schema counts it and the trace's canonical
    /// JSON writes it.
    /// `3.5` and `1e300` are not.
    Integer,
    /// true or false.
    Boolean,
    /// An object.
    Object,
    /// An array.
    Array,
    /// null.
    Null,
}

/// 2^53: below it every integral float is exactly an integer (the bound
/// canonical JSON prints such a float as an integer under).
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

impl JsonType {
    /// Whether `value` has this type (`null` only matches `Null`; an
    /// integral float below 2^53 is an `Integer`).
    pub fn matches(self, value: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (self, value) {
            (JsonType::String, Value::String(_))
            | (JsonType::Number, Value::Number(_))
            | (JsonType::Boolean, Value::Bool(_))
            | (JsonType::Object, Value::Object(_))
            | (JsonType::Array, Value::Array(_))
            | (JsonType::Null, Value::Null) => true,
            (JsonType::Integer, Value::Number(n)) => {
                n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() < MAX_SAFE_INTEGER)
            }
            _ => false,
        }
    }

    /// The type's name as written in the schema.
    pub fn as_str(self) -> &'static str {
        match self {
            JsonType::String => "string",
            JsonType::Number => "number",
            JsonType::Integer => "integer",
            JsonType::Boolean => "boolean",
            JsonType::Object => "object",
            JsonType::Array => "array",
            JsonType::Null => "null",
        }
    }
}

/// Checkpoints and rollback.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollback {
    /// Roll memory back to the last stable checkpoint when a plan step times
    /// out. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Take a stable checkpoint every N completed steps. Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u32>,
}

impl Rollback {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }

    /// Whether rollback is on (default true).
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// Checkpoint interval in steps (default 1).
    pub fn checkpoint_every(&self) -> u32 {
        self.checkpoint_every.unwrap_or(1)
    }
}

/// An observation injected into every episode on a schedule. Set exactly one
/// of `atStep`, `afterTool`, `whenMemory`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Injection {
    /// Inject before step N (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_step: Option<u32>,
    /// Inject after every turn that calls this tool: once per turn, after
    /// the turn's tool messages (which must follow the calls directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_tool: Option<String>,
    /// Inject once, after the first turn that leaves a memory key at a value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_memory: Option<MemoryMatch>,
    /// The observation, e.g. `{"type": "system", "content": "the user asked about Beijing weather; suggest an umbrella"}`.
    #[schemars(schema_with = "schema::any_json")]
    pub observation: serde_json::Value,
    /// Why it is injected (shown in the trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The trigger kinds of an injection that are set, for validation.
impl Injection {
    /// Names of the triggers set (`atStep`, `afterTool`, `whenMemory`).
    pub fn triggers_set(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        if self.at_step.is_some() {
            set.push("atStep");
        }
        if self.after_tool.is_some() {
            set.push("afterTool");
        }
        if self.when_memory.is_some() {
            set.push("whenMemory");
        }
        set
    }
}

/// A memory condition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryMatch {
    /// The memory key.
    pub key: String,
    /// The value it must equal (any JSON, including null).
    #[schemars(schema_with = "schema::any_json")]
    pub equals: serde_json::Value,
}

/// The per-episode metrics a reward component's `source` can name: what the
/// sandbox scores each episode on (the runner's `metric_score`; a test in
/// the sandbox crate checks it scores each). Any other source would score 0
/// on every episode.
pub const REWARD_SOURCES: &[&str] = &[
    "tool_call_accuracy",
    "tool_call_accuracy_lenient",
    "plan_step_f1",
    "memory_consistency",
    "error_rate",
    "logit_divergence",
    "steps",
    "resolution_time",
    "efficiency_penalty",
    "success",
    "task_success",
];

/// Reward components and their weights.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rewards {
    /// Named components, e.g. `correctness: {weight: 1.0, source: tool_call_accuracy}`,
    /// `efficiency: {weight: -0.1, source: steps}`. The reward is the weighted sum.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub components: BTreeMap<String, RewardComponent>,
    /// Weight changes over training steps, in increasing `atTrainingStep`.
    /// Each entry overrides the weights it names from that step on; every
    /// change is recorded in the trace as a delta.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_schedule: Vec<WeightChange>,
}

impl Rewards {
    /// The weight of every component at `training_step`, schedule applied.
    pub fn weights_at(&self, training_step: u64) -> BTreeMap<String, f64> {
        let mut weights: BTreeMap<String, f64> =
            self.components.iter().map(|(name, component)| (name.clone(), component.weight)).collect();
        for change in self.weight_schedule.iter().filter(|c| c.at_training_step <= training_step) {
            for (name, weight) in &change.weights {
                weights.insert(name.clone(), *weight);
            }
        }
        weights
    }
}

/// One reward component.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RewardComponent {
    /// Its weight in the sum (negative for penalties).
    pub weight: f64,
    /// Where the score comes from: a per-episode metric the sandbox scores
    /// (`tool_call_accuracy`, `tool_call_accuracy_lenient`, `plan_step_f1`,
    /// `memory_consistency`, `error_rate`, `logit_divergence`, `steps`,
    /// `resolution_time`, `efficiency_penalty`, `success`/`task_success`);
    /// any other is refused by validation. Default: the component's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// A change of reward weights from a training step on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightChange {
    /// The training step from which these weights apply.
    pub at_training_step: u64,
    /// Component name -> new weight.
    pub weights: BTreeMap<String, f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_come_from_accessors() {
        let spec = SandboxConfigSpec::default();
        assert_eq!(spec.plan_step_timeout().as_millis(), 3_000);
        assert_eq!(spec.tool_timeout_for("x").as_millis(), 800);
        assert_eq!(spec.max_steps(), 20);
        assert_eq!(spec.trace.top_k(), 5);
        assert!(spec.trace.error_context());
        assert_eq!(spec.trace.level(), TraceLevel::Standard);
        assert_eq!(spec.memory.null_writes(), NullWrites::Warn);
        assert!(spec.rollback.enabled());
        // Nothing is written that the user did not write.
        assert_eq!(serde_json::to_value(&spec).expect("ser"), serde_json::json!({}));
    }

    #[test]
    fn weight_schedule_overrides_from_its_step_on() {
        let rewards: Rewards = serde_json::from_value(serde_json::json!({
            "components": {"correctness": {"weight": 1.0}, "efficiency": {"weight": -0.5}},
            "weightSchedule": [{"atTrainingStep": 100, "weights": {"efficiency": -0.1}}]
        }))
        .expect("rewards");
        assert_eq!(rewards.weights_at(99)["efficiency"], -0.5);
        assert_eq!(rewards.weights_at(100)["efficiency"], -0.1);
        assert_eq!(rewards.weights_at(100)["correctness"], 1.0);
    }

    #[test]
    fn json_types_match_values() {
        use serde_json::json;
        assert!(JsonType::Integer.matches(&json!(3)));
        assert!(!JsonType::Integer.matches(&json!(3.5)));
        // Before: 3.0 was refused, though JSON Schema and canonical JSON take it as 3.
        assert!(JsonType::Integer.matches(&json!(3.0)));
        assert!(JsonType::Integer.matches(&json!(-3.0)));
        assert!(!JsonType::Integer.matches(&json!(1e300)));
        assert!(!JsonType::Integer.matches(&json!(9_007_199_254_740_992.0)));
        assert!(JsonType::Number.matches(&json!(3.5)));
        assert!(!JsonType::String.matches(&json!(null)));
        assert!(JsonType::Null.matches(&json!(null)));
    }
}
