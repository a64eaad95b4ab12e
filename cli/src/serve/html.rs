//! The HTML both `basecamp serve` and `basecamp trace report` write: one
//! page shell with inline CSS and a little inline JS (no network, ever),
//! inline SVG charts, and the sections that show a group's insights.
//!
//! The script wires the interactive parts and then marks the page with
//! `data-ready="1"` on `<html>`: a URL fragment `#episode=<key>` opens that
//! episode's in-page trace view (`data-open-episode` on `<body>`), and
//! `#episode=<key>:s<n>` opens it at step n's panel (`data-open-panel`, the
//! panel's id); `#step=<scope>/<n>` (a timeline column's link) lists the
//! episodes flagged at step n in the group of that scope, `#step=<n>` in
//! every group (`data-open-step`),
//! `#<table id>-page-<n>` shows page n of a report's episode table (its
//! pagers' `data-page`), and the "failed only" box hides passing rows.
//! Browser tests read these marks.

use std::fmt::Write as _;

use super::catalog::EpisodeEntry;
use super::insights::{Correlation, Insights, StepStat};

pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Backticked names in a sentence become `<code>`.
pub fn sentence(text: &str) -> String {
    esc(text)
        .split('`')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { format!("<code>{part}</code>") } else { part.to_string() })
        .collect()
}

pub fn num(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// What a variant's row says after its count of `n` episodes that the
/// policy's server or a service failed (left out of its means); nothing
/// for none.
pub fn not_measured_note(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!(" <span class=\"not-measured\">({n} NOT MEASURED: the policy or a service failed)</span>"),
    }
}

