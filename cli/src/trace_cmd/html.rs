//! The page `basecamp trace report` writes: a table of the groups (task and
//! variant), each group's insight sections (shared with `basecamp serve`'s
//! task page), and every episode's trace view as a hidden drawer that a
//! click (a `#episode=<task>/<variant>/<id>` link) opens — so the report is
//! one file that works offline.

use std::fmt::Write as _;

use basecamp_trace::TraceContents;

use crate::serve::catalog::EpisodeEntry;
use crate::serve::episode;
use crate::serve::html::{esc, insight_sections, num, page};
use crate::serve::insights::Insights;

/// Token logits drawn per episode in the report (the rest are counted).
const REPORT_TOKEN_CAP: usize = 400;

/// One task variant's episodes and what they say.
pub struct Group<'a> {
    pub namespace: &'a str,
    pub task: &'a str,
    pub variant: &'a str,
    pub entries: Vec<&'a EpisodeEntry>,
    pub insights: Insights,
}

/// The in-page key of an episode's trace view.
pub fn view_key(e: &EpisodeEntry) -> String {
    format!("{}/{}/{}", e.task, e.variant, e.id)
}

/// The page; `load` reads an episode's trace when its view is drawn, so one
/// decoded trace is held at a time, whatever the number of episodes.
pub fn render(
    groups: &[Group<'_>],
    inputs: &[String],
    problems: &[String],
    load: impl Fn(&EpisodeEntry) -> Result<TraceContents, String>,
) -> String {
    let metric = groups.first().map_or("", |g| g.insights.metric.as_str());
    let mut h =
        format!("<h1>trace report: <code>{}</code></h1><p class=\"muted\">{}</p>", esc(metric), esc(&inputs.join(" ")));
    h.push_str(
        "<table id=\"groups\"><tr><th>namespace</th><th>task</th><th>variant</th><th>episodes</th><th>failed</th>",
    );
    let _ = write!(h, "<th>mean {}</th><th>hints</th></tr>", esc(metric));
    for (i, g) in groups.iter().enumerate() {
        let values: Vec<f64> = g.entries.iter().filter_map(|e| e.metrics.get(metric).copied()).collect();
        let mean = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td><a href=\"#group-{i}\"><b>{}</b></a></td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(g.namespace),
            esc(g.task),
            esc(g.variant),
            g.entries.len(),
            if g.insights.failed > 0 { "bad" } else { "good" },
            g.insights.failed,
            num(mean),
            g.insights.hints.len()
        );
    }
    h.push_str("</table>");
    for problem in problems {
        let _ = write!(h, "<p class=\"warn\">{}</p>", esc(problem));
    }
    let link = |e: &EpisodeEntry| format!("#episode={}", view_key(e));
    for (i, g) in groups.iter().enumerate() {
        let _ = write!(h, "<h2 id=\"group-{i}\">{} / variant {}</h2>", esc(g.task), esc(g.variant));
        h.push_str(&insight_sections(&g.insights, &g.entries, &link, &format!("g{i}")));
    }
    for g in groups {
        for e in &g.entries {
            let _ = write!(
                h,
                "<section class=\"episode-view drawer\" id=\"episode:{}\" hidden><a class=\"close\" href=\"#\">close ✕</a>",
                esc(&view_key(e))
            );
            match load(e) {
                Ok(contents) => h.push_str(&episode::render(e, &contents, REPORT_TOKEN_CAP, None)),
                Err(problem) => {
                    let _ = write!(h, "<h1>episode {}</h1><p class=\"bad\">{}</p>", esc(&e.id), esc(&problem));
                }
            }
            h.push_str("</section>");
        }
    }
    page(&format!("trace report: {metric}"), &h)
}
