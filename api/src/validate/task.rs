//! Rules for a HarnessTask spec: criteria, data and trace locations, the
//! policy, sandbox references and profiles, variants, shards, and the test
//! set against the referenced sandboxes' tools.

use std::collections::{BTreeMap, BTreeSet};

use crate::criteria::{CRITERION_METRICS, Criterion, metric_kind};
use crate::preprocessor::{Preprocessor, PreprocessorSyntaxError};
use crate::problem::{Location, Problem, Report, Rule, Severity};
use crate::profile::resolve_profile;
use crate::sandbox::SandboxConfigSpec;
use crate::storage::{S3UriError, StorageLocation};
use crate::task::HarnessTaskSpec;
use crate::testset::TestSet;

use super::names::{dns_subdomain_violation, is_dns_label};
use super::sandbox::key_path;
use super::{ValidationContext, check_not_too_long, list, suggestion};

/// The most shards a variant may have: an Indexed Job of more completions
/// must set `maxFailedIndexes`, which Basecamp does not.
pub const MAX_SHARDS: u32 = 100_000;

pub(super) fn validate(
    task: &HarnessTaskSpec,
    sandboxes: &[(&str, &SandboxConfigSpec)],
    ctx: &ValidationContext<'_>,
) -> Report {
    let label = ctx.task_label();
    let mut problems: Vec<Problem> = Vec::new();

    let criteria = &task.task_definition.success_criteria;
    for (index, criterion) in criteria.iter().enumerate() {
        let path = format!("spec.taskDefinition.successCriteria[{index}]");
        // The same condition twice is judged, reported and counted twice.
        if let Some(first) = criteria[..index].iter().position(|c| c.trim() == criterion.trim()) {
            problems.push(Problem::warning(
                Rule::InvalidCriterion,
                path,
                format!("success criterion {criterion:?} repeats successCriteria[{first}]; give each condition once"),
            ));
            continue;
        }
        match criterion.parse::<Criterion>() {
            Err(error) => problems.push(Problem::error(Rule::InvalidCriterion, path, error.to_string())),
            // A warning, not an error: the task still runs and reports every
            // metric; only this criterion is reported as not met.
            Ok(parsed) => {
                if let Some(reason) = parsed.never_met_because() {
                    let hint = match metric_kind(&parsed.metric) {
                        Some(_) => String::new(),
                        None => format!(
                            "; use one of: {}.{}",
                            list(CRITERION_METRICS.iter().map(|(m, _)| *m), 8),
                            suggestion(&parsed.metric, CRITERION_METRICS.iter().map(|(m, _)| *m))
                        ),
                    };
                    problems.push(Problem::warning(
                        Rule::InvalidCriterion,
                        path,
                        format!("success criterion {criterion:?}: {reason}{hint}"),
                    ));
                } else if let Some(reason) = parsed.count_against_a_fraction() {
                    problems.push(Problem::warning(
                        Rule::InvalidCriterion,
                        path,
                        format!("success criterion {criterion:?}: {reason}"),
                    ));
                }
            }
        }
    }

    // Every run computes all of its metrics: a name here that no run
    // reports (a typo) would never show, and the run would not say so.
    let metrics = &task.evaluation.metrics;
    for (index, metric) in metrics.iter().enumerate() {
        let path = format!("spec.evaluation.metrics[{index}]");
        let known = CRITERION_METRICS.iter().map(|(m, _)| *m);
        if let Some(first) = metrics[..index].iter().position(|m| m == metric) {
            problems.push(Problem::warning(
                Rule::UnknownMetric,
                path,
                format!("metric {metric:?} repeats evaluation.metrics[{first}]; name each metric once"),
            ));
        } else if metric_kind(metric).is_none() {
            problems.push(Problem::warning(
                Rule::UnknownMetric,
                path,
                format!(
                    "{metric:?} is not a metric any run reports, so it never shows; use one of: {}.{}",
                    list(known.clone(), 8),
                    suggestion(metric, known)
                ),
            ));
        }
    }

    if let Some(pipeline) = &task.data_pipeline {
        if pipeline.source.trim().is_empty() {
            problems.push(Problem::error(
                Rule::InvalidManifest,
                "spec.dataPipeline.source",
                "the source is empty; give an s3:// URI or a path",
            ));
        }
        check_s3(&mut problems, "spec.dataPipeline.source", &pipeline.source, true);
        if pipeline.batch_size == Some(0) {
            problems.push(Problem::error(
                Rule::OutOfRange,
                "spec.dataPipeline.batchSize",
                "the batch size is 0; use a positive batch size",
            ));
        }
        if let Some(timeout) = pipeline.record_timeout {
            super::sandbox::check_duration(&mut problems, "spec.dataPipeline.recordTimeout", timeout);
        }
        if let Some(preprocessor) = &pipeline.preprocessor {
            check_preprocessor(&mut problems, preprocessor);
        }
    }
    check_training(task, &mut problems);

    // Evaluation.
    let test_set_path = task.evaluation.test_set.trim();
    if test_set_path.is_empty() {
        problems.push(Problem::error(
            Rule::InvalidEvaluation,
            "spec.evaluation.testSet",
            "the test set is empty; give a JSONL file (s3://bucket/tests.jsonl or a path)",
        ));
    } else {
        check_s3(&mut problems, "spec.evaluation.testSet", test_set_path, false);
        if test_set_path.ends_with('/') {
            problems.push(Problem::error(
                Rule::InvalidEvaluation,
                "spec.evaluation.testSet",
                "the test set must be a JSONL file, not a prefix or directory",
            ));
        } else if !(test_set_path.ends_with(".jsonl") || test_set_path.ends_with(".json")) {
            problems.push(Problem::warning(
                Rule::InvalidEvaluation,
                "spec.evaluation.testSet",
                format!("{test_set_path:?} does not end in .jsonl; test sets are JSONL, one episode per line (CSV is not read)"),
            ));
        }
    }
    let loaded_test_set;
    let mut test_set = ctx.test_set;
    if test_set.is_none()
        && !test_set_path.is_empty()
        && let Some(file) = ctx.local_file(test_set_path)
    {
        match TestSet::load(&file) {
            Ok(set) => {
                loaded_test_set = set;
                test_set = Some(&loaded_test_set);
            }
            // At the field that names it, as a missing scripted policy is
            // (its rows' problems are at their own file:line).
            Err(crate::testset::TestSetLoadError::Io { path, source }) => problems.push(Problem::error(
                Rule::MissingFile,
                "spec.evaluation.testSet",
                format!("cannot read the test set {path}: {source}"),
            )),
            Err(error) => problems.extend(error.to_report()),
        }
    }

    check_policy(task, ctx, &mut problems);

    // Shards.
    if task.shards == Some(0) {
        problems.push(Problem::error(
            Rule::InvalidShards,
            "spec.shards",
            "shards is 0; a variant needs at least 1 shard (remove it for the default of 1)",
        ));
    }
    if let Some(shards) = task.shards.filter(|s| *s > MAX_SHARDS) {
        problems.push(Problem::error(
            Rule::InvalidShards,
            "spec.shards",
            format!(
                "shards is {shards}, more than {MAX_SHARDS}: an Indexed Job of more completions needs settings Basecamp does not make; split the test set into tasks"
            ),
        ));
    }
    if task.parallelism == Some(0) {
        problems.push(Problem::error(
            Rule::InvalidShards,
            "spec.parallelism",
            "parallelism is 0, so no shard would ever run; remove it (all shards at once) or set 1 or more",
        ));
    }
    if let Some(parallelism) = task.parallelism
        && parallelism > task.shards()
        && task.shards() > 0
    {
        problems.push(Problem::warning(
            Rule::InvalidShards,
            "spec.parallelism",
            format!(
                "parallelism {parallelism} is more than shards ({}); only {} pods can run at once",
                task.shards(),
                task.shards()
            ),
        ));
    }
    if let Some(set) = test_set
        && task.shards() as usize > set.len()
        && !set.is_empty()
    {
        problems.push(Problem::warning(
            Rule::InvalidShards,
            "spec.shards",
            format!(
                "{} shards for {} episodes: {} shards will be empty",
                task.shards(),
                set.len(),
                task.shards() as usize - set.len()
            ),
        ));
    }

    // Traces, redaction, queue.
    if let Some(traces) = &task.traces {
        if let Some(destination) = &traces.destination {
            if destination.trim().is_empty() {
                problems.push(Problem::error(
                    Rule::InvalidTraces,
                    "spec.traces.destination",
                    "the destination is empty; give s3://bucket/prefix or a directory, or remove it",
                ));
            }
            check_s3(&mut problems, "spec.traces.destination", destination, false);
        }
        if traces.retention_days == Some(0) {
            problems.push(Problem::warning(
                Rule::InvalidTraces,
                "spec.traces.retentionDays",
                "retentionDays 0 lets the next cleanup delete every trace; remove it to keep traces",
            ));
        }
    }
    if let Some(redaction) = &task.redaction {
        for (index, field) in redaction.pii_fields.iter().enumerate() {
            if field.trim().is_empty() {
                problems.push(Problem::error(
                    Rule::InvalidManifest,
                    format!("spec.redaction.piiFields[{index}]"),
                    "the field name is empty",
                ));
            }
        }
    }
    if let Some(queue) = &task.queue_name {
        check_queue_name(&mut problems, queue);
    }

    let mut report = Report::new();
    super::push_all(&mut report, &label, problems);
    check_sandbox_refs(task, sandboxes, ctx, test_set, &label, &mut report);
    report
}

