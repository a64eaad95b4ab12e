//! The handlers of server mode and the table they are routed from.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use basecamp_trace::metrics::ended_by_other_than_the_agent;
use basecamp_trace::pb::{Outcome, StepStatus};
use futures_util::FutureExt;
use serde_json::{Value, json};

use super::action::parse_action;
use super::create::{Source, inline_input, parse_create};
use super::registry::{Entry, Playing, RegisterError, Slot, SlotStatus, unix_ms};
use super::{Gym, GymState};
use crate::driver::panic_message;
use crate::episode::{Episode, EpisodeResult, InjectionRefused, LiveInjection, PANIC, StepReport, outcome_name};
use crate::metrics::status_label;
use crate::server::{
    ApiError, EpisodeIdPath, MAX_BODY_BYTES, MAX_ID_LEN, generated_injection_id, observability, read_injection,
    readable, with_fallbacks,
};

/// Every route server mode serves, as `(method, path)`: the API's own
/// (built into the router from this same list) and `/metrics`, `/healthz`.
pub fn routes() -> Vec<(Method, &'static str)> {
    let mut all: Vec<(Method, &'static str)> =
        api_routes().into_iter().map(|(method, path, _)| (method, path)).collect();
    all.push((Method::GET, "/metrics"));
    all.push((Method::GET, "/healthz"));
    all
}

fn api_routes() -> Vec<(Method, &'static str, MethodRouter<GymState>)> {
    vec![
        (Method::GET, "/v1/episodes", get(list)),
        (Method::POST, "/v1/episodes", post(create)),
        (Method::GET, "/v1/episodes/{episode_id}", get(describe)),
        (Method::POST, "/v1/episodes/{episode_id}/step", post(step)),
        (Method::POST, "/v1/episodes/{episode_id}/inject", post(inject)),
        (Method::POST, "/v1/episodes/{episode_id}/close", post(close)),
        (Method::GET, "/v1/episodes/{episode_id}/trace", get(trace)),
    ]
}

const SERVED: &str = "server mode serves GET/POST /v1/episodes, GET /v1/episodes/{id}, POST /v1/episodes/{id}/step, POST /v1/episodes/{id}/inject, POST /v1/episodes/{id}/close, GET /v1/episodes/{id}/trace, GET /metrics and GET /healthz (see openapi/sandbox.yaml)";

/// The server-mode router.
pub fn router(gym: GymState) -> Router {
    let mut by_path: BTreeMap<&'static str, MethodRouter<GymState>> = BTreeMap::new();
    for (_, path, handler) in api_routes() {
        let merged = match by_path.remove(path) {
            Some(existing) => existing.merge(handler),
            None => handler,
        };
        by_path.insert(path, merged);
    }
    let api = by_path.into_iter().fold(Router::new(), |router, (path, handler)| router.route(path, handler));
    let api = api.layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    let metrics = gym.metrics.clone();
    with_fallbacks(api.with_state(gym).merge(observability(metrics)), SERVED)
}

fn trace_io(episode: &str, e: &std::io::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "TraceIo",
        format!("cannot write the trace of episode {episode:?}: {e}; the episode is closed"),
    )
}

impl Gym {
    /// `<out>/<id>.trace`: where the episode `id` writes its trace.
    fn trace_path(&self, id: &str) -> std::path::PathBuf {
        self.out_dir.join(crate::episode::trace_file_name(id))
    }

    /// Whether an episode of this id ran here before: its trace exists.
    fn trace_exists(&self, id: &str) -> bool {
        self.trace_path(id).exists()
    }

    /// A generated episode id, `name(n)` for the next number `n` whose id
    /// neither this server holds nor an earlier run left a trace of (a
    /// restarted server counts from 1 again, in the same directory).
    fn fresh_id(&self, name: impl Fn(usize) -> String) -> String {
        loop {
            let id = name(self.registry.next_number());
            if !self.registry.contains(&id) && !self.trace_exists(&id) {
                return id;
            }
        }
    }

    /// The refusal of an id whose trace is in the output directory already.
    fn trace_on_disk(&self, id: &str) -> ApiError {
        ApiError::new(
            StatusCode::CONFLICT,
            "EpisodeExists",
            format!(
                "episode {id:?} has a trace in {} already (an earlier episode of that id, of this server or \
                 one before it: kept, never overwritten); choose another episode_id, or leave it out for a generated one",
                self.out_dir.display()
            ),
        )
    }

