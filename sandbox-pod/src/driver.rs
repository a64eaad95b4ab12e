//! Driver mode: run one shard of a test set — episodes as concurrent tasks
//! sharing one runner — and write the shard's `summary.json` next to its
//! traces. The summary is written even when episodes fail: every episode
//! that ran is in it, with its failure class and trace file, and so is the
//! trace file of each episode cut off or lost after its trace was created,
//! so that the summary names every file the shard wrote.
//!
//! A shard whose policy's server or services end episode after episode
//! ([`outage_threshold`] in a row) waits for the policy to answer again
//! (its server's readiness URL; a hosted endpoint's `/models`, once the
//! endpoint has served a measured episode), or stops starting episodes
//! ([`GaveUp`]): a dead server costs a few episodes, not the whole test set.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime};

use basecamp_trace::metrics::{Aggregate, EpisodeEnd, POLICY_ERROR, aggregate, measures_the_agent};
use basecamp_trace::pb::Outcome;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::episode::{EpisodeInput, EpisodeResult, EpisodeRunner, outcome_name, rollback_path, trace_file_name};
use crate::executor::unix_nanos;

/// A shard's `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardSummary {
    pub namespace: String,
    pub task: String,
    pub variant: String,
    pub shard: u32,
    pub shard_count: u32,
    pub started_unix_nanos: i64,
    pub wall_seconds: f64,
    pub aggregate: Aggregate,
    pub episodes: Vec<EpisodeResult>,
    #[serde(default)]
    /// Episodes that ended without a result, with the error: their trace
    /// could not be written, or their task panicked.
    pub lost: Vec<LostEpisode>,
    /// True when the run was stopped (Ctrl-C) before every episode finished.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped_early: bool,
    /// Episodes cut off by the stop: their traces hold what ran and end as
    /// `cancelled` (the step under way ended by an error context saying
    /// so); they are not in `episodes` or the aggregate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupted: Vec<String>,
    /// The trace files of the `interrupted` episodes that had created one
    /// (one cut off before its start has none), in the same order. Absent
    /// from summaries written before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupted_traces: Vec<String>,
    /// Episodes the stop kept from starting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_started: Vec<String>,
    /// Why the shard stopped starting episodes before the end of its test
    /// set — the policy's server or a service failed episode after episode
    /// — and the episodes it did not start ([`GaveUp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gave_up: Option<GaveUp>,
    /// The sandbox's services that exited while the episodes used them:
    /// the calls to each failed from then on (`service_exited`). Set by the
    /// caller that ran the services (`basecamp-sandbox run`), after the
    /// episodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_exits: Vec<crate::services::ServiceExit>,
    /// What the policy endpoint's 429s did, when it answered any: its
    /// [`Throttle`](crate::policy::throttle::Throttle)'s counts, which a
    /// `basecamp run` variant's shards share (one client, one API key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<crate::policy::throttle::RateLimits>,
}

impl ShardSummary {
    /// The files of the shard's directory this shard wrote, relative to
    /// it: `summary.json`, each finished episode's trace and rollback
    /// evidence, and the trace of each episode cut off or lost after it
    /// created one — all as the summary names them, not guessed from the
    /// directory (whose file times need not follow this machine's clock).
    /// What an earlier run left in the directory is not among them.
    pub fn files_written(&self) -> Vec<String> {
        let mut files = vec![SUMMARY_FILE.to_string()];
        for episode in &self.episodes {
            files.push(episode.trace_file.clone());
            if episode.rollbacks > 0 {
                let rollback = rollback_path(Path::new(&episode.trace_file));
                files.push(rollback.to_string_lossy().into_owned());
            }
        }
        let cut_off = self.interrupted_traces.iter().chain(self.lost.iter().filter_map(|l| l.trace_file.as_ref()));
        for trace in cut_off {
            if !files.contains(trace) {
                files.push(trace.clone());
            }
        }
        files
    }
}

