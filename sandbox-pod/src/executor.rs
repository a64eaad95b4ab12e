//! The tool execution layer: every tool call of an episode goes through
//! [`ToolExecutor::call`].
//!
//! For each call it takes the context snapshot (memory hash, plan step,
//! canonical argument hash), runs the tool under its timeout, swaps in the
//! tool's fallback when the tool fails or times out, applies the resulting
//! memory patch under the memory policy (null writes, strict types), and
//! returns the observation together with the trace records that describe
//! the call (`PlanStep` and one `MemoryDelta` per changed key). It writes
//! nothing itself, so the caller decides where records go and the executor
//! stays testable without files.
//!
//! [`MemoryGuard`] catches memory changes that no applied patch explains.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use basecamp_api::sandbox::JsonType;
use basecamp_trace::pb::{self, MemorySource, StepKind, StepStatus, record::Body};
use basecamp_trace::{
    Digest, Memory, MemoryDelta, MemoryPatch, PatchOp, canonical_json, hash_canonical_text, hash_json,
};
use serde_json::{Value, json};

use crate::deadline::Timer;
use crate::services::ServiceWatch;
use crate::tools::{Tool, ToolError, ToolOutput, json_type};

/// The timeout used when a tool has none configured.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_millis(800);

/// How long a call whose connection to a service was refused or reset waits
/// for that service's exit to show (`ToolExecutor::blame`). Spent only on
/// such a failure of a tool that calls a service still running.
pub const SERVICE_EXIT_GRACE: Duration = Duration::from_millis(50);

/// What to do when a patch writes JSON `null` into a memory key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NullWrites {
    Allow,
    /// Apply it, and say so in the outcome's warnings (and the trace).
    #[default]
    Warn,
    /// Refuse the null writes of the patch; the call is marked refused.
    Error,
}

/// A tool's stand-in answer when it fails or times out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fallback {
    pub observation: Value,
    pub memory_patch: MemoryPatch,
}

/// One tool as the executor runs it.
#[derive(Debug, Clone)]
pub struct ToolDef {
    pub tool: Tool,
    pub timeout: Duration,
    pub fallback: Option<Fallback>,
    /// Memory key -> JSON pointer into the tool's observation: after a
    /// successful call, each key is set to the value the pointer finds
    /// (the config's `memoryPatch`). A pointer that finds nothing writes
    /// nothing and is reported as a warning.
    pub memory_map: Vec<(String, String)>,
}

impl ToolDef {
    pub fn new(tool: Tool, timeout: Duration) -> Self {
        Self { tool, timeout, fallback: None, memory_map: Vec::new() }
    }
}

/// The executor: the sandbox's tools and its memory policy.
#[derive(Debug, Clone, Default)]
pub struct ToolExecutor {
    /// Every tool, shared by the episodes of a runner (a SandboxConfig may
    /// define thousands; an episode does not copy them).
    tools: Arc<BTreeMap<String, ToolDef>>,
    /// This episode's own copies of the recorded tools, each with its own
    /// place in its fixture's sequence ([`ToolExecutor::for_episode`]);
    /// found before `tools`.
    recorded: BTreeMap<String, ToolDef>,
    null_writes: NullWrites,
    /// Key -> JSON type name ("string", "number", "integer", "boolean", "object", "array").
    memory_types: BTreeMap<String, String>,
    /// What ends a call at its tool's timeout.
    timer: Timer,
    /// The services the tools call: a failed call to one that has exited
    /// says so ([`ToolError::ServiceExited`]).
    services: ServiceWatch,
}

/// A call the policy asked for. `arguments` is `Err(raw text)` when the
/// policy's arguments were not a JSON object (not JSON at all, or JSON of
/// another type): recorded, never executed.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    pub step: u32,
    pub call_id: &'a str,
    pub plan_label: &'a str,
    pub name: &'a str,
    pub arguments: Result<&'a Value, &'a str>,
}

