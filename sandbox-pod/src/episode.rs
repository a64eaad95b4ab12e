//! One episode: the agent loop between the policy and the tool executor,
//! written to a `.trace` as it runs.
//!
//! An [`Episode`] is a step machine: [`EpisodeRunner::start`] writes the
//! header and initial memory; per plan step [`Episode::advance`] checks
//! memory against the guard and delivers due injections, then
//! [`Episode::act`] records the policy's turn and logits, runs each tool
//! call through the executor under the plan-step deadline, and either
//! accepts the step as the new stable checkpoint or — when the deadline
//! passed — rolls memory back to the last checkpoint; [`Episode::finish`]
//! computes metrics and the reward and closes the trace (with
//! `rollback_trace.json` next to it after a rollback). The frame is closed
//! at the end of every step, so a killed process leaves every finished step
//! readable. Driver mode ([`EpisodeRunner::run`]) asks the policy between
//! `advance` and `act`; server mode ([`crate::gym`]) takes the answer from
//! an external trainer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use basecamp_trace::metrics::{
    ActualCall, EpisodeMetrics, EpisodeObservation, ExpectedCall, MemoryExpectation, POLICY_ERROR, measures_the_agent,
    score_episode,
};
use basecamp_trace::pb::{
    self, EpisodeEnd, ErrorContext, Header, InjectionTrigger, MemorySource, Outcome, StepKind, StepStatus, ToolPayload,
    record::Body,
};
use basecamp_trace::{Memory, MemoryPatch, TraceWriter, canonical_json, hash_json};
use futures_util::FutureExt;
use serde::Serialize;
use serde_json::{Value, json};

use crate::driver::StopSignal;
use crate::executor::{MemoryGuard, ToolCall, ToolExecutor, unix_nanos};
use crate::logits::{Divergence, LogitAnalytics, RawLogitsError, TurnLogits};
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
///
/// It also knows which episodes can still take one: the episodes a shard
/// will run (when told, [`LiveInjections::expect_episodes`]) minus those
/// that finished, so the endpoint can refuse an injection that would never
/// be delivered instead of accepting it silently.
#[derive(Debug, Clone, Default)]
pub struct LiveInjections(Arc<Mutex<LiveState>>);

#[derive(Debug, Default)]
struct LiveState {
    queues: BTreeMap<String, VecDeque<LiveInjection>>,
    /// The episodes that will run here; `None`: any id is accepted.
    expected: Option<BTreeSet<String>>,
    finished: BTreeSet<String>,
    /// The ids of the injections offered to each episode not finished yet:
    /// an id is taken once an episode.
    ids: BTreeMap<String, BTreeSet<String>>,
    /// The ids of the scheduled injections, taken in every episode from its start.
    scheduled: BTreeSet<String>,
}

/// Why [`LiveInjections::offer`] refused an injection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectionRefused {
    #[error("no episode {episode:?} runs here; this sandbox runs {count} episodes ({examples})")]
    UnknownEpisode { episode: String, count: usize, examples: String },
    #[error("episode {episode:?} has already finished; an injection can no longer reach it")]
    Finished { episode: String },
    #[error(
        "episode {episode:?} has taken an injection with id {id:?} already; give each injection its own id \
         (or none, for a generated one)"
    )]
    Exists { episode: String, id: String },
    #[error(
        "injection {id:?} is scheduled for episode {episode:?} (the sandbox's spec.injections), so a live \
         injection may not take its id; give another id (or none, for a generated one)"
    )]
    Scheduled { episode: String, id: String },
}

impl LiveInjections {
    fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `injection` for `episode`, whatever the episode.
    pub fn push(&self, episode: &str, injection: LiveInjection) {
        self.lock().queues.entry(episode.to_string()).or_default().push_back(injection);
    }

    /// Declares the episodes that will run: from now on [`offer`](Self::offer)
    /// refuses any other id.
    pub fn expect_episodes(&self, ids: impl IntoIterator<Item = String>) {
        self.lock().expected.get_or_insert_with(BTreeSet::new).extend(ids);
    }

    /// Takes the ids of `scheduled` in every episode: a live injection
    /// offered under one of them is refused ([`InjectionRefused::Scheduled`]),
    /// so that an id in a trace names one injection.
    pub fn reserve_scheduled(&self, scheduled: &[ScheduledInjection]) {
        self.lock().scheduled.extend(scheduled.iter().map(|s| s.id.clone()));
    }

    /// Queues `injection` when `episode` can still receive it.
    pub fn offer(&self, episode: &str, injection: LiveInjection) -> Result<(), InjectionRefused> {
        let mut state = self.lock();
        if state.finished.contains(episode) {
            return Err(InjectionRefused::Finished { episode: episode.to_string() });
        }
        if let Some(expected) = &state.expected
            && !expected.contains(episode)
        {
            let mut examples: Vec<&str> = expected.iter().take(5).map(String::as_str).collect();
            if expected.len() > examples.len() {
                examples.push("…");
            }
            return Err(InjectionRefused::UnknownEpisode {
                episode: episode.to_string(),
                count: expected.len(),
                examples: examples.join(", "),
            });
        }
        if state.scheduled.contains(&injection.id) {
            return Err(InjectionRefused::Scheduled { episode: episode.to_string(), id: injection.id });
        }
        if !state.ids.entry(episode.to_string()).or_default().insert(injection.id.clone()) {
            return Err(InjectionRefused::Exists { episode: episode.to_string(), id: injection.id });
        }
        state.queues.entry(episode.to_string()).or_default().push_back(injection);
        Ok(())
    }

    /// Removes and returns the injections due at `step`.
    fn take_due(&self, episode: &str, step: u32) -> Vec<LiveInjection> {
        let mut state = self.lock();
        let Some(queue) = state.queues.get_mut(episode) else { return Vec::new() };
        let (due, later): (Vec<_>, Vec<_>) = queue.drain(..).partition(|i| i.at_step.is_none_or(|s| s <= step));
        queue.extend(later);
        due
    }