/// A shard that stopped starting episodes because its infrastructure kept
/// failing them: [`outage_threshold`] episodes in a row ended by the
/// policy's server or a service (`policy_error`, `service_exited`), and
/// the policy did not answer again in time — its server's readiness URL
/// within its `startupTimeout`, a hosted endpoint's `/models` within
/// `spec.policy.outageTimeout` — or answered after an earlier outage and
/// failed every episode since, or is an endpoint that never served a
/// measured episode (a wrong URL, model or key is not an outage).
/// Starting the rest would only have failed them too, each after its
/// retries: a dead model server would have turned a 1,000-episode test set
/// into 1,000 traces of the outage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GaveUp {
    /// What failed and what the shard did about it, e.g. "8 episodes in a
    /// row were ended by the policy's server or a service (the last, e7,
    /// policy_error: ...); the policy server did not answer ready ...".
    pub reason: String,
    /// The episodes it did not start, in test-set order.
    pub not_started: Vec<String>,
}

/// How many episodes in a row (in the order they end) the infrastructure
/// must end before a shard waits for the policy's server or gives up:
/// twice the episodes in flight (one outage fails every episode under way
/// at once, and a burst of errors from a hosted API should not stop a run),
/// and never fewer than 5.
pub fn outage_threshold(concurrency: usize) -> usize {
    concurrency.saturating_mul(2).max(5)
}

/// Counts the episodes the infrastructure ended in a row; a measured
/// episode starts the count again.
struct OutageWatch {
    in_a_row: usize,
    threshold: usize,
    /// The policy was waited for (and answered) since the last measured
    /// episode.
    waited: bool,
    /// An episode of this shard was measured: the policy has worked.
    measured_any: bool,
}

impl OutageWatch {
    /// Notes an episode that ran; returns what the outage looks like when
    /// this episode makes `threshold` in a row.
    fn note(&mut self, result: &EpisodeResult) -> Option<String> {
        if measures_the_agent(&result.failure_class) {
            self.in_a_row = 0;
            self.waited = false;
            self.measured_any = true;
            return None;
        }
        self.in_a_row += 1;
        (self.in_a_row >= self.threshold).then(|| {
            // A service's exit is said in the tool call that met it, not
            // as the episode's error.
            let error = result.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
            format!(
                "{} episodes in a row were ended by the policy's server or a service (the last, {}, {}{error})",
                self.in_a_row, result.id, result.failure_class,
            )
        })
    }

    /// The policy answered after an outage: counting starts again, and a
    /// next outage before any measured episode is not waited for.
    fn waited_for_the_policy(&mut self) {
        self.in_a_row = 0;
        self.waited = true;
    }
}

