//! `basecamp trace analyze` as a user runs it: the real binary on real
//! safetensors files (written here), stdout, stderr and exit codes. Numbers
//! are checked against the float64 oracle on fresh random logits (the seed
//! is printed on failure; `BASECAMP_TEST_SEED` replays it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use basecamp_gpu::file::{RawTensor, TensorDtype, write_tensors};
use basecamp_gpu::logits::LogitsView;
use basecamp_gpu::logits::reference::reference;
use basecamp_gpu::testdata::{Rng, fresh_seed, mixed_logits, perturbed, to_bf16};
use serde_json::Value;

fn analyze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "analyze"])
        .args(args)
        .output()
        .expect("the basecamp binary runs")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// The one line on stderr of a failed run.
fn failure(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8(out.stderr.clone()).expect("UTF-8 stderr");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {stderr:?}");
    lines[0].to_string()
}

fn json_of(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

fn write(dir: &Path, name: &str, tensors: &[RawTensor]) -> PathBuf {
    let path = dir.join(name);
    write_tensors(&path, tensors).expect("write safetensors");
    path
}

#[test]
fn two_files_give_every_statistic_and_kl_matching_float64() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let (rows, vocab, k) = (9, 3001, 4);
    let p = mixed_logits(&mut rng, rows, vocab);
    let q = perturbed(&mut rng, &p, 0.2);
    let dir = tempfile::tempdir().expect("temp dir");
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[rows, vocab], &p)]);
    let b = write(dir.path(), "b.safetensors", &[RawTensor::f32("logits", &[rows, vocab], &q)]);
    let doc = json_of(&analyze(&[
        "--logits",
        path_str(&a),
        path_str(&b),
        "--top-k",
        "4",
        "--device",
        "cpu",
        "--output",
        "json",
    ]));
    let pv = LogitsView::f32(&p, rows, vocab).expect("p");
    let qv = LogitsView::f32(&q, rows, vocab).expect("q");
    let want = reference(pv, Some(qv), k).expect("valid");
    let context = format!("seed {seed} (BASECAMP_TEST_SEED={seed})");
    assert_eq!(doc["inputs"][1]["file"], Value::String(path_str(&b).to_string()));
    assert_eq!(doc["inputs"][0]["shape"], serde_json::json!([rows, vocab]));
    assert!(doc["backend"].as_str().expect("backend").starts_with("cpu"), "{}", doc["backend"]);
    let tokens = doc["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), rows);
    let close = |got: f64, want: f64| (got - want).abs() <= 1e-5 * (1.0 + want.abs());
    for (t, w) in tokens.iter().zip(&want) {
        assert!(close(f(&t["logsumexp"]), w.lse), "{t} vs {w:?}; {context}");
        assert!(close(f(&t["entropy"]), w.entropy), "{t} vs {w:?}; {context}");
        let kl = w.kl.expect("pair");
        if kl.is_infinite() {
            assert_eq!(t["kl"], "inf", "{context}");
        } else {
            assert!((f(&t["kl"]) - kl).abs() <= 1e-6 + 1e-4 * kl, "{t} vs {w:?}; {context}");
        }
        let ids: Vec<u64> = t["top"].as_array().expect("top").iter().map(|e| e["id"].as_u64().expect("id")).collect();
        let want_ids: Vec<u64> = w.top.iter().map(|&(id, _)| u64::from(id)).collect();
        assert_eq!(ids, want_ids, "{context}");
        for (e, &(_, lp)) in t["top"].as_array().expect("top").iter().zip(&w.top) {
            assert!(close(f(&e["logprob"]), lp), "{e} vs {lp}; {context}");
        }
    }
    let finite: Vec<f64> = want.iter().filter_map(|w| w.kl).filter(|v| v.is_finite()).collect();
    let mean = finite.iter().sum::<f64>() / finite.len() as f64;
    assert!((f(&doc["summary"]["kl_mean"]) - mean).abs() <= 1e-6 + 1e-4 * mean, "{}; {context}", doc["summary"]);
    assert_eq!(doc["summary"]["tokens"], rows);
    assert_eq!(doc["summary"]["kl_infinite"], want.len() - finite.len());
}