/// A LocalQueue is an object (a subdomain name), and its name also goes on
/// every pod as the label `kueue.x-k8s.io/queue-name`, whose values are at
/// most 63 characters.
fn check_queue_name(problems: &mut Vec<Problem>, queue: &str) {
    let why = match dns_subdomain_violation(queue) {
        Some(why) => why,
        None if queue.len() > 63 => format!(
            "it is {} characters, and pods carry it as the label kueue.x-k8s.io/queue-name, at most 63",
            queue.chars().count()
        ),
        None => return,
    };
    problems.push(Problem::error(
        Rule::InvalidName,
        "spec.queueName",
        format!("{queue:?} is not a Kueue LocalQueue name: {why}"),
    ));
}

/// Refuses a preprocessor that `basecamp data preprocess` (the trainer's
/// dataset step) would refuse, by the same parser: found here, not when the
/// trainer pod fails after the evaluation has run.
fn check_preprocessor(problems: &mut Vec<Problem>, preprocessor: &str) {
    let Err(error) = preprocessor.parse::<Preprocessor>() else { return };
    let advice = match error {
        PreprocessorSyntaxError::Unknown(_) => match Preprocessor::from_python_path(preprocessor) {
            Some(python) => format!("; for the Python function write {python}"),
            None => String::new(),
        },
        PreprocessorSyntaxError::UnclosedQuote(_) => "; quote as a shell does".into(),
    };
    problems.push(Problem::error(
        Rule::InvalidPreprocessor,
        "spec.dataPipeline.preprocessor",
        format!("{error}{advice}"),
    ));
}

