//! `basecamp trace report PATHS --metric M [--cluster-by K] [-o FILE]`: one
//! self-contained HTML file (inline CSS, JS and SVG; nothing fetched) about
//! a set of traces: per task and variant, the root-cause hints, the per-step
//! timeline, the correlations of M with every other metric, the failed
//! episodes clustered by K, and every episode's trace view in the page.
//!
//! PATHS are trace files, directories (a `basecamp run` output), globs, or
//! `s3://BUCKET/PREFIX` (its traces and summaries are fetched into a
//! temporary directory first, deleted when the report is written; the
//! report names those traces by their `s3://` URLs).
//! Episode metrics come from the shard `summary.json` next to the traces
//! when there is one, else from what each trace holds (no
//! `tool_call_accuracy` then: without `--metric` the report is about
//! `reward`, and says so). An `-o` that is one of the input traces or
//! their shard summaries is refused.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use basecamp_sandbox::driver::SUMMARY_FILE;
use basecamp_trace::RecordKind;
use basecamp_trace::inputs::{TRACE_SUFFIX, default_jobs, expand_inputs};

use super::html::{Group, write};
use crate::serve::catalog::Catalog;
use crate::serve::insights::{ClusterBy, Loaded, compute, metric_names};
use crate::serve::mirror::TempMirror;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Trace files, directories (searched recursively) or glob patterns.
    #[arg(required = true)]
    pub paths: Vec<String>,
    /// The metric the report is about: correlations are computed against it
    /// [default: tool_call_accuracy, or reward for traces without a summary.json].
    #[arg(long)]
    pub metric: Option<String>,
    /// What failed episodes are clustered by.
    #[arg(long, value_enum, default_value_t = ClusterBy::MemoryState)]
    pub cluster_by: ClusterBy,
    /// The HTML file to write.
    #[arg(long, short, default_value = "trace_report.html", value_parser = crate::local_path)]
    pub output: PathBuf,
    /// Traces read and drawn at once [default: one per core].
    #[arg(long, short = 'j', value_parser = crate::at_least_one::<usize>)]
    pub jobs: Option<usize>,
}

