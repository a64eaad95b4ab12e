//! `validate`: the shared checks of `basecamp_api::validate_task` (the same
//! words as `basecamp harness validate`), plus what only matters in a
//! cluster: pods read the test set from S3 and write traces to S3 (their
//! disks vanish, and the operator aggregates from there), and a scripted
//! policy file on the operator's side does not exist in the pod. Pure.
//!
//! On success every variant comes back resolved (profile applied), ready
//! for `build`.

use basecamp_api::{HarnessTask, Problem, Report, Rule, ValidationContext, resolve_profile, validate_task};
use kube::ResourceExt;

use super::dereference::World;
use crate::build::ResolvedVariant;

/// The outcome of validation.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Runnable: the variants resolved, and any warnings.
    Valid {
        /// Variants in spec order.
        variants: Vec<ResolvedVariant>,
        /// Warnings to show in status.
        warnings: Vec<Problem>,
    },
    /// Not runnable: every problem (errors first).
    Invalid(Report),
}

fn cluster_rules(task: &HarnessTask) -> Vec<Problem> {
    let mut problems = Vec::new();
    let test_set = task.spec.evaluation.test_set.trim();
    if !test_set.is_empty() && !test_set.starts_with("s3://") {
        problems.push(Problem::error(
            Rule::InvalidEvaluation,
            "spec.evaluation.testSet",
            format!(
                "{test_set:?} is a local path, but sandbox pods have no such file; in a cluster the test set must be \
                 an s3:// URI (upload it, e.g. `aws s3 cp tests.jsonl s3://BUCKET/tests.jsonl`), or run locally with `basecamp run`"
            ),
        ));
    }
    match task.spec.traces.as_ref().and_then(|t| t.destination.as_deref()) {
        Some(dest) if dest.starts_with("s3://") => {}
        Some(dest) => problems.push(Problem::error(
            Rule::InvalidTraces,
            "spec.traces.destination",
            format!(
                "{dest:?} is a local directory, which vanishes with the pod; in a cluster traces go to an s3:// URI \
                 (e.g. s3://BUCKET/traces), where the operator aggregates them"
            ),
        )),
        None => problems.push(Problem::error(
            Rule::InvalidTraces,
            "spec.traces.destination",
            "no trace destination; in a cluster set spec.traces.destination to an s3:// URI (e.g. s3://BUCKET/traces)",
        )),
    }
    if let Some(script) = task.spec.policy.scripted.as_deref()
        && !script.starts_with("s3://")
    {
        problems.push(Problem::error(
            Rule::InvalidPolicy,
            "spec.policy.scripted",
            format!(
                "the scripted policy {script:?} is a local file that sandbox pods do not have; in a cluster use \
                 spec.policy.endpoint (an OpenAI-compatible server), or run locally with `basecamp run`"
            ),
        ));
    }
    if let Some(training) = &task.spec.training_config {
        // The trainer writes checkpoints where the operator and the
        // evaluation pods read them: a local path is none of their disks.
        for (path, value) in [
            ("spec.trainingConfig.checkpoints", training.checkpoints.as_deref()),
            ("spec.trainingConfig.resumeFrom", training.resume_from.as_deref()),
        ] {
            if let Some(value) = value.filter(|v| !v.trim().starts_with("s3://")) {
                problems.push(Problem::error(
                    Rule::InvalidS3Uri,
                    path,
                    format!(
                        "{value:?} is a local path, but the trainer, the operator and the evaluation pods each have \
                         their own disk; in a cluster checkpoints live under an s3:// URI (e.g. s3://BUCKET/checkpoints/)"
                    ),
                ));
            }
        }
    }
    problems.extend(training_job_names(task));
    problems
}

