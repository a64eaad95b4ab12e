//! From the API's spec to a runnable [`EpisodeRunner`]: tools, timeouts,
//! fallbacks, memory policy, injections, rewards and the policy of one
//! variant of a HarnessTask, with its SandboxConfig already resolved
//! (profile applied). Relative paths (scripted policy, fixtures, exec
//! working directories) are taken from the manifest's directory.
//!
//! Validation (`basecamp_api::validate_task`) runs before this; the errors
//! here are what only building can find (an unreadable fixture, a policy
//! that cannot be built).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use basecamp_api::fixture::FixtureEntry;
use basecamp_api::sandbox::{Fallback as ApiFallback, NullWrites as ApiNullWrites};
use basecamp_api::task::PolicySpec;
use basecamp_api::tool::{HttpMethod, RecordedMatch};
use basecamp_api::{Episode, HarnessTaskSpec, SandboxConfigSpec};
use basecamp_trace::pb::Header;
use basecamp_trace::{MemoryPatch, hash_json};
use serde_json::{Value, json};

use crate::episode::{EpisodeInput, EpisodeRunner, InjectionWhen, LiveInjections, ScheduledInjection};
use crate::executor::{Fallback, NullWrites, ToolDef, ToolExecutor};
use crate::policy::{ApiKeySource, ChatMessage, OpenAiConfig, Policy, PolicyConfig, ScriptedConfig, ToolSpec};
use crate::rewards::{ComponentSpec, RewardCalculator, RewardSpec, ScheduleEntry, WeightSchedule};
use crate::tools::Tool;
use crate::tools::exec::{ExecTool, ProgramProblem};
use crate::tools::http::{HttpTool, RateLimit};
use crate::tools::recorded::{RecordedTool, Recording};

/// The environment variable a pod's API key arrives in when the task names a Secret.
pub const API_KEY_ENV: &str = "BASECAMP_POLICY_API_KEY";

/// Where and as what this runner runs.
#[derive(Debug, Clone, Default)]
pub struct RunContext {
    /// Directory relative paths in the manifests are resolved against.
    pub base_dir: PathBuf,
    pub namespace: String,
    pub task: String,
    pub variant: String,
    pub shard: u32,
    pub shard_count: u32,
    pub training_step: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("tool {tool}: {message}")]
    Tool { tool: String, message: String },
    #[error("policy: {0}")]
    Policy(String),
    #[error("rewards: {0}")]
    Rewards(String),
    #[error("{field}: {value} is not a positive duration")]
    Duration { field: String, value: String },
    /// An exec tool whose program cannot be started: every call would fail.
    #[error("{field}: {message}")]
    ExecProgram { field: String, message: String },
}

impl ConfigError {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Tool { .. } => "ToolConfig",
            Self::Policy(_) => "PolicyConfig",
            Self::Rewards(_) => "RewardsConfig",
            Self::Duration { .. } => "InvalidDuration",
            Self::ExecProgram { .. } => "ExecProgramUnavailable",
        }
    }
}

fn positive(d: basecamp_api::Duration, field: impl Into<String>) -> Result<std::time::Duration, ConfigError> {
    d.to_std()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ConfigError::Duration { field: field.into(), value: d.to_string() })
}

fn resolve(base: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() { p.to_path_buf() } else { base.join(p) }
}

/// Reward component -> the metric it scores (`source`).
pub type RewardSources = BTreeMap<String, String>;

/// The sandbox's reward calculator and each component's metric source
/// (`None` without reward components). Preprocessors score with the same one.
pub fn reward_calculator(
    sandbox: &SandboxConfigSpec,
) -> Result<Option<(RewardCalculator, RewardSources)>, ConfigError> {
    let Some(r) = sandbox.rewards.as_ref().filter(|r| !r.components.is_empty()) else { return Ok(None) };
    let spec = RewardSpec {
        components: r.components.iter().map(|(n, c)| (n.clone(), ComponentSpec { weight: c.weight })).collect(),
        schedule: WeightSchedule(
            r.weight_schedule
                .iter()
                .map(|c| ScheduleEntry { at_training_step: c.at_training_step, weights: c.weights.clone() })
                .collect(),
        ),
    };
    let calculator = RewardCalculator::new(&spec).map_err(|e| ConfigError::Rewards(e.to_string()))?;
    let sources = r.components.iter().filter_map(|(n, c)| Some((n.clone(), c.source.clone()?))).collect();
    Ok(Some((calculator, sources)))
}

