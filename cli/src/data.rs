//! `basecamp data preprocess`: traces into training data — `(state, action,
//! reward)` rows in batches of `dataPipeline.batchSize`, as JSON Lines or
//! Parquet (`dataPipeline.format`) — with the task's preprocessor
//! (`builtin:trajectory`, `exec:...`, `python:module.function`; see
//! `basecamp_sandbox::preprocess`). With `--config`, the source, version,
//! preprocessor, batch size, format and the reward weights (the sandbox's
//! own calculator, at `--training-step`) come from the manifests.
//!
//! inputs (files, directories, globs, `s3://` prefixes; the trace commands'
//! [`Sources`]) -> preflight the preprocessor on the first record -> rows
//! into `batch-00000.jsonl` (or `.parquet`, see [`parquet_file`]), ... ->
//! `dataset.json`, written last: it marks the dataset complete
//! (operator/TRAINING.md, "Locations"). A damaged trace (cut off by a
//! crash, corrupt, or read to its end without an episode end) gives the
//! rows of the steps that finished before the damage; it is named on
//! stderr and under `partial` in `dataset.json`, and one with no finished
//! step under `skipped`, as a file that is not a trace is. When its
//! episode end is missing, its episode's reward is unknown: every row of it
//! says `truncated` (a JSON Lines key, a Parquet column), so a trainer can
//! tell its reward (0 from the built-in) from a real one, and `dataset.json`'s
//! `truncatedRows` and the summary line count them. The format only
//! decides how a batch file is encoded ([`BatchFile`]); the rest is the
//! same. An `s3://` output is staged in a temporary directory and uploaded
//! with the sandbox's storage client (retries): an earlier run's
//! `dataset.json` removed, the batches, and `dataset.json` only once they
//! all arrived.
//!
//! The trainer pod's `dataset` init container runs this with
//! `FallbackToLogsOnError`, so a failure's message, the last thing on
//! stderr, becomes the pod's termination message: messages stay short.

mod parquet_file;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use basecamp_api::task::{DEFAULT_RECORD_TIMEOUT, DataFormat};
use basecamp_sandbox::config::reward_calculator;
use basecamp_sandbox::preprocess::{
    Preprocessor, Row, Subprocess, parse_preprocessor, raw_records, trajectory_row, unfinished_step,
};
use basecamp_sandbox::rewards::RewardCalculator;
use basecamp_sandbox::run::{absolute_dir, load_manifests_in, resolve_variants, select_task};
use basecamp_sandbox::storage::{Destination, UtcDate};
use basecamp_trace::{RecordKind, TraceContents, TraceError};

use crate::trace_cmd::sources::{Source, Sources, s3_client};
use parquet_file::ParquetBatch;

/// The file that describes a dataset and marks it complete.
pub const DATASET_FILE: &str = "dataset.json";

/// Failed uploads named one by one in the error; the rest are counted.
const FAILURES_SHOWN: usize = 3;

#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Turn traces (files, directories, globs, s3:// prefixes) into (state, action, reward) batches: JSON Lines or Parquet.
    Preprocess(PreprocessArgs),
}

#[derive(clap::Args, Debug)]
pub struct PreprocessArgs {
    /// Traces: files, directories (searched recursively), globs, or s3://BUCKET/PREFIX/
    /// (every *.trace under it). Default: the manifest's dataPipeline.source.
    pub inputs: Vec<String>,
    /// Where the batches go: DIR or s3://BUCKET/PREFIX/, holding batch-00000.jsonl (or .parquet), ...
    /// and dataset.json (written last).
    #[arg(long, short)]
    pub out: String,
    /// The HarnessTask manifests: source, version, preprocessor, batch size, format and reward weights come from them.
    #[arg(long = "config")]
    pub config: Vec<PathBuf>,
    /// With --config: run a user preprocessor in, and resolve a local dataPipeline.source
    /// against, DIR instead of the manifest's directory (the trainer pod passes `.`: its
    /// image's working directory).
    #[arg(long, value_name = "DIR", requires = "config")]
    pub base_dir: Option<PathBuf>,
    /// With --config: the HarnessTask, when the manifests hold several (NAME, or NAMESPACE/NAME when two
    /// namespaces have one of that name).
    #[arg(long, requires = "config")]
    pub task: Option<String>,
    /// With --config: the variant whose SandboxConfig scores rewards (default: the first).
    #[arg(long, requires = "config")]
    pub variant: Option<String>,
    /// builtin:trajectory, exec:PROGRAM ARGS..., or python:module.function (overrides the manifest).
    #[arg(long)]
    pub preprocessor: Option<String>,
    /// Rows per batch file, at least 1 (overrides the manifest's dataPipeline.batchSize; default 64).
    #[arg(long, value_parser = crate::at_least_one::<u32>)]
    pub batch_size: Option<u32>,
    /// The batch files' format (overrides the manifest's dataPipeline.format; default jsonl).
    #[arg(long, value_parser = format_parser())]
    pub format: Option<DataFormat>,
    /// The source data's version, recorded in dataset.json (default: the manifest's dataPipeline.version).
    #[arg(long)]
    pub version: Option<String>,
    /// The training step whose reward weights apply.
    #[arg(long, default_value_t = 0)]
    pub training_step: u64,
    /// How long an exec:/python: preprocessor may take to answer one record, e.g. 30s, 10m
    /// (overrides the manifest's dataPipeline.recordTimeout; default 5m).
    #[arg(long, value_name = "DURATION", value_parser = record_timeout_parser)]
    pub record_timeout: Option<std::time::Duration>,
}