#[test]
fn bf16_logits_with_a_batch_dimension_print_a_table() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let (rows, vocab) = (3, 500);
    let p = to_bf16(&mixed_logits(&mut rng, rows, vocab));
    let dir = tempfile::tempdir().expect("temp dir");
    // Two tensors: without --tensor the one called "logits" is used.
    let a = write(
        dir.path(),
        "a.safetensors",
        &[RawTensor::bf16("logits", &[1, rows, vocab], &p), RawTensor::f32("hidden", &[2, 2], &[1.0; 4])],
    );
    let out = analyze(&["--logits", path_str(&a), "--top-k", "2", "--device", "auto"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("A: {} tensor \"logits\" [{rows}, {vocab}] bf16", a.display()));
    assert!(lines[1].starts_with("backend: "), "{text}");
    assert!(lines[2].contains("logsumexp") && lines[2].contains("top-2"), "{text}");
    let want = reference(LogitsView::bf16(&p, rows, vocab).expect("p"), None, 2).expect("valid");
    for (row, w) in want.iter().enumerate() {
        let line = lines[3 + row];
        assert!(line.trim_start().starts_with(&format!("{row} ")), "{line}");
        // The last fields are id:logprob pairs; the ids must be the oracle's.
        let ids: Vec<&str> =
            line.split_whitespace().rev().take(w.top.len()).map(|f| f.split(':').next().unwrap_or("")).collect();
        let want_ids: Vec<String> = w.top.iter().rev().map(|(id, _)| id.to_string()).collect();
        assert_eq!(ids, want_ids, "{line}; seed {seed}");
    }
    assert!(lines[3 + rows].starts_with(&format!("tokens: {rows}  mean entropy: ")), "{text}");
}

#[test]
fn input_errors_name_the_file_the_tensor_and_the_shapes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let values: Vec<f32> = (0..24).map(|i| (i % 7) as f32 - 3.0).collect();
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[4, 6], &values)]);
    let wide = write(dir.path(), "wide.safetensors", &[RawTensor::f32("logits", &[3, 8], &values)]);
    let ids = write(
        dir.path(),
        "ids.safetensors",
        &[RawTensor { name: "ids".into(), dtype: TensorDtype::I32, shape: vec![4, 6], bytes: vec![0; 96] }],
    );
    let flat = write(dir.path(), "flat.safetensors", &[RawTensor::f32("logits", &[24], &values)]);
    let (a_s, wide_s) = (path_str(&a), path_str(&wide));

    let line = failure(&analyze(&["--logits", a_s, "--tensor", "scores"]));
    assert_eq!(line, format!("error: {a_s} has no tensor \"scores\"; it has: logits"));

    let line = failure(&analyze(&["--logits", path_str(&ids)]));
    assert_eq!(line, format!("error: tensor \"ids\" in {} is I32: logits must be F32 or BF16", ids.display()));

    let line = failure(&analyze(&["--logits", path_str(&flat)]));
    assert_eq!(
        line,
        format!(
            "error: tensor \"logits\" in {} has shape [24]: logits must be [tokens, vocab] with vocab >= 1 \
             (leading dimensions of 1, as in [1, tokens, vocab], are dropped)",
            flat.display()
        )
    );

    let line = failure(&analyze(&["--logits", a_s, wide_s]));
    assert_eq!(
        line,
        format!(
            "error: {a_s} tensor \"logits\" has shape [4, 6] but {wide_s} tensor \"logits\" has shape [3, 8]: \
             KL needs logits of the same shape"
        )
    );

    let line = failure(&analyze(&["--logits", a_s, "--top-k", "21"]));
    assert_eq!(line, "error: top-k of 21 is more than the 20 supported: ask for at most 20");
    // A huge k is refused the same way (it aborted allocating rows x k outputs, with a backtrace).
    let line = failure(&analyze(&["--logits", a_s, "--top-k", "100000000000"]));
    assert_eq!(line, "error: top-k of 100000000000 is more than the 20 supported: ask for at most 20");
    // A negative k is a usage error that says so (clap read `-1` as an unknown flag).
    let out = analyze(&["--logits", a_s, "--top-k", "-1"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: invalid value '-1' for '--top-k <TOP_K>': must be 0 or more\n"), "{stderr}");

    let missing = dir.path().join("missing.safetensors");
    let line = failure(&analyze(&["--logits", path_str(&missing)]));
    assert!(line.starts_with(&format!("error: cannot read {}: ", missing.display())), "{line}");
}

#[test]
fn a_nan_in_the_second_file_names_that_file_row_and_column() {
    let dir = tempfile::tempdir().expect("temp dir");
    let values: Vec<f32> = (0..24).map(|i| (i % 5) as f32).collect();
    let mut bad = values.clone();
    bad[2 * 6 + 4] = f32::NAN;
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[4, 6], &values)]);
    let b = write(dir.path(), "b.safetensors", &[RawTensor::bf16("logits", &[4, 6], &to_bf16(&bad))]);
    let line = failure(&analyze(&["--logits", path_str(&a), path_str(&b), "--device", "cpu"]));
    assert_eq!(
        line,
        format!(
            "error: {} tensor \"logits\": logits q row 2 column 4 is NaN: logits must be finite or -inf",
            b.display()
        )
    );
}

