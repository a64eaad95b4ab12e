//! A policy that sends full-vocabulary logits: the sandbox derives the
//! turn's `token_logit` records (top-k, entropy, KL against the reference)
//! and the episode's `logit_divergence`, checked against the float64
//! oracle on fresh random logits (ties, -inf, peaked and flat rows among
//! them) — and bad logits are a warning naming file, row and column, never
//! a lost turn.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use basecamp_gpu::file::{RawTensor, write_tensors};
use basecamp_gpu::logits::LogitsView;
use basecamp_gpu::logits::reference::{ReferenceRow, reference};
use basecamp_gpu::testdata::{Rng, fresh_seed, mixed_logits, perturbed, to_bf16};
use basecamp_sandbox::episode::{EpisodeInput, EpisodeResult, EpisodeRunner};
use basecamp_sandbox::executor::{NullWrites, ToolDef, ToolExecutor};
use basecamp_sandbox::policy::{ChatMessage, Policy, PolicyConfig, ScriptedConfig};
use basecamp_sandbox::tools::Tool;
use basecamp_sandbox::tools::recorded::{RecordedTool, parse_fixture};
use basecamp_trace::metrics::{EpisodeEnd, aggregate};
use basecamp_trace::pb::{Header, TokenLogit, record::Body};
use basecamp_trace::read_trace;
use serde_json::{Value, json};

const TOP_K: usize = 5;
/// Odd, so no row is a whole number of SIMD vectors.
const VOCAB: usize = 4099;

fn runner(script: &Path) -> EpisodeRunner {
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script.to_path_buf() })).unwrap();
    let fixture = r#"{"tool": "lookup", "arguments": {}, "response": {"observation": "found"}}"#;
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    executor.add_tool(
        "lookup",
        ToolDef {
            tool: Tool::Recorded(RecordedTool::new("lookup", parse_fixture("fixture.jsonl", fixture).unwrap())),
            timeout: Duration::from_secs(5),
            fallback: None,
            memory_map: Vec::new(),
        },
    );
    EpisodeRunner {
        max_steps: 5,
        plan_step_timeout: Duration::from_secs(30),
        header: Header { task: "logits".into(), top_k: TOP_K as u32, ..Default::default() },
        ..EpisodeRunner::new(executor, policy)
    }
}

async fn run_episode(dir: &Path, id: &str, turns: Vec<Value>) -> (EpisodeResult, Vec<(u32, TokenLogit)>, bool) {
    let script = dir.join(format!("{id}.jsonl"));
    std::fs::write(&script, format!("{}\n", json!({"episode": id, "turns": turns}))).unwrap();
    let input = EpisodeInput {
        id: id.into(),
        messages: vec![ChatMessage::user("Find it.")],
        expected_calls: vec![("lookup".into(), Default::default(), None)],
        ..Default::default()
    };
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let result = runner(&script).run(&input, &out).await.unwrap();
    let trace = read_trace(out.join(&result.trace_file)).unwrap();
    let mut logprobs_missing = false;
    let tokens = trace
        .records
        .into_iter()
        .filter_map(|r| match r.body {
            Some(Body::TokenLogit(t)) => Some((r.step, t)),
            Some(Body::PolicyTurn(turn)) => {
                logprobs_missing |= turn.logprobs_missing;
                None
            }
            _ => None,
        })
        .collect();
    (result, tokens, logprobs_missing)
}

/// `||got - want|| / ||want||` over the pairs where `want` is finite; the
/// infinite ones must be equal.
fn relative(pairs: impl Iterator<Item = (f32, f64)>) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (got, want) in pairs {
        if want.is_finite() {
            diff += (f64::from(got) - want).powi(2);
            norm += want.powi(2);
        } else {
            assert_eq!(f64::from(got), want, "an infinite value must come out exactly");
        }
    }
    if norm > 0.0 { (diff / norm).sqrt() } else { diff.sqrt() }
}