/// Builds the runner for one variant. `sandbox` must be resolved (profile applied).
pub fn build_runner(
    task: &HarnessTaskSpec,
    sandbox: &SandboxConfigSpec,
    ctx: &RunContext,
) -> Result<EpisodeRunner, ConfigError> {
    build_runner_with_policy(task, sandbox, ctx, build_policy(task, sandbox, &ctx.base_dir)?)
}

/// The policy of a variant's episodes: a scripted policy's file read and
/// checked, an API key read. It needs neither the sandbox's services nor
/// an output directory, so a caller can build it before either, and a
/// policy refused then leaves nothing behind.
pub fn build_policy(
    task: &HarnessTaskSpec,
    sandbox: &SandboxConfigSpec,
    base_dir: &Path,
) -> Result<Policy, ConfigError> {
    Policy::from_config(&policy_config(&task.policy, base_dir, sandbox.trace.top_k())?)
        .map_err(|e| ConfigError::Policy(e.to_string()))
}

/// [`build_runner`] with the policy built already, by [`build_policy`].
pub fn build_runner_with_policy(
    task: &HarnessTaskSpec,
    sandbox: &SandboxConfigSpec,
    ctx: &RunContext,
    policy: Policy,
) -> Result<EpisodeRunner, ConfigError> {
    let executor = build_executor(sandbox, &ctx.base_dir)?;
    let policy_readiness = crate::readiness::Readiness::after_an_outage(&task.policy, &policy);
    let tools = sandbox
        .tools
        .iter()
        .map(|(name, spec)| {
            ToolSpec::new(
                name.clone(),
                spec.description.clone().unwrap_or_default(),
                spec.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
            )
        })
        .collect();
    let top_k = sandbox.trace.top_k();
    let (rewards, reward_sources) = match reward_calculator(sandbox)? {
        Some((calculator, sources)) => (Some(calculator), sources),
        None => (None, BTreeMap::new()),
    };
    let injections = sandbox
        .injections
        .iter()
        .enumerate()
        .filter_map(|(i, inj)| {
            let when = match (&inj.at_step, &inj.after_tool, &inj.when_memory) {
                (Some(step), _, _) => InjectionWhen::AtStep(*step),
                (None, Some(tool), _) => InjectionWhen::AfterTool(tool.clone()),
                (None, None, Some(m)) => InjectionWhen::MemoryEquals { key: m.key.clone(), value: m.equals.clone() },
                (None, None, None) => return None,
            };
            Some(ScheduledInjection {
                id: format!("injection-{i}"),
                when,
                observation: inj.observation.clone(),
                description: inj.description.clone().unwrap_or_default(),
            })
        })
        .collect();
    let config_json = serde_json::to_value(sandbox).unwrap_or(Value::Null);
    let header = Header {
        namespace: ctx.namespace.clone(),
        task: ctx.task.clone(),
        variant: ctx.variant.clone(),
        shard: ctx.shard,
        shard_count: ctx.shard_count,
        config_hash: hash_json(&config_json).0.to_vec(),
        producer_versions: [("basecamp-sandbox".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        // The alternatives per token: what raw logits are reduced to, and
        // what an OpenAI-compatible server is asked for unless the policy says.
        top_k,
        ..Default::default()
    };
    Ok(EpisodeRunner {
        executor,
        policy,
        tools,
        system_prompt: task.task_definition.description.clone(),
        max_steps: sandbox.max_steps(),
        plan_step_timeout: positive(sandbox.plan_step_timeout(), "spec.planStepTimeout")?,
        rollback_enabled: sandbox.rollback.enabled(),
        checkpoint_every: sandbox.rollback.checkpoint_every(),
        snapshot_interval: sandbox.trace.memory_snapshot_interval(),
        error_context: sandbox.trace.error_context(),
        injections,
        rewards,
        reward_sources,
        training_step: ctx.training_step,
        header,
        live: LiveInjections::default(),
        metrics: None,
        logits: Default::default(),
        policy_readiness,
    })
}

fn exec_tool(exec: &basecamp_api::tool::ExecTool, base_dir: &Path) -> ExecTool {
    let mut tool = ExecTool::new(exec.command.clone());
    tool.env = exec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    tool.working_dir =
        Some(exec.working_dir.as_deref().map_or_else(|| base_dir.to_path_buf(), |d| resolve(base_dir, d)));
    tool
}

/// Why exec tool `name` cannot start: the field and what is wrong.
fn exec_program_problem(name: &str, tool: &ExecTool) -> Option<(String, String)> {
    Some(match tool.cannot_start()? {
        ProgramProblem::Program(m) => (format!("spec.tools.{name}.exec.command[0]"), m),
        ProgramProblem::WorkingDir(m) => (format!("spec.tools.{name}.exec.workingDir"), m),
    })
}

/// The programs of a sandbox that cannot start on this machine, each exec
/// tool's and each service's, as (field path, what is wrong): what a run
/// from `base_dir` refuses before its first episode, for `harness
/// validate` to say first. A program named through a `$(services.…)`
/// reference is known only once the services run, and not judged here.
pub fn program_problems(sandbox: &SandboxConfigSpec, base_dir: &Path) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    for (name, exec) in sandbox.tools.iter().filter_map(|(name, spec)| Some((name, spec.exec.as_ref()?))) {
        // An empty command is validation's to say.
        if exec.command.first().is_some_and(|program| !program.trim().is_empty() && !program.contains("$(services.")) {
            problems.extend(exec_program_problem(name, &exec_tool(exec, base_dir)));
        }
    }
    for (name, service) in
        sandbox.services.iter().filter(|(_, s)| s.command.first().is_some_and(|p| !p.trim().is_empty()))
    {
        if let Some(message) = crate::services::program_problem(service, base_dir) {
            problems.push((format!("spec.services.{name}.command[0]"), message));
        }
    }
    problems
}

/// The tools of a sandbox with their timeouts, fallbacks and memory policy.
pub fn build_executor(sandbox: &SandboxConfigSpec, base_dir: &Path) -> Result<ToolExecutor, ConfigError> {
    let null_writes = match sandbox.memory.null_writes() {
        ApiNullWrites::Allow => NullWrites::Allow,
        ApiNullWrites::Warn => NullWrites::Warn,
        ApiNullWrites::Error => NullWrites::Error,
    };
    let mut executor = ToolExecutor::new(null_writes);
    if sandbox.memory.strict_types {
        for (key, ty) in &sandbox.memory.schema {
            let name = serde_json::to_value(ty).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
            executor.require_memory_type(key.clone(), name);
        }
    }
    // Each fixture file is read once, however many tools answer from it,
    // and each tool takes its own lines.
    let mut fixtures: HashMap<PathBuf, HashMap<String, Vec<FixtureEntry>>> = HashMap::new();
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| ConfigError::Tool { tool: "*".into(), message: format!("cannot build the HTTP client: {e}") })?;
    for (name, spec) in &sandbox.tools {
        let err = |message: String| ConfigError::Tool { tool: name.clone(), message };
        let tool = if let Some(http) = &spec.http {
            let method = match http.method.unwrap_or(HttpMethod::Get) {
                HttpMethod::Get => reqwest::Method::GET,
                HttpMethod::Post => reqwest::Method::POST,
                HttpMethod::Put => reqwest::Method::PUT,
                HttpMethod::Patch => reqwest::Method::PATCH,
                HttpMethod::Delete => reqwest::Method::DELETE,
            };
            let mut tool = HttpTool::new(client.clone(), method, http.url.clone());
            tool.headers = http.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            tool.retry = http.retry.clone();
            if let Some(body) = &http.body {
                let template = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.clone()));
                tool.body_template = Some(template);
            }
            if let Some(limit) = &http.rate_limit {
                tool = tool
                    .with_rate_limit(RateLimit {
                        requests_per_second: limit.requests_per_second,
                        burst: limit.burst.unwrap_or(1),
                    })
                    .map_err(err)?;
            }
            Tool::Http(tool)
        } else if let Some(exec) = &spec.exec {
            let tool = exec_tool(exec, base_dir);
            // Checked now: a program that cannot start failed every call with a spawn error, exit 0.
            if let Some((field, message)) = exec_program_problem(name, &tool) {
                return Err(ConfigError::ExecProgram { field, message });
            }
            Tool::Exec(tool)
        } else if let Some(recorded) = &spec.recorded {
            let path = resolve(base_dir, &recorded.fixture);
            let lines = match fixtures.entry(path) {
                Entry::Occupied(loaded) => loaded.into_mut(),
                Entry::Vacant(slot) => {
                    let fixture = basecamp_api::fixture::Fixture::load(slot.key()).map_err(|e| err(e.to_string()))?;
                    slot.insert(by_tool(fixture.entries))
                }
            };
            let match_by = recorded.match_by.unwrap_or_default();
            let by_args = match_by == RecordedMatch::Args;
            let recordings = lines.remove(name).unwrap_or_default().into_iter().map(|e| Recording {
                tool: e.tool,
                arguments: by_args.then_some(Value::Object(e.arguments)),
                // As a live tool answers: `memory` is written, then `memory_remove` deleted.
                response: match (e.memory_patch, e.memory_remove) {
                    (None, None) if e.observation.get("observation").is_some() => json!({"observation": e.observation}),
                    (None, None) => e.observation,
                    (patch, remove) => json!({"observation": e.observation, "memory": patch, "memory_remove": remove}),
                },
                // A recorded timeout never answers: the executor's timeout and the fallback apply.
                timeout: e.timeout,
                latency: e.latency_ms,
                error: e.error,
                error_type: e.error_type,
            });
            let tool = RecordedTool::new(name, recordings).from_file(&recorded.fixture);
            Tool::Recorded(if match_by == RecordedMatch::Cycle { tool.cycling() } else { tool })
        } else {
            return Err(err("defines none of http, exec, recorded".into()));
        };
        executor.add_tool(
            name.clone(),
            ToolDef {
                tool,
                timeout: positive(sandbox.tool_timeout_for(name), format!("spec.toolTimeouts.{name}"))?,
                fallback: sandbox.fallbacks.get(name).map(fallback),
                memory_map: spec.memory_patch.iter().map(|(k, p)| (k.clone(), p.clone())).collect(),
            },
        );
    }
    Ok(executor)
}

