//! `basecamp trace cleanup PATHS... --older-than 7d [--delete]`: removes old
//! traces from local directories and from S3. A dry run by default: it lists
//! what would go and sums it up; `--delete` deletes. Only files and objects
//! whose names end in `.trace` are ever considered — checkpoints,
//! `summary.json`, `index.json`, rollback traces and anything else stay, even
//! when named explicitly or matched by a glob — and of local files only those
//! that begin as a trace does (an S3 object is judged by its name).
//!
//! A local file's age is its modification time; an S3 object's, its
//! `LastModified`. `s3://BUCKET/PREFIX` takes every `*.trace` object under
//! the prefix (one listing), `s3://BUCKET/KEY.trace` that one object (one
//! HEAD). S3 goes through the sandbox's storage client (`AWS_ENDPOINT_URL_S3`,
//! the standard credential chain, retries), which deletes 1,000 keys a
//! request and reports each key that did not go. Everything is found before
//! anything is deleted, so a location that cannot be read stops the command
//! with nothing deleted; a trace that cannot be deleted is named with the
//! cause, the others still go, and the exit code is 1.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use basecamp_sandbox::storage::{Destination, ObjectInfo, Storage};
use basecamp_trace::format::MAGIC;
use basecamp_trace::inputs::{TRACE_SUFFIX, expand_inputs};
use clap::Args;

#[derive(Args)]
#[command(after_help = "S3: s3://BUCKET/PREFIX takes every *.trace object under the prefix, \
    s3://BUCKET/KEY.trace one object; the endpoint and credentials come from AWS_ENDPOINT_URL_S3 \
    and the standard AWS chain. Keys are deleted 1,000 a request; each one that fails is named.")]
pub struct CleanupArgs {
    /// Directories (searched recursively for *.trace), trace files, glob patterns,
    /// s3://BUCKET/PREFIX (every *.trace object under it) or s3://BUCKET/KEY.trace.
    #[arg(required = true)]
    paths: Vec<String>,
    /// Age above which a trace goes, by modification time (S3: LastModified): 90s, 30m, 12h, 7d, 2w, 1.5d, 7d12h.
    #[arg(long, value_name = "AGE", value_parser = parse_age, allow_hyphen_values = true)]
    older_than: Duration,
    /// Delete (without it, only report what would be deleted).
    #[arg(long)]
    delete: bool,
}

/// `7d` -> 7 days; parts add up (`7d12h`) and may have a fraction
/// (`1.5d`). Units: s, m, h, d, w.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    const USAGE: &str = "an age such as 7d, 36h, 1.5d or 7d12h (units s, m, h, d, w)";
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative; give {USAGE}"));
    }
    let mut rest = text;
    let mut seconds = 0f64;
    if rest.is_empty() {
        return Err(format!("no age given; give {USAGE}"));
    }
    while !rest.is_empty() {
        let split = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(split);
        let n: f64 = number.parse().map_err(|_| format!("{text:?} is not {USAGE}"))?;
        let unit_end = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let per = match unit {
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            "w" => 7.0 * 86_400.0,
            _ => return Err(format!("{text:?}: unknown unit {unit:?}; use s, m, h, d or w (e.g. 7d)")),
        };
        seconds += n * per;
        rest = after;
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is too long an age"))
}

/// A trace old enough to go.
struct OldTrace {
    /// How output names it: the path, or the `s3://` URL.
    name: String,
    location: Destination,
    size: u64,
}

/// What the arguments found, before anything is deleted.
#[derive(Default)]
struct Plan {
    old: Vec<OldTrace>,
    young: usize,
    /// Files matched by a glob or named directly that are not traces.
    kept_other: usize,
    seen: HashSet<String>,
    /// Local files by [`directory_entry`].
    seen_local: HashSet<PathBuf>,
}

impl Plan {
    /// Sorts one found file or object by name and age; each name counts once.
    fn consider(&mut self, object: ObjectInfo, now: SystemTime, older_than: Duration) -> anyhow::Result<()> {
        let name = object.location.to_string();
        if !self.seen.insert(name.clone()) {
            return Ok(());
        }
        if !name.ends_with(TRACE_SUFFIX) {
            self.kept_other += 1;
            return Ok(());
        }
        let Some(modified) = object.last_modified else {
            bail!("{}: no modification time, so its age is unknown", super::one_line(&name))
        };
        if now.duration_since(modified).is_ok_and(|age| age > older_than) {
            self.old.push(OldTrace { name, location: object.location, size: object.size });
        } else {
            self.young += 1;
        }
        Ok(())
    }
}