/// Checks an `s3://` value; `data_pipeline` selects the advice for a query
/// string (the version has its own field there).
fn check_s3(problems: &mut Vec<Problem>, path: &str, value: &str, data_pipeline: bool) {
    let value = value.trim();
    if !value.contains("://") && value.to_ascii_lowercase().starts_with("s3:") {
        problems.push(Problem::error(
            Rule::InvalidS3Uri,
            path,
            format!("{value:?} looks like an S3 URI but does not start with s3://"),
        ));
        return;
    }
    match StorageLocation::parse(value) {
        Ok(_) => {}
        Err(S3UriError::Query { query, .. }) => {
            let base = value.split('?').next().unwrap_or(value);
            let version = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("versionId="))
                .map(|v| format!(" (version: {v})"))
                .unwrap_or_default();
            let advice = if data_pipeline {
                format!("use {base:?} as the source and put the version in spec.dataPipeline.version{version}")
            } else {
                format!("use {base:?}; S3 URIs name a bucket and a key only")
            };
            problems.push(Problem::error(
                Rule::S3UriQuery,
                path,
                format!("{value:?} has a query string (?{query}), which S3 URIs cannot carry (\"Invalid S3 URI format\"); {advice}"),
            ));
        }
        Err(error) => problems.push(Problem::error(Rule::InvalidS3Uri, path, error.to_string())),
    }
}