#[test]
fn device_gpu_without_a_gpu_is_a_clear_error_and_auto_falls_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[2, 3], &[0.0, 1.0, 2.0, 2.0, 1.0, 0.0])]);
    let auto = json_of(&analyze(&["--logits", path_str(&a), "--output", "json"]));
    if !basecamp_gpu::probe::driver_present() {
        println!("skipping the GPU run: no NVIDIA driver");
        let reason = auto["fallback_reason"].as_str().expect("a reason");
        assert!(reason.contains("no NVIDIA driver"), "{auto}");
        // Before: "... (run on a GPU node, or use --device cpu)", under auto, which had done just that.
        assert!(!reason.contains("--device"), "{reason}");
        let line = failure(&analyze(&["--logits", path_str(&a), "--device", "gpu"]));
        assert!(line.starts_with("error: --device gpu: no NVIDIA driver"), "{line}");
        assert!(line.ends_with("(run on a GPU node, or use --device auto or cpu)"), "{line}");
    }
    assert_eq!(auto["tokens"][1]["top"][0]["id"], 0);
}

#[test]
fn a_reader_that_stops_reading_early_is_not_an_error() {
    // `basecamp trace analyze ... | head -3`: the closed pipe was reported as
    // "error: Broken pipe (os error 32)" with exit 1, in both formats.
    let dir = tempfile::tempdir().expect("temp dir");
    let values: Vec<f32> = (0..4000).map(|i| (i % 13) as f32 * 0.25).collect();
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[400, 10], &values)]);
    for format in ["table", "json"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["trace", "analyze", "--logits", path_str(&a), "--device", "cpu", "--output", format])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the basecamp binary runs");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("it ends");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{format}");
        assert_eq!(out.status.code(), Some(0), "{format}");
    }
}

#[test]
fn a_directory_is_named_as_one_and_a_pipe_is_read() {
    // Both failed to map: "cannot read DIR: No such device (os error 19)",
    // and the same for `--logits <(...)` or /dev/stdin, which hold a file.
    let dir = tempfile::tempdir().expect("temp dir");
    let line = failure(&analyze(&["--logits", path_str(dir.path())]));
    assert_eq!(line, format!("error: cannot read {}: is a directory, not a safetensors file", dir.path().display()));

    // A device is refused, not read (/dev/zero never ends).
    let line = failure(&analyze(&["--logits", "/dev/zero"]));
    assert_eq!(line, "error: cannot read /dev/zero: is neither a regular file nor a pipe");

    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[2, 3], &[0.0, 1.0, 2.0, 2.0, 1.0, 0.0])]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "analyze", "--logits", "/dev/stdin", "--device", "cpu", "--output", "json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the basecamp binary runs");
    let bytes = std::fs::read(&a).expect("read back");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(&bytes).expect("write to the pipe");
    }
    let doc = json_of(&child.wait_with_output().expect("it ends"));
    assert_eq!(doc["tokens"][0]["top"][0]["id"], 2);
    assert_eq!(doc["inputs"][0]["file"], "/dev/stdin");
}

