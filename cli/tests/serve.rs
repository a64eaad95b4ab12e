//! `basecamp serve` over plain HTTP: the real binary on 127.0.0.1 serving a
//! tree of runs written with the real trace writer; status codes, what the
//! pages say, the raw bytes, and that nothing outside the directory leaks.

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/http.rs"]
mod http;
#[path = "support/s3.rs"]
mod s3;

use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use basecamp_sandbox::driver::SUMMARY_FILE;
use basecamp_trace::synthetic::{EpisodeShape, generate};
use fixtures::{EPISODES, NAMESPACE, TASK, TRACE_ONLY_TASK, pearson, shard_dir, write_run};
use http::{Server, get};
use s3::S3Server;

fn task_path() -> String {
    format!("/tasks/{NAMESPACE}/{TASK}")
}

#[test]
fn pages_are_served_at_stable_urls_with_what_the_traces_say() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let server = Server::start(dir.path());

    let index = get(&server.addr, "/");
    assert_eq!(index.status, 200);
    assert!(index.headers.to_ascii_lowercase().contains("content-type: text/html"), "{}", index.headers);
    let text = index.text();
    assert!(text.contains(&format!("href=\"/tasks/{NAMESPACE}/{TASK}\"")), "{text}");
    assert!(text.contains(&format!("href=\"/tasks/{NAMESPACE}/{TRACE_ONLY_TASK}\"")));
    assert!(text.contains(&format!("href=\"/tasks/{NAMESPACE}/{TASK}?variant=a\"")));

    // The task page: both variants' metrics, the memory null story, the reward-weight hint.
    let page = get(&server.addr, &task_path());
    assert_eq!(page.status, 200);
    let text = page.text();
    assert!(text.contains("data-variant=\"a\"") && text.contains("data-variant=\"b\""));
    assert!(
        text.contains(
            "in 4 of 4 failed episodes <code>shipping_status</code> was set to null by the fallback of \
             <code>track_order</code> (after timeout x4)"
        ),
        "the root cause of variant a is missing"
    );
    assert!(text.contains("reward component <code>efficiency</code> (weight -0.2) correlates negatively"), "{text}");
    assert!(text.contains("step 1 (<code>track_order</code>) is the weakest: 8 of 12 tool calls succeeded (67%)"));
    // The episode links of the Grafana URL scheme.
    assert!(text.contains(&format!("href=\"/tasks/{NAMESPACE}/{TASK}/episodes/a/ep-000\"")));

    // ?variant= selects one; an unknown one is a 400 that names the variants.
    let only_b = get(&server.addr, &format!("{}?variant=b", task_path())).text();
    assert!(only_b.contains("id=\"variant-b\"") && !only_b.contains("id=\"variant-a\""));
    assert!(only_b.contains("no failed episodes"));
    // A data link of a series without a variant label sends an empty one: all variants.
    let empty = get(&server.addr, &format!("{}?variant=", task_path()));
    assert_eq!(empty.status, 200);
    assert!(empty.text().contains("id=\"variant-a\"") && empty.text().contains("id=\"variant-b\""));
    let unknown = get(&server.addr, &format!("{}?variant=zz", task_path()));
    assert_eq!(unknown.status, 400);
    assert!(unknown.text().contains("has no variant `zz` (it has: a, b)"));
    let bad_key = get(&server.addr, &format!("{}?cluster_by=colour", task_path()));
    assert_eq!(bad_key.status, 400);
    // A metric no episode has is refused naming those they have (before: a 200 with a column of `-`).
    let no_metric = get(&server.addr, &format!("{}?metric=nope", task_path()));
    assert_eq!(no_metric.status, 400);
    assert!(no_metric.text().contains("metric `nope`: no episode here has it; these do: "), "{}", no_metric.text());
    assert!(no_metric.text().contains("tool_call_accuracy"), "{}", no_metric.text());
    // The site's own error pages for what axum refuses (before: plain text).
    let twice = get(&server.addr, &format!("{}?variant=a&variant=b", task_path()));
    assert_eq!(twice.status, 400);
    assert!(twice.headers.to_ascii_lowercase().contains("content-type: text/html"), "{}", twice.headers);
    assert!(twice.text().contains("duplicate field"), "{}", twice.text());
    for path in [format!("{}%FF", task_path()), "/raw/%FF.trace".to_string()] {
        let unreadable = get(&server.addr, &path);
        assert_eq!(unreadable.status, 404, "{path}");
        assert!(unreadable.text().contains("no page at this path"), "{path}: {}", unreadable.text());
    }

    // The correlation shown is Pearson's r of the data: tool_call_accuracy vs steps.
    let page =
        get(&server.addr, &format!("{}?variant=a&metric=tool_call_accuracy&cluster_by=tool", task_path())).text();
    let steps: Vec<f64> = (0..EPISODES).map(|i| if fixtures::fails("a", i) { 2.0 } else { 3.0 }).collect();
    let accuracy: Vec<f64> = (0..EPISODES).map(|i| if fixtures::fails("a", i) { 0.5 } else { 1.0 }).collect();
    let r = pearson(&steps, &accuracy);
    assert!((r - 1.0).abs() < 1e-9, "steps determine accuracy here: {r}");
    assert!(page.contains("<tr><td><code>steps</code></td><td><b>+1.000</b></td><td>12</td></tr>"), "{page}");
    assert!(page.contains("in 4 of 4 failed episodes <code>track_order</code> failed first (timeout x4)"));

    assert_eq!(get(&server.addr, &format!("/tasks/{NAMESPACE}/nope")).status, 404);
    assert_eq!(get(&server.addr, "/nothing/here").status, 404);
}