/// What a shard does when its infrastructure failed [`outage_threshold`]
/// episodes in a row: when the policy failed and something says when it
/// answers again (its server's readiness URL; a hosted endpoint's
/// `/models`, once the endpoint has served a measured episode), waits for
/// that and goes on; otherwise — a script, an endpoint that never served
/// one (a wrong URL, model or key), `outageTimeout: 0s`, a service that
/// exited (services are not restarted), a policy that answered after the
/// last outage and still failed every episode since — gives up. `None`: go on.
async fn after_an_outage(
    runner: &EpisodeRunner,
    outage: String,
    last_class: &str,
    watch: &OutageWatch,
    stop: &StopSignal,
) -> Option<String> {
    let where_ = format!("variant {}, shard {}", runner.header.variant, runner.header.shard);
    let readiness = runner.policy_readiness.as_ref().filter(|_| last_class == POLICY_ERROR);
    let never_served =
        readiness.is_some_and(|r| r.awaited() == crate::readiness::Awaited::Endpoint && !watch.measured_any);
    let Some(readiness) = readiness.filter(|_| !watch.waited && !never_served) else {
        let why = match readiness {
            Some(_) if never_served => "no episode of this shard was measured yet, and an endpoint that never \
                 answered one is taken for a wrong URL, model or key rather than an outage (check \
                 spec.policy.endpoint, model and the API key)"
                .to_string(),
            Some(readiness) => format!(
                "the policy answered at {} after the last outage, yet no episode since was measured",
                readiness.url
            ),
            None if last_class == POLICY_ERROR => "nothing tells when the policy is back (a script, or an endpoint \
                 whose spec.policy.outageTimeout is 0s)"
                .to_string(),
            None => "a service that exited is not restarted".to_string(),
        };
        let reason = format!("{outage}; {why}, so no more episodes were started");
        crate::stderr_line!("error: {where_}: {reason}");
        return Some(reason);
    };
    crate::stderr_line!(
        "warning: {where_}: {outage}; waiting up to {} for {} before starting more",
        readiness.timeout,
        readiness.describe()
    );
    let waiting = |waiting| {
        if let Some(metrics) = &runner.metrics {
            metrics.set_waiting_for_policy(waiting);
        }
    };
    waiting(true);
    let ended = tokio::select! {
        ready = readiness.wait() => match ready {
            Ok(took) => {
                crate::stderr_line!(
                    "{where_}: the policy answers again at {} after {:.1}s; going on",
                    readiness.url,
                    took.as_secs_f64()
                );
                None
            }
            Err(not_ready) => {
                let reason = format!("{outage}; then {not_ready}");
                crate::stderr_line!("error: {where_}: {reason}; no more episodes were started");
                Some(reason)
            }
        },
        // A stop ends the wait; the stop's own accounting follows.
        () = stop.cancelled() => None,
    };
    waiting(false);
    ended
}

/// Listens for SIGTERM from now on (its default would end the process on
/// the spot: no summaries, traces cut, services and temporary files left)
/// and ends at the first Ctrl-C or SIGTERM. Call it within a Tokio runtime.
pub fn ctrl_c_or_sigterm() -> impl std::future::Future<Output = ()> + Send + 'static {
    let signal = which_stop_signal();
    async move {
        signal.await;
    }
}

/// As [`ctrl_c_or_sigterm`], naming the signal that came: "Ctrl-C" or
/// "SIGTERM", for a message that tells the user what was received.
pub fn which_stop_signal() -> impl std::future::Future<Output = &'static str> + Send + 'static {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        let terminated = async {
            match term.as_mut() {
                Some(term) => term.recv().await,
                None => std::future::pending().await,
            }
        };
        // A Ctrl-C handler that could not be installed never fires (it is
        // not a Ctrl-C).
        let interrupted = async {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = interrupted => "Ctrl-C",
            _ = terminated => "SIGTERM",
        }
    }
}

/// Stops a run early (Ctrl-C): cancel it and every shard winds down.
pub type StopSignal = tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LostEpisode {
    pub id: String,
    pub error: String,
    /// Its trace file, when it had created one (what ran, up to the error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_file: Option<String>,
}

pub const SUMMARY_FILE: &str = "summary.json";

/// How one episode's task ended; `trace_file` is set when the episode had
/// created its trace.
enum Ended {
    Ran(Box<EpisodeResult>),
    Lost { error: String, trace_file: Option<String> },
    Interrupted { trace_file: Option<String> },
    NotStarted,
}

