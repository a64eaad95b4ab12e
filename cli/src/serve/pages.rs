//! The pages of `basecamp serve`: the task list, a task's page (metrics
//! per variant, then each selected variant's hints, timeline,
//! correlations, failure clusters and episodes) and an episode's trace.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use basecamp_trace::RecordKind;
use basecamp_trace::metrics::percentile;

use super::catalog::{Catalog, EpisodeEntry};
use super::episode;
use super::html::{PAGE_ROWS, Rows, esc, insight_sections, not_measured_note, num, page, url_segment};
use super::insights::{ClusterBy, Loaded, compute};
use crate::run::summary::TABLE_METRICS;

pub fn task_url(namespace: &str, task: &str) -> String {
    format!("/tasks/{}/{}", url_segment(namespace), url_segment(task))
}

pub fn episode_url(e: &EpisodeEntry) -> String {
    format!("{}/episodes/{}/{}", task_url(&e.namespace, &e.task), url_segment(&e.variant), url_segment(&e.id))
}

pub fn raw_url(e: &EpisodeEntry) -> String {
    let segments: Vec<String> = e.relative.split('/').map(url_segment).collect();
    format!("/raw/{}", segments.join("/"))
}

pub fn index(catalog: &Catalog, dir: &str) -> String {
    let mut h = format!("<h1>basecamp serve</h1><p class=\"muted\">{}</p>", esc(dir));
    let tasks = catalog.tasks();
    if tasks.is_empty() {
        h.push_str("<p>no traces found under this directory</p>");
    } else {
        h.push_str("<table id=\"tasks\"><tr><th>namespace</th><th>task</th><th>variants</th><th>episodes</th><th>failed</th></tr>");
        for (key, episodes) in &tasks {
            let mut variants: Vec<&str> = episodes.iter().map(|e| e.variant.as_str()).collect();
            variants.sort();
            variants.dedup();
            let failed = episodes.iter().filter(|e| e.failed()).count();
            let links: Vec<String> = variants
                .iter()
                .map(|v| {
                    let failed = episodes.iter().filter(|e| e.variant == *v && e.failed()).count();
                    let total = episodes.iter().filter(|e| e.variant == *v).count();
                    format!(
                        "<a href=\"{}?variant={}\">{}</a> <span class=\"muted\">({failed}/{total} failed)</span>",
                        esc(&task_url(&key.namespace, &key.task)),
                        url_segment(v),
                        esc(v)
                    )
                })
                .collect();
            let _ = write!(
                h,
                "<tr class=\"task\"><td>{}</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td class=\"{}\">{failed}</td></tr>",
                esc(&key.namespace),
                esc(&task_url(&key.namespace, &key.task)),
                esc(&key.task),
                links.join(" · "),
                episodes.len(),
                if failed > 0 { "bad" } else { "good" }
            );
        }
        h.push_str("</table>");
    }
    problems(&mut h, catalog);
    page("basecamp serve", &h)
}

fn problems(h: &mut String, catalog: &Catalog) {
    for p in &catalog.problems {
        let _ = write!(h, "<p class=\"warn\">{}</p>", esc(p));
    }
}

/// What the task page was asked for (its query string).
#[derive(Debug, Default, serde::Deserialize)]
pub struct TaskQuery {
    pub variant: Option<String>,
    pub metric: Option<String>,
    pub cluster_by: Option<String>,
    /// The page of each episode table (1-based, [`PAGE_ROWS`] rows a page:
    /// a task of 20,000 episodes is 40 pages, not one page of 16 MB).
    pub page: Option<String>,
}