    fn entry(&self, id: &str) -> Result<Arc<Entry>, ApiError> {
        self.registry.get(id).ok_or_else(|| self.unknown(id))
    }

    /// Why `id` is not held: never here, or closed and forgotten.
    fn unknown(&self, id: &str) -> ApiError {
        let message = if self.trace_exists(id) {
            format!(
                "episode {id:?} is closed and no longer held (a closed episode is held for {} ms after its last \
                 request); GET /v1/episodes/{id}/trace serves its trace, {}",
                self.keep_closed.as_millis(),
                self.trace_path(id).display()
            )
        } else {
            format!("no episode {id:?} here; GET /v1/episodes lists them, POST /v1/episodes creates one")
        };
        ApiError::new(StatusCode::NOT_FOUND, "UnknownEpisode", message)
    }

    /// Ends the slot's episode: scores it, completes its trace, frees its
    /// place. `reason` cancels an episode that is not done yet.
    pub(super) fn finish(&self, entry: &Entry, slot: &mut Slot, reason: Option<String>) -> Result<(), ApiError> {
        let Some(mut episode) = slot.episode.take() else { return Ok(()) };
        let id = episode.id().to_string();
        let step = episode.step();
        self.registry.release();
        let finished = match reason {
            Some(reason) => episode.cancel(reason).and_then(|()| episode.finish(&self.runner)),
            None => episode.finish(&self.runner),
        };
        match finished {
            Ok(result) => {
                self.metrics.observe_episode(&result);
                entry.update(|s| {
                    s.step = step;
                    s.done = true;
                    s.closed = true;
                    s.state = result.outcome.clone();
                });
                slot.result = Some(result);
                Ok(())
            }
            Err(e) => {
                entry.update(|s| {
                    s.done = true;
                    s.closed = true;
                    s.state = "error".into();
                });
                Err(trace_io(&id, &e))
            }
        }
    }

    /// Marks the episode whose step task failed as ended in error: its
    /// episode was out of the slot, and is gone with the task. A panic
    /// while the step is played is caught and ends the episode with its
    /// trace complete; this is for one the step could not catch (in the
    /// end of its episode).
    async fn lose_step(&self, id: &str) {
        let Some(entry) = self.registry.get(id) else { return };
        let mut slot = entry.slot.lock().await;
        if slot.playing.take().is_some() && slot.episode.is_none() && slot.result.is_none() {
            self.registry.release();
            entry.update(|s| {
                s.step_in_progress = None;
                s.done = true;
                s.closed = true;
                s.state = "error".into();
            });
        }
    }

    /// Closes every open episode (the server is shutting down; the stop
    /// has cut off the steps under way, each of which ends its episode).
    pub async fn close_all(&self, reason: &str) {
        for entry in self.registry.all() {
            let _turn = entry.turn.lock().await;
            let mut slot = entry.slot.lock().await;
            if slot.episode.is_some()
                && let Err(e) = self.finish(&entry, &mut slot, Some(reason.to_string()))
            {
                tracing::warn!(error = %e.message, "closing an episode at shutdown");
            }
        }
    }

    /// Closes the episodes idle for longer than the idle timeout; those
    /// busy right now are left for the next round.
    pub async fn close_idle(&self) {
        self.registry.forget_closed(self.keep_closed);
        for entry in self.registry.idle(self.idle_timeout) {
            let Ok(_turn) = entry.turn.try_lock() else { continue };
            let Ok(mut slot) = entry.slot.try_lock() else { continue };
            let reason =
                format!("closed after {} ms without a request (the idle timeout)", self.idle_timeout.as_millis());
            if let Err(e) = self.finish(&entry, &mut slot, Some(reason)) {
                tracing::warn!(error = %e.message, "closing an idle episode");
            }
        }
    }
}

/// How often the reaper looks (closing idle episodes, forgetting closed
/// ones), for the shorter of the idle timeout and `keep_closed`.
pub fn reaper_period(shortest: Duration) -> Duration {
    (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(5))
}

