//! `report.html`: the run's summary as one self-contained page (no network
//! needed): the per-variant table with bars, the A/B comparison, criteria,
//! root-cause hints, and every episode with a link to its trace file. A
//! checkbox narrows the episode list to failures; a long list shows 500
//! rows at a time (the script `basecamp serve` and `trace report` share).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::summary::{RunSummary, TABLE_METRICS, fmt_latency, fmt_metric};
// The escaping `basecamp serve` and `trace report` use: one set of rules for every page.
use crate::serve::html::{PAGE_ROWS, esc, num, page_end, rows_in_page, sentence};

pub const REPORT_FILE: &str = "report.html";

pub fn write(summary: &RunSummary, dir: &Path) -> Result<()> {
    let path = dir.join(REPORT_FILE);
    std::fs::write(&path, render(summary)).with_context(|| format!("cannot write {}", path.display()))
}

/// A horizontal bar for a value in [0, 1].
fn bar(v: Option<f64>) -> String {
    let Some(v) = v.filter(|v| v.is_finite()) else { return String::new() };
    let width = (v.clamp(0.0, 1.0) * 120.0).round();
    format!(
        r##"<svg width="124" height="10" aria-hidden="true"><rect width="122" height="8" y="1" fill="#eee"/><rect width="{width}" height="8" y="1" fill="#3b7dd8"/></svg>"##
    )
}

/// `: a, b, c` and how many more, for a list of episode ids shown in a sentence.
fn some_ids(ids: &[String]) -> String {
    match ids.len() {
        0 => String::new(),
        n if n <= SHOWN_IDS => format!(": {}", esc(&ids.join(", "))),
        n => format!(": {} and {} more", esc(&ids[..SHOWN_IDS].join(", ")), n - SHOWN_IDS),
    }
}

/// How many episode ids (or trace links) a sentence of the report names.
const SHOWN_IDS: usize = 10;

