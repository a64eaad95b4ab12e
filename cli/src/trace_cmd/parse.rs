//! `basecamp trace parse FILE --output json|html`; FILE may be one
//! `s3://BUCKET/KEY.trace` object.
//!
//! A damaged file still prints what could be recovered (a crashed pod's
//! trace is still evidence), then one line naming the file and byte offset
//! on stderr, and exits 1 unless `--allow-truncated` accepts a clean
//! truncation.

use std::io::{self, Cursor, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use basecamp_trace::inputs::TRACE_SUFFIX;
use basecamp_trace::{TraceContents, TraceError, json::trace_to_json, read_trace, read_trace_from};
use clap::{Args, ValueEnum};

use super::sources::Sources;

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    /// The proto3 JSON mapping of every record.
    Json,
    /// One self-contained HTML page: step timeline, memory deltas, rewards, errors, tokens.
    Html,
}

#[derive(Args)]
pub struct ParseArgs {
    /// The .trace file, or one s3://BUCKET/KEY.trace object.
    file: PathBuf,
    #[arg(long, short, value_enum, default_value = "json")]
    output: OutputFormat,
    /// Exit 0 for a trace whose writer was killed (a clean truncation).
    #[arg(long)]
    allow_truncated: bool,
}

pub fn run(args: &ParseArgs) -> anyhow::Result<ExitCode> {
    let trace = read_one(&args.file)?;
    let name = args.file.display().to_string();
    match args.output {
        OutputFormat::Json => {
            let doc = trace_to_json(&name, &trace);
            let mut out = io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &doc)?;
            writeln!(out)?;
        }
        OutputFormat::Html => {
            io::stdout().lock().write_all(basecamp_trace::html::trace_to_html(&name, &trace).as_bytes())?;
        }
    }
    Ok(match trace.damage() {
        None => ExitCode::SUCCESS,
        Some(TraceError::Truncated { .. }) if args.allow_truncated => {
            eprintln!("warning: {}", trace.damage().expect("matched Some"));
            ExitCode::SUCCESS
        }
        Some(damage) => {
            eprintln!("error: {damage}");
            ExitCode::FAILURE
        }
    })
}

/// One whole trace: a local file, or one `s3://BUCKET/KEY.trace` object
/// fetched with the trace commands' S3 client (`AWS_ENDPOINT_URL_S3`, the
/// standard credential chain, retries). A damaged trace is a value
/// ([`TraceContents::damage`]); only one that cannot be opened is an error.
pub fn read_one(file: &Path) -> anyhow::Result<TraceContents> {
    let Some(url) = file.to_str().filter(|f| f.starts_with("s3://")) else {
        return Ok(read_trace(file)?);
    };
    if !url.ends_with(TRACE_SUFFIX) {
        bail!(
            "{url}: give one trace object, s3://BUCKET/KEY{TRACE_SUFFIX} (trace search, validate and report take a prefix)"
        );
    }
    let sources = Sources::resolve(&[url.to_string()])?;
    let bytes = sources.read_bytes(&sources.items[0])?;
    Ok(read_trace_from(Cursor::new(bytes), url)?)
}