/// A training task's Jobs are `<task>-train` and `<task>-s<N>-<variant>`
/// beside the variants' `<task>-<variant>`: a variant named `train` or
/// `s<N>-...` would share a Job with the trainer or an evaluation.
fn training_job_names(task: &HarnessTask) -> Vec<Problem> {
    let trains =
        task.spec.training_config.as_ref().and_then(|t| t.image.as_deref()).is_some_and(|i| !i.trim().is_empty());
    if !trains {
        return Vec::new();
    }
    let collides = |name: &str| {
        name == crate::training::trainer::TRAINER_JOB_SUFFIX
            || name
                .strip_prefix('s')
                .and_then(|rest| rest.split_once('-'))
                .is_some_and(|(digits, _)| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
    };
    task.spec
        .variants
        .iter()
        .enumerate()
        .filter(|(_, v)| collides(&v.name))
        .map(|(i, v)| {
            Problem::error(
                Rule::InvalidManifest,
                format!("spec.variants[{i}].name"),
                format!(
                    "variant {:?} would share a Job name with the trainer (<task>-train) or a checkpoint evaluation \
                     (<task>-s<N>-<variant>) of this training task; rename the variant",
                    v.name
                ),
            )
        })
        .collect()
}

/// Validates a task against what it refers to.
pub fn check(task: &HarnessTask, world: &World) -> Verdict {
    let name = task.name_any();
    let found: Vec<(&str, &basecamp_api::SandboxConfigSpec)> = world
        .sandboxes
        .iter()
        .filter_map(|(name, sandbox)| sandbox.as_ref().map(|s| (name.as_str(), &s.spec)))
        .collect();
    let ctx = ValidationContext { task_name: Some(&name), test_set: None, base_dir: None, fixtures: None };
    let mut report = validate_task(&task.spec, &found, &ctx);
    report.extend(cluster_rules(task).into_iter().map(|p| p.in_object(&format!("HarnessTask/{name}"))));
    if report.has_errors() {
        return Verdict::Invalid(report);
    }
    let mut variants = Vec::new();
    for variant in task.spec.effective_variants() {
        let Some((_, spec)) = found.iter().find(|(n, _)| *n == variant.sandbox_ref.name) else {
            continue;
        };
        match resolve_profile(spec, variant.sandbox_ref.profile.as_deref()) {
            Ok(resolved) => variants.push(ResolvedVariant {
                name: variant.name.clone(),
                sandbox_name: variant.sandbox_ref.name.clone(),
                profile: variant.sandbox_ref.profile.clone(),
                spec: resolved,
            }),
            Err(error) => {
                // validate_task reports profile errors; this keeps the invariant explicit.
                let rule =
                    if error.category() == "UnknownProfile" { Rule::UnknownProfile } else { Rule::InvalidProfile };
                report.push(Problem::error(rule, "spec.sandboxRef.profile", error.to_string()));
                return Verdict::Invalid(report);
            }
        }
    }
    Verdict::Valid { variants, warnings: report.warnings().cloned().collect() }
}

/// The errors of a report as one message for a condition (capped), e.g.
/// `spec.variants[0].sandboxRef.name: SandboxConfig "shop" not found ...`.
pub fn summarize(report: &Report, limit: usize) -> String {
    let mut text = report
        .errors()
        .map(|p| format!("{}: {}", p.location, p.message.lines().next().unwrap_or("")))
        .collect::<Vec<_>>()
        .join("; ");
    if text.len() > limit {
        let mut cut = limit;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// The first error's rule: the condition reason and Event reason.
pub fn reason(report: &Report) -> &'static str {
    report.errors().next().map_or("InvalidSpec", Problem::category)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(spec: serde_json::Value) -> HarnessTask {
        serde_json::from_value(json!({
            "apiVersion": "basecamp.dev/v1alpha1", "kind": "HarnessTask",
            "metadata": {"name": "eval", "namespace": "team-a", "uid": "u"},
            "spec": spec,
        }))
        .expect("task")
    }

    fn spec() -> serde_json::Value {
        json!({
            "taskDefinition": {},
            "evaluation": {"testSet": "s3://data/tests.jsonl"},
            "policy": {"endpoint": "http://policy:8000/v1", "model": "m"},
            "sandboxRef": {"name": "shop", "profile": "prod"},
            "traces": {"destination": "s3://traces/x"},
        })
    }

    fn world_with_shop() -> World {
        let sandbox: basecamp_api::SandboxConfig = serde_json::from_value(json!({
            "apiVersion": "basecamp.dev/v1alpha1", "kind": "SandboxConfig",
            "metadata": {"name": "shop", "namespace": "team-a"},
            "spec": {"maxSteps": 10, "profiles": {"prod": {"maxSteps": 40}}},
        }))
        .expect("sandbox");
        World { sandboxes: [("shop".to_string(), Some(sandbox))].into(), nodes: None }
    }

    #[test]
    fn a_valid_task_resolves_its_profile() {
        let Verdict::Valid { variants, .. } = check(&task(spec()), &world_with_shop()) else { panic!("valid") };
        assert_eq!(variants.len(), 1);
        assert_eq!(variants[0].name, "default");
        assert_eq!(variants[0].spec.max_steps, Some(40));
        assert!(variants[0].spec.profiles.is_empty());
    }

    #[test]
    fn an_unknown_sandbox_is_named_with_its_field() {
        let world = World { sandboxes: [("shop".to_string(), None)].into(), nodes: None };
        let Verdict::Invalid(report) = check(&task(spec()), &world) else { panic!("invalid") };
        assert_eq!(reason(&report), "UnknownSandbox");
        let text = summarize(&report, 2000);
        assert!(text.contains("spec.sandboxRef.name") && text.contains("\"shop\" not found"), "{text}");
    }

    #[test]
    fn a_training_task_refuses_variant_names_its_jobs_use() {
        let mut training = spec();
        training.as_object_mut().expect("spec").remove("sandboxRef");
        training["trainingConfig"] = json!({"image": "trainer:1"});
        training["variants"] = json!([
            {"name": "train", "sandboxRef": {"name": "shop"}},
            {"name": "s20-a", "sandboxRef": {"name": "shop"}},
        ]);
        let Verdict::Invalid(report) = check(&task(training.clone()), &world_with_shop()) else { panic!("invalid") };
        let text = summarize(&report, 4000);
        assert!(text.contains("spec.variants[0].name") && text.contains("spec.variants[1].name"), "{text}");
        training["variants"] = json!([
            {"name": "a", "sandboxRef": {"name": "shop"}},
            {"name": "s-b", "sandboxRef": {"name": "shop"}},
        ]);
        assert!(matches!(check(&task(training.clone()), &world_with_shop()), Verdict::Valid { .. }));
        training.as_object_mut().expect("spec").remove("trainingConfig");
        training["variants"][0]["name"] = json!("train");
        assert!(matches!(check(&task(training), &world_with_shop()), Verdict::Valid { .. }), "no trainer, no clash");
    }

    #[test]
    fn local_checkpoint_paths_are_refused_in_a_cluster() {
        let mut training = spec();
        training["trainingConfig"] =
            json!({"image": "trainer:1", "checkpoints": "/data/ckpt/", "resumeFrom": "s3://ckpt/step-10/"});
        let Verdict::Invalid(report) = check(&task(training.clone()), &world_with_shop()) else { panic!("invalid") };
        let text = summarize(&report, 4000);
        assert!(text.contains("spec.trainingConfig.checkpoints") && text.contains("is a local path"), "{text}");
        assert!(!text.contains("spec.trainingConfig.resumeFrom"), "{text}");
        training["trainingConfig"]["checkpoints"] = json!("s3://ckpt/");
        assert!(matches!(check(&task(training), &world_with_shop()), Verdict::Valid { .. }));
    }

    #[test]
    fn local_paths_are_refused_in_a_cluster() {
        let mut local = spec();
        local["evaluation"]["testSet"] = json!("tests/shop.jsonl");
        local["traces"] = json!({"destination": "./runs"});
        let Verdict::Invalid(report) = check(&task(local), &world_with_shop()) else { panic!("invalid") };
        let text = summarize(&report, 4000);
        assert!(text.contains("spec.evaluation.testSet") && text.contains("must be an s3:// URI"), "{text}");
        assert!(text.contains("spec.traces.destination"), "{text}");
        assert_eq!(reason(&report), "InvalidEvaluation");
        assert!(summarize(&report, 20).ends_with("..."));
    }
}
