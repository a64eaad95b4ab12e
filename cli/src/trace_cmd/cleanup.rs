//! `basecamp trace cleanup PATHS... --older-than 7d [--delete]`: removes old
//! traces. A dry run by default: it lists what would go and sums it up;
//! `--delete` deletes. Only files whose names end in `.trace` are ever
//! considered — checkpoints, `summary.json`, `index.json`, rollback traces
//! and anything else stay, even when named explicitly or matched by a glob.

use std::fs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use basecamp_trace::inputs::{TRACE_SUFFIX, expand_inputs};
use clap::Args;

#[derive(Args)]
pub struct CleanupArgs {
    /// Directories (searched recursively for *.trace), trace files or glob patterns.
    #[arg(required = true)]
    paths: Vec<String>,
    /// Age above which a trace goes, by modification time: 90s, 30m, 12h, 7d, 2w.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    older_than: Duration,
    /// Delete (without it, only report what would be deleted).
    #[arg(long)]
    delete: bool,
}

/// `7d` -> 7 days. Units: s, m, h, d, w.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not an age such as 7d (units s, m, h, d, w)"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("{text:?}: unknown unit {unit:?}; use s, m, h, d or w (e.g. 7d)")),
    };
    Ok(Duration::from_secs(n.saturating_mul(seconds)))
}

pub fn run(args: &CleanupArgs) -> anyhow::Result<ExitCode> {
    let files = expand_inputs(&args.paths, TRACE_SUFFIX)?;
    let now = SystemTime::now();
    let (mut kept_other, mut young) = (0usize, 0usize);
    let mut old: Vec<(PathBuf, u64)> = Vec::new();
    for file in files {
        if !file.file_name().is_some_and(|n| n.to_string_lossy().ends_with(TRACE_SUFFIX)) {
            kept_other += 1;
            continue;
        }
        let meta = fs::metadata(&file).with_context(|| format!("{}: cannot read its age", file.display()))?;
        let age =
            now.duration_since(meta.modified().with_context(|| format!("{}: no modification time", file.display()))?);
        if age.is_ok_and(|age| age > args.older_than) {
            old.push((file, meta.len()));
        } else {
            young += 1;
        }
    }
    let bytes: u64 = old.iter().map(|(_, b)| b).sum();
    let mut failed = 0usize;
    for (file, size) in &old {
        if args.delete {
            match fs::remove_file(file) {
                Ok(()) => println!("deleted {} ({size} bytes)", file.display()),
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {}: cannot delete: {e}", file.display());
                }
            }
        } else {
            println!("would delete {} ({size} bytes)", file.display());
        }
    }
    let note =
        if kept_other > 0 { format!("; {kept_other} files that are not .trace left alone") } else { String::new() };
    if args.delete {
        println!("deleted {} traces, {} bytes; {young} newer traces kept{note}", old.len() - failed, bytes);
    } else {
        println!(
            "dry run: would delete {} traces, {bytes} bytes; {young} newer traces kept{note}; add --delete to delete",
            old.len()
        );
    }
    if failed > 0 {
        bail!("{failed} traces could not be deleted");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_units() {
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert!(parse_age("7").unwrap_err().contains("unknown unit"));
        assert!(parse_age("d").unwrap_err().contains("not an age"));
        assert!(parse_age("7 days").is_err());
    }
}