/// Why a call did not produce the tool's own answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    #[error("tool {tool} {source}")]
    Tool { tool: String, source: ToolError },
    #[error("unknown tool {tool:?}; this sandbox defines: {available}")]
    UnknownTool { tool: String, available: String },
    /// `problem` says what is wrong with them: "are not valid JSON", or
    /// "must be a JSON object, got an array".
    #[error("the arguments for {tool} {problem}: {raw}")]
    InvalidArguments { tool: String, problem: String, raw: String },
    #[error("refused to write null into memory key(s) {keys} (memory.nullWrites is error)")]
    NullWriteRefused { keys: String },
    #[error("memory key `{key}` must hold {expected}, the patch from {origin} wrote {found}")]
    MemoryType { key: String, expected: String, found: &'static str, origin: String },
    #[error(
        "refused to write the empty memory key \"\" (the patch from {origin}); a memory key needs a name, e.g. \"eta\""
    )]
    EmptyMemoryKey { origin: String },
}

impl CallError {
    /// The trace's `error_type`, from a fixed set.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Tool { source, .. } => source.error_type(),
            Self::UnknownTool { .. } => "unknown_tool",
            Self::InvalidArguments { .. } => "invalid_arguments",
            Self::NullWriteRefused { .. } => "null_write_refused",
            Self::MemoryType { .. } => "memory_type",
            Self::EmptyMemoryKey { .. } => "memory_key",
        }
    }
}

/// The result of one call: what the policy sees next, and what the trace records.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    pub observation: Value,
    pub status: StepStatus,
    pub error: Option<CallError>,
    pub deltas: Vec<MemoryDelta>,
    /// Things worth a look that did not fail the call (null writes under `warn`).
    pub warnings: Vec<String>,
    pub plan_step: pb::PlanStep,
}

impl CallOutcome {
    /// The trace records of this call: the plan step, then its memory deltas.
    pub fn records(&self) -> impl Iterator<Item = Body> + '_ {
        std::iter::once(Body::PlanStep(Box::new(self.plan_step.clone())))
            .chain(self.deltas.iter().map(|d| Body::MemoryDelta(d.to_record())))
    }

    pub fn timed_out(&self) -> bool {
        matches!(&self.error, Some(CallError::Tool { source: ToolError::Timeout(_), .. }))
    }
}

impl ToolExecutor {
    pub fn new(null_writes: NullWrites) -> Self {
        Self { null_writes, ..Self::default() }
    }

    pub fn add_tool(&mut self, name: impl Into<String>, def: ToolDef) -> &mut Self {
        let name = name.into();
        self.recorded.remove(&name);
        Arc::make_mut(&mut self.tools).insert(name, def);
        self
    }

    /// The executor one episode calls through: the same tools and memory
    /// policy, with tool state of its own (where a recorded tool is in its
    /// sequence), so what an episode gets does not depend on what the
    /// episodes running beside it called.
    pub fn for_episode(&self) -> Self {
        let recorded = self
            .tools
            .iter()
            .filter(|(_, def)| matches!(def.tool, Tool::Recorded(_)))
            .map(|(name, def)| (name.clone(), ToolDef { tool: def.tool.for_episode(), ..def.clone() }))
            .collect();
        Self { recorded, ..self.clone() }
    }

    /// The same tools for another shard of a local run ([`Tool::for_shard`]):
    /// nothing is read or parsed again.
    pub fn for_shard(&self) -> Self {
        let tools =
            self.tools.iter().map(|(name, def)| (name.clone(), ToolDef { tool: def.tool.for_shard(), ..def.clone() }));
        Self { tools: Arc::new(tools.collect()), recorded: BTreeMap::new(), ..self.clone() }
    }

    /// Ends calls at their timeout with `timer` (default [`Timer::Precise`]).
    pub fn set_timer(&mut self, timer: Timer) -> &mut Self {
        self.timer = timer;
        self
    }

    /// Tells a failed call to a service that has exited by it (see
    /// [`crate::services::RunningServices::watch`]).
    pub fn watch_services(&mut self, services: ServiceWatch) -> &mut Self {
        self.services = services;
        self
    }

    /// Requires memory `key` to hold JSON of type `type_name` (strict types).
    pub fn require_memory_type(&mut self, key: impl Into<String>, type_name: impl Into<String>) -> &mut Self {
        self.memory_types.insert(key.into(), type_name.into());
        self
    }

    pub fn tool(&self, name: &str) -> Option<&ToolDef> {
        self.recorded.get(name).or_else(|| self.tools.get(name))
    }

