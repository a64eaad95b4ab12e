//! Driver mode end to end: manifests on disk -> `basecamp-sandbox run` ->
//! traces, summary.json and the upload to the task's destination; with
//! `--listen` and `--metrics-linger`, the waits for a first and a final scrape.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use basecamp_sandbox::testing::{
    example_copy, never_ready, post_repeated, services_in, wait_for_no_services, wait_for_services,
};
use basecamp_trace::{Tail, read_trace};
use serde_json::Value;

const MANIFEST: &str = r#"
apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: tools
spec:
  tools:
    track_order:
      description: Look up an order.
      parameters: {type: object, properties: {order_id: {type: string}}}
      recorded:
        fixture: fixture.jsonl
      memoryPatch:
        shipping_status: /status
  toolTimeouts:
    default: 300ms
  fallbacks:
    track_order:
      observation: {status: unknown}
      memoryPatch: {shipping_status: pending}
  maxSteps: 4
  planStepTimeout: 5s
  rewards:
    components:
      correctness: {weight: 1.0, source: tool_call_accuracy}
    weightSchedule:
      - atTrainingStep: 20
        weights: {correctness: 2.0}
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: shipping
spec:
  taskDefinition:
    description: You are a support agent.
    successCriteria: ["tool_call_accuracy >= 0.5"]
  evaluation:
    metrics: [tool_call_accuracy]
    testSet: tests.jsonl
  policy:
    scripted: policy.jsonl
  sandboxRef: {name: tools}
  shards: 2
  traces:
    destination: DEST
"#;

const FIXTURE: &str = r#"{"tool": "track_order", "arguments": {"order_id": "1"}, "observation": {"status": "in_transit"}}
{"tool": "track_order", "arguments": {"order_id": "2"}, "observation": {"status": "late"}, "timeout": true}
"#;

const TESTS: &str = r#"{"id": "ep-1", "instruction": "Where is order 1?", "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}], "expected_memory": {"shipping_status": "in_transit"}}
{"id": "ep-2", "instruction": "Where is order 2?", "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "2"}}], "expected_memory": {"shipping_status": "late"}}
{"id": "ep-3", "instruction": "Hi", "expected_tool_calls": []}
"#;

const POLICY: &str = r#"{"episode": "ep-1", "turns": [{"tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}]}, {"content": "In transit."}]}
{"episode": "ep-2", "turns": [{"tool_calls": [{"name": "track_order", "arguments": {"order_id": "2"}}]}, {"content": "Pending."}]}
{"episode": "ep-3", "turns": [{"content": "Hello!"}]}
"#;

fn write_project(dir: &Path, dest: &Path) {
    std::fs::write(dir.join("task.yaml"), MANIFEST.replace("DEST", &dest.display().to_string())).unwrap();
    std::fs::write(dir.join("fixture.jsonl"), FIXTURE).unwrap();
    std::fs::write(dir.join("tests.jsonl"), TESTS).unwrap();
    std::fs::write(dir.join("policy.jsonl"), POLICY).unwrap();
}

fn sandbox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox")).args(args).output().unwrap()
}

#[test]
fn a_shard_runs_writes_traces_and_summary_and_uploads_them() {
    let project = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), dest.path());
    let manifest = project.path().join("task.yaml");
    let out_dir = out.path().join("shard-0");
    let run =
        sandbox(&["run", "--config", manifest.to_str().unwrap(), "--shard", "0/2", "--out", out_dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("shipping/default shard 0/2: 2 episodes"), "{stdout}");

    // Shard 0 of 2 holds the first two rows (contiguous shards).
    let summary: Value = serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    let episodes = summary["episodes"].as_array().unwrap();
    assert_eq!(episodes.len(), 2);
    assert_eq!(episodes[0]["id"], "ep-1");
    assert_eq!(episodes[0]["failure_class"], "ok");
    assert_eq!(episodes[0]["metrics"]["memory_consistency"], 1.0);
    assert_eq!(episodes[1]["id"], "ep-2");
    assert_eq!(episodes[1]["failure_class"], "timeout", "the recorded timeout takes the fallback");
    assert_eq!(episodes[1]["metrics"]["memory_consistency"], 0.0, "the fallback wrote pending, not late");
    assert_eq!(summary["aggregate"]["episodes"], 2);
    assert_eq!(summary["aggregate"]["means"]["tool_call_accuracy"], 1.0);

    let trace = read_trace(out_dir.join("ep-1.trace")).unwrap();
    assert!(matches!(trace.tail, Tail::Complete));
    assert_eq!(trace.header.task, "shipping");
    assert_eq!(trace.header.shard_count, 2);

    // Uploaded under <dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/.
    let uploaded: Vec<_> = walk(dest.path());
    assert!(uploaded.iter().any(|p| p.ends_with("default/shipping/default/0/summary.json")), "{uploaded:?}");
    assert!(uploaded.iter().any(|p| p.ends_with("default/shipping/default/0/ep-2.trace")), "{uploaded:?}");
}

/// The summary says its traces are uploaded (the operator aggregates from
/// it, serve lists its episodes): it goes last, and not when one failed.
#[test]
fn the_summary_is_uploaded_last_and_not_when_a_trace_failed_to_upload() {
    use basecamp_sandbox::storage::{Destination, ShardPartition, UtcDate};
    let project = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), dest.path());
    // A directory where ep-2.trace goes: that one copy fails.
    let date = UtcDate::from_system_time(std::time::SystemTime::now()).unwrap();
    let partition = ShardPartition::new(date, "default", "shipping", "default", 0).unwrap();
    let Destination::Local(shard_dir) =
        Destination::parse(&dest.path().display().to_string()).unwrap().for_shard(&partition)
    else {
        unreachable!("a local destination")
    };
    std::fs::create_dir_all(shard_dir.join("ep-2.trace/in-the-way")).unwrap();
    let manifest = project.path().join("task.yaml");
    let run = sandbox(&[
        "run",
        "--config",
        manifest.to_str().unwrap(),
        "--shard",
        "0/2",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert_eq!(run.status.code(), Some(3), "stdout: {stdout}\nstderr: {stderr}");
    // Before: summary.json went up beside the missing trace, counting it.
    assert!(shard_dir.join("ep-1.trace").is_file(), "{stdout}{stderr}");
    assert!(!shard_dir.join("summary.json").exists(), "{stdout}{stderr}");
    let said = format!("{stdout}{stderr}");
    assert!(said.contains("the summary goes up only with all of them"), "{said}");
    assert!(out.path().join("summary.json").is_file(), "kept locally");
    let again = format!("basecamp-sandbox upload {} {}", out.path().display(), dest.path().display());
    assert!(said.contains(&format!("upload them again with: {again}")), "{said}");

    // `upload` sends the kept copies once the obstacle is gone: into the same
    // partition, the summary last (before: only a rerun of the whole shard).
    let upload = |dir: &Path| sandbox(&["upload", dir.to_str().unwrap(), dest.path().to_str().unwrap()]);
    let failed = upload(out.path());
    assert_eq!(failed.status.code(), Some(3), "{}", String::from_utf8_lossy(&failed.stderr));
    assert!(!shard_dir.join("summary.json").exists());
    std::fs::remove_dir_all(shard_dir.join("ep-2.trace")).unwrap();
    let done = upload(out.path());
    let (stdout, stderr) = (String::from_utf8_lossy(&done.stdout), String::from_utf8_lossy(&done.stderr));
    assert!(done.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("uploaded 3 files to "), "{stdout}");
    for file in ["ep-1.trace", "ep-2.trace", "summary.json"] {
        assert_eq!(
            std::fs::read(shard_dir.join(file)).unwrap(),
            std::fs::read(out.path().join(file)).unwrap(),
            "{file}"
        );
    }
    // A directory without a shard summary is refused, naming what it needs.
    let empty = tempfile::tempdir().unwrap();
    let refused = upload(empty.path());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("summary.json") && stderr.contains("output directory of a `basecamp-sandbox run`"),
        "{stderr}"
    );
}

