//! The `HarnessTask` custom resource: a declarative training or evaluation
//! task — what success means, where the data and the test set are, which
//! policy to call, which sandbox (and profile) to run it in, how many shards,
//! an optional A/B pair of variants, and where traces go.
//!
//! Its status is written by the operator: phase, metav1-style conditions,
//! shard counts and metrics per variant, success-criteria results, and the
//! locations of traces and the report.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::schema;

/// The variant name used when a task has a single `sandboxRef` and no
/// `variants`.
pub const DEFAULT_VARIANT: &str = "default";

/// A training or evaluation task run in Basecamp sandboxes.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "basecamp.dev",
    version = "v1alpha1",
    kind = "HarnessTask",
    namespaced,
    status = "HarnessTaskStatus",
    shortname = "ht",
    category = "basecamp",
    doc = "A Basecamp harness task: a test set run by a policy in sandboxes, sharded, traced and scored against success criteria.",
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}"#,
    printcolumn = r#"{"name": "Variants", "type": "string", "jsonPath": ".status.variantsSummary"}"#,
    printcolumn = r#"{"name": "Shards", "type": "string", "jsonPath": ".status.shardsSummary", "description": "Finished shards / total shards"}"#,
    printcolumn = r#"{"name": "Accuracy", "type": "string", "jsonPath": ".status.accuracy", "description": "tool_call_accuracy per variant"}"#,
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.sandboxRef) != (has(self.variants) && size(self.variants) > 0)",
        "message": "set exactly one of spec.sandboxRef (one sandbox) and spec.variants (an A/B test)"
    }
]))]
pub struct HarnessTaskSpec {
    /// What the task is and what success means.
    pub task_definition: TaskDefinition,
    /// Training data, for tasks that train (evaluation-only tasks omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_pipeline: Option<DataPipeline>,
    /// Training settings, for tasks that train.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_config: Option<TrainingConfig>,
    /// The test set and the metrics computed on it.
    pub evaluation: Evaluation,
    /// The policy (the model under test) the agent loop calls.
    pub policy: PolicySpec,
    /// The SandboxConfig to run in (and its profile). Set this or `variants`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_ref: Option<SandboxRef>,
    /// Shards per variant: the test set is split into this many contiguous
    /// parts, one pod each (an Indexed Job's completions). 1 to 100000
    /// (Kubernetes asks more of an Indexed Job above that). Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub shards: Option<u32>,
    /// Shards of one variant running at once, at least 1. Default: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// An A/B test: two variants, each with its own sandbox (or profile), run
    /// on the same test set and compared. Set this or `sandboxRef`. At most
    /// two, with different names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "rule": "self.all(v, self.exists_one(w, w.name == v.name))",
            "message": "variant names must be unique"
        }
    ]))]
    pub variants: Vec<Variant>,
    /// Where traces, shard summaries and the report are written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<TraceDestination>,
    /// PII removed from traces before they are written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redaction: Option<Redaction>,
    /// Create the Jobs suspended (Kueue or a person resumes them). Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// Kueue LocalQueue to admit the Jobs through (`kueue.x-k8s.io/queue-name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
}

impl HarnessTaskSpec {
    /// Shards per variant (default 1).
    pub fn shards(&self) -> u32 {
        self.shards.unwrap_or(1)
    }

    /// The variants to run: `variants` when set, else one variant named
    /// [`DEFAULT_VARIANT`] with `sandboxRef`. Empty when neither is set.
    pub fn effective_variants(&self) -> Vec<Variant> {
        if !self.variants.is_empty() {
            return self.variants.clone();
        }
        self.sandbox_ref
            .iter()
            .map(|sandbox_ref| Variant { name: DEFAULT_VARIANT.to_string(), sandbox_ref: sandbox_ref.clone() })
            .collect()
    }
}

