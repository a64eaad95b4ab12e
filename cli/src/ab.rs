//! `basecamp ab compare A [B]`: two runs (or the two variants of one run)
//! side by side — the metric table with deltas, and how their failures'
//! root causes differ — from the shards' `summary.json` files and traces.
//!
//! `A` and `B` are directories holding shard summaries at any depth (a
//! `basecamp run` variant directory), or `s3://` prefixes where the operator
//! uploads them (`s3://BUCKET/…/<namespace>/<task>/<variant>/`, fetched into a
//! temporary directory first). With only `A`, it must hold exactly two
//! variant subdirectories; the first (by name) is the baseline.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use basecamp_sandbox::driver::{SUMMARY_FILE, ShardSummary};

use crate::run::summary::{Comparison, VariantSummary, columns, compare};
use crate::serve::mirror::TempMirror;

#[derive(clap::Subcommand, Debug)]
pub enum AbCommand {
    /// The A/B table (metric, A, B, delta %) and a root-cause comparison.
    Compare {
        /// The baseline run directory or s3:// prefix (or a run with two variants when B is absent).
        a: PathBuf,
        /// The candidate run directory or s3:// prefix.
        b: Option<PathBuf>,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: AbCommand) -> Result<ExitCode> {
    let AbCommand::Compare { a, b, json } = command;
    // s3:// prefixes are read from temporary copies, removed when `copies` is dropped.
    let mut copies = Vec::new();
    // Each side: where it is read (a copy, for a prefix) and what it is called.
    let mut local = |arg: PathBuf| -> Result<Side> {
        let url = arg.to_str().filter(|a| a.starts_with("s3://")).map(str::to_string);
        let Some(url) = url else {
            return Ok(Side::named_after(arg.clone(), arg.display().to_string()));
        };
        let copy = TempMirror::fetch(&url, "ab")?;
        let dir = copy.mirror.dir.clone();
        copies.push(copy);
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or(&url).to_string();
        Ok(Side { dir, name, shown: url })
    };
    let a = local(a)?;
    let b = b.map(&mut local).transpose()?;
    let (baseline, candidate) = match b {
        Some(b) => (side(&a)?, side(&b)?),
        None => {
            let mut variants: Vec<PathBuf> = std::fs::read_dir(&a.dir)
                .with_context(|| format!("cannot read {}", a.shown))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !summaries_under(p).is_empty())
                .collect();
            variants.sort();
            if variants.len() != 2 {
                bail!(
                    "{} holds {} variant directories with shard summaries; compare two runs with `basecamp ab compare A B`",
                    a.shown,
                    variants.len()
                );
            }
            let variant = |dir: &PathBuf| {
                let shown = match dir.strip_prefix(&a.dir) {
                    Ok(rel) => format!("{}/{}", a.shown.trim_end_matches('/'), rel.display()),
                    Err(_) => dir.display().to_string(),
                };
                side(&Side::named_after(dir.clone(), shown))
            };
            (variant(&variants[0])?, variant(&variants[1])?)
        }
    };
    let comparison = compare(&baseline, &candidate);
    // Written, not print!ed: a closed stdout (`| head`) is an error to return, not a panic.
    let mut stdout = std::io::stdout().lock();
    if json {
        let out = serde_json::json!({ "comparison": comparison, "baseline": baseline, "candidate": candidate });
        writeln!(stdout, "{}", serde_json::to_string_pretty(&out).expect("serialisable"))?;
    } else {
        write!(stdout, "{}", render(&comparison, &baseline, &candidate))?;
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Every `summary.json` under `dir`, sorted.
fn summaries_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == SUMMARY_FILE) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// One side of the comparison.
struct Side {
    /// Where its summaries are read.
    dir: PathBuf,
    /// What the table calls it: the last segment of its path or prefix.
    name: String,
    /// What messages call it: the path or `s3://` URL given.
    shown: String,
}

impl Side {
    fn named_after(dir: PathBuf, shown: String) -> Side {
        let name = dir.file_name().map_or_else(|| shown.clone(), |n| n.to_string_lossy().into_owned());
        Side { dir, name, shown }
    }
}

/// The summaries under a side's directory.
fn side(side: &Side) -> Result<VariantSummary> {
    let dir = side.dir.as_path();
    let files = summaries_under(dir);
    if files.is_empty() {
        bail!(
            "{}: no {SUMMARY_FILE} below this directory; give a `basecamp run` output or a variant directory",
            side.shown
        );
    }
    let mut shards = Vec::new();
    for file in files {
        let text = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let summary: ShardSummary =
            serde_json::from_slice(&text).with_context(|| format!("{} is not a shard summary", file.display()))?;
        let relative = file.parent().and_then(|p| p.strip_prefix(dir).ok()).unwrap_or(Path::new("")).to_path_buf();
        shards.push((summary, relative));
    }
    let sandbox = shards.first().map(|(s, _)| format!("{}/{}", s.task, s.variant)).unwrap_or_default();
    Ok(VariantSummary::from_shards(&side.name, &sandbox, shards, &[], dir))
}

fn render(c: &Comparison, a: &VariantSummary, b: &VariantSummary) -> String {
    let mut out = format!(
        "{} ({} episodes, {} failed) vs {} ({} episodes, {} failed)\n\n",
        b.name, b.aggregate.episodes, b.failed, a.name, a.aggregate.episodes, a.failed
    );
    out.push_str(&c.table());
    // Root causes side by side: each cluster's size in A and in B.
    let mut clusters: BTreeMap<&str, (usize, usize, &str)> = BTreeMap::new();
    for cause in &a.root_causes {
        clusters.entry(&cause.key).or_insert((0, 0, &cause.hint)).0 = cause.episodes;
    }
    for cause in &b.root_causes {
        clusters.entry(&cause.key).or_insert((0, 0, &cause.hint)).1 = cause.episodes;
    }
    if !clusters.is_empty() {
        out.push_str("\nfailure root causes (episodes in each):\n");
        let mut rows = vec![vec!["cause".to_string(), a.name.clone(), b.name.clone()]];
        let mut sorted: Vec<_> = clusters.into_iter().collect();
        sorted.sort_by_key(|(_, (in_a, in_b, _))| std::cmp::Reverse(in_a + in_b));
        for (key, (in_a, in_b, _)) in &sorted {
            rows.push(vec![key.to_string(), in_a.to_string(), in_b.to_string()]);
        }
        out.push_str(&columns(&rows));
        for (_, (in_a, in_b, hint)) in sorted.iter().take(3) {
            let fixed = if *in_b == 0 { format!(" — gone in {}", b.name) } else { String::new() };
            let (who, _) = if in_a >= in_b { (&a.name, in_a) } else { (&b.name, in_b) };
            out.push_str(&format!("  {who}: {hint}{fixed}\n"));
        }
    }
    out
}