#[test]
fn a_test_set_message_the_policy_cannot_take_is_refused_naming_its_row() {
    // Before: the message was dropped and the episode ran without it.
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), out.path());
    let tests = TESTS.replacen(
        r#""instruction": "Where is order 1?""#,
        r#""messages": [{"role": "customer", "content": "Where is order 1?"}]"#,
        1,
    );
    std::fs::write(project.path().join("tests.jsonl"), tests).unwrap();
    let manifest = project.path().join("task.yaml");
    let run =
        sandbox(&["run", "--config", manifest.to_str().unwrap(), "--no-upload", "--out", out.path().to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(r#"row "ep-1": messages[0]: unknown variant `customer`"#), "{stderr}");
    assert!(!out.path().join("ep-2.trace").exists(), "refused before any episode");
}

/// An S3 endpoint that refuses connections: each file is retried, and the
/// retries are said on stderr as they happen (before: only the final report,
/// with no sign of the waits in between).
#[test]
fn upload_retries_are_said_as_they_happen() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("s3://traces/runs"));
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // closed at once
    let run = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["run", "--config"])
        .arg(project.path().join("task.yaml"))
        .args(["--shard", "1/2", "--out"])
        .arg(out.path())
        .env("AWS_ENDPOINT_URL_S3", format!("http://{refused}"))
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .env("AWS_REGION", "us-east-1")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("upload failed; will retry"), "{stderr}");
}

#[test]
fn a_run_uploads_only_what_it_wrote_and_leaves_the_rest_of_the_output_directory_alone() {
    let project = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), dest.path());
    let manifest = project.path().join("task.yaml");
    let run = |shard: &str| {
        let run = sandbox(&[
            "run",
            "--config",
            manifest.to_str().unwrap(),
            "--shard",
            shard,
            "--out",
            out.path().to_str().unwrap(),
        ]);
        let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
        assert!(run.status.success(), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&run.stderr));
        stdout
    };
    // Shard 0 (ep-1, ep-2), then shard 1 (ep-3) into the same --out, which also holds a file of the user's.
    run("0/2");
    std::fs::write(out.path().join("notes.txt"), "mine").unwrap();
    let stdout = run("1/2");
    assert!(stdout.contains("uploaded 2 files"), "ep-3.trace and summary.json: {stdout}");
    let shard_1: Vec<String> = walk(dest.path())
        .into_iter()
        .filter_map(|p| p.split_once("/default/shipping/default/1/").map(|(_, file)| file.to_string()))
        .collect();
    // Before: ep-1.trace, ep-2.trace and notes.txt went up as shard 1's too.
    let mut shard_1 = shard_1;
    shard_1.sort();
    assert_eq!(shard_1, ["ep-3.trace", "summary.json"]);
    // Nothing local is removed.
    for kept in ["ep-1.trace", "ep-2.trace", "ep-3.trace", "notes.txt"] {
        assert!(out.path().join(kept).is_file(), "{kept}");
    }
}

/// A pod's layout: the manifests alone in a ConfigMap mount, the files they
/// name in the tools image's working directory.
#[test]
fn base_dir_resolves_the_manifests_relative_paths_against_the_tools_images_working_directory() {
    let config = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    write_project(image.path(), dest.path());
    std::fs::rename(image.path().join("task.yaml"), config.path().join("manifests.yaml")).unwrap();
    let manifest = config.path().join("manifests.yaml");
    let out_dir = config.path().join("out");
    let run_in = |cwd: &Path, extra: &[&str]| {
        let mut args =
            vec!["run", "--config", manifest.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--no-upload"];
        args.extend(extra);
        Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox")).args(&args).current_dir(cwd).output().unwrap()
    };

    // Without --base-dir the files are looked for beside the manifests, and are not there.
    let refused = run_in(image.path(), &[]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains(&config.path().join("fixture.jsonl").display().to_string()), "{said}");

    // `--base-dir .` (what the operator passes): the working directory, here the "image".
    let run = run_in(image.path(), &["--base-dir", "."]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("shipping/default shard 0/1: 3 episodes"), "{stdout}");
    let summary: Value = serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["episodes"][0]["failure_class"], "ok", "the fixture was found: {summary}");

    // A --base-dir that is not a directory is refused, naming the flag.
    for bad in ["no-such-dir", "fixture.jsonl"] {
        let refused = run_in(image.path(), &["--base-dir", bad]);
        let said = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{said}");
        assert!(said.contains(&format!("--base-dir {bad}: ")), "{said}");
    }
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}

#[test]
fn bad_manifests_are_refused_with_every_problem() {
    let project = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let text = std::fs::read_to_string(project.path().join("task.yaml")).unwrap();
    let broken =
        text.replace("shards: 2", "shards: 0").replace("sandboxRef: {name: tools}", "sandboxRef: {name: nope}");
    std::fs::write(project.path().join("task.yaml"), broken).unwrap();
    let run = sandbox(&["run", "--config", project.path().join("task.yaml").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("spec.shards"), "{stderr}");
    assert!(stderr.contains("nope"), "{stderr}");
}

#[test]
fn a_bad_shard_argument_is_explained() {
    let run = sandbox(&["run", "--config", "x.yaml", "--shard", "2/2"]);
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("the index must be below the count"));
}