pub fn render(s: &RunSummary) -> String {
    let mut h = String::new();
    let episodes: u32 = s.variants.iter().map(|v| v.aggregate.episodes).sum();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>basecamp run: {task}</title>
<style>
body{{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222}} h1{{font-size:20px}} h2{{font-size:16px;margin-top:28px}}
table{{border-collapse:collapse}} td,th{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left;vertical-align:middle}}
th{{background:#f5f5f5}} .bad{{color:#b00020;font-weight:600}} .good{{color:#1b7f3b;font-weight:600}} code{{background:#f3f3f3;padding:0 3px}}
tr.failed td{{background:#fff4f4}} .muted{{color:#777}}
</style></head><body>
<h1>basecamp run: {task}</h1>
<p class="muted">{episodes} episodes in {wall:.1}s ({eps:.1} episodes/s){stopped}</p>
"#,
        task = esc(&s.task),
        wall = s.wall_seconds,
        eps = s.episodes_per_second,
        stopped = if s.stopped_early { " — <span class=\"bad\">stopped early, partial results</span>" } else { "" },
    );
    h.push_str(
        "<h2>Variants</h2><table id=\"variants\"><tr><th>variant</th><th>sandbox</th><th>episodes</th><th>failed</th>",
    );
    for m in TABLE_METRICS {
        let _ = write!(h, "<th>{m}</th>");
    }
    h.push_str("<th>p50</th><th>p95</th><th>criteria</th></tr>");
    for v in &s.variants {
        let a = &v.aggregate;
        let met = v.criteria.iter().filter(|c| c.met).count();
        let _ = write!(
            h,
            "<tr><td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td>",
            esc(&v.name),
            esc(&v.sandbox),
            a.episodes,
            v.failed
        );
        for m in TABLE_METRICS {
            let value = a.value_of(m);
            let _ = write!(h, "<td>{} {}</td>", num(value), bar(value));
        }
        let class = if met == v.criteria.len() { "good" } else { "bad" };
        let _ = write!(
            h,
            "<td>{}</td><td>{}</td><td class=\"{class}\">{met}/{} met</td></tr>",
            fmt_latency(a, a.resolution_time_p50_s),
            fmt_latency(a, a.resolution_time_p95_s),
            v.criteria.len()
        );
    }
    h.push_str("</table>");
    for failed in &s.failed_shards {
        let _ = write!(
            h,
            "<p class=\"bad failed-shard\">variant {}, {}</p>",
            esc(&failed.variant),
            esc(&failed.consequence())
        );
    }
    for exited in &s.service_exits {
        let _ = write!(
            h,
            "<p class=\"bad service-exit\">variant {}, {}</p>",
            esc(&exited.variant),
            esc(&exited.consequence())
        );
    }
    for v in &s.variants {
        if v.kept_from_earlier_run {
            let _ = write!(
                h,
                "<p class=\"muted kept\">variant {}: from an earlier run in this directory (not run now)</p>",
                esc(&v.name)
            );
        }
        if let Some(said) = v.not_measured_sentence() {
            let class = if v.not_measured_tolerated() { "muted" } else { "bad" };
            let _ = write!(h, "<p class=\"{class} not-measured\">variant {}: {}</p>", esc(&v.name), esc(&said));
        }
        for gave_up in &v.gave_up {
            let _ = write!(h, "<p class=\"bad gave-up\">variant {}: {}</p>", esc(&v.name), esc(&gave_up.sentence()));
        }
        if let Some(rate_limits) = &v.rate_limits {
            let said = rate_limits.sentence();
            let _ = write!(h, "<p class=\"muted rate-limited\">variant {}: {}</p>", esc(&v.name), esc(&said));
        }
        if let Some(warned) = &v.warned {
            let said = warned.sentence(v.aggregate.episodes);
            let _ = write!(h, "<p class=\"muted warned\">variant {}: {}</p>", esc(&v.name), esc(&said));
        }
        // What a stop left out of the table: said as the console says it.
        if !v.interrupted.is_empty() || !v.not_started.is_empty() {
            // The cut-off episodes' traces, one click away as every other episode's.
            let cut_off = if v.interrupted_traces.is_empty() {
                some_ids(&v.interrupted)
            } else {
                let links: Vec<String> = v
                    .interrupted_traces
                    .iter()
                    .take(SHOWN_IDS)
                    .map(|t| {
                        let name =
                            Path::new(t).file_stem().map_or_else(|| t.clone(), |s| s.to_string_lossy().into_owned());
                        format!("<a href=\"{}\">{}</a>", esc(t), esc(&name))
                    })
                    .collect();
                let more = v.interrupted_traces.len().saturating_sub(SHOWN_IDS);
                format!(": {}{}", links.join(", "), if more > 0 { format!(" and {more} more") } else { String::new() })
            };
            let _ = write!(
                h,
                "<p class=\"bad stopped\">variant {}: stopped early: {} cut off (their traces end as cancelled{cut_off}), \
                 {} not started{}; neither is in the averages</p>",
                esc(&v.name),
                v.interrupted.len(),
                v.not_started.len(),
                some_ids(&v.not_started),
            );
        }
    }

    if let Some(c) = &s.comparison {
        let _ = write!(
            h,
            "<h2>A/B: {} vs {}</h2><table id=\"comparison\"><tr><th>metric</th><th>{}</th><th>{}</th><th>delta</th></tr>",
            esc(&c.candidate),
            esc(&c.baseline),
            esc(&c.baseline),
            esc(&c.candidate)
        );
        for d in &c.rows {
            let delta = d.delta_percent.map_or("-".into(), |p| format!("{p:+.1}%"));
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{delta}</td></tr>",
                esc(&d.metric),
                esc(&fmt_metric(&d.metric, d.baseline)),
                esc(&fmt_metric(&d.metric, d.candidate))
            );
        }
        h.push_str("</table>");
    }

    h.push_str("<h2>Success criteria</h2><table id=\"criteria\"><tr><th>variant</th><th>criterion</th><th>observed</th><th>result</th></tr>");
    for v in &s.variants {
        for c in &v.criteria {
            let (class, word) = if c.met { ("good", "met") } else { ("bad", "NOT met") };
            let observed = c.problem.clone().map_or_else(|| num(c.observed), |p| esc(&p));
            let _ = write!(
                h,
                "<tr><td>{}</td><td><code>{}</code></td><td>{observed}</td><td class=\"{class}\">{word}</td></tr>",
                esc(&v.name),
                esc(&c.criterion)
            );
        }
    }
    h.push_str("</table><h2>Why episodes failed</h2>");
    for v in &s.variants {
        let _ = write!(
            h,
            "<h3>{}: {} of {} failed</h3><ul class=\"causes\">",
            esc(&v.name),
            v.failed,
            v.aggregate.episodes
        );
        for cause in &v.root_causes {
            let _ = write!(
                h,
                "<li>{} <span class=\"muted\">e.g. {}</span></li>",
                sentence(&cause.hint),
                esc(&cause.examples.join(", "))
            );
        }
        if v.root_causes.is_empty() {
            h.push_str("<li class=\"muted\">no failures</li>");
        }
        h.push_str("</ul>");
    }

    let rows: Vec<String> = s
        .variants
        .iter()
        .flat_map(|v| v.episodes.iter().map(move |e| (v, e)))
        .map(|(v, e)| {
            format!(
                "<tr data-ok=\"{}\"{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}s</td><td><a href=\"{}\">{}</a></td></tr>",
                if e.failed() { 0 } else { 1 },
                if e.failed() { " class=\"failed\"" } else { "" },
                esc(&v.name),
                esc(&e.id),
                esc(&e.outcome),
                esc(&e.failure_class),
                num(Some(e.metrics.tool_call_accuracy)),
                num(e.metrics.memory_consistency),
                e.metrics.resolution_time_s,
                esc(&e.trace),
                esc(&e.trace)
            )
        })
        .collect();
    // A long run's table shows a page at a time (the shared page script pages it).
    let (pager, shown, later) = rows_in_page("episodes", &rows, PAGE_ROWS);
    let _ = write!(
        h,
        "<h2>Episodes</h2><label><input type=\"checkbox\" class=\"failed-only\" data-table=\"episodes\"> only failed</label>{pager}\
         <table id=\"episodes\" class=\"episodes\"><tr><th>variant</th><th>episode</th><th>outcome</th><th>failure class</th>\
         <th>tool_call_accuracy</th><th>memory_consistency</th><th>time</th><th>trace</th></tr>{shown}</table>{pager}{later}"
    );
    h.push_str(&page_end());
    h
}
