//! `basecamp trace ...`: the trace tools.

mod analyze;
mod archive;
mod cleanup;
mod export;
mod html;
pub mod parse;
mod redact;
mod report;
mod search;
pub(crate) mod sources;
mod validate;

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Print a whole trace (header, every record, how the file ended).
    Parse(parse::ParseArgs),
    /// Top-k log-probabilities, entropy and KL(A || B) per token from raw logits (safetensors).
    Analyze(analyze::AnalyzeArgs),
    /// Re-execute an episode with its recorded policy outputs and tool responses; report
    /// "identical" or the first divergence (step, field, recorded vs replayed).
    Replay(crate::replay::ReplayArgs),
    /// One self-contained HTML report: per-step timeline, metric correlations, failure clusters, root-cause hints.
    Report(report::ReportArgs),
    /// Find the steps of many traces that match a query, e.g. 'memory_state.shipping_status == null'.
    Search(search::SearchArgs),
    /// Check traces: schema, steps in order and ended, statuses, hashes, the memory hash chain, reward sums.
    Validate(validate::ValidateArgs),
    /// Copy traces with PII fields and patterns replaced by salted hashes, still valid traces.
    Redact(redact::RedactArgs),
    /// Pack traces into FILE.tar.zst with an index; `archive list FILE`, `archive extract FILE EPISODE -o DIR`.
    Archive(archive::ArchiveArgs),
    /// Delete traces older than an age (a dry run unless --delete); never checkpoints or summaries.
    Cleanup(cleanup::CleanupArgs),
    /// Export traces as OpenTelemetry GenAI spans (OTLP/JSON lines): --otlp.
    Export(export::ExportArgs),
}

pub fn run(cmd: TraceCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TraceCommand::Parse(args) => parse::run(&args),
        TraceCommand::Analyze(args) => analyze::run(&args),
        TraceCommand::Replay(args) => crate::replay::run(args),
        TraceCommand::Report(args) => report::run(&args),
        TraceCommand::Search(args) => search::run(&args),
        TraceCommand::Validate(args) => validate::run(&args),
        TraceCommand::Redact(args) => redact::run(&args),
        TraceCommand::Archive(args) => archive::run(&args),
        TraceCommand::Cleanup(args) => cleanup::run(&args),
        TraceCommand::Export(args) => export::run(&args),
    }
}

/// `text` as it goes on one line of plain output: as it is, or, when it
/// holds a control character (a newline in a file name would start a line
/// that looks like another match or finding; an ESC would reach the
/// terminal), quoted with Rust's escapes (`"a\nb"`).
pub(crate) fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(char::is_control) { format!("{text:?}").into() } else { text.into() }
}

/// [`one_line`] of a path as it is displayed.
pub(crate) fn shown_path(path: &std::path::Path) -> String {
    one_line(&path.display().to_string()).into_owned()
}

/// How plain output names a source: [`one_line`] of its name, or, for a
/// local file whose name is not UTF-8, the path quoted with its bytes
/// escaped (`"ep-\xFF.trace"`), so two such files are told apart and the
/// name can be typed back.
pub(crate) fn shown_name(source: &sources::Source) -> std::borrow::Cow<'_, str> {
    match source.local_path() {
        Some(path) if path.to_str().is_none() => format!("{path:?}").into(),
        _ => one_line(&source.name),
    }
}

/// `FILE.partial` next to `FILE`, where an output is written before it is
/// renamed into place: the whole name and a suffix, since `with_extension`
/// would give `a.tar.zst` and `a.tar.gz` (or traces named `ep.b1` and
/// `ep.b2`) one temporary file.
pub(crate) fn partial_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}