/// Every record of a turn against the oracle: top-k ids exactly, the rest
/// within `limit` (relative, METHOD.md: float32 arithmetic far under 1e-3).
fn check_turn(records: &[&TokenLogit], view: LogitsView<'_>, want: &[ReferenceRow], emitted: &[u32], limit: f64) {
    assert_eq!(records.len(), want.len());
    for (row, (record, want)) in records.iter().zip(want).enumerate() {
        assert_eq!(record.position as usize, row);
        let ids: Vec<i32> = want.top.iter().map(|&(id, _)| id as i32).collect();
        assert_eq!(record.top_ids[..], ids[..], "row {row}: top ids");
        assert_eq!(record.top_tokens.len(), ids.len(), "row {row}: parallel arrays");
        assert_eq!(record.token_id, emitted[row] as i32);
        assert!(record.entropy.is_some(), "row {row}: entropy is set for derived records");
    }
    let top = relative(
        records.iter().zip(want).flat_map(|(r, w)| r.top_logprobs.iter().copied().zip(w.top.iter().map(|t| t.1))),
    );
    let entropy = relative(records.iter().zip(want).map(|(r, w)| (r.entropy.unwrap(), w.entropy)));
    let chosen = relative(
        records
            .iter()
            .zip(want)
            .enumerate()
            .map(|(row, (r, w))| (r.logprob, f64::from(view.logit(row, emitted[row] as usize).unwrap()) - w.lse)),
    );
    assert!(top < limit && entropy < limit && chosen < limit, "top {top:e}, entropy {entropy:e}, chosen {chosen:e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_logits_become_token_records_and_the_episode_divergence() {
    let seed = fresh_seed();
    println!("seed {seed} (BASECAMP_TEST_SEED={seed} reruns it)");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();

    // Turn 0: f32 logits and a reference (a second run at the same
    // context), from a file next to the script; in one row (with another
    // finite logit left) the reference gives probability 0 to the policy's
    // best token, so that row's KL is +inf.
    let rows0 = 9;
    let p = mixed_logits(&mut rng, rows0, VOCAB);
    let mut q = perturbed(&mut rng, &p, 0.4);
    let row_of = |r: usize| &p[r * VOCAB..(r + 1) * VOCAB];
    let inf_row = (0..rows0).rev().find(|&r| row_of(r).iter().filter(|x| x.is_finite()).count() >= 2).unwrap();
    let row = row_of(inf_row);
    let best = (0..VOCAB).filter(|&i| row[i].is_finite()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
    q[inf_row * VOCAB + best] = f32::NEG_INFINITY;
    // A sampler emits only tokens its logits give a chance (one at -inf is
    // an ImpossibleToken error, the last test's step 4).
    let emitted0: Vec<u32> = (0..rows0)
        .map(|r| {
            let finite: Vec<usize> = (0..VOCAB).filter(|&i| row_of(r)[i].is_finite()).collect();
            finite[rng.below(finite.len())] as u32
        })
        .collect();
    write_tensors(
        &dir.path().join("turn0.safetensors"),
        &[RawTensor::f32("logits", &[1, rows0, VOCAB], &p), RawTensor::f32("reference", &[rows0, VOCAB], &q)],
    )
    .unwrap();

    // Turn 1: bf16 logits sent inline, no reference, no emitted ids (each
    // record names the row's most likely token).
    let rows1 = 4;
    let p1 = to_bf16(&mixed_logits(&mut rng, rows1, VOCAB));
    let inline = dir.path().join("inline.safetensors");
    write_tensors(&inline, &[RawTensor::bf16("logits", &[rows1, VOCAB], &p1)]).unwrap();
    let inline = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&inline).unwrap());

    let turns = vec![
        json!({"tool_calls": [{"name": "lookup", "arguments": {}}],
               "raw_logits": {"path": "turn0.safetensors", "reference": "reference", "token_ids": emitted0}}),
        json!({"content": "Found it.", "raw_logits": {"safetensors_base64": inline}}),
    ];
    let (result, tokens, logprobs_missing) = run_episode(dir.path(), "ep-raw", turns).await;
    assert!(!logprobs_missing, "a turn with raw logits has its logprobs");

    let view0 = LogitsView::f32(&p, rows0, VOCAB).unwrap();
    let want0 = reference(view0, Some(LogitsView::f32(&q, rows0, VOCAB).unwrap()), TOP_K).unwrap();
    let turn0: Vec<&TokenLogit> = tokens.iter().filter(|(step, _)| *step == 1).map(|(_, t)| t).collect();
    check_turn(&turn0, view0, &want0, &emitted0, 1e-5);
    let kl_pairs: Vec<(f32, f64)> =
        turn0.iter().zip(&want0).map(|(r, w)| (r.kl.expect("a reference was given"), w.kl.unwrap())).collect();
    let kl = relative(kl_pairs.iter().copied());
    // As basecamp-gpu's own tests: relative, or absolute where every KL is near 0.
    let kl_abs =
        kl_pairs.iter().filter(|(_, w)| w.is_finite()).map(|&(g, w)| (f64::from(g) - w).abs()).fold(0.0, f64::max);
    assert!(kl < 1e-4 || kl_abs < 1e-6, "KL relative error {kl:e}, absolute {kl_abs:e}");
    assert_eq!(turn0[inf_row].kl, Some(f32::INFINITY));

    let view1 = LogitsView::bf16(&p1, rows1, VOCAB).unwrap();
    let want1 = reference(view1, None, TOP_K).unwrap();
    let turn1: Vec<&TokenLogit> = tokens.iter().filter(|(step, _)| *step == 2).map(|(_, t)| t).collect();
    let top1: Vec<u32> = want1.iter().map(|w| w.top[0].0).collect();
    check_turn(&turn1, view1, &want1, &top1, 1e-5);
    assert!(turn1.iter().all(|r| r.kl.is_none()), "no reference, no KL");

    // logit_divergence: the mean KL of the tokens where it is finite; the
    // infinite one is named in a warning, not averaged in.
    let finite: Vec<f64> = want0.iter().filter_map(|w| w.kl).filter(|k| k.is_finite()).collect();
    let want_mean = finite.iter().sum::<f64>() / finite.len() as f64;
    let got = result.metrics.logit_divergence.expect("a divergence");
    assert!((got - want_mean).abs() <= 1e-4 * want_mean.max(1e-6), "{got} vs {want_mean}");
    let infinite = want0.iter().filter(|w| w.kl == Some(f64::INFINITY)).count();
    assert!(
        result.warnings.iter().any(|w| w.starts_with(&format!("{infinite} token(s) had KL = +inf"))),
        "{:?}",
        result.warnings
    );
    let summary = serde_json::to_value(&result.metrics).unwrap();
    assert_eq!(summary["logit_divergence"].as_f64(), Some(got));
    let agg = aggregate([EpisodeEnd {
        metrics: &result.metrics,
        outcome: &result.outcome,
        failure_class: &result.failure_class,
    }]);
    assert_eq!(agg.value_of("logit_divergence"), Some(got));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_raw_logits_are_a_warning_and_the_logprobs_stand_in() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(fresh_seed());
    let mut bad = mixed_logits(&mut rng, 3, 16);
    bad[16 + 5] = f32::NAN;
    let mut good = mixed_logits(&mut rng, 3, 16);
    // Row 1 gives token 2 probability 0; the tokens the turns emit elsewhere are possible.
    (good[16 + 2], good[1], good[16 + 3]) = (f32::NEG_INFINITY, 0.5, 0.5);
    write_tensors(
        &dir.path().join("bad.safetensors"),
        &[
            RawTensor::f32("logits", &[3, 16], &bad),
            RawTensor::f32("good", &[3, 16], &good),
            RawTensor::f32("short", &[2, 16], &good[..32]),
        ],
    )
    .unwrap();
    let logprobs = json!([{"token": "hi", "logprob": -0.5, "top_logprobs": [{"token": "hi", "logprob": -0.5}]}]);
    let turns = vec![
        json!({"tool_calls": [{"name": "lookup", "arguments": {}}], "logprobs": logprobs,
               "raw_logits": {"path": "missing.safetensors"}}),
        json!({"tool_calls": [{"name": "lookup", "arguments": {}}], "raw_logits": {"path": "bad.safetensors"}}),
        json!({"tool_calls": [{"name": "lookup", "arguments": {}}],
               "raw_logits": {"path": "bad.safetensors", "tensor": "good", "reference": "short"}}),
        json!({"tool_calls": [{"name": "lookup", "arguments": {}}],
               "raw_logits": {"path": "bad.safetensors", "tensor": "good", "token_ids": [1, 2, 3]}}),
        json!({"content": "done", "raw_logits": {"path": "bad.safetensors", "tensor": "good", "token_ids": [1, 3, 99]}}),
    ];
    let (result, tokens, _) = run_episode(dir.path(), "ep-bad", turns).await;
    let path = dir.path().join("bad.safetensors");
    let missing = dir.path().join("missing.safetensors");
    let expected = [
        format!(
            "step 1: raw logits not used (LogitsFileUnreadable): cannot read {}: No such file or directory (os error 2); its logprobs are recorded instead",
            missing.display()
        ),
        format!(
            "step 2: raw logits not used (NonFiniteLogit): {} tensor \"logits\": logits p row 1 column 5 is NaN: logits must be finite or -inf",
            path.display()
        ),
        format!(
            "step 3: raw logits not used (LogitsShapeMismatch): {}: reference tensor \"short\" has shape [2, 16] but the logits \"good\" have [3, 16]",
            path.display()
        ),
        format!(
            "step 4: raw logits not used (ImpossibleToken): {} tensor \"good\": emitted token 2 at row 1 has logit -inf \
             (probability 0) in these logits: the tokens and the logits do not belong together (shifted by a position, \
             or another model's logits?)",
            path.display()
        ),
        format!(
            "step 5: raw logits not used (TokenOutOfRange): {} tensor \"good\": emitted token 99 at row 2 is outside the vocabulary of 16 tokens",
            path.display()
        ),
    ];
    for line in &expected {
        assert!(result.warnings.contains(line), "missing warning\n  {line}\nin {:#?}", result.warnings);
    }
    // Only step 1's scripted logprobs made records; nothing was invented.
    assert_eq!(tokens.len(), 1);
    assert_eq!((tokens[0].0, tokens[0].1.token.as_str(), tokens[0].1.entropy), (1, "hi", None));
    assert_eq!(result.metrics.logit_divergence, None);
    assert_eq!(result.outcome, "completed", "the episode itself went on: {:?}", result.error);
}

#[test]
fn a_script_with_a_malformed_raw_logits_block_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("policy.jsonl");
    std::fs::write(
        &script,
        "{\"content\": \"ok\"}\n{\"content\": \"x\", \"raw_logits\": {\"path\": \"a.safetensors\", \"refrence\": \"q\"}}\n",
    )
    .unwrap();
    let error = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script.clone() })).unwrap_err();
    let text = error.to_string();
    assert!(text.starts_with(&format!("{}:2: raw_logits: unknown field `refrence`", script.display())), "{text}");
}