/// A duration greater than zero, as manifests write them.
fn record_timeout_parser(text: &str) -> Result<std::time::Duration, String> {
    let timeout = basecamp_api::Duration::parse_flag(text)?;
    if timeout.is_zero() {
        return Err(format!("{text:?}: a preprocessor needs some time to answer; give a duration such as 30s"));
    }
    Ok(timeout)
}

/// `jsonl` or `parquet`, listed in the help and in clap's error for another word.
fn format_parser() -> impl clap::builder::TypedValueParser<Value = DataFormat> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(DataFormat::NAMES)
        .map(|name| name.parse::<DataFormat>().expect("every possible value is a format"))
}

pub fn run(command: DataCommand) -> Result<ExitCode> {
    let DataCommand::Preprocess(args) = command;
    preprocess(&args)
}

/// What the flags and (optionally) the manifests settle.
struct Settings {
    preprocessor: Preprocessor,
    batch_size: usize,
    format: DataFormat,
    calculator: Option<RewardCalculator>,
    /// The working directory (and `PYTHONPATH` entry) of a user preprocessor.
    workdir: PathBuf,
    /// How long a user preprocessor may take to answer one record.
    record_timeout: std::time::Duration,
    inputs: Vec<String>,
    version: Option<String>,
}

fn settings(args: &PreprocessArgs) -> Result<Settings> {
    let (mut name, mut batch, mut calculator, mut workdir) = (None, None, None, std::env::current_dir()?);
    let (mut source, mut version, mut format, mut record_timeout) = (None, None, None, None);
    if !args.config.is_empty() {
        let base_dir = args.base_dir.as_deref().map(absolute_dir).transpose().map_err(|e| anyhow!("{e}"))?;
        let (manifests, _) = load_manifests_in(&args.config, base_dir.as_deref()).map_err(|e| anyhow!("{e}"))?;
        let loaded = select_task(&manifests, args.task.as_deref()).map_err(|e| anyhow!("{e}"))?;
        let task = &loaded.object;
        workdir = base_dir.unwrap_or_else(|| loaded.base_dir());
        if let Some(pipeline) = &task.spec.data_pipeline {
            name = pipeline.preprocessor.clone();
            batch = pipeline.batch_size;
            version = pipeline.version.clone();
            format = pipeline.format;
            record_timeout = Some(pipeline.record_timeout());
            // A local source is relative to the manifest, as the test set is.
            source = Some(match pipeline.source.as_str() {
                s3 if s3.starts_with("s3://") => s3.to_string(),
                path => workdir.join(path).display().to_string(),
            });
        }
        let variant =
            resolve_variants(&manifests, task, args.variant.as_deref()).map_err(|e| anyhow!("{e}"))?.remove(0);
        calculator = reward_calculator(&variant.sandbox).map_err(|e| anyhow!("{e}"))?.map(|(c, _)| c);
    }
    let inputs = match (args.inputs.is_empty(), source) {
        (false, _) => args.inputs.clone(),
        (true, Some(source)) => vec![source],
        (true, None) if args.config.is_empty() => {
            bail!(
                "name the traces to preprocess (files, directories, s3:// prefixes), or give --config with a task whose spec.dataPipeline.source names them"
            )
        }
        (true, None) => bail!(
            "the task has no spec.dataPipeline.source; name the traces to preprocess (files, directories, s3:// prefixes)"
        ),
    };
    let name = args.preprocessor.clone().or(name).unwrap_or_else(|| "builtin:trajectory".into());
    Ok(Settings {
        preprocessor: parse_preprocessor(&name)?,
        // Both are at least 1: the flag's parser and the manifest's validation refuse 0.
        batch_size: args.batch_size.or(batch).unwrap_or(64) as usize,
        format: args.format.or(format).unwrap_or_default(),
        calculator,
        workdir,
        record_timeout: args.record_timeout.or(record_timeout).unwrap_or(DEFAULT_RECORD_TIMEOUT),
        inputs,
        version: args.version.clone().or(version),
    })
}

