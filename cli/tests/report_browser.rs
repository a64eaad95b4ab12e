//! `basecamp trace report` and `basecamp serve` in a real browser: Debian's
//! chromium, headless, renders the report of a real `basecamp run
//! examples/ecommerce`, the served pages and the page `basecamp trace parse
//! --output html` writes (opened from its file); screenshots must be real
//! images, the console must stay clean, and the interactive parts (the
//! episode drawer a point or row opens, the step list a timeline column
//! opens) must work — read back from the DOM after the scripts ran.
//!
//! Screenshots are kept under `<target>/tmp/browser/` for a person to look at.
//! Without chromium the tests try `scripts/browser.sh install`; only when
//! that fails do they skip, saying so.

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/http.rs"]
mod http;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn shots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn basecamp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

/// The browser, installed by scripts/browser.sh when missing; `None` (and a
/// message) only when it cannot be installed.
fn chromium() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let find = || {
                std::env::var_os("BASECAMP_CHROMIUM")
                    .map(PathBuf::from)
                    .into_iter()
                    .chain(["/usr/bin/chromium", "/usr/bin/chromium-browser"].map(PathBuf::from))
                    .find(|p| p.is_file())
            };
            if let Some(found) = find() {
                return Some(found);
            }
            let install = Command::new("bash")
                .arg(repo().join("scripts/browser.sh"))
                .arg("install")
                .stdin(Stdio::null())
                .output();
            let found = find();
            if found.is_none() {
                let why = match install {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").to_string(),
                    Err(e) => e.to_string(),
                };
                eprintln!("SKIPPED: chromium is not installed and `scripts/browser.sh install` failed: {why}");
            }
            found
        })
        .clone()
}

/// One headless chromium run at a time (the machine is small), with a fresh profile.
fn browse(bin: &Path, extra: &[&str], url: &str) -> (String, String) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).ok();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).ok();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish {url} within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (out.join().unwrap(), err.join().unwrap())
}

/// Console messages and uncaught exceptions in chromium's log (our pages log nothing).
fn console_errors(log: &str) -> Vec<String> {
    log.lines().filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught")).map(str::to_string).collect()
}

/// The page's DOM after its scripts ran, with the console checked.
fn dom(bin: &Path, url: &str) -> String {
    let (dom, log) = browse(bin, &["--dump-dom", "--virtual-time-budget=3000"], url);
    assert!(console_errors(&log).is_empty(), "console errors on {url}: {:?}", console_errors(&log));
    assert!(dom.contains("<html lang=\"en\" data-ready=\"1\">"), "the page script did not finish on {url}");
    dom
}

/// A screenshot, checked to be a real PNG of the window's size with something
/// drawn: a blank white 1280x700 page compresses to about 4 KB, so each page
/// must weigh at least `min_bytes` (its text, tables and charts).
fn screenshot(bin: &Path, url: &str, name: &str, (w, h): (u32, u32), min_bytes: usize) -> PathBuf {
    let path = shots_dir().join(name);
    let _ = std::fs::remove_file(&path);
    let (_, log) = browse(bin, &[&format!("--screenshot={}", path.display()), &format!("--window-size={w},{h}")], url);
    assert!(console_errors(&log).is_empty(), "console errors on {url}: {:?}", console_errors(&log));
    let png = std::fs::read(&path).unwrap_or_else(|e| panic!("no screenshot of {url}: {e}\n{log}"));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name} is not a PNG");
    assert_eq!(&png[12..16], b"IHDR");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (w, h), "{name}");
    assert!(png.len() >= min_bytes, "{name} looks empty: {} bytes", png.len());
    path
}

/// One real `basecamp run examples/ecommerce` for every test here.
fn ecommerce_run() -> &'static Path {
    static RUN: OnceLock<tempfile::TempDir> = OnceLock::new();
    RUN.get_or_init(|| {
        let out = tempfile::tempdir().unwrap();
        let example = repo().join("examples/ecommerce");
        let run = basecamp(&["run", example.to_str().unwrap(), "--no-progress", "--out", out.path().to_str().unwrap()]);
        assert!(
            run.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        out
    })
    .path()
}

