//! `basecamp data preprocess`: traces of a real run into (state, action,
//! reward) batches, with the built-in trajectory preprocessor and with user
//! Python preprocessors (a good one, one that returns the wrong shape, one
//! that does not import).

use std::path::Path;
use std::process::{Command, Output};

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
    assert_eq!(dataset["batches"].as_array().unwrap().len() as u64, steps.div_ceil(25));
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
         def wrong(record):\n    return {'state': 1}\n",
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
}