fn result_json(episode_id: &str, result: &EpisodeResult) -> Value {
    let mut value = serde_json::to_value(result).expect("an episode result serializes");
    if let Value::Object(fields) = &mut value {
        fields.remove("id");
        fields.insert("episode_id".into(), json!(episode_id));
        fields.insert("reward".into(), json!(result.metrics.reward.unwrap_or(0.0)));
        fields.insert("truncated".into(), json!(truncated(result)));
    }
    value
}

/// Whether an episode that ended was cut off by something other than the
/// agent (gymnasium's `truncated`: closed early or idle, or failed by the
/// policy's server or a service); the other endings (`completed`,
/// `max_steps`, the agent's `error`) are `terminated`: the reward scores
/// what the agent did with its steps.
fn truncated(result: &EpisodeResult) -> bool {
    let cancelled = result.outcome == outcome_name(Outcome::Cancelled);
    ended_by_other_than_the_agent(cancelled, &result.failure_class)
}

/// `terminated` and `truncated` as gymnasium's `step` returns them beside
/// `done` (their `or`): both false while the episode runs.
fn ending(result: Option<&EpisodeResult>) -> (bool, bool) {
    match result {
        None => (false, false),
        Some(result) => {
            let truncated = truncated(result);
            (!truncated, truncated)
        }
    }
}

fn episode_exists(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "EpisodeExists",
        format!("episode {id:?} exists already; choose another episode_id, or leave it out for a generated one"),
    )
}

fn done_conflict(id: &str, entry: &Entry, slot: &Slot) -> ApiError {
    let status = entry.status();
    let how = match &slot.result {
        Some(result) => format!("ended {} at step {}", result.outcome, result.metrics.steps),
        None => format!("ended ({})", status.state),
    };
    ApiError::new(
        StatusCode::CONFLICT,
        "EpisodeDone",
        format!(
            "episode {id:?} {how}; it takes no more actions: POST /v1/episodes/{id}/close for its metrics, GET /v1/episodes/{id}/trace for its trace"
        ),
    )
}

async fn list(State(gym): State<GymState>) -> Response {
    let episodes: Vec<SlotStatus> = gym.registry.all().iter().map(|e| e.status()).collect();
    axum::Json(json!({"episodes": episodes, "open": gym.registry.open(), "max_episodes": gym.max_episodes}))
        .into_response()
}