    /// Marks `episode` finished and returns the injections it never received.
    /// Only an expected episode (a driver's test-set row) is remembered as
    /// finished: server mode expects none, and remembering each of its
    /// episodes grew a set for the life of the server.
    fn finish(&self, episode: &str) -> Vec<LiveInjection> {
        let mut state = self.lock();
        if state.expected.is_some() {
            state.finished.insert(episode.to_string());
        }
        state.ids.remove(episode);
        state.queues.remove(episode).map(Vec::from).unwrap_or_default()
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
    /// A stable checkpoint is taken after every this many completed steps
    /// (`rollback.checkpointEvery`, at least 1).
    pub checkpoint_every: u32,
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
    /// Turns that come with raw logits are analysed here (shared by episodes).
    pub logits: Arc<LogitAnalytics>,
    /// How to tell that the policy answers again — its server's readiness
    /// URL, a hosted endpoint's `/models` — when a shard finds it failing
    /// episode after episode ([`crate::driver::run_shard`]); `None` for a
    /// script, or an endpoint whose `outageTimeout` is zero.
    pub policy_readiness: Option<crate::readiness::Readiness>,
}

/// An expected tool call: name, arguments, and the argument names compared (all when `None`).
pub type ExpectedCallSpec = (String, serde_json::Map<String, Value>, Option<Vec<String>>);

/// One test-set row, as the runner needs it.
#[derive(Debug, Clone, Default)]
pub struct EpisodeInput {
    pub id: String,
    /// The test-set row it runs (the trace header's `row_id`): `None` for
    /// an episode given inline (server mode), whose row is nowhere.
    pub row_id: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub initial_memory: serde_json::Map<String, Value>,
    pub expected_calls: Vec<ExpectedCallSpec>,
    pub expected_memory: Option<serde_json::Map<String, Value>>,
    pub expected_memory_hash: Option<String>,
}

/// What an episode produced.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
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
    /// key -> {before, after}: the changes since the checkpoint that were
    /// undone; `before` is left out for a key the checkpoint did not hold
    /// (and `after` for one the step removed), so an absent key is not read
    /// as a JSON null.
    modified_keys: BTreeMap<String, Value>,
    /// The last (up to) 10 tokens of the policy with their top-k alternatives.
    last_tokens: Vec<Value>,
}

struct StepState {
    calls: Vec<(String, Option<Value>, bool)>,
    payloads: VecDeque<ToolPayload>,
    last_tokens: VecDeque<pb::TokenLogit>,
    warnings: Vec<String>,
    /// The episode's failure class so far (see [`StepState::note_error`]).
    first_error: Option<String>,
    rollbacks: u32,
    rollback_traces: Vec<RollbackTrace>,
    /// KL of the tokens whose policy sent reference logits.
    divergence: Divergence,
}

impl StepState {
    /// Notes an error of this class: the first one classifies the episode,
    /// unless the infrastructure fails after it (the policy's server, a
    /// service a tool calls): then the episode measured that, not the agent,
    /// and its class says so (aggregates leave it out of the means).
    fn note_error(&mut self, class: &str) {
        let replaces = match &self.first_error {
            None => true,
            Some(first) => measures_the_agent(first) && !measures_the_agent(class),
        };
        if replaces {
            self.first_error = Some(class.to_string());
        }
    }
}

/// Where an [`Episode`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Started, or between two steps: the next step has not begun.
    BetweenSteps,
    /// A step has begun (its injections delivered): waiting for the policy's answer.
    AwaitingAction,
    /// Over: [`Episode::finish`] writes the end of the trace.
    Done(Outcome),
}

/// What one tool call of a step did, for callers that drive the episode
/// from outside (the gym-like server's `info`).
#[derive(Debug, Clone, PartialEq)]
pub struct CallReport {
    pub tool: String,
    pub call_id: String,
    pub status: StepStatus,
    /// The trace's `error_type`, when the call failed.
    pub error_type: Option<String>,
    pub latency: Duration,
    /// The memory keys the call changed, in the order the deltas were applied.
    pub memory_delta_keys: Vec<String>,
}

/// What [`Episode::act`] did with one answer of the policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReport {
    pub step: u32,
    pub calls: Vec<CallReport>,
    /// The plan step ran out of time inside a tool call (memory was rolled
    /// back to the last checkpoint when rollback is enabled).
    pub plan_step_timed_out: bool,
}

/// One episode in progress: the step machine that both modes drive.
///
/// Driver mode ([`EpisodeRunner::run`]) asks the policy between
/// [`advance`](Episode::advance) and [`act`](Episode::act); server mode
/// (the gym-like API) gets the answer from an external trainer instead.
/// Either way the trace records are the same, written by the same code.
pub struct Episode {
    input: EpisodeInput,
    started: Instant,
    trace_path: PathBuf,
    writer: TraceWriter<File>,
    /// The runner's tools as this episode calls them ([`ToolExecutor::for_episode`]).
    executor: ToolExecutor,
    memory: Memory,
    guard: MemoryGuard,
    /// The stable checkpoint a timed-out step rolls back to: memory at the
    /// start, then after every `checkpoint_every` completed steps.
    checkpoint: Memory,
    /// Steps completed (finished in time) since the checkpoint was taken.
    completed_since_checkpoint: u32,
    /// Memory at the end of the last step, which the guard compares with
    /// to name the keys changed behind the runtime's back.
    last_step_memory: Memory,
    messages: Vec<ChatMessage>,
    /// Which scheduled injections have fired.
    fired: Vec<bool>,
    state: StepState,
    step: u32,
    phase: Phase,
    final_answer: String,
    stop_error: Option<String>,
    /// Injection ids delivered since [`Episode::take_delivered`] was last called.
    delivered: Vec<String>,
}

impl std::fmt::Debug for Episode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Episode")
            .field("id", &self.input.id)
            .field("step", &self.step)
            .field("phase", &self.phase)
            .field("trace_path", &self.trace_path)
            .finish_non_exhaustive()
    }
}

