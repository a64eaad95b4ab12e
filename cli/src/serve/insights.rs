//! What a group of episodes (one variant of a task) says, computed from
//! their metrics and traces: the per-step timeline (duration, tool success
//! rate, memory consistency at each step index), Pearson correlations
//! between the chosen metric and every other one, clusters of the failed
//! episodes by a chosen key, and root-cause hints — the memory-null analysis
//! of `basecamp run`, the weakest step, a strong correlation, and a reward
//! component whose weighted contribution works against tool accuracy.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use super::catalog::EpisodeEntry;
use super::digest::TraceDigest;
use crate::run::analysis::root_causes;

/// What failed episodes are clustered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ClusterBy {
    /// The first memory key set to null (by which source), as `basecamp run` reports it.
    #[value(name = "memory_state", alias = "memory-state")]
    MemoryState,
    /// The first error: its type and the tool that raised it.
    #[value(name = "error")]
    Error,
    /// The tool whose call failed first.
    #[value(name = "tool")]
    Tool,
}

impl ClusterBy {
    pub fn name(self) -> &'static str {
        match self {
            ClusterBy::MemoryState => "memory_state",
            ClusterBy::Error => "error",
            ClusterBy::Tool => "tool",
        }
    }

    pub fn parse(text: &str) -> Option<ClusterBy> {
        match text {
            "memory_state" | "memory-state" => Some(ClusterBy::MemoryState),
            "error" => Some(ClusterBy::Error),
            "tool" => Some(ClusterBy::Tool),
            _ => None,
        }
    }
}

/// An episode with its trace read (or why it could not be).
pub struct Loaded<'a> {
    pub entry: &'a EpisodeEntry,
    pub digest: &'a Result<TraceDigest, String>,
}

impl<'a> Loaded<'a> {
    /// Reads the trace unless the entry's digest was read before.
    pub fn load(entry: &'a EpisodeEntry) -> Self {
        Loaded { entry, digest: entry.digest() }
    }

    /// The episode's metrics plus `reward.<component>` scores from its trace.
    pub fn values(&self) -> BTreeMap<String, f64> {
        let mut values = self.entry.metrics.clone();
        if let Ok(digest) = self.digest {
            for (name, score, _) in digest.reward_components() {
                values.insert(format!("reward.{name}"), score);
            }
            if !values.contains_key("steps") {
                values.insert("steps".into(), digest.steps.len() as f64);
            }
        }
        values
    }
}

/// Insights already computed for a catalog, by (namespace, task, variant,
/// metric, cluster key): the task page's analysis reads the failed
/// episodes' traces again (`basecamp run`'s root causes), so a catalog
/// that did not change answers from here.
#[derive(Default)]
pub struct InsightsMemo(Mutex<HashMap<InsightsKey, Arc<Insights>>>);

type InsightsKey = (String, String, String, String, ClusterBy);

/// Distinct queries remembered per catalog; more are computed and not kept
/// (`?metric=` is free text).
const MEMO_LIMIT: usize = 256;

impl std::fmt::Debug for InsightsMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.lock().map_or(0, |memo| memo.len());
        write!(f, "InsightsMemo({kept} kept)")
    }
}

impl InsightsMemo {
    /// The insights of one task variant for `metric` and `cluster_by`:
    /// remembered, or computed now by `compute` (outside the lock, so
    /// concurrent pages do not wait on each other).
    pub fn get_or_compute(
        &self,
        (namespace, task, variant): (&str, &str, &str),
        metric: &str,
        cluster_by: ClusterBy,
        compute: impl FnOnce() -> Insights,
    ) -> Arc<Insights> {
        let key = (namespace.to_string(), task.to_string(), variant.to_string(), metric.to_string(), cluster_by);
        if let Some(kept) = self.0.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Arc::clone(kept);
        }
        let computed = Arc::new(compute());
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if memo.len() < MEMO_LIMIT {
            memo.insert(key, Arc::clone(&computed));
        }
        computed
    }
}