#[test]
fn a_file_without_tensors_says_so() {
    // It said "holds 0 tensors and none is called \"logits\": pick one with
    // --tensor (it has: no tensors)": there is none to pick.
    let dir = tempfile::tempdir().expect("temp dir");
    let empty = write(dir.path(), "empty.safetensors", &[]);
    let line = failure(&analyze(&["--logits", path_str(&empty)]));
    assert_eq!(line, format!("error: {} holds no tensors", empty.display()));
}

#[test]
fn a_tensor_named_twice_in_the_header_is_refused() {
    // JSON allows a key twice and the parser kept the last: two "logits"
    // entries of shape [2, 3] and [3, 2] over the same bytes analysed [3, 2]
    // without a word.
    let dir = tempfile::tempdir().expect("temp dir");
    let header = br#"{"logits":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"logits":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}}"#;
    let mut header = header.to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend([0.0f32, 1.0, 2.0, 2.0, 1.0, 0.0].iter().flat_map(|v| v.to_le_bytes()));
    let twice = dir.path().join("twice.safetensors");
    std::fs::write(&twice, bytes).expect("write");
    let line = failure(&analyze(&["--logits", path_str(&twice)]));
    assert_eq!(
        line,
        format!("error: {} is not a valid safetensors file: the header names \"logits\" twice", twice.display())
    );
}

/// A safetensors file of `header` (padded) and `data`.
fn raw_file(dir: &Path, name: &str, header: &[u8], data: &[f32]) -> PathBuf {
    let mut header = header.to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

#[test]
fn a_tensor_whose_offsets_do_not_fit_its_shape_is_named_with_both_sizes() {
    // Before: "invalid shape, data type, or offset for tensor", naming none.
    let dir = tempfile::tempdir().expect("temp dir");
    let header = br#"{"logits":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]},"extra":{"dtype":"F32","shape":[1],"data_offsets":[20,24]}}"#;
    let path = raw_file(dir.path(), "short.safetensors", header, &[0.0, 1.0, 2.0, 2.0, 1.0, 0.0]);
    let line = failure(&analyze(&["--logits", path_str(&path)]));
    assert_eq!(
        line,
        format!(
            "error: {} is not a valid safetensors file: tensor \"logits\" of shape [2, 3] and type F32 takes 24 bytes, \
             but its data_offsets [0, 20] span 20",
            path.display()
        )
    );
    // A name given twice is said as such, even where its entries' offsets do not fit together.
    let header = br#"{"logits":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"logits":{"dtype":"F32","shape":[3,2],"data_offsets":[24,48]}}"#;
    let path = raw_file(dir.path(), "twice.safetensors", header, &[0.0; 12]);
    let line = failure(&analyze(&["--logits", path_str(&path)]));
    assert_eq!(
        line,
        format!("error: {} is not a valid safetensors file: the header names \"logits\" twice", path.display())
    );
}

#[test]
fn logits_of_no_tokens_still_give_the_summary_line() {
    // [0, V] is accepted (a turn that generated nothing); the table ended at
    // its column header, without the "tokens:" line the JSON's summary has.
    let dir = tempfile::tempdir().expect("temp dir");
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[0, 7], &[])]);
    let out = analyze(&["--logits", path_str(&a), path_str(&a), "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let tail: Vec<&str> = text.lines().rev().take(2).collect();
    assert_eq!(
        tail,
        ["KL(A||B) nats: mean of finite -  max -  infinite 0", "tokens: 0  mean entropy: - nats"],
        "{text}"
    );
    let doc = json_of(&analyze(&["--logits", path_str(&a), "--device", "cpu", "--output", "json"]));
    assert_eq!(doc["summary"], serde_json::json!({"tokens": 0, "entropy_mean": null}));
}

#[test]
fn a_log_probability_beyond_float_range_is_written_as_text_in_json() {
    // Logits 3e38 and -3e38 in one row: the second's log-probability, -6e38,
    // is -inf in f32, which JSON cannot hold; it came out as null.
    let dir = tempfile::tempdir().expect("temp dir");
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[1, 3], &[3e38, -3e38, 0.0])]);
    let doc = json_of(&analyze(&["--logits", path_str(&a), "--device", "cpu", "--output", "json", "--top-k", "3"]));
    let top = &doc["tokens"][0]["top"];
    assert_eq!((&top[2]["id"], &top[2]["logprob"]), (&serde_json::json!(1), &serde_json::json!("-inf")), "{doc}");
    assert_eq!(top[0]["logprob"], 0.0);
}

