//! Root-cause hints for a variant's failed episodes, read back from their
//! traces: what a person would grep for, counted. The strongest signal is a
//! memory key set to `null` during the episode — by which source (a
//! fallback first, then a tool, the policy, an injection) and after which
//! error — because a null in memory silently derails everything after it.
//! A null the episode started with (the test set's initial memory) or got
//! back from a rollback is given, not a cause. Stronger still is a call
//! that failed because a service it calls had exited (`service_exited`):
//! the sandbox broke, and what followed says nothing of the agent.
//! Failures without either are grouped by their failure class.

use std::collections::BTreeMap;
use std::path::PathBuf;

use basecamp_trace::metrics::{POLICY_ERROR, SERVICE_EXITED};
use basecamp_trace::pb::{self, record::Body};
use serde::Serialize;

use super::summary::EpisodeRow;

/// One cluster of failed episodes and the sentence that explains it.
#[derive(Debug, Clone, Serialize)]
pub struct RootCause {
    /// e.g. "in 19 of 19 failed episodes `shipping_status` was set to null by
    /// the fallback of `track_order` (after timeout x12, rate_limited x7)".
    pub hint: String,
    pub episodes: usize,
    pub of_failed: usize,
    /// What clusters them: `service_exited:<tool>`, `null:<key>:<source>:<origin>` or `class:<failure_class>`.
    pub key: String,
    /// Up to five episode ids, for a first look.
    pub examples: Vec<String>,
}

/// What one failed trace says about why.
#[derive(Debug, Default)]
struct Evidence {
    /// The first null a fallback wrote, else the first written by anything
    /// else during the episode: key, source, origin.
    null_write: Option<(String, String, String)>,
    /// Error types of the steps whose fallback was used, by tool.
    fallback_errors: BTreeMap<String, Vec<String>>,
    /// The tool of the first call that failed because a service had exited.
    service_exited: Option<String>,
    /// The message of the first error context: why the episode failed,
    /// where no null write or dead service says it (a policy endpoint that
    /// could not be reached, a panic).
    first_error: Option<String>,
    /// The message of the last error context: the one that ended the
    /// episode (a policy failure after a tool's timeout, say).
    last_error: Option<String>,
    unreadable: Option<String>,
}

fn evidence(path: &PathBuf) -> Evidence {
    let mut found = Evidence::default();
    // The evidence is in plan steps and memory deltas, never in token logits.
    let contents = match basecamp_trace::read_trace_without(path, &[basecamp_trace::RecordKind::TokenLogit]) {
        Ok(c) => c,
        Err(e) => {
            found.unreadable = Some(e.to_string());
            return found;
        }
    };
    let mut other_null = None;
    for record in &contents.records {
        match &record.body {
            Some(Body::MemoryDelta(delta)) if delta.after_json.as_deref() == Some("null") => {
                let source = pb::MemorySource::try_from(delta.source).unwrap_or(pb::MemorySource::Unspecified);
                let write = || (delta.key.clone(), source_name(source).to_string(), delta.origin.clone());
                match source {
                    pb::MemorySource::Fallback if found.null_write.is_none() => found.null_write = Some(write()),
                    pb::MemorySource::Initial | pb::MemorySource::Rollback | pb::MemorySource::Fallback => {}
                    _ if other_null.is_none() => other_null = Some(write()),
                    _ => {}
                }
            }
            Some(Body::ErrorContext(context)) => {
                found.first_error.get_or_insert_with(|| context.message.clone());
                found.last_error = Some(context.message.clone());
            }
            Some(Body::PlanStep(step)) => {
                if step.error_type == SERVICE_EXITED && found.service_exited.is_none() {
                    found.service_exited = Some(step.tool.clone());
                }
                if step.fallback_used {
                    let error = if step.error_type.is_empty() { "error".to_string() } else { step.error_type.clone() };
                    found.fallback_errors.entry(step.tool.clone()).or_default().push(error);
                }
            }
            _ => {}
        }
    }
    found.null_write = found.null_write.or(other_null);
    found
}

/// The most characters of an error message quoted in a hint.
const QUOTED_CHARS: usize = 300;

