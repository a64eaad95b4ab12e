//! The reward library as a dataset preprocessor uses it: a spec read from
//! JSON, samples scored across training steps, each weight change reported
//! once, and the signal a sandbox would write agreeing with the stream's.

use std::collections::BTreeMap;

use basecamp_sandbox::rewards::{RewardCalculator, RewardSpec, RewardTracker};

const SPEC: &str = r#"{
  "components": {
    "tool_call_accuracy": {"weight": 1.0},
    "format": {"weight": 0.5},
    "brevity": {"weight": 0.0}
  },
  "schedule": [
    {"atTrainingStep": 100, "weights": {"brevity": 0.25}},
    {"atTrainingStep": 200, "weights": {"format": 0.1, "brevity": 0.25}}
  ]
}"#;

fn scores(accuracy: f64, format: f64, brevity: f64) -> BTreeMap<String, f64> {
    BTreeMap::from([
        ("tool_call_accuracy".to_owned(), accuracy),
        ("format".to_owned(), format),
        ("brevity".to_owned(), brevity),
    ])
}

#[test]
fn a_preprocessor_sees_each_weight_change_once_and_the_same_sums_as_the_sandbox() {
    let spec: RewardSpec = serde_json::from_str(SPEC).unwrap();
    let calculator = RewardCalculator::new(&spec).unwrap();
    let mut tracker = RewardTracker::new(calculator.clone());

    let mut emitted = Vec::new();
    for step in (0..300).step_by(25) {
        let sample = scores(1.0, 0.5, 0.8);
        let streamed = tracker.signal(step, &sample).unwrap();
        let per_episode = calculator.signal(step, &sample).unwrap();
        assert_eq!(streamed.weighted_sum, per_episode.weighted_sum, "step {step}");
        assert_eq!(streamed.components, per_episode.components, "step {step}");
        emitted.extend(streamed.weight_deltas);
    }

    // brevity 0 -> 0.25 at 100, format 0.5 -> 0.1 at 200; brevity's repeat at 200 is no change.
    let summary: Vec<_> =
        emitted.iter().map(|d| (d.component.as_str(), d.old_weight, d.new_weight, d.training_step)).collect();
    assert_eq!(summary, vec![("brevity", 0.0, 0.25, 100), ("format", 0.5, 0.1, 200)]);

    let late = calculator.signal(250, &scores(1.0, 0.5, 0.8)).unwrap();
    assert!((late.weighted_sum - (1.0 + 0.05 + 0.2)).abs() < 1e-12);
    assert_eq!(late.weight_deltas.len(), 2, "one trace carries the history behind its weights");
}

#[test]
fn a_typo_in_the_schedule_is_caught_when_the_spec_is_loaded() {
    let spec: RewardSpec = serde_json::from_str(&SPEC.replace(r#""format": 0.1"#, r#""formatting": 0.1"#)).unwrap();
    let err = RewardCalculator::new(&spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rewards.schedule[1] (atTrainingStep 200) sets a weight for `formatting`, which is not a reward component \
         (components: brevity, format, tool_call_accuracy); add it under rewards.components or fix the name"
    );
}

#[test]
fn a_nan_score_never_reaches_a_trace() {
    let calculator = RewardCalculator::new(&serde_json::from_str(SPEC).unwrap()).unwrap();
    let err = calculator.signal(0, &scores(f64::NAN, 1.0, 1.0)).unwrap_err();
    assert_eq!(err.category(), "RewardNonFiniteScore");
}
