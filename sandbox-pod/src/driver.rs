//! Driver mode: run one shard of a test set — episodes as concurrent tasks
//! sharing one runner — and write the shard's `summary.json` next to its
//! traces. The summary is written even when episodes fail: every episode
//! that ran is in it, with its failure class and trace file.

use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use basecamp_trace::metrics::{Aggregate, aggregate};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::episode::{EpisodeInput, EpisodeResult, EpisodeRunner};
use crate::executor::unix_nanos;

/// A shard's `summary.json`.
#[derive(Debug, Clone, Serialize)]
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
    /// Episodes whose trace could not be written, with the error.
    pub lost: Vec<LostEpisode>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LostEpisode {
    pub id: String,
    pub error: String,
}

pub const SUMMARY_FILE: &str = "summary.json";

/// Runs `episodes` with at most `concurrency` at a time, traces into `out_dir`.
/// `on_done` is called after each episode (progress, metrics).
pub async fn run_shard(
    runner: Arc<EpisodeRunner>,
    episodes: Vec<EpisodeInput>,
    out_dir: &Path,
    concurrency: usize,
    on_done: impl Fn(&EpisodeResult),
) -> std::io::Result<ShardSummary> {
    std::fs::create_dir_all(out_dir)?;
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    for (index, input) in episodes.into_iter().enumerate() {
        let runner = runner.clone();
        let permits = permits.clone();
        let dir = out_dir.to_path_buf();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("the semaphore is never closed");
            let result = runner.run(&input, &dir).await;
            (index, input.id, result)
        });
    }
    let mut done: Vec<(usize, EpisodeResult)> = Vec::new();
    let mut lost = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((index, _, Ok(result))) => {
                on_done(&result);
                done.push((index, result));
            }
            Ok((_, id, Err(e))) => lost.push(LostEpisode { id, error: format!("cannot write the trace: {e}") }),
            Err(e) => lost.push(LostEpisode { id: "?".into(), error: format!("episode task failed: {e}") }),
        }
    }
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
        aggregate: aggregate(episodes.iter().map(|e| (&e.metrics, e.outcome.as_str()))),
        episodes,
        lost,
    };
    write_summary(&summary, out_dir)?;
    Ok(summary)
}

/// Writes `summary.json` atomically (temp file, then rename).
pub fn write_summary(summary: &ShardSummary, out_dir: &Path) -> std::io::Result<()> {
    let tmp = out_dir.join(format!(".{SUMMARY_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(summary).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, out_dir.join(SUMMARY_FILE))
}
