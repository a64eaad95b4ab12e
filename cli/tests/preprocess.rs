//! `basecamp data preprocess`: traces of a real run into (state, action,
//! reward) batches, with the built-in trajectory preprocessor and with user
//! Python preprocessors (a good one, one that returns the wrong shape, one
//! that raises, one that does not import); and the dataset a trainer pod's
//! `dataset` init container makes: traces from an `s3://` prefix (by
//! default the manifest's `dataPipeline.source`) into batches uploaded to
//! an `s3://` prefix, `dataset.json` last, against a real S3 server
//! (`s3s-fs` on 127.0.0.1, as in `s3_inputs.rs`). Parquet batches
//! (`dataPipeline.format`, `--format`) are read back by pyarrow, an
//! independent reader (`scripts/pyarrow.sh`), and compared with the JSON
//! Lines of the same traces.

#[path = "support/pyarrow.rs"]
mod pyarrow;
#[path = "support/s3.rs"]
mod s3;
#[path = "support/unended.rs"]
mod unended;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use s3::{BUCKET, S3Server, basecamp_with_s3};
use serde_json::Value;

fn basecamp(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).current_dir(dir).output().expect("basecamp runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn rows(dir: &Path) -> Vec<Value> {
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<Value>>()
        })
        .collect()
}

#[test]
fn traces_become_training_rows_with_the_sandboxes_rewards_and_user_preprocessors_are_checked_first() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce");
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let output = basecamp(
        &[
            "run",
            example.to_str().unwrap(),
            "--variant",
            "a",
            "--shards",
            "1",
            "--concurrency",
            "16",
            "--no-progress",
            "--out",
            runs.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let run: Value = serde_json::from_slice(&std::fs::read(runs.join("run.json")).unwrap()).unwrap();
    let episodes = run["variants"][0]["episodes"].as_array().unwrap();
    let steps: u64 = episodes.iter().map(|e| e["metrics"]["steps"].as_u64().unwrap()).sum();

    // Built-in: one row per step; the final step carries the episode's reward, as the sandbox scored it.
    let out = tmp.path().join("builtin");
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--config",
            example.to_str().unwrap(),
            "--batch-size",
            "25",
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let built = rows(&out);
    assert_eq!(built.len() as u64, steps);
    let dataset: Value = serde_json::from_slice(&std::fs::read(out.join("dataset.json")).unwrap()).unwrap();
    let batches = steps.div_ceil(25);
    assert_eq!(dataset["batches"].as_array().unwrap().len() as u64, batches);
    assert_eq!(dataset["batches"][0], "batch-00000.jsonl");
    assert_eq!(dataset["source"], runs.to_str().unwrap());
    assert_eq!(dataset["version"], Value::Null, "neither --version nor dataPipeline.version");
    assert_eq!(dataset["preprocessor"], "builtin:trajectory");
    assert_eq!(dataset["batchSize"], 25);
    assert_eq!(dataset["rows"].as_u64(), Some(steps));
    // Every episode ended: its reward is known.
    assert_eq!(dataset["truncatedRows"], 0);
    assert!(built.iter().all(|r| r["truncated"] == false), "{built:?}");
    assert!(!text(&output).contains("truncated"), "{}", text(&output));
    assert_eq!(dataset["traces"].as_u64(), Some(episodes.len() as u64));
    assert_eq!(dataset["skipped"], serde_json::json!([]));
    assert_eq!(dataset["trainingStep"], 0);
    let created = dataset["createdAt"].as_str().unwrap();
    assert!(created.len() == 20 && created.ends_with('Z') && &created[10..11] == "T", "{created}");
    for episode in episodes {
        let id = episode["id"].as_str().unwrap();
        let mine: Vec<&Value> = built.iter().filter(|r| r["episode"] == id).collect();
        let last = mine.last().unwrap();
        assert_eq!(last["action"]["type"], "final_answer", "{id}");
        let expected = episode["metrics"]["reward"].as_f64().unwrap();
        assert!((last["reward"].as_f64().unwrap() - expected).abs() < 1e-9, "{id}: {last} vs {expected}");
        assert!(mine[..mine.len() - 1].iter().all(|r| r["reward"] == 0.0));
    }
    // The null the fallback wrote is in the next step's state.
    assert!(
        built.iter().any(|r| r["state"]["memory"]["shipping_status"].is_null()
            && r["state"]["memory"].get("shipping_status").is_some())
    );

    // A user's Python preprocessor: raw record in, (state, action, reward) out.
    std::fs::write(
        tmp.path().join("prep.py"),
        "def triple(record):\n    return ({'memory': record['memory_before']}, record['action'], record.get('episode_reward', 0.0))\n\
         def wrong(record):\n    return {'state': 1}\n\
         def raising(record):\n    raise ValueError('bad record ' + 'x' * 10000)\n",
    )
    .unwrap();
    let out = tmp.path().join("python");
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--preprocessor",
            "python:prep.triple",
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let python = rows(&out);
    assert_eq!(python.len(), built.len());
    assert_eq!(
        python.iter().map(|r| &r["reward"]).collect::<Vec<_>>(),
        built.iter().map(|r| &r["reward"]).collect::<Vec<_>>()
    );
    // With --config the preprocessor runs in the manifest's directory, and the user's
    // code where it was started (a trainer image's WORKDIR) still imports.
    let out = tmp.path().join("python-config");
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--config",
            example.to_str().unwrap(),
            "--preprocessor",
            "python:prep.triple",
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(rows(&out).len(), built.len());
    // An exec: preprocessor's relative file: against the manifest's directory (not there), or
    // with --base-dir . against the working directory (the trainer image's WORKDIR in a pod).
    std::fs::write(
        tmp.path().join("prep_exec.py"),
        "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
         print(json.dumps([{'memory': r['memory_before']}, r['action'], r.get('episode_reward', 0.0)]), flush=True)\n",
    )
    .unwrap();
    let exec = |out: &str, extra: &[&str]| {
        let mut args =
            vec!["data", "preprocess", runs.to_str().unwrap(), "-o", out, "--config", example.to_str().unwrap()];
        args.extend(extra);
        args.extend(["--preprocessor", "exec:python3 prep_exec.py"]);
        basecamp(&args, tmp.path())
    };
    let output = exec("exec-manifest-dir", &[]);
    assert!(!output.status.success(), "prep_exec.py is not beside the manifests: {}", text(&output));
    assert!(text(&output).contains("prep_exec.py': [Errno 2] No such file or directory"), "{}", text(&output));
    // Every relative path of the manifests resolves there, so the "image" holds their files too.
    for file in ["tests.jsonl", "policy.jsonl"] {
        std::fs::copy(example.join(file), tmp.path().join(file)).unwrap();
    }
    let output = exec("exec-base-dir", &["--base-dir", "."]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(rows(&tmp.path().join("exec-base-dir")).len(), built.len());
    // Each record is sent once: the preflight's answer is the first record's row
    // (it was sent again, so a preprocessor that counts or keeps state saw it twice).
    std::fs::write(
        tmp.path().join("prep_count.py"),
        "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
         open('seen.log', 'a').write(f\"{r['episode']} {r['step']}\\n\")\n    \
         print(json.dumps([{}, r['action'], 0.0]), flush=True)\n",
    )
    .unwrap();
    let args = ["data", "preprocess", runs.to_str().unwrap(), "-o", "exec-count", "--preprocessor"];
    let output = basecamp(&[&args[..], &["exec:python3 prep_count.py"]].concat(), tmp.path());
    assert!(output.status.success(), "{}", text(&output));
    let seen = std::fs::read_to_string(tmp.path().join("seen.log")).unwrap();
    assert_eq!(seen.lines().count(), built.len(), "{seen}");

    // The wrong shape fails before the run, naming the record, the answer and what was expected.
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.to_str().unwrap(),
            "-o",
            tmp.path().join("x").to_str().unwrap(),
            "--preprocessor",
            "python:prep.wrong",
        ],
        tmp.path(),
    );
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("preprocessor python:prep.wrong returned {\"state\":1} for record {"), "{said}");
    assert!(said.contains("expected [state_dict, action_dict, reward]"), "{said}");
    assert_fits_a_termination_message(&output);

    // A function that raises: its exception and where, cut to fit however long its message.
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.to_str().unwrap(),
            "-o",
            tmp.path().join("z").to_str().unwrap(),
            "--preprocessor",
            "python:prep.raising",
        ],
        tmp.path(),
    );
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("preprocessor python:prep.raising failed on record {"), "{said}");
    assert!(said.contains("ValueError (at "), "{said}");
    assert!(said.contains("prep.py:6 in raising): bad record xxx"), "{said}");
    assert_fits_a_termination_message(&output);
    assert!(!tmp.path().join("z/dataset.json").exists(), "no dataset.json: the dataset is not complete");

    // A module that does not import says so.
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.to_str().unwrap(),
            "-o",
            tmp.path().join("y").to_str().unwrap(),
            "--preprocessor",
            "python:nosuchmodule.f",
        ],
        tmp.path(),
    );
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("ModuleNotFoundError") && said.contains("nosuchmodule"), "{said}");
    assert!(said.starts_with("error: preprocessor python:nosuchmodule.f: cannot start: it exited"), "{said}");
    assert!(!said.contains("for record") && !said.contains("on record"), "no record is to blame: {said}");
    assert_fits_a_termination_message(&output);
}

