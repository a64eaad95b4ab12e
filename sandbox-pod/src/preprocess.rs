//! Preprocessors (`dataPipeline.preprocessor`): traces into training rows
//! of `(state, action, reward)`.
//!
//! Each finished step of a trace becomes one *raw record* (a damaged
//! trace's steps before the one its damage cut: [`unfinished_step`]) — the
//! step's action (tool call or final answer), its observation and status,
//! memory before and after, the deltas and their sources, `truncated`
//! ([`is_truncated`]: the trace has no episode end, or the episode was
//! cancelled or ended by the policy's server or a service, so its reward is
//! no score of the agent's), and on the last step of an episode that ended the episode's
//! reward components — and a preprocessor turns each raw record into a
//! triple, which becomes a [`Row`] with the record's identity and
//! `truncated`:
//!
//! - `builtin:trajectory`: state = memory before the step (+ step index and
//!   the previous observation), action = the tool call or the final answer,
//!   reward = 0 until the last step, which carries the episode reward (a
//!   truncated episode has none: all its rows carry 0, which `truncated`
//!   says is no score);
//! - `exec:PROGRAM ARGS...`: a subprocess reading one raw record per line
//!   on stdin and writing one `[state, action, reward]` JSON line per record;
//! - `python:package.module.function`: a Python function `f(record) ->
//!   (state_dict, action_dict, reward)`, run through the same protocol.
//!
//! Rewards are always scored by the sandbox's own [`RewardCalculator`] (the
//! components' raw scores from the trace, the weights in force at the
//! training step), never by a second implementation — the classic way a
//! preprocessor's reward drifts from what the sandbox rewarded. A user
//! preprocessor gets that reward in the raw record (`episode_reward`; a
//! truncated record has none, its reward being unknown).
//!
//! Before a run, [`Subprocess::preflight`] imports/starts the preprocessor
//! and checks its answer on one record: a wrong shape fails with the record,
//! what came back and what was expected.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use basecamp_trace::metrics::ended_by_other_than_the_agent;
use basecamp_trace::pb::{self, record::Body};
use basecamp_trace::{TraceContents, TraceError};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::rewards::RewardCalculator;

pub use basecamp_api::preprocessor::{Preprocessor, PreprocessorSyntaxError, TRAJECTORY};

#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    #[error("preprocessor {0:?} is not one of builtin:trajectory, exec:PROGRAM ARGS..., python:module.function")]
    Unknown(String),
    #[error("preprocessor {name}: cannot start: {message}")]
    Start { name: String, message: String },
    #[error(
        "preprocessor {name} returned {got} for record {record}; expected [state_dict, action_dict, reward] \
         (a tuple of two objects and a number)"
    )]
    Shape { name: String, record: String, got: String },
    #[error("preprocessor {name} failed on record {record}: {message}")]
    Failed { name: String, record: String, message: String },
    #[error("reward: {0}")]
    Reward(String),
}

impl PreprocessError {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Unknown(_) => "UnknownPreprocessor",
            Self::Start { .. } => "PreprocessorStart",
            Self::Shape { .. } => "PreprocessorShape",
            Self::Failed { .. } => "PreprocessorFailed",
            Self::Reward(_) => "RewardsConfig",
        }
    }
}

/// The syntax is the API's (so validation refuses what a run would); a
/// command that cannot be split is, for a run, one that cannot start.
impl From<PreprocessorSyntaxError> for PreprocessError {
    fn from(error: PreprocessorSyntaxError) -> Self {
        match error {
            PreprocessorSyntaxError::Unknown(name) => Self::Unknown(name),
            PreprocessorSyntaxError::UnclosedQuote(name) => {
                Self::Start { name, message: "its command has an unclosed quote or a trailing backslash".into() }
            }
        }
    }
}

/// Parses a preprocessor name with the run's errors (and their categories).
pub fn parse_preprocessor(name: &str) -> Result<Preprocessor, PreprocessError> {
    Ok(name.parse::<Preprocessor>()?)
}