/// What the task is and what success means.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskDefinition {
    /// A display name (the object's name is used when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the agent must do, e.g. "resolve complaints about delayed shipping".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Conditions on the aggregated metrics, each `metric OP value`, e.g.
    /// `tool_call_accuracy >= 0.9`, `success_rate > 0.85`,
    /// `avg_resolution_time < 90s`. The metric is one a run reports: a
    /// metric's mean (`avg_`/`mean_` prefix optional), `success_rate` (the
    /// share of episodes with no tool error, every tool call right and the
    /// memory as expected), `completion_rate` (the share that ran to their
    /// end), `episodes`, `lost_episodes`, `not_measured_episodes` (those the
    /// policy's server or a sandbox service failed, left out of every mean
    /// and of `success_rate`; any such episode fails the task unless a
    /// criterion on it or on `not_measured_rate`, their share, sets a
    /// tolerance, e.g. `not_measured_rate <= 1%`), `p50_resolution_time`,
    /// `p95_resolution_time`; any other name is never met (validation
    /// warns). OP: < <= > >= == !=; values are numbers, percentages (5%) or
    /// durations (ms, s, m, h; compared in seconds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub success_criteria: Vec<String>,
}

/// Training data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataPipeline {
    /// `s3://bucket/prefix/` or a local path. No query string: put an S3
    /// object version in `version`.
    pub source: String,
    /// Version of the source data (e.g. an S3 versionId or a dataset tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Preprocessor turning raw logs into (state, action, reward):
    /// `builtin:trajectory` (the default), `exec:PROGRAM ARGS...` (split as a
    /// shell splits words) or `python:module.function`. Rewards come from the
    /// sandbox's reward calculator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preprocessor: Option<String>,
    /// Training batch size; also the rows per batch file of the dataset
    /// (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    /// The dataset's file format (see [`DataFormat`]). Default: jsonl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DataFormat>,
    /// How long a user preprocessor (`exec:`, `python:`) may take to answer
    /// one record (the first: to start, then answer) before it is stopped
    /// and the run fails naming the record. At most 7 days (168h). Default: 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_timeout: Option<Duration>,
}

/// How long a user preprocessor may take to answer one record when
/// `dataPipeline.recordTimeout` does not say.
pub const DEFAULT_RECORD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl DataPipeline {
    /// How long a user preprocessor may take to answer one record.
    pub fn record_timeout(&self) -> std::time::Duration {
        self.record_timeout.and_then(Duration::to_std).unwrap_or(DEFAULT_RECORD_TIMEOUT)
    }
}

/// The dataset's file format: `jsonl` (JSON Lines, `batch-00000.jsonl`,
/// ...; the default) or `parquet` (`batch-00000.parquet`, ...: one
/// ZSTD-compressed row group a file; `state` and `action` as JSON text).
// The CRD's description of `dataPipeline.format` is this comment, not the field's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// JSON Lines: one row a line.
    #[default]
    Jsonl,
    /// Apache Parquet: one row group a file, ZSTD-compressed columns.
    Parquet,
}

impl DataFormat {
    /// Every format, as spelt in manifests and on the command line.
    pub const NAMES: [&str; 2] = ["jsonl", "parquet"];

    /// `jsonl` or `parquet`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Jsonl => "jsonl",
            Self::Parquet => "parquet",
        }
    }

    /// The batch files' extension (no dot).
    pub fn extension(self) -> &'static str {
        self.name()
    }
}

impl std::fmt::Display for DataFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DataFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "jsonl" => Ok(Self::Jsonl),
            "parquet" => Ok(Self::Parquet),
            other => Err(format!("unknown dataset format {other:?}; use {}", Self::NAMES.join(" or "))),
        }
    }
}

/// Training settings (passed to the training container).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingConfig {
    /// The base model, e.g. `deepseek-v4.1-agent-base`. Copy it exactly:
    /// a misspelt id hangs at "Downloading model...".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// Optimizer, e.g. `paged_adamw_32bit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    /// Learning-rate schedule, e.g. `{type: cosine, warmup_steps: 200}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::json_object")]
    pub lr_schedule: Option<serde_json::Value>,
    /// Checkpoint to resume from (`s3://...` or a path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<String>,
    /// Training image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Training command (argv).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// GPUs for training (`nvidia.com/gpu` on the trainer pod; placed on
    /// nodes of the first variant's `minComputeCapability`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Where the trainer writes checkpoints: one `step-N/` prefix each,
    /// finished by a `COMPLETE` object (see `completionMarker`). Default:
    /// `<traces.destination>/checkpoints/<namespace>/<task>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<String>,
    /// The object that marks a checkpoint as fully written. Default: `COMPLETE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_marker: Option<String>,
    /// Checkpoints evaluated at the same time (each runs the test set in
    /// sandboxes, one Job per variant). Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_evaluations: Option<u32>,
}

