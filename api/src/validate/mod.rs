//! The one validation shared by the sandbox, the operator and the CLI.
//!
//! [`validate_task`] checks a HarnessTask spec, every SandboxConfig it
//! references (with the selected profile applied), and — when the caller has
//! it — the test set against the sandbox's tools. [`validate_sandbox`] checks
//! a SandboxConfig on its own, base spec and every profile. Both return a
//! [`Report`] with EVERY problem found, never just the first, each with a
//! severity, a bounded rule name, the object, a field path or `file:line`,
//! and a message that says what to do.
//!
//! Validation reads no network. It reads local files (the test set,
//! recorded-tool fixtures, a scripted policy) only when
//! [`ValidationContext::base_dir`] is set — the CLI sets it to the
//! manifest's directory; the operator leaves it unset.

mod names;
mod sandbox;
mod task;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::duration::{Duration, MAX_SPEC_DURATION};
use crate::problem::{Problem, Report, Rule};
use crate::sandbox::SandboxConfigSpec;
use crate::task::HarnessTaskSpec;
use crate::testset::TestSet;

pub use names::{
    dns_subdomain_violation, is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name, is_tool_name,
};

/// What validation may use besides the specs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ValidationContext<'a> {
    /// The task's name, for messages (`HarnessTask/<name>`).
    pub task_name: Option<&'a str>,
    /// The test set, when the caller has loaded it: each row's
    /// `expected_tool_calls` are checked against the sandbox's tools and the
    /// shard count against its size.
    pub test_set: Option<&'a TestSet>,
    /// The directory relative paths are resolved against. When set, local
    /// files the spec names (test set, fixtures, scripted policy) are read
    /// and checked; when unset, no file is touched.
    pub base_dir: Option<&'a Path>,
    /// Fixture files already read by an earlier check sharing this memo:
    /// a fixture that a SandboxConfig, each of its profiles and each task
    /// using it all name is then read once. Without one, each check reads
    /// the file itself.
    pub fixtures: Option<&'a FixtureMemo>,
}

/// What validation needs of each fixture file it has read, by path.
#[derive(Debug, Default)]
pub struct FixtureMemo(Mutex<HashMap<PathBuf, Arc<FixtureFacts>>>);

/// The tools a fixture records, each with the line it first appears on, or
/// the file's problems when it cannot be read or parsed.
#[derive(Debug)]
pub(crate) struct FixtureFacts {
    pub(crate) name: String,
    pub(crate) tools: Result<Vec<(String, u64)>, Report>,
    /// Entries that write or remove the empty memory key `""`: line, field.
    /// Warnings, not errors: a fixture records what a tool answered, a
    /// buggy answer included, and a run replays it (refused there as the
    /// tool's own write would be).
    pub(crate) empty_memory_keys: Vec<(u64, String)>,
}

impl FixtureFacts {
    fn read(file: &Path) -> FixtureFacts {
        match crate::fixture::Fixture::load(file) {
            Err(error) => FixtureFacts {
                name: file.display().to_string(),
                tools: Err(error.to_report()),
                empty_memory_keys: Vec::new(),
            },
            Ok(fixture) => {
                let mut tools: Vec<(String, u64)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                let mut empty_memory_keys = Vec::new();
                for entry in fixture.entries {
                    if entry.memory_patch.as_ref().is_some_and(|patch| patch.contains_key("")) {
                        empty_memory_keys.push((entry.line, "memoryPatch".to_string()));
                    }
                    let removed = entry.memory_remove.iter().flatten().enumerate().filter(|(_, key)| key.is_empty());
                    empty_memory_keys.extend(removed.map(|(i, _)| (entry.line, format!("memoryRemove[{i}]"))));
                    if seen.insert(entry.tool.clone()) {
                        tools.push((entry.tool, entry.line));
                    }
                }
                FixtureFacts { name: fixture.name, tools: Ok(tools), empty_memory_keys }
            }
        }
    }
}

impl FixtureMemo {
    pub(crate) fn facts(memo: Option<&FixtureMemo>, file: &Path) -> Arc<FixtureFacts> {
        let Some(memo) = memo else { return Arc::new(FixtureFacts::read(file)) };
        // Held while the file is read: two checks never read it at once.
        let mut read = memo.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        read.entry(file.to_path_buf()).or_insert_with(|| Arc::new(FixtureFacts::read(file))).clone()
    }
}

impl ValidationContext<'_> {
    pub(crate) fn task_label(&self) -> String {
        match self.task_name {
            Some(name) => format!("HarnessTask/{name}"),
            None => "HarnessTask".to_string(),
        }
    }

    /// `path` resolved against `base_dir`, when files may be read and the
    /// path is local.
    fn local_file(&self, path: &str) -> Option<PathBuf> {
        let base = self.base_dir?;
        if path.starts_with("s3://") || path.contains("://") {
            return None;
        }
        Some(base.join(path))
    }
}

/// Checks a HarnessTask spec and the sandboxes it references.
///
/// `sandboxes` are the SandboxConfigs the task may reference (its
/// namespace, or the same manifest), by name. Problems in a sandbox are
/// attributed to `SandboxConfig/<name>`, with `(profile <p>)` when they
/// appear only with the task's profile applied.
pub fn validate_task(
    task: &HarnessTaskSpec,
    sandboxes: &[(&str, &SandboxConfigSpec)],
    ctx: &ValidationContext<'_>,
) -> Report {
    task::validate(task, sandboxes, ctx)
}

/// Checks a SandboxConfig on its own: the base spec, then every profile
/// (reporting only what a profile adds to the base's problems).
pub fn validate_sandbox(name: &str, spec: &SandboxConfigSpec, ctx: &ValidationContext<'_>) -> Report {
    let mut report = sandbox::check(name, spec, None, ctx);
    for profile in spec.profiles.keys() {
        report.extend(sandbox::check(name, spec, Some(profile), ctx));
    }
    report
}

/// A duration of a spec longer than [`MAX_SPEC_DURATION`]: an error at `path`.
fn check_not_too_long(problems: &mut Vec<Problem>, path: &str, duration: Duration) {
    if duration > MAX_SPEC_DURATION {
        problems.push(Problem::error(
            Rule::OutOfRange,
            path,
            format!(
                "the duration is {duration}, longer than {MAX_SPEC_DURATION} ({} days), the most a duration in a spec may be; give a shorter one (a bare number counts milliseconds)",
                MAX_SPEC_DURATION.as_whole_days()
            ),
        ));
    }
}

fn push_all(report: &mut Report, object: &str, problems: impl IntoIterator<Item = Problem>) {
    for problem in problems {
        report.push(problem.in_object(object));
    }
}

/// "a, b, c" or "none", at most `limit` names then "...".
fn list(names: impl IntoIterator<Item = impl AsRef<str>>, limit: usize) -> String {
    let names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_string()).collect();
    if names.is_empty() {
        return "none".to_string();
    }
    let mut text = names.iter().take(limit).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > limit {
        text.push_str(&format!(", ... ({} in all)", names.len()));
    }
    text
}

/// The defined name closest to `name` (by edit distance), if close enough
/// to be a likely typo.
pub(crate) fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            current.push((previous[j] + cost).min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// " Did you mean \"x\"?" or "".
pub(crate) fn suggestion<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    did_you_mean(name, candidates).map(|c| format!(" Did you mean {c:?}?")).unwrap_or_default()
}

#[cfg(test)]
mod tests;
