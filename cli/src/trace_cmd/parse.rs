//! `basecamp trace parse FILE --output json|html`; FILE may be one
//! `s3://BUCKET/KEY.trace` object. Several paths, a directory, a glob or an
//! `s3://` prefix print JSON Lines instead: one trace's document per line,
//! in path order (`basecamp trace parse runs/ | jq ...`).
//!
//! The HTML is `basecamp serve`'s episode page ([`crate::serve::episode`]),
//! self-contained: it needs no server and fetches nothing. Its metrics come
//! from the shard's `summary.json` beside the trace (beside the object, for
//! one on S3) when that names it, else from the trace.
//!
//! A damaged file still prints what could be recovered (a crashed pod's
//! trace is still evidence), then one line naming the file and byte offset
//! on stderr, and exits 1 unless `--allow-truncated` accepts a clean
//! truncation. A trace that reads to its trailer without an episode end
//! is not `"complete"` either (the reader's `NoEpisodeEnd` damage), and
//! exits 1 with one line.

use std::io::{self, Write};
use std::ops::ControlFlow;
use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use basecamp_sandbox::driver::SUMMARY_FILE;
use basecamp_trace::inputs::{TRACE_SUFFIX, default_jobs, for_each_ordered};
use basecamp_trace::json::{TraceEnding, WriteJsonError, write_trace_json};
use basecamp_trace::{RecordKind, TraceContents, TraceError};
use clap::{Args, ValueEnum};

use super::sources::{Source, Sources};
use crate::serve::catalog::{self, ShardIndex};
use crate::serve::episode;

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    /// The proto3 JSON mapping of every record.
    Json,
    /// One self-contained HTML page, `basecamp serve`'s episode view: timeline,
    /// steps with memory deltas, policy turns and token logits (top-k), rewards, errors.
    Html,
}

#[derive(Args)]
pub struct ParseArgs {
    /// The .trace file, or one s3://BUCKET/KEY.trace object (one JSON document);
    /// or several, directories (searched recursively), globs and s3://BUCKET/PREFIX
    /// (JSON Lines: one trace per line).
    #[arg(required = true)]
    paths: Vec<std::ffi::OsString>,
    #[arg(long, short, value_enum, default_value = "json")]
    output: OutputFormat,
    /// Exit 0 for a trace whose writer was killed (a clean truncation).
    #[arg(long)]
    allow_truncated: bool,
    /// Worker threads for several traces (default: one per core).
    #[arg(long, short = 'j', value_parser = crate::at_least_one::<usize>)]
    jobs: Option<usize>,
}

pub fn run(args: &ParseArgs) -> anyhow::Result<ExitCode> {
    match args.paths.as_slice() {
        [one] if is_one_trace(one) => parse_one(args, Path::new(one)),
        _ => parse_many(args),
    }
}

/// A path that names one trace: a file, or an `s3://` object key ending in
/// `.trace`; not a directory, a glob or a prefix.
fn is_one_trace(path: &std::ffi::OsStr) -> bool {
    let text = path.to_string_lossy();
    if text.starts_with("s3://") {
        return text.ends_with(TRACE_SUFFIX);
    }
    let file = Path::new(path);
    // A glob names many, unless a file has that very name.
    !file.is_dir() && (file.exists() || !text.contains(['*', '?', '[']))
}