impl TrainingConfig {
    /// The completion marker's file name (default `COMPLETE`).
    pub fn completion_marker(&self) -> &str {
        self.completion_marker.as_deref().filter(|m| !m.is_empty()).unwrap_or(DEFAULT_COMPLETION_MARKER)
    }

    /// Checkpoints evaluated at once (default 1).
    pub fn max_concurrent_evaluations(&self) -> u32 {
        self.max_concurrent_evaluations.unwrap_or(1).max(1)
    }
}

/// The object that marks a checkpoint `step-N/` as complete, by default.
pub const DEFAULT_COMPLETION_MARKER: &str = "COMPLETE";

/// A policy server started next to the sandbox in every evaluation pod (a
/// native sidecar, e.g. vLLM), serving the checkpoint under test on
/// localhost. The sandbox waits until `readinessPath` answers 200.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyServer {
    /// The server's image, e.g. `vllm/vllm-openai:v0.11.0`.
    pub image: String,
    /// The command (argv); default: the image's entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments. `$(BASECAMP_CHECKPOINT)` (the checkpoint's location; the
    /// model id or `resumeFrom` when not evaluating a checkpoint),
    /// `$(BASECAMP_STEP)` and `$(BASECAMP_POLICY_PORT)` are expanded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The loopback port it listens on. Default: 8000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// Path answering 200 once the model is loaded. Default: `/v1/models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_path: Option<String>,
    /// How long loading may take before the pod fails.
    /// At most 7 days (168h). Default: 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout: Option<Duration>,
    /// GPUs for the server (`nvidia.com/gpu`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// The port a sandbox pod's `basecamp-sandbox` serves `/metrics`, `/healthz`
/// and live injection on (the container port named `metrics`, which the
/// chart's PodMonitor scrapes). A policy server sidecar cannot use it.
pub const SANDBOX_METRICS_PORT: u16 = 9464;

impl PolicyServer {
    /// The port (default 8000).
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(8000)
    }

    /// The readiness path (default `/v1/models`).
    pub fn readiness_path(&self) -> &str {
        self.readiness_path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/v1/models")
    }

    /// The startup timeout (default 10 minutes).
    pub fn startup_timeout(&self) -> Duration {
        self.startup_timeout.unwrap_or(Duration::from_secs(600))
    }

    /// The OpenAI-compatible base URL it serves: `http://127.0.0.1:PORT/v1`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port())
    }

    /// The URL the sandbox polls before its first episode.
    pub fn readiness_url(&self) -> String {
        format!("http://127.0.0.1:{}{}", self.port(), self.readiness_path())
    }
}

/// The test set and what is measured on it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    /// Metrics to compute and report, e.g. `tool_call_accuracy`,
    /// `plan_step_f1`, `memory_consistency`, `error_rate`, `resolution_time`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<String>,
    /// The test set: a JSONL file (`s3://bucket/key.jsonl` or a path), one
    /// episode per line, each with a unique `id`.
    pub test_set: String,
    /// Default `compare_args` per tool: the argument names compared for
    /// strict tool-call accuracy when a test row does not say (tool name ->
    /// argument names). Without either, all arguments are compared.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compare_args: BTreeMap<String, Vec<String>>,
}

