//! One episode: the agent loop between the policy and the tool executor,
//! written to a `.trace` as it runs.
//!
//! Per plan step: check memory against the guard, deliver due injections,
//! ask the policy, record its turn and logits, run each tool call through
//! the executor under the plan-step deadline, then either accept the step as
//! the new stable checkpoint or — when the deadline passed — roll memory
//! back to the last checkpoint and write `rollback_trace.json`. The frame is
//! closed at the end of every step, so a killed process leaves every
//! finished step readable. Metrics and the reward are computed at the end.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use basecamp_trace::metrics::{
    ActualCall, EpisodeMetrics, EpisodeObservation, ExpectedCall, MemoryExpectation, score_episode,
};
use basecamp_trace::pb::{
    self, EpisodeEnd, ErrorContext, Header, InjectionTrigger, MemorySource, Outcome, StepKind, StepStatus, ToolPayload,
    record::Body,
};
use basecamp_trace::{Memory, MemoryPatch, TraceWriter, canonical_json, hash_json};
use serde::Serialize;
use serde_json::{Value, json};

use crate::executor::{MemoryGuard, ToolCall, ToolExecutor, unix_nanos};
use crate::policy::{ChatMessage, Policy, PolicyRequest, PolicyResponse, ToolArguments, ToolSpec};
use crate::rewards::RewardCalculator;

/// When a scheduled injection fires.
#[derive(Debug, Clone, PartialEq)]
pub enum InjectionWhen {
    AtStep(u32),
    AfterTool(String),
    MemoryEquals { key: String, value: Value },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledInjection {
    pub id: String,
    pub when: InjectionWhen,
    pub observation: Value,
    pub description: String,
}

/// An observation pushed from outside while episodes run
/// (`basecamp sandbox inject`), for one episode, optionally at a given step.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveInjection {
    pub id: String,
    pub observation: Value,
    pub at_step: Option<u32>,
}

/// Live injections waiting for their episode, shared with the HTTP endpoint.
#[derive(Debug, Clone, Default)]
pub struct LiveInjections(Arc<Mutex<BTreeMap<String, VecDeque<LiveInjection>>>>);

impl LiveInjections {
    pub fn push(&self, episode: &str, injection: LiveInjection) {
        let mut queues = self.0.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(episode.to_string()).or_default().push_back(injection);
    }

    /// Removes and returns the injections due at `step`.
    fn take_due(&self, episode: &str, step: u32) -> Vec<LiveInjection> {
        let mut queues = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(queue) = queues.get_mut(episode) else { return Vec::new() };
        let (due, later): (Vec<_>, Vec<_>) = queue.drain(..).partition(|i| i.at_step.is_none_or(|s| s <= step));
        queue.extend(later);
        due
    }
}

/// Everything about running episodes that does not change between them.
#[derive(Debug)]
pub struct EpisodeRunner {
    pub executor: ToolExecutor,
    pub policy: Policy,
    pub tools: Vec<ToolSpec>,
    pub system_prompt: Option<String>,
    pub max_steps: u32,
    pub plan_step_timeout: Duration,
    pub rollback_enabled: bool,
    pub snapshot_interval: u32,
    pub error_context: bool,
    pub injections: Vec<ScheduledInjection>,
    pub rewards: Option<RewardCalculator>,
    /// Reward component -> the metric that scores it (the component's own name when absent).
    pub reward_sources: BTreeMap<String, String>,
    pub training_step: u64,
    /// Header fields shared by every episode (task, variant, shard, config hash, versions).
    pub header: Header,
    pub live: LiveInjections,
    /// Where tool calls, injections and episodes are counted for `/metrics`.
    pub metrics: Option<Arc<crate::metrics::SandboxMetrics>>,
}

/// An expected tool call: name, arguments, and the argument names compared (all when `None`).
pub type ExpectedCallSpec = (String, serde_json::Map<String, Value>, Option<Vec<String>>);