/// One training row. Its fields serialize in this order (a JSON Lines
/// row's keys, the Parquet columns).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The run's task (`<task>@step-N` for a checkpoint's evaluation) and
    /// variant: an episode id is unique only within them (an A/B run has
    /// each test-set row once per variant).
    pub task: String,
    pub variant: String,
    pub episode: String,
    pub step: u32,
    pub state: Value,
    pub action: Value,
    pub reward: f64,
    /// The episode was cut off by something other than the agent
    /// ([`is_truncated`]: its trace has no episode end, or it was cancelled
    /// or ended by the policy's server or a service): its reward is no score of the
    /// actions; `reward` is what the preprocessor made without it (0 from
    /// `builtin:trajectory`). A trainer that learns from rewards leaves
    /// these rows out.
    pub truncated: bool,
}

/// A record's row: its identity and `truncated` from the record, whatever
/// the preprocessor answered.
fn row_of(record: &Value, state: Value, action: Value, reward: f64) -> Row {
    Row {
        task: text_field(record, "task"),
        variant: text_field(record, "variant"),
        episode: text_field(record, "episode"),
        step: record["step"].as_u64().unwrap_or(0) as u32,
        state,
        action,
        reward,
        truncated: record["truncated"].as_bool().unwrap_or(false),
    }
}

/// A string field of a raw record (always present: [`raw_records`] writes it,
/// as it writes `step` and `truncated`).
fn text_field(record: &Value, key: &str) -> String {
    record[key].as_str().unwrap_or_default().to_string()
}

fn json_or_text(text: &str) -> Value {
    if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into()))
    }
}

/// The episode reward of a trace: its recorded components scored by
/// `calculator` at `training_step` (the recorded weighted sum when the
/// sandbox has no reward configuration).
pub fn episode_reward(
    signal: &pb::RewardSignal,
    calculator: Option<&RewardCalculator>,
    training_step: u64,
) -> Result<f64, PreprocessError> {
    let Some(calculator) = calculator else { return Ok(signal.weighted_sum) };
    let scores: BTreeMap<String, f64> = signal.components.iter().map(|c| (c.name.clone(), c.score)).collect();
    let rescored = calculator.signal(training_step, &scores).map_err(|e| PreprocessError::Reward(e.to_string()))?;
    Ok(rescored.weighted_sum)
}

/// The step of a damaged trace that may not have finished: the last one
/// read, when the records stopped at damage (a crash, a cut, a corrupt
/// frame) before the episode's end. The damage may have taken the rest of
/// its records (the writer closes a frame within a step too: the policy
/// turn, the token logits, and the tool calls are frames of their own), so
/// only the steps before it are known to be whole; a step is finished
/// once the next one starts. `None` when every step read finished: the
/// trace is undamaged, holds its episode end, or reads to its trailer
/// without one ([`TraceError::NoEpisodeEnd`]: nothing is missing but the end).
pub fn unfinished_step(trace: &TraceContents) -> Option<u32> {
    let damage = trace.damage()?;
    let ended = trace.records.iter().any(|r| matches!(r.body, Some(Body::EpisodeEnd(_))));
    if ended || matches!(damage, TraceError::NoEpisodeEnd { .. }) {
        return None;
    }
    trace.records.last().map(|r| r.step).filter(|&step| step > 0)
}

/// Whether `trace`'s episode was cut off by something other than the
/// agent, so that its reward is no score of the agent's actions: the trace
/// has no episode end (the sandbox killed, a crash, a cut copy, corrupt
/// before its end, or read to its trailer without one: how the episode
/// ended is unknown), or its end says it was cancelled (Ctrl-C, SIGTERM, a
/// gym client's close or idle timeout) or that the infrastructure ended it
/// (failure class `policy_error` or `service_exited`: the policy's server
/// or a service failed). A damage after the end (in the footer index)
/// leaves the episode whole.
pub fn is_truncated(trace: &TraceContents) -> bool {
    let end = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::EpisodeEnd(end)) => Some(end),
        _ => None,
    });
    end.is_none_or(|end| {
        ended_by_other_than_the_agent(end.outcome == pb::Outcome::Cancelled as i32, &end.failure_class)
    })
}