    /// `error` of a call to `tool`, or [`ToolError::ServiceExited`] when a
    /// service the tool calls has exited: the call failed because the
    /// sandbox broke. A connection refused or reset waits a moment
    /// ([`SERVICE_EXIT_GRACE`]) for the exit of a service that crashed on
    /// this call.
    async fn blame(&self, tool: &str, error: ToolError) -> ToolError {
        if !self.services.calls_a_service(tool) || !error.may_be_a_dead_service() {
            return error;
        }
        let grace = if matches!(error, ToolError::Transport(_)) { SERVICE_EXIT_GRACE } else { Duration::ZERO };
        match self.services.exited_for(tool, grace).await {
            Some(exit) => ToolError::ServiceExited {
                service: exit.service,
                status: exit.status,
                log: exit.log.display().to_string(),
                cause: Box::new(error),
            },
            None => error,
        }
    }

    /// The tool names for a message: the first 20, then how many more.
    fn tool_list(&self) -> String {
        const SHOWN: usize = 20;
        let mut list = self.tools.keys().take(SHOWN).map(String::as_str).collect::<Vec<_>>().join(", ");
        if self.tools.len() > SHOWN {
            list.push_str(&format!(" and {} more", self.tools.len() - SHOWN));
        }
        list
    }

    pub fn tool_names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// The timeout that applies to `tool`.
    pub fn tool_timeout_for(&self, tool: &str) -> Duration {
        self.tool(tool).map_or(DEFAULT_TOOL_TIMEOUT, |d| d.timeout)
    }

    /// Runs one call against `memory`. Never fails: every problem becomes a
    /// recorded, explained outcome.
    pub async fn call(&self, call: ToolCall<'_>, memory: &mut Memory) -> CallOutcome {
        let started_wall = SystemTime::now();
        let started = Instant::now();
        let memory_before = memory.hash();
        let (arguments_json, input_hash) = arguments_json_and_hash(call.arguments);
        let def = self.tool(call.name);
        let timeout = def.map_or(Duration::ZERO, |d| d.timeout);

        // Requests an HTTP tool sent again, counted as they go out: a call its
        // timeout cut off still says how many.
        let sent_again = AtomicU32::new(0);
        let result: Result<ToolOutput, CallError> = match (def, call.arguments) {
            (None, _) => Err(CallError::UnknownTool { tool: call.name.to_string(), available: self.tool_list() }),
            (Some(_), Err(raw)) => Err(CallError::InvalidArguments {
                tool: call.name.to_string(),
                problem: arguments_problem(raw),
                raw: raw.chars().take(200).collect(),
            }),
            (Some(def), Ok(args)) => {
                let deadline = Instant::now() + def.timeout;
                let call_until = def.tool.call_until(call.name, args, Some(deadline), &sent_again);
                match self.timer.timeout(def.timeout, call_until).await {
                    Ok(Ok(output)) => Ok(output),
                    Ok(Err(source)) => Err(CallError::Tool { tool: call.name.to_string(), source }),
                    Err(_) => Err(CallError::Tool {
                        tool: call.name.to_string(),
                        source: ToolError::Timeout(def.timeout.as_millis() as u64),
                    }),
                }
            }
        };
        let latency = started.elapsed();
        let result = match result {
            Err(CallError::Tool { tool, source }) => {
                Err(CallError::Tool { source: self.blame(&tool, source).await, tool })
            }
            other => other,
        };

        let retries = sent_again.load(Ordering::Relaxed);
        let (mut status, observation, patch, source, response_bytes, mut error) = match result {
            Ok(out) => {
                (StepStatus::Ok, out.observation, out.memory_patch, MemorySource::Tool, out.response_bytes, None)
            }
            Err(err) => {
                let failed_status = match &err {
                    CallError::Tool { source: ToolError::Timeout(_), .. } => StepStatus::Timeout,
                    CallError::UnknownTool { .. } | CallError::InvalidArguments { .. } => StepStatus::Refused,
                    _ => StepStatus::Error,
                };
                let fallback = match &err {
                    CallError::Tool { .. } => def.and_then(|d| d.fallback.as_ref()),
                    _ => None,
                };
                match fallback {
                    Some(fb) => (
                        StepStatus::Fallback,
                        fb.observation.clone(),
                        fb.memory_patch.clone(),
                        MemorySource::Fallback,
                        0,
                        Some(err),
                    ),
                    None => {
                        let obs = json!({"error": err.to_string(), "error_type": err.error_type()});
                        (failed_status, obs, MemoryPatch::default(), MemorySource::Tool, 0, Some(err))
                    }
                }
            }
        };

        let mut warnings = Vec::new();
        let mut patch = patch;
        if status == StepStatus::Ok
            && let Some(def) = def
        {
            for (key, pointer) in &def.memory_map {
                match observation.pointer(pointer) {
                    Some(value) => patch.ops.push(PatchOp::Set { key: key.clone(), value: value.clone() }),
                    None => warnings.push(format!(
                        "{}'s result has nothing at {pointer} for memory key {key}; memory key left unchanged",
                        call.name
                    )),
                }
            }
        }
        let (patch, refused) = self.police_patch(patch, call.name, source, &mut warnings, &mut error, &mut status);
        let deltas = memory.apply(&patch, source, call.name);
        let memory_after = memory.hash();
        let observation_json = canonical_json(&observation);
        let (error_type, error_message) = match &error {
            // A failed call's own message says why its retries stopped; a timeout cannot.
            Some(e @ CallError::Tool { source: ToolError::Timeout(_), .. }) if retries > 0 => {
                (e.error_type().to_string(), format!("{e} (after {retries} request(s) sent again)"))
            }
            Some(e) => (e.error_type().to_string(), e.to_string()),
            None => (String::new(), warnings.join("; ")),
        };
        let plan_step = pb::PlanStep {
            index: call.step,
            kind: StepKind::ToolCall as i32,
            plan_label: call.plan_label.to_string(),
            tool: call.name.to_string(),
            call_id: call.call_id.to_string(),
            arguments_json,
            input_hash: input_hash.0.to_vec(),
            result_hash: hash_canonical_text(&observation_json).0.to_vec(),
            response_bytes: if response_bytes > 0 { response_bytes } else { observation_json.len() as u64 },
            observation_json,
            status: status as i32,
            error_type,
            error_message,
            fallback_used: status == StepStatus::Fallback,
            memory_hash_before: memory_before.0.to_vec(),
            memory_hash_after: memory_after.0.to_vec(),
            start_unix_nanos: unix_nanos(started_wall),
            latency_micros: latency.as_micros() as u64,
            timeout_ms: timeout.as_millis() as u64,
            refused_memory_json: refused.into_iter().map(|(key, value)| (key, canonical_json(&value))).collect(),
            retries,
        };
        CallOutcome { observation, status, error, deltas, warnings, plan_step }
    }