/// A task of 1,100 episodes: its page holds 500 rows of the episode table
/// (failed first), links the other pages, and lists and draws at most so
/// many episodes in clusters, flagged steps and charts, counting the rest.
/// Before pages, 20,000 episodes made one page of 10.8 MB.
#[test]
fn a_long_task_is_paged_and_every_episode_is_on_one_page() {
    let dir = tempfile::tempdir().unwrap();
    let n = 1_100;
    fixtures::write_traces(dir.path(), TASK, "a", n);
    let failed = (0..n).filter(|&i| fixtures::fails("a", i)).count();
    let server = Server::start(dir.path());
    let rows = |page: &str| -> Vec<(String, bool)> {
        page.split("<tr data-ok=\"")
            .skip(1)
            .map(|row| {
                let id = row.split("</a>").next().unwrap().rsplit('>').next().unwrap().to_string();
                (id, row.starts_with('0'))
            })
            .collect()
    };

    let first = get(&server.addr, &task_path());
    assert_eq!(first.status, 200);
    let first = first.text();
    assert!(first.contains("rows 1–500 of 1,100, page 1 of 3"), "{first}");
    assert!(first.contains(&format!("href=\"{}?page=2\" data-page=\"2\">next ›</a>", task_path())), "{first}");
    let cluster_more = format!("and {} more (the episode table lists failed episodes first)", failed - 100);
    assert!(first.contains(&cluster_more), "the cluster of {failed} lists 100 and counts the rest");
    assert!(first.contains("1,000 of 1,100 episodes drawn, evenly spaced; r and the line use all"));
    assert_eq!(first.matches("class=\"point\"").count() % 1_000, 0, "charts of 1,000 points each");

    // Pages keep the query; together they hold every episode once, failed first.
    let mut seen = Vec::new();
    for page in 1..=3 {
        let text = get(&server.addr, &format!("{}?variant=a&metric=reward&page={page}", task_path())).text();
        assert!(text.contains(&format!("page {page} of 3")), "page {page}");
        seen.extend(rows(&text));
    }
    assert_eq!(seen.len(), n as usize);
    assert!(seen[..failed].iter().all(|(_, failed)| *failed) && seen[failed..].iter().all(|(_, failed)| !failed));
    let mut ids: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n as usize, "an episode on two pages");
    let last = get(&server.addr, &format!("{}?page=3", task_path())).text();
    assert!(last.contains("rows 1,001–1,100 of 1,100"));
    assert!(last.contains(&format!("<a href=\"{}?page=2\" data-page=\"2\">‹ previous</a>", task_path())));

    for bad in ["0", "4"] {
        let refused = get(&server.addr, &format!("{}?page={bad}", task_path()));
        assert_eq!(refused.status, 400, "page {bad}");
        assert!(refused.text().contains("the episode tables here have pages 1 to 3 (500 episodes a page)"));
    }
    let refused = get(&server.addr, &format!("{}?page=-1", task_path()));
    assert_eq!(refused.status, 400);
    assert!(refused.text().contains("page `-1` is not a page number: use 1, 2, ..."), "{}", refused.text());
}