async fn create(State(gym): State<GymState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = readable(body)?;
    let request = parse_create(&body).map_err(|e| ApiError::bad_request("InvalidEpisodeRequest", e.to_string()))?;
    let chosen_id = request.episode_id;
    if let Some(id) = &chosen_id {
        crate::server::check_id("episode_id", id)
            .map_err(|m| ApiError::bad_request("InvalidEpisodeRequest", format!("{m} (at most {MAX_ID_LEN} bytes)")))?;
    }
    let row_id = match &request.source {
        Source::Row(row) => Some(row.clone()),
        Source::Inline(_) => None,
    };
    // The episode and its place are settled before an id is generated:
    // only a create that succeeds takes one (a refused one left a gap).
    let mut input = match request.source {
        Source::Row(row) => gym.rows.get(&row).cloned().ok_or_else(|| {
            let mut examples: Vec<&str> = gym.rows.keys().take(5).map(String::as_str).collect();
            if gym.rows.len() > examples.len() {
                examples.push("…");
            }
            ApiError::bad_request(
                "UnknownTestSetRow",
                format!(
                    "row_id: no row {row:?} in the test set {} ({} rows: {})",
                    gym.test_set_name,
                    gym.rows.len(),
                    examples.join(", ")
                ),
            )
        })?,
        // The id is the row's only in name: the checks do not depend on it.
        Source::Inline(fields) => inline_input(chosen_id.as_deref().unwrap_or("episode"), fields, &gym.compare_args)
            .map_err(|e| ApiError::bad_request("InvalidEpisodeRequest", e.to_string()))?,
    };
    if let Some(id) = &chosen_id {
        if gym.registry.contains(id) {
            return Err(episode_exists(id));
        }
        if gym.trace_exists(id) {
            return Err(gym.trace_on_disk(id));
        }
    }
    let reservation = gym.registry.reserve(gym.max_episodes).map_err(|e| match e {
        RegisterError::Full { open, max } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyEpisodes",
            format!(
                "{open} episodes are open, the limit is {max}; close one (POST /v1/episodes/{{id}}/close) and retry"
            ),
        ),
        RegisterError::Exists(id) => episode_exists(&id),
    })?;
    let episode_id = match (chosen_id, &row_id) {
        (Some(id), _) => id,
        (None, Some(row)) => gym.fresh_id(|n| format!("{row}-{n}")),
        (None, None) => gym.fresh_id(|n| format!("episode-{n}")),
    };
    input.id = episode_id.clone();
    let trace_file = crate::episode::trace_file_name(&episode_id);
    let entry = Arc::new(Entry::new(SlotStatus {
        episode_id: episode_id.clone(),
        row_id: row_id.clone(),
        step: 0,
        step_in_progress: None,
        done: false,
        state: "running".into(),
        closed: false,
        created_unix_ms: unix_ms(SystemTime::now()),
        trace_file,
        last_used: std::time::Instant::now(),
    }));
    let mut slot = entry.slot.try_lock().expect("a slot nobody else has seen yet is unlocked");
    gym.registry.insert(reservation, &episode_id, entry.clone()).map_err(|_| episode_exists(&episode_id))?;

    let started: std::io::Result<(Episode, bool)> =
        gym.runner.start_new(input, &gym.out_dir).and_then(|mut episode| {
            let running = episode.advance(&gym.runner)?;
            Ok((episode, running))
        });
    let (mut episode, running) = match started {
        Ok(started) => started,
        // Created on disk since the check (another server on this directory).
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            gym.registry.release();
            gym.registry.remove(&episode_id);
            return Err(gym.trace_on_disk(&episode_id));
        }
        Err(e) => {
            gym.registry.release();
            entry.update(|s| {
                s.done = true;
                s.closed = true;
                s.state = "error".into();
            });
            return Err(trace_io(&episode_id, &e));
        }
    };
    let injections = episode.take_delivered();
    let mut body = json!({
        "episode_id": episode_id,
        "row_id": row_id,
        "observation": {
            "messages": episode.messages(),
            "tools": gym.runner.tools,
            "memory": episode.memory(),
        },
        "memory": episode.memory(),
        "step": episode.step(),
        "max_steps": gym.runner.max_steps,
        "done": !running,
        "terminated": false,
        "truncated": false,
        "injections": injections,
    });
    let step = episode.step();
    slot.episode = Some(episode);
    entry.update(|s| s.step = step);
    if !running {
        gym.finish(&entry, &mut slot, None)?;
        if let Some(result) = &slot.result {
            body["result"] = result_json(&episode_id, result);
        }
        let (terminated, truncated) = ending(slot.result.as_ref());
        body["terminated"] = json!(terminated);
        body["truncated"] = json!(truncated);
    }
    tracing::info!(episode = %episode_id, row = ?row_id, "episode created");
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// The episode's state, at once: while a step is played (`step_in_progress`)
/// the conversation and memory are those the step began from.
async fn describe(State(gym): State<GymState>, EpisodeIdPath(id): EpisodeIdPath) -> Result<Response, ApiError> {
    let entry = gym.entry(&id)?;
    let slot = entry.slot.lock().await;
    let mut body = serde_json::to_value(entry.status()).expect("a status serializes");
    if let Some(episode) = &slot.episode {
        body["messages"] = json!(episode.messages());
        body["memory"] = episode.memory();
    } else if let Some(playing) = &slot.playing {
        body["messages"] = json!(playing.messages);
        body["memory"] = playing.memory.clone();
    }
    if let Some(result) = &slot.result {
        body["result"] = result_json(&id, result);
    }
    Ok(axum::Json(body).into_response())
}