/// The raw records of one trace: one per finished plan step, in order (the
/// [`unfinished_step`] of a damaged trace is left out). Each says whether
/// the episode [`is_truncated`]; the last one of an episode that ended with
/// a reward signal carries `episode_reward` and `reward_components`, and a
/// truncated episode's never do.
pub fn raw_records(
    trace: &TraceContents,
    calculator: Option<&RewardCalculator>,
    training_step: u64,
) -> Result<Vec<Value>, PreprocessError> {
    let header = &trace.header;
    let mut memory: Map<String, Value> = Map::new();
    let mut records: Vec<Value> = Vec::new();
    let mut last_observation = Value::Null;
    let truncated = is_truncated(trace);
    // The unfinished step's records are the last ones read.
    let unfinished = unfinished_step(trace);
    let finished = trace.records.len() - trace.records.iter().rev().take_while(|r| Some(r.step) == unfinished).count();
    for record in &trace.records[..finished] {
        match &record.body {
            Some(Body::PlanStep(step)) => {
                let kind = pb::StepKind::try_from(step.kind).unwrap_or(pb::StepKind::Unspecified);
                let status = pb::StepStatus::try_from(step.status).unwrap_or(pb::StepStatus::Unspecified);
                let action = match kind {
                    pb::StepKind::ToolCall => {
                        json!({"type": "tool_call", "tool": step.tool, "arguments": json_or_text(&step.arguments_json)})
                    }
                    pb::StepKind::FinalAnswer => {
                        json!({"type": "final_answer", "content": json_or_text(&step.observation_json)})
                    }
                    _ => json!({"type": "policy_error", "error": step.error_message}),
                };
                let observation = json_or_text(&step.observation_json);
                records.push(json!({
                    "episode": header.episode_id,
                    "task": header.task,
                    "variant": header.variant,
                    "step": record.step,
                    "action": action,
                    "observation": observation,
                    "previous_observation": last_observation,
                    "status": status.as_str_name().trim_start_matches("STEP_STATUS_").to_ascii_lowercase(),
                    "error_type": step.error_type,
                    "fallback_used": step.fallback_used,
                    "latency_ms": step.latency_micros as f64 / 1000.0,
                    "memory_before": Value::Object(memory.clone()),
                    "memory_after": Value::Null,
                    "memory_deltas": [],
                    "truncated": truncated,
                }));
                last_observation = observation;
            }
            Some(Body::MemoryDelta(delta)) => {
                let after = delta.after_json.as_deref().map(json_or_text);
                match &after {
                    Some(value) => memory.insert(delta.key.clone(), value.clone()),
                    None => memory.remove(&delta.key),
                };
                let source = pb::MemorySource::try_from(delta.source).unwrap_or(pb::MemorySource::Unspecified);
                if let Some(current) = records.last_mut().filter(|r| r["step"] == record.step)
                    && let Some(deltas) = current["memory_deltas"].as_array_mut()
                {
                    deltas.push(json!({
                        "key": delta.key,
                        "before": delta.before_json.as_deref().map(json_or_text),
                        "after": after,
                        "source": source.as_str_name().trim_start_matches("MEMORY_SOURCE_").to_ascii_lowercase(),
                    }));
                }
            }
            // An episode's reward is known once it ended: a reward signal in a
            // trace without its end (the sandbox writes its one signal right
            // before the end; another writer may write one a step) is not
            // used, so that `truncated` alone tells which rewards are unknown.
            Some(Body::RewardSignal(signal)) if !truncated => {
                if let Some(last) = records.last_mut() {
                    let components: Map<String, Value> = signal
                        .components
                        .iter()
                        .map(|c| (c.name.clone(), json!({"score": c.score, "weight": c.weight})))
                        .collect();
                    last["reward_components"] = Value::Object(components);
                    last["episode_reward"] = json!(episode_reward(signal, calculator, training_step)?);
                }
            }
            _ => {}
        }
        // Memory after a step is memory before the next record of another step.
        if let Some(last) = records.last_mut() {
            last["memory_after"] = Value::Object(memory.clone());
        }
    }
    Ok(records)
}