/// Writes rows into numbered batch files of one format.
struct Batches {
    dir: PathBuf,
    /// The `dataset.json` an earlier run may have left, removed before the
    /// first batch file replaces one of its batches: it would mark a
    /// half-rewritten directory complete. A run that fails before that
    /// leaves the earlier dataset as it was.
    marker: PathBuf,
    size: usize,
    format: DataFormat,
    /// Parquet files carry it as key/value metadata.
    metadata: Vec<(String, String)>,
    in_current: usize,
    files: Vec<PathBuf>,
    current: Option<BatchFile>,
    rows: usize,
    /// Rows whose episode has no end, so no known reward ([`Row::truncated`]).
    truncated_rows: usize,
}

/// The batch being written, as its format encodes it.
enum BatchFile {
    /// Streamed: one JSON object a line.
    Jsonl(std::io::BufWriter<std::fs::File>),
    /// Held until the batch is full, then written as one row group.
    Parquet(ParquetBatch),
}

impl BatchFile {
    fn create(format: DataFormat, path: &Path) -> Result<Self> {
        let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(match format {
            DataFormat::Jsonl => Self::Jsonl(std::io::BufWriter::new(file)),
            DataFormat::Parquet => Self::Parquet(ParquetBatch::new(file)),
        })
    }

    fn push(&mut self, row: &Row) -> Result<()> {
        match self {
            Self::Jsonl(out) => {
                serde_json::to_writer(&mut *out, row)?;
                out.write_all(b"\n")?;
            }
            Self::Parquet(batch) => batch.push(row)?,
        }
        Ok(())
    }

    fn finish(self, path: &Path, metadata: &[(String, String)]) -> Result<()> {
        match self {
            Self::Jsonl(mut out) => out.flush(),
            Self::Parquet(batch) => batch.finish(metadata).map_err(std::io::Error::other),
        }
        .with_context(|| format!("cannot write {}", path.display()))
    }
}

impl Batches {
    fn new(dir: PathBuf, marker: PathBuf, settings: &Settings, training_step: u64) -> Self {
        let mut metadata = vec![
            ("basecamp.source".to_string(), settings.inputs.join(", ")),
            ("basecamp.preprocessor".to_string(), settings.preprocessor.to_string()),
            ("basecamp.trainingStep".to_string(), training_step.to_string()),
        ];
        metadata.extend(settings.version.clone().map(|v| ("basecamp.version".to_string(), v)));
        Self {
            dir,
            marker,
            size: settings.batch_size,
            format: settings.format,
            metadata,
            in_current: 0,
            files: Vec::new(),
            current: None,
            rows: 0,
            truncated_rows: 0,
        }
    }

    fn push(&mut self, row: &Row) -> Result<()> {
        if self.current.is_none() || self.in_current == self.size {
            if self.files.is_empty() {
                match std::fs::remove_file(&self.marker) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(e).with_context(|| format!("cannot remove the old {}", self.marker.display()));
                    }
                    _ => {}
                }
            }
            self.finish()?;
            let path = self.dir.join(format!("batch-{:05}.{}", self.files.len(), self.format.extension()));
            self.current = Some(BatchFile::create(self.format, &path)?);
            self.files.push(path);
            self.in_current = 0;
        }
        self.current.as_mut().expect("opened above").push(row)?;
        self.in_current += 1;
        self.rows += 1;
        self.truncated_rows += usize::from(row.truncated);
        Ok(())
    }

    /// Finishes the batch being written, if any.
    fn finish(&mut self) -> Result<()> {
        match (self.current.take(), self.files.last()) {
            (Some(last), Some(path)) => last.finish(path, &self.metadata),
            _ => Ok(()),
        }
    }

    fn names(&self) -> Vec<String> {
        self.files.iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect()
    }
}