/// The policy the agent loop calls: an OpenAI-compatible chat-completions
/// endpoint, or a scripted policy. Set exactly one of `endpoint`, `scripted`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// Base URL of an OpenAI-compatible API (vLLM, SGLang, Ollama, hosted),
    /// e.g. `http://localhost:8000/v1`; `/chat/completions` is appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Model name sent in requests (required with `endpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// API key from a Secret in the task's namespace (in the cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<SecretKeyRef>,
    /// API key from this environment variable (locally).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// API key from this file. Keys are never written to traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<String>,
    /// Sampling temperature, 0 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Maximum tokens per completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// `top_logprobs` to request (0-20). Default: the sandbox's `trace.topK`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Timeout of one request. At most 7 days (168h). Default: 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<Duration>,
    /// How long a shard waits for `endpoint` (a policy without `server`)
    /// to answer again after an outage: when episode after episode failed
    /// on it, having measured one before, `GET <endpoint>/models` is polled
    /// until it answers anything but 408, 429 or 5xx, and the shard goes on
    /// (or gives up, starting no more episodes, once this has passed). `0s`
    /// gives up at once. A policy server's outage is waited for up to its
    /// `startupTimeout`. At most 7 days (168h). Default: 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outage_timeout: Option<Duration>,
    /// A scripted policy instead of an endpoint: a JSONL file of responses
    /// (for tests and replay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scripted: Option<String>,
    /// A policy server run in each sandbox pod (e.g. vLLM serving the
    /// checkpoint under evaluation). Without `endpoint`, the policy is
    /// called at its `http://127.0.0.1:PORT/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<PolicyServer>,
}

impl PolicySpec {
    /// The endpoint called: `endpoint`, else the policy server's.
    pub fn effective_endpoint(&self) -> Option<String> {
        self.endpoint.clone().or_else(|| self.server.as_ref().map(PolicyServer::endpoint))
    }

    /// The request timeout (default 60 s).
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout.unwrap_or(Duration::from_secs(60))
    }

    /// How long a shard waits for a hosted endpoint after an outage (default 5 min).
    pub fn outage_timeout(&self) -> Duration {
        self.outage_timeout.unwrap_or(Duration::from_secs(300))
    }
}

/// A key in a Secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in the Secret. Default: `apiKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A SandboxConfig in the task's namespace, and optionally one of its profiles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRef {
    /// The SandboxConfig's name (not empty: the operator cannot read a
    /// SandboxConfig of no name, and reported it as the API unreachable).
    #[schemars(length(min = 1))]
    pub name: String,
    /// One of its `profiles` (e.g. `dev`, `prod`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// One arm of an A/B test.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Variant {
    /// The variant's name (a DNS label, e.g. `a`, `baseline`); it appears in
    /// Job names, labels, trace paths and metrics.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The sandbox this variant runs in.
    pub sandbox_ref: SandboxRef,
}

/// Where traces go and how long they stay.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceDestination {
    /// `s3://bucket/prefix` or a local directory. Keys are partitioned as
    /// `<dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/`.
    /// Default: `./basecamp-runs/<task>/` for `basecamp run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// What happens to the task's traces when the task is deleted: `Retain`
    /// or `Delete`. Default: Retain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// Days traces are kept (`basecamp trace cleanup` deletes older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_days: Option<u32>,
}

/// Trace retention on task deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum Retention {
    /// Keep the traces.
    #[default]
    Retain,
    /// Delete the task's trace prefix.
    Delete,
}

/// PII redaction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Redaction {
    /// Field names whose values are replaced before traces are written, e.g.
    /// `user_phone`, `user_address`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pii_fields: Vec<String>,
}

/// The observed state of a HarnessTask, written by the operator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HarnessTaskStatus {
    /// Pending, Running, Succeeded, Failed or Suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TaskPhase>,
    /// Conditions: Ready, Progressing, Degraded, Succeeded, Failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Shard counts by variant.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shards: BTreeMap<String, ShardCounts>,
    /// The pod-template hash of the Job that `shards` counts, by variant. A
    /// finished Job that its TTL removed is run again only when an edit
    /// changes its variant's template (not on any edit of the task).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub job_templates: BTreeMap<String, String>,
    /// Finished (succeeded + failed) shards / total, over all variants, e.g. "3/4".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_summary: Option<String>,
    /// The variant names, e.g. "a,b".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variants_summary: Option<String>,
    /// tool_call_accuracy for display, e.g. "0.912" or "a=0.68 b=0.85".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<String>,
    /// Aggregated metrics by variant (metric name -> value). Never NaN: a
    /// metric without data is absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
    /// Success-criteria results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub criteria: Vec<CriterionResult>,
    /// The shard indexes (by variant) whose `summary.json` is counted in
    /// `metrics`. Metrics are always recomputed from every summary found in
    /// the trace destination, so a restarted operator never counts a shard
    /// twice.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub aggregated_shards: BTreeMap<String, Vec<u32>>,
    /// A/B deltas (second variant minus first) by metric name, once both
    /// variants have data.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deltas: BTreeMap<String, f64>,
    /// Every S3 trace destination this task's Jobs were given (an edit of
    /// `traces.destination` adds one): retention `Delete` removes the
    /// task's objects under each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace_destinations: Vec<String>,
    /// Where the traces are (`s3://...` or a directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_location: Option<String>,
    /// URL of the HTML report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_url: Option<String>,
    /// The training loop, for tasks with `trainingConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingStatus>,
}

