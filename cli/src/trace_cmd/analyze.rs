//! `basecamp trace analyze --logits A.safetensors [B.safetensors]`: per-token
//! top-k log-probabilities, log-sum-exp and entropy of the logits in A, and
//! with B, KL(A || B) per token with its mean and max — what the trace's
//! `token_logit` section and the `logit_divergence` metric are made of.
//!
//! The tensors are memory-mapped (`basecamp_gpu::file`) and read in place,
//! except one whose data is not aligned in the file, which is copied whole
//! (said on stderr, since it costs the file's size in memory); the work runs on
//! the GPU when one is usable (`--device auto`, the default), else on the
//! CPU; under `auto` a GPU run that fails is done again on the CPU (with a
//! warning). Every input error names the file and the tensor.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use basecamp_gpu::file::{FileError, LoadedLogits, LogitsFile};
use basecamp_gpu::logits::Input;
use basecamp_gpu::{Analyzer, BackendError, DeviceChoice, LogitStats};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};

#[derive(Clone, Copy, ValueEnum)]
pub enum DeviceArg {
    /// The GPU when one is usable, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// The GPU, or an error.
    Gpu,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    /// One row per token, then a summary.
    Table,
    /// One JSON document.
    Json,
}

#[derive(Args)]
pub struct AnalyzeArgs {
    /// The logits (2-D [tokens, vocab], or [1, tokens, vocab]; F32 or BF16,
    /// safetensors; `-` for standard input); a second file adds KL(first ||
    /// second) per token.
    #[arg(long = "logits", value_name = "FILE", required = true, num_args = 1..)]
    logits: Vec<PathBuf>,
    /// The tensor to read (default: the file's only tensor, or "logits").
    #[arg(long, value_name = "NAME")]
    tensor: Option<String>,
    /// How many top tokens to list per position (at most 20).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = crate::count::<usize>)]
    top_k: usize,
    /// Where to compute.
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    #[arg(long, short, value_enum, default_value = "table")]
    output: OutputFormat,
}

/// A file, the tensor read from it, and how to name both in messages.
struct Source<'a> {
    file: &'a LogitsFile,
    logits: LoadedLogits<'a>,
}

impl Source<'_> {
    fn label(&self) -> String {
        format!("{} tensor {:?}", self.file.path().display(), self.logits.name)
    }
}