#[test]
fn an_episode_page_shows_its_trace_and_links_the_raw_bytes() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let server = Server::start(dir.path());

    let page = get(&server.addr, &format!("{}/episodes/a/ep-000", task_path()));
    assert_eq!(page.status, 200);
    let text = page.text();
    for expected in [
        "<h1>episode <code>ep-000</code></h1>",
        "data-status=\"fallback\"",                  // the timeline row of the failed call
        "<b>timeout</b> tool track_order timed out", // its error
        "<tr class=\"nullw\"><td><code>shipping_status</code>", // the memory delta to null
        "title=\"#1 id 101 logprob -0.900",          // a token with its logit
        "<th>logprob</th><th>entropy</th><th>KL</th>", // raw-logits columns, as a record has them
        "<td>-0.900</td><td>1.2500</td><td>0.0625</td>",
        "<td>-0.050</td><td>-</td><td>-</td>",
        "<code>efficiency</code></td><td>2.000</td><td class=\"warn\">-0.2</td>", // reward components
        "deadline elapsed",                                                       // the error's cause chain
        "metrics from the shard's summary.json",
    ] {
        assert!(text.contains(expected), "missing {expected:?}");
    }
    let raw_href = format!("/raw/2026/11/30/{NAMESPACE}/{TASK}/a/shard-0/ep-000.trace");
    assert!(text.contains(&format!("href=\"{raw_href}\"")));
    let raw = get(&server.addr, &raw_href);
    assert_eq!(raw.status, 200);
    assert_eq!(raw.body, std::fs::read(shard_dir(dir.path(), TASK, "a").join("ep-000.trace")).unwrap());
    assert!(raw.headers.to_ascii_lowercase().contains("content-type: application/octet-stream"));

    // Traces without a summary: the metrics the trace holds.
    let trace_only = get(&server.addr, &format!("/tasks/{NAMESPACE}/{TRACE_ONLY_TASK}/episodes/a/ep-001")).text();
    assert!(trace_only.contains("metrics from the trace alone"));
    assert!(trace_only.contains("<code>resolution_time_s</code> <b>1.510</b>"), "{trace_only}");

    assert_eq!(get(&server.addr, &format!("{}/episodes/a/ep-999", task_path())).status, 404);
    assert_eq!(get(&server.addr, &format!("{}/episodes/c/ep-000", task_path())).status, 404);
}

/// The index's "(failed/total failed)" of one variant of a task.
fn counts_of(index: &str, task: &str, variant: &str) -> String {
    let link = format!("href=\"/tasks/{NAMESPACE}/{task}?variant={variant}\">{variant}</a> <span class=\"muted\">(");
    let at = index.find(&link).map(|i| i + link.len());
    at.and_then(|i| index[i..].split(')').next()).unwrap_or("absent").to_string()
}

/// The variants table row of `variant` on a task page.
fn variant_row(page: &str, variant: &str) -> String {
    let start = page.find(&format!("data-variant=\"{variant}\"")).expect("the variant's row");
    page[start..].split("</tr>").next().unwrap().to_string()
}