/// Runs `episodes` with at most `concurrency` at a time, traces into `out_dir`.
/// `on_done` is called after each episode (progress, metrics). When `stop`
/// fires, no new episode starts and running ones are cut off where they
/// are — each ends its trace as `cancelled`, so every trace is whole — and
/// the summary is still written, marked `stopped_early`.
///
/// Only the running episodes have a task: the next starts when one ends,
/// so a test set of any length costs the memory of `concurrency` episodes
/// in flight (a task per row up front took ~7 KB a row: 135 MB for 20,000).
pub async fn run_shard(
    runner: Arc<EpisodeRunner>,
    episodes: Vec<EpisodeInput>,
    out_dir: &Path,
    concurrency: usize,
    stop: StopSignal,
    on_done: impl Fn(&EpisodeResult),
) -> std::io::Result<ShardSummary> {
    std::fs::create_dir_all(out_dir)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot create {}: {e}", out_dir.display())))?;
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let in_flight = concurrency.max(1);
    let mut pending = episodes.into_iter().enumerate();
    let mut tasks = JoinSet::new();
    // Each running task's episode id and whether it created its trace: a
    // task that panics returns neither, and its lost episode is recorded with them.
    let mut spawned: HashMap<tokio::task::Id, (String, Arc<AtomicBool>)> = HashMap::new();
    let mut done: Vec<(usize, EpisodeResult)> = Vec::new();
    let mut lost = Vec::new();
    let (mut interrupted, mut not_started) = (Vec::new(), Vec::new());
    let mut outage =
        OutageWatch { in_a_row: 0, threshold: outage_threshold(in_flight), waited: false, measured_any: false };
    let mut gave_up: Option<String> = None;
    loop {
        while tasks.len() < in_flight && !stop.is_cancelled() && gave_up.is_none() {
            let Some((index, input)) = pending.next() else { break };
            let trace_created = Arc::new(AtomicBool::new(false));
            let episode_id = input.id.clone();
            let task = tasks.spawn(run_episode(
                runner.clone(),
                index,
                input,
                out_dir.to_path_buf(),
                stop.clone(),
                trace_created.clone(),
            ));
            spawned.insert(task.id(), (episode_id, trace_created));
        }
        let Some(joined) = tasks.join_next_with_id().await else { break };
        let task_id = match &joined {
            Ok((id, _)) => *id,
            Err(failed) => failed.id(),
        };
        let (id, trace_created) = spawned.remove(&task_id).expect("every task is recorded when it is spawned");
        match joined {
            Ok((_, (index, Ended::Ran(result)))) => {
                on_done(&result);
                if let (Some(metrics), Some(rate_limits)) =
                    (&runner.metrics, runner.policy.throttle().and_then(|throttle| throttle.report()))
                {
                    metrics.observe_rate_limits(&rate_limits);
                }
                let seen = outage.note(&result).filter(|_| gave_up.is_none());
                if let Some(seen) = seen {
                    gave_up = after_an_outage(&runner, seen, &result.failure_class, &outage, &stop).await;
                    outage.waited_for_the_policy();
                }
                done.push((index, *result));
            }
            Ok((_, (_, Ended::Lost { error, trace_file }))) => lost.push(LostEpisode { id, error, trace_file }),
            Ok((_, (index, Ended::Interrupted { trace_file }))) => interrupted.push((index, id, trace_file)),
            Ok((_, (index, Ended::NotStarted))) => not_started.push((index, id)),
            Err(failed) => {
                let trace_file = trace_created.load(Ordering::Acquire).then(|| trace_file_name(&id));
                lost.push(LostEpisode { id, error: task_failure(failed), trace_file });
            }
        }
    }
    // The outage, or else the stop, kept the rest from starting.
    let unstarted: Vec<(usize, String)> = pending.map(|(index, input)| (index, input.id)).collect();
    let gave_up = match gave_up {
        Some(reason) => Some(GaveUp { reason, not_started: unstarted.into_iter().map(|(_, id)| id).collect() }),
        None => {
            not_started.extend(unstarted);
            None
        }
    };
    interrupted.sort();
    not_started.sort();
    done.sort_by_key(|(i, _)| *i);
    let episodes: Vec<EpisodeResult> = done.into_iter().map(|(_, r)| r).collect();
    let header = &runner.header;
    let summary = ShardSummary {
        namespace: header.namespace.clone(),
        task: header.task.clone(),
        variant: header.variant.clone(),
        shard: header.shard,
        shard_count: header.shard_count,
        started_unix_nanos: unix_nanos(started_wall),
        wall_seconds: started.elapsed().as_secs_f64(),
        aggregate: aggregate(episodes.iter().map(|e| EpisodeEnd {
            metrics: &e.metrics,
            outcome: &e.outcome,
            failure_class: &e.failure_class,
        })),
        episodes,
        lost,
        stopped_early: stop.is_cancelled() && !(interrupted.is_empty() && not_started.is_empty()),
        interrupted_traces: interrupted.iter().filter_map(|(_, _, trace)| trace.clone()).collect(),
        interrupted: interrupted.into_iter().map(|(_, id, _)| id).collect(),
        not_started: not_started.into_iter().map(|(_, id)| id).collect(),
        gave_up,
        service_exits: Vec::new(),
        rate_limits: runner.policy.throttle().and_then(|throttle| throttle.report()),
    };
    write_summary(&summary, out_dir)?;
    Ok(summary)
}