/// Where the dataset goes, and where it is written first.
enum Output {
    Local(PathBuf),
    /// Staged in `staging` (batches in `staging/batches/`), then uploaded.
    S3 {
        destination: Destination,
        staging: PathBuf,
    },
}

impl Output {
    fn new(out: &str) -> Result<Self> {
        // Parsed either way: `S3://b/x` or `gs://b/x` is refused, not made a local directory.
        let destination = Destination::parse_prefix(out)?;
        if !destination.is_s3() {
            return Ok(Self::Local(PathBuf::from(out)));
        }
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
        let staging = std::env::temp_dir().join(format!("basecamp-dataset-{}-{nanos}", std::process::id()));
        Ok(Self::S3 { destination, staging })
    }

    /// The directory batch files are written to.
    fn batch_dir(&self) -> PathBuf {
        match self {
            Self::Local(dir) => dir.clone(),
            Self::S3 { staging, .. } => staging.join("batches"),
        }
    }

    /// Where `dataset.json` is written locally.
    fn dataset_file(&self) -> PathBuf {
        match self {
            Self::Local(dir) => dir.join(DATASET_FILE),
            Self::S3 { staging, .. } => staging.join(DATASET_FILE),
        }
    }

    fn display(&self) -> String {
        match self {
            Self::Local(dir) => dir.display().to_string(),
            Self::S3 { destination, .. } => format!("{destination}/"),
        }
    }
}