#[test]
fn a_run_still_writing_shows_up_between_two_requests() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let replay = shard_dir(dir.path(), TRACE_ONLY_TASK, "a");
    // ep-001 is still being written: half its bytes are there.
    let full = std::fs::read(replay.join("ep-001.trace")).unwrap();
    std::fs::write(replay.join("ep-001.trace"), &full[..full.len() / 2]).unwrap();
    // Variant b's summary.json lands after its traces.
    let b = shard_dir(dir.path(), TASK, "b");
    let mut summary: serde_json::Value = serde_json::from_slice(&std::fs::read(b.join(SUMMARY_FILE)).unwrap()).unwrap();
    std::fs::remove_file(b.join(SUMMARY_FILE)).unwrap();
    let server = Server::start(dir.path());
    // Past the cache's settle time: from here on only metadata reveal a change.
    std::thread::sleep(Duration::from_millis(2500));

    let index = get(&server.addr, "/").text();
    assert_eq!(counts_of(&index, TRACE_ONLY_TASK, "a"), "3/6 failed", "ep-000, ep-003 and the half-written ep-001");
    let b_page = get(&server.addr, &format!("{}/episodes/b/ep-001", task_path())).text();
    assert!(b_page.contains("metrics from the trace alone"));
    assert_eq!(get(&server.addr, "/").text(), index, "nothing changed, nothing differs");
    let replay_page = format!("/tasks/{NAMESPACE}/{TRACE_ONLY_TASK}");
    assert!(get(&server.addr, &replay_page).text().contains("damaged_trace"), "the half-written trace's failure");

    // The trace grows to its end; another trace is deleted; a new variant's trace appears.
    std::fs::OpenOptions::new()
        .append(true)
        .open(replay.join("ep-001.trace"))
        .unwrap()
        .write_all(&full[full.len() / 2..])
        .unwrap();
    std::fs::remove_file(replay.join("ep-005.trace")).unwrap();
    let mut new = generate(&EpisodeShape { seed: 3, steps: 3, tokens_per_step: 2, ..Default::default() });
    new.header.namespace = NAMESPACE.into();
    new.header.task = TRACE_ONLY_TASK.into();
    new.header.variant = "c".into();
    let c = shard_dir(dir.path(), TRACE_ONLY_TASK, "c");
    std::fs::create_dir_all(&c).unwrap();
    std::fs::write(c.join("ep-new.trace"), new.write_to(Vec::new(), 3).unwrap()).unwrap();
    let index = get(&server.addr, "/").text();
    assert_eq!(counts_of(&index, TRACE_ONLY_TASK, "a"), "2/5 failed", "{index}");
    assert!(counts_of(&index, TRACE_ONLY_TASK, "c").ends_with("/1 failed"), "{index}");
    let replay = get(&server.addr, &replay_page).text();
    assert!(!replay.contains("damaged_trace"), "the task page's analysis follows the grown trace");

    // The summary lands, with numbers of its own: the task page shows them.
    assert!(!variant_row(&get(&server.addr, &task_path()).text(), "b").contains("<td>0.123</td>"));
    for episode in summary["episodes"].as_array_mut().unwrap() {
        episode["metrics"]["plan_step_f1"] = serde_json::json!(0.123);
    }
    std::fs::write(b.join(SUMMARY_FILE), serde_json::to_vec(&summary).unwrap()).unwrap();
    let row = variant_row(&get(&server.addr, &task_path()).text(), "b");
    assert!(row.contains("<td>0.123</td>"), "{row}");
    let b_page = get(&server.addr, &format!("{}/episodes/b/ep-001", task_path())).text();
    assert!(b_page.contains("metrics from the shard's summary.json"));
}

#[test]
fn nothing_outside_the_directory_is_served() {
    let outer = tempfile::tempdir().unwrap();
    let served = outer.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    write_run(&served);
    // A secret next to the served directory, and a symlink from inside to it.
    std::fs::write(outer.path().join("secret.trace"), b"not for you").unwrap();
    std::fs::write(outer.path().join("secret.json"), b"{\"password\":1}").unwrap();
    std::os::unix::fs::symlink(outer.path().join("secret.trace"), served.join("link.trace")).unwrap();
    std::fs::write(served.join("notes.txt"), b"plain text").unwrap();
    let server = Server::start(&served);

    for path in [
        "/raw/../secret.trace",
        "/raw/..%2fsecret.trace",
        "/raw/%2e%2e/secret.json",
        "/raw/2026/../../secret.trace",
        "/raw/2026/%2E%2E/%2E%2E/secret.json",
        "/raw//etc/passwd",
        "/raw/link.trace",
    ] {
        let r = get(&server.addr, path);
        assert_eq!(r.status, 400, "{path} must be refused");
        assert!(r.text().contains("leaves the served directory"), "{path}");
        assert!(!r.text().contains("not for you") && !r.text().contains("password"));
    }
    // A NUL is no file name, not a way out (before: "the path leaves the served directory").
    let nul = get(&server.addr, "/raw/a%00.trace");
    assert_eq!(nul.status, 400);
    assert!(nul.text().contains("not a file name"), "{}", nul.text());
    assert_eq!(get(&server.addr, "/raw/notes.txt").status, 404, "only .trace and .json files");
    assert_eq!(get(&server.addr, "/raw/missing.trace").status, 404);
    // The symlinked trace is not listed as an episode either.
    let index = get(&server.addr, "/").text();
    assert!(!index.contains("link.trace"));
    // And the path of a real file still works.
    let summary = format!("/raw/2026/11/30/{NAMESPACE}/{TASK}/b/shard-0/summary.json");
    let r = get(&server.addr, &summary);
    assert_eq!(r.status, 200);
    assert!(r.headers.to_ascii_lowercase().contains("content-type: application/json"));
}

