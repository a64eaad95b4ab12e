//! Which checkpoints to evaluate (pure): complete checkpoints from a
//! listing of `C`, the plan — oldest first, at most
//! `maxConcurrentEvaluations` steps at once, never a step at or below the
//! resumed one, never one already evaluated or running — and the history
//! kept in `steps.json` and `status.training.history`.

use std::collections::{BTreeMap, BTreeSet};

use basecamp_api::task::{CheckpointEvaluation, TRAINING_HISTORY_LIMIT, parse_checkpoint_step};

/// Complete checkpoints by step: the segment as the trainer named it
/// (`step-100`, `step-000100`). A checkpoint is complete once
/// `step-N/<marker>` exists; `relative` are keys relative to `C`.
pub fn complete_checkpoints<'a>(relative: impl IntoIterator<Item = &'a str>, marker: &str) -> BTreeMap<u64, String> {
    let mut complete = BTreeMap::new();
    for key in relative {
        if let Some((segment, file)) = key.split_once('/')
            && file == marker
            && let Some(step) = parse_checkpoint_step(segment)
        {
            // Two spellings of one step (step-100, step-0100): the first in key order.
            complete.entry(step).or_insert_with(|| segment.to_string());
        }
    }
    complete
}

/// What to do with the checkpoints this time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Steps to start evaluating now, oldest first.
    pub start: Vec<u64>,
    /// Steps waiting for a slot, oldest first.
    pub queued: Vec<u64>,
    /// Complete checkpoints above the resumed step.
    pub found: u32,
}

/// The plan: the complete steps above `resumed` that are neither
/// `evaluated` nor `running`, oldest first; as many start as
/// `max_concurrent` leaves beside the running ones.
pub fn plan(
    complete: &BTreeMap<u64, String>,
    resumed: Option<u64>,
    evaluated: &BTreeSet<u64>,
    running: &BTreeSet<u64>,
    max_concurrent: u32,
) -> Plan {
    let fresh: Vec<u64> = complete.keys().copied().filter(|step| resumed.is_none_or(|r| *step > r)).collect();
    let waiting: Vec<u64> =
        fresh.iter().copied().filter(|step| !evaluated.contains(step) && !running.contains(step)).collect();
    let slots = usize::try_from(max_concurrent.max(1)).unwrap_or(usize::MAX).saturating_sub(running.len());
    let (start, queued) = waiting.split_at(slots.min(waiting.len()));
    Plan { start: start.to_vec(), queued: queued.to_vec(), found: u32::try_from(fresh.len()).unwrap_or(u32::MAX) }
}

/// Every evaluation in `lists`, one per step (the first seen wins: a step is
/// evaluated once), sorted by step.
pub fn merge(lists: &[&[CheckpointEvaluation]]) -> Vec<CheckpointEvaluation> {
    let mut by_step: BTreeMap<u64, CheckpointEvaluation> = BTreeMap::new();
    for evaluation in lists.iter().flat_map(|l| l.iter()) {
        by_step.entry(evaluation.step).or_insert_with(|| evaluation.clone());
    }
    by_step.into_values().collect()
}

/// The newest [`TRAINING_HISTORY_LIMIT`] of a sorted list, oldest first.
pub fn newest(all: &[CheckpointEvaluation]) -> Vec<CheckpointEvaluation> {
    all[all.len().saturating_sub(TRAINING_HISTORY_LIMIT)..].to_vec()
}

/// `steps.json` as read: a JSON array of evaluations (an empty file is an empty list).
pub fn parse_steps(bytes: &[u8]) -> Result<Vec<CheckpointEvaluation>, serde_json::Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    serde_json::from_slice(bytes)
}
