//! The trace commands on `s3://` prefixes, against a real S3 server
//! (`s3s-fs` from crates.io on 127.0.0.1, installed by `scripts/s3-server.sh
//! install`; `make test` does that first). s3s-fs serves a directory, so
//! the test puts traces in place as files and reads them back over S3.

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/s3.rs"]
mod s3;

use basecamp_trace::synthetic::{EpisodeShape, generate};
use s3::{BUCKET, S3Server};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn search_validate_export_and_archive_read_s3_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let local = dir.path().join("local");
    let run = data.join(BUCKET).join("runs/2026/shard-0");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    for seed in 1..=3 {
        let bytes = generate(&EpisodeShape { seed, steps: 30, tokens_per_step: 2, ..Default::default() })
            .write_to(Vec::new(), 3)
            .unwrap();
        std::fs::write(run.join(format!("ep-{seed}.trace")), &bytes).unwrap();
        std::fs::write(local.join(format!("ep-{seed}.trace")), &bytes).unwrap();
    }
    std::fs::write(run.join("summary.json"), "{}").unwrap();
    let server = S3Server::start(&data);
    let prefix = format!("s3://{BUCKET}/runs/2026");
    let query = "exists(error_context)";

    // The same matches as the local copies, named by their s3:// URLs.
    let remote = server.basecamp(&["trace", "search", query, &prefix], dir.path());
    assert_eq!(remote.status.code(), Some(0), "{}", text(&remote.stderr));
    let here = server.basecamp(&["trace", "search", query, &local.display().to_string()], dir.path());
    let local_prefix = format!("{}/", local.display());
    let remote_prefix = format!("s3://{BUCKET}/runs/2026/shard-0/");
    assert!(!here.stdout.is_empty());
    assert_eq!(text(&remote.stdout), text(&here.stdout).replace(&local_prefix, &remote_prefix));

    let out = server.basecamp(&["trace", "validate", &prefix], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(text(&out.stderr), "3 traces checked: all valid\n");

    let out = server.basecamp(&["trace", "export", "--otlp", &format!("{prefix}/shard-0/ep-2.trace")], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 1);

    let archive = dir.path().join("runs.tar.zst");
    let out = server.basecamp(&["trace", "archive", &prefix, "-o", &archive.display().to_string()], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = server.basecamp(&["trace", "archive", "list", &archive.display().to_string()], dir.path());
    assert_eq!(text(&out.stdout).lines().count(), 4);

    // Redaction reads each object twice (PII values, then the copy): fetched
    // once, the copies are those of the local files byte for byte.
    let redact = |input: &str, out: &str| {
        let args =
            ["trace", "redact", input, "--pii-fields", "order_id", "--patterns", "email", "--salt", "s", "-o", out];
        let run = server.basecamp(&args, dir.path());
        assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
        dir.path().join(out)
    };
    let from_s3 = redact(&prefix, "redacted-s3");
    let from_disk = redact(&local.display().to_string(), "redacted-local");
    for seed in 1..=3 {
        let name = format!("ep-{seed}.trace");
        let copy = std::fs::read(from_s3.join("shard-0").join(&name)).unwrap();
        assert!(copy == std::fs::read(from_disk.join(&name)).unwrap(), "{name}: the S3 copy differs");
    }

    let out = server.basecamp(&["trace", "search", query, &format!("s3://{BUCKET}/nothing-here")], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), format!("error: s3://{BUCKET}/nothing-here: no .trace objects under this prefix\n"));
}