/// The task page, or `None` when the directory holds no such task.
pub fn task(catalog: &Catalog, namespace: &str, task: &str, query: &TaskQuery) -> Option<Result<String, String>> {
    let variants = catalog.variants_of(namespace, task);
    if variants.is_empty() {
        return None;
    }
    // A data link whose series has no variant label sends `?variant=`: all variants.
    let query = &TaskQuery {
        variant: query.variant.clone().filter(|v| !v.is_empty()),
        metric: query.metric.clone().filter(|m| !m.is_empty()),
        cluster_by: query.cluster_by.clone().filter(|c| !c.is_empty()),
        page: query.page.clone().filter(|p| !p.is_empty()),
    };
    if let Some(v) = &query.variant
        && !variants.contains_key(v)
    {
        let known: Vec<&str> = variants.keys().map(String::as_str).collect();
        return Some(Err(format!("task {namespace}/{task} has no variant `{v}` (it has: {})", known.join(", "))));
    }
    let shown: Vec<&EpisodeEntry> = variants
        .iter()
        .filter(|(name, _)| query.variant.as_ref().is_none_or(|v| v == *name))
        .flat_map(|(_, episodes)| episodes.iter().copied())
        .collect();
    // As `trace report --metric` refuses it: a metric no episode has would
    // draw a column of `-` and no correlations, with a 200.
    if let Some(m) = &query.metric
        && !CHOICES.contains(&m.as_str())
        && !shown.iter().any(|e| e.metrics.contains_key(m))
    {
        let mut known: BTreeSet<&str> = CHOICES.into_iter().collect();
        known.extend(shown.iter().flat_map(|e| e.metrics.keys().map(String::as_str)));
        let known: Vec<&str> = known.into_iter().collect();
        return Some(Err(format!("metric `{m}`: no episode here has it; these do: {}", known.join(", "))));
    }
    let metric = query.metric.clone().unwrap_or_else(|| default_metric(&shown));
    let cluster_by = match query.cluster_by.as_deref() {
        None => ClusterBy::MemoryState,
        Some(text) => match ClusterBy::parse(text) {
            Some(c) => c,
            None => return Some(Err(format!("cluster_by `{text}`: use memory_state, error or tool"))),
        },
    };
    let url = task_url(namespace, task);
    let page_number = match query.page.as_deref().map(|text| (text, text.parse::<usize>())) {
        None => 1,
        Some((_, Ok(n))) => n,
        Some((text, Err(_))) => return Some(Err(format!("page `{text}` is not a page number: use 1, 2, ..."))),
    };
    let href = |n: usize| {
        let mut href = format!("{url}?page={n}");
        for (key, value) in [("variant", &query.variant), ("metric", &query.metric), ("cluster_by", &query.cluster_by)]
        {
            if let Some(value) = value {
                let _ = write!(href, "&{key}={}", url_segment(value));
            }
        }
        href
    };
    let rows = Rows::Page { page: page_number, per_page: PAGE_ROWS, href: &href };
    let pages = variants
        .iter()
        .filter(|(name, _)| query.variant.as_ref().is_none_or(|v| v == *name))
        .map(|(_, episodes)| rows.pages(episodes.len()))
        .max()
        .unwrap_or(1);
    if page_number == 0 || page_number > pages {
        return Some(Err(format!(
            "page {page_number}: the episode tables here have pages 1 to {pages} ({PAGE_ROWS} episodes a page)"
        )));
    }
    let mut h = format!("<nav><a href=\"/\">all tasks</a></nav><h1>{} / {}</h1>", esc(namespace), esc(task));
    h.push_str(
        "<h2>Metrics per variant</h2><table id=\"variants\"><tr><th>variant</th><th>episodes</th><th>failed</th>",
    );
    for m in TABLE_METRICS {
        let _ = write!(h, "<th>{m}</th>");
    }
    h.push_str("<th>reward</th><th>p50</th><th>p95</th></tr>");
    for (name, episodes) in &variants {
        // Over the episodes that measured the agent, as run.json's aggregate.
        let measured: Vec<&&EpisodeEntry> = episodes.iter().filter(|e| e.measured()).collect();
        let mean = |m: &str| {
            let vals: Vec<f64> = measured.iter().filter_map(|e| e.metrics.get(m).copied()).collect();
            (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
        };
        let mut times: Vec<f64> = measured.iter().filter_map(|e| e.metrics.get("resolution_time_s").copied()).collect();
        times.sort_by(f64::total_cmp);
        let failed = episodes.iter().filter(|e| e.failed()).count();
        let not_measured = not_measured_note(episodes.len() - measured.len());
        let selected = query.variant.as_deref() == Some(name.as_str());
        let _ = write!(
            h,
            "<tr class=\"variant{}\" data-variant=\"{}\"><td><a href=\"{}?variant={}\"><b>{}</b></a></td><td>{}</td><td class=\"{}\">{failed}{not_measured}</td>",
            if selected { " selected" } else { "" },
            esc(name),
            esc(&url),
            url_segment(name),
            esc(name),
            episodes.len(),
            if failed > 0 { "bad" } else { "good" }
        );
        for m in TABLE_METRICS {
            let _ = write!(h, "<td>{}</td>", num(mean(m)));
        }
        let _ = write!(
            h,
            "<td>{}</td><td>{:.2}s</td><td>{:.2}s</td></tr>",
            num(mean("reward")),
            percentile(&times, 0.5),
            percentile(&times, 0.95)
        );
    }
    h.push_str("</table>");
    let _ = write!(
        h,
        "<p class=\"muted\">show: <a href=\"{}\">all variants</a>{}</p>",
        esc(&url),
        variants
            .keys()
            .map(|v| format!(" · <a href=\"{}?variant={}\">{}</a>", esc(&url), url_segment(v), esc(v)))
            .collect::<String>()
    );
    let selector: String = CHOICES
        .iter()
        .map(|m| {
            let mut href = format!("{url}?metric={m}");
            if let Some(v) = &query.variant {
                href.push_str(&format!("&variant={}", url_segment(v)));
            }
            if *m == metric { format!(" · <b>{m}</b>") } else { format!(" · <a href=\"{}\">{m}</a>", esc(&href)) }
        })
        .collect();
    let _ = write!(h, "<p class=\"muted\">correlate with{selector}</p>");
    let link = |e: &EpisodeEntry| episode_url(e);
    for (name, episodes) in &variants {
        if query.variant.as_ref().is_some_and(|v| v != name) {
            continue;
        }
        let insights = catalog.insights.get_or_compute((namespace, task, name), &metric, cluster_by, || {
            let loaded: Vec<Loaded<'_>> = episodes.iter().map(|e| Loaded::load(e)).collect();
            compute(&loaded, &metric, cluster_by)
        });
        let _ = write!(h, "<h2 id=\"variant-{}\">variant {}</h2>", esc(name), esc(name));
        h.push_str(&insight_sections(&insights, episodes, &link, name, rows));
    }
    problems(&mut h, catalog);
    Some(Ok(page(&format!("{namespace}/{task}"), &h)))
}

/// The metrics the task page offers to correlate with, in order of preference.
const CHOICES: [&str; 5] = ["tool_call_accuracy", "error_rate", "memory_consistency", "reward", "resolution_time_s"];

/// The first metric of [`CHOICES`] that varies across the episodes shown
/// (a constant one has no correlations to show), else `tool_call_accuracy`.
fn default_metric(episodes: &[&EpisodeEntry]) -> String {
    CHOICES
        .iter()
        .find(|m| {
            let mut values = episodes.iter().filter_map(|e| e.metrics.get(**m));
            values.next().is_some_and(|first| values.any(|v| (v - first).abs() > 1e-12))
        })
        .unwrap_or(&CHOICES[0])
        .to_string()
}

/// One episode's page, or `None` when there is no such episode.
pub fn episode_page(catalog: &Catalog, namespace: &str, task: &str, variant: &str, id: &str) -> Option<String> {
    let entry = catalog
        .episodes
        .iter()
        .find(|e| e.namespace == namespace && e.task == task && e.variant == variant && e.id == id)?;
    let url = task_url(namespace, task);
    let nav = format!(
        "<nav><a href=\"/\">all tasks</a><a href=\"{}\">{}/{}</a><a href=\"{}?variant={}\">variant {}</a></nav>",
        esc(&url),
        esc(namespace),
        esc(task),
        esc(&url),
        url_segment(variant),
        esc(variant)
    );
    let cap = episode::PAGE_TOKEN_CAP;
    let view = match basecamp_trace::read_trace_at_most(&entry.trace, RecordKind::TokenLogit, cap) {
        Ok((contents, undrawn)) => episode::render(entry, &contents, &undrawn, cap, Some(&raw_url(entry))),
        Err(e) => format!("<h1>episode {}</h1><p class=\"bad\">{}</p>", esc(id), esc(&e.to_string())),
    };
    Some(episode::page(entry, &nav, &view))
}