/// One test-set row, as the runner needs it.
#[derive(Debug, Clone, Default)]
pub struct EpisodeInput {
    pub id: String,
    pub messages: Vec<ChatMessage>,
    pub initial_memory: serde_json::Map<String, Value>,
    pub expected_calls: Vec<ExpectedCallSpec>,
    pub expected_memory: Option<serde_json::Map<String, Value>>,
    pub expected_memory_hash: Option<String>,
}

/// What an episode produced.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeResult {
    pub id: String,
    pub outcome: String,
    pub metrics: EpisodeMetrics,
    /// A bounded failure class for reports: `ok`, or the first error type seen.
    pub failure_class: String,
    pub trace_file: String,
    pub rollbacks: u32,
    pub warnings: Vec<String>,
    /// Why the episode stopped early, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A plan-step timeout's evidence, written next to the trace.
#[derive(Debug, Clone, Serialize)]
struct RollbackTrace {
    episode: String,
    step: u32,
    plan_step_timeout_ms: u64,
    triggering_observation: Value,
    /// key -> {before, after}: the step's changes that were undone.
    modified_keys: BTreeMap<String, Value>,
    /// The last (up to) 10 tokens of the policy with their top-k alternatives.
    last_tokens: Vec<Value>,
}

struct StepState {
    calls: Vec<(String, Option<Value>, bool)>,
    payloads: VecDeque<ToolPayload>,
    last_tokens: VecDeque<pb::TokenLogit>,
    warnings: Vec<String>,
    first_error: Option<String>,
    rollbacks: u32,
    rollback_traces: Vec<RollbackTrace>,
}