/// `builtin:trajectory` on one raw record.
pub fn trajectory_row(record: &Value) -> Row {
    let state = json!({
        "memory": record["memory_before"],
        "step": record["step"],
        "previous_observation": record["previous_observation"],
    });
    row_of(record, state, record["action"].clone(), record["episode_reward"].as_f64().unwrap_or(0.0))
}

/// A user's preprocessor as a subprocess: JSON lines in, JSON lines out.
pub struct Subprocess {
    name: String,
    child: Child,
    stdin: ChildStdin,
    /// Its stdout's lines, read on a thread so that an answer can be waited
    /// for at most [`Subprocess::timeout`]; disconnected at its end.
    lines: mpsc::Receiver<std::io::Result<String>>,
    /// How long it may take to answer one record (`dataPipeline.recordTimeout`).
    timeout: Duration,
    /// The end of what it wrote on stderr, which a thread reads as it comes:
    /// a pipe nobody reads fills up (64 KiB on Linux) and blocks a chatty
    /// preprocessor mid-write, while this waits for its answer.
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Closed when the stderr thread has read to the end.
    stderr_done: mpsc::Receiver<()>,
}

/// Calls `module.function(record)` per line; errors come back as objects.
/// Once the function is imported it says so ([`PYTHON_READY`]), so a module
/// that does not import is told apart from a function that fails.
const PYTHON_SHIM: &str = r#"
import importlib, json, sys, traceback
module, function = sys.argv[1], sys.argv[2]
f = getattr(importlib.import_module(module), function)
print(json.dumps({"__ready__": True}), flush=True)
for line in sys.stdin:
    record = json.loads(line)
    try:
        out = f(record)
    except Exception as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = "%s:%s in %s" % (frame.filename, frame.lineno, frame.name)
        print(json.dumps({"__error__": "%s (at %s): %s" % (type(e).__name__, where, e)}), flush=True)
        continue
    try:
        print(json.dumps(list(out) if isinstance(out, tuple) else out), flush=True)
    except (TypeError, ValueError) as e:
        print(json.dumps({"__error__": "the result is not JSON (%s): %r" % (e, out)}), flush=True)
"#;

/// The most bytes of a record or an answer quoted in an error.
const EXCERPT_BYTES: usize = 300;
/// The most bytes of what a preprocessor said (its error, its stderr) quoted
/// in an error. With the excerpts, a message stays well within the 2 KB a
/// pod's termination message keeps (`FallbackToLogsOnError`).
const MESSAGE_BYTES: usize = 1000;

/// The most bytes of a preprocessor's stderr kept (its end) for an error.
const STDERR_KEPT: usize = 64 * 1024;
/// How long an exited preprocessor's stderr is waited for: a child it left
/// running may hold the pipe open.
const STDERR_GRACE: Duration = Duration::from_secs(2);

/// The Python shim's first line, once the function is imported.
const PYTHON_READY: &str = r#"{"__ready__": true}"#;

fn excerpt(value: &Value) -> String {
    head(&value.to_string(), EXCERPT_BYTES)
}

/// The first `max` bytes of `text` (on a character boundary), marked when cut.
fn head(text: &str, max: usize) -> String {
    if text.len() > max { format!("{}…", &text[..text.floor_char_boundary(max)]) } else { text.to_string() }
}

/// The last `max` bytes of `text` (on a character boundary), marked when cut:
/// the end of a traceback names the error.
fn tail(text: &str, max: usize) -> String {
    if text.len() > max {
        format!("…{}", &text[text.ceil_char_boundary(text.len() - max)..])
    } else {
        text.to_string()
    }
}