impl EpisodeRunner {
    /// A runner of `policy` over `executor`'s tools with a SandboxConfig's
    /// defaults (20 steps, 3 s plan steps, rollback on, error context on,
    /// snapshots every 10 steps) and nothing else: no tool specs for the
    /// policy, no system prompt, injections, rewards or metrics. Set the
    /// fields that differ: `EpisodeRunner { max_steps: 4, ..EpisodeRunner::new(e, p) }`.
    pub fn new(executor: ToolExecutor, policy: Policy) -> Self {
        use basecamp_api::sandbox::{DEFAULT_MAX_STEPS, DEFAULT_MEMORY_SNAPSHOT_INTERVAL, DEFAULT_PLAN_STEP_TIMEOUT};
        Self {
            executor,
            policy,
            tools: Vec::new(),
            system_prompt: None,
            max_steps: DEFAULT_MAX_STEPS,
            plan_step_timeout: DEFAULT_PLAN_STEP_TIMEOUT.to_std().expect("a positive constant"),
            rollback_enabled: true,
            checkpoint_every: 1,
            snapshot_interval: DEFAULT_MEMORY_SNAPSHOT_INTERVAL,
            error_context: true,
            injections: Vec::new(),
            rewards: None,
            reward_sources: BTreeMap::new(),
            training_step: 0,
            header: Header::default(),
            live: LiveInjections::default(),
            metrics: None,
            logits: Arc::default(),
            policy_readiness: None,
        }
    }

    /// Whether `id` is the id of one of the scheduled injections, which every
    /// episode takes from its start: a live injection may not reuse it.
    pub fn is_scheduled_injection(&self, id: &str) -> bool {
        self.injections.iter().any(|i| i.id == id)
    }

    /// Alternatives per token for records derived from raw logits: the
    /// header's `top_k` (the sandbox's `trace.topK`), 5 when unset.
    pub fn top_k(&self) -> u32 {
        match self.header.top_k {
            0 => basecamp_api::sandbox::DEFAULT_TOP_K,
            k => k,
        }
    }

    /// Runs one episode, writing `<dir>/<id>.trace`. Failures inside the
    /// episode are recorded and end it; only an unwritable trace is an `Err`.
    pub async fn run(&self, input: &EpisodeInput, dir: &Path) -> std::io::Result<EpisodeResult> {
        let episode = self.start(input.clone(), dir)?;
        self.run_started(episode, &StopSignal::new()).await
    }

    /// Runs an episode [`EpisodeRunner::start`] began (its trace created)
    /// to its end, or until `stop`: the step under way is then cut off
    /// where it is ([`Episode::cancel`]) and the trace closed with outcome
    /// `cancelled`, so a stopped run leaves whole traces. What
    /// [`EpisodeRunner::run`] does after the start.
    ///
    /// A panic while a step is played (a tool's, or a bug of the sandbox's)
    /// ends the episode in error there, failure class `panic`, its trace
    /// complete: uncaught, the episode was lost with its task and its trace
    /// cut off without an end or an index.
    pub async fn run_started(&self, mut episode: Episode, stop: &StopSignal) -> std::io::Result<EpisodeResult> {
        loop {
            let going_on = tokio::select! {
                biased;
                () = stop.cancelled() => {
                    episode.cancel(format!("stopped at step {}: the run was interrupted", episode.step))?;
                    false
                }
                played = AssertUnwindSafe(self.play_step(&mut episode)).catch_unwind() => match played {
                    Ok(going_on) => going_on?,
                    Err(panic) => {
                        let message = crate::driver::panic_message(panic.as_ref());
                        tracing::error!(episode = %episode.id(), step = episode.step, "the step panicked: {message}");
                        episode.stop(PANIC, PANIC, format!("the step panicked: {message}"))?;
                        false
                    }
                },
            };
            if !going_on {
                return episode.finish(self);
            }
        }
    }

    /// Begins the episode's next step and plays it: the policy's answer
    /// (within the plan-step timeout) acted on, or the error that ends the
    /// episode. False when the episode was over before it.
    async fn play_step(&self, episode: &mut Episode) -> std::io::Result<bool> {
        if !episode.advance(self)? {
            return Ok(false);
        }
        let deadline = tokio::time::Instant::now() + self.plan_step_timeout;
        let request = PolicyRequest::new(episode.id(), episode.step - 1, &episode.messages[..], &self.tools[..]);
        let answer = tokio::time::timeout_at(deadline, self.policy.respond(&request)).await;
        match answer {
            Ok(Ok(response)) => {
                episode.act(self, &response, deadline).await?;
            }
            Ok(Err(e)) => {
                if let Some(metrics) = &self.metrics {
                    metrics.observe_policy_error(e.category());
                }
                episode.stop(e.category(), POLICY_ERROR, format!("policy failed: {e}"))?;
            }
            // Still retrying a failing server when the step's time ran out:
            // the server failed, not the model (which may never have been asked).
            Err(_) => match request.retrying.last() {
                Some((attempts, e)) => {
                    if let Some(metrics) = &self.metrics {
                        metrics.observe_policy_error(e.category());
                    }
                    let msg = format!(
                        "policy failed: the plan-step timeout of {:?} ran out while its request was retried after \
                         {attempts} failed attempt(s), the last: {e}",
                        self.plan_step_timeout
                    );
                    episode.stop(e.category(), POLICY_ERROR, msg)?;
                }
                // Not sent yet: it waited for its place among the requests
                // at once of an endpoint that answered 429.
                None if request.retrying.queued() => {
                    let category = "PolicyRateLimited";
                    if let Some(metrics) = &self.metrics {
                        metrics.observe_policy_error(category);
                    }
                    let msg = format!(
                        "policy failed: the plan-step timeout of {:?} ran out while its request waited for its \
                         place among the requests at once of an endpoint that answered 429 (too many requests)",
                        self.plan_step_timeout
                    );
                    episode.stop(category, POLICY_ERROR, msg)?;
                }
                None => {
                    let msg = format!(
                        "the policy did not answer within the plan-step timeout of {:?}",
                        self.plan_step_timeout
                    );
                    episode.stop("plan_step_timeout", "plan_step_timeout", msg)?;
                }
            },
        }
        Ok(true)
    }