/// One step index across the episodes that reached it.
#[derive(Debug, Clone, Default)]
pub struct StepStat {
    pub index: u32,
    pub episodes: usize,
    pub mean_ms: f64,
    pub max_ms: f64,
    pub tool_calls: usize,
    pub ok_calls: usize,
    /// Episodes whose memory held no written `null` after this step.
    pub memory_ok: usize,
    /// Tool name -> calls at this step.
    pub tools: BTreeMap<String, usize>,
    /// Failure type -> count, for the failed calls at this step.
    pub failures: BTreeMap<String, usize>,
    /// Episodes (indices into the group) whose call failed or whose memory held a null here.
    pub flagged: Vec<usize>,
}

impl StepStat {
    pub fn success_rate(&self) -> Option<f64> {
        (self.tool_calls > 0).then(|| self.ok_calls as f64 / self.tool_calls as f64)
    }

    pub fn memory_consistency(&self) -> Option<f64> {
        (self.episodes > 0).then(|| self.memory_ok as f64 / self.episodes as f64)
    }
}

/// The chosen metric against another one.
#[derive(Debug, Clone)]
pub struct Correlation {
    pub x: String,
    pub y: String,
    /// Pearson r, or why there is none (too few points, a constant).
    pub r: Result<f64, String>,
    /// (x, y, episode index into the group).
    pub points: Vec<(f64, f64, usize)>,
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub key: String,
    /// One sentence; names in backticks.
    pub label: String,
    pub members: Vec<usize>,
}

#[derive(Debug, Clone, Default)]
pub struct Insights {
    pub metric: String,
    pub cluster_by: Option<ClusterBy>,
    pub episodes: usize,
    pub failed: usize,
    pub steps: Vec<StepStat>,
    pub correlations: Vec<Correlation>,
    pub clusters: Vec<Cluster>,
    /// Sentences, names in backticks.
    pub hints: Vec<String>,
    /// Traces that could not be read, with why.
    pub unreadable: Vec<String>,
    /// Each episode's metrics with its `reward.<component>` scores, by group index.
    pub values: Vec<BTreeMap<String, f64>>,
}

/// Pearson's r over paired values; `Err` says why it is undefined.
pub fn pearson(xs: &[f64], ys: &[f64]) -> Result<f64, String> {
    pearson_of(("x", xs), ("y", ys))
}