/// How many evaluated checkpoints `status.training.history` keeps (the
/// newest); every one is in `<dest>/reports/<ns>/<task>/steps.json`.
pub const TRAINING_HISTORY_LIMIT: usize = 20;

/// The training loop's state: the trainer Job and the checkpoint evaluations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingStatus {
    /// Pending, Running, Succeeded or Failed (the trainer Job's state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TaskPhase>,
    /// The trainer Job's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Why the trainer (or its preprocessor) failed, from the pod's
    /// termination message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the preprocessed dataset is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// Where checkpoints are written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<String>,
    /// The step of `resumeFrom` (checkpoints up to it are not evaluated again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from_step: Option<u64>,
    /// Complete checkpoints found after `resumedFromStep`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints_found: Option<u32>,
    /// The newest evaluated step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_step: Option<u64>,
    /// Steps whose evaluation Jobs run now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evaluating: Vec<u64>,
    /// Complete checkpoints waiting for an evaluation slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<u64>,
    /// The newest evaluated checkpoints, oldest first (at most
    /// [`TRAINING_HISTORY_LIMIT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<CheckpointEvaluation>,
    /// Directories of `checkpoints` named like a step that are not one
    /// (`step_100`, `Step-100`, `step-1e3`, a step above
    /// 9223372036854775807), so never evaluated: a checkpoint directory is
    /// `step-<N>`. In name order, at most [`IGNORED_DIRECTORIES_LIMIT`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_directories: Vec<String>,
}

/// How many names `status.training.ignoredDirectories` keeps.
pub const IGNORED_DIRECTORIES_LIMIT: usize = 10;

/// One evaluated checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointEvaluation {
    /// The training step.
    pub step: u64,
    /// The checkpoint's location.
    pub checkpoint: String,
    /// Succeeded (every shard finished), or Failed.
    pub phase: TaskPhase,
    /// Aggregated metrics by variant (metric name -> value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
    /// Whether every success criterion held, for every variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criteria_met: Option<bool>,
    /// The evaluation's report (its traces are under the run name `<task>@step-N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_url: Option<String>,
    /// When its last shard finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// The run name under which the evaluation of checkpoint `step` of `task`
/// writes traces and reports: `<task>@step-<N>` (`@` cannot appear in an
/// object name, so it never collides with a task).
pub fn checkpoint_run_name(task: &str, step: u64) -> String {
    format!("{task}@step-{step}")
}

/// The largest training step: status fields are int64 in the CRD, so a
/// larger step could never be written (the API server reads it as a float
/// and refuses every status update of the task).
pub const MAX_CHECKPOINT_STEP: u64 = i64::MAX as u64;

/// The step of a checkpoint prefix's last segment `step-N` (`step-000100`
/// too); `None` for anything else, a step above [`MAX_CHECKPOINT_STEP`] included.
pub fn parse_checkpoint_step(segment: &str) -> Option<u64> {
    let digits = segment.trim_end_matches('/').rsplit('/').next()?.strip_prefix("step-")?;
    let step: u64 =
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())??;
    (step <= MAX_CHECKPOINT_STEP).then_some(step)
}

/// Task phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TaskPhase {
    /// Accepted, Jobs not yet running.
    Pending,
    /// Shards are running.
    Running,
    /// All shards finished and every success criterion is met.
    Succeeded,
    /// The spec is invalid, shards failed, or a criterion is not met.
    Failed,
    /// `suspend: true`, or waiting for Kueue admission.
    Suspended,
}