impl EpisodeRunner {
    /// Runs one episode, writing `<dir>/<id>.trace`. Failures inside the
    /// episode are recorded and end it; only an unwritable trace is an `Err`.
    pub async fn run(&self, input: &EpisodeInput, dir: &Path) -> std::io::Result<EpisodeResult> {
        let started = Instant::now();
        let trace_path = dir.join(format!("{}.trace", file_safe(&input.id)));
        let mut header = self.header.clone();
        header.episode_id = input.id.clone();
        header.start_time_unix_nanos = unix_nanos(SystemTime::now());
        header.training_step = self.training_step;
        header.top_k = self.policy.top_k();
        let mut writer = TraceWriter::create(&trace_path, header)?;

        let mut memory = Memory::new();
        for delta in memory.apply(&MemoryPatch::from_object(&input.initial_memory), MemorySource::Initial, "test_set") {
            writer.append(0, Body::MemoryDelta(delta.to_record()))?;
        }
        writer.end_step()?;

        let mut guard = MemoryGuard::new(&mut memory);
        let mut checkpoint = memory.clone();
        let mut messages: Vec<ChatMessage> = self.system_prompt.iter().map(ChatMessage::system).collect();
        messages.extend(input.messages.iter().cloned());
        let mut fired: Vec<bool> = vec![false; self.injections.len()];
        let mut state = StepState {
            calls: Vec::new(),
            payloads: VecDeque::new(),
            last_tokens: VecDeque::new(),
            warnings: Vec::new(),
            first_error: None,
            rollbacks: 0,
            rollback_traces: Vec::new(),
        };
        let mut outcome = Outcome::MaxSteps;
        let mut final_answer = String::new();
        let mut stop_error: Option<String> = None;
        let mut steps_run = 0;

        for step in 1..=self.max_steps {
            steps_run = step;
            if let Err(corruption) = guard.check(&mut memory, Some(&checkpoint)) {
                let msg = corruption.to_string();
                self.record_error(&mut writer, step, "memory_corruption", &msg, vec![], &mut memory, &state)?;
                state.first_error.get_or_insert("memory_corruption".into());
                stop_error = Some(msg);
                outcome = Outcome::Error;
                break;
            }
            let deadline = tokio::time::Instant::now() + self.plan_step_timeout;

            // Injections due before the policy's turn.
            for (i, inj) in self.injections.iter().enumerate() {
                if !fired[i] && inj.when == InjectionWhen::AtStep(step) {
                    fired[i] = true;
                    inject(
                        self.metrics.as_deref(),
                        &mut writer,
                        &mut messages,
                        step,
                        &inj.id,
                        InjectionTrigger::AtStep,
                        &inj.observation,
                        &inj.description,
                    )?;
                }
            }
            for live in self.live.take_due(&input.id, step) {
                inject(
                    self.metrics.as_deref(),
                    &mut writer,
                    &mut messages,
                    step,
                    &live.id,
                    InjectionTrigger::Live,
                    &live.observation,
                    "live",
                )?;
            }

            let request = PolicyRequest::new(input.id.clone(), step - 1, messages.clone(), self.tools.clone());
            let response = match tokio::time::timeout_at(deadline, self.policy.respond(&request)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    if let Some(metrics) = &self.metrics {
                        metrics.observe_policy_error(e.category());
                    }
                    let msg = format!("policy failed: {e}");
                    self.record_error(&mut writer, step, e.category(), &msg, vec![], &mut memory, &state)?;
                    state.first_error.get_or_insert("policy_error".into());
                    stop_error = Some(msg);
                    outcome = Outcome::Error;
                    break;
                }
                Err(_) => {
                    let msg = format!(
                        "the policy did not answer within the plan-step timeout of {:?}",
                        self.plan_step_timeout
                    );
                    self.record_error(&mut writer, step, "plan_step_timeout", &msg, vec![], &mut memory, &state)?;
                    state.first_error.get_or_insert("plan_step_timeout".into());
                    stop_error = Some(msg);
                    outcome = Outcome::Error;
                    break;
                }
            };
            self.record_policy_turn(&mut writer, step, &response, &mut state)?;
            messages.push(response.to_assistant_message());

            if response.is_final() {
                final_answer = response.content.clone().unwrap_or_default();
                let answer = Value::String(final_answer.clone());
                let hash = memory.hash();
                writer.append(
                    step,
                    Body::PlanStep(pb::PlanStep {
                        index: step,
                        kind: StepKind::FinalAnswer as i32,
                        observation_json: canonical_json(&answer),
                        result_hash: hash_json(&answer).0.to_vec(),
                        status: StepStatus::Ok as i32,
                        memory_hash_before: hash.0.to_vec(),
                        memory_hash_after: hash.0.to_vec(),
                        start_unix_nanos: unix_nanos(SystemTime::now()),
                        ..Default::default()
                    }),
                )?;
                writer.end_step()?;
                outcome = Outcome::Completed;
                break;
            }

            let mut step_deadline_hit: Option<Value> = None;
            for call in &response.tool_calls {
                let arguments = match &call.arguments {
                    ToolArguments::Parsed(v) => Ok(v),
                    ToolArguments::Invalid(bad) => Err(bad.raw.as_str()),
                };
                let tool_call = ToolCall { step, call_id: &call.id, plan_label: "", name: &call.name, arguments };
                let result = tokio::time::timeout_at(deadline, self.executor.call(tool_call, &mut memory)).await;
                let Ok(outcome_of_call) = result else {
                    // The plan step ran out of time inside this call: the call is abandoned.
                    let observation = json!({"error": format!("plan step timed out after {} ms", self.plan_step_timeout.as_millis()), "tool": call.name});
                    let hash = memory.hash();
                    writer.append(
                        step,
                        Body::PlanStep(pb::PlanStep {
                            index: step,
                            kind: StepKind::ToolCall as i32,
                            tool: call.name.clone(),
                            call_id: call.id.clone(),
                            arguments_json: call.arguments.to_json_text(),
                            status: StepStatus::RolledBack as i32,
                            error_type: "plan_step_timeout".into(),
                            error_message: format!("plan step exceeded {} ms", self.plan_step_timeout.as_millis()),
                            memory_hash_before: hash.0.to_vec(),
                            memory_hash_after: hash.0.to_vec(),
                            observation_json: canonical_json(&observation),
                            timeout_ms: self.plan_step_timeout.as_millis() as u64,
                            ..Default::default()
                        }),
                    )?;
                    state.calls.push((call.name.clone(), call.arguments.as_value().cloned(), true));
                    step_deadline_hit = Some(observation);
                    break;
                };
                if let Some(metrics) = &self.metrics {
                    metrics.observe_call(&outcome_of_call);
                }
                for body in outcome_of_call.records() {
                    writer.append(step, body)?;
                }
                guard.accept(&mut memory);
                state.warnings.extend(outcome_of_call.warnings.iter().cloned());
                let failed = outcome_of_call.status != StepStatus::Ok;
                state.calls.push((call.name.clone(), call.arguments.as_value().cloned(), failed));
                state.payloads.push_back(ToolPayload {
                    tool: call.name.clone(),
                    arguments_json: outcome_of_call.plan_step.arguments_json.clone(),
                    response_json: outcome_of_call.plan_step.observation_json.clone(),
                    status: outcome_of_call.status as i32,
                });
                if state.payloads.len() > 3 {
                    state.payloads.pop_front();
                }
                if let Some(err) = &outcome_of_call.error {
                    state.first_error.get_or_insert_with(|| err.error_type().to_string());
                    if self.error_context {
                        self.record_error(
                            &mut writer,
                            step,
                            err.error_type(),
                            &err.to_string(),
                            cause_chain(err),
                            &mut memory,
                            &state,
                        )?;
                    }
                }
                messages.push(ChatMessage::tool(call.id.clone(), outcome_of_call.plan_step.observation_json.clone()));

                for (i, inj) in self.injections.iter().enumerate() {
                    let due = match &inj.when {
                        InjectionWhen::AfterTool(tool) => *tool == call.name,
                        InjectionWhen::MemoryEquals { key, value } => memory.get(key) == Some(value),
                        InjectionWhen::AtStep(_) => false,
                    };
                    if !fired[i] && due {
                        fired[i] = true;
                        let trigger = match inj.when {
                            InjectionWhen::AfterTool(_) => InjectionTrigger::AfterTool,
                            _ => InjectionTrigger::MemoryMatch,
                        };
                        inject(
                            self.metrics.as_deref(),
                            &mut writer,
                            &mut messages,
                            step,
                            &inj.id,
                            trigger,
                            &inj.observation,
                            &inj.description,
                        )?;
                    }
                }
            }

            if let Some(observation) = step_deadline_hit {
                state.first_error.get_or_insert("plan_step_timeout".into());
                if self.rollback_enabled {
                    self.roll_back(&mut writer, step, &mut memory, &checkpoint, observation, input, &mut state)?;
                    guard.accept(&mut memory);
                }
            } else {
                checkpoint = memory.clone();
            }
            if self.snapshot_interval > 0 && step % self.snapshot_interval == 0 {
                writer.append(step, Body::MemorySnapshot(memory.to_snapshot()))?;
            }
            writer.end_step()?;
        }