/// The kubelet keeps the last 2048 bytes of the log as a failed container's
/// termination message (`FallbackToLogsOnError`): the whole error fits.
fn assert_fits_a_termination_message(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: preprocessor "), "{stderr}");
    assert!(stderr.len() <= 2048, "{} bytes on stderr: {stderr}", stderr.len());
}

// ---- Parquet -------------------------------------------------------------------

/// A dataset's batch files with `extension`, in name (= batch) order.
/// A synthetic episode of `steps` steps, one token each, as trace bytes.
fn small_trace(seed: u64, steps: u32) -> Vec<u8> {
    let shape = basecamp_trace::synthetic::EpisodeShape { seed, steps, tokens_per_step: 1, ..Default::default() };
    basecamp_trace::synthetic::generate(&shape).write_to(Vec::new(), 3).unwrap()
}

fn batch_files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

/// The JSON Lines rows of a dataset, each with its reward's 64 bits as
/// big-endian hex, parsed from the reward's own text by Rust's correctly
/// rounding parser (serde_json's default parser may be an ulp off).
fn jsonl_rows_and_reward_bits(dir: &Path) -> Vec<(Value, String)> {
    batch_files(dir, "jsonl")
        .iter()
        .flat_map(|p| std::fs::read_to_string(p).unwrap().lines().map(str::to_string).collect::<Vec<_>>())
        .map(|line| {
            // A row serializes its fields in order: the reward is followed by `truncated`.
            let (_, after) = line.rsplit_once(",\"reward\":").expect("a reward");
            let reward = after.split([',', '}']).next().expect("split yields at least one piece");
            let reward: f64 = reward.parse().expect("the reward is a number");
            (serde_json::from_str(&line).unwrap(), format!("{:016x}", reward.to_bits()))
        })
        .collect()
}

/// The Parquet batches in `parquet_dir`, as pyarrow reads them, hold the
/// rows of the JSON Lines batches in `jsonl_dir`, in the same order and
/// batches of `batch_size`, with the schema and compression promised.
/// Returns the first file's key/value metadata.
fn assert_parquet_holds_the_jsonl_rows(parquet_dir: &Path, jsonl_dir: &Path, batch_size: usize) -> Value {
    let files = pyarrow::read(&batch_files(parquet_dir, "parquet"));
    let expected = jsonl_rows_and_reward_bits(jsonl_dir);
    assert_eq!(files.len(), expected.len().div_ceil(batch_size), "one file a batch");
    let columns = serde_json::json!([
        {"name": "task", "physical": "BYTE_ARRAY", "logical": "String", "maxDefinitionLevel": 0, "arrow": "string"},
        {"name": "variant", "physical": "BYTE_ARRAY", "logical": "String", "maxDefinitionLevel": 0, "arrow": "string"},
        {"name": "episode", "physical": "BYTE_ARRAY", "logical": "String", "maxDefinitionLevel": 0, "arrow": "string"},
        {"name": "step", "physical": "INT32", "logical": "Int(bitWidth=32, isSigned=false)", "maxDefinitionLevel": 0, "arrow": "uint32"},
        {"name": "state", "physical": "BYTE_ARRAY", "logical": "JSON", "maxDefinitionLevel": 0, "arrow": "extension<arrow.json>"},
        {"name": "action", "physical": "BYTE_ARRAY", "logical": "JSON", "maxDefinitionLevel": 0, "arrow": "extension<arrow.json>"},
        {"name": "reward", "physical": "DOUBLE", "logical": "None", "maxDefinitionLevel": 0, "arrow": "double"},
        {"name": "truncated", "physical": "BOOLEAN", "logical": "None", "maxDefinitionLevel": 0, "arrow": "bool"},
    ]);
    let mut read = Vec::new();
    for (index, file) in files.iter().enumerate() {
        let name = &file["file"];
        assert_eq!(file["rowGroups"], 1, "{name}");
        assert_eq!(file["columns"], columns, "{name}");
        assert_eq!(file["compression"], serde_json::json!(["ZSTD"]), "{name}");
        let rows = file["rows"].as_array().unwrap();
        let full = index + 1 < files.len();
        assert!(if full { rows.len() == batch_size } else { rows.len() <= batch_size }, "{name}: {}", rows.len());
        read.extend(rows.iter().cloned());
    }
    assert_eq!(read.len(), expected.len());
    for (index, (got, (want, reward_bits))) in read.iter().zip(&expected).enumerate() {
        for column in ["task", "variant", "episode"] {
            assert_eq!(got[column], want[column], "row {index}: {column}");
        }
        assert_eq!(got["step"], want["step"], "row {index}");
        assert_eq!(got["truncated"], want["truncated"], "row {index}");
        assert!(want["truncated"].is_boolean(), "row {index}: {want}");
        for column in ["state", "action"] {
            let text = got[column].as_str().unwrap_or_else(|| panic!("row {index}: {column} is JSON text: {got}"));
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(value, want[column], "row {index}: {column}");
        }
        assert_eq!(&got["reward"], reward_bits, "row {index}: reward bits ({})", want["reward"]);
    }
    assert!(expected.iter().any(|(row, _)| row["reward"] != 0.0), "some rows carry a reward");
    files[0]["metadata"].clone()
}