fn code_html(hint: &str) -> String {
    hint.split('`')
        .enumerate()
        .map(|(i, p)| if i % 2 == 1 { format!("<code>{p}</code>") } else { p.to_string() })
        .collect()
}

/// (memory_consistency, error_rate) of variant a's episodes, from the shard summaries.
fn a_metrics(run: &Path) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(run.join("a")).unwrap().flatten() {
        let Ok(text) = std::fs::read(shard.path().join("summary.json")) else { continue };
        let summary: Value = serde_json::from_slice(&text).unwrap();
        for e in summary["episodes"].as_array().unwrap() {
            let m = &e["metrics"];
            out.push((m["memory_consistency"].as_f64().unwrap(), m["error_rate"].as_f64().unwrap()));
        }
    }
    out
}

#[test]
fn the_console_check_catches_a_throwing_page() {
    let Some(bin) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("throws.html");
    std::fs::write(&page, "<html><body><script>throw new Error('boom')</script></body></html>").unwrap();
    let (_, log) = browse(&bin, &["--dump-dom"], &format!("file://{}", page.display()));
    let errors = console_errors(&log);
    assert!(errors.iter().any(|l| l.contains("Uncaught Error: boom")), "{log}");
}

#[test]
fn the_report_of_a_real_run_renders_and_opens_an_episode_from_a_click_link() {
    let run = ecommerce_run();
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("trace_report.html");
    let result = basecamp(&[
        "trace",
        "report",
        run.to_str().unwrap(),
        "--metric",
        "error_rate",
        "--cluster-by",
        "memory_state",
        "-o",
        report.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&result.stderr));
    assert!(stdout.contains("120 episodes"), "{stdout}");
    let html = std::fs::read_to_string(&report).unwrap();

    // Self-contained: nothing is fetched.
    for needle in ["src=", "<link", "http://", "https://", "@import", "url("] {
        assert!(!html.contains(needle), "the report must not reference {needle:?}");
    }
    // The root cause `basecamp run` found, from the same traces.
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    let a = summary["variants"].as_array().unwrap().iter().find(|v| v["name"] == "a").unwrap();
    let hint = a["root_causes"][0]["hint"].as_str().unwrap();
    assert!(html.contains(&code_html(hint)), "missing the root cause {hint:?}");
    // Pearson r of error_rate and memory_consistency over variant a, computed here.
    let (mc, er): (Vec<f64>, Vec<f64>) = a_metrics(run).into_iter().unzip();
    let r = fixtures::pearson(&mc, &er);
    let row = format!("<tr><td><code>memory_consistency</code></td><td><b>{r:+.3}</b></td><td>{}</td></tr>", mc.len());
    assert!(html.contains(&row), "missing {row}");
    // A failing episode's point and row link to its in-page trace view.
    let failed = a["episodes"].as_array().unwrap().iter().find(|e| e["failure_class"] != "ok").unwrap();
    let key = format!("default/shipping-delay-ab/a/{}", failed["id"].as_str().unwrap());
    assert!(html.contains(&format!("<a href=\"#episode={key}\" class=\"point\"")));
    assert!(html.contains(&format!("<section class=\"episode-view drawer\" id=\"episode:{key}\" hidden>")));
    // Each view is packed until its drawer opens: none of its markup is in the page as written.
    let unpacked = fixtures::unpacked_report(&html);
    assert!(!html.contains("<h2>Timeline</h2>") && unpacked.contains("<h2>Timeline</h2>"));

    let Some(bin) = chromium() else { return };
    let url = format!("file://{}", report.display());
    let page = dom(&bin, &url);
    assert!(!page.contains("data-open-episode"), "no drawer is open before a click");
    // Clicking the point follows its link: the fragment opens the drawer.
    let opened = dom(&bin, &format!("{url}#episode={key}"));
    assert!(opened.contains(&format!("<body data-open-episode=\"{key}\">")), "the episode view did not open");
    assert!(opened.contains(&format!("<section class=\"episode-view drawer\" id=\"episode:{key}\">")));
    assert!(opened.contains("data-status=\"fallback\""), "its timeline shows the failed call");
    // A timeline column lists the episodes flagged at that step.
    let step = dom(&bin, &format!("{url}#step=1"));
    assert!(step.contains("<body data-open-step=\"1\">"));
    assert!(
        step.contains("<div class=\"step-detail panel\" data-step=\"1\" data-scope=\"g0\">"),
        "step 1's list is shown"
    );

    screenshot(&bin, &url, "report.png", (1400, 2400), 100_000);
    screenshot(&bin, &format!("{url}#episode={key}"), "report-episode.png", (1400, 1200), 60_000);
}