/// Writes `path` through `fill`: into a temporary file beside it, renamed
/// over `path` once complete, so a failed report leaves the old file (or
/// none), never half a page. A path that is not a regular file
/// (`/dev/stdout`) is written in place.
fn write_whole(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>) -> std::io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut out = BufWriter::new(File::create(path)?);
        fill(&mut out)?;
        return out.flush();
    }
    let partial = super::partial_path(path);
    let written = File::create(&partial).and_then(|file| {
        let mut out = BufWriter::new(file);
        fill(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&partial, path)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Refuses an `-o` that is a file the report reads: one of the traces, or
/// a shard's `summary.json` beside them (replaced by the page, it would be
/// gone for the next report, `serve` and `ab`).
fn refuse_output_that_is_read(inputs: &[String], output: &Path) -> Result<()> {
    let Ok(output) = std::fs::canonicalize(output) else {
        // Not there yet: nothing reads it.
        return Ok(());
    };
    let traces = expand_inputs(inputs, TRACE_SUFFIX)?;
    let summaries = traces.iter().filter_map(|trace| Some(trace.parent()?.join(SUMMARY_FILE)));
    for read in traces.iter().cloned().chain(summaries) {
        if std::fs::canonicalize(&read).is_ok_and(|real| real == output) {
            let what = if read.ends_with(SUMMARY_FILE) { "shard summary, which it reads" } else { "input trace" };
            bail!("{}: the report would overwrite this {what}; choose another -o file", read.display());
        }
    }
    Ok(())
}

pub fn run(args: &ReportArgs) -> Result<ExitCode> {
    // The temporary copies are removed when `fetched` is dropped.
    let mut fetched = Vec::new();
    report(args, &mut fetched)
}

/// An `s3://` input's temporary local copy.
struct Fetched {
    copy: TempMirror,
}

impl Fetched {
    /// The object's URL when `path` lies in this copy.
    fn url_of(&self, path: &Path) -> Option<String> {
        let relative = path.strip_prefix(&self.copy.mirror.dir).ok()?;
        let relative: Vec<String> =
            relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        Some(self.copy.mirror.url_of(&relative.join("/")))
    }

    /// `text` (a message) with the copy's paths replaced by the objects' URLs.
    fn rename_in(&self, text: &str) -> String {
        let local = format!("{}/", self.copy.mirror.dir.display());
        text.replace(&local, &format!("{}/", self.copy.mirror.url().trim_end_matches('/')))
    }
}

/// Names what lies in the temporary copies by `s3://` URLs: the copies are
/// deleted once the report is written, the objects stay.
fn s3_names(fetched: &[Fetched], text: &str) -> String {
    fetched.iter().fold(text.to_string(), |text, copy| copy.rename_in(&text))
}

/// Mirrors an `s3://` input into a new temporary directory (recorded in `fetched`).
fn local_input(input: &str, fetched: &mut Vec<Fetched>) -> Result<String> {
    if !input.starts_with("s3://") {
        return Ok(input.to_string());
    }
    let copy = TempMirror::fetch(input, "report")?;
    let dir = copy.mirror.dir.display().to_string();
    fetched.push(Fetched { copy });
    Ok(dir)
}

fn report(args: &ReportArgs, fetched: &mut Vec<Fetched>) -> Result<ExitCode> {
    let inputs = args.paths.iter().map(|p| local_input(p, fetched)).collect::<Result<Vec<_>>>()?;
    refuse_output_that_is_read(&inputs, &args.output)?;
    let mut catalog = Catalog::from_inputs(&inputs)?;
    for entry in &mut catalog.episodes {
        if let Some(url) = fetched.iter().find_map(|copy| copy.url_of(&entry.trace)) {
            entry.relative = url;
        }
    }
    for problem in &mut catalog.problems {
        *problem = s3_names(fetched, problem);
    }
    if catalog.episodes.is_empty() {
        let why =
            if catalog.problems.is_empty() { String::new() } else { format!(": {}", catalog.problems.join("; ")) };
        bail!("no readable traces in {}{why}", args.paths.join(" "));
    }
    // Groups: one per task and variant, in order.
    let mut groups: BTreeMap<(String, String, String), Vec<&_>> = BTreeMap::new();
    for e in &catalog.episodes {
        groups.entry((e.namespace.clone(), e.task.clone(), e.variant.clone())).or_default().push(e);
    }
    let mut loaded_groups = Vec::new();
    for ((namespace, task, variant), mut entries) in groups {
        entries.sort_by(|a, b| a.id.cmp(&b.id));
        let loaded: Vec<Loaded<'_>> = entries.iter().map(|e| Loaded::load(e)).collect();
        loaded_groups.push((namespace, task, variant, entries, loaded));
    }
    // A damaged trace is in the report as far as it reads: said on stderr
    // and in the page, with the file and byte offset, since its metrics
    // (no reward, fewer steps) are those of the part read.
    let damaged: Vec<String> = loaded_groups
        .iter()
        .flat_map(|(_, _, _, _, loaded)| loaded.iter())
        .filter_map(|l| l.digest.as_ref().ok()?.damage.as_ref())
        .map(|damage| format!("{}; the report holds what was read before it", s3_names(fetched, damage)))
        .collect();
    // Why a metric may be missing: the damaged traces, each named.
    let damage_note = || if damaged.is_empty() { String::new() } else { format!(" (damaged: {})", damaged.join("; ")) };
    let known: std::collections::BTreeSet<String> =
        loaded_groups.iter().flat_map(|(_, _, _, _, loaded)| metric_names(loaded)).collect();
    let metric = match &args.metric {
        Some(metric) if !known.contains(metric) => bail!(
            "--metric {metric}: no episode has this metric; these do: {}{}",
            known.into_iter().collect::<Vec<_>>().join(", "),
            damage_note()
        ),
        Some(metric) => metric.clone(),
        None => match ["tool_call_accuracy", "reward"].into_iter().find(|m| known.contains(*m)) {
            Some("tool_call_accuracy") => "tool_call_accuracy".to_string(),
            Some(other) => {
                basecamp_sandbox::stderr_line!(
                    "note: no episode has tool_call_accuracy (it comes from the summary.json beside the traces); \
                     the report is about {other} (choose with --metric)"
                );
                other.to_string()
            }
            None => bail!(
                "no episode has tool_call_accuracy or reward; give --metric, one of: {}{}",
                known.into_iter().collect::<Vec<_>>().join(", "),
                damage_note()
            ),
        },
    };
    catalog.problems.extend(damaged.iter().cloned());
    let mut rendered = Vec::new();
    for (namespace, task, variant, entries, loaded) in &loaded_groups {
        let mut insights = compute(loaded, &metric, args.cluster_by);
        for unreadable in &mut insights.unreadable {
            *unreadable = s3_names(fetched, unreadable);
        }
        rendered.push(Group { namespace, task, variant, entries: entries.clone(), insights });
    }
    let jobs = args.jobs.unwrap_or_else(default_jobs);
    write_whole(&args.output, |out| {
        write(out, &rendered, &args.paths, &catalog.problems, jobs, |e, tokens| {
            basecamp_trace::read_trace_at_most(&e.trace, RecordKind::TokenLogit, tokens)
                .map_err(|e| s3_names(fetched, &e.to_string()))
        })
    })
    .with_context(|| format!("cannot write {}", args.output.display()))?;
    let episodes: usize = rendered.iter().map(|g| g.entries.len()).sum();
    let failed: usize = rendered.iter().map(|g| g.insights.failed).sum();
    // Written, not printed: a closed stdout (`| head -1`) is an error line, not a panic.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "wrote {}: {episodes} episodes ({failed} failed) in {} task variant(s), metric {metric}, failures clustered by {}",
        super::shown_path(&args.output),
        rendered.len(),
        args.cluster_by.name()
    )?;
    for g in &rendered {
        for hint in g.insights.hints.iter().take(3) {
            let line = format!("{}/{}: {}", g.task, g.variant, hint);
            writeln!(out, "  {}", super::one_line(&line))?;
        }
    }
    for problem in &catalog.problems {
        // The problems name files: one whose name holds a newline is quoted.
        basecamp_sandbox::stderr_line!("warning: {}", super::one_line(problem));
    }
    // As every trace tool does: a trace that could not be read, or only in
    // part, fails the command (the report is written without it, or with
    // what was read).
    if catalog.unreadable > 0 {
        basecamp_sandbox::stderr_line!(
            "error: {} trace(s) could not be read and are not in the report",
            catalog.unreadable
        );
    }
    if !damaged.is_empty() {
        basecamp_sandbox::stderr_line!(
            "error: {} trace(s) are damaged; the report holds what was read of them",
            damaged.len()
        );
    }
    Ok(if catalog.unreadable > 0 || !damaged.is_empty() { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