#[test]
fn parse_and_replay_take_one_s3_object() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run = data.join(BUCKET).join("runs/shard-0");
    std::fs::create_dir_all(&run).unwrap();
    let bytes = generate(&EpisodeShape { seed: 7, steps: 5, tokens_per_step: 2, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    let local = dir.path().join("ep-7.trace");
    std::fs::write(&local, &bytes).unwrap();
    std::fs::write(run.join("ep-7.trace"), &bytes).unwrap();
    let server = S3Server::start(&data);
    let url = format!("s3://{BUCKET}/runs/shard-0/ep-7.trace");

    // The same document as the local copy, named by its URL.
    let remote = server.basecamp(&["trace", "parse", &url], dir.path());
    assert_eq!(remote.status.code(), Some(0), "{}", text(&remote.stderr));
    let here = server.basecamp(&["trace", "parse", &local.display().to_string()], dir.path());
    assert_eq!(text(&remote.stdout), text(&here.stdout).replace(&local.display().to_string(), &url));

    // A prefix prints JSON Lines, one trace per line: here the one object's document.
    let out = server.basecamp(&["trace", "parse", &format!("s3://{BUCKET}/runs/")], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listed: serde_json::Value = serde_json::from_str(text(&out.stdout).strip_suffix('\n').unwrap()).unwrap();
    assert_eq!(listed, serde_json::from_str::<serde_json::Value>(&text(&remote.stdout)).unwrap());
    // A key that is not there is named.
    let missing = format!("s3://{BUCKET}/runs/shard-0/ep-8.trace");
    let out = server.basecamp(&["trace", "parse", &missing], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&missing), "{}", text(&out.stderr));

    // replay reads the object the same way (the manifests are another test's: here the
    // trace must be read before the manifests are even looked at).
    let out = server.basecamp(&["trace", "replay", &missing, "--config", "no-such.yaml"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).starts_with(&format!("error: cannot replay {missing}: ")), "{}", text(&out.stderr));
}

#[test]
fn parse_html_of_an_s3_object_takes_its_metrics_from_the_summary_beside_it() {
    // Before: the page of an S3 object never fetched its shard's
    // summary.json, so it showed the trace's own metrics (no
    // tool_call_accuracy) where the same file read locally showed the summary's.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    fixtures::write_run(&data.join(BUCKET));
    let server = S3Server::start(&data);
    let shard = fixtures::shard_dir(std::path::Path::new(""), fixtures::TASK, "a");
    let key = shard.join("ep-000.trace").display().to_string();
    let url = format!("s3://{BUCKET}/{key}");
    let html = |file: &str| server.basecamp(&["trace", "parse", "--output", "html", file], &data.join(BUCKET));

    let here = html(&key);
    assert_eq!((here.status.code(), text(&here.stderr)), (Some(0), String::new()));
    assert!(text(&here.stdout).contains("metrics from the shard's summary.json"));
    let remote = html(&url);
    assert_eq!((remote.status.code(), text(&remote.stderr)), (Some(0), String::new()));
    assert_eq!(text(&remote.stdout), text(&here.stdout).replace(&key, &url));

    // A summary that is not one is a warning naming its URL; the page reads the trace's metrics.
    let summary = data.join(BUCKET).join(&shard).join("summary.json");
    std::fs::write(&summary, "{not json").unwrap();
    let out = html(&url);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let expected = format!("warning: {}: not a shard summary (", shard_url(&shard));
    assert!(text(&out.stderr).starts_with(&expected), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("metrics from the trace alone"));
    // None at all: no warning, the trace's metrics.
    std::fs::remove_file(&summary).unwrap();
    let out = html(&url);
    assert_eq!((out.status.code(), text(&out.stderr)), (Some(0), String::new()));
    assert!(text(&out.stdout).contains("metrics from the trace alone"));
}

/// The URL of `shard`'s summary.json in the test bucket.
fn shard_url(shard: &std::path::Path) -> String {
    format!("s3://{BUCKET}/{}", shard.join("summary.json").display())
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_tree(&path, &to.join(entry.file_name()));
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn ab_compare_reads_variants_where_the_operator_uploads_them() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = dir.path().join("data");
    let server = S3Server::start(&data);
    let out = server.basecamp(
        &["run", example.to_str().unwrap(), "--shards", "2", "--no-progress", "--out", run.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The operator's layout: <destination>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/.
    let task = data.join(BUCKET).join("traces/2026/11/30/default/shipping-delay-ab");
    for variant in ["a", "b"] {
        copy_tree(&run.join(variant), &task.join(variant));
    }
    let prefix = format!("s3://{BUCKET}/traces/2026/11/30/default/shipping-delay-ab");

    let here = server
        .basecamp(&["ab", "compare", run.join("a").to_str().unwrap(), run.join("b").to_str().unwrap()], dir.path());
    assert_eq!(here.status.code(), Some(0), "{}", text(&here.stderr));
    let remote = server.basecamp(&["ab", "compare", &format!("{prefix}/a"), &format!("{prefix}/b/")], dir.path());
    assert_eq!(remote.status.code(), Some(0), "{}", text(&remote.stderr));
    assert_eq!(text(&remote.stdout), text(&here.stdout), "the same table, the variants named a and b");
    // One prefix holding the two variants, as one run directory.
    let both = server.basecamp(&["ab", "compare", &prefix], dir.path());
    assert_eq!(both.status.code(), Some(0), "{}", text(&both.stderr));
    assert_eq!(text(&both.stdout), text(&here.stdout));
    // A prefix without summaries names the URL, not a temporary copy.
    let empty = server.basecamp(&["ab", "compare", &format!("s3://{BUCKET}/nothing/")], dir.path());
    assert_eq!(empty.status.code(), Some(1));
    assert!(text(&empty.stderr).contains(&format!("s3://{BUCKET}/nothing/")), "{}", text(&empty.stderr));
    assert!(!text(&empty.stderr).contains("basecamp-ab-"), "{}", text(&empty.stderr));
}