        let resolution_time_s = started.elapsed().as_secs_f64();
        let expected: Vec<ExpectedCall<'_>> = input
            .expected_calls
            .iter()
            .map(|(name, arguments, compare)| ExpectedCall { name, arguments, compare_args: compare.as_deref() })
            .collect();
        let actual: Vec<ActualCall<'_>> = state
            .calls
            .iter()
            .map(|(name, args, failed)| ActualCall { name, arguments: args.as_ref(), failed: *failed })
            .collect();
        let final_memory = match memory.to_value() {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let memory_hash = memory.hash().to_string();
        let memory_expectation = match (&input.expected_memory, &input.expected_memory_hash) {
            (Some(values), _) => MemoryExpectation::Values(values),
            (None, Some(hash)) => MemoryExpectation::Hash(hash),
            (None, None) => MemoryExpectation::None,
        };
        let mut metrics = score_episode(&EpisodeObservation {
            expected: &expected,
            actual: &actual,
            memory_expectation,
            final_memory: &final_memory,
            final_memory_hash_hex: &memory_hash,
            resolution_time_s,
            reward: None,
            steps: steps_run,
        });
        if let Some(calculator) = &self.rewards {
            let scores = reward_scores(calculator, &self.reward_sources, &metrics, outcome, self.max_steps);
            match calculator.signal(self.training_step, &scores) {
                Ok(signal) => {
                    metrics.reward = Some(signal.weighted_sum);
                    writer.append(steps_run, Body::RewardSignal(signal))?;
                }
                Err(e) => state.warnings.push(format!("reward not computed: {e}")),
            }
        }
        writer.finish(EpisodeEnd {
            outcome: outcome as i32,
            end_time_unix_nanos: unix_nanos(SystemTime::now()),
            steps: steps_run,
            final_memory_hash: memory.hash().0.to_vec(),
            final_answer,
        })?;
        if !state.rollback_traces.is_empty() {
            let path = rollback_path(&trace_path);
            let text = serde_json::to_vec_pretty(&state.rollback_traces).expect("rollback traces serialize");
            std::fs::write(&path, text)?;
        }
        let failure_class = failure_class(&state, &metrics);
        Ok(EpisodeResult {
            id: input.id.clone(),
            outcome: outcome_name(outcome).into(),
            metrics,
            failure_class,
            trace_file: trace_path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
            rollbacks: state.rollbacks,
            warnings: state.warnings,
            error: stop_error,
        })
    }