fn check_policy_server(
    server: &crate::task::PolicyServer,
    policy: &crate::task::PolicySpec,
    problems: &mut Vec<Problem>,
) {
    if server.image.trim().is_empty() {
        problems.push(Problem::error(
            Rule::InvalidPolicy,
            "spec.policy.server.image",
            "the policy server needs an image, e.g. vllm/vllm-openai",
        ));
    }
    if server.port == Some(0) {
        problems.push(Problem::error(Rule::OutOfRange, "spec.policy.server.port", "port 0; give the server's port"));
    }
    if server.port == Some(crate::task::SANDBOX_METRICS_PORT) {
        problems.push(Problem::error(
            Rule::OutOfRange,
            "spec.policy.server.port",
            format!(
                "port {} is the sandbox's metrics port in the same pod; give the server another (default 8000)",
                crate::task::SANDBOX_METRICS_PORT
            ),
        ));
    }
    if !server.readiness_path().starts_with('/') {
        problems.push(Problem::error(
            Rule::InvalidUrl,
            "spec.policy.server.readinessPath",
            format!("{:?} is not a path; write it as /v1/models", server.readiness_path()),
        ));
    }
    if server.startup_timeout.is_some_and(|d| !d.is_positive()) {
        problems.push(Problem::error(
            Rule::NonPositiveDuration,
            "spec.policy.server.startupTimeout",
            "the startup timeout is not positive; give the time loading the model may take, e.g. 10m",
        ));
    }
    if let Some(timeout) = server.startup_timeout {
        check_not_too_long(problems, "spec.policy.server.startupTimeout", timeout);
    }
    if let Some(endpoint) = &policy.endpoint {
        let local = ["http://127.0.0.1:", "http://localhost:", "http://[::1]:"]
            .iter()
            .any(|p| endpoint.starts_with(&format!("{p}{}", server.port())));
        if !local {
            problems.push(Problem::warning(
                Rule::InvalidPolicy,
                "spec.policy.endpoint",
                format!(
                    "the policy server listens on port {} in the pod, but the endpoint {endpoint} is elsewhere; omit `endpoint` to call the server",
                    server.port()
                ),
            ));
        }
    }
}

fn check_training(task: &HarnessTaskSpec, problems: &mut Vec<Problem>) {
    let Some(training) = &task.training_config else { return };
    if let Some(resume_from) = &training.resume_from {
        check_s3(problems, "spec.trainingConfig.resumeFrom", resume_from, false);
        if crate::task::parse_checkpoint_step(resume_from).is_none() {
            problems.push(Problem::warning(
                Rule::InvalidManifest,
                "spec.trainingConfig.resumeFrom",
                format!(
                    "{resume_from:?} does not end in step-N/, so no step is known to be done: every checkpoint \
                     the trainer writes is evaluated, earlier ones included; name the checkpoint directory \
                     (e.g. s3://BUCKET/checkpoints/step-1000/)"
                ),
            ));
        }
    }
    if let Some(checkpoints) = &training.checkpoints {
        check_s3(problems, "spec.trainingConfig.checkpoints", checkpoints, false);
    }
    if training.completion_marker.as_deref().is_some_and(|m| m.is_empty() || m.contains('/')) {
        problems.push(Problem::error(
            Rule::InvalidManifest,
            "spec.trainingConfig.completionMarker",
            "the completion marker is an object name inside step-N/, without '/', e.g. COMPLETE",
        ));
    }
    if training.max_concurrent_evaluations == Some(0) {
        problems.push(Problem::error(
            Rule::OutOfRange,
            "spec.trainingConfig.maxConcurrentEvaluations",
            "0 evaluations at once would never evaluate a checkpoint; use 1 or more",
        ));
    }
    if training.gpus == Some(0) {
        problems.push(Problem::warning(
            Rule::InvalidGpu,
            "spec.trainingConfig.gpus",
            "gpus: 0 requests no GPU; omit it for a CPU trainer",
        ));
    }
    if training.image.as_deref().is_some_and(|i| i.trim().is_empty()) {
        problems.push(Problem::error(
            Rule::InvalidManifest,
            "spec.trainingConfig.image",
            "the trainer image is empty; give the image the trainer runs in, or leave trainingConfig out to evaluate \
             without training",
        ));
        return;
    }
    if training.image.is_none() {
        if !training.command.is_empty() {
            problems.push(Problem::error(
                Rule::InvalidManifest,
                "spec.trainingConfig.command",
                "a trainer command needs the `image` it runs in",
            ));
        }
        return;
    }
    let destination = task.traces.as_ref().and_then(|t| t.destination.as_deref());
    if training.checkpoints.is_none() && destination.is_none() {
        problems.push(Problem::error(
            Rule::InvalidTraces,
            "spec.trainingConfig.checkpoints",
            "the trainer needs a checkpoint location: set trainingConfig.checkpoints or traces.destination (s3://...)",
        ));
    }
}

