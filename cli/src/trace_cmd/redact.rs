//! `basecamp trace redact PATHS... --pii-fields a,b [--patterns email,phone] -o OUTDIR`:
//! copies of traces with personal data replaced by salted hashes
//! (`basecamp_trace::redact`), each still a valid trace. Inputs are never
//! modified; each output is written to a temporary name and renamed when
//! complete, so a failure leaves no half-redacted file. A trace named after
//! its episode id (as the sandbox names them) is written under the name of
//! its redacted id.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use basecamp_sandbox::episode::trace_file_name;
use basecamp_trace::TraceError;
use basecamp_trace::inputs::{default_jobs, for_each_ordered};
use basecamp_trace::redact::{Pattern, RedactError, RedactStats, Redactor};
use clap::Args;

use super::shown_path;
use super::sources::{Source, Sources};

#[derive(Args)]
pub struct RedactArgs {
    /// Trace files, directories (searched recursively for *.trace), glob patterns, or s3://BUCKET/PREFIX.
    #[arg(required = true)]
    paths: Vec<std::ffi::OsString>,
    /// Memory keys and JSON fields (at any depth) whose values are replaced, e.g. user_phone,user_address.
    #[arg(long, value_delimiter = ',', value_name = "FIELDS", value_parser = pii_field)]
    pii_fields: Vec<String>,
    /// Patterns replaced inside every string: email, phone.
    #[arg(long, value_delimiter = ',', value_name = "PATTERNS")]
    patterns: Vec<String>,
    /// Salt of the hashes (same salt, same tokens across runs); default: random, so tokens join only within this run.
    /// Not empty: unsalted tokens of phone numbers or emails can be found by trying every value.
    #[arg(long, value_parser = salt)]
    salt: Option<String>,
    /// Directory for the redacted traces (created if missing); each keeps its path below the directory,
    /// glob prefix or S3 prefix given.
    #[arg(long, short = 'o', value_name = "OUTDIR", value_parser = crate::local_path)]
    out: PathBuf,
    /// Also redact a trace whose writer was killed (a clean truncation): the copy holds its records, redacted,
    /// and is cut off after them the same way. Other damage is still an error.
    #[arg(long)]
    allow_truncated: bool,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', value_parser = crate::at_least_one::<usize>)]
    jobs: Option<usize>,
}

/// One `--pii-fields` entry, without the spaces around it (`a, b`). An
/// empty one (`a,,b`, `--pii-fields "$UNSET"`) is refused: it names no
/// field, and on its own it would copy every value unredacted.
fn pii_field(text: &str) -> Result<String, String> {
    match text.trim() {
        "" => Err(
            "an empty field name (two commas in a row, or an empty list?); give names such as user_phone,user_address"
                .into(),
        ),
        name => Ok(name.to_string()),
    }
}

