//! `validate`: a clean episode has no findings; each kind of damage to a
//! real episode (written by the real writer) is found, at the right step.

use basecamp_trace::TraceReader;
use basecamp_trace::pb::{Record, StepStatus, record::Body};
use basecamp_trace::synthetic::{EpisodeShape, SyntheticEpisode, generate};
use basecamp_trace::validate::{Finding, validate_file, validate_reader};

fn episode() -> SyntheticEpisode {
    generate(&EpisodeShape { seed: 3, steps: 12, tokens_per_step: 2, ..Default::default() })
}

fn findings(ep: &SyntheticEpisode) -> Vec<Finding> {
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    validate_reader(TraceReader::new(bytes.as_slice(), "ep.trace").unwrap())
}

/// (step, check) of each finding, and its message for failure output.
fn summary(found: &[Finding]) -> Vec<(Option<u32>, &'static str)> {
    found.iter().map(|f| (f.step, f.check)).collect()
}

fn plan_step_mut(ep: &mut SyntheticEpisode, step: usize) -> &mut basecamp_trace::pb::PlanStep {
    ep.steps[step]
        .iter_mut()
        .find_map(|r| match &mut r.body {
            Some(Body::PlanStep(p)) => Some(p),
            _ => None,
        })
        .expect("every synthetic step has a plan step")
}

#[test]
fn a_clean_episode_has_no_findings() {
    for seed in 1..6 {
        let ep = generate(&EpisodeShape { seed, steps: 30, tokens_per_step: 2, ..Default::default() });
        let found = findings(&ep);
        assert!(found.is_empty(), "seed {seed}: {found:#?}");
    }
}

#[test]
fn a_broken_memory_hash_chain_is_found_at_its_step() {
    let mut ep = episode();
    plan_step_mut(&mut ep, 5).memory_hash_after = vec![7; 32];
    let found = findings(&ep);
    assert_eq!(summary(&found), [(Some(6), "memory")], "{found:#?}");
    assert!(found[0].message.starts_with("hash chain broken: memory_hash_before "), "{}", found[0]);
    assert!(found[0].message.ends_with("of the call at step 5"), "{}", found[0]);
}

#[test]
fn memory_changed_without_a_delta_is_found() {
    let mut ep = episode();
    // Drop step 4's deltas: the recorded hashes no longer follow from the deltas.
    ep.steps[4].retain(|r| !matches!(r.body, Some(Body::MemoryDelta(_))));
    let found = findings(&ep);
    let steps: Vec<_> = summary(&found);
    assert!(steps.contains(&(Some(5), "memory")), "{found:#?}");
    assert!(found.iter().any(|f| f.message.contains("is not the hash of the memory the deltas give")), "{found:#?}");
}

#[test]
fn a_delta_whose_before_is_wrong_is_found() {
    let mut ep = episode();
    for r in &mut ep.steps[3] {
        if let Some(Body::MemoryDelta(d)) = &mut r.body {
            d.before_json = Some("\"not what memory held\"".into());
            break;
        }
    }
    let found = findings(&ep);
    assert_eq!(summary(&found), [(Some(3), "memory")], "{found:#?}");
    assert!(found[0].message.contains("says it was \"not what memory held\" but memory held"), "{}", found[0]);
}

#[test]
fn a_wrong_reward_sum_is_found() {
    let mut ep = episode();
    for r in &mut ep.steps[2] {
        if let Some(Body::RewardSignal(s)) = &mut r.body {
            s.weighted_sum += 0.5;
        }
    }
    let found = findings(&ep);
    assert_eq!(summary(&found), [(Some(2), "reward")], "{found:#?}");
    assert!(found[0].message.contains("tool_call_accuracy"), "{}", found[0]);
}

/// Sets step 2's reward components to `scores` (weight 1 each) and its weighted sum.
fn with_reward(scores: &[f64], weighted_sum: f64) -> Vec<Finding> {
    let mut ep = episode();
    for r in &mut ep.steps[2] {
        if let Some(Body::RewardSignal(s)) = &mut r.body {
            s.components.truncate(scores.len());
            for (c, &score) in s.components.iter_mut().zip(scores) {
                (c.score, c.weight) = (score, 1.0);
            }
            s.weighted_sum = weighted_sum;
        }
    }
    findings(&ep)
}