    /// This runner for shard `shard` of a local run (`basecamp run` runs the
    /// shards of a variant side by side): the same tools, policy and
    /// settings without reading or parsing anything again (a recorded
    /// fixture, a scripted policy), with its own HTTP rate limits
    /// ([`ToolExecutor::for_shard`]) and live injections; the metrics and the
    /// logit analytics are the process's, shared.
    pub fn for_shard(&self, shard: u32) -> EpisodeRunner {
        EpisodeRunner {
            executor: self.executor.for_shard(),
            policy: self.policy.clone(),
            tools: self.tools.clone(),
            system_prompt: self.system_prompt.clone(),
            max_steps: self.max_steps,
            plan_step_timeout: self.plan_step_timeout,
            rollback_enabled: self.rollback_enabled,
            checkpoint_every: self.checkpoint_every,
            snapshot_interval: self.snapshot_interval,
            error_context: self.error_context,
            injections: self.injections.clone(),
            rewards: self.rewards.clone(),
            reward_sources: self.reward_sources.clone(),
            training_step: self.training_step,
            header: Header { shard, ..self.header.clone() },
            live: LiveInjections::default(),
            metrics: self.metrics.clone(),
            logits: self.logits.clone(),
            policy_readiness: self.policy_readiness.clone(),
        }
    }

    /// Starts an episode: creates `<dir>/<id>.trace` with its header and the
    /// initial memory. No step has begun yet: call [`Episode::advance`].
    pub fn start(&self, input: EpisodeInput, dir: &Path) -> std::io::Result<Episode> {
        self.start_noting_trace(input, dir, || {})
    }

    /// [`EpisodeRunner::start`] for an id that must be new in `dir`: an
    /// existing `<dir>/<id>.trace` (an earlier run's episode of that id) is
    /// an `io::ErrorKind::AlreadyExists` error, never truncated. Server mode
    /// starts its episodes so; a driver run replaces its own earlier shards.
    pub fn start_new(&self, input: EpisodeInput, dir: &Path) -> std::io::Result<Episode> {
        self.start_with(input, dir, true, || {})
    }

    /// [`EpisodeRunner::start`], calling `trace_created` as soon as the
    /// trace holds its header: from then on the file is this episode's (a
    /// readable prefix) whether the rest of the start succeeds, fails (an
    /// initial memory too large for a frame, a full disk) or panics.
    pub fn start_noting_trace(
        &self,
        input: EpisodeInput,
        dir: &Path,
        trace_created: impl FnOnce(),
    ) -> std::io::Result<Episode> {
        self.start_with(input, dir, false, trace_created)
    }

    fn start_with(
        &self,
        input: EpisodeInput,
        dir: &Path,
        exclusive: bool,
        trace_created: impl FnOnce(),
    ) -> std::io::Result<Episode> {
        let trace_path = dir.join(trace_file_name(&input.id));
        let mut header = self.header.clone();
        header.episode_id = input.id.clone();
        header.row_id = input.row_id.clone().unwrap_or_default();
        header.start_time_unix_nanos = unix_nanos(SystemTime::now());
        header.training_step = self.training_step;
        // An OpenAI-compatible server returns what it was asked for; other
        // policies' records (raw logits) carry the sandbox's trace.topK.
        header.top_k = match self.policy.top_k() {
            0 => self.top_k(),
            k => k,
        };
        let mut writer = if exclusive {
            TraceWriter::create_new(&trace_path, header)?
        } else {
            TraceWriter::create(&trace_path, header)?
        };
        trace_created();

        let mut memory = Memory::new();
        for delta in memory.apply(&MemoryPatch::from_object(&input.initial_memory), MemorySource::Initial, "test_set") {
            writer.append(0, Body::MemoryDelta(delta.to_record()))?;
        }
        writer.end_step()?;

        let guard = MemoryGuard::new(&mut memory);
        let checkpoint = memory.clone();
        let last_step_memory = memory.clone();
        let mut messages: Vec<ChatMessage> = self.system_prompt.iter().map(ChatMessage::system).collect();
        messages.extend(input.messages.iter().cloned());
        Ok(Episode {
            input,
            started: Instant::now(),
            trace_path,
            writer,
            executor: self.executor.for_episode(),
            memory,
            guard,
            checkpoint,
            completed_since_checkpoint: 0,
            last_step_memory,
            messages,
            fired: vec![false; self.injections.len()],
            state: StepState {
                calls: Vec::new(),
                payloads: VecDeque::new(),
                last_tokens: VecDeque::new(),
                warnings: Vec::new(),
                first_error: None,
                rollbacks: 0,
                rollback_traces: Vec::new(),
                divergence: Divergence::default(),
            },
            step: 0,
            phase: Phase::BetweenSteps,
            final_answer: String::new(),
            stop_error: None,
            delivered: Vec::new(),
        })
    }
}

impl Episode {
    pub fn id(&self) -> &str {
        &self.input.id
    }

