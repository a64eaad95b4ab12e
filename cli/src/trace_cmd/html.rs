//! The page `basecamp trace report` writes: a table of the groups (task and
//! variant), each group's insight sections (shared with `basecamp serve`'s
//! task page), and every episode's trace view as a hidden drawer that a
//! click (a `#episode=<namespace>/<task>/<variant>/<id>` link) opens — so the report is
//! one file that works offline. The page is written as it is drawn, one
//! episode's view at a time, each packed until opened.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::ops::ControlFlow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use basecamp_trace::inputs::for_each_ordered;
use basecamp_trace::{LeftOut, TraceContents};
use flate2::Compression;
use flate2::write::GzEncoder;

use crate::serve::catalog::EpisodeEntry;
use crate::serve::episode;
use crate::serve::episode::StepAnchors;
use crate::serve::html::{
    PACKED_VIEW_TYPE, PAGE_ROWS, Rows, esc, insight_sections, not_measured_note, num, page_end, page_start, url_segment,
};
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

/// The in-page key of an episode's trace view: namespace, task, variant and
/// id (a group is one namespace's task variant, so two namespaces may hold
/// the same episode id), each percent-encoded so that no `/` of a name
/// blurs where a segment ends; it never holds `:` or an HTML special.
pub fn view_key(e: &EpisodeEntry) -> String {
    [&e.namespace, &e.task, &e.variant, &e.id].map(|segment| url_segment(segment)).join("/")
}

/// The fragment that opens an episode's drawer: the page script decodes the
/// fragment once (`decodeURIComponent`) and looks up the drawer by the
/// result, so the key is encoded once more (an id holding `%` opens too).
pub fn view_link(e: &EpisodeEntry) -> String {
    let key: Vec<String> = view_key(e).split('/').map(url_segment).collect();
    format!("#episode={}", key.join("/"))
}

/// The drawer's step panels, `episode:<key>:s<n>`, linked as
/// `#episode=<key>:s<n>`: unique on a page of many drawers, and a link the
/// page script answers by keeping the drawer open at that panel.
fn drawer_anchors(e: &EpisodeEntry) -> StepAnchors {
    StepAnchors { id_prefix: format!("episode:{}:s", view_key(e)), href_prefix: format!("{}:s", view_link(e)) }
}

