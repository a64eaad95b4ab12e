//! `basecamp trace replay FILE --config MANIFEST...`: re-executes a recorded
//! episode (FILE, or one `s3://BUCKET/KEY.trace` object) through the sandbox — the same executor, memory policy,
//! fallbacks, rewards and metrics — with the policy's recorded outputs and
//! the tools' recorded responses, then compares the new trace with the old
//! one and reports "identical" or the first divergence (step, field,
//! recorded vs replayed).
//!
//! The manifests give what a trace does not hold (without `--config`, those
//! of the `basecamp run` whose directory holds the trace, named in its
//! `run.json`): the SandboxConfig (memory
//! patches, fallbacks, timeouts, rewards) and the test-set row (the input
//! and the expectations the metrics are scored against). Every tool becomes
//! a `recorded` tool answering in call order from the trace, with the memory
//! the tool itself wrote (its answer's `memory` and `memory_remove`, from the
//! call's memory deltas), so the memory policy judges those writes again; a
//! call that timed out times out again, one that failed fails with the same
//! error type, so the fallback path is exercised for real; live injections are
//! delivered again at the step they reached. Each answer, and each policy
//! turn, takes the time it took when recorded, on a paused clock (no real
//! waiting), so the calls of a step use up its planStepTimeout as they did
//! and a call is cut by it where it was cut. A divergence therefore
//! means the sandbox or its configuration no longer does what it did when
//! the trace was written.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use basecamp_api::task::PolicySpec;
use basecamp_api::tool::{RecordedMatch, RecordedTool, ToolSpec};
use basecamp_sandbox::config::{RunContext, build_runner, episode_input};
use basecamp_sandbox::deadline::Timer;
use basecamp_sandbox::episode::{EpisodeInput, LiveInjection};
use basecamp_sandbox::run::{load_manifests, load_test_set, resolve_variants, select_task};
use basecamp_trace::pb::{self, record::Body};
use serde_json::{Value, json};

use crate::run::summary::RUN_FILE;

/// Re-execute a recorded episode and report the first divergence.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The .trace file to replay, or one s3://BUCKET/KEY.trace object.
    pub file: PathBuf,
    /// The manifests the episode ran with (HarnessTask, SandboxConfig, test
    /// set); default: those of the `basecamp run` whose directory holds FILE.
    #[arg(long = "config")]
    pub config: Vec<PathBuf>,
    /// The variant (default: the trace header's).
    #[arg(long)]
    pub variant: Option<String>,
    /// Keep the replayed trace here (default: a temporary directory, removed).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The first place two traces differ.
#[derive(Debug, PartialEq)]
pub struct Divergence {
    pub record: usize,
    pub step: u32,
    pub section: &'static str,
    pub field: &'static str,
    pub recorded: String,
    pub replayed: String,
}

