//! `basecamp trace export --otlp PATHS... [-o FILE]`: traces as OpenTelemetry
//! GenAI spans (`basecamp_trace::otlp`), one OTLP/JSON
//! `ExportTraceServiceRequest` per trace per line — the OTLP file
//! exporter's format, which collectors (`otlpjsonfile` receiver) read.
//! A damaged trace is exported as far as it reads, with one error line.
//! `-o FILE` is written as `FILE.partial` and renamed when every trace is
//! exported; it may not be one of the inputs, and when no trace could be
//! read at all it is not written.

use std::io::{self, BufWriter, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use basecamp_trace::inputs::{default_jobs, for_each_ordered};
use basecamp_trace::otlp::export_request;
use clap::Args;

use super::sources::{Source, Sources};

#[derive(Args)]
pub struct ExportArgs {
    /// Export as OTLP/JSON (OpenTelemetry GenAI spans); the only format so far.
    #[arg(long)]
    otlp: bool,
    /// Trace files, directories (searched recursively for *.trace), glob patterns, or s3://BUCKET/PREFIX.
    #[arg(required = true)]
    paths: Vec<std::ffi::OsString>,
    /// Write to this file instead of stdout (written as FILE.partial and renamed when complete).
    #[arg(long, short = 'o', value_name = "FILE", value_parser = crate::local_path)]
    out: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', value_parser = crate::at_least_one::<usize>)]
    jobs: Option<usize>,
}

pub fn run(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    if !args.otlp {
        bail!("choose a format: --otlp (OpenTelemetry GenAI spans as OTLP/JSON)");
    }
    let sources = Sources::resolve(&args.paths)?;
    let files = &sources.items;
    // -o is written under a temporary name and renamed when complete, so an
    // interrupted export leaves no file that looks finished.
    let target = match &args.out {
        Some(path) => Some(sources.create_output(path, "the file to write", "spans.jsonl")?),
        None => None,
    };
    let mut out: Box<dyn Write> = match &target {
        Some(output) => Box::new(BufWriter::new(output)),
        None => Box::new(BufWriter::new(io::stdout().lock())),
    };
    let (mut failed, mut exported) = (false, 0usize);
    let mut write_error = None;
    let convert = |source: &Source| match sources.open(source) {
        Ok(reader) => {
            let (request, damage) = export_request(reader);
            (Some(serde_json::to_string(&request).expect("an OTLP request always serializes")), damage)
        }
        Err(e) => (None, Some(e)),
    };
    for_each_ordered(files, args.jobs.unwrap_or_else(default_jobs), convert, |_, (line, damage)| {
        exported += usize::from(line.is_some());
        let written = line.map_or(Ok(()), |line| writeln!(out, "{line}"));
        if let Some(e) = damage {
            failed = true;
            basecamp_sandbox::stderr_line!("error: {e}");
        }
        match written {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                // The rest is neither read nor converted.
                write_error = Some(e);
                ControlFlow::Break(())
            }
        }
    });
    let written = match write_error {
        Some(e) => Err(e),
        None => out.flush(),
    };
    drop(out);
    let name = args.out.as_ref().map_or_else(|| "the export".to_string(), |p| p.display().to_string());
    if let Err(e) = written {
        if let Some(output) = target {
            output.discard();
        }
        return Err(e).with_context(|| format!("cannot write {name}"));
    }
    if let Some(output) = target {
        // Not one trace could be read (each is named above): an existing
        // FILE is left as it was rather than replaced by an empty one.
        if exported == 0 && failed {
            output.discard();
            bail!("no trace could be exported (each is named above); {name} was not written");
        }
        output.commit()?;
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