#[test]
fn a_checkpoint_evaluation_runs_as_task_at_step_n_with_that_steps_weights() {
    let project = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), dest.path());
    let manifest = project.path().join("task.yaml");
    let out_dir = out.path().join("shard-0");
    let run = sandbox(&[
        "run",
        "--config",
        manifest.to_str().unwrap(),
        "--shard",
        "0/2",
        "--checkpoint-step",
        "30",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("shipping@step-30/default shard 0/2: 2 episodes"), "{stdout}");

    // summary.json names the run, as the operator aggregates it.
    let summary: Value = serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["task"], "shipping@step-30");
    // Step 30 is past the schedule's step 20: correctness weighs 2.0 (1.0 before).
    assert_eq!(summary["episodes"][0]["metrics"]["tool_call_accuracy"], 1.0);
    assert_eq!(summary["episodes"][0]["metrics"]["reward"], 2.0, "{}", summary["episodes"][0]);

    let trace = read_trace(out_dir.join("ep-1.trace")).unwrap();
    assert_eq!(trace.header.training_step, 30);
    assert_eq!(trace.header.task, "shipping@step-30");

    // Uploaded under <dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>@step-30/<variant>/<shard>/.
    let uploaded: Vec<_> = walk(dest.path());
    assert!(uploaded.iter().any(|p| p.ends_with("/default/shipping@step-30/default/0/summary.json")), "{uploaded:?}");
    assert!(uploaded.iter().any(|p| p.ends_with("/default/shipping@step-30/default/0/ep-1.trace")), "{uploaded:?}");
    assert!(!uploaded.iter().any(|p| p.contains("/shipping/")), "nothing under the task's own name: {uploaded:?}");

    // Without the flag the same shard is the task's own, at step 0's weights.
    let plain = out.path().join("plain");
    let run = sandbox(&[
        "run",
        "--config",
        manifest.to_str().unwrap(),
        "--shard",
        "0/2",
        "--no-upload",
        "--out",
        plain.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let summary: Value = serde_json::from_slice(&std::fs::read(plain.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["task"], "shipping");
    assert_eq!(summary["episodes"][0]["metrics"]["reward"], 1.0);
    assert_eq!(read_trace(plain.join("ep-1.trace")).unwrap().header.training_step, 0);
}

/// `basecamp-sandbox run` in the background, its stderr read as it comes.
struct Background {
    child: Child,
    stderr_lines: mpsc::Receiver<String>,
    stderr: String,
    stdout: std::thread::JoinHandle<String>,
}

/// How a background run ended.
struct Ended {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    /// When it had exited (polled every 20 ms).
    at: Instant,
}

impl Background {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, stderr_lines) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut stdout = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        Self { child, stderr_lines, stderr: String::new(), stdout }
    }

    /// The first stderr line containing `needle`, read within `within`.
    fn line_with(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr.push_str(&line);
                    self.stderr.push('\n');
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no stderr line with {needle:?} within {within:?}; stderr so far:\n{}", self.stderr);
                }
            }
        }
    }

    fn has_exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Waits for the exit, killing the process and failing after `within`.
    fn exit_within(mut self, within: Duration) -> Ended {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let rest: Vec<String> = self.stderr_lines.try_iter().collect();
                panic!("still running after {within:?}; stderr:\n{}{}", self.stderr, rest.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let at = Instant::now();
        let stdout = self.stdout.join().unwrap();
        // The reader thread ends with the pipe: everything written is in the channel.
        let mut stderr = self.stderr;
        for line in self.stderr_lines.iter() {
            stderr.push_str(&line);
            stderr.push('\n');
        }
        Ended { status, stdout, stderr, at }
    }
}

/// The URL in a line such as "... http://127.0.0.1:PORT/metrics ...".
fn address_in(line: &str) -> String {
    let rest = &line[line.find("http://").unwrap_or_else(|| panic!("no URL in {line:?}")) + "http://".len()..];
    rest.split(|c: char| c == '/' || c.is_whitespace()).next().unwrap().to_string()
}

