//! `basecamp trace search QUERY PATHS... [--json]`: the steps of many traces
//! that match a query (the language of `basecamp_trace::query`).
//!
//! Files are searched in parallel (one file per task, `--jobs` threads) and
//! printed in input order; each file is streamed, so a directory of any size
//! needs the memory of a few traces. A damaged or unreadable file prints the
//! matches before the damage, then one line naming the file and byte offset
//! on stderr; the exit status is then 1. A memory key or reward component
//! the query names that no searched trace has gets a warning on stderr
//! listing the ones they have (a typo otherwise looks like "no matches").

use std::io::{self, Write};
use std::ops::ControlFlow;
use std::process::ExitCode;

use basecamp_trace::inputs::{default_jobs, for_each_ordered};
use basecamp_trace::query::{FileMatches, NamesSeen, Query};
use clap::Args;
use serde_json::json;

use super::sources::Sources;
use super::{one_line, shown_name};

/// The query language, shown by `basecamp trace search --help`.
pub const QUERY_HELP: &str = "\
QUERY is evaluated once per step of each episode; a matching step prints
FILE:OFFSET: episode ID step N (SECTION), OFFSET being the byte offset of the
frame holding the record that matched.

  memory_state.shipping_status == null
  plan_execution.tool == \"tracking_api\" and latency_ms > 800
  exists(error_context) and not plan_execution.status == \"ok\"
  reward_signal.efficiency_penalty < -0.1 or (step >= 40 and episode.variant == \"b\")
  episode_end.failure_class == \"policy_error\"

Operators ==, !=, <, <=, >, >=; literals \"string\", 12.5, true, false, null;
and/&&, or/||, not/!, parentheses. exists(PATH) holds when a record of the
step has PATH (scalar fields: a non-default value; token_logit.entropy and kl:
recorded, 0 included; JSON paths: present, 0, \"\", false and null included);
exists(SECTION) when the step has a record of that section;
exists(memory_state.KEY) when the step changed KEY (a removal included).

Conditions on the same section (for memory_state: the same key) are checked
against one record at a time: `tool == \"a\" and latency_ms > 800` needs one
call that is both. Conditions on different sections, and exists(), combine
per step.

Paths:
  memory_state.KEY[.a.b]   the JSON value a MemoryDelta wrote to KEY (a removal has none)
  plan_execution.FIELD     a PlanStep field (a bare FIELD means this section): tool, status
                           (ok|error|timeout|fallback|rolled_back|refused), kind, latency_ms,
                           latency_us, timeout_ms, error_type, error_message, fallback_used,
                           arguments[.path], observation[.path], plan_label, call_id, index,
                           response_bytes, input_hash, result_hash, memory_hash_before|after
  reward_signal.NAME       component NAME's raw score (.score, .weight); reward_signal.weighted_sum
  error_context.FIELD      error_type, message, stack, cause (any entry), tool (any last payload),
                           memory.KEY[.path] (the snapshot's value)
  token_logit.FIELD        position, token_id, token, logprob; entropy and kl (nats) on tokens
                           derived from a policy's raw logits
  policy_turn.FIELD        model, content, tool_calls[.path], finish_reason, latency_ms,
                           prompt_tokens, completion_tokens, logprobs_missing
  injection.FIELD          id, trigger, observation[.path], description
  episode_end.FIELD        how the episode ended, matched at its last step: outcome
                           (completed|max_steps|error|cancelled), failure_class (ok,
                           wrong_tool_calls, memory_mismatch, timeout, ..., policy_error,
                           service_exited), final_answer, steps, final_memory_hash,
                           end_time_unix_nanos
  episode.FIELD            id, task, variant, namespace, shard, shard_count, training_step,
                           config_hash (a hash)
  step                     the step number

Quote a path segment with other characters: memory_state.\"user.phone\".
Strings take the escapes \\\" \\' \\\\ \\n \\t \\r and \\u with four hex digits (\\u00e9; a
character beyond U+FFFF as a surrogate pair, as in JSON, or typed as itself). Hashes compare as hex, or as
the base64 `basecamp trace parse` prints; a hex prefix of 8 or more digits (the 12 that `trace validate` and
the reports print) matches every hash that starts with it, with == and != only.

A memory_state.KEY or reward_signal.NAME that no searched trace has is
reported on stderr as a warning listing the names they do have (a misspelt
key otherwise matches nothing, as silently as a value nobody wrote); the
exit status is unchanged.";

#[derive(Args)]
#[command(after_long_help = QUERY_HELP)]
pub struct SearchArgs {
    /// The query, e.g. 'plan_execution.tool == "tracking_api" and latency_ms > 800' (see --help).
    query: String,
    /// Trace files, directories (searched recursively for *.trace), glob patterns, or s3://BUCKET/PREFIX.
    #[arg(required = true)]
    paths: Vec<std::ffi::OsString>,
    /// Print one JSON object per match (JSON Lines): file, offset, episode, step, section.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', value_parser = crate::at_least_one::<usize>)]
    jobs: Option<usize>,
}

pub fn run(args: &SearchArgs) -> anyhow::Result<ExitCode> {
    let query = Query::parse(&args.query)?;
    let sources = Sources::resolve(&args.paths)?;
    let files = &sources.items;
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut failed = 0usize;
    let mut write_error: Option<io::Error> = None;
    let mut seen = NamesSeen::default();
    for_each_ordered(
        files,
        args.jobs.unwrap_or_else(default_jobs),
        |source| query.search_opened(sources.open(source)),
        // A failed write ends the walk: no further trace is read (or fetched).
        |i, found: FileMatches| {
            seen.merge(found.seen);
            let file = &files[i].name;
            for m in &found.matches {
                let section = m.section.map_or("step", |s| s.name());
                let written = if args.json {
                    let line = json!({"file": file, "offset": m.offset, "episode": m.episode, "step": m.step, "section": section});
                    writeln!(out, "{line}")
                } else {
                    writeln!(
                        out,
                        "{}:{}: episode {} step {} ({section})",
                        shown_name(&files[i]),
                        m.offset,
                        one_line(&m.episode),
                        m.step
                    )
                };
                if let Err(e) = written {
                    write_error = Some(e);
                    return ControlFlow::Break(());
                }
            }
            if let Some(e) = found.error {
                let _ = out.flush();
                basecamp_sandbox::stderr_line!("error: {e}");
                failed += 1;
            }
            ControlFlow::Continue(())
        },
    );
    // The last lines are written by this flush (all of them when they fit the buffer).
    let flushed = write_error.map_or_else(|| out.flush(), Err);
    if flushed.is_ok() {
        // A damaged trace was read only up to its damage: a name may be in what was not.
        let unread = match failed {
            0 => String::new(),
            1 => " (in what could be read: 1 trace was read only up to its damage, or not at all)".to_string(),
            n => format!(" (in what could be read: {n} traces were read only up to their damage, or not at all)"),
        };
        for line in query.unseen_names(&seen) {
            basecamp_sandbox::stderr_line!("warning: {line}{unread}");
        }
    }
    match flushed {
        // A closed pipe (`| head`) is not an error of the search.
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write the matches to stdout"))
        }
        _ => Ok(if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }),
    }
}
