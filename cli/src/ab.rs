//! `basecamp ab compare A [B]`: two runs (or the two variants of one run)
//! side by side — the metric table with deltas, and how their failures'
//! root causes differ — from the shards' `summary.json` files and traces.
//!
//! `A` and `B` are directories holding shard summaries at any depth (a
//! `basecamp run` variant directory), or `s3://` prefixes where the operator
//! uploads them (`s3://BUCKET/…/<namespace>/<task>/<variant>/`, fetched into a
//! temporary directory first). Each side must hold one variant's shards
//! (what their summaries say, not how the directories are named); each
//! shard once. With only `A`, it must hold the shards of exactly two
//! variants; the first (by name) is the baseline.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use basecamp_sandbox::driver::{SUMMARY_FILE, ShardSummary};

use crate::run::analysis::RootCause;
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
        Some(b) => {
            let (a_name, b_name) = column_names(&a.shown, &b.shown);
            (one_variant(&Side { name: a_name, ..a })?, one_variant(&Side { name: b_name, ..b })?)
        }
        None => two_variants(&a)?,
    };
    for line in episode_set_warnings(&baseline, &candidate) {
        basecamp_sandbox::stderr_line!("warning: {line}");
    }
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

/// What makes the deltas compare unlike things: episodes one side ran and
/// the other did not (another test set, a missing shard), and runs stopped
/// before every episode finished.
fn episode_set_warnings(a: &VariantSummary, b: &VariantSummary) -> Vec<String> {
    fn ids(v: &VariantSummary) -> BTreeSet<&str> {
        v.episodes.iter().map(|e| e.id.as_str()).collect()
    }
    let (in_a, in_b) = (ids(a), ids(b));
    let (only_a, only_b) = (in_a.difference(&in_b).count(), in_b.difference(&in_a).count());
    let mut lines = Vec::new();
    if only_a + only_b > 0 {
        lines.push(format!(
            "the two sides ran different episodes: {only_a} of {}'s {} are not in {}, {only_b} of {}'s {} are not in {}",
            a.name,
            in_a.len(),
            b.name,
            b.name,
            in_b.len(),
            a.name
        ));
    }
    for v in [a, b] {
        if !v.interrupted.is_empty() || !v.not_started.is_empty() {
            lines.push(format!(
                "{} was stopped early: {} episode(s) cut off and {} not started are not compared",
                v.name,
                v.interrupted.len(),
                v.not_started.len()
            ));
        }
    }
    lines
}