fn check_policy(task: &HarnessTaskSpec, ctx: &ValidationContext<'_>, problems: &mut Vec<Problem>) {
    let policy = &task.policy;
    let served = policy.endpoint.is_some() || policy.server.is_some();
    match (served, &policy.scripted) {
        (false, None) => problems.push(Problem::error(
            Rule::InvalidPolicy,
            "spec.policy",
            "the policy needs an `endpoint` (an OpenAI-compatible URL), a `server` run in the pod, or `scripted` (a JSONL file of responses)",
        )),
        (true, Some(_)) => problems.push(Problem::error(
            Rule::InvalidPolicy,
            "spec.policy",
            "set either `endpoint`/`server` or `scripted`, not both",
        )),
        _ => {}
    }
    if let Some(server) = &policy.server {
        check_policy_server(server, policy, problems);
    }
    if let Some(endpoint) = &policy.effective_endpoint() {
        let rest = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("https://"));
        if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) || endpoint.chars().any(char::is_whitespace) {
            problems.push(Problem::error(
                Rule::InvalidUrl,
                "spec.policy.endpoint",
                format!("{endpoint:?} is not an http(s) URL, e.g. http://localhost:8000/v1"),
            ));
        }
        if policy.model.as_deref().is_none_or(|m| m.trim().is_empty()) {
            problems.push(Problem::error(
                Rule::InvalidPolicy,
                "spec.policy.model",
                "an endpoint needs a `model` (the name the server serves, e.g. the vLLM --served-model-name)",
            ));
        }
    }
    let key_sources: Vec<&str> = [
        policy.api_key_secret.as_ref().map(|_| "apiKeySecret"),
        policy.api_key_env.as_ref().map(|_| "apiKeyEnv"),
        policy.api_key_file.as_ref().map(|_| "apiKeyFile"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if key_sources.len() > 1 {
        problems.push(Problem::error(
            Rule::InvalidPolicy,
            "spec.policy",
            format!("the API key comes from one place; remove all but one of {}", key_sources.join(", ")),
        ));
    }
    if let Some(secret) = &policy.api_key_secret
        && let Some(why) = dns_subdomain_violation(&secret.name)
    {
        problems.push(Problem::error(
            Rule::InvalidName,
            "spec.policy.apiKeySecret.name",
            format!("{:?} is not a Secret name: {why}", secret.name),
        ));
    }
    if let Some(temperature) = policy.temperature
        && !(0.0..=2.0).contains(&temperature)
    {
        problems.push(Problem::error(
            Rule::OutOfRange,
            "spec.policy.temperature",
            format!("temperature {temperature} is outside 0-2"),
        ));
    }
    if let Some(top) = policy.top_logprobs
        && top > 20
    {
        problems.push(Problem::error(
            Rule::OutOfRange,
            "spec.policy.topLogprobs",
            format!("topLogprobs {top} is more than the 20 OpenAI-compatible servers return"),
        ));
    }
    if policy.max_tokens == Some(0) {
        problems.push(Problem::error(
            Rule::OutOfRange,
            "spec.policy.maxTokens",
            "maxTokens 0 allows no output; remove it or set a positive number",
        ));
    }
    if let Some(timeout) = policy.request_timeout
        && !timeout.is_positive()
    {
        problems.push(Problem::error(
            Rule::NonPositiveDuration,
            "spec.policy.requestTimeout",
            format!("the duration is {timeout}; it must be greater than zero (e.g. \"60s\")"),
        ));
    }
    if let Some(timeout) = policy.request_timeout {
        check_not_too_long(problems, "spec.policy.requestTimeout", timeout);
    }
    if let Some(timeout) = policy.outage_timeout {
        check_outage_timeout(policy, timeout, problems);
    }
    if let Some(scripted) = &policy.scripted
        && let Some(file) = ctx.local_file(scripted)
        && !file.is_file()
    {
        problems.push(Problem::error(
            Rule::MissingFile,
            "spec.policy.scripted",
            format!("the scripted policy {} does not exist", file.display()),
        ));
    }
}

fn check_outage_timeout(
    policy: &crate::task::PolicySpec,
    timeout: crate::duration::Duration,
    problems: &mut Vec<Problem>,
) {
    const FIELD: &str = "spec.policy.outageTimeout";
    if timeout.as_millis() < 0 {
        problems.push(Problem::error(
            Rule::NonPositiveDuration,
            FIELD,
            format!("the duration is {timeout}; give how long to wait for the endpoint, or 0s to give up at once"),
        ));
    }
    check_not_too_long(problems, FIELD, timeout);
    let unused = if policy.server.is_some() {
        Some("a policy server's outage is waited for up to spec.policy.server.startupTimeout")
    } else if policy.scripted.is_some() {
        Some("a scripted policy has no endpoint to wait for")
    } else {
        None
    };
    if let Some(why) = unused {
        problems.push(Problem::warning(
            Rule::InvalidPolicy,
            FIELD,
            format!("outageTimeout applies to an endpoint without a server and is not used here: {why}"),
        ));
    }
}

fn check_sandbox_refs(
    task: &HarnessTaskSpec,
    sandboxes: &[(&str, &SandboxConfigSpec)],
    ctx: &ValidationContext<'_>,
    test_set: Option<&TestSet>,
    label: &str,
    report: &mut Report,
) {
    let mut own: Vec<Problem> = Vec::new();
    let mut others = Report::new();
    match (&task.sandbox_ref, task.variants.is_empty()) {
        (None, true) => own.push(Problem::error(
            Rule::InvalidSandboxRef,
            "spec.sandboxRef",
            "the task names no sandbox: set sandboxRef {name: <SandboxConfig>} or two variants",
        )),
        (Some(_), false) => own.push(Problem::error(
            Rule::InvalidSandboxRef,
            "spec.sandboxRef",
            "set sandboxRef or variants, not both; with variants each variant names its own sandboxRef",
        )),
        _ => {}
    }
    if task.variants.len() > 2 {
        own.push(Problem::error(
            Rule::TooManyVariants,
            "spec.variants",
            format!(
                "{} variants; an A/B test compares two — move the others into another HarnessTask",
                task.variants.len()
            ),
        ));
    }
    let mut first_index: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, variant) in task.variants.iter().enumerate() {
        let path = format!("spec.variants[{index}].name");
        if let Some(first) = first_index.get(variant.name.as_str()) {
            own.push(Problem::error(
                Rule::DuplicateVariant,
                &path,
                format!(
                    "variant name {:?} is also used by spec.variants[{first}]; variant names must differ",
                    variant.name
                ),
            ));
        } else {
            first_index.insert(&variant.name, index);
        }
        if !is_dns_label(&variant.name) {
            own.push(Problem::error(
                Rule::InvalidName,
                &path,
                format!("variant name {:?} must be a DNS label (lowercase letters, digits and '-'); it is used in Job names", variant.name),
            ));
        }
    }

    let refs: Vec<(String, &crate::task::SandboxRef)> = if task.variants.is_empty() {
        task.sandbox_ref.iter().map(|r| ("spec.sandboxRef".to_string(), r)).collect()
    } else {
        task.variants
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("spec.variants[{i}].sandboxRef"), &v.sandbox_ref))
            .collect()
    };
    // Each name once: a SandboxConfig defined twice is its own error (DuplicateObject).
    let mut available: Vec<&str> = Vec::new();
    for (name, _) in sandboxes {
        if !available.contains(name) {
            available.push(name);
        }
    }
    for (path, sandbox_ref) in refs {
        let Some((name, spec)) = sandboxes.iter().find(|(name, _)| *name == sandbox_ref.name) else {
            own.push(Problem::error(
                Rule::UnknownSandbox,
                format!("{path}.name"),
                format!(
                    "SandboxConfig {:?} not found (available: {}); create it in the task's namespace (or the same manifest) or fix the name.{}",
                    sandbox_ref.name,
                    list(&available, 8),
                    suggestion(&sandbox_ref.name, available.iter().copied())
                ),
            ));
            continue;
        };
        if let Some(profile) = &sandbox_ref.profile
            && !spec.profiles.contains_key(profile)
        {
            own.push(Problem::error(
                Rule::UnknownProfile,
                format!("{path}.profile"),
                format!(
                    "profile {profile:?} is not defined in SandboxConfig {name:?} (profiles: {}).{}",
                    list(spec.profiles.keys(), 8),
                    suggestion(profile, spec.profiles.keys().map(String::as_str))
                ),
            ));
            others.extend(super::sandbox::check(name, spec, None, ctx));
            continue;
        }
        others.extend(super::sandbox::check(name, spec, sandbox_ref.profile.as_deref(), ctx));
        let Ok(resolved) = resolve_profile(spec, sandbox_ref.profile.as_deref()) else { continue };
        let sandbox_label = match &sandbox_ref.profile {
            Some(profile) => format!("SandboxConfig/{name} (profile {profile})"),
            None => format!("SandboxConfig/{name}"),
        };
        let tools: BTreeSet<&str> = resolved.tools.keys().map(String::as_str).collect();
        for tool in task.evaluation.compare_args.keys() {
            if !tools.contains(tool.as_str()) {
                own.push(Problem::error(
                    Rule::UndefinedTool,
                    key_path("spec.evaluation.compareArgs", tool),
                    format!(
                        "compareArgs names tool {tool:?}, which {sandbox_label} does not define (defined: {}).{}",
                        list(&tools, 8),
                        suggestion(tool, tools.iter().copied())
                    ),
                ));
            }
        }
        if let Some(set) = test_set {
            check_expected_tools(set, &tools, &sandbox_label, &mut others);
        }
        // The plan step's clock runs while the policy answers (then its tool calls).
        let (request, step) = (task.policy.request_timeout(), resolved.plan_step_timeout());
        if task.policy.endpoint.is_some() && step.is_positive() && request > step {
            let set = if task.policy.request_timeout.is_some() { "" } else { ", the default" };
            let warning = format!(
                "the policy may take up to {request} to answer (spec.policy.requestTimeout{set}), but a plan step, \
                 the policy's answer and then its tool calls, ends after {step} ({sandbox_label} \
                 spec.planStepTimeout): a slower answer ends the episode as plan_step_timeout, not as the policy's \
                 timeout; raise planStepTimeout above requestTimeout, or lower requestTimeout"
            );
            if !own.iter().any(|p| p.message == warning) {
                own.push(Problem::warning(Rule::TimeoutExceedsStep, "spec.policy.requestTimeout", warning));
            }
        }
    }
    super::push_all(report, label, own);
    report.extend(others);
}

/// One problem per undefined tool named in the test set's expected calls,
/// at the first line that names it.
fn check_expected_tools(set: &TestSet, tools: &BTreeSet<&str>, sandbox_label: &str, report: &mut Report) {
    let mut lines_of: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for episode in &set.episodes {
        for call in &episode.expected_tool_calls {
            if !tools.contains(call.name.as_str()) {
                lines_of.entry(call.name.as_str()).or_default().push(episode.line);
            }
        }
    }
    for (tool, lines) in lines_of {
        let also = if lines.len() > 1 {
            format!(" (also at lines {})", list(lines.iter().skip(1).map(u64::to_string), 5))
        } else {
            String::new()
        };
        report.push(Problem {
            severity: Severity::Error,
            rule: Rule::UndefinedTool,
            object: None,
            location: Location::line(set.name.clone(), lines[0]),
            message: format!(
                "expected_tool_calls names tool {tool:?}{also}, which {sandbox_label} does not define (defined: {}); \
                 fix the test set or define the tool.{}",
                list(tools, 8),
                suggestion(tool, tools.iter().copied())
            ),
        });
    }
}
