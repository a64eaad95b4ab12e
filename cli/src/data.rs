//! `basecamp data preprocess`: traces into training data — `(state, action,
//! reward)` rows as JSON Lines in batches of `dataPipeline.batchSize` — with
//! the task's preprocessor (`builtin:trajectory`, `exec:...`,
//! `python:module.function`; see `basecamp_sandbox::preprocess`). With
//! `--config`, the preprocessor, batch size and the reward weights (the
//! sandbox's own calculator, at `--training-step`) come from the manifests.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use basecamp_sandbox::config::reward_calculator;
use basecamp_sandbox::preprocess::{Preprocessor, Row, Subprocess, raw_records, trajectory_row};
use basecamp_sandbox::rewards::RewardCalculator;
use basecamp_sandbox::run::{load_manifests, resolve_variants, select_task};
use basecamp_trace::inputs::{TRACE_SUFFIX, expand_inputs};

#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Turn traces (files or directories) into (state, action, reward) JSONL batches.
    Preprocess(PreprocessArgs),
}

#[derive(clap::Args, Debug)]
pub struct PreprocessArgs {
    /// Trace files or directories (searched recursively for *.trace).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Where the batches go: DIR/batch-00000.jsonl, ... and DIR/dataset.json.
    #[arg(long, short)]
    pub out: PathBuf,
    /// The HarnessTask manifests: preprocessor, batch size and reward weights come from them.
    #[arg(long = "config")]
    pub config: Vec<PathBuf>,
    /// The variant whose SandboxConfig scores rewards (default: the first).
    #[arg(long)]
    pub variant: Option<String>,
    /// builtin:trajectory, exec:PROGRAM ARGS..., or python:module.function (overrides the manifest).
    #[arg(long)]
    pub preprocessor: Option<String>,
    /// Rows per batch file (overrides the manifest's dataPipeline.batchSize; default 64).
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// The training step whose reward weights apply.
    #[arg(long, default_value_t = 0)]
    pub training_step: u64,
}

pub fn run(command: DataCommand) -> Result<ExitCode> {
    let DataCommand::Preprocess(args) = command;
    preprocess(&args)
}

/// Preprocessor, batch size, reward calculator and working directory from
/// the flags and (optionally) the manifests.
fn settings(args: &PreprocessArgs) -> Result<(Preprocessor, usize, Option<RewardCalculator>, PathBuf)> {
    let (mut name, mut batch, mut calculator, mut workdir) = (None, None, None, std::env::current_dir()?);
    if !args.config.is_empty() {
        let (manifests, _) = load_manifests(&args.config).map_err(|e| anyhow!("{e}"))?;
        let loaded = select_task(&manifests, None).map_err(|e| anyhow!("{e}"))?;
        let task = &loaded.object;
        workdir = loaded.base_dir();
        if let Some(pipeline) = &task.spec.data_pipeline {
            name = pipeline.preprocessor.clone();
            batch = pipeline.batch_size;
        }
        let variant =
            resolve_variants(&manifests, task, args.variant.as_deref()).map_err(|e| anyhow!("{e}"))?.remove(0);
        calculator = reward_calculator(&variant.sandbox).map_err(|e| anyhow!("{e}"))?.map(|(c, _)| c);
    }
    let name = args.preprocessor.clone().or(name).unwrap_or_else(|| "builtin:trajectory".into());
    let preprocessor: Preprocessor = name.parse()?;
    let batch = args.batch_size.or(batch).unwrap_or(64).max(1) as usize;
    Ok((preprocessor, batch, calculator, workdir))
}

/// Writes rows into numbered batch files.
struct Batches {
    dir: PathBuf,
    size: usize,
    in_current: usize,
    files: Vec<PathBuf>,
    current: Option<std::io::BufWriter<std::fs::File>>,
    rows: usize,
}

impl Batches {
    fn push(&mut self, row: &Row) -> Result<()> {
        if self.current.is_none() || self.in_current == self.size {
            if let Some(mut done) = self.current.take() {
                done.flush()?;
            }
            let path = self.dir.join(format!("batch-{:05}.jsonl", self.files.len()));
            let file = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
            self.current = Some(std::io::BufWriter::new(file));
            self.files.push(path);
            self.in_current = 0;
        }
        let out = self.current.as_mut().expect("opened above");
        serde_json::to_writer(&mut *out, row)?;
        out.write_all(b"\n")?;
        self.in_current += 1;
        self.rows += 1;
        Ok(())
    }
}

fn preprocess(args: &PreprocessArgs) -> Result<ExitCode> {
    let (preprocessor, batch_size, calculator, workdir) = settings(args)?;
    let paths: Vec<String> = args.paths.iter().map(|p| p.display().to_string()).collect();
    let traces = expand_inputs(&paths, TRACE_SUFFIX)?;
    if traces.is_empty() {
        bail!(
            "no .trace files under {}",
            args.paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut batches =
        Batches { dir: args.out.clone(), size: batch_size, in_current: 0, files: Vec::new(), current: None, rows: 0 };
    let mut process: Option<Subprocess> = None;
    let mut skipped = Vec::new();
    for path in &traces {
        let contents = match basecamp_trace::read_trace(path) {
            Ok(c) if c.damage().is_none() => c,
            Ok(c) => {
                skipped.push(format!(
                    "{}: incomplete ({})",
                    path.display(),
                    c.damage().map(|d| d.to_string()).unwrap_or_default()
                ));
                continue;
            }
            Err(e) => {
                skipped.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let records = raw_records(&contents, calculator.as_ref(), args.training_step)?;
        for record in &records {
            let row = match &preprocessor {
                Preprocessor::Trajectory => trajectory_row(record),
                other => {
                    if process.is_none() {
                        // Preflight: import/start and check the shape on the first record.
                        process = Some(Subprocess::preflight(other, &workdir, record)?);
                    }
                    process.as_mut().expect("started above").call(record)?
                }
            };
            batches.push(&row)?;
        }
    }
    if let Some(mut last) = batches.current.take() {
        last.flush()?;
    }
    let manifest = serde_json::json!({
        "preprocessor": preprocessor.to_string(),
        "training_step": args.training_step,
        "batch_size": batch_size,
        "rows": batches.rows,
        "traces": traces.len() - skipped.len(),
        "skipped": skipped,
        "batches": batches.files.iter().map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect::<Vec<_>>(),
    });
    std::fs::write(args.out.join("dataset.json"), serde_json::to_vec_pretty(&manifest)?)?;
    for line in &skipped {
        eprintln!("skipped {line}");
    }
    println!(
        "{} rows from {} traces in {} batch(es) of up to {batch_size} -> {}",
        batches.rows,
        traces.len() - skipped.len(),
        batches.files.len(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