/// The step's `info`: its tool calls, summarised.
fn step_info(report: &StepReport, injections: &[String]) -> Value {
    let first_failure = report.calls.iter().find(|c| c.status != StepStatus::Ok);
    let mut delta_keys: Vec<&str> = Vec::new();
    for key in report.calls.iter().flat_map(|c| &c.memory_delta_keys) {
        if !delta_keys.contains(&key.as_str()) {
            delta_keys.push(key);
        }
    }
    let calls: Vec<Value> = report
        .calls
        .iter()
        .map(|c| {
            json!({
                "tool": c.tool,
                "call_id": c.call_id,
                "status": status_label(c.status),
                "error_type": c.error_type,
                "latency_ms": c.latency.as_secs_f64() * 1000.0,
                "memory_delta_keys": c.memory_delta_keys,
            })
        })
        .collect();
    json!({
        "step": report.step,
        "status": first_failure.map_or("ok", |c| status_label(c.status)),
        "error_type": first_failure.and_then(|c| c.error_type.clone()),
        // Summed as durations: an f64 sum of no calls is -0.0, which went out as `"latency_ms": -0.0`.
        "latency_ms": report.calls.iter().map(|c| c.latency).sum::<Duration>().as_secs_f64() * 1000.0,
        "memory_delta_keys": delta_keys,
        "plan_step_timed_out": report.plan_step_timed_out,
        "calls": calls,
        "injections": injections,
    })
}

async fn step(
    State(gym): State<GymState>,
    EpisodeIdPath(id): EpisodeIdPath,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = readable(body)?;
    // Played in a task of its own: a client that goes away mid-step (its
    // timeout, a dropped connection) drops this future, and a step cut
    // where it stood left the episode half played (its turn recorded, its
    // calls not, the next action played as the same step). Only the
    // server's stop or the episode's close cuts a step off, and then the
    // episode ends there.
    let episode_id = id.clone();
    match tokio::spawn(play_step(gym.clone(), id, body)).await {
        Ok(answer) => answer,
        // A panic the step could not catch (while ending its episode).
        Err(failed) => {
            gym.lose_step(&episode_id).await;
            let (category, what) = match failed.try_into_panic() {
                Ok(payload) => ("StepPanicked", format!("panicked: {}", panic_message(payload.as_ref()))),
                Err(failed) => ("TraceIo", format!("failed: {failed}")),
            };
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                category,
                format!("the step of episode {episode_id:?} {what}; its trace may end early"),
            ))
        }
    }
}