    fn record_policy_turn<W: std::io::Write>(
        &self,
        writer: &mut TraceWriter<W>,
        step: u32,
        response: &PolicyResponse,
        state: &mut StepState,
    ) -> std::io::Result<()> {
        writer.append(step, Body::PolicyTurn(response.to_policy_turn()))?;
        if response.logprobs_missing() {
            state.warnings.push(format!("step {step}: the policy's tool-call turn came back without logprobs"));
        }
        for logit in response.token_logits() {
            state.last_tokens.push_back(logit.clone());
            if state.last_tokens.len() > 10 {
                state.last_tokens.pop_front();
            }
            writer.append(step, Body::TokenLogit(logit))?;
        }
        state.warnings.extend(response.warnings.iter().map(|w| format!("step {step}: {w}")));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn record_error<W: std::io::Write>(
        &self,
        writer: &mut TraceWriter<W>,
        step: u32,
        error_type: &str,
        message: &str,
        cause_chain: Vec<String>,
        memory: &mut Memory,
        state: &StepState,
    ) -> std::io::Result<()> {
        writer.append(
            step,
            Body::ErrorContext(ErrorContext {
                error_type: error_type.to_string(),
                message: message.to_string(),
                cause_chain,
                stack: String::new(),
                memory_snapshot_json: memory.entries().map(|(k, v)| (k.clone(), canonical_json(v))).collect(),
                last_tool_payloads: state.payloads.iter().cloned().collect(),
            }),
        )?;
        writer.end_step()
    }

    #[allow(clippy::too_many_arguments)]
    fn roll_back<W: std::io::Write>(
        &self,
        writer: &mut TraceWriter<W>,
        step: u32,
        memory: &mut Memory,
        checkpoint: &Memory,
        observation: Value,
        input: &EpisodeInput,
        state: &mut StepState,
    ) -> std::io::Result<()> {
        let mut modified = BTreeMap::new();
        let mut patch = MemoryPatch::default();
        for (key, now, before) in memory.diff(checkpoint) {
            modified.insert(key.to_string(), json!({"before": before, "after": now}));
            patch = match before {
                Some(v) => patch.set(key, v.clone()),
                None => patch.remove(key),
            };
        }
        for delta in memory.apply(&patch, MemorySource::Rollback, "plan_step_timeout") {
            writer.append(step, Body::MemoryDelta(delta.to_record()))?;
        }
        state.rollbacks += 1;
        state.rollback_traces.push(RollbackTrace {
            episode: input.id.clone(),
            step,
            plan_step_timeout_ms: self.plan_step_timeout.as_millis() as u64,
            triggering_observation: observation,
            modified_keys: modified,
            last_tokens: state
                .last_tokens
                .iter()
                .map(|t| {
                    json!({"position": t.position, "token": t.token, "token_id": t.token_id, "logprob": t.logprob,
                           "top": t.top_tokens.iter().zip(&t.top_logprobs).zip(&t.top_ids)
                               .map(|((tok, lp), id)| json!({"token": tok, "logprob": lp, "id": id})).collect::<Vec<_>>()})
                })
                .collect(),
        });
        Ok(())
    }
}

/// The bounded class a report groups failures by: the first error seen,
/// else what the metrics say went wrong, else `ok`.
fn failure_class(state: &StepState, metrics: &EpisodeMetrics) -> String {
    if let Some(first) = &state.first_error {
        return first.clone();
    }
    if metrics.tool_call_accuracy < 1.0 {
        return "wrong_tool_calls".into();
    }
    if metrics.memory_consistency.is_some_and(|m| m < 1.0) {
        return "memory_mismatch".into();
    }
    "ok".into()
}

#[allow(clippy::too_many_arguments)]
fn inject<W: std::io::Write>(
    metrics: Option<&crate::metrics::SandboxMetrics>,
    writer: &mut TraceWriter<W>,
    messages: &mut Vec<ChatMessage>,
    step: u32,
    id: &str,
    trigger: InjectionTrigger,
    observation: &Value,
    description: &str,
) -> std::io::Result<()> {
    if let Some(metrics) = metrics {
        metrics.observe_injection(trigger);
    }
    writer.append(
        step,
        Body::Injection(pb::Injection {
            id: id.to_string(),
            trigger: trigger as i32,
            observation_json: canonical_json(observation),
            description: description.to_string(),
        }),
    )?;
    let text = match observation {
        Value::String(s) => s.clone(),
        other => canonical_json(other),
    };
    messages.push(ChatMessage::user(format!("[injected observation {id}] {text}")));
    Ok(())
}

fn cause_chain(err: &crate::executor::CallError) -> Vec<String> {
    let mut chain = vec![err.to_string()];
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        chain.push(s.to_string());
        source = s.source();
    }
    chain
}