    /// The current step (1-based; 0 before the first has begun).
    pub fn step(&self) -> u32 {
        self.step
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done(_))
    }

    /// The conversation so far, as the policy sees it.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The episode's memory as a JSON object.
    pub fn memory(&self) -> Value {
        self.memory.to_value()
    }

    pub fn trace_path(&self) -> &Path {
        &self.trace_path
    }

    /// The ids of the injections delivered since the last call.
    pub fn take_delivered(&mut self) -> Vec<String> {
        std::mem::take(&mut self.delivered)
    }

    /// Begins the next step: checks memory against the guard and delivers
    /// the injections due before the policy's turn. False when the episode
    /// is over (done already, out of steps, or memory found corrupted).
    pub fn advance(&mut self, runner: &EpisodeRunner) -> std::io::Result<bool> {
        match self.phase {
            Phase::Done(_) => return Ok(false),
            Phase::AwaitingAction => return Ok(true),
            Phase::BetweenSteps => {}
        }
        if self.step >= runner.max_steps {
            self.phase = Phase::Done(Outcome::MaxSteps);
            return Ok(false);
        }
        self.step += 1;
        let step = self.step;
        if let Err(corruption) = self.guard.check(&mut self.memory, Some(&self.last_step_memory)) {
            let msg = corruption.to_string();
            self.stop("memory_corruption", "memory_corruption", msg)?;
            return Ok(false);
        }
        for (i, inj) in runner.injections.iter().enumerate() {
            if !self.fired[i] && inj.when == InjectionWhen::AtStep(step) {
                self.fired[i] = true;
                self.inject(runner, &inj.id, InjectionTrigger::AtStep, &inj.observation, &inj.description)?;
            }
        }
        self.phase = Phase::AwaitingAction;
        self.deliver_live(runner)?;
        Ok(true)
    }

    /// Delivers the live injections due at the current step, while the
    /// episode waits for the policy's answer; returns their ids. Server
    /// mode calls it when an injection arrives between two actions.
    pub fn deliver_live(&mut self, runner: &EpisodeRunner) -> std::io::Result<Vec<String>> {
        if self.phase != Phase::AwaitingAction {
            return Ok(Vec::new());
        }
        let mut ids = Vec::new();
        for live in runner.live.take_due(&self.input.id, self.step) {
            self.inject(runner, &live.id, InjectionTrigger::Live, &live.observation, "live")?;
            ids.push(live.id);
        }
        Ok(ids)
    }

    /// Ends the episode with an error at the current step: recorded in the
    /// trace's error context, `failure_class` classifies it for reports.
    pub fn stop(&mut self, error_type: &str, failure_class: &str, message: String) -> std::io::Result<()> {
        record_error(&mut self.writer, self.step, error_type, &message, vec![], &mut self.memory, &self.state)?;
        self.state.note_error(failure_class);
        self.stop_error = Some(message);
        self.phase = Phase::Done(Outcome::Error);
        Ok(())
    }

    /// Ends the episode before it finished (closed by its client, idle too
    /// long, the run stopped): outcome `cancelled`, `reason` as its error.
    /// A step begun and not played to its end is ended in the trace by an
    /// error context of type `cancelled` holding `reason`, so the trace
    /// says why and each step it holds has an end.
    pub fn cancel(&mut self, reason: String) -> std::io::Result<()> {
        if self.is_done() {
            return Ok(());
        }
        if self.phase == Phase::AwaitingAction {
            record_error(&mut self.writer, self.step, CANCELLED, &reason, vec![], &mut self.memory, &self.state)?;
            self.state.note_error(CANCELLED);
        } else {
            self.writer.end_step()?;
        }
        self.stop_error = Some(reason);
        self.phase = Phase::Done(Outcome::Cancelled);
        Ok(())
    }

    /// Plays the policy's answer for the current step: records the turn,
    /// then either the final answer (the episode is done) or each tool call
    /// through the executor under `deadline`, with the injections they
    /// trigger, the rollback when the deadline passes, and the memory
    /// snapshot; the step's frame is closed at the end.
    pub async fn act(
        &mut self,
        runner: &EpisodeRunner,
        response: &PolicyResponse,
        deadline: tokio::time::Instant,
    ) -> std::io::Result<StepReport> {
        if self.phase != Phase::AwaitingAction {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("episode {} is not waiting for an action ({:?})", self.input.id, self.phase),
            ));
        }
        let step = self.step;
        let mut report = StepReport { step, ..Default::default() };
        let derived = match &response.raw_logits {
            Some(raw) => Some(runner.logits.analyze_blocking(raw.clone(), runner.top_k() as usize).await),
            None => None,
        };
        record_policy_turn(&mut self.writer, step, response, derived, &mut self.state)?;
        self.messages.push(response.to_assistant_message());

        if response.is_final() {
            self.final_answer = response.content.clone().unwrap_or_default();
            let answer = Value::String(self.final_answer.clone());
            let hash = self.memory.hash();
            self.writer.append(
                step,
                Body::PlanStep(Box::new(pb::PlanStep {
                    index: step,
                    kind: StepKind::FinalAnswer as i32,
                    observation_json: canonical_json(&answer),
                    result_hash: hash_json(&answer).0.to_vec(),
                    status: StepStatus::Ok as i32,
                    memory_hash_before: hash.0.to_vec(),
                    memory_hash_after: hash.0.to_vec(),
                    start_unix_nanos: unix_nanos(SystemTime::now()),
                    ..Default::default()
                })),
            )?;
            self.writer.end_step()?;
            self.phase = Phase::Done(Outcome::Completed);
            return Ok(report);
        }

        // (index of the call the deadline cut off, its observation)
        let mut step_deadline_hit: Option<(usize, Value)> = None;
        // Injections the turn's calls triggered, delivered once every call
        // of the turn has its tool message: OpenAI-compatible servers
        // refuse a user message between the answers to one assistant turn.
        let mut due_injections = Vec::new();
        for (index, call) in response.tool_calls.iter().enumerate() {
            let arguments = match &call.arguments {
                ToolArguments::Parsed(v) => Ok(v),
                ToolArguments::Invalid(bad) => Err(bad.raw.as_str()),
            };
            let tool_call = ToolCall { step, call_id: &call.id, plan_label: "", name: &call.name, arguments };
            let (started_wall, started) = (SystemTime::now(), Instant::now());
            let result = tokio::time::timeout_at(deadline, self.executor.call(tool_call, &mut self.memory)).await;
            let Ok(outcome_of_call) = result else {
                // The plan step ran out of time inside this call: the call is abandoned.
                let latency = started.elapsed();
                let timeout_ms = runner.plan_step_timeout.as_millis();
                let observation =
                    json!({"error": format!("plan step timed out after {timeout_ms} ms"), "tool": call.name});
                let observation_json = canonical_json(&observation);
                let hash = self.memory.hash();
                // As the executor records them for a call that ends.
                let (arguments_json, input_hash) = crate::executor::arguments_json_and_hash(arguments);
                self.writer.append(
                    step,
                    Body::PlanStep(Box::new(pb::PlanStep {
                        index: step,
                        kind: StepKind::ToolCall as i32,
                        tool: call.name.clone(),
                        call_id: call.id.clone(),
                        arguments_json,
                        input_hash: input_hash.0.to_vec(),
                        status: StepStatus::RolledBack as i32,
                        error_type: "plan_step_timeout".into(),
                        error_message: format!("plan step exceeded {timeout_ms} ms"),
                        memory_hash_before: hash.0.to_vec(),
                        memory_hash_after: hash.0.to_vec(),
                        observation_json: observation_json.clone(),
                        start_unix_nanos: unix_nanos(started_wall),
                        latency_micros: u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
                        timeout_ms: timeout_ms as u64,
                        ..Default::default()
                    })),
                )?;
                if let Some(metrics) = &runner.metrics {
                    metrics.observe_rolled_back_call(&call.name, latency);
                }
                self.state.calls.push((call.name.clone(), call.arguments.as_value().cloned(), true));
                report.calls.push(CallReport {
                    tool: call.name.clone(),
                    call_id: call.id.clone(),
                    status: StepStatus::RolledBack,
                    error_type: Some("plan_step_timeout".into()),
                    // How long the call ran: the deadline also covers the
                    // policy's answer and the turn's earlier calls.
                    latency,
                    memory_delta_keys: Vec::new(),
                });
                self.messages.push(ChatMessage::tool(call.id.clone(), observation_json));
                step_deadline_hit = Some((index, observation));
                break;
            };
            if let Some(metrics) = &runner.metrics {
                metrics.observe_call(&outcome_of_call);
            }
            for body in outcome_of_call.records() {
                self.writer.append(step, body)?;
            }
            self.guard.accept(&mut self.memory);
            let state = &mut self.state;
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
            report.calls.push(CallReport {
                tool: call.name.clone(),
                call_id: call.id.clone(),
                status: outcome_of_call.status,
                error_type: outcome_of_call.error.as_ref().map(|e| e.error_type().to_string()),
                latency: Duration::from_micros(outcome_of_call.plan_step.latency_micros),
                memory_delta_keys: outcome_of_call.deltas.iter().map(|d| d.key.clone()).collect(),
            });
            if let Some(err) = &outcome_of_call.error {
                self.state.note_error(err.error_type());
                if runner.error_context {
                    record_error(
                        &mut self.writer,
                        step,
                        err.error_type(),
                        &err.to_string(),
                        cause_chain(err),
                        &mut self.memory,
                        &self.state,
                    )?;
                }
            }
            self.messages.push(ChatMessage::tool(call.id.clone(), outcome_of_call.plan_step.observation_json.clone()));

            for (i, inj) in runner.injections.iter().enumerate() {
                // `afterTool` fires after every turn that calls the tool (once
                // per turn, however many calls); `whenMemory` once an episode.
                let due = match &inj.when {
                    InjectionWhen::AfterTool(tool) => *tool == call.name && !due_injections.contains(&i),
                    InjectionWhen::MemoryEquals { key, value } => !self.fired[i] && self.memory.get(key) == Some(value),
                    InjectionWhen::AtStep(_) => false,
                };
                if due {
                    self.fired[i] = true;
                    due_injections.push(i);
                }
            }
        }

        if let Some((index, _)) = &step_deadline_hit {
            // Every call of the assistant turn needs its tool message, or
            // the next request is refused for an unanswered tool_call id.
            let cut_off = &response.tool_calls[*index];
            for call in &response.tool_calls[index + 1..] {
                let observation = json!({
                    "error": format!(
                        "not run: the plan step timed out in an earlier call of this turn ({} {})",
                        cut_off.name, cut_off.id
                    ),
                    "tool": call.name,
                });
                self.messages.push(ChatMessage::tool(call.id.clone(), canonical_json(&observation)));
            }
        }
        for i in due_injections {
            let inj = &runner.injections[i];
            let trigger = match inj.when {
                InjectionWhen::AfterTool(_) => InjectionTrigger::AfterTool,
                _ => InjectionTrigger::MemoryMatch,
            };
            self.inject(runner, &inj.id, trigger, &inj.observation, &inj.description)?;
        }

        if let Some((_, observation)) = step_deadline_hit {
            report.plan_step_timed_out = true;
            self.state.note_error("plan_step_timeout");
            if runner.rollback_enabled {
                roll_back(
                    &mut self.writer,
                    step,
                    &mut self.memory,
                    &self.checkpoint,
                    observation,
                    &self.input.id,
                    runner.plan_step_timeout,
                    &mut self.state,
                )?;
                self.guard.accept(&mut self.memory);
                // Memory is the checkpoint again: the count starts over.
                self.completed_since_checkpoint = 0;
            }
        } else {
            self.completed_since_checkpoint += 1;
            if self.completed_since_checkpoint >= runner.checkpoint_every {
                self.checkpoint = self.memory.clone();
                self.completed_since_checkpoint = 0;
            }
        }
        self.last_step_memory = self.memory.clone();
        if runner.snapshot_interval > 0 && step.is_multiple_of(runner.snapshot_interval) {
            let record = pb::Record { step, body: Some(Body::MemorySnapshot(self.memory.to_snapshot())) };
            // Too long for a frame, the writer would refuse it, and the episode would end there.
            let len = basecamp_trace::writer::framed_len(&record);
            if len <= basecamp_trace::writer::FRAME_RAW_LIMIT {
                self.writer.write_record(&record)?;
            } else {
                self.state.warnings.push(format!(
                    "step {step}: the memory snapshot was not written: memory is {len} bytes encoded, over a trace \
                     frame's {} bytes (readers rebuild memory from the deltas)",
                    basecamp_trace::writer::FRAME_RAW_LIMIT
                ));
            }
        }
        self.writer.end_step()?;
        self.phase = Phase::BetweenSteps;
        Ok(report)
    }

    /// Scores the episode, writes its reward and end, and closes the trace
    /// (plus `rollback_trace.json` when a step was rolled back). An episode
    /// not done yet ends as `cancelled`.
    pub fn finish(mut self, runner: &EpisodeRunner) -> std::io::Result<EpisodeResult> {
        let outcome = match self.phase {
            Phase::Done(outcome) => outcome,
            _ => Outcome::Cancelled,
        };
        let steps_run = self.step;
        for undelivered in runner.live.finish(&self.input.id) {
            let when = undelivered.at_step.map_or_else(|| "its next step".to_string(), |s| format!("step {s}"));
            self.state.warnings.push(format!(
                "live injection {} for {when} was never delivered: the episode ended at step {steps_run}",
                undelivered.id
            ));
        }
        let input = &self.input;
        let state = &mut self.state;
        let memory = &mut self.memory;
        let resolution_time_s = self.started.elapsed().as_secs_f64();
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
        metrics.logit_divergence = state.divergence.mean();
        if state.divergence.infinite() > 0 {
            state.warnings.push(format!(
                "{} token(s) had KL = +inf (the reference logits give probability 0 to a token the policy's do not); \
                 logit_divergence is the mean of the other tokens",
                state.divergence.infinite()
            ));
        }
        if let Some(calculator) = &runner.rewards {
            let scores = reward_scores(calculator, &runner.reward_sources, &metrics, outcome, runner.max_steps);
            match calculator.signal(runner.training_step, &scores) {
                Ok(signal) => {
                    metrics.reward = Some(signal.weighted_sum);
                    self.writer.append(steps_run, Body::RewardSignal(signal))?;
                }
                Err(e) => state.warnings.push(format!("reward not computed: {e}")),
            }
        }
        let failure_class = failure_class(state, &metrics);
        self.writer.finish(EpisodeEnd {
            outcome: outcome as i32,
            end_time_unix_nanos: unix_nanos(SystemTime::now()),
            steps: steps_run,
            final_memory_hash: memory.hash().0.to_vec(),
            final_answer: self.final_answer.clone(),
            failure_class: failure_class.clone(),
        })?;
        if !state.rollback_traces.is_empty() {
            let path = rollback_path(&self.trace_path);
            let text = serde_json::to_vec_pretty(&state.rollback_traces).expect("rollback traces serialize");
            // Callers report a failure here as the trace's: say which file.
            std::fs::write(&path, text)
                .map_err(|e| std::io::Error::new(e.kind(), format!("its rollback evidence {}: {e}", path.display())))?;
        }
        Ok(EpisodeResult {
            id: input.id.clone(),
            outcome: outcome_name(outcome).into(),
            metrics,
            failure_class,
            trace_file: self.trace_path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
            rollbacks: state.rollbacks,
            warnings: std::mem::take(&mut state.warnings),
            error: self.stop_error.take(),
        })
    }

    /// Records an injection and adds it to the conversation as a user message.
    fn inject(
        &mut self,
        runner: &EpisodeRunner,
        id: &str,
        trigger: InjectionTrigger,
        observation: &Value,
        description: &str,
    ) -> std::io::Result<()> {
        if let Some(metrics) = &runner.metrics {
            metrics.observe_injection(trigger);
        }
        self.writer.append(
            self.step,
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
        self.messages.push(ChatMessage::user(format!("[injected observation {id}] {text}")));
        self.delivered.push(id.to_string());
        Ok(())
    }
}