/// NaN compares false with everything and inf - inf is NaN, so a sum that
/// is not a number slipped past the tolerance check.
#[test]
fn a_reward_sum_that_is_not_finite_is_found() {
    for (scores, weighted_sum) in [
        (&[f64::NAN, 1.0][..], 1.0),
        (&[f64::INFINITY, f64::NEG_INFINITY], 0.0),
        (&[f64::INFINITY, 1.0], f64::INFINITY),
        (&[f64::INFINITY, 1.0], 1.0),
        (&[0.5, 1.0], f64::NAN),
        (&[0.5, 1.0], f64::INFINITY),
    ] {
        let found = with_reward(scores, weighted_sum);
        assert_eq!(summary(&found), [(Some(2), "reward")], "{scores:?} -> {weighted_sum}: {found:#?}");
        assert!(found[0].message.ends_with("a reward must be a finite number"), "{}", found[0]);
    }
    assert!(with_reward(&[0.5, 1.0], 1.5).is_empty(), "the episode is clean otherwise");
}

#[test]
fn statuses_hashes_and_indices_are_checked() {
    let mut ep = episode();
    plan_step_mut(&mut ep, 1).status = 42;
    let p = plan_step_mut(&mut ep, 2);
    p.status = StepStatus::Ok as i32;
    p.fallback_used = true;
    plan_step_mut(&mut ep, 3).input_hash = vec![0; 32];
    plan_step_mut(&mut ep, 4).index = 9;
    let found = findings(&ep);
    assert_eq!(
        summary(&found),
        [(Some(1), "status"), (Some(2), "status"), (Some(3), "hashes"), (Some(4), "steps")],
        "{found:#?}"
    );
}

#[test]
fn steps_out_of_order_and_steps_never_ended_are_found() {
    let mut ep = episode();
    // Step 7 loses its plan step: it never ended.
    ep.steps[7].retain(|r| !matches!(r.body, Some(Body::PlanStep(_))));
    // A stray record of step 2 after step 8.
    let stray = Record {
        step: 2,
        body: ep.steps[2].iter().find(|r| matches!(r.body, Some(Body::PolicyTurn(_)))).unwrap().body.clone(),
    };
    ep.steps[8].push(stray);
    let found = findings(&ep);
    let s = summary(&found);
    assert!(s.contains(&(Some(2), "steps")), "{found:#?}");
    assert!(s.contains(&(Some(7), "steps")), "{found:#?}");
    assert!(found.iter().any(|f| f.message == "record of step 2 comes after step 8"), "{found:#?}");
    assert!(found.iter().any(|f| f.message == "step never ended: no plan step or error context recorded"));
}

#[test]
fn a_truncated_file_is_one_finding_with_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.trace");
    let bytes = episode().write_to(Vec::new(), 3).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let found = validate_file(&path);
    assert_eq!(found.len(), 1, "{found:#?}");
    let line = found[0].to_string();
    assert!(line.starts_with(&format!("{}: schema: truncated at byte ", path.display())), "{line}");
}

#[test]
fn an_episode_end_claiming_more_steps_than_recorded_is_one_finding() {
    let mut ep = episode();
    ep.end.steps = u32::MAX;
    let found = findings(&ep);
    assert_eq!(summary(&found), [(Some(12), "steps")], "{found:#?}");
    assert_eq!(found[0].message, format!("the episode end says {} steps, but records stop at step 12", u32::MAX));
}

#[test]
fn a_step_whose_records_all_come_after_a_later_step_is_one_finding() {
    // Steps 1 and 2 swapped: "record of step 1 comes after step 2" was
    // said once for each of step 1's records.
    let mut ep = episode();
    ep.steps.swap(1, 2);
    let records_of_step_1 = ep.steps[2].len();
    assert!(records_of_step_1 > 1);
    let found = findings(&ep);
    let backwards: Vec<&str> =
        found.iter().filter(|f| f.message.contains("come")).map(|f| f.message.as_str()).collect();
    assert_eq!(backwards, [format!("{records_of_step_1} records of step 1 come after step 2")], "{found:#?}");
}