/// A fixture's lines by the tool they answer for, in file order.
fn by_tool(entries: Vec<FixtureEntry>) -> HashMap<String, Vec<FixtureEntry>> {
    let mut tools: HashMap<String, Vec<FixtureEntry>> = HashMap::new();
    for entry in entries {
        tools.entry(entry.tool.clone()).or_default().push(entry);
    }
    tools
}

fn fallback(f: &ApiFallback) -> Fallback {
    Fallback {
        observation: f.observation.clone(),
        memory_patch: f.memory_patch.as_ref().map(MemoryPatch::from_object).unwrap_or_default(),
    }
}

/// The policy's configuration; an OpenAI-compatible server is asked for
/// `top_logprobs` (`policy.topLogprobs`, else the sandbox's `trace.topK`).
fn policy_config(spec: &PolicySpec, base_dir: &Path, top_k: u32) -> Result<PolicyConfig, ConfigError> {
    if let Some(script) = &spec.scripted {
        return Ok(PolicyConfig::Scripted(ScriptedConfig { path: resolve(base_dir, script) }));
    }
    let endpoint =
        spec.effective_endpoint().ok_or_else(|| ConfigError::Policy("set endpoint, server or scripted".into()))?;
    let mut config = OpenAiConfig::new(endpoint, spec.model.clone().unwrap_or_default());
    config.api_key = if let Some(env) = &spec.api_key_env {
        ApiKeySource::Env(env.clone())
    } else if let Some(file) = &spec.api_key_file {
        ApiKeySource::File(resolve(base_dir, file))
    } else if spec.api_key_secret.is_some() {
        ApiKeySource::Env(API_KEY_ENV.into())
    } else {
        ApiKeySource::None
    };
    config.temperature = spec.temperature;
    config.max_tokens = spec.max_tokens;
    config.top_logprobs = spec.top_logprobs.unwrap_or(top_k);
    config.request_timeout = positive(spec.request_timeout(), "spec.policy.requestTimeout")?;
    Ok(PolicyConfig::OpenAi(Box::new(config)))
}