pub fn run(args: ReplayArgs) -> Result<ExitCode> {
    // As context, not formatted in: main prints the causes once each.
    let recorded = crate::trace_cmd::parse::read_one(&args.file)
        .with_context(|| format!("cannot replay {}", args.file.display()))?;
    if let Some(damage) = recorded.damage() {
        bail!(
            "cannot replay {}: the trace is incomplete ({damage}); replay needs a finished episode",
            args.file.display()
        );
    }
    // Cut off by a stop or a client's close: its end is not the episode's to reproduce.
    let cancelled = recorded
        .records
        .iter()
        .any(|r| matches!(&r.body, Some(Body::EpisodeEnd(end)) if end.outcome == pb::Outcome::Cancelled as i32));
    if cancelled {
        let why = recorded
            .records
            .iter()
            .find_map(|r| match &r.body {
                Some(Body::ErrorContext(e)) if e.error_type == "cancelled" => Some(format!(" ({})", e.message)),
                _ => None,
            })
            .unwrap_or_default();
        bail!(
            "cannot replay {}: the episode was cancelled before it finished{why}; replay needs a finished episode",
            args.file.display()
        );
    }
    let header = recorded.header.clone();
    let manifests = if args.config.is_empty() {
        let (run_file, manifests) = manifests_of_run(&args.file, &header.task)
            .with_context(|| format!("cannot replay {}", args.file.display()))?;
        basecamp_sandbox::stderr_line!("manifests: {} (from {})", join_paths(&manifests), run_file.display());
        manifests
    } else {
        args.config.clone()
    };
    // Without --out, a fresh temporary directory (removed when dropped),
    // named without the episode id: that comes from the trace, and a
    // `x/../y` there would otherwise pick the directory that gets removed.
    let temporary;
    let scratch = match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            // Absolute: the sandbox resolves the fixture and script paths
            // against this directory, which would double a relative one.
            std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))?
        }
        None => {
            temporary = tempfile::Builder::new()
                .prefix("basecamp-replay-")
                .tempdir()
                .context("cannot create a temporary directory for the replay")?;
            temporary.path().to_path_buf()
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let prepared = runtime.block_on(prepare(&args, &manifests, &recorded.records, &header, &scratch))?;
    let replayed = prepared.run()?;
    let compared = comparable(&recorded.records).count();
    match first_divergence(&recorded.records, &replayed) {
        None => {
            writeln!(
                std::io::stdout(),
                "identical: {} ({compared} records: plan steps, memory deltas, rewards, episode end)",
                args.file.display()
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Some(d) => {
            writeln!(
                std::io::stdout(),
                "diverged: {} at step {} (record {} of {compared}, {}): {} recorded {} vs replayed {}",
                args.file.display(),
                d.step,
                d.record + 1,
                d.section,
                d.field,
                d.recorded,
                d.replayed
            )?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// What `trace replay` reads of a `basecamp run`'s `run.json`.
#[derive(serde::Deserialize)]
struct RunManifests {
    task: String,
    #[serde(default)]
    manifests: Vec<PathBuf>,
}

/// The manifests of the `basecamp run` whose directory holds `trace`: the
/// nearest `run.json` above it (`<out>/<variant>/shard-<i>/<episode>.trace`)
/// of the trace's task.
fn manifests_of_run(trace: &Path, task: &str) -> Result<(PathBuf, Vec<PathBuf>)> {
    let pass_config = "pass --config with the HarnessTask, its SandboxConfig and the test set the episode ran with";
    // Not a local path: read as one, its ancestors would end in the working directory.
    if trace.to_str().is_some_and(|t| t.starts_with("s3://")) {
        bail!("no --config, and an S3 object is in no `basecamp run` directory; {pass_config}");
    }
    let run_file = std::path::absolute(trace)
        .ok()
        .and_then(|trace| trace.ancestors().skip(1).take(4).map(|dir| dir.join(RUN_FILE)).find(|f| f.is_file()))
        .ok_or_else(|| anyhow!("no --config, and no {RUN_FILE} of a `basecamp run` above the trace; {pass_config}"))?;
    let text = std::fs::read(&run_file).with_context(|| format!("cannot read {}", run_file.display()))?;
    let run: RunManifests = serde_json::from_slice(&text)
        .map_err(|e| anyhow!("{} is not a `basecamp run` summary ({e}); {pass_config}", run_file.display()))?;
    if run.task != task {
        bail!("{} is a run of task {:?}, the trace of task {task:?}; {pass_config}", run_file.display(), run.task);
    }
    if run.manifests.is_empty() {
        bail!("{} does not name its manifests (a run before they were recorded); {pass_config}", run_file.display());
    }
    Ok((run_file, run.manifests))
}

fn join_paths(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" ")
}

/// A replay ready to run: the sandbox with recorded tools and policy, the
/// episode's input, and where the replayed trace goes.
struct Prepared {
    runner: basecamp_sandbox::episode::EpisodeRunner,
    input: basecamp_sandbox::episode::EpisodeInput,
    out: PathBuf,
}

impl Prepared {
    /// Runs the episode on paused time: tokio's clock stands still while
    /// anything is running and jumps to the next timer when all wait. The
    /// recorded tools and policy take their recorded latencies and the tools'
    /// timeouts and the plan-step deadline fire on that clock, so a call is
    /// cut (or not) where the recording cut it, without waiting in real time
    /// for the minutes an episode took. tokio's timer ends each wait on its
    /// next millisecond, so a replayed step runs up to a millisecond a call
    /// longer than recorded. Time outside the tools and the policy
    /// (the recording's own bookkeeping, raw-logits analysis) is not
    /// replayed: a call cut within that margin of a deadline may be cut
    /// differently.
    fn run(self) -> Result<Vec<pb::Record>> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build()?;
        let result =
            runtime.block_on(self.runner.run(&self.input, &self.out)).context("cannot write the replayed trace")?;
        let trace = self.out.join(&result.trace_file);
        let contents =
            basecamp_trace::read_trace(&trace).map_err(|e| anyhow!("the replayed trace does not read: {e}"))?;
        Ok(contents.records)
    }
}

async fn prepare(
    args: &ReplayArgs,
    manifests: &[PathBuf],
    records: &[pb::Record],
    header: &pb::Header,
    scratch: &Path,
) -> Result<Prepared> {
    let err = |e: basecamp_sandbox::run::RunError| anyhow!("{e}");
    let (manifests, _warnings) = load_manifests(manifests).map_err(err)?;
    // The header's namespace tells same-named tasks of two namespaces apart.
    let task =
        if header.namespace.is_empty() { header.task.clone() } else { format!("{}/{}", header.namespace, header.task) };
    let loaded = select_task(&manifests, Some(&task)).map_err(err)?;
    let task = &loaded.object;
    let variant_name = args.variant.clone().unwrap_or_else(|| header.variant.clone());
    let variant = resolve_variants(&manifests, task, Some(&variant_name)).map_err(err)?.remove(0);
    let base_dir = loaded.base_dir();
    let test_set = load_test_set(&task.spec.evaluation.test_set, &base_dir).await.map_err(err)?;
    // Server mode names a row's episodes `<row>-<n>`; traces before schema 1.2 have no row_id.
    let row_id = if header.row_id.is_empty() { &header.episode_id } else { &header.row_id };
    let row = test_set.episodes.iter().find(|e| &e.id == row_id).ok_or_else(|| {
        let inline = if header.row_id.is_empty() {
            " (an episode created in server mode with its fields inline has no row to replay)"
        } else {
            ""
        };
        anyhow!(
            "episode {}: no row {row_id:?} in the test set {}{inline}",
            header.episode_id,
            task.spec.evaluation.test_set
        )
    })?;

    let fixture = scratch.join("replay-tools.jsonl");
    std::fs::write(&fixture, tool_fixture(records, &variant.sandbox.tools)?)?;
    let script = scratch.join("replay-policy.jsonl");
    std::fs::write(&script, policy_script(records)?)?;

    let mut sandbox = variant.sandbox.clone();
    sandbox.services.clear();
    for tool in sandbox.tools.values_mut() {
        tool.http = None;
        tool.exec = None;
        tool.recorded = Some(RecordedTool {
            fixture: fixture.to_string_lossy().into_owned(),
            match_by: Some(RecordedMatch::Sequence),
        });
    }
    let mut spec = task.spec.clone();
    spec.policy = PolicySpec { scripted: Some(script.to_string_lossy().into_owned()), ..Default::default() };
    let ctx = RunContext {
        base_dir: scratch.to_path_buf(),
        namespace: header.namespace.clone(),
        task: header.task.clone(),
        variant: variant.name.clone(),
        shard: header.shard,
        shard_count: header.shard_count,
        training_step: header.training_step,
    };
    let mut runner =
        build_runner(&spec, &sandbox, &ctx).map_err(|e| anyhow!("cannot build the replay sandbox: {e}"))?;
    // Tool timeouts on tokio's clock, which the replay pauses (`Prepared::run`).
    runner.executor.set_timer(Timer::Tokio);
    // Live injections came from outside (`basecamp sandbox inject`), like the
    // tools' answers: delivered again at the step they reached.
    for record in records {
        if let Some(Body::Injection(injection)) = &record.body
            && injection.trigger == pb::InjectionTrigger::Live as i32
        {
            let observation = parse_json(&injection.observation_json, "live injection")
                .with_context(|| format!("step {} (injection {})", record.step, injection.id))?;
            runner.live.push(
                &header.episode_id,
                LiveInjection { id: injection.id.clone(), observation, at_step: Some(record.step) },
            );
        }
    }
    let input = episode_input(row, &spec.evaluation.compare_args)
        .map_err(|e| anyhow::anyhow!("test set row {:?}: {e}", row.id))?;
    let input = EpisodeInput { id: header.episode_id.clone(), ..input };
    let out = scratch.join("replayed");
    std::fs::create_dir_all(&out)?;
    Ok(Prepared { runner, input, out })
}

fn parse_json(text: &str, what: &str) -> Result<Value> {
    if text.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(text).with_context(|| format!("the trace's {what} is not JSON"))
}

/// Refusals made before a tool is called: such a call asks no tool, so it
/// has no answer in the fixture (it would take the tool's next one).
const REFUSED_UNCALLED: [&str; 2] = ["invalid_arguments", "unknown_tool"];

/// Refusals of a tool's memory write, made after it answered: its answer
/// goes in the fixture, and the memory policy refuses the write again.
const REFUSED_AFTER_ANSWER: [&str; 3] = ["null_write_refused", "memory_type", "memory_key"];

/// A recorded latency in milliseconds, taken again by the replay; longer
/// than any spec duration (168h) it is damage, said where it is (the replay
/// sandbox would refuse its own fixture naming another tool and a temporary file).
fn recorded_millis(micros: u64) -> Result<f64> {
    let most = basecamp_api::duration::MAX_SPEC_DURATION;
    if micros / 1000 > most.as_millis().unsigned_abs() {
        bail!(
            "the recorded latency of {micros} µs is longer than anything may take ({most}); the trace is damaged there"
        );
    }
    Ok(micros as f64 / 1000.0)
}

/// The tools' recorded answers, in call order, as a fixture. An answer
/// carries the memory its tool wrote, so the replayed call writes it again
/// under the memory policy of the replay's configuration.
fn tool_fixture(records: &[pb::Record], tools: &BTreeMap<String, ToolSpec>) -> Result<String> {
    let mut lines = String::new();
    for (index, record) in records.iter().enumerate() {
        let Some(Body::PlanStep(step)) = &record.body else { continue };
        if step.kind != pb::StepKind::ToolCall as i32 || step.tool.is_empty() {
            continue;
        }
        let refused = step.status == pb::StepStatus::Refused as i32;
        if refused && REFUSED_UNCALLED.contains(&step.error_type.as_str()) {
            continue;
        }
        let mut entry = json!({"tool": step.tool});
        // Only for a reader of the fixture: replay answers calls in sequence.
        if let Ok(arguments @ Value::Object(_)) = serde_json::from_str::<Value>(&step.arguments_json) {
            entry["arguments"] = arguments;
        }
        let answered = (step.status == pb::StepStatus::Ok as i32 && !step.fallback_used)
            || (refused && REFUSED_AFTER_ANSWER.contains(&step.error_type.as_str()));
        let timed_out = step.error_type == "timeout" || step.error_type == "plan_step_timeout";
        if !timed_out && step.latency_micros > 0 {
            // The call takes its time again: later calls of the step, and
            // its plan-step deadline, see the time it used.
            let latency = recorded_millis(step.latency_micros)
                .with_context(|| format!("step {} ({})", record.step, step.tool))?;
            entry["latencyMs"] = json!(latency);
        }
        if answered {
            let observation = parse_json(&step.observation_json, "tool observation")
                .with_context(|| format!("step {} ({})", record.step, step.tool))?;
            let memory_map = tools.get(&step.tool).map(|t| &t.memory_patch);
            let (set, remove) = memory_written_by_tool(step, &records[index + 1..], &observation, memory_map)
                .with_context(|| format!("step {} ({})", record.step, step.tool))?;
            if !set.is_empty() {
                entry["memoryPatch"] = Value::Object(set);
            }
            if !remove.is_empty() {
                entry["memoryRemove"] = json!(remove);
            }
            entry["observation"] = observation;
        } else if timed_out {
            // Never answers: the tool's timeout, or the plan step's, ends it again.
            entry["timeout"] = json!(true);
        } else {
            let error_type = if step.error_type.is_empty() { "tool_error" } else { step.error_type.as_str() };
            // The recorded message is the call's ("tool NAME exited with …"):
            // the replayed tool fails with the tool's own part, which the call
            // names again.
            let prefix = format!("tool {} ", step.tool);
            let message = step.error_message.strip_prefix(&prefix).unwrap_or(&step.error_message);
            entry["error"] = json!(message);
            entry["errorType"] = json!(error_type);
        }
        lines.push_str(&entry.to_string());
        lines.push('\n');
    }
    Ok(lines)
}

/// What a call's tool itself wrote to memory (the `memory` and
/// `memory_remove` of its answer): the call's memory deltas, which follow its
/// plan step record, and the writes the memory policy refused (in the plan
/// step: they changed nothing), less the writes its SandboxConfig
/// `memoryPatch` makes from the observation (the replay makes those again).
/// Deltas record the writes that changed memory, in order: the answer's keys
/// set, its keys removed, then the `memoryPatch` writes.
fn memory_written_by_tool(
    step: &pb::PlanStep,
    after_step: &[pb::Record],
    observation: &Value,
    memory_map: Option<&BTreeMap<String, String>>,
) -> Result<(serde_json::Map<String, Value>, Vec<String>)> {
    let (mut set, mut remove) = (serde_json::Map::new(), Vec::new());
    let mut own_write = |key: &str, value: Value| {
        let mapped = memory_map
            .and_then(|map| map.get(key))
            .and_then(|pointer| observation.pointer(pointer))
            .is_some_and(|from_observation| *from_observation == value);
        if !mapped {
            set.insert(key.to_string(), value);
        }
    };
    let deltas = after_step.iter().map_while(|r| match &r.body {
        Some(Body::MemoryDelta(delta)) => Some(delta),
        _ => None,
    });
    for delta in deltas.filter(|d| d.source == pb::MemorySource::Tool as i32 && d.origin == step.tool) {
        let Some(after) = &delta.after_json else {
            remove.push(delta.key.clone());
            continue;
        };
        let value = parse_json(after, "memory delta").with_context(|| format!("memory key {}", delta.key))?;
        own_write(&delta.key, value);
    }
    for (key, value) in &step.refused_memory_json {
        let value = parse_json(value, "refused memory write").with_context(|| format!("memory key {key}"))?;
        own_write(key, value);
    }
    Ok((set, remove))
}

/// The policy's recorded turns (with their token logprobs) as a script.
fn policy_script(records: &[pb::Record]) -> Result<String> {
    let mut turns: Vec<Value> = Vec::new();
    for record in records {
        match &record.body {
            Some(Body::PolicyTurn(turn)) => {
                let mut response = json!({});
                if !turn.content.is_empty() {
                    response["content"] = json!(turn.content);
                }
                let calls = parse_json(&turn.tool_calls_json, "policy tool calls")
                    .with_context(|| format!("step {} (the policy's turn)", record.step))?;
                if let Some(calls) = calls.as_array().filter(|c| !c.is_empty()) {
                    let scripted: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            json!({"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                        })
                        .collect();
                    response["tool_calls"] = Value::Array(scripted);
                }
                if response.as_object().is_some_and(|o| o.is_empty()) {
                    response["content"] = json!("");
                }
                if !turn.finish_reason.is_empty() {
                    response["finish_reason"] = json!(turn.finish_reason);
                }
                // The policy's time counts against the plan step too.
                if turn.latency_micros > 0 {
                    let delay = recorded_millis(turn.latency_micros)
                        .with_context(|| format!("step {} (the policy's turn)", record.step))?;
                    response["delay_ms"] = json!(delay);
                }
                turns.push(response);
            }
            Some(Body::TokenLogit(token)) => {
                let Some(turn) = turns.last_mut() else { continue };
                let top: Vec<Value> = token
                    .top_tokens
                    .iter()
                    .zip(&token.top_logprobs)
                    .zip(token.top_ids.iter().map(Some).chain(std::iter::repeat(None)))
                    .map(|((t, lp), id)| match id.filter(|id| **id >= 0) {
                        Some(id) => json!({"token": t, "logprob": lp, "token_id": id}),
                        None => json!({"token": t, "logprob": lp}),
                    })
                    .collect();
                let mut entry = json!({"token": token.token, "logprob": token.logprob, "top_logprobs": top});
                if token.token_id >= 0 {
                    entry["token_id"] = json!(token.token_id);
                }
                // What the raw logits gave when the trace was recorded (they
                // are not in the trace), so logit_divergence replays too.
                if let Some(entropy) = token.entropy {
                    entry["entropy"] = json!(entropy);
                }
                match token.kl {
                    Some(kl) if kl.is_infinite() => entry["kl"] = json!("inf"),
                    Some(kl) => entry["kl"] = json!(kl),
                    None => {}
                }
                match turn.get_mut("logprobs").and_then(Value::as_array_mut) {
                    Some(list) => list.push(entry),
                    None => turn["logprobs"] = json!([entry]),
                }
            }
            _ => {}
        }
    }
    if turns.is_empty() {
        bail!("the trace holds no policy turns to replay");
    }
    Ok(turns.iter().map(|t| format!("{t}\n")).collect())
}

/// The records a replay must reproduce (timing and logits are left out).
fn comparable(records: &[pb::Record]) -> impl Iterator<Item = &pb::Record> {
    records.iter().filter(|r| {
        matches!(
            r.body,
            Some(
                Body::PlanStep(_)
                    | Body::MemoryDelta(_)
                    | Body::RewardSignal(_)
                    | Body::Injection(_)
                    | Body::EpisodeEnd(_)
            )
        )
    })
}

/// A proto enum value by its short lower-case name (`refused`, `tool_call`),
/// as `trace search` spells it; the number when this build does not know it.
fn enum_name<E: TryFrom<i32>>(value: i32, name: fn(&E) -> &'static str, prefix: &str) -> String {
    E::try_from(value).map_or_else(|_| value.to_string(), |e| name(&e).trim_start_matches(prefix).to_ascii_lowercase())
}

fn hex8(bytes: &[u8]) -> String {
    if bytes.is_empty() { "(none)".into() } else { hex::encode(&bytes[..bytes.len().min(8)]) }
}

/// (section, [(field, value)]) of a comparable record.
fn fields(record: &pb::Record) -> (&'static str, Vec<(&'static str, String)>) {
    match &record.body {
        Some(Body::PlanStep(s)) => (
            "plan_execution",
            vec![
                ("kind", enum_name(s.kind, pb::StepKind::as_str_name, "STEP_KIND_")),
                ("tool", s.tool.clone()),
                ("input_hash", hex8(&s.input_hash)),
                ("status", enum_name(s.status, pb::StepStatus::as_str_name, "STEP_STATUS_")),
                ("error_type", s.error_type.clone()),
                ("fallback_used", s.fallback_used.to_string()),
                ("result_hash", hex8(&s.result_hash)),
                ("memory_hash_before", hex8(&s.memory_hash_before)),
                ("memory_hash_after", hex8(&s.memory_hash_after)),
            ],
        ),
        Some(Body::MemoryDelta(d)) => (
            "memory_state",
            vec![
                ("key", d.key.clone()),
                ("before", d.before_json.clone().unwrap_or_else(|| "(absent)".into())),
                ("after", d.after_json.clone().unwrap_or_else(|| "(absent)".into())),
                ("source", enum_name(d.source, pb::MemorySource::as_str_name, "MEMORY_SOURCE_")),
                ("origin", d.origin.clone()),
            ],
        ),
        Some(Body::RewardSignal(r)) => {
            let mut f = vec![("weighted_sum", format!("{:.9}", r.weighted_sum))];
            f.extend(r.components.iter().map(|c| ("component", format!("{}={:.9}x{:.9}", c.name, c.score, c.weight))));
            ("reward_signal", f)
        }
        Some(Body::Injection(i)) => {
            ("injection", vec![("id", i.id.clone()), ("observation", i.observation_json.clone())])
        }
        Some(Body::EpisodeEnd(e)) => (
            "episode_end",
            vec![
                ("outcome", enum_name(e.outcome, pb::Outcome::as_str_name, "OUTCOME_")),
                ("steps", e.steps.to_string()),
                ("final_memory_hash", hex8(&e.final_memory_hash)),
            ],
        ),
        _ => ("other", Vec::new()),
    }
}

/// The first differing memory delta of `step` in two record runs.
fn first_delta_divergence(a: &[&pb::Record], b: &[&pb::Record], step: u32) -> Option<Divergence> {
    let deltas = |records: &[&pb::Record]| -> Vec<(usize, pb::Record)> {
        records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.step == step && matches!(r.body, Some(Body::MemoryDelta(_))))
            .map(|(i, r)| (i, (*r).clone()))
            .collect()
    };
    let (da, db) = (deltas(a), deltas(b));
    for k in 0..da.len().max(db.len()) {
        let (Some((i, x)), Some((_, y))) = (da.get(k), db.get(k)) else {
            let count = |d: &Vec<(usize, pb::Record)>| format!("{} memory deltas", d.len());
            return Some(Divergence {
                record: da.get(k).or(db.get(k)).map_or(0, |(i, _)| *i),
                step,
                section: "memory_state",
                field: "deltas",
                recorded: count(&da),
                replayed: count(&db),
            });
        };
        let ((_, fx), (_, fy)) = (fields(x), fields(y));
        if let Some(((field, vx), (_, vy))) = fx.iter().zip(&fy).find(|((_, vx), (_, vy))| vx != vy) {
            let key = fx.first().map_or(String::new(), |(_, k)| k.clone());
            let (recorded, replayed) =
                if *field == "key" { (vx.clone(), vy.clone()) } else { (format!("{key}={vx}"), format!("{key}={vy}")) };
            return Some(Divergence { record: *i, step, section: "memory_state", field, recorded, replayed });
        }
    }
    None
}

/// The first difference between the comparable records of two traces.
pub fn first_divergence(recorded: &[pb::Record], replayed: &[pb::Record]) -> Option<Divergence> {
    let (a, b): (Vec<_>, Vec<_>) = (comparable(recorded).collect(), comparable(replayed).collect());
    for i in 0..a.len().max(b.len()) {
        let (Some(x), Some(y)) = (a.get(i), b.get(i)) else {
            let missing = |r: Option<&&pb::Record>| r.map_or("(no record)".to_string(), |r| fields(r).0.to_string());
            return Some(Divergence {
                record: i,
                step: a.get(i).or(b.get(i)).map_or(0, |r| r.step),
                section: "records",
                field: "record",
                recorded: missing(a.get(i)),
                replayed: missing(b.get(i)),
            });
        };
        let ((section_x, fx), (section_y, fy)) = (fields(x), fields(y));
        if section_x != section_y {
            return Some(Divergence {
                record: i,
                step: x.step,
                section: "records",
                field: "section",
                recorded: section_x.into(),
                replayed: section_y.into(),
            });
        }
        for ((field, vx), (_, vy)) in fx.iter().zip(&fy) {
            if vx != vy {
                // A memory hash says that memory differs; the step's deltas say how.
                if field.starts_with("memory_hash")
                    && let Some(delta) = first_delta_divergence(&a[i..], &b[i..], x.step)
                {
                    return Some(Divergence { record: i + delta.record, ..delta });
                }
                return Some(Divergence {
                    record: i,
                    step: x.step,
                    section: section_x,
                    field,
                    recorded: vx.clone(),
                    replayed: vy.clone(),
                });
            }
        }
        if fx.len() != fy.len() {
            return Some(Divergence {
                record: i,
                step: x.step,
                section: section_x,
                field: "component",
                recorded: fx.len().to_string(),
                replayed: fy.len().to_string(),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_turns_take_their_recorded_time_and_a_timed_out_call_never_answers() {
        let call = |status: pb::StepStatus, error_type: &str, latency_micros: u64| pb::Record {
            step: 1,
            body: Some(Body::PlanStep(Box::new(pb::PlanStep {
                kind: pb::StepKind::ToolCall as i32,
                tool: "t".into(),
                status: status as i32,
                error_type: error_type.into(),
                observation_json: "{}".into(),
                latency_micros,
                ..Default::default()
            }))),
        };
        let records = [
            call(pb::StepStatus::Ok, "", 1_234),
            call(pb::StepStatus::Error, "http_status", 2_000_500),
            call(pb::StepStatus::Timeout, "timeout", 1_500_000),
            call(pb::StepStatus::RolledBack, "plan_step_timeout", 0),
        ];
        let fixture = tool_fixture(&records, &BTreeMap::new()).unwrap();
        let lines: Vec<Value> = fixture.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let latency: Vec<Option<f64>> = lines.iter().map(|l| l["latencyMs"].as_f64()).collect();
        assert_eq!(latency, [Some(1.234), Some(2000.5), None, None]);
        assert_eq!([&lines[2]["timeout"], &lines[3]["timeout"]], [&json!(true), &json!(true)]);

        let turn = |latency_micros: u64| pb::Record {
            step: 1,
            body: Some(Body::PolicyTurn(pb::PolicyTurn { content: "ok".into(), latency_micros, ..Default::default() })),
        };
        let script = policy_script(&[turn(750), turn(0)]).unwrap();
        let turns: Vec<Value> = script.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!((turns[0]["delay_ms"].as_f64(), turns[1].get("delay_ms")), (Some(0.75), None));

        // A latency no call can take is damage, said at its step (before: the replay sandbox refused
        // its own fixture, naming another tool and a temporary file).
        let err = tool_fixture(&[call(pb::StepStatus::Ok, "", u64::MAX)], &BTreeMap::new()).unwrap_err();
        assert!(
            format!("{err:#}").starts_with("step 1 (t): the recorded latency of 18446744073709551615 µs"),
            "{err:#}"
        );
        let err = policy_script(&[turn(u64::MAX)]).unwrap_err();
        assert!(format!("{err:#}").starts_with("step 1 (the policy's turn): the recorded latency"), "{err:#}");
    }

    #[test]
    fn the_policy_script_carries_recorded_entropy_and_kl_with_infinity_as_text() {
        let turn = pb::Record {
            step: 1,
            body: Some(Body::PolicyTurn(pb::PolicyTurn { content: "ok".into(), ..Default::default() })),
        };
        let token = |kl: Option<f32>| pb::Record {
            step: 1,
            body: Some(Body::TokenLogit(pb::TokenLogit {
                token: "o".into(),
                token_id: -1,
                logprob: -0.5,
                entropy: Some(1.5),
                kl,
                ..Default::default()
            })),
        };
        let script = policy_script(&[turn, token(Some(0.125)), token(Some(f32::INFINITY)), token(None)]).unwrap();
        let line: Value = serde_json::from_str(script.trim()).unwrap();
        let logprobs = line["logprobs"].as_array().unwrap();
        assert_eq!((&logprobs[0]["entropy"], &logprobs[0]["kl"]), (&json!(1.5), &json!(0.125)));
        assert_eq!(logprobs[1]["kl"], "inf");
        assert!(logprobs[2].get("kl").is_none(), "{script}");
    }
}