fn parse_one(args: &ParseArgs, file: &Path) -> anyhow::Result<ExitCode> {
    let sources = Sources::one(file)?;
    let name = file.display().to_string();
    let ending = match args.output {
        OutputFormat::Json => {
            // Buffered: stdout alone is line-buffered, one write(2) per
            // line of the pretty JSON (12 million for a 2,000-step trace).
            let mut out = io::BufWriter::new(io::stdout().lock());
            let ending = write_trace_json(sources.reopener(&sources.items[0])?, &name, &mut out, true)?;
            writeln!(out)?;
            out.flush()?;
            ending
        }
        OutputFormat::Html => {
            let reader = sources.open(&sources.items[0])?;
            // The view decodes only the token logits it draws.
            let cap = episode::PAGE_TOKEN_CAP;
            let (trace, undrawn) = reader.at_most(RecordKind::TokenLogit, cap).into_contents_and_left_out();
            let summary = match sources.read_beside(&sources.items[0], SUMMARY_FILE) {
                Ok(found) => found.map(|(name, text)| ShardIndex::parse(&text, &name)).transpose(),
                Err(e) => Err(format!("{e:#}; metrics read from the trace")),
            };
            let summary = summary.unwrap_or_else(|problem| {
                basecamp_sandbox::stderr_line!("warning: {problem}");
                None
            });
            let entry = catalog::lone_entry(file, &trace, summary.as_ref());
            let view = episode::render(&entry, &trace, &undrawn, cap, None);
            io::stdout().lock().write_all(episode::page(&entry, "", &view).as_bytes())?;
            TraceEnding { damage: trace.damage().cloned() }
        }
    };
    let failed = report_ending(&ending, args.allow_truncated);
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Says on stderr how a damaged or unended trace ended; true when that is
/// a failure (not a clean truncation that `--allow-truncated` accepts).
fn report_ending(ending: &TraceEnding, allow_truncated: bool) -> bool {
    match &ending.damage {
        None => false,
        Some(damage @ TraceError::Truncated { .. }) if allow_truncated => {
            basecamp_sandbox::stderr_line!("warning: {damage}");
            false
        }
        Some(damage) => {
            basecamp_sandbox::stderr_line!("error: {damage}");
            true
        }
    }
}

/// Every trace the paths name, as JSON Lines on stdout, in order; a damaged
/// trace prints what could be recovered and its error line, one that
/// cannot be read only its error line, and both make the exit status 1.
fn parse_many(args: &ParseArgs) -> anyhow::Result<ExitCode> {
    if matches!(args.output, OutputFormat::Html) {
        bail!(
            "--output html draws one trace; give one FILE, or use `basecamp trace report {}` for many",
            args.paths.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join(" ")
        );
    }
    let sources = Sources::resolve(&args.paths)?;
    // A trace's line and how it ended; Err: it could not be read (or changed
    // while it was read).
    let parse = |source: &Source| -> Result<(Vec<u8>, TraceEnding), WriteJsonError> {
        let mut doc = Vec::new();
        let ending = write_trace_json(sources.reopener(source)?, &source.name, &mut doc, false)?;
        Ok((doc, ending))
    };
    let mut out = io::BufWriter::new(io::stdout().lock());
    let (mut failed, mut write_error) = (false, None);
    for_each_ordered(&sources.items, args.jobs.unwrap_or_else(default_jobs), parse, |_, parsed| {
        let written = match parsed {
            Ok((doc, ending)) => {
                failed |= report_ending(&ending, args.allow_truncated);
                out.write_all(&doc).and_then(|()| out.write_all(b"\n"))
            }
            Err(unreadable) => {
                // Nothing read is a failure even when --allow-truncated accepts a cut.
                basecamp_sandbox::stderr_line!("error: {unreadable}");
                failed = true;
                Ok(())
            }
        };
        match written {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                // The rest is neither read nor printed.
                write_error = Some(e);
                ControlFlow::Break(())
            }
        }
    });
    if let Some(e) = write_error.map_or_else(|| out.flush().err(), Some) {
        return Err(e.into());
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// One whole trace: a local file, or one `s3://BUCKET/KEY.trace` object
/// fetched with the trace commands' S3 client (`AWS_ENDPOINT_URL_S3`, the
/// standard credential chain, retries). A damaged trace is a value
/// ([`TraceContents::damage`]); only one that cannot be opened is an error.
pub fn read_one(file: &Path) -> anyhow::Result<TraceContents> {
    let sources = Sources::one(file)?;
    Ok(sources.open(&sources.items[0])?.into_contents())
}