/// Every `summary.json` under `dir`, sorted.
pub(crate) fn summaries_under(dir: &Path) -> Vec<PathBuf> {
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

/// The segments of a side as given: a path's, or an `s3://` URL's.
fn segments(shown: &str) -> Vec<&str> {
    shown.split('/').filter(|s| !s.is_empty() && *s != ".").collect()
}

/// What the table calls two sides: the last segment of each path or
/// prefix, or as many trailing segments as tell them apart (`runs/x/a` and
/// `runs/y/a` are `x/a` and `y/a`); the paths as given when none do.
fn column_names(a: &str, b: &str) -> (String, String) {
    let (a_segments, b_segments) = (segments(a), segments(b));
    let suffix = |segments: &[&str], n: usize| segments[segments.len().saturating_sub(n)..].join("/");
    for n in 1..=a_segments.len().max(b_segments.len()) {
        let (a_name, b_name) = (suffix(&a_segments, n), suffix(&b_segments, n));
        if a_name != b_name && !a_name.is_empty() && !b_name.is_empty() {
            return (a_name, b_name);
        }
    }
    (a.to_string(), b.to_string())
}

/// One side of the comparison.
struct Side {
    /// Where its summaries are read.
    dir: PathBuf,
    /// What the table calls it: the last segment of its path or prefix (see [`column_names`]).
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

/// A shard summary under a side's directory, and the directory it is in.
struct Shard {
    summary: ShardSummary,
    dir: PathBuf,
    file: PathBuf,
}

impl Shard {
    /// The variant it belongs to: namespace, task, variant.
    fn variant(&self) -> (&str, &str, &str) {
        (&self.summary.namespace, &self.summary.task, &self.summary.variant)
    }
}

/// Every shard summary under a side's directory, each shard of a variant once.
fn shards_of(side: &Side) -> Result<Vec<Shard>> {
    match std::fs::metadata(&side.dir) {
        Err(e) => bail!("{}: {e}", side.shown),
        Ok(meta) if !meta.is_dir() => bail!(
            "{}: is a file; give a `basecamp run` output or a variant directory (one holding shard {SUMMARY_FILE} files)",
            side.shown
        ),
        Ok(_) => {}
    }
    let files = summaries_under(&side.dir);
    if files.is_empty() {
        bail!(
            "{}: no {SUMMARY_FILE} below this directory; give a `basecamp run` output or a variant directory",
            side.shown
        );
    }
    let mut shards: Vec<Shard> = Vec::new();
    for file in files {
        let text = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let summary: ShardSummary =
            serde_json::from_slice(&text).with_context(|| format!("{} is not a shard summary", file.display()))?;
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let shard = Shard { summary, dir, file };
        if let Some(same) =
            shards.iter().find(|s| s.variant() == shard.variant() && s.summary.shard == shard.summary.shard)
        {
            bail!(
                "{}: shard {} of {} is there twice ({} and {}); a comparison counts each episode once, so give one copy",
                side.shown,
                shard.summary.shard,
                variant_name(shard.variant()),
                same.file.display(),
                shard.file.display()
            );
        }
        shards.push(shard);
    }
    Ok(shards)
}

fn variant_name((namespace, task, variant): (&str, &str, &str)) -> String {
    format!("{namespace}/{task}/{variant}")
}

/// The shards grouped by variant, in order of (namespace, task, variant).
fn by_variant(shards: Vec<Shard>) -> BTreeMap<(String, String, String), Vec<Shard>> {
    let mut groups: BTreeMap<(String, String, String), Vec<Shard>> = BTreeMap::new();
    for shard in shards {
        let (namespace, task, variant) = shard.variant();
        groups.entry((namespace.into(), task.into(), variant.into())).or_default().push(shard);
    }
    groups
}

/// A side that must hold one variant's shards (of any number of runs' layouts).
fn one_variant(side: &Side) -> Result<VariantSummary> {
    let groups = by_variant(shards_of(side)?);
    if groups.len() > 1 {
        let names: Vec<String> = groups.keys().map(|(n, t, v)| variant_name((n, t, v))).collect();
        bail!(
            "{}: holds shard summaries of {} variants ({}), which would be counted as one; \
             give one variant's directory, or this run alone to compare its variants",
            side.shown,
            names.len(),
            names.join(", ")
        );
    }
    let shards = groups.into_values().next().expect("shards_of found one at least");
    warn_of_missing_shards(side, &shards);
    Ok(summarize(&side.name, &side.dir, shards))
}

/// The two variants the summaries under one directory belong to, whatever
/// its layout: told apart by what the summaries say, so the shards of one
/// variant are never taken for two. The baseline is the first by name.
fn two_variants(side: &Side) -> Result<(VariantSummary, VariantSummary)> {
    let groups = by_variant(shards_of(side)?);
    let names: Vec<String> = groups.keys().map(|(n, t, v)| variant_name((n, t, v))).collect();
    let [first, second] = <[_; 2]>::try_from(groups.into_iter().collect::<Vec<_>>()).map_err(|_| {
        anyhow::anyhow!(
            "{}: holds shard summaries of {} variant(s) ({}), not two; compare two runs with `basecamp ab compare A B`",
            side.shown,
            names.len(),
            names.join(", ")
        )
    })?;
    // Called by variant name, or by task when both have the same (two checkpoints' runs).
    let same_variant = first.0.2 == second.0.2;
    let name =
        |(_, task, variant): &(String, String, String)| if same_variant { task.clone() } else { variant.clone() };
    let (a_name, b_name) = (name(&first.0), name(&second.0));
    warn_of_missing_shards(side, &first.1);
    warn_of_missing_shards(side, &second.1);
    Ok((summarize(&a_name, &common_dir(&first.1), first.1), summarize(&b_name, &common_dir(&second.1), second.1)))
}

/// Says on stderr which shards of a variant its summaries count
/// (`shard_count`) but `side` holds no summary of (a shard that failed, or
/// a directory copied in part): their episodes are not in the comparison.
fn warn_of_missing_shards(side: &Side, shards: &[Shard]) {
    let count = shards.iter().map(|s| s.summary.shard_count).max().unwrap_or(0);
    let missing: Vec<String> =
        (0..count).filter(|i| !shards.iter().any(|s| s.summary.shard == *i)).map(|i| i.to_string()).collect();
    if !missing.is_empty() {
        basecamp_sandbox::stderr_line!(
            "warning: {}: {} has {count} shards, but no {SUMMARY_FILE} of shard(s) {} here; their episodes are not compared",
            side.shown,
            variant_name(shards[0].variant()),
            missing.join(", ")
        );
    }
}

/// The deepest directory that holds every one of the shards.
fn common_dir(shards: &[Shard]) -> PathBuf {
    let mut common = shards[0].dir.clone();
    while !shards.iter().all(|s| s.dir.starts_with(&common)) {
        if !common.pop() {
            break;
        }
    }
    common
}

/// One variant's summary from its shards; traces are found relative to `root`.
fn summarize(name: &str, root: &Path, shards: Vec<Shard>) -> VariantSummary {
    let (_, task, variant) = shards[0].variant();
    let sandbox = format!("{task}/{variant}");
    let shards = shards
        .into_iter()
        .map(|s| {
            let relative = s.dir.strip_prefix(root).unwrap_or(Path::new("")).to_path_buf();
            (s.summary, relative)
        })
        .collect();
    VariantSummary::from_shards(name, &sandbox, shards, &[], root)
}

fn render(c: &Comparison, a: &VariantSummary, b: &VariantSummary) -> String {
    let counts = |v: &VariantSummary| {
        let mut said = format!("{} episodes, {} failed", v.aggregate.episodes, v.failed);
        if v.aggregate.not_measured > 0 {
            said.push_str(&format!(", {} NOT MEASURED", v.aggregate.not_measured));
        }
        // A shard that gave up left part of the test set unrun: the comparison is over fewer episodes.
        let unrun: usize = v.gave_up.iter().map(|g| g.gave_up.not_started.len()).sum();
        if !v.gave_up.is_empty() {
            said.push_str(&format!(", {} shard(s) GAVE UP ({unrun} not started)", v.gave_up.len()));
        }
        // A rate-limited side waited for its endpoint: its resolution times are not only the agent's.
        if let Some(rate_limits) = &v.rate_limits {
            said.push_str(&format!(
                ", {} answers 429 (its waits for the endpoint are in its resolution times)",
                rate_limits.answers_429
            ));
        }
        said
    };
    let mut out = format!("{} ({}) vs {} ({})\n\n", b.name, counts(b), a.name, counts(a));
    out.push_str(&c.table());
    // Root causes side by side: each cluster's size in A and in B, and each side's sentence.
    let mut clusters: BTreeMap<&str, [Option<&RootCause>; 2]> = BTreeMap::new();
    for (side, causes) in [&a.root_causes, &b.root_causes].into_iter().enumerate() {
        for cause in causes {
            clusters.entry(&cause.key).or_default()[side] = Some(cause);
        }
    }
    if !clusters.is_empty() {
        out.push_str("\nfailure root causes (episodes in each):\n");
        let size = |cause: Option<&RootCause>| cause.map_or(0, |c| c.episodes);
        let mut sorted: Vec<_> = clusters.into_iter().collect();
        sorted.sort_by_key(|(_, [in_a, in_b])| std::cmp::Reverse(size(*in_a) + size(*in_b)));
        let mut rows = vec![vec!["cause".to_string(), a.name.clone(), b.name.clone()]];
        for (key, [in_a, in_b]) in &sorted {
            rows.push(vec![key.to_string(), size(*in_a).to_string(), size(*in_b).to_string()]);
        }
        out.push_str(&columns(&rows));
        // Each sentence under the name of the side whose episodes it counts.
        for (_, [in_a, in_b]) in sorted.iter().take(3) {
            if let Some(cause) = in_a {
                let fixed = if in_b.is_none() { format!(" — gone in {}", b.name) } else { String::new() };
                out.push_str(&format!("  {}: {}{fixed}\n", a.name, cause.hint));
            }
            if let Some(cause) = in_b {
                out.push_str(&format!("  {}: {}\n", b.name, cause.hint));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::column_names;

    #[test]
    fn two_sides_are_named_by_the_fewest_trailing_segments_that_tell_them_apart() {
        let names = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(column_names("runs/x/a", "runs/y/b"), names("a", "b"));
        // Before: `a` and `a`, and a JSON whose baseline and candidate were one name.
        assert_eq!(column_names("runs/x/a", "runs/y/a"), names("x/a", "y/a"));
        assert_eq!(column_names("/tmp/p/x/a/", "runs/q/x/a"), names("p/x/a", "q/x/a"));
        assert_eq!(column_names("s3://one/t/a/", "s3://two/t/a"), names("one/t/a", "two/t/a"));
        assert_eq!(column_names("x/a", "./y/a"), names("x/a", "y/a"));
        // Nothing but the root tells them apart: the paths as given.
        assert_eq!(column_names("/a", "a"), names("/a", "a"));
        assert_eq!(column_names("/", "a"), names("/", "a"));
    }
}