/// A report of several groups, one of them in a second namespace holding
/// the same episode ids and an id with `%` and a space: each drawer opens
/// from its own link, a drawer's step link keeps it open at that step's
/// panel, and a timeline column opens its own group's step list alone.
#[test]
fn a_report_of_several_groups_opens_what_was_clicked_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::write_run(dir.path());
    let other = dir.path().join("team-b").join(fixtures::TASK).join("a").join("shard-0");
    std::fs::create_dir_all(&other).unwrap();
    fixtures::write_episode_as(&other.join("ep-000.trace"), "team-b", fixtures::TASK, "a", "ep-000", 1);
    // Episode 0 of variant a fails: its drawer has steps 1 and 2.
    fixtures::write_episode_as(&other.join("ep-50.trace"), "team-b", fixtures::TASK, "a", "ep 50%", 0);
    let report = dir.path().join("r.html");
    let result = basecamp(&["trace", "report", dir.path().to_str().unwrap(), "-o", report.to_str().unwrap()]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let html = std::fs::read_to_string(&report).unwrap();
    // Before: both namespaces' ep-000 were the drawer `shop/a/ep-000`, twice.
    for key in ["team-a/shop/a/ep-000", "team-b/shop/a/ep-000"] {
        let drawer = format!("<section class=\"episode-view drawer\" id=\"episode:{key}\" hidden>");
        assert_eq!(html.matches(&drawer).count(), 1, "{key}");
    }
    // The key percent-encodes the id; the link encodes it once more, as the page script decodes it once.
    let key = "team-b/shop/a/ep%2050%25";
    let link = "#episode=team-b/shop/a/ep%252050%2525";
    assert!(html.contains(&format!("<a href=\"{link}\">ep 50%</a>")), "the episode table links its drawer");
    let unpacked = fixtures::unpacked_report(&html);
    assert!(unpacked.contains(&format!("<a href=\"{link}:s1\">1</a>")), "its timeline links its own step panel");
    assert!(unpacked.contains(&format!("<div class=\"panel\" id=\"episode:{key}:s1\">")));
    assert!(!unpacked.contains("id=\"s1\""), "no two drawers share a step panel's id");
    assert!(html.contains("<a href=\"#step=g0/1\" class=\"step-col\" data-step=\"1\">"));

    let Some(bin) = chromium() else { return };
    let url = format!("file://{}", report.display());
    // Before: decoded to `ep 50%`, no drawer had that id, so nothing opened.
    let opened = dom(&bin, &format!("{url}{link}"));
    assert!(opened.contains(&format!("<body data-open-episode=\"{key}\">")), "the drawer did not open");
    // Before: `#s2` hid the drawer it was clicked in.
    let at_step = dom(&bin, &format!("{url}{link}:s2"));
    assert!(at_step.contains(&format!("data-open-episode=\"{key}\"")), "a step link closed its drawer");
    assert!(at_step.contains(&format!("data-open-panel=\"episode:{key}:s2\"")));
    assert!(at_step.contains(&format!("<section class=\"episode-view drawer\" id=\"episode:{key}\">")));
    // Before: every group's step-1 list opened.
    let step = dom(&bin, &format!("{url}#step=g1/1"));
    assert!(step.contains("<body data-open-step=\"1\">"));
    assert!(step.contains("<div class=\"step-detail panel\" data-step=\"1\" data-scope=\"g1\">"), "g1's list opens");
    for other in ["g0", "g2", "g3"] {
        let hidden = format!("<div class=\"step-detail panel\" data-step=\"1\" data-scope=\"{other}\" hidden=\"\">");
        assert!(step.contains(&hidden), "{other}'s step list stays shut");
    }
}