/// Writes the page to `out`. `load` reads an episode's trace when its view
/// is drawn (at most the given number of token logits decoded, the rest
/// counted per step), on `jobs` threads, in order; each view is written packed (see
/// [`packed_drawer`]) as soon as it and the ones before it are, so memory
/// holds a few views whatever the number of episodes.
pub fn write(
    out: &mut impl Write,
    groups: &[Group<'_>],
    inputs: &[String],
    problems: &[String],
    jobs: usize,
    load: impl Fn(&EpisodeEntry, usize) -> Result<(TraceContents, LeftOut), String> + Sync,
) -> io::Result<()> {
    let metric = groups.first().map_or("", |g| g.insights.metric.as_str());
    out.write_all(page_start(&format!("trace report: {metric}")).as_bytes())?;
    out.write_all(summary(groups, inputs, problems, metric).as_bytes())?;
    let entries: Vec<&EpisodeEntry> = groups.iter().flat_map(|g| g.entries.iter().copied()).collect();
    let mut failed = None;
    for_each_ordered(
        &entries,
        jobs,
        |e| {
            let view = match load(e, REPORT_TOKEN_CAP) {
                Ok((contents, undrawn)) => {
                    episode::render_with(e, &contents, &undrawn, REPORT_TOKEN_CAP, None, &drawer_anchors(e))
                }
                Err(problem) => format!("<h1>episode {}</h1><p class=\"bad\">{}</p>", esc(&e.id), esc(&problem)),
            };
            packed_drawer(&view_key(e), &view)
        },
        |_, drawer| match out.write_all(drawer.as_bytes()) {
            Ok(()) => ControlFlow::Continue(()),
            Err(error) => {
                // The rest is neither read nor drawn.
                failed = Some(error);
                ControlFlow::Break(())
            }
        },
    );
    if let Some(error) = failed {
        return Err(error);
    }
    out.write_all(page_end().as_bytes())
}

/// The groups' table and each group's insight sections.
fn summary(groups: &[Group<'_>], inputs: &[String], problems: &[String], metric: &str) -> String {
    let mut h =
        format!("<h1>trace report: <code>{}</code></h1><p class=\"muted\">{}</p>", esc(metric), esc(&inputs.join(" ")));
    h.push_str(
        "<table id=\"groups\"><tr><th>namespace</th><th>task</th><th>variant</th><th>episodes</th><th>failed</th>",
    );
    let _ = write!(h, "<th>mean {}</th><th>hints</th></tr>", esc(metric));
    for (i, g) in groups.iter().enumerate() {
        // Over the episodes that measured the agent, as run.json's aggregate.
        let measured: Vec<&&EpisodeEntry> = g.entries.iter().filter(|e| e.measured()).collect();
        let values: Vec<f64> = measured.iter().filter_map(|e| e.metrics.get(metric).copied()).collect();
        let mean = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
        let not_measured = not_measured_note(g.entries.len() - measured.len());
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td><a href=\"#group-{i}\"><b>{}</b></a></td><td>{}{not_measured}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
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
    for (i, g) in groups.iter().enumerate() {
        let _ = write!(h, "<h2 id=\"group-{i}\">{} / variant {}</h2>", esc(g.task), esc(g.variant));
        h.push_str(&insight_sections(
            &g.insights,
            &g.entries,
            &view_link,
            &format!("g{i}"),
            Rows::All { per_page: PAGE_ROWS },
        ));
    }
    h
}

/// An episode's hidden drawer with its view gzipped and base64-encoded in a
/// script element the browser neither runs nor parses: a view is ~270 KB of
/// HTML (mostly token-logit tables) that compresses ~8x, and a page with
/// thousands of parsed hidden views loads slowly. The page script inflates
/// a drawer when it is first opened (`DecompressionStream`, in every
/// current browser).
pub fn packed_drawer(key: &str, view: &str) -> String {
    let mut gz = GzEncoder::new(Vec::with_capacity(view.len() / 8), Compression::default());
    gz.write_all(view.as_bytes()).expect("writing to a Vec cannot fail");
    let packed = BASE64.encode(gz.finish().expect("writing to a Vec cannot fail"));
    format!(
        "<section class=\"episode-view drawer\" id=\"episode:{}\" hidden><a class=\"close\" href=\"#\">close ✕</a>\
         <script type=\"{PACKED_VIEW_TYPE}\">{packed}</script></section>",
        esc(key)
    )
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;
    use crate::serve::html::page;

    /// The view a packed drawer holds, inflated as the page script does.
    fn unpack(drawer: &str) -> String {
        let open = format!("<script type=\"{PACKED_VIEW_TYPE}\">");
        let start = drawer.find(&open).expect("a packed view") + open.len();
        let end = start + drawer[start..].find("</script>").expect("its end");
        let gz = BASE64.decode(&drawer[start..end]).expect("base64");
        let mut view = String::new();
        flate2::read::GzDecoder::new(gz.as_slice()).read_to_string(&mut view).expect("gzip");
        view
    }

    #[test]
    fn a_drawer_packs_its_view_whole_and_hides_it_from_the_parser() {
        let view = "<h1>episode e&lt;1&gt;</h1><script>alert(1)</script></section><p>ünïcode ✕</p>".repeat(500);
        let drawer = packed_drawer("t/a/e<1>", &view);
        assert!(drawer.starts_with("<section class=\"episode-view drawer\" id=\"episode:t/a/e&lt;1&gt;\" hidden>"));
        assert_eq!(unpack(&drawer), view);
        // Nothing of the view is markup until the script inflates it.
        assert_eq!(drawer.matches("</script>").count(), 1);
        assert_eq!(drawer.matches("<section").count(), 1);
        assert!(drawer.len() < view.len() / 10, "{} bytes for a {} byte view", drawer.len(), view.len());
    }

    fn entry(namespace: &str, id: &str) -> EpisodeEntry {
        EpisodeEntry {
            namespace: namespace.into(),
            task: "shop".into(),
            variant: "a".into(),
            shard: 0,
            id: id.into(),
            outcome: "completed".into(),
            failure_class: "ok".into(),
            metrics: Default::default(),
            from_summary: false,
            trace: format!("{id}.trace").into(),
            relative: format!("{id}.trace"),
            started_unix_nanos: 0,
            digest: Default::default(),
        }
    }

    /// What the page script's `decodeURIComponent` makes of a fragment.
    fn decode_uri_component(text: &str) -> String {
        let mut bytes = Vec::new();
        let mut rest = text.as_bytes();
        while let Some((&b, after)) = rest.split_first() {
            if b == b'%' {
                let hex = std::str::from_utf8(&after[..2]).expect("two hex digits");
                bytes.push(u8::from_str_radix(hex, 16).expect("hex"));
                rest = &after[2..];
            } else {
                bytes.push(b);
                rest = after;
            }
        }
        String::from_utf8(bytes).expect("UTF-8")
    }

    #[test]
    fn each_episode_has_its_own_drawer_and_its_link_finds_it() {
        let ids = ["ep-1", "ep 50%", "a/b", "100%25", "ünï\"<x>"];
        let mut keys = Vec::new();
        for namespace in ["team-a", "team-b"] {
            for id in ids {
                let e = entry(namespace, id);
                let (key, link) = (view_key(&e), view_link(&e));
                // As the page script opens it: the fragment decoded once, after `episode=`.
                let fragment = link.strip_prefix("#episode=").expect("an episode link");
                let opened = decode_uri_component(fragment);
                assert_eq!(opened, key, "{link}");
                let drawer = packed_drawer(&key, "");
                assert!(drawer.contains(&format!(" id=\"episode:{opened}\" hidden>")), "{drawer}");
                assert!(!key.contains(':') && esc(&key) == key, "{key}");
                keys.push(key);
            }
        }
        assert_eq!(keys[1], "team-a/shop/a/ep%2050%25");
        keys.sort();
        keys.dedup();
        // Before: `shop/a/ep-1` (and every other id) in both namespaces alike.
        assert_eq!(keys.len(), 2 * ids.len(), "{keys:?}");
    }

    #[test]
    fn the_page_script_inflates_the_packed_type_the_report_writes() {
        let shell = page("t", "");
        assert!(shell.contains(&format!("script[type=\"{PACKED_VIEW_TYPE}\"]")));
        assert!(shell.contains("new DecompressionStream('gzip')"));
    }
}