pub fn run(args: &RedactArgs) -> anyhow::Result<ExitCode> {
    let patterns = args
        .patterns
        .iter()
        .map(|p| Pattern::from_name(p).with_context(|| format!("unknown pattern {p:?}; patterns are email, phone")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.pii_fields.is_empty() && patterns.is_empty() {
        bail!("nothing to redact: give --pii-fields, --patterns or both");
    }
    let sources = Sources::resolve(&args.paths)?;
    let files = &sources.items;
    let outputs = output_paths(files, &args.out)?;
    refuse_out_inside_an_input(&args.paths, &args.out)?;
    crate::create_out_dir(&args.out)?;
    let salt = match &args.salt {
        Some(s) => s.as_bytes().to_vec(),
        None => Redactor::random_salt(),
    };
    let redactor =
        Redactor::new(args.pii_fields.iter().cloned(), patterns, salt).allowing_truncated(args.allow_truncated);
    let jobs: Vec<(&Source, &PathBuf)> = files.iter().zip(&outputs).collect();
    let mut failed = 0usize;
    let mut total = RedactStats::default();
    // A closed stdout (`| head`) does not stop the redaction: every trace is
    // still written, and the error is returned at the end (print! would panic).
    let mut stdout = std::io::stdout().lock();
    let mut write_error: Option<std::io::Error> = None;
    for_each_ordered(
        &jobs,
        args.jobs.unwrap_or_else(default_jobs),
        |(input, output)| redact_one(&redactor, &sources, input, output),
        |i, result| {
            let input = jobs[i].0;
            match result {
                Ok((stats, output)) => {
                    total.records += stats.records;
                    total.replaced += stats.replaced;
                    total.fields_found.extend(stats.fields_found);
                    if let Some(cut) = &stats.truncated {
                        let end = if stats.kept_end { "its episode end kept, no index" } else { "no episode end" };
                        basecamp_sandbox::stderr_line!(
                            "warning: {cut}; {} holds them redacted and is cut off after them too ({end})",
                            shown_path(&output)
                        );
                    }
                    if write_error.is_none()
                        && let Err(e) = writeln!(
                            stdout,
                            "{} -> {}: {} values replaced in {} records",
                            input.shown(),
                            shown_path(&output),
                            stats.replaced,
                            stats.records
                        )
                    {
                        write_error = Some(e);
                    }
                }
                Err(e) => {
                    failed += 1;
                    let truncated = matches!(
                        e.downcast_ref::<RedactError>(),
                        Some(RedactError::Read(TraceError::Truncated { .. }))
                    );
                    let hint = match (truncated, args.allow_truncated) {
                        (true, false) => " (--allow-truncated redacts the records recovered)",
                        // Cut inside its header: nothing to make a copy of.
                        (true, true) => " (cut before its header ended: there is nothing to redact)",
                        _ => "",
                    };
                    basecamp_sandbox::stderr_line!("error: {e:#}{hint}");
                }
            }
        },
    );
    if let Some(e) = write_error {
        return Err(e.into());
    }
    let redacted = files.len() - failed;
    // A field in no trace at all is most likely misspelt, and then the
    // values it meant are in the copies as they were.
    for field in &args.pii_fields {
        if redacted > 0 && !total.fields_found.contains(field) {
            basecamp_sandbox::stderr_line!(
                "warning: --pii-fields {field}: no JSON field or memory key of this name in any of the {redacted} \
                 traces redacted (misspelt?); nothing was replaced for it"
            );
        }
    }
    writeln!(
        stdout,
        "{} traces redacted, {} values replaced{}",
        redacted,
        total.replaced,
        if args.salt.is_none() { " (random salt)" } else { "" }
    )?;
    Ok(if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// `OUTDIR/<file name>` for each input; two inputs with one name, or an
/// output that is one of the inputs (its own, or another's when OUTDIR is
/// inside an input directory), are refused before anything is written.
fn output_paths(files: &[Source], out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let inputs: HashMap<PathBuf, &Source> =
        files.iter().filter_map(|file| Some((fs::canonicalize(file.local_path()?).ok()?, file))).collect();
    let mut seen: HashMap<PathBuf, &str> = HashMap::new();
    let mut outputs = Vec::with_capacity(files.len());
    for file in files {
        let output = out.join(&file.relative_path);
        if let Some(other) = seen.insert(output.clone(), &file.name) {
            bail!(
                "{} and {} would both be written to {}; redact them into different directories",
                super::one_line(other),
                file.shown(),
                shown_path(&output)
            );
        }
        if let Some(input) = fs::canonicalize(&output).ok().and_then(|path| inputs.get(&path)) {
            if std::ptr::eq(*input, file) {
                bail!("{}: the output would overwrite the input; choose another -o directory", file.shown());
            }
            bail!(
                "{}: the redacted copy of {} would overwrite this input; choose an -o directory that holds no input",
                input.shown(),
                file.shown()
            );
        }
        outputs.push(output);
    }
    Ok(outputs)
}

/// `-o` inside a directory given as input (or a glob's fixed directory):
/// the copies would be found again by every later command over that
/// directory, each episode twice, raw and redacted. Refused.
fn refuse_out_inside_an_input(paths: &[std::ffi::OsString], out: &Path) -> anyhow::Result<()> {
    let out_resolved = resolved(out);
    for arg in paths.iter().filter(|a| !a.to_string_lossy().starts_with("s3://")) {
        let wild = |p: &Path| p.to_string_lossy().contains(['*', '?', '[']);
        let Some(dir) = Path::new(arg).ancestors().find(|p| !wild(p) && p.is_dir()) else { continue };
        if Path::new(arg).is_file() {
            continue;
        }
        let dir_resolved = resolved(dir);
        if out_resolved.starts_with(&dir_resolved) {
            bail!(
                "-o {} is inside the input directory {}: the redacted copies would be read with the originals by \
                 every later command over it; choose an -o directory outside the inputs",
                out.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// `path` with its links and `..` resolved as far as it exists, the rest
/// (still to be created) appended as given.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for existing in absolute.ancestors() {
        if let Ok(real) = fs::canonicalize(existing) {
            return real.join(absolute.strip_prefix(existing).unwrap_or(Path::new("")));
        }
    }
    absolute
}

/// Redacts `input` into `output`, or into the file named after the
/// redacted episode id when `output` is named after the original one
/// (`dave~40example.com.trace`, as the sandbox names traces): the copy and
/// the path it was written to.
fn redact_one(
    redactor: &Redactor,
    sources: &Sources,
    input: &Source,
    output: &Path,
) -> anyhow::Result<(RedactStats, PathBuf)> {
    let open = sources.reopener(input)?;
    if let Some(parent) = output.parent() {
        fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let tmp = super::partial_path(output);
    let file = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let result = redactor.redact(open, BufWriter::new(file), &shown_path(output));
    match result {
        Ok(stats) => {
            let output = named_after_redacted_id(output, &stats.episode_id);
            fs::rename(&tmp, &output).with_context(|| {
                let _ = fs::remove_file(&tmp);
                format!("cannot rename {} to {}", tmp.display(), output.display())
            })?;
            Ok((stats, output))
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e.into())
        }
    }
}

/// `output` renamed after the copy's episode id when its name is the
/// sandbox's file name of the original id and redaction changed the id:
/// otherwise the name would keep what the header no longer holds.
fn named_after_redacted_id(output: &Path, (original, redacted): &(String, String)) -> PathBuf {
    let named_after_id = output.file_name().is_some_and(|name| *name == *trace_file_name(original));
    if original != redacted && named_after_id {
        output.with_file_name(trace_file_name(redacted))
    } else {
        output.to_path_buf()
    }
}

/// A `--salt` that is not empty (nor only spaces).
fn salt(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the salt is empty: tokens of an unsalted hash can be reversed by trying every phone number or \
                    common email; give a secret salt, or leave --salt out for a random one"
            .into());
    }
    Ok(text.to_string())
}