#[test]
fn a_missing_directory_is_one_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["serve", "/no/such/dir", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/no/such/dir: cannot serve it: no such directory"), "{stderr}");
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn an_s3_prefix_is_mirrored_served_and_refreshed() {
    // The operator's upload layout, in a bucket of the real S3 server: variant a first.
    let staging = tempfile::tempdir().unwrap();
    write_run(staging.path());
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("s3");
    let prefix = data.join("runs/traces");
    let a = shard_dir(staging.path(), TASK, "a");
    copy_tree(&a, &prefix.join(a.strip_prefix(staging.path()).unwrap()));
    let s3 = S3Server::start(&data);
    let cache = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &[
            "serve",
            "s3://runs/traces",
            "--listen",
            "127.0.0.1:0",
            "--cache",
            cache.path().to_str().unwrap(),
            "--refresh",
            "1",
        ],
        &s3.env(),
    );

    let page = get(&server.addr, &task_path());
    assert_eq!(page.status, 200);
    assert!(page.text().contains("was set to null by the fallback of <code>track_order</code>"));
    assert!(!page.text().contains("data-variant=\"b\""));
    let raw_path = format!("/raw/2026/11/30/{NAMESPACE}/{TASK}/a/shard-0/ep-003.trace");
    let raw = get(&server.addr, &raw_path);
    assert_eq!(raw.status, 200);
    assert_eq!(raw.body, std::fs::read(a.join("ep-003.trace")).unwrap());

    // An object rewritten with the same size (another episode's bytes, padded or cut) is fetched
    // again: the mirror compares LastModified too, not only the size.
    let object = prefix.join(a.strip_prefix(staging.path()).unwrap()).join("ep-003.trace");
    let mut rewritten = std::fs::read(a.join("ep-004.trace")).unwrap();
    rewritten.resize(raw.body.len(), 0);
    assert_ne!(rewritten, raw.body);
    std::thread::sleep(Duration::from_millis(1100)); // a LastModified of a later second
    std::fs::write(&object, &rewritten).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&server.addr, &raw_path).body != rewritten {
        assert!(Instant::now() < deadline, "the same-size rewrite was not mirrored within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::copy(a.join("ep-003.trace"), &object).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&server.addr, &raw_path).body != raw.body {
        assert!(Instant::now() < deadline, "the restored object was not mirrored within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }

    // `trace report` reads the same prefix.
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("r.html");
    let result = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "report", "s3://runs/traces", "--metric", "error_rate", "-o", report.to_str().unwrap()])
        .envs(s3.env())
        .output()
        .unwrap();
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let html = fixtures::unpacked_report(&std::fs::read_to_string(&report).unwrap());
    assert!(html.contains("in 4 of 4 failed episodes <code>shipping_status</code> was set to null"));
    assert!(html.contains("metrics from the shard's summary.json"));

    // Variant b lands in the bucket later: the mirror picks it up.
    let b = shard_dir(staging.path(), TASK, "b");
    copy_tree(&b, &prefix.join(b.strip_prefix(staging.path()).unwrap()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !get(&server.addr, &task_path()).text().contains("data-variant=\"b\"") {
        assert!(Instant::now() < deadline, "variant b did not appear within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `done` every 200 ms for up to 60 s; `what` names what did not happen.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_object_deleted_from_s3_leaves_the_view_and_an_unreachable_s3_empties_nothing() {
    let staging = tempfile::tempdir().unwrap();
    write_run(staging.path());
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("s3");
    let prefix = data.join("runs/traces");
    let (a, b) = (shard_dir(staging.path(), TASK, "a"), shard_dir(staging.path(), TASK, "b"));
    for shard in [&a, &b] {
        copy_tree(shard, &prefix.join(shard.strip_prefix(staging.path()).unwrap()));
    }
    let s3 = S3Server::start(&data);
    let cache = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &[
            "serve",
            "s3://runs/traces",
            "--listen",
            "127.0.0.1:0",
            "--cache",
            cache.path().to_str().unwrap(),
            "--refresh",
            "1",
        ],
        &s3.env(),
    );
    let raw_a = format!("/raw/2026/11/30/{NAMESPACE}/{TASK}/a/shard-0/ep-003.trace");
    let raw_b = format!("/raw/2026/11/30/{NAMESPACE}/{TASK}/b/shard-0/ep-000.trace");
    assert!(get(&server.addr, &task_path()).text().contains("data-variant=\"b\""));
    assert_eq!(get(&server.addr, &raw_a).status, 200);
    assert_eq!(get(&server.addr, &raw_b).status, 200);
    // The user's own file put in the mirror: not the mirror's to remove.
    std::fs::write(cache.path().join("notes.txt"), b"mine").unwrap();

    // Variant b's objects (traces and summary) and one trace of variant a are deleted.
    std::fs::remove_dir_all(prefix.join(b.strip_prefix(staging.path()).unwrap())).unwrap();
    std::fs::remove_file(prefix.join(a.strip_prefix(staging.path()).unwrap()).join("ep-003.trace")).unwrap();
    wait_for("the deleted objects did not leave the view", || {
        !get(&server.addr, &task_path()).text().contains("data-variant=\"b\"")
            && get(&server.addr, &raw_a).status == 404
    });
    assert_eq!(get(&server.addr, &raw_b).status, 404);
    assert_eq!(get(&server.addr, &format!("{}/episodes/a/ep-003", task_path())).status, 404);
    let index = get(&server.addr, "/").text();
    assert_eq!(counts_of(&index, TASK, "a"), format!("3/{} failed", EPISODES - 1), "{index}");
    assert_eq!(std::fs::read(cache.path().join("notes.txt")).unwrap(), b"mine");

    // S3 goes away: refreshes fail, and the view stays as it was.
    let before = get(&server.addr, &task_path()).text();
    let seen = server.stderr().len();
    drop(s3);
    wait_for("no refresh failed", || server.stderr()[seen..].contains("refreshing the mirror failed"));
    let failures = server.stderr()[seen..].matches("refreshing the mirror failed").count();
    wait_for("no second refresh failed", || {
        server.stderr()[seen..].matches("refreshing the mirror failed").count() > failures
    });
    assert_eq!(get(&server.addr, &task_path()).text(), before);
    let raw = format!("/raw/2026/11/30/{NAMESPACE}/{TASK}/a/shard-0/ep-000.trace");
    assert_eq!(get(&server.addr, &raw).body, std::fs::read(a.join("ep-000.trace")).unwrap());
}

/// Without --cache the mirror is the process's own: gone when it stops
/// (before: SIGTERM ended it on the spot and the copy stayed in the temp dir).
#[test]
fn a_temporary_mirror_is_removed_when_serve_stops() {
    let staging = tempfile::tempdir().unwrap();
    write_run(staging.path());
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("s3");
    let a = shard_dir(staging.path(), TASK, "a");
    copy_tree(&a, &data.join("runs/traces").join(a.strip_prefix(staging.path()).unwrap()));
    let s3 = S3Server::start(&data);
    let tmp = tempfile::tempdir().unwrap();
    let mut envs = s3.env();
    envs.push(("TMPDIR", tmp.path().display().to_string()));
    let server = Server::start_with(&["serve", "s3://runs/traces", "--listen", "127.0.0.1:0"], &envs);
    assert_eq!(get(&server.addr, &task_path()).status, 200);
    let mirrors = || std::fs::read_dir(tmp.path()).unwrap().count();
    assert_eq!(mirrors(), 1, "the mirror is in TMPDIR while serving");
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
    assert_eq!(mirrors(), 0, "the mirror is removed");

    // Also when serving never starts: the port is taken (before: the whole copy stayed).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let failed = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["serve", "s3://runs/traces", "--listen", &port])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1), "{}", String::from_utf8_lossy(&failed.stderr));
    assert!(String::from_utf8_lossy(&failed.stderr).contains(&format!("cannot listen on {port}")));
    assert_eq!(mirrors(), 0, "the mirror is removed");
}

#[test]
fn a_report_of_an_s3_prefix_names_the_objects_not_its_deleted_copy() {
    let staging = tempfile::tempdir().unwrap();
    write_run(staging.path());
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("s3");
    let prefix = data.join("runs/traces");
    let a = shard_dir(staging.path(), TASK, "a");
    copy_tree(&a, &prefix.join(a.strip_prefix(staging.path()).unwrap()));
    std::fs::write(prefix.join("junk.trace"), b"not a trace").unwrap();
    let s3 = S3Server::start(&data);

    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("r.html");
    let result = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "report", "s3://runs/traces/", "-o", report.to_str().unwrap()])
        .envs(s3.env())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    // The report is written without the unreadable object, which fails the command as every trace tool's
    // unreadable input does (before: exit 0).
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(stderr.ends_with("error: 1 trace(s) could not be read and are not in the report\n"), "{stderr}");
    let html = fixtures::unpacked_report(&std::fs::read_to_string(&report).unwrap());
    let object = format!("s3://runs/traces/2026/11/30/{NAMESPACE}/{TASK}/a/shard-0/ep-003.trace");
    assert!(html.contains(&format!("file <code>{object}</code>")), "the episode names its object");
    // The problem with the unreadable object names it too, in the page and on stderr.
    assert!(html.contains("s3://runs/traces/junk.trace: "), "{html}");
    assert!(stderr.contains("warning: s3://runs/traces/junk.trace: "), "{stderr}");
    let temp = std::env::temp_dir().join("basecamp-report-");
    assert!(!html.contains(temp.to_str().unwrap()), "no path into the deleted copy");
}

#[test]
fn a_report_of_lone_traces_is_about_reward_and_never_overwrites_an_input() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let trace = walk_traces(dir.path()).into_iter().next().expect("a trace");
    let lone = dir.path().join("lone");
    std::fs::create_dir_all(&lone).unwrap();
    let copy = lone.join("ep.trace");
    std::fs::copy(&trace, &copy).unwrap();
    let report = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_basecamp")).arg("trace").arg("report").args(args).output().unwrap()
    };

    // No summary.json beside it: no tool_call_accuracy, so without --metric the report is about reward, and says so.
    let out = dir.path().join("r.html");
    let result = report(&[copy.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(stderr.contains("the report is about reward (choose with --metric)"), "{stderr}");
    assert!(String::from_utf8_lossy(&result.stdout).contains("metric reward"));
    // A metric asked for by name is still checked.
    let result = report(&[copy.to_str().unwrap(), "--metric", "tool_call_accuracy", "-o", out.to_str().unwrap()]);
    assert_eq!(result.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&result.stderr).contains("--metric tool_call_accuracy: no episode has this metric")
    );

    // -o naming an input trace is refused; the trace is untouched.
    let before = std::fs::read(&copy).unwrap();
    let result = report(&[lone.to_str().unwrap(), "-o", copy.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the report would overwrite this input trace"), "{stderr}");
    assert_eq!(std::fs::read(&copy).unwrap(), before);

    // The page is written whole or not at all: nothing temporary is left beside -o,
    // and a write that fails (a full disk) is an error naming the file.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let result = report(&[lone.to_str().unwrap(), "-o", "/dev/full"]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: cannot write /dev/full"), "{stderr}");
}

fn walk_traces(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk_traces(&path));
        } else if path.extension().is_some_and(|e| e == "trace") {
            found.push(path);
        }
    }
    found.sort();
    found
}