impl Subprocess {
    /// Starts `preprocessor` (not the built-in) with `workdir` as working
    /// directory and, with the directory this process started in, on `PYTHONPATH`.
    /// It may take `timeout` to answer each record (and to be ready).
    pub fn start(preprocessor: &Preprocessor, workdir: &Path, timeout: Duration) -> Result<Self, PreprocessError> {
        let name = preprocessor.to_string();
        let mut command = match preprocessor {
            Preprocessor::Trajectory => {
                return Err(PreprocessError::Start { name, message: "the built-in needs no subprocess".into() });
            }
            Preprocessor::Exec(argv) => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
            Preprocessor::Python { module, function } => {
                let mut c = Command::new("python3");
                c.args(["-c", PYTHON_SHIM, module, function]);
                c
            }
        };
        // The manifest's directory, then the directory this was started in (a
        // trainer image's WORKDIR holding the user's code, in the dataset init
        // container), then what was already there.
        let mut python_path = vec![workdir.display().to_string()];
        if let Ok(cwd) = std::env::current_dir().map(|d| d.display().to_string())
            && !python_path.contains(&cwd)
        {
            python_path.push(cwd);
        }
        python_path.extend(std::env::var("PYTHONPATH").ok().filter(|p| !p.is_empty()));
        let python_path = python_path.join(":");
        let mut child = command
            .current_dir(workdir)
            .env("PYTHONPATH", python_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| PreprocessError::Start { name: name.clone(), message: e.to_string() })?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let lines = read_lines(child.stdout.take().expect("stdout is piped"));
        let (stderr, stderr_done) = drain_stderr(child.stderr.take().expect("stderr is piped"));
        let mut process = Self { name, child, stdin, lines, timeout, stderr, stderr_done };
        if matches!(preprocessor, Preprocessor::Python { .. }) {
            match process.next_line() {
                Answer::Line(line) if line.trim() == PYTHON_READY => {}
                Answer::TimedOut => {
                    let message = process.timed_out("to import its module");
                    return Err(PreprocessError::Start { name: process.name.clone(), message });
                }
                // Not importable (ModuleNotFoundError, AttributeError, a syntax error): it exited.
                _ => {
                    let message = process.exit_message();
                    return Err(PreprocessError::Start { name: process.name.clone(), message });
                }
            }
        }
        Ok(process)
    }

    /// Its next line on stdout, waiting at most the timeout.
    fn next_line(&mut self) -> Answer {
        match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(line)) => Answer::Line(line),
            Err(mpsc::RecvTimeoutError::Timeout) => Answer::TimedOut,
            Ok(Err(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => Answer::Ended,
        }
    }

    /// Stops a preprocessor that took too long for `what`, and says so.
    fn timed_out(&mut self, what: &str) -> String {
        let _ = self.child.kill();
        let waited = basecamp_api::duration::Duration::from(self.timeout);
        format!(
            "it took longer than {waited} {what} (spec.dataPipeline.recordTimeout, or --record-timeout) and was stopped"
        )
    }

    /// What the process said on stderr, once it has exited.
    fn exit_message(&mut self) -> String {
        let _ = self.child.kill();
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        // Everything it wrote, unless something it started still holds the pipe.
        let _ = self.stderr_done.recv_timeout(STDERR_GRACE);
        let stderr = {
            let kept = self.stderr.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            String::from_utf8_lossy(&kept).into_owned()
        };
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
        let said = if tail.is_empty() { "no output".into() } else { self::tail(&tail.join(" | "), MESSAGE_BYTES) };
        format!("it exited ({status}): {said}")
    }

    /// One raw record in, one row out, its shape checked.
    pub fn call(&mut self, record: &Value) -> Result<Row, PreprocessError> {
        let failed = |s: &mut Self, message: String| PreprocessError::Failed {
            name: s.name.clone(),
            record: excerpt(record),
            message,
        };
        if writeln!(self.stdin, "{record}").and_then(|_| self.stdin.flush()).is_err() {
            let message = self.exit_message();
            return Err(failed(self, message));
        }
        let line = match self.next_line() {
            Answer::Line(line) => line,
            Answer::TimedOut => {
                let message = self.timed_out("to answer");
                return Err(failed(self, message));
            }
            Answer::Ended => {
                let message = self.exit_message();
                return Err(failed(self, message));
            }
        };
        let answer: Value = serde_json::from_str(line.trim()).map_err(|e| {
            failed(self, format!("it printed {:?}, which is not JSON ({e})", head(line.trim(), EXCERPT_BYTES)))
        })?;
        if let Some(error) = answer.get("__error__").and_then(Value::as_str) {
            return Err(failed(self, head(error, MESSAGE_BYTES)));
        }
        let shape_error =
            || PreprocessError::Shape { name: self.name.clone(), record: excerpt(record), got: excerpt(&answer) };
        let [state, action, reward] = answer.as_array().map(Vec::as_slice).unwrap_or_default() else {
            return Err(shape_error());
        };
        let (true, true, Some(reward)) = (state.is_object(), action.is_object(), reward.as_f64()) else {
            return Err(shape_error());
        };
        Ok(row_of(record, state.clone(), action.clone(), reward))
    }