impl TaskPhase {
    /// The phase's name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskPhase::Pending => "Pending",
            TaskPhase::Running => "Running",
            TaskPhase::Succeeded => "Succeeded",
            TaskPhase::Failed => "Failed",
            TaskPhase::Suspended => "Suspended",
        }
    }
}

/// Condition types the operator sets.
pub mod condition_types {
    /// The spec is valid and its sandboxes resolved.
    pub const READY: &str = "Ready";
    /// Shards are being created or are running.
    pub const PROGRESSING: &str = "Progressing";
    /// Something is wrong but the task goes on (a shard failed and is retried, S3 is down).
    pub const DEGRADED: &str = "Degraded";
    /// Finished with every criterion met.
    pub const SUCCEEDED: &str = "Succeeded";
    /// Finished without meeting the criteria, or cannot run.
    pub const FAILED: &str = "Failed";
}

/// Shard counts of one variant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardCounts {
    /// Shards in total.
    pub total: u32,
    /// Shards that finished successfully.
    pub succeeded: u32,
    /// Shards that failed for good.
    pub failed: u32,
    /// Shards running now.
    pub running: u32,
}

impl ShardCounts {
    /// Succeeded plus failed.
    pub fn finished(&self) -> u32 {
        self.succeeded.saturating_add(self.failed)
    }
}

/// The result of one success criterion for one variant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CriterionResult {
    /// The variant.
    pub variant: String,
    /// The criterion as written.
    pub criterion: String,
    /// Whether it is met.
    pub met: bool,
    /// The observed value (absent when the metric has no data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<f64>,
    /// Why it is not met, or why it cannot be evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_sandbox_ref_is_the_default_variant() {
        let spec = HarnessTaskSpec {
            sandbox_ref: Some(SandboxRef { name: "shop".into(), profile: None }),
            ..Default::default()
        };
        let variants = spec.effective_variants();
        assert_eq!(variants.len(), 1);
        assert_eq!(variants[0].name, DEFAULT_VARIANT);
        assert_eq!(spec.shards(), 1);
        assert!(HarnessTaskSpec::default().effective_variants().is_empty());
    }

    #[test]
    fn the_data_format_is_jsonl_or_parquet_and_another_word_names_the_field_and_line() {
        let pipeline: DataPipeline =
            serde_json::from_value(serde_json::json!({"source": "s3://b/p/", "format": "parquet"})).unwrap();
        assert_eq!(pipeline.format, Some(DataFormat::Parquet));
        assert_eq!(DataPipeline::default().format.unwrap_or_default(), DataFormat::Jsonl);
        for name in DataFormat::NAMES {
            assert_eq!(name.parse::<DataFormat>().unwrap().to_string(), name);
        }
        assert_eq!("csv".parse::<DataFormat>().unwrap_err(), r#"unknown dataset format "csv"; use jsonl or parquet"#);

        // The CRD lists the formats, so the API server refuses another word too.
        let schema = crate::crd::schema_of("HarnessTask").expect("schema");
        let format = &schema["properties"]["spec"]["properties"]["dataPipeline"]["properties"]["format"];
        assert_eq!(format["enum"], serde_json::json!(["jsonl", "parquet"]), "{format}");
        assert!(format["description"].as_str().is_some_and(|d| d.contains("parquet")), "{format}");

        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {name: t}\nspec:\n  \
                    dataPipeline:\n    source: s3://b/p/\n    format: csv\n  \
                    evaluation: {testSet: t.jsonl}\n  policy: {endpoint: 'http://x', model: m}\n";
        let (manifests, report) = crate::manifest::Manifests::parse("m.yaml", text);
        assert!(manifests.tasks.is_empty());
        let problem = &report.problems()[0];
        assert_eq!(problem.location, crate::problem::Location::line("m.yaml", 7));
        assert!(problem.message.starts_with("spec.dataPipeline.format: unknown variant `csv`"), "{problem}");
        assert!(problem.message.contains("jsonl") && problem.message.contains("parquet"), "{problem}");
    }

    #[test]
    fn shard_counts_sum_finished() {
        let counts = ShardCounts { total: 4, succeeded: 2, failed: 1, running: 1 };
        assert_eq!(counts.finished(), 3);
    }
}
