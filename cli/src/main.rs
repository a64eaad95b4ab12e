//! `basecamp`: run harness tasks locally and work with execution traces.
//!
//! Each subcommand lives in its own module; `main` only parses arguments,
//! dispatches, and turns an error into one line on stderr and exit status 1
//! — except a write to a stdout whose reader is gone (`| head`), which ends
//! the command quietly with status 0, as it ends `cat`, `grep` or `jq`.

// clap makes the arguments' doc comments the `--help` text, where
// `./basecamp-runs/<task>/` is meant as written, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

mod ab;
mod data;
mod harness;
mod replay;
mod run;
mod sandbox_cmd;
mod serve;
mod trace_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "basecamp",
    version,
    about = "Agent-training base camp: harness tasks, sandboxes and execution traces"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a HarnessTask on this machine (no cluster): every variant and
    /// shard, traces to ./basecamp-runs/<task>/, a summary table and report.html.
    Run(run::RunArgs),
    /// Validate HarnessTask/SandboxConfig manifests; convert the JSON harness form.
    #[command(subcommand)]
    Harness(harness::HarnessCommand),
    /// Compare two runs (or the two variants of one run).
    #[command(subcommand)]
    Ab(ab::AbCommand),
    /// Training data from traces: `data preprocess` into (state, action, reward) batches.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Read and inspect .trace files.
    #[command(subcommand)]
    Trace(trace_cmd::TraceCommand),
    /// Talk to a running sandbox: inject an observation into an episode.
    #[command(subcommand)]
    Sandbox(sandbox_cmd::SandboxCommand),
    /// Serve the reports and traces of a run directory, read-only, at stable URLs (Grafana links here).
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Harness(cmd) => harness::run(cmd),
        Command::Ab(cmd) => ab::run(cmd),
        Command::Data(cmd) => data::run(cmd),
        Command::Trace(cmd) => trace_cmd::run(cmd),
        Command::Sandbox(cmd) => sandbox_cmd::run(cmd),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            basecamp_sandbox::stderr_line!("error: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// Whether `error` is a broken pipe met writing to stdout: an I/O error of
/// that kind in its chain while stdout's reader has gone (a pipe's write end
/// then polls as an error). A broken pipe to anything else, e.g. a
/// preprocessor that died, stays an error.
fn is_closed_stdout(error: &anyhow::Error) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let broken_pipe = error.chain().any(|cause| {
        let kind = match cause.downcast_ref::<std::io::Error>() {
            Some(e) => Some(e.kind()),
            // serde_json's error does not name its I/O error as a cause.
            None => cause.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind),
        };
        kind == Some(std::io::ErrorKind::BrokenPipe)
    });
    if !broken_pipe {
        return false;
    }
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLOUT)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1))
        && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLERR))
}

/// The error and its causes joined by ": ", leaving out a cause whose text
/// the message before it already ends with (library errors often say
/// `cannot start "python3": {source}` and also name `source` as their cause).
fn report(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let said = cause.to_string();
        if text.ends_with(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

/// A count of at least 1 (`--jobs`, `--concurrency`, `--batch-size`, ...).
/// clap's ranged parser would answer `0 is not in 1..18446744073709551615`.
pub(crate) fn at_least_one<T: TryFrom<u64>>(arg: &str) -> Result<T, String> {
    let n: u64 = arg.trim().parse().map_err(|_| "not a whole number".to_string())?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    T::try_from(n).map_err(|_| format!("{n} is too large"))
}

/// A count that may be 0: a negative number is refused as one (clap would
/// otherwise read `-1` as an unknown flag).
pub(crate) fn count<T: TryFrom<u64>>(arg: &str) -> Result<T, String> {
    let arg = arg.trim();
    if arg.starts_with('-') && arg[1..].parse::<u64>().is_ok() {
        return Err("must be 0 or more".into());
    }
    let n: u64 = arg.parse().map_err(|_| "not a whole number".to_string())?;
    T::try_from(n).map_err(|_| format!("{n} is too large"))
}

/// An output that is written on this machine only (`-o` of redact,
/// archive, extract, export, report): a URL such as `s3://b/x` is refused,
/// not created as a local directory `s3:/b/x` while the command reports
/// writing to S3.
pub(crate) fn local_path(arg: &str) -> Result<std::path::PathBuf, String> {
    match arg.split_once("://") {
        Some((scheme, _)) if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric()) => Err(format!(
            "{arg:?} is a URL; this command writes a local path only (copy to {scheme}:// afterwards, e.g. `aws s3 cp`)"
        )),
        _ => Ok(arg.into()),
    }
}

/// Refuses an output directory (`--out DIR`) that a file stands in the way
/// of: the path itself or one above it (`cannot create out: File exists`
/// and `Not a directory` said neither which path nor why).
pub(crate) fn check_out_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    let in_the_way = dir.ancestors().find(|p| !p.as_os_str().is_empty() && p.exists() && !p.is_dir());
    match in_the_way {
        Some(file) if file == dir => {
            anyhow::bail!("{} is a file; the output goes into a directory (created if missing)", dir.display())
        }
        Some(file) => anyhow::bail!(
            "cannot make the directory {}: {} is a file; the output goes into a directory (created if missing)",
            dir.display(),
            file.display()
        ),
        None => Ok(()),
    }
}

/// Creates the output directory `dir` and its parents ([`check_out_dir`] first).
pub(crate) fn create_out_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    check_out_dir(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create the directory {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_directory_with_a_file_in_its_way_is_refused_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("afile");
        std::fs::write(&file, "x").unwrap();
        let said = create_out_dir(&file).unwrap_err().to_string();
        assert_eq!(
            said,
            format!("{} is a file; the output goes into a directory (created if missing)", file.display())
        );
        let below = file.join("sub/dir");
        let said = create_out_dir(&below).unwrap_err().to_string();
        assert!(
            said.starts_with(&format!("cannot make the directory {}: {} is a file", below.display(), file.display())),
            "{said}"
        );
        let fresh = tmp.path().join("new/out");
        create_out_dir(&fresh).unwrap();
        assert!(fresh.is_dir());
        create_out_dir(&fresh).expect("an existing directory is fine");
    }

    #[test]
    fn a_count_is_a_whole_number_of_at_least_one() {
        assert_eq!(at_least_one::<usize>("8"), Ok(8));
        assert_eq!(at_least_one::<usize>("0"), Err("must be at least 1".to_string()));
        assert_eq!(at_least_one::<usize>("-1"), Err("not a whole number".to_string()));
        assert_eq!(at_least_one::<u32>("5000000000"), Err("5000000000 is too large".to_string()));
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        #[derive(Debug)]
        struct Spawn(std::io::Error);
        impl std::fmt::Display for Spawn {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot start \"python3\": {}", self.0)
            }
        }
        impl std::error::Error for Spawn {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = anyhow::Error::new(Spawn(io)).context("variant a");
        assert_eq!(report(&error), "variant a: cannot start \"python3\": No such file or directory (os error 2)");
        let chained = anyhow::anyhow!("disk full").context("cannot write summary.json").context("shard 0");
        assert_eq!(report(&chained), "shard 0: cannot write summary.json: disk full");
    }
}
