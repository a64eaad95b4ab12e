//! `basecamp trace validate PATHS...`: checks every promise of each trace
//! (`basecamp_trace::validate`: schema, steps, statuses, hashes, the memory
//! hash chain, reward sums) and prints one line per finding, naming the
//! file and the step. Exit status 1 when anything is found.

use std::io::{self, Write};
use std::ops::ControlFlow;
use std::process::ExitCode;

use basecamp_trace::inputs::{default_jobs, for_each_ordered};
use basecamp_trace::validate::{Finding, validate_opened};
use clap::Args;
use serde_json::json;

use super::shown_name;
use super::sources::Sources;

#[derive(Args)]
pub struct ValidateArgs {
    /// Trace files, directories (searched recursively for *.trace), glob patterns, or s3://BUCKET/PREFIX.
    #[arg(required = true)]
    paths: Vec<std::ffi::OsString>,
    /// Print one JSON object per finding (JSON Lines): file, step, check, message.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', value_parser = crate::at_least_one::<usize>)]
    jobs: Option<usize>,
}

pub fn run(args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let sources = Sources::resolve(&args.paths)?;
    let files = &sources.items;
    let mut out = io::BufWriter::new(io::stdout().lock());
    let (mut findings, mut bad_files) = (0usize, 0usize);
    let mut result = Ok(());
    for_each_ordered(
        files,
        args.jobs.unwrap_or_else(default_jobs),
        |source| validate_opened(&source.name, sources.open(source)),
        |i, found| {
            if found.is_empty() {
                return ControlFlow::Continue(());
            }
            bad_files += 1;
            findings += found.len();
            for f in &found {
                let written = if args.json {
                    writeln!(out, "{}", json!({"file": f.file, "step": f.step, "check": f.check, "message": f.message}))
                } else {
                    // A newline in a file name would split the finding over two lines.
                    writeln!(out, "{}", Finding { file: shown_name(&files[i]).into_owned(), ..f.clone() })
                };
                if let Err(e) = written {
                    // The rest is not validated.
                    result = Err(e);
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        },
    );
    result?;
    out.flush()?;
    if findings == 0 {
        basecamp_sandbox::stderr_line!("{} traces checked: all valid", files.len());
        Ok(ExitCode::SUCCESS)
    } else {
        basecamp_sandbox::stderr_line!("{} traces checked: {findings} findings in {bad_files} traces", files.len());
        Ok(ExitCode::FAILURE)
    }
}