/// Percent-encodes a path segment (ids and names in URLs).
pub fn url_segment(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px} h3{font-size:14px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0} td,th{padding:3px 9px;border-bottom:1px solid #e4e4e4;text-align:left;vertical-align:top}
th{background:#f5f5f5;font-weight:600} code{background:#f1f1f1;padding:0 3px;border-radius:2px}
a{color:#1f5fbf;text-decoration:none} a:hover{text-decoration:underline}
.muted{color:#777} .bad{color:#b00020;font-weight:600} .good{color:#1b7f3b;font-weight:600} .warn{color:#a15c00}
tr.failed td{background:#fff4f4} .hint{background:#fffbe6;border-left:3px solid #e0a800;padding:6px 10px;margin:6px 0}
.status{display:inline-block;padding:0 6px;border-radius:3px;font-size:12px;color:#fff;background:#888}
.status.ok{background:#1b7f3b} .status.timeout,.status.error,.status.refused{background:#b00020} .status.fallback,.status.rolled_back{background:#c26b00}
.charts{display:flex;flex-wrap:wrap;gap:14px} .chart{border:1px solid #e4e4e4;padding:6px;border-radius:4px}
.chart-title{font-size:12px;margin-bottom:2px} .chart svg text{font:10px system-ui,sans-serif;fill:#444}
.panel{border:1px solid #e4e4e4;border-radius:4px;padding:8px 12px;margin:8px 0;background:#fafafa}
.step-detail[hidden],.episode-view[hidden]{display:none}
.episode-view.drawer{position:fixed;top:0;right:0;width:min(960px,75vw);height:100vh;overflow:auto;background:#fff;box-shadow:-4px 0 16px rgba(0,0,0,.25);padding:16px 22px;box-sizing:border-box;z-index:5}
.close{float:right;font-size:13px}
.tok{display:inline-block;padding:0 2px;margin:1px;border-radius:2px;font-family:ui-monospace,monospace;font-size:12px}
.kv{font-family:ui-monospace,monospace;font-size:12px;white-space:pre-wrap;word-break:break-all}
.nullw td{background:#fde8e8}
.metrics{display:flex;flex-wrap:wrap;gap:6px 16px;margin:6px 0} .metrics span{white-space:nowrap}
nav a{margin-right:12px}
"#;

/// The type of the script element that holds a report drawer's view,
/// gzipped and base64-encoded, until the page script inflates it.
pub const PACKED_VIEW_TYPE: &str = "text/x-gzip-base64";

const SCRIPT: &str = r##"
(function () {
  function hash() { try { return decodeURIComponent(location.hash.slice(1)); } catch (e) { return ''; } }
  // A report's drawer holds its view gzipped and base64-encoded until first opened.
  function unpack(view) {
    var packed = view.querySelector('script[type="text/x-gzip-base64"]');
    if (!packed) { return Promise.resolve(); }
    var bytes = Uint8Array.from(atob(packed.textContent), function (c) { return c.charCodeAt(0); });
    var html = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(html).text().then(function (text) {
      if (packed.parentNode) { packed.insertAdjacentHTML('afterend', text); packed.remove(); }
    });
  }
  // Report tables paged by this script, by table id: go(page).
  var paged = {};
  function show() {
    var h = hash(), body = document.body, page = /^(.+)-page-([0-9]+)$/.exec(h);
    if (page && paged[page[1]]) { paged[page[1]](Number(page[2])); }
    document.querySelectorAll('.episode-view.drawer').forEach(function (s) { s.hidden = true; });
    document.querySelectorAll('.step-detail').forEach(function (s) { s.hidden = true; });
    delete body.dataset.openEpisode; delete body.dataset.openStep; delete body.dataset.openPanel;
    if (h.indexOf('episode=') === 0) {
      // A drawer's key never holds ':' (its segments are percent-encoded), so
      // ':s<n>' after it names one of its step panels.
      var at = /^(.*):s([0-9]+)$/.exec(h.slice(8));
      var id = at ? at[1] : h.slice(8), view = document.getElementById('episode:' + id);
      if (view) {
        return unpack(view).then(function () {
          if (hash() !== h) { return; }
          view.hidden = false; body.dataset.openEpisode = id; view.scrollTop = 0;
          var panel = at && document.getElementById('episode:' + id + ':s' + at[2]);
          if (panel) { body.dataset.openPanel = panel.id; panel.scrollIntoView({block: 'start'}); }
        });
      }
    } else if (h.indexOf('step=') === 0) {
      // step=<scope>/<n>: that group's panel; step=<n>: every group's.
      var step = /^(?:(.*)\/)?([0-9]+)$/.exec(h.slice(5));
      document.querySelectorAll('.step-detail').forEach(function (d) {
        if (!step || d.dataset.step !== step[2] || (step[1] !== undefined && d.dataset.scope !== step[1])) { return; }
        d.hidden = false; body.dataset.openStep = step[2]; d.scrollIntoView({block: 'nearest'});
      });
    }
  }
  window.addEventListener('hashchange', show);
  document.addEventListener('keydown', function (e) {
    if (e.key === 'Escape' && document.body.dataset.openEpisode) { location.hash = ''; }
  });
  document.querySelectorAll('input.failed-only').forEach(function (box) {
    function apply() {
      var table = document.getElementById(box.dataset.table);
      if (!table) { return; }
      table.querySelectorAll('tr[data-ok]').forEach(function (row) {
        row.hidden = box.checked && row.dataset.ok === '1';
      });
      table.dataset.filtered = box.checked ? '1' : '0';
    }
    box.addEventListener('change', apply); apply();
  });
  // An episode table of a report file: page 1 in the table, the others in
  // <template>s; #<table id>-page-<n> (a pager link) swaps page n's rows in
  // and both pagers follow.
  var fmt = function (n) { return n.toLocaleString('en-US'); };
  document.querySelectorAll('table.episodes').forEach(function (table) {
    var pagers = document.querySelectorAll('p.pager[data-table="' + CSS.escape(table.id) + '"]');
    if (!pagers.length) { return; }
    var later = document.querySelectorAll('template.rows[data-table="' + CSS.escape(table.id) + '"]');
    var first = document.createElement('template');
    table.querySelectorAll('tr[data-ok]').forEach(function (row) { first.content.appendChild(row.cloneNode(true)); });
    var pages = [first].concat(Array.prototype.slice.call(later));
    var total = Number(pagers[0].dataset.rows), per = Number(pagers[0].dataset.perPage);
    function link(n, page, text) {
      return n === page || n < 1 || n > pages.length ? ' · <span class="muted">' + text + '</span>'
        : ' · <a href="#' + encodeURIComponent(table.id) + '-page-' + n + '" data-page="' + n + '">' + text + '</a>';
    }
    function go(page) {
      if (!(page >= 1 && page <= pages.length)) { return; }
      table.querySelectorAll('tr[data-ok]').forEach(function (row) { row.remove(); });
      table.tBodies[table.tBodies.length - 1].appendChild(pages[page - 1].content.cloneNode(true));
      var start = (page - 1) * per, end = Math.min(start + per, total);
      pagers.forEach(function (p) {
        p.dataset.page = page;
        p.innerHTML = 'rows ' + fmt(start + 1) + '–' + fmt(end) + ' of ' + fmt(total) + ', page ' + fmt(page)
          + ' of ' + fmt(pages.length) + link(1, page, 'first') + link(page - 1, page, '‹ previous')
          + link(page + 1, page, 'next ›') + link(pages.length, page, 'last');
      });
      var box = document.querySelector('input.failed-only[data-table="' + CSS.escape(table.id) + '"]');
      if (box) { box.dispatchEvent(new Event('change')); }
    }
    paged[table.id] = go;
  });
  Promise.resolve(show()).then(function () { document.documentElement.dataset.ready = '1'; });
})();
"##;

/// A whole page: title, body, the shared style and script.
pub fn page(title: &str, body: &str) -> String {
    format!("{}{body}{}", page_start(title), page_end())
}

/// A page's shell up to its body's content, for pages written in pieces.
pub fn page_start(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n",
        esc(title)
    )
}

/// What follows a page's body content: the shared script and the closing tags.
pub fn page_end() -> String {
    format!("\n<script>{SCRIPT}</script></body></html>\n")
}

fn status_class(rate: Option<f64>) -> &'static str {
    match rate {
        Some(r) if r >= 0.999 => "good",
        Some(r) if r >= 0.9 => "warn",
        Some(_) => "bad",
        None => "muted",
    }
}

/// The per-step timeline: for each step index a column with the mean
/// duration (bar height), the tool success rate and the memory
/// consistency (two strips, red when low). A column links to
/// `#step=<scope>/<n>`, which opens that step's panel of this group alone.
pub fn timeline_svg(steps: &[StepStat], scope: &str) -> String {
    if steps.is_empty() {
        return "<p class=\"muted\">no plan steps in these traces</p>".into();
    }
    let col = 56.0_f64;
    let left = 150.0;
    let width = left + col * steps.len() as f64 + 10.0;
    let bar_h = 90.0;
    let max_ms = steps.iter().map(|s| s.mean_ms).fold(0.0, f64::max).max(1e-9);
    let id = esc(scope);
    // The page script decodes the fragment once (decodeURIComponent).
    let scope_in_link = url_segment(scope);
    let mut svg = format!(
        r##"<svg id="timeline-{id}" class="timeline" width="{width}" height="214" role="img" aria-label="per-step timeline">
<text x="4" y="70">mean duration</text><text x="4" y="135">tool success</text><text x="4" y="163">memory consistency</text>"##
    );
    for (i, s) in steps.iter().enumerate() {
        let x = left + col * i as f64;
        let h = (s.mean_ms / max_ms * bar_h).max(1.0);
        let top = 16.0;
        let color = |v: Option<f64>| match v {
            None => "#ddd",
            Some(v) if v >= 0.999 => "#1b7f3b",
            Some(v) if v >= 0.9 => "#e0a800",
            Some(_) => "#b00020",
        };
        let success = s.success_rate();
        let memory = s.memory_consistency();
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
        let _ = write!(
            svg,
            r##"<a href="#step={scope_in_link}/{idx}" class="step-col" data-step="{idx}"><title>step {idx}: {eps} episodes, mean {mean:.0} ms (max {max:.0} ms), tool success {sr}, memory consistency {mc}</title>
<rect x="{x}" y="6" width="{w}" height="196" fill="transparent"/>
<rect x="{bx}" y="{by}" width="{bw}" height="{h:.1}" fill="#3b7dd8"/><text x="{tx}" y="{ly}" text-anchor="middle">{mean:.0} ms</text>
<rect x="{bx}" y="122" width="{bw}" height="18" fill="{sc}"/><text x="{tx}" y="135" text-anchor="middle" style="fill:#fff">{sr}</text>
<rect x="{bx}" y="150" width="{bw}" height="18" fill="{mcc}"/><text x="{tx}" y="163" text-anchor="middle" style="fill:#fff">{mc}</text>
<text x="{tx}" y="186" text-anchor="middle">step {idx}</text><text x="{tx}" y="200" text-anchor="middle" class="muted">n={eps}</text></a>"##,
            idx = s.index,
            eps = s.episodes,
            mean = s.mean_ms,
            max = s.max_ms,
            sr = pct(success),
            mc = pct(memory),
            w = col,
            bx = x + 6.0,
            bw = col - 12.0,
            by = top + bar_h - h,
            ly = top + bar_h - h - 3.0,
            tx = x + col / 2.0,
            sc = color(success),
            mcc = color(memory),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One scatter plot: x against y, each point an episode (red when it
/// failed) linking to its trace view, with the least-squares line.
pub fn scatter_svg(c: &Correlation, entries: &[&EpisodeEntry], link: &dyn Fn(&EpisodeEntry) -> String) -> String {
    let (w, h, pad) = (266.0_f64, 180.0_f64, 36.0_f64);
    let range = |vals: Vec<f64>| {
        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !lo.is_finite() {
            (0.0, 1.0)
        } else if hi - lo < 1e-12 {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo, hi)
        }
    };
    let (x0, x1) = range(c.points.iter().map(|p| p.0).collect());
    let (y0, y1) = range(c.points.iter().map(|p| p.1).collect());
    let sx = |x: f64| pad + (x - x0) / (x1 - x0) * (w - pad - 8.0);
    let sy = |y: f64| h - pad + 8.0 - (y - y0) / (y1 - y0) * (h - pad - 8.0);
    let r_text = match &c.r {
        Ok(r) => format!("r = {r:+.2}"),
        Err(why) => format!("r undefined ({why})"),
    };
    let mut svg = format!(
        "<div class=\"chart-title\"><code>{}</code> vs <code>{}</code> · <b>{}</b></div>",
        esc(&c.y),
        esc(&c.x),
        esc(&r_text)
    );
    let _ = write!(
        svg,
        r##"<svg class="scatter" width="{w}" height="{hh}" role="img" aria-label="{y} vs {x}">
<line x1="{pad}" y1="{axy}" x2="{w}" y2="{axy}" stroke="#bbb"/><line x1="{pad}" y1="4" x2="{pad}" y2="{axy}" stroke="#bbb"/>
<text x="{pad}" y="{lx}">{x}: {x0:.3} … {x1:.3}</text><text x="{ty}" y="12">{y1:.3}</text><text x="{ty}" y="{axy}">{y0:.3}</text>"##,
        hh = h + 8.0,
        axy = h - pad + 8.0,
        lx = h + 2.0,
        ty = 2.0,
        x = esc(&c.x),
        y = esc(&c.y),
    );
    if c.r.is_ok() {
        let n = c.points.len() as f64;
        let (mx, my) = (c.points.iter().map(|p| p.0).sum::<f64>() / n, c.points.iter().map(|p| p.1).sum::<f64>() / n);
        let sxy: f64 = c.points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let sxx: f64 = c.points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let slope = sxy / sxx;
        let at = |x: f64| (my + slope * (x - mx)).clamp(y0, y1);
        let _ = write!(
            svg,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#3b7dd8" stroke-dasharray="4 3"/>"##,
            sx(x0),
            sy(at(x0)),
            sx(x1),
            sy(at(x1))
        );
    }
    // Points on the same spot fan out (a sunflower), so their number shows.
    let mut taken: std::collections::HashMap<(i64, i64), usize> = std::collections::HashMap::new();
    // An even sample when there are more points than a chart can show usefully.
    let drawn = c.points.len().min(MAX_POINTS);
    for &(x, y, i) in (0..drawn).map(|k| &c.points[k * c.points.len() / drawn]) {
        let e = entries[i];
        let (px, py) = (sx(x), sy(y));
        let k = taken.entry((px.round() as i64, py.round() as i64)).or_insert(0);
        let (angle, radius) = (*k as f64 * 2.4, 2.6 * (*k as f64).sqrt());
        *k += 1;
        let (px, py) = (px + radius * angle.cos(), py + radius * angle.sin());
        let fill = if e.failed() { "#b00020" } else { "#1b7f3b" };
        let _ = write!(
            svg,
            r##"<a href="{href}" class="point" data-episode="{key}"><title>{key}: {xn} = {x:.3}, {yn} = {y:.3} ({class})</title><circle cx="{cx:.1}" cy="{cy:.1}" r="4" fill="{fill}" fill-opacity="0.7"/></a>"##,
            href = esc(&link(e)),
            key = esc(&e.key()),
            xn = esc(&c.x),
            yn = esc(&c.y),
            class = esc(&e.failure_class),
            cx = px,
            cy = py,
        );
    }
    svg.push_str("</svg>");
    if drawn < c.points.len() {
        let _ = write!(
            svg,
            "<div class=\"muted sampled\">{} of {} episodes drawn, evenly spaced; r and the line use all</div>",
            count(drawn),
            count(c.points.len())
        );
    }
    svg
}

/// The most episodes a cluster or a step's flagged list links by name; the
/// rest are counted (the episode table lists failed episodes first).
pub const MAX_LISTED: usize = 100;

/// The most episodes a scatter chart draws: an even sample of the rest
/// (Pearson's r and the fitted line use every point).
pub const MAX_POINTS: usize = 1_000;

/// Rows an episode table shows at a time: a table of 20,000 rows laid out
/// at once took a browser seconds (a page of 45 MB, 14 s to open).
pub const PAGE_ROWS: usize = 500;

/// Which rows of a group's episode table a page holds.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    /// Every episode (a report file cannot fetch more): `per_page` in the
    /// table, the rest in `<template>`s of as many that the page script
    /// swaps in when a pager link is clicked.
    All { per_page: usize },
    /// Page `page` (1-based) of `per_page` rows; `href(n)` is page n's URL.
    Page { page: usize, per_page: usize, href: &'a dyn Fn(usize) -> String },
}

impl Rows<'_> {
    /// How many pages a table of `rows` rows has with these rows a page (at least one).
    pub fn pages(&self, rows: usize) -> usize {
        match self {
            Rows::All { per_page } | Rows::Page { per_page, .. } => rows.div_ceil(*per_page).max(1),
        }
    }
}

/// `n` with thousands separated: 20,000.
pub fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Links to at most [`MAX_LISTED`] episodes, then how many more there are.
fn listed(indices: &[usize], entries: &[&EpisodeEntry], link: &dyn Fn(&EpisodeEntry) -> String) -> String {
    let mut h: String = indices
        .iter()
        .take(MAX_LISTED)
        .map(|&i| format!("<a href=\"{}\">{}</a> ", esc(&link(entries[i])), esc(&entries[i].id)))
        .collect();
    if indices.len() > MAX_LISTED {
        let _ = write!(h, "<span class=\"muted more\">{}</span>", not_listed(indices.len()));
    }
    h.trim_end().to_string()
}

/// What a list cut at [`MAX_LISTED`] of `n` episodes says of the rest.
fn not_listed(n: usize) -> String {
    format!("and {} more (the episode table lists failed episodes first)", count(n - MAX_LISTED))
}

/// The sections of one group's insights: hints, timeline (with the
/// episodes flagged at each step), correlations, clusters and the episode
/// table (the `rows` of it). `link` gives an episode's trace view URL;
/// `scope` keeps element ids unique when a page holds several groups.
pub fn insight_sections(
    insights: &Insights,
    entries: &[&EpisodeEntry],
    link: &dyn Fn(&EpisodeEntry) -> String,
    scope: &str,
    rows: Rows<'_>,
) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<p>{} episodes, <span class=\"{}\">{} failed</span>; metric <code>{}</code>; failures clustered by <code>{}</code></p>",
        insights.episodes,
        if insights.failed > 0 { "bad" } else { "good" },
        insights.failed,
        esc(&insights.metric),
        insights.cluster_by.map_or("memory_state", |c| c.name())
    );
    h.push_str("<h3>Root-cause hints</h3>");
    if insights.hints.is_empty() {
        h.push_str("<p class=\"muted\">nothing stands out: no failures, no weak step, no strong correlation</p>");
    }
    for hint in &insights.hints {
        let _ = write!(h, "<div class=\"hint\">{}</div>", sentence(hint));
    }
    for problem in &insights.unreadable {
        let _ = write!(h, "<div class=\"hint bad\">unreadable trace: {}</div>", esc(problem));
    }

    h.push_str("<h3>Timeline per step</h3><p class=\"muted\">Columns are step indices across episodes: mean duration (policy + tool), the share of tool calls that succeeded, and the share of episodes whose memory holds no <code>null</code> a tool or fallback wrote. Click a step to list the episodes flagged there.</p>");
    h.push_str(&timeline_svg(&insights.steps, scope));
    for s in &insights.steps {
        let _ = write!(
            h,
            "<div class=\"step-detail panel\" data-step=\"{}\" data-scope=\"{}\" hidden><b>step {}</b>: {} episodes, tools {}, mean {:.0} ms, <span class=\"{}\">tool success {}</span>, memory consistency {}",
            s.index,
            esc(scope),
            s.index,
            s.episodes,
            s.tools.iter().map(|(t, n)| format!("<code>{}</code> x{n}", esc(t))).collect::<Vec<_>>().join(", "),
            s.mean_ms,
            status_class(s.success_rate()),
            num(s.success_rate()),
            num(s.memory_consistency())
        );
        if s.flagged.is_empty() {
            h.push_str("<p class=\"muted\">no episode failed or held a null at this step</p>");
        } else {
            let _ = write!(h, "<p>{} episode(s) flagged at this step:</p><ul>", count(s.flagged.len()));
            for &i in s.flagged.iter().take(MAX_LISTED) {
                let e = entries[i];
                let _ = write!(
                    h,
                    "<li><a href=\"{}\">{}</a> <span class=\"muted\">{}</span></li>",
                    esc(&link(e)),
                    esc(&e.key()),
                    esc(&e.relative)
                );
            }
            if s.flagged.len() > MAX_LISTED {
                let _ = write!(h, "<li class=\"muted more\">{}</li>", not_listed(s.flagged.len()));
            }
            h.push_str("</ul>");
        }
        h.push_str("</div>");
    }

    let _ = write!(h, "<h3>Correlations with <code>{}</code></h3>", esc(&insights.metric));
    if insights.correlations.is_empty() {
        h.push_str("<p class=\"muted\">no other metric to correlate with</p>");
    } else {
        h.push_str("<table class=\"correlations\"><tr><th>metric</th><th>Pearson r</th><th>n</th></tr>");
        for c in &insights.correlations {
            let r = match &c.r {
                Ok(r) => format!("<b>{r:+.3}</b>"),
                Err(why) => format!("<span class=\"muted\">undefined: {}</span>", esc(why)),
            };
            let _ = write!(h, "<tr><td><code>{}</code></td><td>{r}</td><td>{}</td></tr>", esc(&c.x), c.points.len());
        }
        h.push_str("</table>");
        let defined: Vec<&Correlation> = insights.correlations.iter().filter(|c| c.r.is_ok()).take(6).collect();
        if defined.is_empty() {
            let _ = write!(
                h,
                "<p class=\"muted\">no correlation is defined: <code>{}</code> or every other metric is constant here; pick another metric</p>",
                esc(&insights.metric)
            );
        } else {
            h.push_str("<div class=\"charts\">");
            for c in defined {
                let _ = write!(h, "<div class=\"chart\">{}</div>", scatter_svg(c, entries, link));
            }
            h.push_str("</div><p class=\"muted\">Each point is an episode (red: failed; points on one spot fan out); click one to open its trace.</p>");
        }
    }

    let _ = write!(
        h,
        "<h3>Failure clusters by <code>{}</code></h3>",
        insights.cluster_by.map_or("memory_state", |c| c.name())
    );
    if insights.clusters.is_empty() {
        h.push_str("<p class=\"good\">no failed episodes</p>");
    } else {
        let biggest = insights.clusters.iter().map(|c| c.members.len()).max().unwrap_or(1).max(1);
        h.push_str("<table class=\"clusters\"><tr><th>episodes</th><th>cluster</th><th>members</th></tr>");
        for c in &insights.clusters {
            let width = c.members.len() as f64 / biggest as f64 * 160.0;
            let _ = write!(
                h,
                "<tr data-cluster=\"{}\"><td><svg width=\"166\" height=\"14\"><rect width=\"{width:.1}\" height=\"12\" y=\"1\" fill=\"#b00020\"/><text x=\"{tx:.1}\" y=\"11\">{n}</text></svg></td><td>{}<br><span class=\"muted\">{}</span></td><td>{}</td></tr>",
                esc(&c.key),
                sentence(&c.label),
                esc(&c.key),
                listed(&c.members, entries, link),
                tx = (width + 4.0).min(140.0),
                n = c.members.len(),
            );
        }
        h.push_str("</table>");
    }

    let table_id = format!("episodes-{scope}");
    let fixed: Vec<&str> = ["error_rate", "memory_consistency"].into_iter().filter(|m| *m != insights.metric).collect();
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[b].failed().cmp(&entries[a].failed()).then(entries[a].id.cmp(&entries[b].id)));
    let total = order.len();
    let row = |i: usize| {
        let e = entries[i];
        format!(
            "<tr data-ok=\"{}\"{}><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}<td>{}</td><td class=\"muted\">{}</td></tr>",
            if e.failed() { 0 } else { 1 },
            if e.failed() { " class=\"failed\"" } else { "" },
            esc(&link(e)),
            esc(&e.id),
            esc(&e.variant),
            e.shard,
            esc(&e.outcome),
            if e.failed() { format!("<span class=\"bad\">{}</span>", esc(&e.failure_class)) } else { "ok".into() },
            num(insights.values.get(i).and_then(|v| v.get(&insights.metric)).copied()),
            fixed.iter().map(|m| format!("<td>{}</td>", num(e.metrics.get(*m).copied()))).collect::<String>(),
            e.metrics.get("resolution_time_s").map_or("-".into(), |s| format!("{s:.2}s")),
            esc(&e.relative),
        )
    };
    let (pager, shown, later) = match rows {
        Rows::All { per_page } => {
            let rows: Vec<String> = order.iter().map(|&i| row(i)).collect();
            rows_in_page(&table_id, &rows, per_page)
        }
        Rows::Page { page, per_page, href } => {
            let start = ((page.max(1) - 1) * per_page).min(total);
            let end = (start + per_page).min(total);
            let shown = order[start..end].iter().map(|&i| row(i)).collect();
            (pager(page, rows.pages(total), start, end, total, href, ""), shown, String::new())
        }
    };
    let _ = write!(
        h,
        "<h3>Episodes</h3><label><input type=\"checkbox\" class=\"failed-only\" data-table=\"{table_html_id}\"> failed only</label>{pager}\
         <table id=\"{table_html_id}\" class=\"episodes\"><tr><th>episode</th><th>variant</th><th>shard</th><th>outcome</th><th>failure</th><th>{}</th>{}<th>resolution</th><th>trace</th></tr>{shown}</table>{pager}{later}",
        esc(&insights.metric),
        fixed.iter().map(|m| format!("<th>{m}</th>")).collect::<String>(),
        table_html_id = esc(&table_id),
    );
    h
}

/// The rows of a table (`class="episodes"`, rows `<tr data-ok>`) in a page
/// that holds all of them, a file: the pager, the first `per_page` rows for
/// the table, and `<template>`s of as many rows for the others, parsed but
/// never laid out until the page script swaps one in (see [`Rows::All`]).
pub fn rows_in_page(table_id: &str, rows: &[String], per_page: usize) -> (String, String, String) {
    let per_page = per_page.max(1);
    if rows.len() <= per_page {
        return (String::new(), rows.concat(), String::new());
    }
    let total = rows.len();
    let (html_id, link_id) = (esc(table_id), url_segment(table_id));
    let data = format!(" data-table=\"{html_id}\" data-rows=\"{total}\" data-per-page=\"{per_page}\"");
    let pager = pager(1, total.div_ceil(per_page), 0, per_page, total, &|n| format!("#{link_id}-page-{n}"), &data);
    let later = rows[per_page..]
        .chunks(per_page)
        .map(|page| format!("<template class=\"rows\" data-table=\"{html_id}\">{}</template>", page.concat()))
        .collect();
    (pager, rows[..per_page].concat(), later)
}

/// The links between pages of an episode table, with the rows this one
/// holds; `data` goes into the `<p>` tag (the page script's marks).
fn pager(
    page: usize,
    pages: usize,
    start: usize,
    end: usize,
    total: usize,
    href: &dyn Fn(usize) -> String,
    data: &str,
) -> String {
    if pages <= 1 {
        return String::new();
    }
    let held = if start < end {
        format!("rows {}–{} of {}", count(start + 1), count(end), count(total))
    } else {
        format!("page {page} is past this table's last page, {pages}")
    };
    let go = |n: usize, text: &str| {
        if n == page || n == 0 || n > pages {
            format!(" · <span class=\"muted\">{text}</span>")
        } else {
            format!(" · <a href=\"{}\" data-page=\"{n}\">{text}</a>", esc(&href(n)))
        }
    };
    format!(
        "<p class=\"pager\"{data}>{held}, page {} of {}{}{}{}{}</p>",
        count(page),
        count(pages),
        go(1, "first"),
        go(page - 1, "‹ previous"),
        go(page + 1, "next ›"),
        go(pages, "last")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::insights::StepStat;

    #[test]
    fn a_scope_is_text_in_every_id_and_link_it_names() {
        // A variant name from a summary or a trace header, as `serve` takes it for the scope.
        let scope = "a\"><i id=x>planted</i>";
        let step = StepStat { index: 1, episodes: 1, ..Default::default() };
        let insights = Insights { steps: vec![step], ..Default::default() };
        let rows: Vec<String> = (0..3).map(|i| format!("<tr data-ok=\"1\"><td>{i}</td></tr>")).collect();
        let sections = insight_sections(&insights, &[], &|_| String::new(), scope, Rows::All { per_page: 500 });
        let (pager, _, later) = rows_in_page(&format!("episodes-{scope}"), &rows, 1);
        for html in [&sections, &pager, &later] {
            // Before: `id="timeline-a"><i id=x>planted</i>"` and the same in the table's id.
            assert!(!html.contains("<i id=x>"), "the scope became markup: {html}");
        }
        let shown = esc(scope);
        assert!(sections.contains(&format!("<svg id=\"timeline-{shown}\" class=\"timeline\"")), "{sections}");
        assert!(sections.contains(&format!("<table id=\"episodes-{shown}\" class=\"episodes\">")), "{sections}");
        assert!(sections.contains(&format!("class=\"failed-only\" data-table=\"episodes-{shown}\">")));
        assert!(sections.contains(&format!("data-step=\"1\" data-scope=\"{shown}\" hidden>")));
        // Links carry it percent-encoded: the page script decodes the fragment.
        let in_link = url_segment(scope);
        assert!(sections.contains(&format!("<a href=\"#step={in_link}/1\" class=\"step-col\"")), "{sections}");
        assert!(pager.contains(&format!("<a href=\"#episodes-{in_link}-page-2\" data-page=\"2\">")), "{pager}");
        assert!(later.starts_with(&format!("<template class=\"rows\" data-table=\"episodes-{shown}\">")));
    }

    #[test]
    fn a_long_table_holds_a_page_and_templates_of_the_rest_in_order() {
        let rows: Vec<String> = (0..1_100).map(|i| format!("<tr data-ok=\"1\"><td>{i}</td></tr>")).collect();
        let (pager, shown, later) = rows_in_page("t", &rows, 500);
        assert!(pager.starts_with("<p class=\"pager\" data-table=\"t\" data-rows=\"1100\" data-per-page=\"500\">"));
        assert!(pager.contains("rows 1–500 of 1,100, page 1 of 3"), "{pager}");
        assert_eq!(shown, rows[..500].concat());
        let templates: Vec<&str> = later.split("</template>").filter(|t| !t.is_empty()).collect();
        assert_eq!(templates.len(), 2);
        assert_eq!(templates[0], format!("<template class=\"rows\" data-table=\"t\">{}", rows[500..1000].concat()));
        assert_eq!(templates[1], format!("<template class=\"rows\" data-table=\"t\">{}", rows[1000..].concat()));
        // A table that fits is the table alone.
        assert_eq!(rows_in_page("t", &rows[..500], 500), (String::new(), rows[..500].concat(), String::new()));
    }

    #[test]
    fn counts_are_grouped_by_thousands() {
        let cases = [(0, "0"), (999, "999"), (1_000, "1,000"), (20_000, "20,000"), (1_234_567, "1,234,567")];
        for (n, text) in cases {
            assert_eq!(count(n), text);
        }
    }
}