    /// Applies the memory policy to a patch before it touches memory: the
    /// writes it lets through, and those it refused (for the plan step's
    /// record).
    fn police_patch(
        &self,
        mut patch: MemoryPatch,
        origin: &str,
        source: MemorySource,
        warnings: &mut Vec<String>,
        error: &mut Option<CallError>,
        status: &mut StepStatus,
    ) -> (MemoryPatch, BTreeMap<String, Value>) {
        let mut refused = BTreeMap::new();
        // A key "" is no key: nothing could read it back by name, and its delta names no key.
        let who = || if source == MemorySource::Fallback { format!("the fallback of {origin}") } else { origin.into() };
        let before = patch.ops.len();
        patch.ops.retain(|op| match op {
            PatchOp::Set { key, value } if key.is_empty() => {
                refused.insert(String::new(), value.clone());
                false
            }
            _ => true,
        });
        if patch.ops.len() < before {
            error.get_or_insert(CallError::EmptyMemoryKey { origin: who() });
            *status = StepStatus::Refused;
        }
        let null_keys: Vec<&str> = patch
            .ops
            .iter()
            .filter_map(|op| match op {
                PatchOp::Set { key, value: Value::Null } => Some(key.as_str()),
                _ => None,
            })
            .collect();
        if !null_keys.is_empty() {
            match self.null_writes {
                NullWrites::Allow => {}
                NullWrites::Warn => {
                    warnings.push(format!("{} wrote null into memory key(s) {}", who(), null_keys.join(", ")))
                }
                NullWrites::Error => {
                    let keys = null_keys.join(", ");
                    patch.ops.retain(|op| match op {
                        PatchOp::Set { key, value: Value::Null } => {
                            refused.insert(key.clone(), Value::Null);
                            false
                        }
                        _ => true,
                    });
                    error.get_or_insert(CallError::NullWriteRefused { keys });
                    *status = StepStatus::Refused;
                }
            }
        }
        if !self.memory_types.is_empty() {
            let mut type_error = None;
            patch.ops.retain_mut(|op| {
                let PatchOp::Set { key, value } = op else { return true };
                let Some(expected) = self.memory_types.get(key) else { return true };
                if value_has_type(value, expected) || (value.is_null() && self.null_writes != NullWrites::Error) {
                    // 2.0 in an integer key is kept as 2: what the schema says, and what the trace records.
                    if expected == "integer"
                        && let Some(whole) = value.as_f64().filter(|_| value.is_f64())
                    {
                        *value = Value::from(whole as i64);
                    }
                    return true;
                }
                type_error.get_or_insert(CallError::MemoryType {
                    key: key.clone(),
                    expected: expected.clone(),
                    found: json_type(value),
                    origin: origin.to_string(),
                });
                refused.insert(key.clone(), value.clone());
                false
            });
            if let Some(e) = type_error {
                error.get_or_insert(e);
                *status = StepStatus::Refused;
            }
        }
        (patch, refused)
    }
}

