//! Which checkpoints to evaluate (pure): the step directories of `C`,
//! which of them need their completion marker checked this poll (only
//! steps that could start: above the resumed one, neither evaluated,
//! running nor known complete already, a bounded number per poll), the
//! plan — oldest first, at most `maxConcurrentEvaluations` steps at once,
//! never a step at or below the resumed one, never one already evaluated
//! or running — and the history kept in `steps.json` and
//! `status.training.history`.

use std::collections::{BTreeMap, BTreeSet};

use basecamp_api::task::{CheckpointEvaluation, MAX_CHECKPOINT_STEP, TRAINING_HISTORY_LIMIT, parse_checkpoint_step};

/// Marker checks allowed per poll beyond the free evaluation slots: enough
/// to keep a few complete steps queued (and counted) ahead of the slots, so
/// a backlog of new checkpoints is found over several polls instead of
/// costing one request per checkpoint every poll.
pub const MARKER_LOOKAHEAD: usize = 4;

/// Checkpoint directories by step, from the names of `C`'s sub-directories
/// (`step-100`, `step-000100`; anything else, such as `dataset`, is not a
/// checkpoint): every spelling of a step, in name order.
pub fn step_dirs<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeMap<u64, Vec<String>> {
    let mut dirs: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for name in names {
        if let Some(step) = parse_checkpoint_step(name)
            && !name.contains('/')
        {
            dirs.entry(step).or_default().push(name.to_string());
        }
    }
    for spellings in dirs.values_mut() {
        spellings.sort();
        spellings.dedup();
    }
    dirs
}

/// The names of `C`'s sub-directories that look meant as checkpoints but
/// are not `step-<N>` ([`step_dirs`] leaves them out): `step` in any case
/// followed by anything but a letter (`step_100`, `Step-100`, `step100`,
/// `step-1e3`, `step-` with a step above [`MAX_CHECKPOINT_STEP`]), sorted,
/// at most `limit`. `steps`, `stepwise` and `dataset` are other things.
pub fn misnamed_dirs<'a>(names: impl IntoIterator<Item = &'a str>, limit: usize) -> Vec<String> {
    let mut misnamed: Vec<String> = names
        .into_iter()
        .filter(|name| !name.contains('/') && parse_checkpoint_step(name).is_none())
        .filter(|name| {
            let lower = name.to_ascii_lowercase();
            lower.strip_prefix("step").is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphabetic()))
        })
        .map(str::to_string)
        .collect();
    misnamed.sort();
    misnamed.dedup();
    misnamed.truncate(limit);
    misnamed
}

/// The Warning that a misnamed directory (see [`misnamed_dirs`]) of `root`
/// (`C`, ending in `/`) is not evaluated.
pub fn ignored_note(root: &str, name: &str) -> String {
    format!(
        "{root}{name}/ is not evaluated: a checkpoint directory is named step-<N>, N a whole number up to \
         {MAX_CHECKPOINT_STEP} (step-100, step-000100); rename it if it is a checkpoint"
    )
}

/// The Warning that `C` changed from `before` to `now` after the steps of
/// `evaluated` were evaluated: history is keyed by step (and so are the
/// evaluation Jobs, run names and reports), so those steps are not
/// evaluated again under the new root.
pub fn root_changed_note(before: &str, now: &str, evaluated: &BTreeSet<u64>) -> String {
    let steps: Vec<String> = evaluated.iter().take(5).map(u64::to_string).collect();
    let more = if evaluated.len() > steps.len() {
        format!(" and {} more", evaluated.len() - steps.len())
    } else {
        String::new()
    };
    format!(
        "the checkpoint root changed from {before} to {now}; steps {}{more} were evaluated under the old root and are \
         not evaluated again under the new one (a task's history is keyed by step): to evaluate another training \
         run from step 0, create a new HarnessTask",
        steps.join(", ")
    )
}

/// The step directories whose completeness is known without a request,
/// and the ones to check for their marker (oldest first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// Complete checkpoints by step, the directory as the trainer named it.
    pub complete: BTreeMap<u64, String>,
    /// Steps above the resumed one whose marker is unknown, oldest first.
    pub unknown: Vec<u64>,
}

/// Steps whose checkpoint was complete when last seen, so that its marker
/// need not be checked again: markers are written last and never removed.
#[derive(Debug, Clone, Copy)]
pub struct KnownSteps<'a> {
    /// Evaluated (status history or `steps.json`): complete when started.
    pub evaluated: &'a BTreeSet<u64>,
    /// With evaluation Jobs: complete when started.
    pub running: &'a BTreeSet<u64>,
    /// The previous poll's queue (for the same `C` and spec): complete then.
    pub queued_before: &'a BTreeSet<u64>,
}

/// Sorts the step directories above `resumed` into known complete (see
/// [`KnownSteps`]) and unknown. A queued step with two spellings is
/// unknown again: the queue does not say which one had the marker.
pub fn discover(dirs: &BTreeMap<u64, Vec<String>>, resumed: Option<u64>, known: KnownSteps<'_>) -> Discovery {
    let mut found = Discovery::default();
    for (step, spellings) in dirs.iter().filter(|(step, _)| resumed.is_none_or(|r| **step > r)) {
        let Some(first) = spellings.first() else { continue };
        let complete = known.evaluated.contains(step)
            || known.running.contains(step)
            || (known.queued_before.contains(step) && spellings.len() == 1);
        if complete {
            found.complete.insert(*step, first.clone());
        } else {
            found.unknown.push(*step);
        }
    }
    found
}

/// How many marker checks (one request each) this poll may make: the
/// evaluation slots that are free plus [`MARKER_LOOKAHEAD`].
pub fn marker_check_budget(max_concurrent: u32, running: usize) -> usize {
    usize::try_from(max_concurrent.max(1)).unwrap_or(usize::MAX).saturating_sub(running) + MARKER_LOOKAHEAD
}

/// What to do with the checkpoints this time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Steps to start evaluating now, oldest first.
    pub start: Vec<u64>,
    /// Steps waiting for a slot, oldest first.
    pub queued: Vec<u64>,
    /// Complete checkpoints above the resumed step (of those in `complete`).
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
/// A step above [`MAX_CHECKPOINT_STEP`] (recorded by an operator that took
/// one) is left out: status could not hold it.
pub fn parse_steps(bytes: &[u8]) -> Result<Vec<CheckpointEvaluation>, serde_json::Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let mut steps: Vec<CheckpointEvaluation> = serde_json::from_slice(bytes)?;
    steps.retain(|e| e.step <= MAX_CHECKPOINT_STEP);
    Ok(steps)
}