/// A report of 1,100 episodes: 500 rows in its table, the other pages in
/// templates; `#<table>-page-<n>` (a pager link) swaps page n in, failed
/// rows first, and both pagers follow. The rows of every page together are
/// every episode once. (20,000 rows in one table took chromium 7 s to lay out.)
#[test]
fn a_long_report_table_is_paged_in_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let n = 1_100;
    fixtures::write_traces(dir.path(), fixtures::TASK, "a", n);
    let failed = (0..n).filter(|&i| fixtures::fails("a", i)).count();
    let report = dir.path().join("r.html");
    let result = basecamp(&["trace", "report", dir.path().to_str().unwrap(), "-o", report.to_str().unwrap()]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let html = std::fs::read_to_string(&report).unwrap();
    assert_eq!(html.matches("<template class=\"rows\" data-table=\"episodes-g0\">").count(), 2);
    assert_eq!(html.matches("<tr data-ok=").count(), n as usize, "every row is in the file");
    assert!(html.contains("rows 1–500 of 1,100, page 1 of 3"));
    assert!(html.contains("<a href=\"#episodes-g0-page-2\" data-page=\"2\">next ›</a>"));

    let Some(bin) = chromium() else { return };
    let url = format!("file://{}", report.display());
    let table_rows = |page: &str| -> Vec<(String, bool)> {
        let table = &page[page.find("<table id=\"episodes-g0\"").unwrap()..];
        let table = &table[..table.find("</table>").unwrap()];
        table
            .split("<tr data-ok=\"")
            .skip(1)
            .map(|row| {
                let id = row.split("</a>").next().unwrap().rsplit('>').next().unwrap().to_string();
                (id, row.starts_with('0'))
            })
            .collect()
    };
    let mut seen = Vec::new();
    for page in 1..=3 {
        let dom = dom(&bin, &format!("{url}#episodes-g0-page-{page}"));
        let shown = table_rows(&dom);
        assert_eq!(shown.len(), if page < 3 { 500 } else { 100 }, "page {page}");
        let label = format!("page {page} of 3");
        assert_eq!(dom.matches(&label).count(), 2, "both pagers say {label}");
        seen.extend(shown);
    }
    assert!(seen[..failed].iter().all(|(_, f)| *f) && seen[failed..].iter().all(|(_, f)| !f), "failed first");
    let mut ids: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n as usize, "every episode on one page");
    let last = dom(&bin, &format!("{url}#episodes-g0-page-3"));
    assert!(last.contains("rows 1,001–1,100 of 1,100, page 3 of 3"));
    assert!(last.contains("<a href=\"#episodes-g0-page-2\" data-page=\"2\">‹ previous</a>"));
}

#[test]
fn served_pages_render_in_the_browser() {
    let Some(bin) = chromium() else { return };
    let run = ecommerce_run();
    let server = http::Server::start(run);
    let base = format!("http://{}", server.addr);

    let index = dom(&bin, &format!("{base}/"));
    assert!(index.contains("href=\"/tasks/default/shipping-delay-ab\""));
    let task = format!("{base}/tasks/default/shipping-delay-ab?variant=a");
    let page = dom(&bin, &format!("{task}#step=1"));
    assert!(page.contains("<body data-open-step=\"1\">"));
    assert!(page.contains("id=\"variant-a\"") && !page.contains("id=\"variant-b\""));
    assert!(page.contains("was set to null by the fallback of <code>track_order</code>"));
    // The "failed only" box starts unticked: every row is shown.
    assert!(page.contains("data-filtered=\"0\""));

    let summary: Value = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    let a = summary["variants"].as_array().unwrap().iter().find(|v| v["name"] == "a").unwrap();
    let failed = a["episodes"].as_array().unwrap().iter().find(|e| e["failure_class"] != "ok").unwrap();
    let episode = format!("{base}/tasks/default/shipping-delay-ab/episodes/a/{}", failed["id"].as_str().unwrap());
    let view = dom(&bin, &episode);
    assert!(view.contains("<tr class=\"nullw\"><td><code>shipping_status</code>"), "the null write is shown");

    screenshot(&bin, &format!("{base}/"), "serve-index.png", (1280, 700), 10_000);
    screenshot(&bin, &task, "serve-task.png", (1280, 1800), 60_000);
    screenshot(&bin, &episode, "serve-episode.png", (1280, 1400), 60_000);
}