#[test]
fn several_tensors_and_none_called_logits_point_at_the_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    let two = write(
        dir.path(),
        "two.safetensors",
        &[RawTensor::f32("x", &[1, 2], &[0.0, 1.0]), RawTensor::f32("y", &[1, 2], &[1.0, 0.0])],
    );
    let line = failure(&analyze(&["--logits", path_str(&two), "--device", "cpu"]));
    assert_eq!(
        line,
        format!(
            "error: {} holds 2 tensors and none is called \"logits\" (it has: x, y): pick one with --tensor",
            two.display()
        )
    );
}

#[test]
fn a_file_cut_short_or_not_safetensors_is_said_with_its_sizes() {
    // The crate's words were "incomplete metadata, file not fully covered"
    // (cut short, or bytes appended), "header too large" (a text file) and
    // "invalid header length" (a length the file is too short for).
    let dir = tempfile::tempdir().expect("temp dir");
    let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let whole = write(dir.path(), "whole.safetensors", &[RawTensor::f32("logits", &[4, 6], &values)]);
    let bytes = std::fs::read(&whole).expect("read back");
    let said = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        let line = failure(&analyze(&["--logits", path_str(&path), "--device", "cpu"]));
        let prefix = format!("error: {} is not a valid safetensors file: ", path.display());
        line.strip_prefix(&prefix).unwrap_or_else(|| panic!("{line}")).to_string()
    };
    assert_eq!(
        said("cut.safetensors", &bytes[..bytes.len() - 10]),
        "its tensors take 96 bytes of data after the header, but the file has only 86: it is cut short (10 bytes missing)"
    );
    let mut longer = bytes.clone();
    longer.extend([0u8; 4]);
    assert_eq!(
        said("longer.safetensors", &longer),
        "its tensors take 96 bytes of data after the header, but the file has 100: 4 bytes after the last tensor \
         belong to none"
    );
    let text = b"this is a text file, not tensors\n";
    let length = u64::from_le_bytes(text[..8].try_into().expect("8 bytes"));
    assert_eq!(
        said("text.safetensors", text),
        format!(
            "its first 8 bytes give a header length of {length} bytes, more than the 100000000 a safetensors header \
             may have (is it a safetensors file?)"
        )
    );
    assert_eq!(
        said("header-cut.safetensors", &bytes[..20]),
        format!(
            "its first 8 bytes give a header length of {} bytes, but only 12 bytes follow them (cut short, or not a \
             safetensors file)",
            u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
        )
    );
    assert_eq!(
        said("tiny.safetensors", b"abc"),
        "it is 3 bytes long, less than the 8-byte header length a safetensors file starts with"
    );
}