/// Records the policy's turn and its `token_logit` records: derived from
/// the raw logits when the policy sent them and they could be read (else a
/// warning, and the OpenAI-style logprobs, if any, stand in).
fn record_policy_turn<W: std::io::Write>(
    writer: &mut TraceWriter<W>,
    step: u32,
    response: &PolicyResponse,
    derived: Option<Result<TurnLogits, RawLogitsError>>,
    state: &mut StepState,
) -> std::io::Result<()> {
    writer.append(step, Body::PolicyTurn(response.to_policy_turn()))?;
    if response.logprobs_missing() {
        state.warnings.push(format!("step {step}: the policy's tool-call turn came back without logprobs"));
    }
    let records = match derived {
        Some(Ok(turn)) => turn.records,
        Some(Err(e)) => {
            let fallback = if response.logprobs.is_some() { "; its logprobs are recorded instead" } else { "" };
            state.warnings.push(format!("step {step}: raw logits not used ({}): {e}{fallback}", e.category()));
            response.token_logits()
        }
        None => response.token_logits(),
    };
    // Records with a KL: derived from raw logits now, or carried by a replay.
    state.divergence.add(&records);
    for logit in records {
        state.last_tokens.push_back(logit.clone());
        if state.last_tokens.len() > 10 {
            state.last_tokens.pop_front();
        }
        writer.append(step, Body::TokenLogit(logit))?;
    }
    state.warnings.extend(response.warnings.iter().map(|w| format!("step {step}: {w}")));
    Ok(())
}