/// One episode's task: starts it (unless the stop came first), runs it to
/// its end or the stop. `trace_created` is set as soon as its trace exists.
async fn run_episode(
    runner: Arc<EpisodeRunner>,
    index: usize,
    input: EpisodeInput,
    dir: std::path::PathBuf,
    stop: StopSignal,
    trace_created: Arc<AtomicBool>,
) -> (usize, Ended) {
    // While the policy's requests wait for their place (its endpoint
    // answered 429), no episode starts: this one waits before its trace
    // and clock start.
    if let Some(throttle) = runner.policy.throttle() {
        tokio::select! {
            () = throttle.admit() => {}
            () = stop.cancelled() => return (index, Ended::NotStarted),
        }
    }
    if stop.is_cancelled() {
        return (index, Ended::NotStarted);
    }
    let trace_name = trace_file_name(&input.id);
    // The path, not only the OS's reason: "Permission denied" alone does
    // not say which directory to fix.
    let trace_path = dir.join(&trace_name);
    let lost = |e: std::io::Error, trace_file| Ended::Lost {
        error: format!("cannot write the trace {}: {e}", trace_path.display()),
        trace_file,
    };
    // Noted as soon as the trace exists, not once start returns: a start
    // that fails (or panics) after it still leaves the trace.
    let noted = || trace_created.store(true, Ordering::Release);
    let episode = match runner.start_noting_trace(input, &dir, noted) {
        Ok(episode) => episode,
        Err(e) => return (index, lost(e, trace_created.load(Ordering::Acquire).then_some(trace_name))),
    };
    let trace_file = Some(trace_name);
    // Stopped, the episode ends its trace as cancelled; it is reported as
    // interrupted, not scored with the episodes that ran to their end.
    let ended = match runner.run_started(episode, &stop).await {
        Ok(result) if result.outcome == outcome_name(Outcome::Cancelled) => Ended::Interrupted { trace_file },
        Ok(result) => Ended::Ran(Box::new(result)),
        Err(e) => lost(e, trace_file),
    };
    (index, ended)
}

/// Why an episode's task ended without a result: its panic message (a
/// bug, but one episode's, recorded as that episode's error).
fn task_failure(failed: tokio::task::JoinError) -> String {
    match failed.try_into_panic() {
        Ok(payload) => format!("the episode panicked: {}", panic_message(payload.as_ref())),
        Err(failed) => format!("the episode's task ended without a result: {failed}"),
    }
}

/// What a panic said: its message, when it has one.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|m| m.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Writes `summary.json` atomically (temp file, then rename). The error
/// names the file: a full disk is otherwise a bare "No space left on device".
pub fn write_summary(summary: &ShardSummary, out_dir: &Path) -> std::io::Result<()> {
    let tmp = out_dir.join(format!(".{SUMMARY_FILE}.tmp"));
    let path = out_dir.join(SUMMARY_FILE);
    let text = serde_json::to_vec_pretty(summary).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        std::io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()))
    })
}