/// `GET path` over a fresh connection; the body.
fn get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// The sum of `basecamp_sandbox_episodes_total` over its outcomes.
fn episodes_counted(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("basecamp_sandbox_episodes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Stdout with the wall time ("in 0.3s") and `paths` masked: the rest must not change with the linger.
fn comparable(stdout: &str, paths: &[&Path]) -> String {
    let is_seconds = |word: &str| word.strip_suffix('s').is_some_and(|n| n.parse::<f64>().is_ok());
    let mut text = stdout
        .lines()
        .map(|line| line.split(' ').map(|w| if is_seconds(w) { "<t>" } else { w }).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n");
    for path in paths {
        text = text.replace(&path.display().to_string(), "<path>");
    }
    text
}

/// A project whose shard 0/2 runs 2 episodes, and the `run` arguments for it (output in `out`).
fn linger_project(project: &Path, dest: &Path, out: &Path) -> Vec<String> {
    write_project(project, dest);
    let manifest = project.join("task.yaml").display().to_string();
    let out = out.display().to_string();
    ["run", "--config", &manifest, "--shard", "0/2", "--out", &out, "--listen", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn with<'a>(args: &'a [String], more: &[&'a str]) -> Vec<&'a str> {
    args.iter().map(String::as_str).chain(more.iter().copied()).collect()
}

const WAITING: &str = "waiting for a final scrape of http://";

/// The series names with labels (`name{labels}`) of a `/metrics` answer.
fn series(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| Some(l.rsplit_once(' ')?.0.to_string()))
        .collect()
}

/// The first scrape of a lingering run: the episodes wait for it.
fn first_scrape(run: &mut Background) -> (String, String) {
    let serving = run.line_with("serving /metrics", Duration::from_secs(60));
    let addr = address_in(&serving);
    (addr.clone(), get(&addr, "/metrics"))
}

#[test]
fn a_lingering_run_is_scraped_at_zero_before_its_episodes_and_with_its_final_counts_after_the_upload() {
    let (project, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (plain_dest, plain_out) = (tempfile::tempdir().unwrap(), out.path().join("plain"));
    let args = linger_project(project.path(), plain_dest.path(), &plain_out);
    let plain = sandbox(&with(&args, &[]));
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    assert!(!String::from_utf8_lossy(&plain.stderr).contains("scrape"), "no --metrics-linger: no wait");

    let (dest, linger_out) = (tempfile::tempdir().unwrap(), out.path().join("linger"));
    let args = linger_project(project.path(), dest.path(), &linger_out);
    let started = Instant::now();
    let mut run = Background::start(&with(&args, &["--metrics-linger", "60s"]));
    // Before its first scrape a lingering run starts no episode: a shard
    // shorter than a scrape interval would otherwise be scraped only with
    // its final counts, which rate() cannot tell from a series that was always there.
    let serving = run.line_with("serving /metrics", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(700));
    let traces = walk(&linger_out).into_iter().filter(|p| p.ends_with(".trace")).count();
    assert_eq!(traces, 0, "an episode started before the first scrape");
    let addr = address_in(&serving);
    let at_zero = get(&addr, "/metrics");
    assert_eq!(episodes_counted(&at_zero), 0, "{at_zero}");
    let waiting = run.line_with(WAITING, Duration::from_secs(60));
    assert!(waiting.contains("at most 1m"), "{waiting}");
    // The wait begins after the upload: its files are at the destination already.
    let uploaded = walk(dest.path());
    assert!(uploaded.iter().any(|p| p.ends_with("/0/summary.json")), "{uploaded:?}");
    let scraped = Instant::now();
    let metrics = get(&address_in(&waiting), "/metrics");
    assert_eq!(episodes_counted(&metrics), 2, "the scrape has every episode of the shard:\n{metrics}");
    // Every series of the final answer was in the first, at zero: each count is an increase.
    let (first, last) = (series(&at_zero), series(&metrics));
    assert!(last.iter().any(|s| s.starts_with("basecamp_sandbox_tool_calls_total{")), "{metrics}");
    let new: Vec<&String> = last.difference(&first).collect();
    assert!(new.is_empty(), "series that appeared only with their final counts: {new:?}");
    let ended = run.exit_within(Duration::from_secs(20));
    assert!(ended.stderr.contains("final scrape served after"), "{}", ended.stderr);
    assert!(
        ended.at.duration_since(scraped) < Duration::from_secs(20) && started.elapsed() < Duration::from_secs(60),
        "the scrapes ended the waits, not the 60s limit"
    );
    assert_eq!(ended.status.code(), plain.status.code(), "{}", ended.stderr);
    assert_eq!(
        comparable(&ended.stdout, &[dest.path(), &linger_out]),
        comparable(&String::from_utf8_lossy(&plain.stdout), &[plain_dest.path(), &plain_out])
    );
}

#[test]
fn without_a_scrape_the_metrics_linger_ends_at_its_limit_with_the_runs_exit_code() {
    let (project, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A destination that is a file: the upload fails, exit code 3.
    let dest = out.path().join("not-a-directory");
    std::fs::write(&dest, "").unwrap();
    let plain_out = out.path().join("plain");
    let args = linger_project(project.path(), &dest, &plain_out);
    let plain = sandbox(&with(&args, &[]));
    assert_eq!(plain.status.code(), Some(3), "{}", String::from_utf8_lossy(&plain.stderr));

    let linger_out = out.path().join("linger");
    let args = linger_project(project.path(), &dest, &linger_out);
    let mut run = Background::start(&with(&args, &["--metrics-linger", "1s"]));
    // No first scrape either: the episodes start after 1s, saying so.
    let unscraped = run.line_with("starting anyway", Duration::from_secs(60));
    assert!(unscraped.contains("no scrape of http://") && unscraped.contains("within 1s"), "{unscraped}");
    run.line_with(WAITING, Duration::from_secs(60));
    let waited = Instant::now();
    let ended = run.exit_within(Duration::from_secs(20));
    assert!(ended.at.duration_since(waited) >= Duration::from_millis(900), "it waited for the linger");
    assert!(ended.stderr.contains("no scrape within 1s"), "{}", ended.stderr);
    assert_eq!(ended.status.code(), Some(3), "{}", ended.stderr);
    assert_eq!(
        comparable(&ended.stdout, &[&linger_out]),
        comparable(&String::from_utf8_lossy(&plain.stdout), &[&plain_out])
    );
}

#[test]
fn sigterm_ends_the_metrics_linger_at_once() {
    let (project, dest, out) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let args = linger_project(project.path(), dest.path(), &out.path().join("linger"));
    let mut run = Background::start(&with(&args, &["--metrics-linger", "60s"]));
    first_scrape(&mut run);
    run.line_with(WAITING, Duration::from_secs(60));
    let killed = Command::new("kill").args(["-TERM", &run.child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let signalled = Instant::now();
    let ended = run.exit_within(Duration::from_secs(10));
    assert!(ended.at.duration_since(signalled) < Duration::from_secs(10));
    assert!(ended.stderr.contains("stopped waiting for a final scrape"), "{}", ended.stderr);
    assert!(!ended.stderr.contains("no new episodes"), "the shard was over: {}", ended.stderr);
    assert_eq!(ended.status.code(), Some(0), "{}", ended.stderr);
}

#[test]
fn a_scrape_during_the_episodes_does_not_end_the_metrics_linger() {
    let (project, dest, out) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let args = linger_project(project.path(), dest.path(), &out.path().join("linger"));
    // ep-1 thinks 2 s over its first turn: time to scrape while it runs.
    let slow = POLICY.replacen(r#"{"order_id": "1"}}]}"#, r#"{"order_id": "1"}}], "delay_ms": 2000}"#, 1);
    assert_ne!(slow, POLICY);
    std::fs::write(project.path().join("policy.jsonl"), slow).unwrap();
    let mut run = Background::start(&with(&args, &["--metrics-linger", "60s"]));
    let (addr, _) = first_scrape(&mut run);
    // Wait until ep-1's first turn is under way (its trace exists).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !walk(&out.path().join("linger")).iter().any(|p| p.ends_with(".trace")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let early = get(&addr, "/metrics");
    assert!(episodes_counted(&early) < 2, "this scrape must come before the last episode ended:\n{early}");
    run.line_with(WAITING, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!run.has_exited(), "a scrape from before the final counts must not end the wait");
    let last = get(&addr, "/metrics");
    assert_eq!(episodes_counted(&last), 2, "{last}");
    let ended = run.exit_within(Duration::from_secs(20));
    assert!(ended.stderr.contains("final scrape served after"), "{}", ended.stderr);
    assert_eq!(ended.status.code(), Some(0), "{}", ended.stderr);
}

#[test]
fn a_metrics_linger_needs_a_listen_address_and_a_duration() {
    let no_listen = sandbox(&["run", "--config", "x.yaml", "--metrics-linger", "45s"]);
    assert_eq!(no_listen.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_listen.stderr).contains("--listen"), "{no_listen:?}");
    let negative = sandbox(&["run", "--config", "x.yaml", "--listen", "127.0.0.1:0", "--metrics-linger=-5s"]);
    assert_eq!(negative.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&negative.stderr).contains("0s or more"), "{negative:?}");
}

#[test]
fn count_flags_of_0_are_refused_naming_the_flag() {
    // Before: both were taken as 1 without a word.
    for (args, flag) in [
        (vec!["run", "--config", "x.yaml", "--concurrency", "0"], "--concurrency"),
        (vec!["serve", "--config", "x.yaml", "--listen", "127.0.0.1:0", "--max-episodes", "0"], "--max-episodes"),
    ] {
        let run = sandbox(&args);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("invalid value '0' for '{flag}")), "{stderr}");
    }
}

#[test]
fn a_concurrency_above_the_episodes_runs_them_all_at_once() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    // Before: "a semaphore may not have more than MAX_PERMITS permits", a panic, exit 101.
    let run = sandbox(&[
        "run",
        "--config",
        manifest.to_str().unwrap(),
        "--no-upload",
        "--concurrency",
        "18446744073709551615",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&run.stdout).contains("shard 0/1: 3 episodes"));
}

#[test]
fn an_output_path_that_is_a_file_is_named_as_the_output_directory() {
    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join("taken");
    std::fs::write(&taken, "mine").unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce");
    let common = ["--config", example.to_str().unwrap(), "--variant", "a", "--out", taken.to_str().unwrap()];
    for command in [&["run"][..], &["serve", "--listen", "127.0.0.1:0"][..]] {
        let out = sandbox(&[command, &common[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command:?}: {stderr}");
        // Before: "error [ServiceStart]: service tracking: cannot start \"python3\": Not a directory".
        let expected = format!("error [TraceIo]: cannot create the output directory {}: ", taken.display());
        assert!(stderr.contains(&expected) && stderr.contains("give another with --out"), "{command:?}: {stderr}");
        assert!(!stderr.contains("ServiceStart"), "{stderr}");
        assert_eq!(std::fs::read_to_string(&taken).unwrap(), "mine");
    }
}

#[test]
fn a_listen_address_in_use_is_named_with_its_flag() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let manifest = project.path().join("task.yaml");
    let out_dir = out.path().join("shard-0");
    let run = sandbox(&[
        "run",
        "--config",
        manifest.to_str().unwrap(),
        "--no-upload",
        "--listen",
        &addr,
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    // Before: "error [TraceIo]: cannot run the shard: Address already in use (os error 98)".
    assert!(stderr.contains(&format!("error [Listen]: cannot listen on {addr} (--listen): ")), "{stderr}");
}

/// `basecamp-sandbox ARGS | head -0`: the reader is gone before anything is written.
fn with_stdout_closed(args: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child
}

#[test]
fn a_closed_stdout_is_an_error_line_after_a_complete_shard_not_a_panic() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    let out_dir = out.path().join("shard-0");
    let args = ["run", "--config", manifest.to_str().unwrap(), "--no-upload", "--out", out_dir.to_str().unwrap()];
    let run = with_stdout_closed(&args).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    // Before: "panicked ... failed printing to stdout: Broken pipe", exit 101.
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("error [Stdout]: cannot write the outcome to stdout: Broken pipe"), "{stderr}");
    let summary: Value = serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["aggregate"]["episodes"], 3);
    assert!(matches!(read_trace(out_dir.join("ep-1.trace")).unwrap().tail, Tail::Complete));
}

#[test]
fn a_server_whose_stdout_is_closed_keeps_serving_and_says_where() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    let args = ["serve", "--config", manifest.to_str().unwrap(), "--listen", "127.0.0.1:0"];
    let mut child = with_stdout_closed(&[&args[..], &["--out", out.path().to_str().unwrap()]].concat());
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Before: "panicked ... failed printing to stdout: Broken pipe" before serving anything.
    let warning =
        lines.find_map(|line| line.ok().filter(|l| l.contains("cannot write to stdout") || l.contains("panicked")));
    let warning = warning.expect("a line about stdout");
    assert!(warning.starts_with("warning: cannot write to stdout (Broken pipe"), "{warning}");
    let addr = address_in(&warning);
    get(&addr, "/healthz"); // a 200: the server still serves
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_summary_that_cannot_be_written_is_named() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    // A full disk at the end of the shard: the summary's temporary file is /dev/full.
    std::os::unix::fs::symlink("/dev/full", out.path().join(".summary.json.tmp")).unwrap();
    let run =
        sandbox(&["run", "--config", manifest.to_str().unwrap(), "--no-upload", "--out", out.path().to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    // Before: "error [TraceIo]: cannot run the shard: No space left on device (os error 28)".
    let summary = out.path().join("summary.json");
    let expected = format!("cannot write {}: No space left on device", summary.display());
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!out.path().join(".summary.json.tmp").exists(), "no temporary file is left");
    assert!(matches!(read_trace(out.path().join("ep-1.trace")).unwrap().tail, Tail::Complete));
}

#[test]
fn a_closed_stderr_loses_its_lines_not_the_shard() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    // `2>&1 | head -1`, after head has gone: every write to stderr fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let run = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["run", "--config", manifest.to_str().unwrap(), "--no-upload", "--listen", "127.0.0.1:0"])
        .args(["--out", out.path().to_str().unwrap()])
        .stderr(writer)
        .output()
        .unwrap();
    // Before: the "serving /metrics" line panicked before the first episode, exit 101, no summary.
    assert_eq!(run.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&run.stdout).contains("shipping/default shard 0/1: 3 episodes"));
    assert!(out.path().join("summary.json").is_file());
}

#[test]
fn an_api_key_that_cannot_be_a_header_is_refused_before_any_episode() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    let key = project.path().join("key");
    // Two lines: a key file holding more than the key.
    std::fs::write(&key, "sk-abc\nsk-def\n").unwrap();
    let text = std::fs::read_to_string(&manifest).unwrap().replace(
        "scripted: policy.jsonl",
        &format!("endpoint: http://127.0.0.1:9/v1\n    model: m\n    apiKeyFile: {}", key.display()),
    );
    std::fs::write(&manifest, text).unwrap();
    let run =
        sandbox(&["run", "--config", manifest.to_str().unwrap(), "--no-upload", "--out", out.path().to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    // Before: exit 0, every episode failed with "builder error: failed to parse header value".
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let expected = format!("policy API key from file {} cannot be sent in an HTTP header", key.display());
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!stderr.contains("sk-abc"), "the key is never printed");
    assert!(!out.path().join("ep-1.trace").exists(), "no episode ran");
}

#[test]
fn an_http_header_that_cannot_be_sent_is_refused_naming_the_field() {
    let project = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap().replace(
        "      recorded:\n        fixture: fixture.jsonl\n",
        "      http:\n        url: http://127.0.0.1:9/orders/{{order_id}}\n        headers: {\"X-Order\": \"a\\nb\"}\n",
    );
    std::fs::write(&manifest, text).unwrap();
    let run = sandbox(&["run", "--config", manifest.to_str().unwrap(), "--no-upload"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    // Before: exit 0, every call failed with "builder error: failed to parse header value".
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("spec.tools.track_order.http.headers.X-Order: the value holds a line break"), "{stderr}");
}

#[test]
fn an_exec_tool_whose_program_cannot_start_is_refused_naming_the_field() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(project.path().join("plain.sh"), "#!/bin/sh\necho '{}'\n").unwrap();
    std::fs::set_permissions(project.path().join("plain.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .unwrap();
    let field = "spec.tools.track_order.exec.command[0]";
    for (command, said) in [
        (
            "[tools/missing.py]",
            format!("\"tools/missing.py\" ({}) does not exist", project.path().join("tools/missing.py").display()),
        ),
        ("[no-such-program-basecamp]", "\"no-such-program-basecamp\" is not an executable on PATH".to_string()),
        ("[./plain.sh]", "is not executable (mode 644)".to_string()),
    ] {
        let exec = format!("      exec:\n        command: {command}\n");
        std::fs::write(&manifest, text.replace("      recorded:\n        fixture: fixture.jsonl\n", &exec)).unwrap();
        let run = sandbox(&[
            "run",
            "--config",
            manifest.to_str().unwrap(),
            "--no-upload",
            "--out",
            out.path().to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        // Before: exit 0, every call failed with a spawn error.
        assert_eq!(run.status.code(), Some(1), "{command}: {stderr}");
        assert!(stderr.contains(&format!("error [ExecProgramUnavailable]: {field}: ")), "{stderr}");
        assert!(stderr.contains(&said), "{command}: {stderr}");
        assert!(!out.path().join("ep-1.trace").exists(), "no episode ran");
    }
    // Made executable, it runs: a relative path is the manifest directory's, that directory
    // given relative to the working directory too.
    std::fs::set_permissions(project.path().join("plain.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["run", "--config", "./task.yaml", "--no-upload", "--out", out.path().to_str().unwrap()])
        .current_dir(project.path())
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let summary: Value = serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["aggregate"]["means"]["error_rate"], 0.0, "every call ran: {summary}");
}

#[test]
fn sigterm_while_a_service_starts_stops_it_and_serves_nothing() {
    // The e-commerce example with a tracking service that never becomes ready.
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    never_ready(&project);
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["serve", "--config", project.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--out", out.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_services(&project, Duration::from_secs(20));
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "SIGTERM did not end the wait for the service");
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    // Before: killed by the signal on the spot, the service left sleeping.
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.stdout.is_empty(), "nothing was served");
    wait_for_no_services(&project, Duration::from_secs(5));
}

#[test]
fn sigkill_of_the_sandbox_takes_its_services_with_it() {
    // The e-commerce example with a tracking service that never becomes ready: it runs
    // while the sandbox waits for it.
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    never_ready(&project);
    // Before: the service slept on, reparented to init.
    sigkill_the_sandbox_once_running(&project, 1);
}

/// What a service started goes with it too: the service runs under a keeper
/// that the kernel signals when the sandbox dies and that kills the whole
/// process group. Before, only the service itself got a parent-death signal,
/// and its child slept on, reparented to init.
#[test]
fn sigkill_of_the_sandbox_takes_what_its_services_started_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    never_ready(&project);
    // The service starts a second `services/tracking.py` (in its process group) and waits.
    let forking = r#"import os, subprocess, sys, time
if not os.environ.get("CHILD"):
    subprocess.Popen([sys.executable, "services/tracking.py"], env={**os.environ, "CHILD": "1"})
time.sleep(600)
"#;
    std::fs::write(project.join("services/tracking.py"), forking).unwrap();
    sigkill_the_sandbox_once_running(&project, 2);
}

/// Runs the sandbox on `project` until `count` tracking processes run in it,
/// SIGKILLs it (no handler and no destructor runs: only the kernel can stop
/// them now), and waits until none is left.
fn sigkill_the_sandbox_once_running(project: &Path, count: usize) {
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["run", "--config", project.to_str().unwrap(), "--no-upload"])
        .args(["--out", out.path().to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while services_in(project).len() < count {
        let log = std::fs::read_to_string(out.path().join("services/tracking.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "{count} tracking process(es): {:?}; log: {log}", services_in(project));
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for_no_services(project, Duration::from_secs(5));
}

#[test]
fn a_manifest_file_far_too_large_is_refused_without_reading_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.yaml");
    // 17 MiB of zero bytes (sparse); `--config /dev/zero` was read until the OOM killer came.
    std::fs::File::create(&big).unwrap().set_len(17 << 20).unwrap();
    let run = sandbox(&["run", "--config", big.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}: cannot read it: more than 16 MiB", big.display())), "{stderr}");
}

#[test]
fn server_mode_reads_large_bodies_and_refuses_larger_ones_as_json() {
    let project = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["serve", "--config", manifest.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--out", out.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = address_in(&line);

    // 3 MB, as a step's raw logits of a few tokens are. Before: 413 in plain text
    // ("Failed to buffer the request body: length limit exceeded"), axum's 2 MB default.
    let big = serde_json::to_vec(&serde_json::json!({"instruction": "a".repeat(3 << 20)})).unwrap();
    let (status, answer) = post_repeated(&addr, "/v1/episodes", &big, 1);
    assert_eq!(status, 201, "{}", &answer[..answer.len().min(300)]);
    // Over the limit: the API's JSON error.
    let (status, answer) = post_repeated(&addr, "/v1/episodes", &[b' '; 1 << 20], 257);
    assert_eq!(status, 413, "{answer}");
    let error: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(error["error"]["category"], "RequestTooLarge", "{answer}");
    let _ = child.kill();
    let _ = child.wait();
}

/// A HarnessTask in team-a using SandboxConfig `s`, and `s` in each of
/// `sandboxes` (`None`: without a namespace), each with its own `maxSteps`.
fn team_a_task_and_sandboxes(sandboxes: &[Option<&str>]) -> basecamp_api::Manifests {
    let mut text = String::from(
        "apiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {name: t, namespace: team-a}\nspec:\n  taskDefinition: {}\n  evaluation: {testSet: tests.jsonl}\n  policy: {scripted: policy.jsonl}\n  sandboxRef: {name: s}\n",
    );
    for (steps, namespace) in sandboxes.iter().enumerate() {
        let namespace = namespace.map(|n| format!(", namespace: {n}")).unwrap_or_default();
        text.push_str(&format!(
            "---\napiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {{name: s{namespace}}}\nspec: {{maxSteps: {}}}\n",
            steps + 1
        ));
    }
    let (manifests, report) = basecamp_api::Manifests::parse("m.yaml", &text);
    assert!(report.is_empty(), "{report}");
    manifests
}

#[test]
fn a_variant_gets_the_sandbox_config_of_its_tasks_namespace_never_another_namespaces() {
    use basecamp_sandbox::run::resolve_variants;
    let resolved_steps = |sandboxes: &[Option<&str>]| {
        let manifests = team_a_task_and_sandboxes(sandboxes);
        let variants = resolve_variants(&manifests, &manifests.tasks[0].object, None);
        variants.map(|v| v[0].sandbox.max_steps)
    };
    // Before: team-b's `s` (maxSteps 1), the first of that name in the files.
    assert_eq!(resolved_steps(&[Some("team-b"), Some("team-a")]).unwrap(), Some(2));
    // `kubectl apply -f` puts a SandboxConfig without a namespace where the task goes.
    assert_eq!(resolved_steps(&[Some("team-b"), None]).unwrap(), Some(2));
    // Before: team-b's `s`, without a word.
    let err = resolved_steps(&[Some("team-b")]).unwrap_err().to_string();
    assert!(err.contains("SandboxConfig \"s\" is in namespace team-b, the task in team-a"), "{err}");
}

#[test]
fn a_task_is_chosen_by_name_or_by_namespace_and_name_never_by_the_order_of_the_files() {
    use basecamp_sandbox::run::select_task;
    let task = |namespace: &str| {
        format!(
            "apiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {{name: t, namespace: {namespace}}}\nspec:\n  taskDefinition: {{}}\n  evaluation: {{testSet: tests.jsonl}}\n  policy: {{scripted: policy.jsonl}}\n  sandboxRef: {{name: s}}\n"
        )
    };
    let text = format!("{}---\n{}", task("team-b"), task("team-a"));
    let (manifests, report) = basecamp_api::Manifests::parse("m.yaml", &text);
    assert!(report.is_empty(), "{report}");
    let namespace_of = |wanted: &str| {
        select_task(&manifests, Some(wanted)).map(|t| t.object.metadata.namespace.clone().unwrap_or_default())
    };
    assert_eq!(namespace_of("team-a/t").unwrap(), "team-a");
    assert_eq!(namespace_of("team-b/t").unwrap(), "team-b");
    // Before: team-b's, the first in the file, without a word.
    let err = namespace_of("t").unwrap_err().to_string();
    assert!(
        err.contains(
            "HarnessTask \"t\" is in several namespaces (team-b/t, team-a/t); choose one with --task NAMESPACE/t"
        ),
        "{err}"
    );
    let err = namespace_of("team-c/t").unwrap_err().to_string();
    assert!(err.contains("no HarnessTask \"team-c/t\" in the manifests; they hold: team-b/t, team-a/t"), "{err}");
}

#[test]
fn a_task_without_a_namespace_runs_in_the_one_its_name_or_its_sandbox_configs_give() {
    use basecamp_sandbox::run::{run_namespace, select_task};
    // A namespace-less task with variants a and b using SandboxConfigs `sa` and `sb`.
    let manifests = |sa: Option<&str>, sb: Option<&str>| {
        let sandbox = |name: &str, namespace: Option<&str>| {
            let namespace = namespace.map(|n| format!(", namespace: {n}")).unwrap_or_default();
            format!(
                "---\napiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {{name: {name}{namespace}}}\nspec: {{}}\n"
            )
        };
        let text = format!(
            "apiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {{name: t}}\nspec:\n  taskDefinition: {{}}\n  evaluation: {{testSet: tests.jsonl}}\n  policy: {{scripted: policy.jsonl}}\n  variants:\n    - {{name: a, sandboxRef: {{name: sa}}}}\n    - {{name: b, sandboxRef: {{name: sb}}}}\n{}{}",
            sandbox("sa", sa),
            sandbox("sb", sb)
        );
        let (manifests, report) = basecamp_api::Manifests::parse("m.yaml", &text);
        assert!(report.is_empty(), "{report}");
        manifests
    };
    let namespace = |sa, sb, wanted: Option<&str>| {
        let manifests = manifests(sa, sb);
        let task = select_task(&manifests, wanted)?;
        run_namespace(&manifests, &task.object)
    };
    // Nothing says: `default`, as `kubectl apply` without -n.
    assert_eq!(namespace(None, None, None).unwrap(), "default");
    // Before: `default` in the traces and the upload partition, though the
    // SandboxConfigs (and so, applied together, the task) are in team-a.
    assert_eq!(namespace(Some("team-a"), None, None).unwrap(), "team-a");
    assert_eq!(namespace(Some("team-a"), Some("team-a"), Some("t")).unwrap(), "team-a");
    // Before: `default`, though --task named team-c.
    assert_eq!(namespace(None, None, Some("team-c/t")).unwrap(), "team-c");
    // One task runs in one namespace; before, the run went ahead as `default`.
    let err = namespace(Some("team-a"), Some("team-b"), None).unwrap_err().to_string();
    assert!(
        err.contains(
            "HarnessTask \"t\" has no metadata.namespace and its variants use SandboxConfigs of namespaces team-a, team-b; a task runs in one namespace"
        ),
        "{err}"
    );
    // --task NAMESPACE/NAME settles it: the variants' SandboxConfigs are looked up there.
    assert_eq!(namespace(Some("team-a"), Some("team-b"), Some("team-a/t")).unwrap(), "team-a");
}

/// A pod evicted mid-shard gets SIGTERM: the running episode's trace is
/// ended as `cancelled`, the summary says what was cut off, and the exit
/// code says the shard is not done (130), so the Job retries it instead of
/// counting partial results as a finished shard. Before: exit 0.
#[test]
fn sigterm_mid_shard_writes_the_summary_and_exits_130() {
    let (project, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_project(project.path(), Path::new("/tmp/unused"));
    // ep-1 thinks 30 s over its first turn: the signal comes while it runs.
    let slow = POLICY.replacen(r#"{"order_id": "1"}}]}"#, r#"{"order_id": "1"}}], "delay_ms": 30000}"#, 1);
    assert_ne!(slow, POLICY);
    std::fs::write(project.path().join("policy.jsonl"), slow).unwrap();
    let manifest = project.path().join("task.yaml").display().to_string();
    let out_dir = out.path().display().to_string();
    let run =
        Background::start(&["run", "--config", &manifest, "--no-upload", "--concurrency", "1", "--out", &out_dir]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out.path().join("ep-1.trace").exists() {
        assert!(Instant::now() < deadline, "ep-1 never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(Command::new("kill").args(["-TERM", &run.child.id().to_string()]).status().unwrap().success());
    let ended = run.exit_within(Duration::from_secs(20));
    assert_eq!(ended.status.code(), Some(130), "{}", ended.stderr);
    assert!(ended.stderr.contains("stopping: no new episodes"), "{}", ended.stderr);
    assert!(
        ended
            .stderr
            .contains("stopped early: 1 episodes interrupted, 2 not started (summary.json lists them); exit 130"),
        "{}",
        ended.stderr
    );
    let summary: Value = serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["stopped_early"], true);
    assert_eq!(summary["interrupted"], serde_json::json!(["ep-1"]));
    assert_eq!(summary["not_started"], serde_json::json!(["ep-2", "ep-3"]));
    let trace = read_trace(out.path().join("ep-1.trace")).unwrap();
    assert!(trace.damage().is_none(), "the cut-off episode's trace is whole: {:?}", trace.damage());
}

/// An S3 outage before the first episode (the test set cannot be fetched
/// after every retry) is exit 4, which the operator's Job retries; before,
/// it was exit 1, which fails the shard's index for good as a refused
/// configuration does.
#[test]
fn a_test_set_on_an_unreachable_s3_is_exit_4_not_a_configuration_error() {
    let (project, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_project(project.path(), Path::new("/tmp/unused"));
    let manifest = project.path().join("task.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("testSet: tests.jsonl", "testSet: s3://testsets/tests.jsonl")).unwrap();
    let port = basecamp_sandbox::testing::free_port();
    let run = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["run", "--config", manifest.to_str().unwrap(), "--no-upload", "--out", out.path().to_str().unwrap()])
        .env("AWS_ENDPOINT_URL_S3", format!("http://127.0.0.1:{port}"))
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("error [TestSetUnavailable]: test set s3://testsets/tests.jsonl: "), "{stderr}");
    assert!(stderr.contains("(unavailable for now: exit 4, a later attempt can succeed)"), "{stderr}");
}

/// A policy that cannot be built is refused before any service starts, in
/// both modes: no service runs, and the output directory holds no logs.
#[test]
fn a_refused_policy_starts_no_service() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let marker = project.join("service-started");
    let service = project.join("services/tracking.py");
    let code = std::fs::read_to_string(&service).unwrap();
    std::fs::write(&service, format!("import pathlib; pathlib.Path({:?}).touch()\n{code}", marker.display())).unwrap();
    let mut policy = std::fs::read_to_string(project.join("policy.jsonl")).unwrap();
    let bad_line = policy.lines().count() + 1;
    policy.push_str("{\"episode\": \"ship-999\", \"turns\": 5}\n");
    std::fs::write(project.join("policy.jsonl"), policy).unwrap();
    for (command, flag) in [("run", "--no-upload"), ("serve", "--listen=127.0.0.1:0")] {
        let out = tempfile::tempdir().unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
            .args([command, "--config", project.to_str().unwrap(), "--out", out.path().to_str().unwrap()])
            .arg(flag)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{command}: {stderr}");
        assert!(stderr.contains(&format!("policy.jsonl:{bad_line}: ")), "{command}: {stderr}");
        // Before: the tracking service was started, and waited for, before the policy was read.
        assert!(!marker.exists(), "{command}: a service started before the policy was refused");
        assert!(!out.path().join("services").exists(), "{command}: services' logs were written");
    }
}

/// Driver mode takes an injection id once an episode, the ids of the
/// scheduled injections (`injection-<n>`, spec.injections[n]) included, as
/// server mode does: a live injection may not reuse one.
#[test]
fn a_live_injection_may_not_take_the_id_of_a_scheduled_one() {
    let (project, out, dest) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let args = linger_project(project.path(), dest.path(), out.path());
    let manifest = project.path().join("task.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let scheduled = text.replace(
        "  maxSteps: 4\n",
        "  maxSteps: 4\n  injections:\n    - afterTool: track_order\n      observation: Check the carrier too.\n",
    );
    assert_ne!(scheduled, text);
    std::fs::write(&manifest, scheduled).unwrap();
    // A lingering run starts no episode before its first scrape: the injections reach ep-1 at its start.
    let mut run = Background::start(&with(&args, &["--metrics-linger", "60s"]));
    let addr = address_in(&run.line_with("serving /metrics", Duration::from_secs(60)));
    let inject = |body: &str| {
        let (status, answer) = post_repeated(&addr, "/v1/episodes/ep-1/inject", body.as_bytes(), 1);
        (status, serde_json::from_str::<Value>(&answer).unwrap_or_else(|e| panic!("{e}: {answer}")))
    };
    // Before: 202, and ep-1's trace held two injections "injection-0", the live one first.
    let (status, refused) = inject(r#"{"observation": "live words", "id": "injection-0"}"#);
    assert_eq!((status, refused["error"]["category"].as_str()), (409, Some("InjectionExists")), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("injection \"injection-0\" is scheduled for episode \"ep-1\" (the sandbox's spec.injections)"),
        "{message}"
    );
    let (status, taken) = inject(r#"{"observation": "live words", "id": "ops-1"}"#);
    assert_eq!(status, 202, "{taken}");
    get(&addr, "/metrics");
    let waiting = run.line_with(WAITING, Duration::from_secs(60));
    get(&address_in(&waiting), "/metrics");
    let ended = run.exit_within(Duration::from_secs(20));
    assert_eq!(ended.status.code(), Some(0), "{}", ended.stderr);
    let trace = read_trace(out.path().join("ep-1.trace")).unwrap();
    let ids: Vec<String> = trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(basecamp_trace::pb::record::Body::Injection(i)) => Some(i.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["ops-1", "injection-0"]);
}

/// A sandbox pod says when one of its services died while the episodes
/// used it, with its exit status and the end of its log, on stderr and in
/// its `summary.json` (`service_exits`, uploaded with the log), and the
/// calls to it failed as `service_exited` errors naming it (they were bare
/// `transport` errors; before that, nothing said it at all). Its episodes
/// failing one after another, the shard gives up (a service is not
/// restarted) and exits 4, so that the Job runs it again in a new pod.
#[test]
fn a_service_that_dies_during_the_run_is_named_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    // Answers its readiness probe, then exits with status 3 on the first order asked for.
    let crashing = r#"import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/healthz":
            print("tracking crashed on", self.path, flush=True)
            os._exit(3)
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
HTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler).serve_forever()
"#;
    std::fs::write(project.join("services/tracking.py"), crashing).unwrap();
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["run", "--config", project.to_str().unwrap(), "--variant", "b", "--no-upload", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "the shard gave up: {stderr}");
    assert!(
        stderr.contains("service_exited); a service that exited is not restarted, so no more episodes were started"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "warning: service tracking exited with exit status: 3 during the run; the tool calls to it failed"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("tracking crashed on /"), "the end of its log: {stderr}");
    let summary: Value = serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    let exits = summary["service_exits"].as_array().unwrap_or_else(|| panic!("no service_exits: {summary}"));
    assert_eq!(exits.len(), 1, "{summary}");
    assert_eq!((exits[0]["service"].as_str(), exits[0]["status"].as_str()), (Some("tracking"), Some("exit status: 3")));
    assert!(exits[0]["tail"].as_str().unwrap().contains("tracking crashed on /"), "{summary}");
    let episodes = summary["episodes"].as_array().unwrap();
    assert!(!episodes.is_empty() && episodes.iter().all(|e| e["failure_class"] == "service_exited"), "{summary}");
    let not_started = summary["gave_up"]["not_started"].as_array().map_or(0, Vec::len);
    assert_eq!(episodes.len() + not_started, 60, "every episode ran or is named as not started: {summary}");
}