/// A test-set row as the runner needs it; `compare_args` are the task's
/// per-tool defaults, used where a row does not say. A message that is not
/// a chat message (a role the policy has no place for, content that is not
/// text) is an error naming it: it was dropped without a word, and the
/// episode ran without it.
pub fn episode_input(row: &Episode, compare_args: &BTreeMap<String, Vec<String>>) -> Result<EpisodeInput, String> {
    let mut messages = Vec::new();
    for (i, message) in row.messages.iter().flatten().enumerate() {
        let message: ChatMessage =
            serde_json::from_value(message.clone()).map_err(|e| format!("messages[{i}]: {e}"))?;
        messages.push(message);
    }
    if let Some(instruction) = &row.instruction {
        messages.push(ChatMessage::user(instruction.clone()));
    }
    Ok(EpisodeInput {
        id: row.id.clone(),
        row_id: Some(row.id.clone()),
        messages,
        initial_memory: row.initial_memory.clone().unwrap_or_default(),
        expected_calls: row
            .expected_tool_calls
            .iter()
            .map(|c| {
                let compare = c.compare_args.clone().or_else(|| compare_args.get(&c.name).cloned());
                (c.name.clone(), c.arguments.clone(), compare)
            })
            .collect(),
        expected_memory: row.expected_memory.clone(),
        expected_memory_hash: row.expected_memory_hash.clone(),
    })
}