/// Plays one step. The episode leaves its slot for the step (its tool calls
/// may run for their whole timeout), so that reads, injections and a close
/// are not held up; a close cuts the step off, as the server's stop does.
async fn play_step(gym: GymState, id: String, body: Bytes) -> Result<Response, ApiError> {
    let entry = gym.entry(&id)?;
    // One step at a time: a second waits for the first, then finds the episode moved on.
    let _turn = entry.turn.lock().await;
    let (mut episode, action) = {
        let mut slot = entry.slot.lock().await;
        let Some(episode) = slot.episode.as_ref() else { return Err(done_conflict(&id, &entry, &slot)) };
        let step = episode.step();
        let action = parse_action(&body, step).map_err(|e| match e.step_mismatch {
            true => ApiError::new(StatusCode::CONFLICT, "StepMismatch", format!("{}: {}", e.field, e.message)),
            false => ApiError::bad_request("InvalidAction", e.to_string()),
        })?;
        let playing = Playing { step, messages: episode.messages().to_vec(), memory: episode.memory() };
        let episode = slot.episode.take().expect("checked just above");
        slot.playing = Some(playing);
        entry.update(|s| s.step_in_progress = Some(step));
        (episode, action)
    };
    let assistant_at = episode.messages().len();
    let deadline = tokio::time::Instant::now() + gym.runner.plan_step_timeout;
    // A panic in the step (a tool's, the sandbox's own bug) is caught here,
    // with the episode still in hand: it ends the episode in error and its
    // trace is completed. Uncaught, the episode was lost with the task and
    // its trace left without an end or an index, as if cut off by a crash.
    let played: Option<std::thread::Result<std::io::Result<(StepReport, bool)>>> = tokio::select! {
        biased;
        () = gym.stop.cancelled() => None,
        () = entry.closing.cancelled() => None,
        played = AssertUnwindSafe(async {
            let report = episode.act(&gym.runner, &action, deadline).await?;
            let running = episode.advance(&gym.runner)?;
            Ok((report, running))
        }).catch_unwind() => Some(played),
    };
    let mut slot = entry.slot.lock().await;
    slot.playing = None;
    let (report, running, stopped) = match played {
        Some(Ok(Ok((report, running)))) => (report, running, None),
        Some(Err(panic)) => {
            let step = episode.step();
            let message = panic_message(panic.as_ref());
            tracing::error!(episode = %id, step, "the step panicked: {message}");
            let recorded = episode.stop(PANIC, PANIC, format!("the step panicked: {message}"));
            slot.episode = Some(episode);
            entry.update(|s| s.step_in_progress = None);
            if let Err(e) = recorded {
                let error = trace_io(&id, &e);
                let _ = gym.finish(&entry, &mut slot, Some(format!("the trace could not be written: {e}")));
                return Err(error);
            }
            gym.finish(&entry, &mut slot, None)?;
            return Err(step_panicked(&id, step, &message));
        }
        Some(Ok(Err(e))) => {
            let error = trace_io(&id, &e);
            slot.episode = Some(episode);
            entry.update(|s| s.step_in_progress = None);
            let _ = gym.finish(&entry, &mut slot, Some(format!("the trace could not be written: {e}")));
            return Err(error);
        }
        // As driver mode's stop: the step ends where it is (in the trace, an
        // error context that says why) and the episode as `cancelled`.
        None => {
            let step = episode.step();
            let why = if gym.stop.is_cancelled() { "the server shut down" } else { "closed by the client" };
            (StepReport { step, ..StepReport::default() }, false, Some(format!("stopped at step {step}: {why}")))
        }
    };
    let messages = episode.messages().get(assistant_at + 1..).unwrap_or_default().to_vec();
    let injections = episode.take_delivered();
    let memory = episode.memory();
    let step_now = episode.step();
    slot.episode = Some(episode);
    entry.update(|s| {
        s.step_in_progress = None;
        s.step = step_now;
    });
    let mut info = step_info(&report, &injections);
    let mut reward = 0.0;
    if !running {
        gym.finish(&entry, &mut slot, stopped)?;
        if let Some(result) = &slot.result {
            reward = result.metrics.reward.unwrap_or(0.0);
            info["outcome"] = json!(result.outcome);
            info["result"] = result_json(&id, result);
        }
    }
    let (terminated, truncated) = ending(slot.result.as_ref().filter(|_| !running));
    let body = json!({
        "observation": {"messages": messages, "memory": memory},
        "reward": reward,
        "done": !running,
        "terminated": terminated,
        "truncated": truncated,
        "info": info,
    });
    Ok(axum::Json(body).into_response())
}

/// The answer to a step that panicked: the episode ended in error there.
fn step_panicked(id: &str, step: u32, message: &str) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "StepPanicked",
        format!(
            "the step of episode {id:?} panicked: {message}; the episode ended in error at step {step} and its trace \
             is complete: POST /v1/episodes/{id}/close for its result, GET /v1/episodes/{id}/trace for its trace. \
             A panic is a bug (in a tool or the sandbox): please report it with the trace"
        ),
    )
}