/// The error type, and failure class, of an episode ended before it finished.
const CANCELLED: &str = "cancelled";
/// The error type, and failure class, of an episode whose step panicked.
pub const PANIC: &str = "panic";

fn record_error<W: std::io::Write>(
    writer: &mut TraceWriter<W>,
    step: u32,
    error_type: &str,
    message: &str,
    cause_chain: Vec<String>,
    memory: &mut Memory,
    state: &StepState,
) -> std::io::Result<()> {
    let (memory_snapshot_json, omitted_memory_keys) = error_snapshot(memory);
    writer.append(
        step,
        Body::ErrorContext(Box::new(ErrorContext {
            error_type: error_type.to_string(),
            message: message.to_string(),
            cause_chain,
            stack: String::new(),
            memory_snapshot_json,
            last_tool_payloads: state.payloads.iter().cloned().collect(),
            omitted_memory_keys,
        })),
    )?;
    writer.end_step()
}

/// Most JSON of one memory value an error context's snapshot holds.
pub const ERROR_SNAPSHOT_VALUE_LIMIT: usize = 1 << 20;
/// Most JSON of all values an error context's snapshot holds.
pub const ERROR_SNAPSHOT_LIMIT: usize = 16 << 20;

/// Memory as an error context holds it: every value's canonical JSON, in
/// key order, except a value over [`ERROR_SNAPSHOT_VALUE_LIMIT`] and any
/// value that would take the total past [`ERROR_SNAPSHOT_LIMIT`] (a smaller
/// one after it may still fit), which are named instead.
/// A diagnostic record must not grow past what a trace frame can hold (the
/// episode's trace would be lost with it); the deltas hold every value.
fn error_snapshot(memory: &Memory) -> (BTreeMap<String, String>, Vec<String>) {
    let (mut kept, mut omitted, mut size) = (BTreeMap::new(), Vec::new(), 0usize);
    for (key, value) in memory.entries() {
        let json = canonical_json(value);
        if json.len() > ERROR_SNAPSHOT_VALUE_LIMIT || size + json.len() > ERROR_SNAPSHOT_LIMIT {
            omitted.push(key.clone());
        } else {
            size += json.len();
            kept.insert(key.clone(), json);
        }
    }
    (kept, omitted)
}

