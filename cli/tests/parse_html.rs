//! `basecamp trace parse FILE --output html`: `basecamp serve`'s episode
//! page as one self-contained file (no server, nothing fetched), with no way
//! for trace contents to inject markup; a damaged trace's page says so.

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/http.rs"]
mod http;

use std::path::Path;
use std::process::{Command, Output};

use basecamp_trace::pb::{MemoryDelta, MemorySource, StepStatus, record::Body};
use basecamp_trace::synthetic::{EpisodeShape, generate};
use fixtures::{NAMESPACE, TASK, shard_dir, write_run};
use http::{Server, get};

fn parse_html(dir: &Path, file: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .current_dir(dir)
        .args(["trace", "parse", "--output", "html"])
        .arg(file)
        .args(extra)
        .output()
        .expect("the basecamp binary runs")
}

/// `text` without the first part from `start` to the end of `end`.
fn cut(text: &str, start: &str, end: &str) -> String {
    let from = text.find(start).unwrap_or_else(|| panic!("no {start:?}"));
    let to = from + text[from..].find(end).unwrap_or_else(|| panic!("no {end:?}")) + end.len();
    format!("{}{}", &text[..from], &text[to..])
}

#[test]
fn the_page_is_the_served_episode_page_without_its_links_to_the_server() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let server = Server::start(dir.path());
    let served = get(&server.addr, &format!("/tasks/{NAMESPACE}/{TASK}/episodes/a/ep-000")).text();

    // Named as serve names it (relative to the directory served), so the
    // file line of both views is the same.
    let file = shard_dir(Path::new(""), TASK, "a").join("ep-000.trace");
    let out = parse_html(dir.path(), &file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = String::from_utf8(out.stdout).unwrap();

    // The view serve draws: its timeline, the failed call, the null write,
    // the token logits and the metrics of the shard's summary.json.
    for expected in [
        "<section class=\"episode-view page\"><h1>episode <code>ep-000</code></h1>",
        "<h2>Timeline</h2><table class=\"timeline-steps\">",
        "data-status=\"fallback\"",
        "<tr class=\"nullw\"><td><code>shipping_status</code>",
        "title=\"#1 id 101 logprob -0.900",
        "metrics from the shard's summary.json",
    ] {
        assert!(page.contains(expected), "missing {expected:?}");
    }
    // The same page, less what needs the server: its navigation and the raw bytes' link.
    let offline = cut(&cut(&served, "<nav>", "</nav>"), " · <a href=\"/raw/", "raw .trace</a>");
    assert_eq!(page, offline);
}

#[test]
fn the_page_is_self_contained_and_escapes_trace_contents() {
    // The first seed whose episode holds a call that fell back.
    let mut ep = (1..)
        .map(|seed| generate(&EpisodeShape { seed, steps: 12, tokens_per_step: 3, ..Default::default() }))
        .find(|ep| {
            ep.steps
                .iter()
                .flatten()
                .any(|r| matches!(&r.body, Some(Body::PlanStep(p)) if p.status == StepStatus::Fallback as i32))
        })
        .unwrap();
    ep.steps[2].push(basecamp_trace::pb::Record {
        step: 2,
        body: Some(Body::MemoryDelta(MemoryDelta {
            key: "note".into(),
            before_json: None,
            after_json: Some("\"<script>alert(1)</script>\"".into()),
            source: MemorySource::SystemInjection as i32,
            origin: "inj-1".into(),
        })),
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ep.trace");
    std::fs::write(&file, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let out = parse_html(dir.path(), &file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let html = String::from_utf8(out.stdout).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.trim_end().ends_with("</html>"));
    for section in [
        "<h2>Timeline</h2>",
        "<h2>Steps</h2>",
        "token logits (3 tokens)",
        "<table class=\"memory\">",
        "<h2>Reward</h2>",
        "<h2>Errors</h2>",
        "<h2>End</h2>",
        "metrics from the trace alone",
    ] {
        assert!(html.contains(section), "missing {section}");
    }
    assert_eq!(html.matches("<tr class=\"step-row\"").count(), 12, "one timeline row a call");
    for tool in ["tracking_api", "order_lookup"] {
        assert!(html.contains(tool));
    }
    assert!(html.contains("data-status=\"fallback\""), "a call that fell back shows its status");
    assert!(html.contains("tool_call_accuracy"));
    // Trace contents cannot inject markup: the one script is the page's own.
    assert_eq!(html.matches("<script").count(), 1, "a script tag got through");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    // Nothing is fetched, and every link stays in the page.
    for external in ["src=", "<link", "http://", "https://", "@import", "url("] {
        assert!(!html.contains(external), "the page references {external}");
    }
    assert_eq!(html.matches("href=\"").count(), html.matches("href=\"#").count(), "a link leaves the page");
}

#[test]
fn a_damaged_trace_draws_what_was_read_and_says_it_is_damaged() {
    let bytes = generate(&EpisodeShape { seed: 3, steps: 10, tokens_per_step: 3, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cut.trace");
    std::fs::write(&file, &bytes[..bytes.len() * 2 / 3]).unwrap();

    let out = parse_html(dir.path(), &file, &["--allow-truncated"]);
    assert_eq!(out.status.code(), Some(0), "--allow-truncated accepts a clean truncation");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("warning: ") && stderr.contains("cut.trace"), "{stderr}");
    let html = String::from_utf8(out.stdout).unwrap();
    let notice = format!(
        "<div class=\"hint bad damage\">damaged trace, showing the records before the damage: {}",
        file.display()
    );
    assert!(html.contains(&notice), "the page does not say the trace is damaged");
    assert!(html.contains("<tr class=\"step-row\" data-step=\"1\""), "the steps read are drawn");
    assert!(html.contains("failure class <span class=\"bad\">damaged_trace</span>"));
    assert!(html.trim_end().ends_with("</html>"));

    // Without it the page is still written, and the exit status says the trace is damaged.
    let out = parse_html(dir.path(), &file, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&notice));
}

#[test]
fn token_logits_past_the_cap_are_counted_not_drawn() {
    // 22,000 tokens; the page draws 20,000 (serve's episode page does the same).
    let bytes = generate(&EpisodeShape { seed: 5, steps: 11, tokens_per_step: 2000, top_k: 1, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("long.trace");
    std::fs::write(&file, bytes).unwrap();
    let out = parse_html(dir.path(), &file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let html = String::from_utf8(out.stdout).unwrap();
    assert_eq!(html.matches("<span class=\"tok\"").count(), 20_000);
    assert!(html.contains("20000 token logits drawn, 2000 more in the trace"));
}