/// Delivers an injection due now at once; one for a later step, or any
/// while a step is played, is queued for the step it names (or the next).
async fn inject(
    State(gym): State<GymState>,
    EpisodeIdPath(id): EpisodeIdPath,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = readable(body)?;
    let entry = gym.entry(&id)?;
    let request = read_injection(&id, &body)?;
    let mut slot = entry.slot.lock().await;
    let playing = slot.playing.as_ref().map(|p| p.step);
    if slot.episode.is_none() && playing.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "EpisodeFinished",
            format!("episode {id:?} has already finished; an injection can no longer reach it"),
        ));
    }
    let at_step = request.at_step;
    // A step past the last the episode may take is never reached: accepted,
    // it was dropped without a word.
    if let Some(at) = at_step.filter(|at| *at > gym.runner.max_steps) {
        return Err(ApiError::bad_request(
            "InvalidInjection",
            format!(
                "`at_step` is {at}, but episode {id:?} ends by step {} (its sandbox's maxSteps); leave it out for the next turn",
                gym.runner.max_steps
            ),
        ));
    }
    // The step under way had its turn when it began: queued, this would reach the next one instead.
    if let Some(running) = playing
        && let Some(at) = at_step.filter(|at| *at <= running)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "StepInProgress",
            format!(
                "`at_step` is {at}, but episode {id:?} is playing step {running}, whose turn was taken when it began: \
                 the injection was not queued; name step {} or later, or leave `at_step` out for the next turn",
                running + 1
            ),
        ));
    }
    let injection_id = match request.id {
        Some(given) if gym.runner.is_scheduled_injection(&given) => {
            let refused = InjectionRefused::Scheduled { episode: id.clone(), id: given };
            return Err(ApiError::new(StatusCode::CONFLICT, "InjectionExists", refused.to_string()));
        }
        Some(given) if slot.injection_ids.contains(&given) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "InjectionExists",
                format!(
                    "injection {given:?} was accepted by episode {id:?} already; it is not injected twice: give a new \
                     injection its own `id`, or leave `id` out for a generated one"
                ),
            ));
        }
        Some(given) => given,
        // A generated id skips those a client chose (`live-3`, say) in this episode, and the scheduled ones'.
        None => loop {
            let generated = generated_injection_id(&gym.next_injection);
            if !slot.injection_ids.contains(&generated) && !gym.runner.is_scheduled_injection(&generated) {
                break generated;
            }
        },
    };
    slot.injection_ids.insert(injection_id.clone());
    let injection = LiveInjection { id: injection_id.clone(), observation: request.observation, at_step };
    gym.runner.live.push(&id, injection);
    let (delivered_at_step, messages) = match slot.episode.as_mut() {
        Some(episode) => {
            let before = episode.messages().len();
            let delivered = episode.deliver_live(&gym.runner).map_err(|e| trace_io(&id, &e))?;
            episode.take_delivered();
            let delivered_at_step = delivered.contains(&injection_id).then(|| episode.step());
            (delivered_at_step, episode.messages().get(before..).unwrap_or_default().to_vec())
        }
        // Delivered by the step's end when it is due at the next step.
        None => (None, Vec::new()),
    };
    entry.update(|_| {});
    let body = json!({
        "id": injection_id,
        "episode": id,
        "at_step": at_step,
        "delivered_at_step": delivered_at_step,
        "observation": {"messages": messages},
    });
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// Ends the episode and answers its result. A step under way is cut off
/// where it stands (it ends the episode, `stopped at step N: closed by the
/// client`, and its own client hears so), as the server's stop does.
async fn close(State(gym): State<GymState>, EpisodeIdPath(id): EpisodeIdPath) -> Result<Response, ApiError> {
    let entry = gym.entry(&id)?;
    entry.closing.cancel();
    // Free once the cut step has ended; a step that begins after the close
    // is cut before its action is played.
    let _turn = entry.turn.lock().await;
    let mut slot = entry.slot.lock().await;
    if let Some(episode) = &slot.episode {
        let reason = format!("closed by the client at step {}", episode.step());
        gym.finish(&entry, &mut slot, Some(reason))?;
    }
    match &slot.result {
        Some(result) => Ok(axum::Json(result_json(&id, result)).into_response()),
        None => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "TraceIo",
            format!("episode {id:?} ended without a result: its trace could not be written"),
        )),
    }
}

async fn trace(State(gym): State<GymState>, EpisodeIdPath(id): EpisodeIdPath) -> Result<Response, ApiError> {
    let trace_file = match gym.registry.get(&id) {
        Some(entry) => entry.status().trace_file,
        None if gym.trace_exists(&id) => crate::episode::trace_file_name(&id),
        None => return Err(gym.unknown(&id)),
    };
    let path = gym.out_dir.join(&trace_file);
    let bytes = tokio::fs::read(&path).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "TraceIo",
            format!("cannot read the trace of episode {id:?} at {}: {e}", path.display()),
        )
    })?;
    // Complete is what the file says: its writer's footer is there. A closed
    // episode's trace is not complete when its writing failed (a full disk),
    // nor one an earlier server left cut off by a crash.
    let complete = basecamp_trace::IndexedTrace::new(std::io::Cursor::new(&bytes[..]), trace_file.clone())
        .is_ok_and(|trace| trace.is_finished());
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
        (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{trace_file}\"")),
        (header::HeaderName::from_static("x-basecamp-trace-complete"), complete.to_string()),
    ];
    Ok((headers, bytes).into_response())
}