#[test]
fn a_report_never_overwrites_a_shard_summary_it_reads() {
    // `trace report DIR -o DIR/.../summary.json` replaced the summary the
    // report had just read with the page, exit 0.
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let summary = shard_dir(dir.path(), TASK, "a").join(SUMMARY_FILE);
    let before = std::fs::read(&summary).expect("the run has a shard summary");
    let out = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "report"])
        .arg(dir.path())
        .arg("-o")
        .arg(&summary)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: {}: the report would overwrite this shard summary, which it reads; choose another -o file\n",
            summary.display()
        )
    );
    assert_eq!(std::fs::read(&summary).unwrap(), before);
}

#[test]
fn a_report_of_a_damaged_trace_names_the_damage() {
    // A payload checksum mismatch early in the trace: the report said only
    // "no episode has tool_call_accuracy or reward; give --metric", and with
    // --metric steps it exited 0 without a word about the damage.
    use basecamp_trace::format::{FRAME_HEADER_LEN, FrameHeader, PREAMBLE_LEN};
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("ep.trace");
    let mut bytes = generate(&EpisodeShape { seed: 2, steps: 6, tokens_per_step: 2, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    // The second frame (the first step's), one byte of its payload.
    let first = FrameHeader::decode(bytes[PREAMBLE_LEN..PREAMBLE_LEN + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
    let second = PREAMBLE_LEN + FRAME_HEADER_LEN + first.compressed_len as usize;
    bytes[second + FRAME_HEADER_LEN + 4] ^= 0x5a;
    std::fs::write(&trace, &bytes).unwrap();
    let damage = format!("{}: corrupt frame at byte {second}: payload checksum mismatch", trace.display());
    let report = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["trace", "report"]).arg(&trace).args(args).output().unwrap()
    };
    let html = dir.path().join("r.html");
    let out = report(&["-o", html.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no episode has tool_call_accuracy or reward"), "{stderr}");
    assert!(stderr.contains(&damage), "{stderr}");

    let out = report(&["--metric", "steps", "-o", html.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("warning: {damage}")), "{stderr}");
    assert!(stderr.contains("error: 1 trace(s) are damaged"), "{stderr}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&format!("<p class=\"warn\">{damage}")), "the page says so too");
}

/// Episodes the policy's server failed are counted apart and left out of
/// the means on the task page and in `trace report`, as in `run.json`'s
/// aggregate and the operator's status: variant a's accuracy was 0.667,
/// its four failed episodes' 0 counted as the agent's.
#[test]
fn episodes_the_policy_failed_are_left_out_of_the_task_page_s_and_the_report_s_means() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let summary = shard_dir(dir.path(), TASK, "a").join(SUMMARY_FILE);
    let text = std::fs::read_to_string(&summary).unwrap();
    assert_eq!(text.matches("\"timeout\"").count(), 4, "the four failed episodes' class");
    std::fs::write(&summary, text.replace("\"timeout\"", "\"policy_error\"")).unwrap();

    let server = Server::start(dir.path());
    let row = variant_row(&get(&server.addr, &task_path()).text(), "a");
    assert!(row.contains("4 <span class=\"not-measured\">(4 NOT MEASURED: the policy or a service failed)"), "{row}");
    let accuracy = row.split("<td>").nth(4).unwrap_or_default();
    assert!(accuracy.starts_with("1.000</td>"), "tool_call_accuracy over the 8 measured: {row}");

    let out = dir.path().join("r.html");
    let report = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "report", dir.path().to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let html = std::fs::read_to_string(&out).unwrap();
    let row = html.split("<tr>").find(|r| r.contains("href=\"#group-") && r.contains("<b>a</b>")).expect(&html);
    assert!(row.contains("12 <span class=\"not-measured\">(4 NOT MEASURED"), "{row}");
    assert!(row.contains("<td>1.000</td>"), "the mean over the 8 measured: {row}");
}

/// A shard that gave up (its policy's server failed episode after episode)
/// or that a stop cut short ran only part of its test set: the pages and
/// the report say so, with the reason and how many were never started.
/// Before, its traces were shown as if they were the whole test set.
#[test]
fn shards_that_gave_up_or_were_stopped_are_named_with_what_they_did_not_start() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let edit = |variant: &str, add: serde_json::Value| {
        let path = shard_dir(dir.path(), TASK, variant).join(SUMMARY_FILE);
        let mut summary: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        summary.as_object_mut().unwrap().extend(add.as_object().unwrap().clone());
        std::fs::write(&path, serde_json::to_vec(&summary).unwrap()).unwrap();
    };
    let reason = "16 episodes in a row were ended by the policy's server or a service (the last, e9, policy_error)";
    edit("a", serde_json::json!({"gave_up": {"reason": reason, "not_started": ["x1", "x2", "x3"]}}));
    edit("b", serde_json::json!({"stopped_early": true, "not_started": ["y1", "y2"]}));
    let gave_up = format!("{NAMESPACE}/{TASK}/a: shard 0 GAVE UP, 3 episode(s) not started: {reason}");
    let stopped = format!("{NAMESPACE}/{TASK}/b: shard 0: a stop kept 2 episode(s) from starting");

    let server = Server::start(dir.path());
    for path in ["/".to_string(), task_path()] {
        let page = get(&server.addr, &path).text();
        for line in [&gave_up, &stopped] {
            let shown = line.replace('\'', "&#39;");
            assert!(page.contains(&format!("<p class=\"warn\">{shown}</p>")), "{path}: {line}\n{page}");
        }
    }
    let out = dir.path().join("r.html");
    let report = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "report", dir.path().to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&report.stderr);
    assert!(stderr.contains(&gave_up) && stderr.contains(&stopped), "{stderr}");
}
