//! `basecamp trace archive PATHS... -o FILE.tar.zst`, `archive list FILE`,
//! `archive extract FILE EPISODE|NAME... -o DIR`: trace archives that any
//! `zstd -d | tar x` unpacks, with an index (`basecamp_trace::archive`) so
//! `extract` reads and decompresses only the members it returns.

use std::fs;
use std::io::{BufWriter, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use basecamp_trace::archive::{ArchiveReader, ArchiveWriter, Member, PreparedMember, prepare_member};
use basecamp_trace::inputs::{default_jobs, for_each_ordered};
use clap::{Args, Subcommand};
use serde_json::json;

use super::sources::{Source, Sources};
use super::{one_line, shown_path};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ArchiveArgs {
    #[command(subcommand)]
    action: Option<ArchiveAction>,
    /// Trace files, directories (searched recursively for *.trace), glob patterns or s3://BUCKET/PREFIX to archive.
    /// A file whose name is not UTF-8 cannot be a member (the archive's index is JSON): it is named in an error
    /// and left out, the others are archived, and the exit status is 1; rename it and archive it on its own.
    #[arg(required = true)]
    paths: Vec<std::ffi::OsString>,
    /// The archive to write (conventionally FILE.tar.zst; `-` for stdout). Members are named by their path below
    /// the directory, glob prefix or S3 prefix given.
    #[arg(long, short = 'o', value_name = "FILE", required = true, value_parser = crate::local_path)]
    out: Option<PathBuf>,
    /// Worker threads compressing members (default: one per core).
    #[arg(long, short = 'j', value_parser = crate::at_least_one::<usize>)]
    jobs: Option<usize>,
}

#[derive(Subcommand)]
enum ArchiveAction {
    /// List the traces in an archive (from its index only).
    List {
        file: PathBuf,
        /// One JSON object per member (JSON Lines).
        #[arg(long)]
        json: bool,
    },
    /// Extract traces by episode id or member name, reading only their frames.
    Extract {
        file: PathBuf,
        /// Episode ids or member names (with or without .trace).
        #[arg(required = true, value_name = "EPISODE|NAME")]
        keys: Vec<String>,
        /// Directory to write them to (created if missing).
        #[arg(long, short = 'o', value_name = "DIR", value_parser = crate::local_path)]
        out: PathBuf,
    },
}

pub fn run(args: &ArchiveArgs) -> anyhow::Result<ExitCode> {
    match &args.action {
        Some(ArchiveAction::List { file, json }) => list(file, *json),
        Some(ArchiveAction::Extract { file, keys, out }) => extract(file, keys, out),
        None => create(args),
    }
}

fn create(args: &ArchiveArgs) -> anyhow::Result<ExitCode> {
    let out = args.out.as_ref().expect("clap requires -o when archiving");
    let sources = Sources::resolve(&args.paths)?;
    // Member names are UTF-8 (the index is JSON): a file name that is not
    // would be archived under another name. Such a file is left out and
    // named; the others are archived, and the exit status says one was not.
    let (files, unnamed): (Vec<&Source>, Vec<&Source>) =
        sources.items.iter().partition(|file| file.relative_path.to_str() == Some(file.relative.as_str()));
    for file in &unnamed {
        basecamp_sandbox::stderr_line!(
            "error: {:?}: the file name is not UTF-8, which archive member names must be (the archive's index is \
             JSON), so it was not archived; rename it and archive it on its own",
            file.local_path().unwrap_or(&file.relative_path)
        );
    }
    let mut names = std::collections::HashMap::new();
    for file in &files {
        if let Some(other) = names.insert(file.relative.as_str(), &file.name) {
            bail!(
                "{} and {} would both be archived as {}; archive them separately",
                one_line(other),
                file.shown(),
                one_line(&file.relative)
            );
        }
    }
    // A member that is another's directory (`x.trace` and `x.trace/y.trace`)
    // cannot be extracted (or untarred) next to it.
    for file in &files {
        let dirs = file.relative.match_indices('/').map(|(at, _)| &file.relative[..at]);
        if let Some(other) = dirs.filter_map(|dir| names.get(dir)).next() {
            bail!(
                "{} would be archived as a file where {} needs a directory of that name; archive them separately",
                one_line(other),
                file.shown()
            );
        }
    }
    let output = sources.create_output(out, "the archive's file name", "traces.tar.zst")?;
    if output.is_terminal() {
        bail!(
            "{} is a terminal: the archive is compressed binary; redirect it (`-o - > traces.tar.zst`) or give -o FILE",
            out.display()
        );
    }
    let mut writer = ArchiveWriter::new(BufWriter::new(&output));
    let (mut failed, mut write_error, mut input_bytes) = (unnamed.len(), None, 0u64);
    let prepare = |source: &&Source| -> anyhow::Result<PreparedMember> {
        let data = sources.read_bytes(source)?;
        Ok(prepare_member(&source.shown(), &source.relative, &data)?)
    };
    for_each_ordered(&files, args.jobs.unwrap_or_else(default_jobs), prepare, |_, prepared| match prepared {
        Ok(member) => {
            // The damage names the file: "X: truncated at byte N: …", "X: corrupt frame at byte N: …".
            if let Some(damage) = member.damage() {
                basecamp_sandbox::stderr_line!("warning: {damage}; archived as it is");
            }
            input_bytes += member.member().bytes;
            if let Err(e) = writer.append(member) {
                // The rest is neither read nor compressed.
                write_error = Some(e);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }
        Err(e) => {
            failed += 1;
            basecamp_sandbox::stderr_line!("error: {e:#}");
            ControlFlow::Continue(())
        }
    });
    let count = writer.members().len();
    if count == 0 && write_error.is_none() {
        drop(writer);
        output.discard();
        bail!("no trace could be archived (each is named above); {} was not written", out.display());
    }
    let result = match write_error {
        Some(e) => {
            drop(writer);
            Err(e)
        }
        None => writer.finish().and_then(|mut w| w.flush()),
    };
    if let Err(e) = result {
        output.discard();
        return Err(e).with_context(|| format!("cannot write {}", out.display()));
    }
    // The archive itself may be what stdout carries (`-o -`, `-o /dev/stdout`).
    let to_stdout = output.in_place();
    output.commit()?;
    let message = match fs::metadata(out) {
        Ok(m) if m.is_file() => {
            format!("archived {count} traces ({input_bytes} bytes) into {} ({} bytes)", out.display(), m.len())
        }
        _ => format!("archived {count} traces ({input_bytes} bytes) into {}", out.display()),
    };
    if to_stdout {
        basecamp_sandbox::stderr_line!("{message}");
    } else {
        writeln!(std::io::stdout(), "{message}")?;
    }
    if failed > 0 {
        basecamp_sandbox::stderr_line!(
            "error: {failed} of {} traces could not be archived (each is named above); the archive holds the others",
            sources.items.len()
        );
    }
    Ok(if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn list(file: &Path, as_json: bool) -> anyhow::Result<ExitCode> {
    let reader = ArchiveReader::open(file)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    if !as_json {
        writeln!(
            out,
            "{:<32} {:<24} {:<20} {:<8} {:>6} {:>9} {:>12}",
            "NAME", "EPISODE", "TASK", "VARIANT", "STEPS", "COMPLETE", "BYTES"
        )?;
    }
    for m in reader.members() {
        if as_json {
            writeln!(out, "{}", json!(m))?;
        } else {
            writeln!(
                out,
                "{:<32} {:<24} {:<20} {:<8} {:>6} {:>9} {:>12}",
                one_line(&m.name),
                one_line(&m.episode),
                one_line(&m.task),
                one_line(&m.variant),
                m.steps,
                if m.complete { "yes" } else { "no" },
                m.bytes
            )?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn extract(file: &Path, keys: &[String], dir: &Path) -> anyhow::Result<ExitCode> {
    let mut reader = ArchiveReader::open(file)?;
    let mut wanted: Vec<Member> = Vec::new();
    for key in keys {
        let found: Vec<_> = reader.find(key).into_iter().cloned().collect();
        if found.is_empty() {
            bail!(
                "{}: no trace named {key:?} or of episode {key:?} ({} traces; see `basecamp trace archive list`)",
                file.display(),
                reader.members().len()
            );
        }
        // A member asked for twice (by name and by episode) comes out once.
        for member in found {
            if !wanted.iter().any(|w| w.name == member.name && w.frame_offset == member.frame_offset) {
                wanted.push(member);
            }
        }
    }
    // Every destination is checked before anything is written: a file already
    // there is kept unless it holds exactly the archived bytes.
    crate::check_out_dir(dir)?;
    let mut plan: Vec<(Member, PathBuf, bool)> = Vec::with_capacity(wanted.len());
    for member in wanted {
        let path = destination(file, dir, &member)?;
        // Two members of one name (an archive not written by basecamp): the second would replace the first.
        if let Some((other, _, _)) = plan.iter().find(|(_, planned, _)| *planned == path) {
            bail!(
                "{}: {} (of episode {}) and {} (of episode {}) would both be extracted to {}; nothing was \
                 extracted: extract them one at a time into different directories",
                shown_path(file),
                one_line(&other.name),
                one_line(&other.episode),
                one_line(&member.name),
                one_line(&member.episode),
                shown_path(&path)
            );
        }
        let already_there = match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e).with_context(|| format!("cannot check {}", path.display())),
            Ok(meta) if meta.is_file() && holds(&path, &member)? => true,
            Ok(_) => bail!(
                "{}: already exists and is not the archived {} (of episode {}); nothing was extracted: \
                 extract into another directory or move the file away",
                shown_path(&path),
                one_line(&member.name),
                one_line(&member.episode)
            ),
        };
        plan.push((member, path, already_there));
    }
    crate::create_out_dir(dir)?;
    // A closed stdout (`| head`) does not stop the extraction; its error is returned at the end.
    let mut stdout = std::io::stdout().lock();
    let mut write_error: Option<std::io::Error> = None;
    for (member, path, already_there) in plan {
        if !already_there {
            let data = reader.read_member(&member)?;
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
            }
            // Written under a temporary name and renamed when complete, so an
            // interrupted extraction leaves no trace that looks whole.
            let tmp = super::partial_path(&path);
            if let Err(e) = fs::write(&tmp, data).and_then(|()| fs::rename(&tmp, &path)) {
                let _ = fs::remove_file(&tmp);
                return Err(e).with_context(|| format!("cannot write {}", path.display()));
            }
        }
        let line = if already_there {
            format!(
                "{} (episode {}) is already at {}",
                one_line(&member.name),
                one_line(&member.episode),
                shown_path(&path)
            )
        } else {
            format!(
                "extracted {} (episode {}) -> {}",
                one_line(&member.name),
                one_line(&member.episode),
                shown_path(&path)
            )
        };
        if write_error.is_none()
            && let Err(e) = writeln!(stdout, "{line}")
        {
            write_error = Some(e);
        }
    }
    match write_error {
        Some(e) => Err(e.into()),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Where `member` goes below `dir`. Member names come from the archive:
/// refuse any that would leave `dir`.
fn destination(file: &Path, dir: &Path, member: &Member) -> anyhow::Result<PathBuf> {
    let relative = Path::new(&member.name);
    if relative.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
        bail!("{}: member name {:?} is not a relative path below the output directory", file.display(), member.name);
    }
    Ok(dir.join(relative))
}

/// Whether the file at `path` is `member`'s trace, byte for byte.
fn holds(path: &Path, member: &Member) -> anyhow::Result<bool> {
    let data = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(member.holds_the_same_bytes_as(&data))
}