pub fn run(args: &CleanupArgs) -> anyhow::Result<ExitCode> {
    let now = SystemTime::now();
    let mut plan = Plan::default();
    let mut s3: Option<(tokio::runtime::Runtime, Storage)> = None;
    for arg in &args.paths {
        if arg.starts_with("s3://") {
            let (runtime, storage) = match &mut s3 {
                Some(client) => client,
                None => s3.insert(super::sources::s3_client()?),
            };
            for object in find_s3(runtime, storage, arg)? {
                plan.consider(object, now, args.older_than)?;
            }
        } else {
            for file in expand_inputs(std::slice::from_ref(arg), TRACE_SUFFIX)? {
                // One file reached by two spellings (`runs` and `./runs`, a
                // symlinked directory) counts once and is deleted once.
                if !plan.seen_local.insert(directory_entry(&file)) {
                    continue;
                }
                let meta = fs::metadata(&file).with_context(|| format!("{}: cannot read its age", file.display()))?;
                // A FIFO or a device named *.trace is no trace (and reading one could block).
                if !meta.is_file() || !starts_like_a_trace(&file)? {
                    basecamp_sandbox::stderr_line!(
                        "{}: not a basecamp trace (bad magic); left alone",
                        super::shown_path(&file)
                    );
                    plan.kept_other += 1;
                    continue;
                }
                // A symbolic link is what is deleted: its own age and size,
                // not its target's (which stays, and is counted where it is found).
                let own =
                    fs::symlink_metadata(&file).with_context(|| format!("{}: cannot read its age", file.display()))?;
                let meta = if own.file_type().is_symlink() { own } else { meta };
                let object = ObjectInfo {
                    relative: String::new(),
                    size: meta.len(),
                    last_modified: Some(
                        meta.modified().with_context(|| format!("{}: no modification time", file.display()))?,
                    ),
                    location: Destination::Local(file),
                };
                plan.consider(object, now, args.older_than)?;
            }
        }
    }
    let Plan { old, young, kept_other, .. } = plan;
    let note =
        if kept_other > 0 { format!("; {kept_other} files that are not traces left alone") } else { String::new() };
    if !args.delete {
        for trace in &old {
            writeln!(std::io::stdout(), "would delete {} ({} bytes)", super::one_line(&trace.name), trace.size)?;
        }
        let bytes: u64 = old.iter().map(|t| t.size).sum();
        writeln!(
            std::io::stdout(),
            "dry run: would delete {} traces, {bytes} bytes; {young} newer traces kept{note}; add --delete to delete",
            old.len()
        )?;
        return Ok(ExitCode::SUCCESS);
    }

    // S3 objects go in one call (1,000 keys a request); its results come
    // back in order, so they pair up with the S3 traces as listed.
    let on_s3: Vec<Destination> = old.iter().filter(|t| t.location.is_s3()).map(|t| t.location.clone()).collect();
    let mut s3_results = match (&s3, on_s3.is_empty()) {
        (Some((runtime, storage)), false) => runtime.block_on(storage.delete_objects(&on_s3)),
        _ => Vec::new(),
    }
    .into_iter();
    let (mut deleted, mut bytes, mut failed) = (0usize, 0u64, 0usize);
    // A closed stdout (`| head`) does not stop the deletion; its error is returned at the end.
    let mut stdout = std::io::stdout().lock();
    let mut write_error: Option<std::io::Error> = None;
    for trace in &old {
        let result = match &trace.location {
            Destination::Local(path) => {
                fs::remove_file(path).map_err(|e| format!("{}: cannot delete: {e}", super::shown_path(path)))
            }
            Destination::S3(_) => match s3_results.next() {
                Some(deletion) => deletion.result.map_err(|e| e.to_string()),
                None => {
                    Err(format!("{}: cannot delete: the storage client gave no result", super::one_line(&trace.name)))
                }
            },
        };
        match result {
            Ok(()) => {
                deleted += 1;
                bytes += trace.size;
                if write_error.is_none()
                    && let Err(e) = writeln!(stdout, "deleted {} ({} bytes)", super::one_line(&trace.name), trace.size)
                {
                    write_error = Some(e);
                }
            }
            Err(message) => {
                failed += 1;
                basecamp_sandbox::stderr_line!("error: {message}");
            }
        }
    }
    if let Some(e) = write_error {
        return Err(e.into());
    }
    writeln!(stdout, "deleted {deleted} traces, {bytes} bytes; {young} newer traces kept{note}")?;
    if failed > 0 {
        bail!("{failed} traces could not be deleted");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a local file begins as a trace does: the magic, or as much of
/// it as the file holds (a writer killed at once leaves less). A file named
/// `*.trace` that is something else is never deleted.
fn starts_like_a_trace(file: &Path) -> anyhow::Result<bool> {
    use std::io::Read;
    let mut head = Vec::with_capacity(MAGIC.len());
    fs::File::open(file)
        .and_then(|f| f.take(MAGIC.len() as u64).read_to_end(&mut head))
        .with_context(|| format!("{}: cannot read it to check it is a trace", file.display()))?;
    Ok(MAGIC.starts_with(&head))
}

/// The directory entry `file` names, however it was spelt: its directory
/// resolved, its own name kept (a symbolic link named `x.trace` is its own
/// entry, and deleting it removes the link, not what it points to).
fn directory_entry(file: &Path) -> PathBuf {
    let (Some(parent), Some(name)) = (file.parent(), file.file_name()) else { return file.to_path_buf() };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    fs::canonicalize(parent).map(|dir| dir.join(name)).unwrap_or_else(|_| file.to_path_buf())
}

/// `s3://B/KEY.trace` is one object (one HEAD); anything else is a prefix,
/// listed whole, of which only `*.trace` objects count (as in a directory).
fn find_s3(runtime: &tokio::runtime::Runtime, storage: &Storage, arg: &str) -> anyhow::Result<Vec<ObjectInfo>> {
    let location = Destination::parse_prefix(arg)?;
    if arg.ends_with(TRACE_SUFFIX) {
        return match runtime.block_on(storage.stat(&location))? {
            Some(object) => Ok(vec![object]),
            None => bail!("{arg}: no such object"),
        };
    }
    let objects: Vec<ObjectInfo> =
        runtime.block_on(storage.list(&location))?.into_iter().filter(|o| o.relative.ends_with(TRACE_SUFFIX)).collect();
    if objects.is_empty() {
        basecamp_sandbox::stderr_line!("note: {arg}: no .trace objects under this prefix");
    }
    Ok(objects)
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
        assert_eq!(parse_age("7d12h"), Ok(Duration::from_secs(7 * 86_400 + 12 * 3600)));
        assert_eq!(parse_age("1.5d"), Ok(Duration::from_secs(36 * 3600)));
        assert!(parse_age("-1d").unwrap_err().contains("negative"), "{:?}", parse_age("-1d"));
        assert!(parse_age("1.2.3d").unwrap_err().contains("not an age"));
        assert!(parse_age("").unwrap_err().contains("no age"));
    }

    fn found(name: &str, size: u64, days_old: u64) -> ObjectInfo {
        ObjectInfo {
            location: Destination::parse(name).expect("a valid location"),
            relative: String::new(),
            size,
            last_modified: Some(SystemTime::now() - Duration::from_secs(days_old * 86_400)),
        }
    }

    #[test]
    fn a_plan_counts_each_name_once_and_keeps_what_is_not_a_trace() {
        let (now, week) = (SystemTime::now(), Duration::from_secs(7 * 86_400));
        let mut plan = Plan::default();
        for object in [
            found("s3://bkt/runs/ep-1.trace", 10, 30),
            found("s3://bkt/runs/ep-1.trace", 10, 30),
            found("s3://bkt/runs/ep-2.trace", 20, 1),
            found("s3://bkt/runs/summary.json", 5, 30),
        ] {
            plan.consider(object, now, week).expect("has an age");
        }
        let old: Vec<&str> = plan.old.iter().map(|t| t.name.as_str()).collect();
        assert_eq!((old, plan.young, plan.kept_other), (vec!["s3://bkt/runs/ep-1.trace"], 1, 1));
        let ageless = ObjectInfo { last_modified: None, ..found("s3://bkt/runs/ep-3.trace", 1, 0) };
        let err = plan.consider(ageless, now, week).expect_err("no age");
        assert!(err.to_string().starts_with("s3://bkt/runs/ep-3.trace: no modification time"), "{err}");
    }
}