/// `message` on one line, at most [`QUOTED_CHARS`] characters.
fn shortened(message: &str) -> String {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(QUOTED_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

fn source_name(source: pb::MemorySource) -> &'static str {
    match source {
        pb::MemorySource::Fallback => "fallback",
        pb::MemorySource::Tool => "tool",
        pb::MemorySource::User => "user",
        pb::MemorySource::Policy => "policy",
        pb::MemorySource::SystemInjection => "injection",
        pb::MemorySource::Rollback => "rollback",
        pb::MemorySource::Initial => "initial memory",
        pb::MemorySource::Unspecified => "an unknown source",
    }
}

/// A cluster of the episodes of one failure class, in the first one's
/// words (`message`): a class alone ("policy_error") says nothing of what
/// to fix.
fn by_class(class: &str, message: Option<&str>, errors: Vec<String>) -> (String, String, Vec<String>) {
    let said = match message {
        Some(message) => format!(" (the first: {})", shortened(message)),
        None => String::new(),
    };
    (format!("class:{class}"), format!("the episode failed with `{class}`{said}"), errors)
}

/// Clusters `failed` episodes (with their trace paths), largest first.
pub fn root_causes(failed: &[(&EpisodeRow, PathBuf)]) -> Vec<RootCause> {
    struct Cluster {
        ids: Vec<String>,
        errors: BTreeMap<String, usize>,
        describe: String,
    }
    let mut clusters: BTreeMap<String, Cluster> = BTreeMap::new();
    for (episode, path) in failed {
        let found = evidence(path);
        let (key, describe, errors) = match (&found.unreadable, &found.null_write) {
            (Some(error), _) => {
                ("unreadable".to_string(), format!("the trace could not be read ({error})"), Vec::new())
            }
            (None, _) if found.service_exited.is_some() => {
                let tool = found.service_exited.as_deref().unwrap_or_default();
                (
                    format!("{SERVICE_EXITED}:{tool}"),
                    format!(
                        "a call to `{tool}` failed because a service it calls had exited (`{SERVICE_EXITED}`: the \
                         sandbox broke, not the agent)"
                    ),
                    Vec::new(),
                )
            }
            // The policy ended it: that, not a null written on the way, is why
            // (the episode measured the policy's server, not the agent).
            (None, _) if episode.failure_class == POLICY_ERROR => {
                by_class(&episode.failure_class, found.last_error.as_deref(), Vec::new())
            }
            (None, Some((key, source, origin))) => {
                let by = match source.as_str() {
                    "fallback" => format!("the fallback of `{origin}`"),
                    "tool" => format!("tool `{origin}`"),
                    other if origin.is_empty() => other.to_string(),
                    other => format!("{other} `{origin}`"),
                };
                let errors = found.fallback_errors.get(origin).cloned().unwrap_or_default();
                (format!("null:{key}:{source}:{origin}"), format!("`{key}` was set to null by {by}"), errors)
            }
            (None, None) => {
                let errors = found.fallback_errors.values().flatten().cloned().collect();
                by_class(&episode.failure_class, found.first_error.as_deref(), errors)
            }
        };
        let cluster =
            clusters.entry(key).or_insert_with(|| Cluster { ids: Vec::new(), errors: BTreeMap::new(), describe });
        cluster.ids.push(episode.id.clone());
        for error in errors {
            *cluster.errors.entry(error).or_default() += 1;
        }
    }
    let total = failed.len();
    let mut causes: Vec<RootCause> = clusters
        .into_iter()
        .map(|(key, c)| {
            let mut errors: Vec<(String, usize)> = c.errors.into_iter().collect();
            errors.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let after = if errors.is_empty() {
                String::new()
            } else {
                let list: Vec<String> = errors.iter().map(|(e, n)| format!("{e} x{n}")).collect();
                format!(" (after {})", list.join(", "))
            };
            RootCause {
                hint: format!("in {} of {total} failed episodes {}{after}", c.ids.len(), c.describe),
                episodes: c.ids.len(),
                of_failed: total,
                key,
                examples: c.ids.iter().take(5).cloned().collect(),
            }
        })
        .collect();
    causes.sort_by(|a, b| b.episodes.cmp(&a.episodes).then(a.key.cmp(&b.key)));
    causes
}
