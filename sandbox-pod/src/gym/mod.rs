//! Server mode: a gym-like HTTP API through which an external RL trainer
//! uses the sandbox as its environment. The trainer is the policy: it
//! creates an episode (a test-set row, or one given inline), receives the
//! observation (messages, tools, memory), and answers each step with an
//! action — tool calls or a final answer — that the sandbox plays exactly
//! as driver mode plays the policy's answer: the same [`Episode`] step
//! machine, executor, injections, rollback, rewards and trace writer, so a
//! trace from either mode reads the same.
//!
//! - `POST /v1/episodes` -> `{episode_id, observation, memory, …}`;
//! - `POST /v1/episodes/{id}/step` -> `{observation, reward, done, terminated, truncated, info}` (gymnasium's pair);
//! - `POST /v1/episodes/{id}/inject`: driver mode's live injection, same body;
//! - `POST /v1/episodes/{id}/close` -> the episode's metrics (trace completed);
//! - `GET /v1/episodes/{id}/trace` -> the `.trace` bytes;
//! - `GET /v1/episodes`, `GET /v1/episodes/{id}`, `/metrics`, `/healthz`.
//!
//! A step may run for a tool's whole timeout, and holds up nothing else:
//! meanwhile `GET /v1/episodes/{id}` answers at once with the state the
//! step began from (`step_in_progress: N`), an injection is queued for the
//! step it names (409 `StepInProgress` when that is the step under way or
//! an earlier one), and a close cuts the step off where it stands (the
//! episode ends `cancelled`, "stopped at step N: closed by the client", and
//! the step's client is answered so), as the server's stop does. An
//! injection `id` is taken once per episode: a second of the same id, or
//! one of a scheduled injection's (the sandbox's `spec.injections`), is
//! refused (409 `InjectionExists`), never injected twice. A generated
//! episode id is taken only by a create that succeeds.
//!
//! `openapi/sandbox.yaml` documents them; a test holds the router and the
//! document to each other. Errors are [`ApiError`](crate::server::ApiError)s.
//! At most `max_episodes` are open at once (429 beyond), and an episode idle
//! for `idle_timeout` (no create, step, inject or close: reads do not count,
//! so a dashboard watching an abandoned episode does not keep its place) is
//! closed as `cancelled`. A closed episode is held (listed, described) for
//! `keep_closed` after its last such request, then
//! forgotten: its trace stays in the output directory, `GET …/trace` still
//! serves it, and its id is never given again. So a server that runs
//! millions of episodes holds those of the last few minutes, not all.
//!
//! - [`action`]: an action body as a policy response;
//! - [`client`]: a client of the API (both modes), for `basecamp sandbox inject`;
//! - [`create`]: a create body as an episode input;
//! - [`registry`]: the episodes, their locks and the open-episode bound;
//! - [`mod@routes`]: the handlers and the route table;
//! - [`setup`]: from manifests to a [`Gym`] (`basecamp-sandbox serve`).
//!
//! [`Episode`]: crate::episode::Episode

pub mod action;
pub mod client;
pub mod create;
pub mod registry;
pub mod routes;
pub mod setup;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::episode::{EpisodeInput, EpisodeRunner};
use crate::metrics::SandboxMetrics;

pub use routes::{router, routes};

/// Open episodes at once, by default.
pub const DEFAULT_MAX_EPISODES: usize = 64;
/// How long an episode may go without a request before it is closed, by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// What a server-mode sandbox is built from.
#[derive(Debug)]
pub struct GymConfig {
    pub runner: EpisodeRunner,
    /// The task's test set, episodes that `row_id` can name.
    pub rows: Vec<EpisodeInput>,
    /// The test set's name, for messages.
    pub test_set_name: String,
    /// The task's per-tool `compareArgs`, applied to inline episodes.
    pub compare_args: BTreeMap<String, Vec<String>>,
    /// Where the traces go.
    pub out_dir: PathBuf,
    pub max_episodes: usize,
    pub idle_timeout: Duration,
    /// How long a closed episode stays held after its last request
    /// (`basecamp-sandbox serve`: the idle timeout).
    pub keep_closed: Duration,
}

/// A server-mode sandbox: the runner, the test set and the episodes.
#[derive(Debug)]
pub struct Gym {
    runner: EpisodeRunner,
    metrics: Arc<SandboxMetrics>,
    rows: BTreeMap<String, EpisodeInput>,
    test_set_name: String,
    compare_args: BTreeMap<String, Vec<String>>,
    out_dir: PathBuf,
    max_episodes: usize,
    idle_timeout: Duration,
    keep_closed: Duration,
    registry: registry::Registry,
    next_injection: AtomicU64,
    /// Fired when the server stops: a step under way is cut off there.
    stop: crate::driver::StopSignal,
}

/// What the handlers share.
pub type GymState = Arc<Gym>;

impl Gym {
    /// Builds the sandbox, creating the trace directory. The runner's
    /// metrics are the ones `/metrics` serves (created when it has none).
    pub fn new(config: GymConfig) -> std::io::Result<GymState> {
        std::fs::create_dir_all(&config.out_dir)?;
        let mut runner = config.runner;
        let metrics = runner.metrics.get_or_insert_with(|| Arc::new(SandboxMetrics::new())).clone();
        metrics.declare_tools(runner.tools.iter().map(|t| t.name.as_str()));
        Ok(Arc::new(Self {
            runner,
            metrics,
            rows: config.rows.into_iter().map(|row| (row.id.clone(), row)).collect(),
            test_set_name: config.test_set_name,
            compare_args: config.compare_args,
            out_dir: config.out_dir,
            max_episodes: config.max_episodes.max(1),
            idle_timeout: config.idle_timeout,
            keep_closed: config.keep_closed,
            registry: registry::Registry::default(),
            next_injection: AtomicU64::new(1),
            stop: crate::driver::StopSignal::new(),
        }))
    }

    pub fn metrics(&self) -> &Arc<SandboxMetrics> {
        &self.metrics
    }

    pub fn out_dir(&self) -> &std::path::Path {
        &self.out_dir
    }
}

/// Serves the API on `listener` until `shutdown` completes, closing idle
/// episodes as it goes; at shutdown the steps under way are cut off where
/// they are (their episodes end `cancelled`, as in driver mode) and every
/// open episode is closed, so each trace is complete.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gym: GymState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let reaper_gym = gym.clone();
    let reaper = tokio::spawn(async move {
        let mut tick =
            tokio::time::interval(routes::reaper_period(reaper_gym.idle_timeout.min(reaper_gym.keep_closed)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            reaper_gym.close_idle().await;
        }
    });
    // The graceful shutdown waits for the requests under way: the stop cuts
    // their steps off first (a tool may run for its whole timeout).
    let stop = gym.stop.clone();
    let shutdown = async move {
        shutdown.await;
        stop.cancel();
    };
    let served = axum::serve(listener, router(gym.clone())).with_graceful_shutdown(shutdown).await;
    reaper.abort();
    gym.close_all("the server shut down").await;
    served
}