pub fn run(args: &AnalyzeArgs) -> anyhow::Result<ExitCode> {
    // Counted here, not by clap: `--logits a --logits b --logits c` passed
    // its per-flag bound and the third file was ignored without a word.
    if args.logits.len() > 2 {
        let given: Vec<String> = args.logits.iter().map(|p| p.display().to_string()).collect();
        bail!(
            "--logits takes one file, or two for KL(first || second) per token; got {}: {}",
            given.len(),
            given.join(", ")
        );
    }
    if args.logits.iter().filter(|path| path.as_os_str() == "-").count() > 1 {
        anyhow::bail!("--logits: only one of the files can be `-` (standard input)");
    }
    let files = args
        .logits
        .iter()
        .map(|path| LogitsFile::open(if path.as_os_str() == "-" { Path::new("/dev/stdin") } else { path }))
        .collect::<Result<Vec<_>, _>>()?;
    let sources = files
        .iter()
        .map(|file| {
            let logits = file.logits(args.tensor.as_deref()).map_err(|e| match e {
                FileError::AmbiguousTensor { .. } => anyhow::anyhow!("{e}: pick one with --tensor"),
                e => e.into(),
            })?;
            Ok(Source { file, logits })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for source in sources.iter().filter(|s| !s.logits.zero_copy()) {
        let bytes = source.logits.view().map_or(0, |v| v.bytes());
        basecamp_sandbox::stderr_line!(
            "note: {}: its data is not aligned to its element size in the file, so all {bytes} bytes are copied into \
             memory rather than read in place (the safetensors library's writers align it)",
            source.label()
        );
    }
    let p = &sources[0];
    let q = sources.get(1);
    if let Some(q) = q
        && q.logits.shape != p.logits.shape
    {
        bail!(
            "{} has shape {:?} but {} has shape {:?}: KL needs logits of the same shape",
            p.label(),
            p.logits.shape,
            q.label(),
            q.logits.shape
        );
    }
    let p_view = p.logits.view().with_context(|| p.label())?;
    let q_view = q.map(|q| q.logits.view().with_context(|| q.label())).transpose()?;

    let mut analyzer = Analyzer::new(match args.device {
        DeviceArg::Auto => DeviceChoice::Auto,
        DeviceArg::Cpu => DeviceChoice::Cpu,
        DeviceArg::Gpu => DeviceChoice::Gpu,
    })?;
    let mut result = analyzer.analyze(p_view, q_view, args.top_k);
    // `auto` promises an answer: a GPU that fails mid-run (not bad input) hands over to the CPU.
    if let (DeviceArg::Auto, Err(BackendError::Gpu(gpu_error))) = (args.device, &result) {
        basecamp_sandbox::stderr_line!("warning: the GPU run failed, analysing on the CPU instead: {gpu_error}");
        analyzer = Analyzer::new(DeviceChoice::Cpu)?;
        result = analyzer.analyze(p_view, q_view, args.top_k);
    }
    let stats = result.map_err(|e| match &e {
        // Name the file the bad value is in.
        BackendError::Logits(error) if error.input().is_some() => {
            let source = if error.input() == Some(Input::Q) { q.unwrap_or(p) } else { p };
            anyhow::anyhow!("{}: {e}", source.label())
        }
        _ => anyhow::Error::new(e),
    })?;

    // Buffered: a line per token would be a write(2) per line.
    let mut out = io::BufWriter::new(io::stdout().lock());
    let backend = analyzer.backend().to_string();
    let written = match args.output {
        OutputFormat::Json => {
            let doc = to_json(&sources, &stats, &backend, analyzer.fallback_reason());
            serde_json::to_writer_pretty(&mut out, &doc).map_err(io::Error::from).and_then(|()| writeln!(out))
        }
        OutputFormat::Table => write_table(&mut out, &sources, &stats, &backend, analyzer.fallback_reason()),
    };
    // A closed pipe (`| head`) ends the command quietly in main.
    written.and_then(|()| out.flush()).context("cannot write the analysis to stdout")?;
    Ok(ExitCode::SUCCESS)
}

/// JSON has no infinity: +inf (a KL) is written as the string "inf", -inf
/// (a finite logit's log-probability beyond float range) as "-inf".
fn number(v: f32) -> Value {
    match v {
        f32::INFINITY => json!("inf"),
        f32::NEG_INFINITY => json!("-inf"),
        v => json!(v),
    }
}

struct KlSummary {
    mean_finite: Option<f64>,
    max: Option<(usize, f32)>,
    infinite: usize,
}

fn kl_summary(kl: &[f32]) -> KlSummary {
    let finite: Vec<f64> = kl.iter().filter(|v| v.is_finite()).map(|&v| f64::from(v)).collect();
    let max = kl.iter().copied().enumerate().fold(None, |best: Option<(usize, f32)>, (i, v)| match best {
        Some((_, b)) if b >= v => best,
        _ => Some((i, v)),
    });
    KlSummary {
        mean_finite: (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64),
        max,
        infinite: kl.len() - finite.len(),
    }
}

fn to_json(sources: &[Source<'_>], stats: &LogitStats, backend: &str, fallback: Option<&str>) -> Value {
    let tokens: Vec<Value> = (0..stats.rows())
        .map(|row| {
            let t = stats.token(row);
            let top: Vec<Value> = t
                .top_ids
                .iter()
                .zip(&t.top_logprobs)
                .map(|(&id, &logprob)| json!({ "id": id, "logprob": number(logprob) }))
                .collect();
            let mut token = json!({ "position": row, "logsumexp": t.logsumexp, "entropy": t.entropy, "top": top });
            if let Some(kl) = t.kl {
                token["kl"] = number(kl);
            }
            token
        })
        .collect();
    let entropy = stats.entropy();
    let mut summary = json!({
        "tokens": stats.rows(),
        "entropy_mean": if entropy.is_empty() { Value::Null } else {
            json!(entropy.iter().map(|&v| f64::from(v)).sum::<f64>() / entropy.len() as f64)
        },
    });
    if let Some(kl) = stats.kl() {
        let s = kl_summary(kl);
        summary["kl_mean"] = s.mean_finite.map_or(Value::Null, |m| json!(m));
        summary["kl_max"] = s.max.map_or(Value::Null, |(_, v)| number(v));
        summary["kl_max_position"] = s.max.map_or(Value::Null, |(i, _)| json!(i));
        summary["kl_infinite"] = json!(s.infinite);
    }
    let inputs: Vec<Value> = sources
        .iter()
        .map(|s| {
            json!({
                "file": s.file.path().display().to_string(),
                "tensor": s.logits.name,
                "shape": s.logits.shape,
                "dtype": s.logits.view().map(|v| v.dtype().to_string()).unwrap_or_default(),
            })
        })
        .collect();
    json!({
        "inputs": inputs,
        "backend": backend,
        "fallback_reason": fallback,
        "top_k": stats.k(),
        "tokens": tokens,
        "summary": summary,
    })
}

fn write_table(
    out: &mut impl Write,
    sources: &[Source<'_>],
    stats: &LogitStats,
    backend: &str,
    fallback: Option<&str>,
) -> io::Result<()> {
    for (letter, s) in ["A", "B"].iter().zip(sources) {
        let dtype = s.logits.view().map(|v| v.dtype().to_string()).unwrap_or_default();
        writeln!(out, "{letter}: {} {:?} {dtype}", s.label(), s.logits.shape)?;
    }
    match fallback {
        Some(why) => writeln!(out, "backend: {backend} (no GPU: {why})")?,
        None => writeln!(out, "backend: {backend}")?,
    }
    let with_kl = stats.kl().is_some();
    writeln!(
        out,
        "{:>6}  {:>10}  {:>9}  {:>8}{}  top-{} (id:logprob)",
        "pos",
        "logsumexp",
        "entropy",
        "top1 lp",
        if with_kl { format!("  {:>10}", "KL(A||B)") } else { String::new() },
        stats.k()
    )?;
    for row in 0..stats.rows() {
        let t = stats.token(row);
        let top: Vec<String> = t.top_ids.iter().zip(&t.top_logprobs).map(|(id, lp)| format!("{id}:{lp:.4}")).collect();
        let top1 = t.top_logprobs.first().map_or("-".to_string(), |lp| format!("{lp:.4}"));
        let kl = t.kl.map_or(String::new(), |kl| format!("  {kl:>10.3e}"));
        writeln!(out, "{row:>6}  {:>10.4}  {:>9.4}  {top1:>8}{kl}  {}", t.logsumexp, t.entropy, top.join(" "))?;
    }
    let entropy = stats.entropy();
    let mean = match entropy.len() {
        0 => "-".to_string(),
        n => format!("{:.4}", entropy.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64),
    };
    writeln!(out, "tokens: {}  mean entropy: {mean} nats", stats.rows())?;
    if let Some(kl) = stats.kl() {
        let s = kl_summary(kl);
        let mean = s.mean_finite.map_or("-".to_string(), |m| format!("{m:.6e}"));
        let max = s.max.map_or("-".to_string(), |(i, v)| format!("{v:.6e} at position {i}"));
        writeln!(out, "KL(A||B) nats: mean of finite {mean}  max {max}  infinite {}", s.infinite)?;
    }
    Ok(())
}
