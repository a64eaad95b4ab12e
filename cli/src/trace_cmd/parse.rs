//! `basecamp trace parse FILE --output json|html`.
//!
//! A damaged file still prints what could be recovered (a crashed pod's
//! trace is still evidence), then one line naming the file and byte offset
//! on stderr, and exits 1 unless `--allow-truncated` accepts a clean
//! truncation.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use basecamp_trace::{TraceError, json::trace_to_json, read_trace};
use clap::{Args, ValueEnum};

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    /// The proto3 JSON mapping of every record.
    Json,
    /// One self-contained HTML page: step timeline, memory deltas, rewards, errors, tokens.
    Html,
}

#[derive(Args)]
pub struct ParseArgs {
    /// The .trace file.
    file: PathBuf,
    #[arg(long, short, value_enum, default_value = "json")]
    output: OutputFormat,
    /// Exit 0 for a trace whose writer was killed (a clean truncation).
    #[arg(long)]
    allow_truncated: bool,
}

pub fn run(args: &ParseArgs) -> anyhow::Result<ExitCode> {
    let trace = read_trace(&args.file)?;
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