    /// Starts the preprocessor and checks its answer on the run's first
    /// record, which is that record's row: each record is sent once.
    pub fn preflight(
        preprocessor: &Preprocessor,
        workdir: &Path,
        timeout: Duration,
        first: &Value,
    ) -> Result<(Self, Row), PreprocessError> {
        let mut process = Self::start(preprocessor, workdir, timeout)?;
        let row = process.call(first)?;
        Ok((process, row))
    }
}

/// What came of waiting for a preprocessor's next line.
enum Answer {
    Line(String),
    /// Its stdout ended (it exited, or closed it).
    Ended,
    TimedOut,
}

/// Sends `stdout`'s lines from a thread until its end (or an error).
fn read_lines(stdout: ChildStdout) -> mpsc::Receiver<std::io::Result<String>> {
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match stdout.read_line(&mut line) {
                // The end: the receiver sees the channel disconnect.
                Ok(0) => return,
                Ok(_) if send.send(Ok(line)).is_ok() => {}
                Ok(_) => return,
                Err(e) => {
                    let _ = send.send(Err(e));
                    return;
                }
            }
        }
    });
    lines
}

/// Reads `stderr` to its end on a thread, keeping the last [`STDERR_KEPT`]
/// bytes; the receiver disconnects once the end is reached.
fn drain_stderr(mut stderr: std::process::ChildStderr) -> (Arc<Mutex<Vec<u8>>>, mpsc::Receiver<()>) {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let (done, stderr_done) = mpsc::channel::<()>();
    let sink = Arc::clone(&kept);
    std::thread::spawn(move || {
        let _done = done;
        let mut chunk = [0u8; 8192];
        while let Ok(n @ 1..) = std::io::Read::read(&mut stderr, &mut chunk) {
            let mut kept = sink.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            kept.extend_from_slice(&chunk[..n]);
            if kept.len() > STDERR_KEPT {
                let excess = kept.len() - STDERR_KEPT;
                kept.drain(..excess);
            }
        }
    });
    (kept, stderr_done)
}