fn preprocess(args: &PreprocessArgs) -> Result<ExitCode> {
    let settings = settings(args)?;
    let output = Output::new(&args.out)?;
    let sources = Sources::resolve(&settings.inputs)?;
    if sources.items.is_empty() {
        bail!("no .trace files under {}", settings.inputs.join(", "));
    }
    let batch_dir = output.batch_dir();
    crate::create_out_dir(&batch_dir)?;
    let mut batches = Batches::new(batch_dir, output.dataset_file(), &settings, args.training_step);
    let mut process: Option<Subprocess> = None;
    let (mut skipped, mut partial) = (Vec::new(), Vec::new());
    // Episodes that ended, by the agent, without a reward signal: their
    // rows are not truncated, yet their reward is no score either.
    let mut unrewarded: Vec<&str> = Vec::new();
    for source in &sources.items {
        let contents = match read_for_rows(&sources, source)? {
            Ok(contents) => contents,
            Err(why) => {
                skipped.push(why);
                continue;
            }
        };
        let records = raw_records(&contents, settings.calculator.as_ref(), args.training_step)?;
        if let Some(damage) = contents.damage() {
            // Nothing finished before the damage: skipped, as one that is not a trace.
            let said = incomplete(source, damage);
            if records.is_empty() {
                skipped.push(said);
                continue;
            }
            partial.push(format!("{said}; {}", rows_kept(&records, unfinished_step(&contents))));
        }
        let ended_by_the_agent = records.first().is_some_and(|r| r["truncated"] == false);
        if ended_by_the_agent && records.iter().all(|r| r.get("episode_reward").is_none()) {
            unrewarded.push(&source.name);
        }
        for record in &records {
            let row = match &settings.preprocessor {
                Preprocessor::Trajectory => trajectory_row(record),
                other => match process.as_mut() {
                    Some(process) => process.call(record)?,
                    None => {
                        // Preflight: import/start and check the shape on the first record (its row).
                        let timeout = settings.record_timeout;
                        let (started, row) = Subprocess::preflight(other, &settings.workdir, timeout, record)?;
                        process = Some(started);
                        row
                    }
                },
            };
            batches.push(&row)?;
        }
    }
    batches.finish()?;
    if batches.rows == 0 {
        // An empty dataset.json would mark a dataset complete that a trainer cannot train on.
        let why = if skipped.is_empty() {
            format!("none of the {} traces has a finished step", sources.items.len())
        } else {
            format!(
                "{} of the {} traces could not be read: {}",
                skipped.len(),
                sources.items.len(),
                skipped_list(&skipped)
            )
        };
        bail!("no rows to write to {}: {why}; {DATASET_FILE} was not written", output.display());
    }
    if let Output::Local(dir) = &output {
        let removed = remove_stale_batches(dir, &batches.names())?;
        if removed > 0 {
            basecamp_sandbox::stderr_line!(
                "note: removed {removed} batch file(s) of an earlier run from {}",
                dir.display()
            );
        }
    }
    let traces = sources.items.len() - skipped.len();
    let dataset = serde_json::json!({
        "source": settings.inputs.join(", "),
        "version": settings.version,
        "preprocessor": settings.preprocessor.to_string(),
        "format": settings.format.name(),
        "batchSize": settings.batch_size,
        "rows": batches.rows,
        "truncatedRows": batches.truncated_rows,
        "unrewardedEpisodes": unrewarded.len(),
        "traces": traces,
        "batches": batches.names(),
        "skipped": skipped,
        "partial": partial,
        "trainingStep": args.training_step,
        "createdAt": utc_now_rfc3339()?,
    });
    let dataset_file = output.dataset_file();
    std::fs::write(&dataset_file, serde_json::to_vec_pretty(&dataset)?)
        .with_context(|| format!("cannot write {}", dataset_file.display()))?;
    if let Output::S3 { destination, staging } = &output {
        upload(&batches, staging, destination)?;
        // Only a complete upload removes the staged copy.
        let _ = std::fs::remove_dir_all(staging);
    }
    for line in &skipped {
        basecamp_sandbox::stderr_line!("skipped {line}");
    }
    for line in &partial {
        basecamp_sandbox::stderr_line!("partial {line}");
    }
    if let Some(first) = unrewarded.first() {
        basecamp_sandbox::stderr_line!(
            "warning: {} of {traces} episodes ended without a reward signal (no `rewards` in their SandboxConfig, or \
             the reward could not be computed: their shard's summary.json says why), the first: {first}; their rows \
             are not truncated, and their reward ({}) is not a score",
            unrewarded.len(),
            match settings.preprocessor {
                Preprocessor::Trajectory => "0 from builtin:trajectory",
                _ => "what the preprocessor made without episode_reward",
            }
        );
    }
    let truncated = match batches.truncated_rows {
        0 => String::new(),
        n => format!(" ({n} truncated: cut off, or ended by the policy or a service; no episode reward)"),
    };
    writeln!(
        std::io::stdout(),
        "{} rows{truncated} from {traces} traces in {} {} batch(es) of up to {} -> {}",
        batches.rows,
        batches.files.len(),
        settings.format,
        settings.batch_size,
        output.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// What rows are made of (plan steps, memory deltas, rewards: the token
/// logits are neither decoded nor, in their own frames, decompressed), read
/// through the trace commands' one reader ([`Sources::open`]). A trace that
/// cannot be read (a file's or an object's I/O, however far in) is an error:
/// the dataset would silently lack it. One that is not a trace is
/// `Ok(Err(why))`, skipped and listed by the caller; a damaged one is its
/// records before the damage (the caller keeps the rows of its finished
/// steps, [`unfinished_step`], and lists it).
fn read_for_rows(sources: &Sources, source: &Source) -> Result<Result<TraceContents, String>, TraceError> {
    let contents = match sources.open(source) {
        Ok(reader) => reader.without(&[RecordKind::TokenLogit]).into_contents(),
        Err(e @ TraceError::Io { .. }) => return Err(e),
        Err(e) => return Ok(Err(e.to_string())),
    };
    match contents.damage() {
        Some(e @ TraceError::Io { .. }) => Err(e.clone()),
        _ => Ok(Ok(contents)),
    }
}

/// "F: incomplete (truncated at byte N: ...)": the damage names the trace
/// itself, which is said once.
fn incomplete(source: &Source, damage: &TraceError) -> String {
    let damage = damage.to_string();
    let why = damage.strip_prefix(&format!("{}: ", source.name)).unwrap_or(&damage);
    format!("{}: incomplete ({why})", source.name)
}

/// Which rows of a damaged trace were kept and which step was left out.
fn rows_kept(records: &[serde_json::Value], unfinished: Option<u32>) -> String {
    let steps: std::collections::BTreeSet<u64> = records.iter().filter_map(|r| r["step"].as_u64()).collect();
    let range = match (steps.first(), steps.last()) {
        (Some(first), Some(last)) if first != last => format!("steps {first}-{last}"),
        (Some(first), _) => format!("step {first}"),
        _ => "no step".to_string(),
    };
    let left_out = match unfinished {
        Some(step) => format!("; step {step}, cut off before it finished, is left out"),
        None => String::new(),
    };
    format!("the {} rows of its finished {range} are kept{left_out}", records.len())
}

/// The first [`FAILURES_SHOWN`] skipped traces, the rest counted: the
/// message stays short enough for a pod's termination message.
fn skipped_list(skipped: &[String]) -> String {
    let mut list = skipped.iter().take(FAILURES_SHOWN).cloned().collect::<Vec<_>>().join("; ");
    if skipped.len() > FAILURES_SHOWN {
        list.push_str(&format!("; ... and {} more", skipped.len() - FAILURES_SHOWN));
    }
    list
}

/// `batch-00000.jsonl` / `batch-00000.parquet`: the names this command writes.
fn is_batch_name(name: &str) -> bool {
    let Some((digits, extension)) = name.strip_prefix("batch-").and_then(|rest| rest.split_once('.')) else {
        return false;
    };
    digits.len() >= 5 && digits.bytes().all(|b| b.is_ascii_digit()) && matches!(extension, "jsonl" | "parquet")
}

/// Removes the batch files in `dir` that this run did not write (an earlier,
/// larger run's): a reader of the whole directory (`pyarrow.parquet.read_table(dir)`)
/// would otherwise get them too. Nothing else in `dir` is touched.
fn remove_stale_batches(dir: &Path, written: &[String]) -> Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_batch_name(&name) && !written.contains(&name) {
            std::fs::remove_file(entry.path()).with_context(|| format!("cannot remove {}", entry.path().display()))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Uploads the batches, then — only when every one arrived — `dataset.json`.
fn upload(batches: &Batches, staging: &Path, destination: &Destination) -> Result<()> {
    let (runtime, storage) = s3_client()?;
    // An earlier run's dataset.json would mark the prefix complete while its batches are
    // being replaced, and still after a batch failed to arrive: it goes first.
    let target = destination.join(DATASET_FILE)?;
    if let Some(Err(e)) =
        runtime.block_on(storage.delete_objects(std::slice::from_ref(&target))).pop().map(|d| d.result)
    {
        bail!(
            "failed to upload the dataset to {destination}/: the earlier run's {DATASET_FILE} could not be removed, \
             so no batch was uploaded; the local copies are in {}\n  {e}",
            staging.display()
        );
    }
    let report = runtime.block_on(storage.upload_dir(&batches.dir, destination));
    if !report.is_complete() {
        let failed: Vec<_> = report.failed().collect();
        let mut message = format!(
            "failed to upload the dataset to {destination}/: {} of {} batch files did not arrive, so {DATASET_FILE} \
             was not written and the dataset is incomplete; the local copies are in {}",
            failed.len(),
            report.files.len(),
            staging.display()
        );
        for (_, err) in failed.iter().take(FAILURES_SHOWN) {
            message.push_str(&format!("\n  {err}"));
        }
        if failed.len() > FAILURES_SHOWN {
            message.push_str(&format!("\n  ... and {} more", failed.len() - FAILURES_SHOWN));
        }
        bail!(message);
    }
    // An earlier, larger run's batch objects under the prefix go, as in a local directory.
    let written = batches.names();
    let listed = runtime.block_on(storage.list(destination)).with_context(|| format!("cannot list {destination}/"))?;
    let stale: Vec<Destination> = listed
        .into_iter()
        .filter(|o| is_batch_name(&o.relative) && !written.contains(&o.relative))
        .map(|o| o.location)
        .collect();
    if !stale.is_empty() {
        let deletions = runtime.block_on(storage.delete_objects(&stale));
        let failed: Vec<String> =
            deletions.iter().filter_map(|d| d.result.as_ref().err().map(|e| e.to_string())).collect();
        if let Some(first) = failed.first() {
            bail!(
                "cannot remove {} batch object(s) of an earlier run from {destination}/, so {DATASET_FILE} was not \
                 written: {first}",
                failed.len()
            );
        }
        basecamp_sandbox::stderr_line!(
            "note: removed {} batch object(s) of an earlier run from {destination}/",
            stale.len()
        );
    }
    runtime.block_on(storage.upload_file(&staging.join(DATASET_FILE), &target)).into_result().map_err(|e| {
        anyhow!(
            "failed to upload {target}, which marks the dataset complete: {e}; the {} batches are uploaded, the local copies are in {}",
            report.files.len(),
            staging.display()
        )
    })?;
    Ok(())
}

/// `2026-11-30T07:41:15Z`.
fn utc_now_rfc3339() -> Result<String> {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default() as i64;
    let date = UtcDate::from_unix_seconds(seconds)?;
    let time = seconds.rem_euclid(86_400);
    Ok(format!("{date}T{:02}:{:02}:{:02}Z", time / 3600, time % 3600 / 60, time % 60))
}