#[test]
fn a_parsed_trace_page_works_from_its_file() {
    let Some(bin) = chromium() else { return };
    let run = ecommerce_run();
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    let a = summary["variants"].as_array().unwrap().iter().find(|v| v["name"] == "a").unwrap();
    let failed = a["episodes"].as_array().unwrap().iter().find(|e| e["failure_class"] != "ok").unwrap();
    // Absolute, or relative to the run's directory.
    let trace = run.join(failed["trace"].as_str().unwrap());
    let out = tempfile::tempdir().unwrap();
    let page = out.path().join("episode.html");
    let parsed = basecamp(&["trace", "parse", trace.to_str().unwrap(), "--output", "html"]);
    assert!(parsed.status.success(), "{}", String::from_utf8_lossy(&parsed.stderr));
    std::fs::write(&page, &parsed.stdout).unwrap();

    let url = format!("file://{}", page.display());
    let view = dom(&bin, &url);
    assert!(view.contains("<section class=\"episode-view page\">"));
    assert!(view.contains("data-status=\"fallback\""), "its timeline shows the failed call");
    assert!(view.contains("<tr class=\"nullw\"><td><code>shipping_status</code>"), "the null write is shown");
    // A timeline row links to its step's panel, in the page.
    let step = dom(&bin, &format!("{url}#s1"));
    assert!(step.contains("<div class=\"panel\" id=\"s1\">"));
    screenshot(&bin, &url, "parse-episode.png", (1280, 1400), 60_000);
}

#[test]
fn the_report_finds_a_reward_weight_that_fights_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::write_run(dir.path());
    let report = dir.path().join("r.html");
    let result = basecamp(&[
        "trace",
        "report",
        dir.path().to_str().unwrap(),
        "--metric",
        "tool_call_accuracy",
        "--cluster-by",
        "tool",
        "-o",
        report.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&result.stderr));
    let html = fixtures::unpacked_report(&std::fs::read_to_string(&report).unwrap());
    // Variant a: weight -0.2 x steps is highest where the plan was cut short.
    assert!(html.contains(
        "reward component <code>efficiency</code> (weight -0.2) correlates negatively with \
         <code>tool_call_accuracy</code>: its weighted contribution vs <code>tool_call_accuracy</code> r = -1.00 over 12 episodes"
    ));
    assert!(html.contains("in 4 of 4 failed episodes <code>track_order</code> failed first (timeout x4)"));
    // Three groups: shop/a, shop/b, and the traces-only shop-replay/a.
    assert!(stdout.contains("in 3 task variant(s)"), "{stdout}");
    // Each episode names its file as found (an s3:// input names the object: tests/serve.rs).
    let file = fixtures::shard_dir(dir.path(), fixtures::TASK, "a").join("ep-003.trace");
    assert!(html.contains(&format!("file <code>{}</code>", file.display())), "the episode names its file");

    // Files named directly still find the summary next to them.
    let dir_a = fixtures::shard_dir(dir.path(), fixtures::TASK, "a");
    let one = dir_a.join("ep-001.trace");
    let result = basecamp(&["trace", "report", one.to_str().unwrap(), "-o", report.to_str().unwrap()]);
    assert!(result.status.success());
    let html = fixtures::unpacked_report(&std::fs::read_to_string(&report).unwrap());
    assert!(html.contains("metrics from the shard's summary.json"));

    // An unknown metric names the known ones.
    let result = basecamp(&["trace", "report", dir.path().to_str().unwrap(), "--metric", "nope", "-o", "/dev/null"]);
    assert_eq!(result.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("--metric nope: no episode has this metric; these do:"), "{stderr}");
    assert!(stderr.contains("reward.efficiency") && stderr.contains("tool_call_accuracy"), "{stderr}");
}