impl Drop for Subprocess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basecamp_trace::Tail;

    #[test]
    fn quoted_text_is_bounded_on_character_boundaries() {
        let long = "é".repeat(2000);
        let start = head(&long, 1001);
        assert!(start.len() <= 1001 + "…".len() && start.ends_with('…'), "{}", start.len());
        let end = tail(&format!("{long}ModuleNotFoundError"), 1001);
        assert!(end.len() <= 1001 + "…".len() && end.ends_with("ModuleNotFoundError"), "{}", end.len());
        assert_eq!(head("short", 10), "short");
        assert_eq!(tail("short", 10), "short");
    }

    /// A trace of two tool steps whose last carries a reward signal, with
    /// or without its episode end after it.
    fn two_steps(ended: bool) -> TraceContents {
        let header =
            pb::Header { episode_id: "ep".into(), task: "t".into(), variant: "a".into(), ..Default::default() };
        let plan = |step: u32| pb::Record {
            step,
            body: Some(Body::PlanStep(Box::new(pb::PlanStep {
                index: step,
                kind: pb::StepKind::ToolCall as i32,
                status: pb::StepStatus::Ok as i32,
                ..Default::default()
            }))),
        };
        let signal = pb::RewardSignal { weighted_sum: 0.75, ..Default::default() };
        let mut records = vec![plan(1), plan(2), pb::Record { step: 2, body: Some(Body::RewardSignal(signal)) }];
        let tail = if ended {
            records.push(pb::Record { step: 2, body: Some(Body::EpisodeEnd(pb::EpisodeEnd::default())) });
            Tail::Complete
        } else {
            Tail::Damaged(TraceError::NoEpisodeEnd { file: "ep.trace".into(), offset: 0 })
        };
        TraceContents { header, records, tail }
    }

    /// `truncated` alone tells a trainer which rewards are unknown: an
    /// episode without its end is truncated in every record and row, and
    /// carries no episode reward even where a reward signal was read.
    #[test]
    fn records_and_rows_of_an_episode_without_its_end_are_truncated_and_carry_no_reward() {
        let records = raw_records(&two_steps(true), None, 0).unwrap();
        assert_eq!(records.iter().map(|r| r["truncated"].clone()).collect::<Vec<_>>(), [false, false]);
        assert_eq!(records[1]["episode_reward"], 0.75);
        let rows: Vec<Row> = records.iter().map(trajectory_row).collect();
        assert_eq!(rows.iter().map(|r| (r.reward, r.truncated)).collect::<Vec<_>>(), [(0.0, false), (0.75, false)]);

        let cut = two_steps(false);
        assert!(is_truncated(&cut));
        let records = raw_records(&cut, None, 0).unwrap();
        assert_eq!(records.iter().map(|r| r["truncated"].clone()).collect::<Vec<_>>(), [true, true]);
        assert!(records.iter().all(|r| r.get("episode_reward").is_none() && r.get("reward_components").is_none()));
        let rows: Vec<Row> = records.iter().map(trajectory_row).collect();
        assert_eq!(rows.iter().map(|r| (r.reward, r.truncated)).collect::<Vec<_>>(), [(0.0, true), (0.0, true)]);
        let json = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(json["truncated"], true, "{json}");
    }

    /// An episode the policy's server (or a dead service) ended, or one that
    /// was cancelled, is cut off too: its reward scored a server's outage or
    /// a half-played episode, not the agent's actions
    /// (its rows carried the reward and `truncated: false`, and a trainer
    /// learnt from them). Traces written before the end named its failure
    /// class are read as before.
    #[test]
    fn rows_of_an_episode_the_infrastructure_ended_are_truncated_and_carry_no_reward() {
        let completed = pb::Outcome::Completed as i32;
        let ends = [
            ("policy_error", completed, true),
            ("service_exited", completed, true),
            ("timeout", completed, false),
            ("", completed, false),
            // Cut off by Ctrl-C or a gym client's close: no score either.
            ("ok", pb::Outcome::Cancelled as i32, true),
        ];
        for (class, outcome, truncated) in ends {
            let mut trace = two_steps(true);
            for record in &mut trace.records {
                if let Some(Body::EpisodeEnd(end)) = &mut record.body {
                    end.failure_class = class.into();
                    end.outcome = outcome;
                }
            }
            assert_eq!(is_truncated(&trace), truncated, "failure class {class:?}");
            let records = raw_records(&trace, None, 0).unwrap();
            assert!(records.iter().all(|r| r["truncated"] == truncated), "failure class {class:?}");
            assert_eq!(records[1].get("episode_reward").is_some(), !truncated, "failure class {class:?}");
        }
    }

    /// The syntax is the API's (tested there); a run keeps its own words
    /// and categories for a name it cannot use.
    #[test]
    fn preprocessor_names_parse_and_bad_ones_say_what_is_accepted() {
        assert_eq!(parse_preprocessor("builtin:trajectory").unwrap(), Preprocessor::Trajectory);
        assert_eq!(
            parse_preprocessor("exec:python3 \"my prep.py\"").unwrap(),
            Preprocessor::Exec(vec!["python3".into(), "my prep.py".into()])
        );
        let err = parse_preprocessor("exec:python3 \"prep.py").unwrap_err();
        assert_eq!(
            err.to_string(),
            "preprocessor exec:python3 \"prep.py: cannot start: its command has an unclosed quote or a trailing backslash"
        );
        assert_eq!(err.category(), "PreprocessorStart");
        for bad in ["shipping_delay_filter", "python:nofunction", "exec:", "python:a b.c"] {
            let err = parse_preprocessor(bad).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "preprocessor {bad:?} is not one of builtin:trajectory, exec:PROGRAM ARGS..., python:module.function"
                )
            );
            assert_eq!(err.category(), "UnknownPreprocessor");
        }
    }
}