/// [`pearson`] of two named series: a constant one is named in the reason
/// (`tool_call_accuracy is constant at 1.000`), so a table row of another
/// metric does not read as if its own values were constant.
pub fn pearson_of((x_name, xs): (&str, &[f64]), (y_name, ys): (&str, &[f64])) -> Result<f64, String> {
    let n = xs.len().min(ys.len());
    if n < 3 {
        return Err(format!("{n} paired value(s); need 3"));
    }
    let mean = |v: &[f64]| v[..n].iter().sum::<f64>() / n as f64;
    let (mx, my) = (mean(xs), mean(ys));
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (dx, dy) = (xs[i] - mx, ys[i] - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx <= f64::EPSILON * n as f64 {
        return Err(format!("{x_name} is constant at {}", short(mx)));
    }
    if syy <= f64::EPSILON * n as f64 {
        return Err(format!("{y_name} is constant at {}", short(my)));
    }
    Ok((sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0))
}

fn short(v: f64) -> String {
    format!("{v:.3}")
}

/// Every metric name any of the episodes has, sorted.
pub fn metric_names(group: &[Loaded<'_>]) -> BTreeSet<String> {
    group.iter().flat_map(|l| l.values().into_keys()).collect()
}

pub fn compute(group: &[Loaded<'_>], metric: &str, cluster_by: ClusterBy) -> Insights {
    let values: Vec<BTreeMap<String, f64>> = group.iter().map(Loaded::values).collect();
    let mut insights = Insights {
        metric: metric.to_string(),
        cluster_by: Some(cluster_by),
        episodes: group.len(),
        failed: group.iter().filter(|l| l.entry.failed()).count(),
        unreadable: group
            .iter()
            .filter_map(|l| l.digest.as_ref().err().map(|e| format!("{}: {e}", l.entry.key())))
            .collect(),
        ..Default::default()
    };
    insights.steps = step_stats(group);
    insights.correlations = correlations(&values, metric);
    insights.clusters = clusters(group, cluster_by);
    insights.hints = hints(group, &values, &insights);
    insights.values = values;
    insights
}

fn step_stats(group: &[Loaded<'_>]) -> Vec<StepStat> {
    let mut stats: BTreeMap<u32, StepStat> = BTreeMap::new();
    let mut durations: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for (i, loaded) in group.iter().enumerate() {
        let Ok(digest) = loaded.digest else { continue };
        for step in &digest.steps {
            let stat = stats.entry(step.index).or_insert_with(|| StepStat { index: step.index, ..Default::default() });
            stat.episodes += 1;
            durations.entry(step.index).or_default().push(step.duration_ms);
            let mut flagged = false;
            if step.is_tool_call() {
                stat.tool_calls += 1;
                *stat.tools.entry(step.tool.clone()).or_default() += 1;
                if step.succeeded() {
                    stat.ok_calls += 1;
                } else {
                    *stat.failures.entry(step.failure()).or_default() += 1;
                    flagged = true;
                }
            }
            if step.memory_ok {
                stat.memory_ok += 1;
            } else {
                flagged = true;
            }
            if flagged {
                stat.flagged.push(i);
            }
        }
    }
    for (index, ds) in durations {
        if let Some(stat) = stats.get_mut(&index) {
            stat.mean_ms = ds.iter().sum::<f64>() / ds.len() as f64;
            stat.max_ms = ds.iter().copied().fold(0.0, f64::max);
        }
    }
    stats.into_values().collect()
}

fn correlations(values: &[BTreeMap<String, f64>], metric: &str) -> Vec<Correlation> {
    let names: BTreeSet<&String> = values.iter().flat_map(|v| v.keys()).collect();
    let mut out: Vec<Correlation> = names
        .into_iter()
        .filter(|name| name.as_str() != metric)
        .filter_map(|other| {
            let points: Vec<(f64, f64, usize)> =
                values.iter().enumerate().filter_map(|(i, v)| Some((*v.get(other)?, *v.get(metric)?, i))).collect();
            if points.is_empty() {
                return None;
            }
            let (xs, ys): (Vec<f64>, Vec<f64>) = points.iter().map(|p| (p.0, p.1)).unzip();
            let r = pearson_of((other, &xs), (metric, &ys));
            Some(Correlation { x: other.clone(), y: metric.to_string(), r, points })
        })
        .collect();
    out.sort_by(|a, b| match (&a.r, &b.r) {
        (Ok(x), Ok(y)) => y.abs().total_cmp(&x.abs()).then(a.x.cmp(&b.x)),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.x.cmp(&b.x),
    });
    out
}

/// The first failing tool call of an episode: (tool, failure type).
fn first_failed_call(loaded: &Loaded<'_>) -> Option<(String, String)> {
    let digest = loaded.digest.as_ref().ok()?;
    digest.steps.iter().find(|s| s.is_tool_call() && !s.succeeded()).map(|s| (s.tool.clone(), s.failure()))
}

fn clusters(group: &[Loaded<'_>], by: ClusterBy) -> Vec<Cluster> {
    let failed: Vec<usize> = (0..group.len()).filter(|&i| group[i].entry.failed()).collect();
    let mut clusters: BTreeMap<String, Cluster> = BTreeMap::new();
    let mut add = |key: String, label: String, i: usize| {
        clusters.entry(key.clone()).or_insert_with(|| Cluster { key, label, members: Vec::new() }).members.push(i);
    };
    match by {
        ClusterBy::MemoryState => {
            // The analysis of `basecamp run`, episode by episode for each one's
            // key, then over all of them for each cluster's sentence.
            let rows: Vec<_> = failed.iter().map(|&i| (group[i].entry.row(), group[i].entry.trace.clone())).collect();
            let all: Vec<_> = rows.iter().map(|(row, path)| (row, path.clone())).collect();
            let sentences: BTreeMap<String, String> =
                root_causes(&all).into_iter().map(|c| (c.key.clone(), c.hint)).collect();
            for (pos, &i) in failed.iter().enumerate() {
                let own = root_causes(&all[pos..=pos]);
                let key = own.first().map_or_else(|| "unknown".to_string(), |c| c.key.clone());
                let label = sentences.get(&key).cloned().unwrap_or_else(|| key.clone());
                add(key, label, i);
            }
        }
        ClusterBy::Error | ClusterBy::Tool => {
            let mut errors_by_tool: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
            for &i in &failed {
                if let Some((tool, error)) = first_failed_call(&group[i]) {
                    *errors_by_tool.entry(tool).or_default().entry(error).or_default() += 1;
                }
            }
            for &i in &failed {
                match first_failed_call(&group[i]) {
                    Some((tool, error)) if by == ClusterBy::Error => {
                        add(format!("error:{error}:{tool}"), format!("`{tool}` failed with `{error}`"), i)
                    }
                    Some((tool, _)) => {
                        let counts = errors_by_tool.get(&tool).map(counted).unwrap_or_default();
                        add(format!("tool:{tool}"), format!("`{tool}` failed first ({counts})"), i)
                    }
                    None => {
                        let class = &group[i].entry.failure_class;
                        add(
                            format!("class:{class}"),
                            format!("no tool call failed; the episode failed with `{class}`"),
                            i,
                        )
                    }
                }
            }
        }
    }
    let total = failed.len();
    let mut out: Vec<Cluster> = clusters
        .into_values()
        .map(|mut c| {
            if by != ClusterBy::MemoryState {
                c.label = format!("in {} of {total} failed episodes {}", c.members.len(), c.label);
            }
            c
        })
        .collect();
    out.sort_by(|a, b| b.members.len().cmp(&a.members.len()).then(a.key.cmp(&b.key)));
    out
}

/// `timeout x11, rate_limited x8`: most frequent first.
fn counted(counts: &BTreeMap<String, usize>) -> String {
    let mut list: Vec<(&String, &usize)> = counts.iter().collect();
    list.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    list.iter().map(|(name, n)| format!("{name} x{n}")).collect::<Vec<_>>().join(", ")
}

fn hints(group: &[Loaded<'_>], values: &[BTreeMap<String, f64>], insights: &Insights) -> Vec<String> {
    let mut hints = Vec::new();
    // 1. What the traces of the failed episodes say (the analysis of `basecamp run`).
    let failed: Vec<_> =
        group.iter().filter(|l| l.entry.failed()).map(|l| (l.entry.row(), l.entry.trace.clone())).collect();
    let rows: Vec<_> = failed.iter().map(|(row, path)| (row, path.clone())).collect();
    hints.extend(root_causes(&rows).into_iter().map(|c| c.hint));

    // 2. The weakest step by tool success, and where memory first holds a null.
    if let Some(step) = insights
        .steps
        .iter()
        .filter(|s| s.success_rate().is_some_and(|r| r < 1.0))
        .min_by(|a, b| a.success_rate().unwrap_or(1.0).total_cmp(&b.success_rate().unwrap_or(1.0)))
    {
        let tools: Vec<String> = step.tools.keys().map(|t| format!("`{t}`")).collect();
        hints.push(format!(
            "step {} ({}) is the weakest: {} of {} tool calls succeeded ({:.0}%); failures: {}",
            step.index,
            tools.join(", "),
            step.ok_calls,
            step.tool_calls,
            step.success_rate().unwrap_or(0.0) * 100.0,
            counted(&step.failures)
        ));
    }
    if let Some(step) = insights.steps.iter().find(|s| s.memory_ok < s.episodes) {
        hints.push(format!(
            "memory consistency drops at step {}: after it, {} of {} episodes hold a `null` a tool or fallback wrote",
            step.index,
            step.episodes - step.memory_ok,
            step.episodes
        ));
    }

    // 3. The strongest correlation with the chosen metric.
    if let Some(c) = insights.correlations.iter().find(|c| c.r.as_ref().is_ok_and(|r| r.abs() >= 0.5)) {
        let r = *c.r.as_ref().expect("filtered on Ok");
        let direction = if r < 0.0 { "falls" } else { "rises" };
        hints.push(format!("`{}` {direction} as `{}` rises (r = {r:+.2}, n = {})", c.y, c.x, c.points.len()));
    }

    // 4. A reward that pays for what lowers tool accuracy.
    let accuracy = if values.iter().any(|v| v.contains_key("tool_call_accuracy")) {
        "tool_call_accuracy"
    } else {
        insights.metric.as_str()
    };
    hints.extend(reward_weight_hints(group, values, accuracy));
    hints
}

/// For each negatively weighted reward component: when its weighted
/// contribution (weight x score) correlates negatively with `accuracy`,
/// the reward pays the policy for what lowers accuracy.
pub fn reward_weight_hints(group: &[Loaded<'_>], values: &[BTreeMap<String, f64>], accuracy: &str) -> Vec<String> {
    let mut contributions: BTreeMap<String, (Vec<f64>, Vec<f64>, f64)> = BTreeMap::new();
    for (loaded, v) in group.iter().zip(values) {
        let (Ok(digest), Some(&acc)) = (loaded.digest, v.get(accuracy)) else { continue };
        for (name, score, weight) in digest.reward_components() {
            if weight < 0.0 {
                let entry = contributions.entry(name).or_insert((Vec::new(), Vec::new(), weight));
                entry.0.push(weight * score);
                entry.1.push(acc);
                entry.2 = weight;
            }
        }
    }
    let mut hints = Vec::new();
    for (name, (contribution, acc, weight)) in contributions {
        if let Ok(r) = pearson(&contribution, &acc)
            && r <= -0.3
        {
            hints.push(format!(
                "reward component `{name}` (weight {weight}) correlates negatively with `{accuracy}`: its weighted \
                 contribution vs `{accuracy}` r = {r:+.2} over {} episodes, so the reward pays for what lowers \
                 accuracy (e.g. skipping tool calls to shorten plans); check the weight of `{name}`",
                acc.len()
            ));
        }
    }
    let (rewards, accs): (Vec<f64>, Vec<f64>) =
        values.iter().filter_map(|v| Some((*v.get("reward")?, *v.get(accuracy)?))).unzip();
    if let Ok(r) = pearson(&rewards, &accs)
        && r <= -0.3
    {
        hints.push(format!(
            "the reward (weighted sum) correlates negatively with `{accuracy}` (r = {r:+.2}, n = {}): check the reward weights",
            rewards.len()
        ));
    }
    hints
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pearson_is_exact_on_lines_and_undefined_on_constants() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        assert!((pearson(&xs, &[2.0, 4.0, 6.0, 8.0]).unwrap() - 1.0).abs() < 1e-12);
        assert!((pearson(&xs, &[8.0, 6.0, 4.0, 2.0]).unwrap() + 1.0).abs() < 1e-12);
        assert!(pearson(&xs, &[1.0, 1.0, 1.0, 1.0]).unwrap_err().contains("constant at 1.000"));
        // Which of the two is constant is named: not the row's own metric when it varies.
        assert_eq!(
            pearson_of(("error_rate", &xs), ("tool_call_accuracy", &[1.0; 4])).unwrap_err(),
            "tool_call_accuracy is constant at 1.000"
        );
        assert!(pearson(&xs[..2], &xs[..2]).unwrap_err().contains("need 3"));
        // A known value: r of (1,2,3,4,5) and (2,4,5,4,5) is 0.7745966...
        let r = pearson(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2.0, 4.0, 5.0, 4.0, 5.0]).unwrap();
        assert!((r - 0.774_596_669).abs() < 1e-6, "{r}");
    }

    #[test]
    fn the_memo_computes_each_query_once() {
        let memo = InsightsMemo::default();
        let calls = std::cell::Cell::new(0);
        let compute = |metric: &str| {
            calls.set(calls.get() + 1);
            Insights { metric: metric.to_string(), ..Default::default() }
        };
        let variant = ("ns", "task", "a");
        let first = memo.get_or_compute(variant, "error_rate", ClusterBy::Tool, || compute("error_rate"));
        let again = memo.get_or_compute(variant, "error_rate", ClusterBy::Tool, || compute("error_rate"));
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(calls.get(), 1);
        // Another metric, cluster key or variant is another query.
        memo.get_or_compute(variant, "reward", ClusterBy::Tool, || compute("reward"));
        memo.get_or_compute(variant, "error_rate", ClusterBy::Error, || compute("error_rate"));
        memo.get_or_compute(("ns", "task", "b"), "error_rate", ClusterBy::Tool, || compute("error_rate"));
        assert_eq!(calls.get(), 4);
        // Past the limit, queries are answered but not kept.
        for i in 0..MEMO_LIMIT {
            memo.get_or_compute(variant, &format!("m{i}"), ClusterBy::Tool, || compute("m"));
        }
        let before = calls.get();
        memo.get_or_compute(variant, &format!("m{}", MEMO_LIMIT - 1), ClusterBy::Tool, || compute("m"));
        assert_eq!(calls.get(), before + 1, "not kept: computed again");
        assert_eq!(memo.0.lock().unwrap().len(), MEMO_LIMIT);
    }
}