#[test]
fn tensors_whose_data_overlap_or_leave_a_gap_are_named() {
    // Before: "invalid offset for tensor `b`", without the offsets.
    let dir = tempfile::tempdir().expect("temp dir");
    let header = br#"{"a":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[1,4],"data_offsets":[8,24]}}"#;
    let path = raw_file(dir.path(), "overlap.safetensors", header, &[0.0; 6]);
    let line = failure(&analyze(&["--logits", path_str(&path), "--tensor", "a"]));
    assert_eq!(
        line,
        format!(
            "error: {} is not a valid safetensors file: tensor \"b\" has data_offsets [8, 24] but the data before it \
             ends at 16: it overlaps the data before it (tensors must follow each other, from offset 0)",
            path.display()
        )
    );
    let header = br#"{"logits":{"dtype":"F32","shape":[1,4],"data_offsets":[8,24]}}"#;
    let path = raw_file(dir.path(), "gap.safetensors", header, &[0.0; 6]);
    let line = failure(&analyze(&["--logits", path_str(&path)]));
    assert!(
        line.ends_with(
            "ends at 0: it leaves a gap after the data before it (tensors must follow each other, from offset 0)"
        ),
        "{line}"
    );
}

#[test]
fn a_tensor_not_aligned_in_its_file_is_analysed_and_its_copy_is_said() {
    // A header of 62 bytes puts the f32 data at byte 70: it cannot be read in
    // place, so the whole tensor was copied into memory (a 2 GB file took
    // 4 GB of RSS) without a word.
    let dir = tempfile::tempdir().expect("temp dir");
    let header = br#"{"logits":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
    assert_eq!((8 + header.len()) % 4, 2, "the data starts off a 4-byte boundary");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend([0.0f32, 1.0, 2.0, 2.0, 1.0, 0.0].iter().flat_map(|v| v.to_le_bytes()));
    let path = dir.path().join("unaligned.safetensors");
    std::fs::write(&path, bytes).expect("write");
    let out = analyze(&["--logits", path_str(&path), "--device", "cpu", "--output", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = json_of(&out);
    assert_eq!((&doc["tokens"][0]["top"][0]["id"], &doc["tokens"][1]["top"][0]["id"]), (&2.into(), &0.into()));
    assert_eq!(
        stderr,
        format!(
            "note: {} tensor \"logits\": its data is not aligned to its element size in the file, so all 24 bytes are \
             copied into memory rather than read in place (the safetensors library's writers align it)\n",
            path.display()
        )
    );
}

/// `--logits -` reads standard input (before: "-: No such file or
/// directory"; `/dev/stdin` worked); two `-` are refused.
#[test]
fn a_dash_reads_the_logits_from_standard_input() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[2, 3], &[0.0, 1.0, 2.0, 2.0, 1.0, 0.0])]);
    let piped = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "analyze", "--logits", "-", "--output", "json", "--device", "cpu"])
        .stdin(std::fs::File::open(&a).unwrap())
        .output()
        .unwrap();
    let from_file = analyze(&["--logits", path_str(&a), "--output", "json", "--device", "cpu"]);
    assert!(piped.status.success(), "{}", String::from_utf8_lossy(&piped.stderr));
    assert_eq!(json_of(&piped)["tokens"], json_of(&from_file)["tokens"]);
    let line = failure(&analyze(&["--logits", "-", "-"]));
    assert_eq!(line, "error: --logits: only one of the files can be `-` (standard input)");
}

/// A third file is refused, however it is given; before, `--logits a
/// --logits b --logits c` ignored `c` without a word (and `--logits a b c`
/// got clap's "unexpected argument").
#[test]
fn a_third_logits_file_is_refused_naming_all_three() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = write(dir.path(), "a.safetensors", &[RawTensor::f32("logits", &[1, 2], &[0.0, 1.0])]);
    let a = path_str(&a);
    let said = "error: --logits takes one file, or two for KL(first || second) per token; got 3: ";
    assert_eq!(failure(&analyze(&["--logits", a, "--logits", a, "--logits", a])), format!("{said}{a}, {a}, {a}"));
    assert_eq!(failure(&analyze(&["--logits", a, a, a])), format!("{said}{a}, {a}, {a}"));
}