#[test]
fn parquet_batches_hold_the_jsonl_rows_as_pyarrow_reads_them_and_the_format_comes_from_the_manifest_or_the_flag() {
    // Before the run: without the reader this test fails at once, saying what to install.
    pyarrow::python();
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    // The example task, with a data pipeline over the traces of its own run, in Parquet.
    let project = tmp.path().join("project");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce"), &project);
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    let pipeline = format!(
        "spec:\n  dataPipeline:\n    source: {}\n    version: logs-v1\n    batchSize: 7\n    format: parquet\n  taskDefinition:",
        runs.display()
    );
    std::fs::write(project.join("task.yaml"), task.replacen("spec:\n  taskDefinition:", &pipeline, 1)).unwrap();
    let project_config = project.to_str().unwrap();
    let output = basecamp(
        &[
            "run",
            project_config,
            "--variant",
            "a",
            "--shards",
            "1",
            "--concurrency",
            "16",
            "--no-progress",
            "--out",
            runs.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));

    // The manifest's format.
    let parquet = tmp.path().join("parquet");
    let output =
        basecamp(&["data", "preprocess", "--config", project_config, "-o", parquet.to_str().unwrap()], tmp.path());
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains(" parquet batch(es) of up to 7 -> "), "{}", text(&output));
    let dataset: Value = serde_json::from_slice(&std::fs::read(parquet.join("dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["format"], "parquet");
    let names: Vec<PathBuf> =
        dataset["batches"].as_array().unwrap().iter().map(|b| parquet.join(b.as_str().unwrap())).collect();
    assert_eq!(names, batch_files(&parquet, "parquet"), "dataset.json lists every batch, in order");
    assert_eq!(dataset["batches"][0], "batch-00000.parquet");
    assert!(batch_files(&parquet, "jsonl").is_empty());

    // --format overrides it.
    let jsonl = tmp.path().join("jsonl");
    let output = basecamp(
        &["data", "preprocess", "--config", project_config, "--format", "jsonl", "-o", jsonl.to_str().unwrap()],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let dataset_jsonl: Value = serde_json::from_slice(&std::fs::read(jsonl.join("dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset_jsonl["format"], "jsonl");
    assert_eq!(dataset_jsonl["batches"][0], "batch-00000.jsonl");
    assert!(batch_files(&jsonl, "parquet").is_empty());
    // Apart from the format, the batches and the time, the two datasets agree.
    for key in ["source", "version", "preprocessor", "batchSize", "rows", "traces", "skipped", "trainingStep"] {
        assert_eq!(dataset[key], dataset_jsonl[key], "{key}");
    }

    let metadata = assert_parquet_holds_the_jsonl_rows(&parquet, &jsonl, 7);
    assert_eq!(metadata["basecamp.preprocessor"], "builtin:trajectory");
    assert_eq!(metadata["basecamp.source"], runs.to_str().unwrap());
    assert_eq!(metadata["basecamp.version"], "logs-v1");
    assert_eq!(metadata["basecamp.trainingStep"], "0");

    // A word that is not a format: the flag's error lists the formats; the
    // manifest's names the file, line and field.
    let output = basecamp(&["data", "preprocess", runs.to_str().unwrap(), "--format", "csv", "-o", "x"], tmp.path());
    let said = text(&output);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("invalid value 'csv' for '--format <FORMAT>'") && said.contains("jsonl, parquet"), "{said}");
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    std::fs::write(project.join("task.yaml"), task.replacen("format: parquet", "format: csv", 1)).unwrap();
    let output = basecamp(&["data", "preprocess", "--config", project_config, "-o", "x"], tmp.path());
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("task.yaml:"), "{said}");
    assert!(said.contains("spec.dataPipeline.format: unknown variant `csv`"), "{said}");
    assert!(!tmp.path().join("x").exists(), "nothing written");

    // A preprocessor's wrong answer fails as it does for JSON Lines, and no dataset.json is written.
    std::fs::write(tmp.path().join("prep.py"), "def wrong(record):\n    return {'state': 1}\n").unwrap();
    let broken = tmp.path().join("broken");
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.to_str().unwrap(),
            "--format",
            "parquet",
            "--preprocessor",
            "python:prep.wrong",
            "-o",
            broken.to_str().unwrap(),
        ],
        tmp.path(),
    );
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("preprocessor python:prep.wrong returned {\"state\":1} for record {"), "{said}");
    assert_fits_a_termination_message(&output);
    assert!(!broken.join("dataset.json").exists());
}

// ---- S3 in, S3 out ------------------------------------------------------------

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_dataset_from_the_manifests_s3_source_is_uploaded_to_s3_with_dataset_json_last() {
    let tmp = tempfile::tempdir().unwrap();
    // The example task, with a data pipeline reading its traces from S3.
    let project = tmp.path().join("project");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce"), &project);
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    let pipeline = format!(
        "spec:\n  dataPipeline:\n    source: s3://{BUCKET}/logs/ecommerce/\n    version: logs-2026-11\n    batchSize: 10\n  taskDefinition:"
    );
    std::fs::write(project.join("task.yaml"), task.replacen("spec:\n  taskDefinition:", &pipeline, 1)).unwrap();

    // Traces of a real run, put where the source points (s3s-fs serves a directory).
    let runs = tmp.path().join("runs");
    let output = basecamp(
        &[
            "run",
            project.to_str().unwrap(),
            "--variant",
            "a",
            "--shards",
            "2",
            "--concurrency",
            "16",
            "--no-progress",
            "--out",
            runs.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let data = tmp.path().join("s3");
    copy_dir(&runs.join("a"), &data.join(BUCKET).join("logs/ecommerce"));
    let server = S3Server::start(&data);

    // No paths: the source is the manifest's; the version too.
    let out = format!("s3://{BUCKET}/checkpoints/default/shipping-delay-ab/dataset/");
    let project_config = project.to_str().unwrap();
    let output = server.basecamp(&["data", "preprocess", "--config", project_config, "--out", &out], tmp.path());
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains(&format!("-> {out}")), "{}", text(&output));
    let uploaded = data.join(BUCKET).join("checkpoints/default/shipping-delay-ab/dataset");
    let dataset: Value = serde_json::from_slice(&std::fs::read(uploaded.join("dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["source"], format!("s3://{BUCKET}/logs/ecommerce/"));
    assert_eq!(dataset["version"], "logs-2026-11");
    assert_eq!(dataset["batchSize"], 10);
    assert_eq!(dataset["preprocessor"], "builtin:trajectory");
    let traces = walk(&runs.join("a")).iter().filter(|p| p.extension().is_some_and(|e| e == "trace")).count();
    assert_eq!(dataset["traces"].as_u64(), Some(traces as u64));
    // Every batch listed is uploaded, and they hold every row.
    let names: Vec<&str> = dataset["batches"].as_array().unwrap().iter().map(|b| b.as_str().unwrap()).collect();
    let rows_uploaded = rows(&uploaded);
    assert_eq!(rows_uploaded.len() as u64, dataset["rows"].as_u64().unwrap());
    assert_eq!(names.len(), rows_uploaded.len().div_ceil(10));
    for name in &names {
        assert!(uploaded.join(name).is_file(), "{name}");
    }
    // The same rows as from the local copies of the traces.
    let local = tmp.path().join("local");
    let output = basecamp(
        &[
            "data",
            "preprocess",
            runs.join("a").to_str().unwrap(),
            "--config",
            project_config,
            "-o",
            local.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let mut here: Vec<String> = rows(&local).iter().map(Value::to_string).collect();
    let mut there: Vec<String> = rows_uploaded.iter().map(Value::to_string).collect();
    here.sort();
    there.sort();
    assert_eq!(here, there);

    // Again into the same places with bigger batches: the earlier run's extra batch files and
    // objects go (a reader of the whole directory or prefix would get them too); nothing else does.
    std::fs::write(local.join("notes.txt"), "mine").unwrap();
    std::fs::write(uploaded.join("notes.txt"), "mine").unwrap();
    let before = batch_files(&local, "jsonl").len();
    assert!(before > 1);
    for out in [local.to_str().unwrap(), out.as_str()] {
        let output = server.basecamp(
            &[
                "data",
                "preprocess",
                runs.join("a").to_str().unwrap(),
                "--config",
                project_config,
                "--batch-size",
                "100000",
                "-o",
                out,
            ],
            tmp.path(),
        );
        assert!(output.status.success(), "{}", text(&output));
        assert!(text(&output).contains(&format!("removed {} batch", before - 1)), "{}", text(&output));
    }
    for dir in [&local, &uploaded] {
        assert_eq!(batch_files(dir, "jsonl"), [dir.join("batch-00000.jsonl")]);
        assert_eq!(rows(dir).len(), rows_uploaded.len(), "every row, once");
        assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "mine");
    }

    // Parquet (--format; the manifest says nothing): the same rows in the same order, uploaded
    // with dataset.json last, as pyarrow reads them.
    let out_parquet = format!("s3://{BUCKET}/datasets/parquet/");
    let output = server.basecamp(
        &["data", "preprocess", "--config", project_config, "--format", "parquet", "--out", &out_parquet],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let uploaded_parquet = data.join(BUCKET).join("datasets/parquet");
    let dataset_parquet: Value =
        serde_json::from_slice(&std::fs::read(uploaded_parquet.join("dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset_parquet["format"], "parquet");
    assert_eq!(dataset_parquet["rows"], dataset["rows"]);
    let names: Vec<PathBuf> = dataset_parquet["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| uploaded_parquet.join(b.as_str().unwrap()))
        .collect();
    assert_eq!(names, batch_files(&uploaded_parquet, "parquet"));
    let metadata = assert_parquet_holds_the_jsonl_rows(&uploaded_parquet, &uploaded, 10);
    assert_eq!(metadata["basecamp.source"], format!("s3://{BUCKET}/logs/ecommerce/"));

    // --version overrides the manifest's; an explicit S3 input overrides the source.
    let out2 = format!("s3://{BUCKET}/datasets/v2");
    let output = server.basecamp(
        &[
            "data",
            "preprocess",
            &format!("s3://{BUCKET}/logs/ecommerce/shard-1/"),
            "--version",
            "v2",
            "--config",
            project_config,
            "--out",
            &out2,
        ],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let dataset: Value =
        serde_json::from_slice(&std::fs::read(data.join(BUCKET).join("datasets/v2/dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["version"], "v2");
    assert_eq!(dataset["source"], format!("s3://{BUCKET}/logs/ecommerce/shard-1/"));
    assert!(dataset["traces"].as_u64().unwrap() < traces as u64);

    // S3 down (local traces, a closed port): after the retries, the error names the object
    // and the cause, and nothing was uploaded — in either format. (An earlier run's
    // dataset.json goes first; a batch upload that fails is in the test below.)
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let local_traces = runs.join("a");
    for format in ["jsonl", "parquet"] {
        let output = basecamp_with_s3(
            closed,
            &[
                "data",
                "preprocess",
                local_traces.to_str().unwrap(),
                "--batch-size",
                "10",
                "--format",
                format,
                "--out",
                &format!("s3://{BUCKET}/down/"),
            ],
            tmp.path(),
        );
        let said = text(&output);
        assert_eq!(output.status.code(), Some(1), "{format}: {said}");
        assert!(said.contains(&format!("failed to upload the dataset to s3://{BUCKET}/down/")), "{said}");
        assert!(
            said.contains("the earlier run's dataset.json could not be removed, so no batch was uploaded"),
            "{said}"
        );
        assert!(said.contains(&format!("failed to delete s3://{BUCKET}/down/dataset.json")), "{said}");
        assert!(said.len() <= 2048, "{} bytes: {said}", said.len());
    }

    // A prefix without traces says so.
    let output = server.basecamp(&["data", "preprocess", &format!("s3://{BUCKET}/empty/"), "--out", "x"], tmp.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output).contains("no .trace objects under this prefix"), "{}", text(&output));
}

#[test]
fn without_paths_or_a_data_pipeline_it_says_what_to_give() {
    let tmp = tempfile::tempdir().unwrap();
    let output = basecamp(&["data", "preprocess", "--out", "x"], tmp.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output).contains("name the traces to preprocess"), "{}", text(&output));
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce");
    let output = basecamp(&["data", "preprocess", "--config", example.to_str().unwrap(), "--out", "x"], tmp.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output).contains("the task has no spec.dataPipeline.source"), "{}", text(&output));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn a_batch_size_of_0_is_refused_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("ep.trace"), small_trace(1, 3)).unwrap();
    // Before: taken as 1, one batch file a row, exit 0.
    let output = basecamp(&["data", "preprocess", "ep.trace", "--batch-size", "0", "--out", "ds"], tmp.path());
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(text(&output).contains("invalid value '0' for '--batch-size <BATCH_SIZE>'"), "{}", text(&output));
    assert!(!tmp.path().join("ds").exists());

    // --task and --variant choose among manifests: without --config they were ignored, exit 0.
    for flag in ["--task", "--variant"] {
        let output = basecamp(&["data", "preprocess", "ep.trace", flag, "zz", "--out", "ds"], tmp.path());
        assert_eq!(output.status.code(), Some(2), "{flag}: {}", text(&output));
        assert!(
            text(&output).contains("required arguments were not provided:\n  --config <CONFIG>"),
            "{}",
            text(&output)
        );
        assert!(!tmp.path().join("ds").exists());
    }
}

/// Runs `basecamp` in `dir`, killed after `limit`: `None` when it had to be.
fn basecamp_within(args: &[&str], dir: &Path, limit: std::time::Duration) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("basecamp runs");
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Some(child.wait_with_output().unwrap())
}

#[test]
fn a_preprocessor_that_writes_much_to_stderr_is_not_blocked_and_its_last_words_name_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("ep.trace"), small_trace(1, 8)).unwrap();
    // 40 KB of progress on stderr a record: more than a pipe holds (64 KiB) by the second.
    std::fs::write(
        tmp.path().join("chatty.py"),
        "import json, sys\nfor n, line in enumerate(sys.stdin):\n    r = json.loads(line)\n    \
         sys.stderr.write('progress ' + 'x' * 40000 + '\\n'); sys.stderr.flush()\n    \
         if len(sys.argv) > 1 and n == 5:\n        sys.exit('record 5 is bad')\n    \
         print(json.dumps([{'step': r['step']}, r['action'], 0.5]), flush=True)\n",
    )
    .unwrap();
    let limit = std::time::Duration::from_secs(60);
    let args = ["data", "preprocess", "ep.trace", "--out", "ds", "--preprocessor", "exec:python3 chatty.py"];
    // Before: its stderr was read only once it exited, so it blocked writing the second
    // record's progress while basecamp waited for the answer: a hang.
    let output = basecamp_within(&args, tmp.path(), limit).expect("not blocked by a full stderr pipe");
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(rows(&tmp.path().join("ds")).len(), 8);
    assert!(tmp.path().join("ds/dataset.json").exists());

    // One that fails after much stderr: the error quotes its end, which names the failure.
    let args = ["data", "preprocess", "ep.trace", "--out", "ds2", "--preprocessor", "exec:python3 chatty.py fail"];
    let output = basecamp_within(&args, tmp.path(), limit).expect("not blocked by a full stderr pipe");
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("it exited (exit status: 1)") && said.contains("record 5 is bad"), "{said}");
    assert_fits_a_termination_message(&output);
    assert!(!tmp.path().join("ds2/dataset.json").exists());
}

#[test]
fn a_run_that_fails_before_writing_a_row_leaves_an_earlier_dataset_complete_and_no_rows_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = small_trace(1, 3);
    std::fs::write(tmp.path().join("ep.trace"), &bytes).unwrap();
    let output = basecamp(&["data", "preprocess", "ep.trace", "--out", "ds"], tmp.path());
    assert!(output.status.success(), "{}", text(&output));
    let dataset = std::fs::read(tmp.path().join("ds/dataset.json")).unwrap();
    let batch = std::fs::read(tmp.path().join("ds/batch-00000.jsonl")).unwrap();
    let unchanged = || {
        assert_eq!(std::fs::read(tmp.path().join("ds/dataset.json")).unwrap(), dataset, "the earlier dataset.json");
        assert_eq!(std::fs::read(tmp.path().join("ds/batch-00000.jsonl")).unwrap(), batch);
    };

    // Before: dataset.json was removed first, so a preprocessor that does not even import
    // left the earlier, complete dataset looking incomplete.
    let output = basecamp(
        &["data", "preprocess", "ep.trace", "--out", "ds", "--preprocessor", "python:nosuchmodule.f"],
        tmp.path(),
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    unchanged();

    // Only unreadable traces (one cut short before its first step, one not a trace). Before:
    // an empty dataset.json ("rows": 0, "batches": []) marked the dataset complete, exit 0.
    std::fs::create_dir(tmp.path().join("damaged")).unwrap();
    std::fs::write(tmp.path().join("damaged/cut.trace"), &bytes[..300]).unwrap();
    std::fs::write(tmp.path().join("damaged/text.trace"), "not a trace\n").unwrap();
    for out in ["ds", "fresh"] {
        let output = basecamp(&["data", "preprocess", "damaged", "--out", out], tmp.path());
        let said = text(&output);
        assert_eq!(output.status.code(), Some(1), "{said}");
        assert!(said.contains(&format!("no rows to write to {out}: 2 of the 2 traces could not be read")), "{said}");
        assert!(said.contains("damaged/cut.trace: incomplete") && said.contains("damaged/text.trace"), "{said}");
        // Before: "damaged/text.trace: damaged/text.trace: not a basecamp trace".
        assert_eq!(said.matches("damaged/text.trace").count(), 1, "named once: {said}");
        // Before: "damaged/cut.trace: incomplete (damaged/cut.trace: truncated at byte ...)".
        assert_eq!(said.matches("damaged/cut.trace").count(), 1, "named once: {said}");
        assert!(said.contains("dataset.json was not written"), "{said}");
        assert!(output.stderr.len() <= 2048, "fits a termination message: {said}");
    }
    unchanged();
    assert!(!tmp.path().join("fresh/dataset.json").exists());
}

#[test]
fn a_trace_file_that_cannot_be_read_stops_the_run_naming_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("ep.trace"), small_trace(1, 3)).unwrap();
    // A file whose every read fails (EIO at offset 0): not a trace to skip, a
    // trace the dataset would silently lack.
    let output = basecamp(&["data", "preprocess", "ep.trace", "/proc/self/mem", "--out", "ds"], tmp.path());
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    // Before: "error: cannot read /proc/self/mem: /proc/self/mem: cannot read: ...".
    assert!(said.ends_with("error: /proc/self/mem: cannot read: Input/output error (os error 5)\n"), "{said}");
    assert!(!tmp.path().join("ds/dataset.json").exists(), "{said}");
}

#[test]
fn an_s3_dataset_whose_batches_did_not_all_arrive_is_not_marked_complete_by_an_earlier_runs_dataset_json() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = |seed: u64| small_trace(seed, 8);
    for (dir, seed) in [("old", 1), ("new", 2)] {
        std::fs::create_dir(tmp.path().join(dir)).unwrap();
        std::fs::write(tmp.path().join(dir).join("ep.trace"), trace(seed)).unwrap();
    }
    let data = tmp.path().join("s3");
    let server = S3Server::start(&data);
    let out = format!("s3://{BUCKET}/dataset/");
    let uploaded = data.join(BUCKET).join("dataset");
    let output = server.basecamp(&["data", "preprocess", "old", "--batch-size", "1", "--out", &out], tmp.path());
    assert!(output.status.success(), "{}", text(&output));
    assert!(uploaded.join("dataset.json").is_file());

    // Five of the eight batch objects cannot be replaced (s3s-fs answers 500 where a
    // directory stands in the way).
    for n in 1..=5 {
        let batch = uploaded.join(format!("batch-{n:05}.jsonl"));
        std::fs::remove_file(&batch).unwrap();
        std::fs::create_dir_all(batch.join("in-the-way")).unwrap();
    }
    let output = server.basecamp(&["data", "preprocess", "new", "--batch-size", "1", "--out", &out], tmp.path());
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("failed to upload the dataset to {out}: 5 of 8 batch files did not arrive")),
        "{said}"
    );
    assert!(said.contains(&format!("{out}batch-00001.jsonl")), "{said}");
    assert!(said.contains("... and 2 more"), "more failures than shown are counted: {said}");
    assert!(said.contains("dataset.json was not written"), "{said}");
    assert!(said.len() <= 2048, "{} bytes: {said}", said.len());
    // Before: the earlier run's dataset.json stayed, marking complete a prefix whose batches
    // were now partly the new run's.
    assert!(!uploaded.join("dataset.json").exists(), "the prefix is not marked complete");
}

#[test]
fn a_preprocessor_that_does_not_answer_in_time_is_stopped_naming_the_record_and_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("ep.trace"), small_trace(1, 4)).unwrap();
    // Answers the first two records, then hangs on the third.
    std::fs::write(
        tmp.path().join("stuck.py"),
        "import json, sys, time\nfor n, line in enumerate(sys.stdin):\n    r = json.loads(line)\n    \
         if n == 2:\n        time.sleep(600)\n    \
         print(json.dumps([{'step': r['step']}, r['action'], 0.5]), flush=True)\n",
    )
    .unwrap();
    let limit = std::time::Duration::from_secs(60);
    let args = ["data", "preprocess", "ep.trace", "--out", "ds", "--preprocessor", "exec:python3 stuck.py"];
    // Before: no limit; basecamp waited for the answer as long as the preprocessor slept.
    let output = basecamp_within(&[&args[..], &["--record-timeout", "1s"]].concat(), tmp.path(), limit)
        .expect("stopped after its record timeout");
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(
        said.contains(
            "took longer than 1s to answer (spec.dataPipeline.recordTimeout, or --record-timeout) and was stopped"
        ),
        "{said}"
    );
    assert!(said.contains("failed on record {"), "the record is quoted: {said}");
    assert_fits_a_termination_message(&output);
    assert!(!tmp.path().join("ds/dataset.json").exists());

    // No time at all is refused before anything runs.
    let output = basecamp(&[&args[..], &["--record-timeout", "0s"]].concat(), tmp.path());
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(text(&output).contains("a preprocessor needs some time to answer"), "{}", text(&output));
}