/// Scores for the configured reward components, each from the metric its
/// `source` names (the component's own name by default).
fn reward_scores(
    calculator: &RewardCalculator,
    sources: &BTreeMap<String, String>,
    m: &EpisodeMetrics,
    outcome: Outcome,
    max_steps: u32,
) -> BTreeMap<String, f64> {
    calculator
        .component_names()
        .map(|name| {
            let source = sources.get(name).map_or(name, String::as_str);
            (name.to_string(), metric_score(source, m, outcome, max_steps).unwrap_or(0.0))
        })
        .collect()
}

/// The value of a reward source for one episode; `None` for an unknown source.
pub fn metric_score(source: &str, m: &EpisodeMetrics, outcome: Outcome, max_steps: u32) -> Option<f64> {
    Some(match source {
        "tool_call_accuracy" => m.tool_call_accuracy,
        "tool_call_accuracy_lenient" => m.tool_call_accuracy_lenient,
        "plan_step_f1" => m.plan_step_f1,
        "memory_consistency" => m.memory_consistency.unwrap_or(0.0),
        "error_rate" => m.error_rate,
        "steps" => f64::from(m.steps),
        "resolution_time" => m.resolution_time_s,
        "efficiency_penalty" => -f64::from(m.steps) / f64::from(max_steps.max(1)),
        "success" | "task_success" => f64::from(u8::from(outcome == Outcome::Completed)),
        _ => return None,
    })
}

/// Reward sources the runner can score.
pub const REWARD_SOURCES: [&str; 10] = [
    "tool_call_accuracy",
    "tool_call_accuracy_lenient",
    "plan_step_f1",
    "memory_consistency",
    "error_rate",
    "steps",
    "resolution_time",
    "efficiency_penalty",
    "success",
    "task_success",
];

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Completed => "completed",
        Outcome::MaxSteps => "max_steps",
        Outcome::Error => "error",
        Outcome::Cancelled => "cancelled",
        Outcome::Unspecified => "unspecified",
    }
}

/// `<trace stem>.rollback_trace.json`, next to the trace.
pub fn rollback_path(trace: &Path) -> PathBuf {
    let stem = trace.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    trace.with_file_name(format!("{stem}.rollback_trace.json"))
}

/// An episode id as a file name: path separators and odd characters replaced.
pub fn file_safe(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}