#[allow(clippy::too_many_arguments)]
fn roll_back<W: std::io::Write>(
    writer: &mut TraceWriter<W>,
    step: u32,
    memory: &mut Memory,
    checkpoint: &Memory,
    observation: Value,
    episode: &str,
    plan_step_timeout: Duration,
    state: &mut StepState,
) -> std::io::Result<()> {
    let mut modified = BTreeMap::new();
    let mut patch = MemoryPatch::default();
    for (key, now, before) in memory.diff(checkpoint) {
        let mut change = serde_json::Map::new();
        if let Some(before) = before {
            change.insert("before".into(), before.clone());
        }
        if let Some(now) = now {
            change.insert("after".into(), now.clone());
        }
        modified.insert(key.to_string(), Value::Object(change));
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
        episode: episode.to_string(),
        step,
        plan_step_timeout_ms: plan_step_timeout.as_millis() as u64,
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

/// The bounded class a report groups failures by: the first error seen (or
/// the infrastructure's failure after it, see [`StepState::note_error`]),
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
        "logit_divergence" => m.logit_divergence.unwrap_or(0.0),
        "steps" => f64::from(m.steps),
        "resolution_time" => m.resolution_time_s,
        "efficiency_penalty" => -f64::from(m.steps) / f64::from(max_steps.max(1)),
        "success" | "task_success" => f64::from(u8::from(outcome == Outcome::Completed)),
        _ => return None,
    })
}

pub(crate) fn outcome_name(o: Outcome) -> &'static str {
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

/// The trace file an episode writes into its directory: `<file_safe(id)>.trace`.
pub fn trace_file_name(id: &str) -> String {
    format!("{}.trace", file_safe(id))
}

/// Longest stem before [`file_safe`] shortens it: with `.rollback_trace.json` it stays
/// well under the 255 bytes a file name may have.
const MAX_STEM: usize = 200;
/// What a shortened stem keeps of the escaped id.
const SHORTENED_KEEP: usize = 180;

/// An episode id as a file name stem, one id to one name. ASCII letters,
/// digits, `-`, `_` and `.` (but not a leading one) stay; every other byte
/// becomes `~` and its two hex digits. So no id leaves the directory or
/// hides in it (`../../x` is `~2E.~2F..~2Fx`), and two ids never share a
/// file (`a/b` is `a~2Fb`, `a_b` stays `a_b`; before, both were `a_b`). A
/// stem longer than 200 bytes keeps its first 180 and ends in `~~` and 32
/// hex digits of the id's sha256: an escaped stem never holds `~~`.
pub fn file_safe(id: &str) -> String {
    let mut stem = String::with_capacity(id.len());
    for (i, byte) in id.bytes().enumerate() {
        let kept = byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' || (byte == b'.' && i > 0);
        if kept {
            stem.push(char::from(byte));
        } else {
            stem.push_str(&format!("~{byte:02X}"));
        }
    }
    if stem.len() > MAX_STEM {
        let digest = hash_json(&Value::String(id.to_string())).0;
        stem.truncate(SHORTENED_KEEP);
        stem.push_str("~~");
        for byte in &digest[..16] {
            stem.push_str(&format!("{byte:02x}"));
        }
    }
    stem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_ids_that_differ_only_past_the_kept_prefix_get_names_of_their_own() {
        let (a, b) = (format!("{}a", "x".repeat(300)), format!("{}b", "x".repeat(300)));
        let (name_a, name_b) = (file_safe(&a), file_safe(&b));
        assert_ne!(name_a, name_b);
        assert_eq!(name_a.len(), SHORTENED_KEEP + 2 + 32);
        assert!(name_a.starts_with(&"x".repeat(SHORTENED_KEEP)) && name_a.contains("~~"), "{name_a}");
        // An id already a short safe name stays as it is, and no escaped name holds `~~`.
        assert_eq!(file_safe("ep-1.a_b"), "ep-1.a_b");
        assert_eq!(file_safe("~~"), "~7E~7E");
        assert_eq!(file_safe(".."), "~2E.");
    }

    #[test]
    fn only_expected_episodes_are_remembered_as_finished() {
        let injection = |id: &str| LiveInjection { id: id.into(), observation: json!({}), at_step: None };
        // Server mode: no episodes expected; its episodes come and go.
        let server = LiveInjections::default();
        for i in 0..1_000 {
            server.push(&format!("ep-{i}"), injection("late"));
            assert_eq!(server.finish(&format!("ep-{i}")).len(), 1, "the undelivered injection is handed back");
        }
        let state = server.lock();
        assert!(state.finished.is_empty() && state.queues.is_empty(), "nothing is kept of finished episodes");
        drop(state);
        // A driver shard: a finished row refuses an injection.
        let driver = LiveInjections::default();
        driver.expect_episodes(["row-1".to_string()]);
        driver.finish("row-1");
        assert_eq!(
            driver.offer("row-1", injection("late")),
            Err(InjectionRefused::Finished { episode: "row-1".into() })
        );
    }
}