/// A call's `arguments_json` and `input_hash` as its plan step records
/// them: the canonical JSON of the arguments and its sha256 — for arguments
/// that are JSON but not an object (`[1, 2]`) too, as `trace validate`
/// checks them — or, for a text that is not JSON at all, the raw text and
/// the hash of it as a JSON string. Also used for a call the plan step's
/// timeout cut off, so that its record can be compared with the same
/// call's elsewhere.
pub fn arguments_json_and_hash(arguments: Result<&Value, &str>) -> (String, Digest) {
    let canonical = |v: &Value| {
        let text = canonical_json(v);
        let hash = hash_canonical_text(&text);
        (text, hash)
    };
    match arguments {
        Ok(v) => canonical(v),
        Err(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(v) => canonical(&v),
            Err(_) => (raw.to_string(), hash_json(&Value::String(raw.to_string()))),
        },
    }
}

/// What is wrong with arguments that are not a JSON object: `[1]` is JSON,
/// so "not valid JSON" would send the model looking for a syntax error.
fn arguments_problem(raw: &str) -> String {
    match serde_json::from_str::<Value>(raw) {
        Ok(value) => format!("must be a JSON object, got {}", json_type(&value)),
        Err(_) => "are not valid JSON".to_string(),
    }
}

fn value_has_type(value: &Value, type_name: &str) -> bool {
    match type_name {
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => JsonType::Integer.matches(value),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        _ => true,
    }
}

pub(crate) fn unix_nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Detects memory changes that no applied patch explains: after every
/// sanctioned change the guard learns the new hash; any other change shows
/// up as a mismatch at the next check.
#[derive(Debug, Clone)]
pub struct MemoryGuard {
    expected: Digest,
}

/// `MEMORY CORRUPTION diff_hash_mismatch expected=… actual=…`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("MEMORY CORRUPTION diff_hash_mismatch expected={expected} actual={actual} (changed keys: {keys})")]
pub struct MemoryCorruption {
    pub expected: String,
    pub actual: String,
    pub keys: String,
}

impl MemoryGuard {
    pub fn new(memory: &mut Memory) -> Self {
        Self { expected: memory.hash() }
    }

    /// Records a sanctioned change (the executor's `memory_hash_after`).
    pub fn accept(&mut self, memory: &mut Memory) {
        self.expected = memory.hash();
    }

    /// Fails when memory changed since the last accepted state. `last_known`
    /// (the memory at that state) lets the error name the keys that changed.
    pub fn check(&self, memory: &mut Memory, last_known: Option<&Memory>) -> Result<(), MemoryCorruption> {
        let actual = memory.hash();
        if actual == self.expected {
            return Ok(());
        }
        let keys = last_known
            .map(|known| known.diff(memory).iter().map(|(k, _, _)| *k).collect::<Vec<_>>().join(", "))
            .unwrap_or_else(|| "unknown".into());
        Err(MemoryCorruption { expected: self.expected.short(), actual: actual.short(), keys })
    }
}