/// An A/B run has each test-set row once per variant, under one episode id:
/// every row names its task and variant, so the two episodes' steps are
/// not one episode's. Before: rows held only `episode` and `step`.
#[test]
fn rows_name_their_task_and_variant_so_one_episode_id_in_two_variants_stays_two_episodes() {
    let tmp = tempfile::tempdir().unwrap();
    let traces = tmp.path().join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    for variant in ["a", "b"] {
        let shape =
            basecamp_trace::synthetic::EpisodeShape { seed: 7, steps: 3, tokens_per_step: 1, ..Default::default() };
        let mut episode = basecamp_trace::synthetic::generate(&shape);
        episode.header.variant = variant.into();
        std::fs::write(traces.join(format!("{variant}.trace")), episode.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    let out = tmp.path().join("rows");
    let output = basecamp(&["data", "preprocess", traces.to_str().unwrap(), "-o", out.to_str().unwrap()], tmp.path());
    assert!(output.status.success(), "{}", text(&output));
    let built = rows(&out);
    assert_eq!(built.len(), 6, "{built:#?}");
    let keys: std::collections::BTreeSet<(String, String, String, u64)> = built
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_else(|| panic!("{k} in {r}")).to_string();
            (field("task"), field("variant"), field("episode"), r["step"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(keys.len(), 6, "each (task, variant, episode, step) once: {keys:#?}");
    assert_eq!(keys.iter().filter(|k| k.1 == "a").count(), 3);
    assert!(keys.iter().all(|k| k.2 == "ep-0007" && !k.0.is_empty()), "{keys:#?}");
}

/// `-o S3://b/x` (or `gs://...`) is refused, not written to a local
/// directory `S3:/b/x` with exit 0.
#[test]
fn an_output_url_of_another_scheme_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("ep.trace"), small_trace(1, 2)).unwrap();
    for out in ["S3://bucket/x", "gs://bucket/x"] {
        let output = basecamp(&["data", "preprocess", "ep.trace", "-o", out], tmp.path());
        assert_eq!(output.status.code(), Some(1), "{out}: {}", text(&output));
        assert!(text(&output).contains(out), "{out}: {}", text(&output));
        assert!(std::fs::read_dir(tmp.path()).unwrap().count() == 1, "{out}: nothing written");
    }
}

/// A damaged trace was skipped whole ("incomplete"), losing the steps it
/// holds before the damage. Now the rows of its finished steps are kept (a
/// step has finished once the next one starts), the step the damage cut is
/// left out even where its plan step was read, and the damage is named on
/// stderr and under `partial` in dataset.json. A trace that reads to its
/// footer without an episode end lost nothing but the end: all its steps.
#[test]
fn a_damaged_trace_gives_the_rows_of_the_steps_that_finished_before_the_damage() {
    use basecamp_trace::pb::{EpisodeEnd, Header, MemoryDelta, PlanStep, StepKind, StepStatus, record::Body};
    let tmp = tempfile::tempdir().unwrap();
    let header = Header { episode_id: "cut".into(), task: "t".into(), variant: "a".into(), ..Default::default() };
    let mut w = basecamp_trace::TraceWriter::new(Vec::new(), header, 3).unwrap();
    let plan = |step: u32| PlanStep {
        index: step,
        kind: StepKind::ToolCall as i32,
        tool: "lookup".into(),
        arguments_json: format!("{{\"n\":{step}}}"),
        status: StepStatus::Ok as i32,
        ..Default::default()
    };
    for step in 1..=4 {
        w.append(step, Body::PlanStep(Box::new(plan(step)))).unwrap();
        w.end_step().unwrap();
    }
    // Step 4 goes on in a frame of its own (the writer closes frames within a step too).
    let before_cut = w.bytes_written() as usize;
    let delta = MemoryDelta { key: "k".into(), after_json: Some("\"x\"".repeat(50)), ..Default::default() };
    w.append(4, Body::MemoryDelta(delta)).unwrap();
    w.end_step().unwrap();
    let whole = w.finish(EpisodeEnd { steps: 4, ..Default::default() }).unwrap();
    std::fs::create_dir(tmp.path().join("runs")).unwrap();
    // Cut inside that frame: its header whole, one byte of its payload.
    std::fs::write(tmp.path().join("runs/cut.trace"), &whole[..before_cut + 21]).unwrap();
    std::fs::write(tmp.path().join("runs/unended.trace"), unended::unended_trace(2)).unwrap();

    let output = basecamp(&["data", "preprocess", "runs", "--out", "ds"], tmp.path());
    let said = text(&output);
    assert!(output.status.success(), "{said}");
    let steps: Vec<(String, u64)> = rows(&tmp.path().join("ds"))
        .iter()
        .map(|r| (r["episode"].as_str().unwrap().to_string(), r["step"].as_u64().unwrap()))
        .collect();
    let expected: Vec<(String, u64)> =
        [("cut", 1), ("cut", 2), ("cut", 3), ("ep", 1), ("ep", 2)].map(|(e, s)| (e.to_string(), s)).to_vec();
    assert_eq!(steps, expected, "{said}");
    let cut = format!(
        "runs/cut.trace: incomplete (truncated at byte {before_cut}: records of 4 steps recovered); the 3 rows of its \
         finished steps 1-3 are kept; step 4, cut off before it finished, is left out"
    );
    let unended_prefix = "runs/unended.trace: incomplete (no episode end: the file reads to its footer index (byte ";
    let unended_suffix = "; the 2 rows of its finished steps 1-2 are kept";
    assert!(said.contains(&format!("partial {cut}\n")), "{said}");
    assert!(
        said.contains(&format!("partial {unended_prefix}")) && said.contains(&format!("{unended_suffix}\n")),
        "{said}"
    );
    assert!(
        said.contains(
            "5 rows (5 truncated: cut off, or ended by the policy or a service; no episode reward) from 2 traces"
        ),
        "{said}"
    );
    let dataset: Value = serde_json::from_slice(&std::fs::read(tmp.path().join("ds/dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["skipped"], serde_json::json!([]));
    let partial: Vec<&str> = dataset["partial"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(partial.len(), 2, "{partial:?}");
    assert_eq!(partial[0], cut);
    assert!(partial[1].starts_with(unended_prefix) && partial[1].ends_with(unended_suffix), "{partial:?}");
}

/// Episode `id`'s trace: `steps` tool steps, then (with `reward`) the
/// sandbox's reward signal and the episode end, or (without) nothing more,
/// as a sandbox killed after those steps leaves it.
fn tool_steps_trace(id: &str, steps: u32, reward: Option<f64>) -> Vec<u8> {
    use basecamp_trace::pb::{EpisodeEnd, RewardSignal, record::Body};
    let mut w = unended::tool_steps(id, steps);
    match reward {
        Some(weighted_sum) => {
            w.append(steps, Body::RewardSignal(RewardSignal { weighted_sum, ..Default::default() })).unwrap();
            w.finish(EpisodeEnd { outcome: 1, steps, ..Default::default() }).unwrap()
        }
        None => w.finish_truncated().unwrap(),
    }
}

/// A damaged trace's rows carried reward 0 and nothing else told a trainer
/// that the episode's reward is unknown (only dataset.json's `partial`
/// text). Now every row says `truncated`: true for the rows of an episode
/// whose trace has no episode end (cut off, or read to its footer without
/// one), in JSON Lines and as a Parquet column; a user preprocessor finds
/// it in the raw record (with no `episode_reward`), and its row carries the
/// record's `truncated` whatever it answers; dataset.json and the summary
/// line count those rows.
#[test]
fn rows_of_an_episode_without_an_end_say_truncated_in_every_format_and_to_user_preprocessors() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    // Named so that the traces are read in this order: ended, unended, killed.
    std::fs::write(runs.join("a-ended.trace"), tool_steps_trace("ended", 2, Some(0.75))).unwrap();
    std::fs::write(runs.join("b-unended.trace"), unended::unended_trace(2)).unwrap();
    // Killed during step 4: steps 1-3 finished.
    std::fs::write(runs.join("c-killed.trace"), tool_steps_trace("killed", 4, None)).unwrap();
    // Episode, step, truncated, the built-in's reward.
    let expected = [
        ("ended", 1, false, 0.0),
        ("ended", 2, false, 0.75),
        ("ep", 1, true, 0.0),
        ("ep", 2, true, 0.0),
        ("killed", 1, true, 0.0),
        ("killed", 2, true, 0.0),
        ("killed", 3, true, 0.0),
    ]
    .map(|(episode, step, truncated, reward)| serde_json::json!([episode, step, truncated, reward]))
    .to_vec();

    let output = basecamp(&["data", "preprocess", "runs", "--out", "jsonl", "--batch-size", "3"], tmp.path());
    let said = text(&output);
    assert!(output.status.success(), "{said}");
    let got: Vec<Value> = rows(&tmp.path().join("jsonl"))
        .iter()
        .map(|r| serde_json::json!([r["episode"], r["step"], r["truncated"], r["reward"]]))
        .collect();
    assert_eq!(got, expected, "{said}");
    assert!(
        said.contains(
            "7 rows (5 truncated: cut off, or ended by the policy or a service; no episode reward) from 3 traces"
        ),
        "{said}"
    );
    let dataset: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("jsonl/dataset.json")).unwrap()).unwrap();
    assert_eq!((&dataset["rows"], &dataset["truncatedRows"]), (&serde_json::json!(7), &serde_json::json!(5)));

    // Parquet: a required BOOLEAN column, the same values (checked against the JSON Lines).
    let output = basecamp(
        &["data", "preprocess", "runs", "--out", "parquet", "--batch-size", "3", "--format", "parquet"],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    assert_parquet_holds_the_jsonl_rows(&tmp.path().join("parquet"), &tmp.path().join("jsonl"), 3);
    let dataset: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("parquet/dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["truncatedRows"], 5);

    // A user preprocessor sees `truncated` (and no episode_reward where the episode has no end);
    // it answers a triple, and the row's `truncated` is the record's.
    std::fs::write(
        tmp.path().join("prep_seen.py"),
        "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
         seen = {'truncated': r['truncated'], 'episode_reward': r.get('episode_reward', 'absent')}\n    \
         print(json.dumps([seen, r['action'], 1.0]), flush=True)\n",
    )
    .unwrap();
    let output = basecamp(
        &["data", "preprocess", "runs", "--out", "exec", "--preprocessor", "exec:python3 prep_seen.py"],
        tmp.path(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let got: Vec<Value> = rows(&tmp.path().join("exec"))
        .iter()
        .map(|r| serde_json::json!([r["episode"], r["step"], r["truncated"], r["reward"], r["state"]]))
        .collect();
    // The record's episode_reward is the reward of the built-in's row where that is not 0.
    let expected: Vec<Value> = expected
        .iter()
        .map(|e| {
            let episode_reward = if e[3] == 0.0 { serde_json::json!("absent") } else { e[3].clone() };
            let seen = serde_json::json!({"truncated": e[2], "episode_reward": episode_reward});
            serde_json::json!([e[0], e[1], e[2], 1.0, seen])
        })
        .collect();
    assert_eq!(got, expected);
}

/// An episode that the policy's server ended (here a scripted failure on
/// its second turn) is truncated in every row, with no reward: its reward
/// scored an outage, not the agent's actions, and its rows said
/// `truncated: false` and carried that reward, which a trainer learnt from.
/// The class comes from the trace's episode end, which names it now.
#[test]
fn rows_of_an_episode_the_policy_s_server_ended_are_truncated_and_carry_no_reward() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce"), &project);
    let script = std::fs::read_to_string(project.join("policy.jsonl")).unwrap();
    let mut lines: Vec<Value> = script.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["episode"], "ship-000");
    lines[0]["turns"][1] = serde_json::json!({"error": "the model server went away"});
    let script: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(project.join("policy.jsonl"), script).unwrap();
    let runs = tmp.path().join("runs");
    let args = ["run", project.to_str().unwrap(), "--variant", "b", "--shards", "1", "--no-progress", "--out"];
    let output = basecamp(&[&args[..], &[runs.to_str().unwrap()]].concat(), tmp.path());
    assert_eq!(output.status.code(), Some(3), "one episode not measured: {}", text(&output));
    assert!(text(&output).contains("b: 1 of 60 episodes NOT MEASURED"), "{}", text(&output));

    let out = tmp.path().join("rows");
    let output = basecamp(&["data", "preprocess", runs.to_str().unwrap(), "-o", out.to_str().unwrap()], tmp.path());
    assert!(output.status.success(), "{}", text(&output));
    let rows = rows(&out);
    let (cut, measured): (Vec<&Value>, Vec<&Value>) = rows.iter().partition(|r| r["episode"] == "ship-000");
    assert_eq!(cut.len(), 1, "the tool call before the failed turn: {cut:?}");
    assert!(cut.iter().all(|r| r["truncated"] == true && r["reward"] == 0.0), "{cut:?}");
    assert!(measured.iter().all(|r| r["truncated"] == false), "every other episode ended by the agent");
    assert!(measured.iter().any(|r| r["reward"].as_f64().is_some_and(|x| x != 0.0)), "the others keep their rewards");
    let dataset: Value = serde_json::from_slice(&std::fs::read(out.join("dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["truncatedRows"], 1, "{dataset}");
}

/// An episode that ended without a reward signal (its SandboxConfig has no
/// `rewards`) gives rows that are not truncated, with reward 0 from the
/// built-in: dataset.json counts those episodes and stderr names the first
/// (before, nothing told a trainer that those zeros are no score).
#[test]
fn episodes_that_ended_without_a_reward_signal_are_counted_and_named() {
    use basecamp_trace::pb::EpisodeEnd;
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    std::fs::write(runs.join("a-rewarded.trace"), tool_steps_trace("rewarded", 2, Some(0.75))).unwrap();
    let unrewarded =
        unended::tool_steps("unrewarded", 2).finish(EpisodeEnd { outcome: 1, steps: 2, ..Default::default() });
    std::fs::write(runs.join("b-unrewarded.trace"), unrewarded.unwrap()).unwrap();
    std::fs::write(runs.join("c-killed.trace"), tool_steps_trace("killed", 2, None)).unwrap();

    let output = basecamp(&["data", "preprocess", "runs", "--out", "rows"], tmp.path());
    let said = text(&output);
    assert!(output.status.success(), "{said}");
    assert!(
        said.contains("warning: 1 of 3 episodes ended without a reward signal (no `rewards` in their SandboxConfig"),
        "{said}"
    );
    assert!(said.contains("the first: runs/b-unrewarded.trace; their rows are not truncated"), "{said}");
    let dataset: Value = serde_json::from_slice(&std::fs::read(tmp.path().join("rows/dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["unrewardedEpisodes"], 1, "the killed one is truncated, not unrewarded: {dataset}");

    let output = basecamp(&["data", "preprocess", "runs/a-rewarded.trace", "--out", "only"], tmp.path());
    assert!(!text(&output).contains("without a reward signal"), "{}", text(&output));
}
