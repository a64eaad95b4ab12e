//! Tests of the validation rules: one test (at least) per rule, each
//! asserting the rule, the field path and the words a user searches for.

use serde_json::json;

use super::*;
use crate::problem::{Location, Rule, Severity};

fn sandbox(value: serde_json::Value) -> SandboxConfigSpec {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("sandbox spec: {e}"))
}

fn task(value: serde_json::Value) -> HarnessTaskSpec {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("task spec: {e}"))
}

/// A sandbox with two tools and nothing wrong.
fn good_sandbox() -> serde_json::Value {
    json!({
        "tools": {
            "track_order": {
                "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
                "http": {"url": "http://127.0.0.1:8080/orders/{{order_id}}"}
            },
            "refund": {"exec": {"command": ["python3", "refund.py"]}}
        },
        "toolTimeouts": {"default": "800ms", "track_order": "2s"},
        "fallbacks": {"track_order": {"observation": {"status": "unknown"}, "memoryPatch": {"shipping_status": "pending"}}},
        "profiles": {"dev": {"trace": {"level": "full"}}}
    })
}

/// A task with nothing wrong, referencing `shop`.
fn good_task() -> serde_json::Value {
    json!({
        "taskDefinition": {"successCriteria": ["tool_call_accuracy >= 0.9", "avg_resolution_time < 90s"]},
        "dataPipeline": {"source": "s3://ds-logs/ecommerce-v3/", "version": "abc123"},
        "evaluation": {"testSet": "s3://ds-eval/tests.jsonl", "compareArgs": {"track_order": ["order_id"]}},
        "policy": {"endpoint": "http://localhost:8000/v1", "model": "m", "requestTimeout": "2s"},
        "sandboxRef": {"name": "shop", "profile": "dev"},
        "shards": 2
    })
}

fn with(mut base: serde_json::Value, patch: serde_json::Value) -> serde_json::Value {
    crate::profile::merge_patch(&mut base, &patch);
    base
}

fn check_task(task_value: serde_json::Value, sandbox_value: serde_json::Value) -> Report {
    let spec = sandbox(sandbox_value);
    validate_task(
        &task(task_value),
        &[("shop", &spec)],
        &ValidationContext { task_name: Some("t"), ..Default::default() },
    )
}

fn check_sandbox(value: serde_json::Value) -> Report {
    validate_sandbox("shop", &sandbox(value), &ValidationContext::default())
}

/// The one problem breaking `rule`, asserting there is exactly one.
fn only(report: &Report, rule: Rule) -> Problem {
    let found: Vec<&Problem> = report.by_rule(rule).collect();
    assert_eq!(found.len(), 1, "expected one {rule}, got:\n{report}");
    found[0].clone()
}

fn field(problem: &Problem) -> &str {
    match &problem.location {
        Location::Field(path) => path,
        other => panic!("not a field location: {other:?}"),
    }
}

#[test]
fn the_good_task_and_sandbox_have_no_problems() {
    let report = check_task(good_task(), good_sandbox());
    assert!(report.is_empty(), "{report}");
}

#[test]
fn s3_uri_with_a_query_string_says_to_use_data_pipeline_version() {
    let report = check_task(
        with(good_task(), json!({"dataPipeline": {"source": "s3://bucket/logs/?versionId=abc123"}})),
        good_sandbox(),
    );
    let problem = only(&report, Rule::S3UriQuery);
    assert_eq!(field(&problem), "spec.dataPipeline.source");
    assert_eq!(problem.object.as_deref(), Some("HarnessTask/t"));
    assert!(problem.message.contains("spec.dataPipeline.version (version: abc123)"), "{problem}");
    assert!(problem.message.contains("\"s3://bucket/logs/\""), "{problem}");
}

#[test]
fn s3_query_strings_and_bad_buckets_are_caught_in_every_location_field() {
    let report = check_task(
        with(
            good_task(),
            json!({
                "evaluation": {"testSet": "s3://ds-eval/tests.jsonl?versionId=1"},
                "traces": {"destination": "s3://Bad_Bucket/x"},
                "trainingConfig": {"resumeFrom": "s3://ckpt/last/?x=1"}
            }),
        ),
        good_sandbox(),
    );
    let paths: Vec<&str> = report.by_rule(Rule::S3UriQuery).map(field).collect();
    assert_eq!(paths, ["spec.trainingConfig.resumeFrom", "spec.evaluation.testSet"], "{report}");
    assert_eq!(field(&only(&report, Rule::InvalidS3Uri)), "spec.traces.destination");
}

#[test]
fn another_scheme_and_dot_dot_keys_are_caught_before_a_pod_would_refuse_them() {
    let report = check_task(
        with(
            good_task(),
            json!({
                "traces": {"destination": "gs://traces/x"},
                "trainingConfig": {"resumeFrom": "s3://ckpt/../last/"}
            }),
        ),
        good_sandbox(),
    );
    let problems: Vec<String> =
        report.by_rule(Rule::InvalidS3Uri).map(|p| format!("{}: {}", field(p), p.message)).collect();
    assert_eq!(
        problems,
        [
            "spec.trainingConfig.resumeFrom: \"s3://ckpt/../last/\": the key \"../last/\" has an empty, '.' or '..' \
             segment; write a plain prefix such as s3://BUCKET/traces",
            "spec.traces.destination: \"gs://traces/x\": the gs:// scheme is not supported; write s3://BUCKET/PREFIX \
             or a local path",
        ],
        "{report}"
    );
}

#[test]
fn tools_referenced_but_not_defined_are_errors_wherever_referenced() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({
            "toolTimeouts": {"trak_order": "1s"},
            "fallbacks": {"weather": {"observation": {}}},
            "injections": [{"afterTool": "send_email", "observation": {"type": "system", "content": "x"}}]
        }),
    ));
    let paths: Vec<&str> = report.by_rule(Rule::UndefinedTool).map(field).collect();
    assert_eq!(
        paths,
        ["spec.toolTimeouts.trak_order", "spec.fallbacks.weather", "spec.injections[0].afterTool"],
        "{report}"
    );
    let typo = report.by_rule(Rule::UndefinedTool).next().expect("typo");
    assert!(typo.message.contains("Did you mean \"track_order\"?"), "{typo}");
    assert!(typo.message.contains("defined: refund, track_order"), "{typo}");
}

#[test]
fn undefined_tools_in_compare_args_and_expected_tool_calls_are_errors() {
    let spec = sandbox(good_sandbox());
    let tests = crate::testset::TestSet::parse(
        "tests.jsonl",
        concat!(
            r#"{"id": "1", "instruction": "x", "expected_tool_calls": [{"name": "track_order", "arguments": {}}]}"#,
            "\n",
            r#"{"id": "2", "instruction": "x", "expected_tool_calls": [{"name": "get_weather", "arguments": {}}]}"#,
            "\n",
            r#"{"id": "3", "instruction": "x", "expected_tool_calls": [{"name": "get_weather", "arguments": {}}]}"#,
            "\n",
        ),
    )
    .expect("test set");
    let report = validate_task(
        &task(with(good_task(), json!({"evaluation": {"compareArgs": {"lookup": ["q"]}}}))),
        &[("shop", &spec)],
        &ValidationContext { test_set: Some(&tests), ..Default::default() },
    );
    let problems: Vec<&Problem> = report.by_rule(Rule::UndefinedTool).collect();
    assert_eq!(problems.len(), 2, "{report}");
    assert_eq!(field(problems[0]), "spec.evaluation.compareArgs.lookup");
    assert_eq!(problems[1].location, Location::line("tests.jsonl", 2));
    assert!(problems[1].message.contains("(also at lines 3)"), "{}", problems[1]);
    assert!(problems[1].message.contains("SandboxConfig/shop (profile dev)"), "{}", problems[1]);
}

#[test]
fn recorded_fixtures_naming_undefined_tools_are_errors_with_file_and_line() {
    let dir = std::env::temp_dir().join(format!("basecamp-api-fixture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    std::fs::write(
        dir.join("faq.jsonl"),
        "{\"tool\": \"faq\", \"observation\": 1}\n{\"tool\": \"faq_search\", \"observation\": 2}\n",
    )
    .expect("write");
    let spec = sandbox(json!({"tools": {"faq": {"recorded": {"fixture": "faq.jsonl"}}}}));
    let report = validate_sandbox("shop", &spec, &ValidationContext { base_dir: Some(&dir), ..Default::default() });
    let problem = only(&report, Rule::UndefinedTool);
    match &problem.location {
        Location::File { file, line, .. } => {
            assert!(file.ends_with("faq.jsonl"), "{file}");
            assert_eq!(*line, Some(2));
        }
        other => panic!("{other:?}"),
    }
    let missing = sandbox(json!({"tools": {"faq": {"recorded": {"fixture": "nope.jsonl"}}}}));
    let report = validate_sandbox("shop", &missing, &ValidationContext { base_dir: Some(&dir), ..Default::default() });
    only(&report, Rule::MissingFile);
    std::fs::remove_dir_all(&dir).ok();
}

/// A fixture entry that writes or removes the empty memory key is a warning
/// at its line (before: nothing until a run reached it). Not an error: a
/// fixture records what a tool answered, a buggy answer included, and a
/// replay refuses that write as the run did.
#[test]
fn a_fixture_entry_with_the_empty_memory_key_is_a_warning_at_its_line() {
    let dir = std::env::temp_dir().join(format!("basecamp-api-empty-key-fixture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    std::fs::write(
        dir.join("faq.jsonl"),
        "{\"tool\": \"faq\", \"observation\": 1, \"memoryPatch\": {\"eta\": 1}}\n\
         {\"tool\": \"faq\", \"observation\": 1, \"memoryPatch\": {\"\": 1}}\n\
         {\"tool\": \"faq\", \"observation\": 1, \"memoryRemove\": [\"eta\", \"\"]}\n",
    )
    .unwrap();
    let spec = sandbox(json!({"tools": {"faq": {"recorded": {"fixture": "faq.jsonl"}}}}));
    let ctx = ValidationContext { base_dir: Some(&dir), ..Default::default() };
    let report = validate_sandbox("shop", &spec, &ctx);
    std::fs::remove_dir_all(&dir).ok();
    let found: Vec<String> = report.by_rule(Rule::InvalidFixture).map(ToString::to_string).collect();
    assert_eq!(found.len(), 2, "{report}");
    assert!(report.by_rule(Rule::InvalidFixture).all(|p| p.severity == Severity::Warning), "{report}");
    assert!(
        found[0].contains("faq.jsonl:2") && found[0].contains("memoryPatch writes the empty memory key"),
        "{found:?}"
    );
    assert!(found[1].contains("faq.jsonl:3") && found[1].contains("memoryRemove[1] removes the empty"), "{found:?}");
}

#[test]
fn a_fixture_several_tools_answer_from_is_read_once_and_its_problems_reported_once() {
    let dir = std::env::temp_dir().join(format!("basecamp-api-shared-fixture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    std::fs::write(dir.join("shared.jsonl"), "{\"tool\": \"a\", \"observation\": 1}\n{\"tool\": \"zz\"}\n")
        .expect("write");
    let ctx = ValidationContext { base_dir: Some(&dir), ..Default::default() };
    let file_problems = |tools: &[&str]| -> Vec<String> {
        let tools: serde_json::Map<String, serde_json::Value> =
            tools.iter().map(|t| (t.to_string(), json!({"recorded": {"fixture": "shared.jsonl"}}))).collect();
        let report = validate_sandbox("shop", &sandbox(json!({"tools": tools})), &ctx);
        report
            .problems()
            .iter()
            .filter(|p| matches!(p.location, Location::File { .. }))
            .map(|p| p.to_string())
            .collect()
    };
    let one = file_problems(&["a"]);
    // The undefined tool on line 2.
    assert_eq!(one.len(), 1, "{one:#?}");
    assert!(one.iter().any(|p| p.contains("\"zz\"")), "{one:#?}");
    let three = file_problems(&["a", "b", "c"]);
    assert_eq!(three.len(), 1, "{three:#?}");
    assert!(three[0].contains("(defined: a, b, c)"), "{three:#?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn zero_and_negative_durations_are_errors_with_their_paths() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"toolTimeouts": {"default": 0, "refund": "-1s"}, "planStepTimeout": "0s"}),
    ));
    let paths: Vec<&str> = report.by_rule(Rule::NonPositiveDuration).map(field).collect();
    assert_eq!(paths, ["spec.toolTimeouts.default", "spec.toolTimeouts.refund", "spec.planStepTimeout"], "{report}");
    let report = check_task(with(good_task(), json!({"policy": {"requestTimeout": "-5s"}})), good_sandbox());
    assert_eq!(field(&only(&report, Rule::NonPositiveDuration)), "spec.policy.requestTimeout");
}

#[test]
fn durations_longer_than_seven_days_are_errors_with_their_paths() {
    // Before: accepted; i64::MAX ms made timers that never fire (292 million years).
    let huge = i64::MAX;
    let report = check_sandbox(with(
        good_sandbox(),
        json!({
            "toolTimeouts": {"default": huge, "refund": "169h"},
            "planStepTimeout": huge,
            "tools": {"track_order": {"http": {"retry": {"attempts": 3, "backoff": "8000h"}}}},
            "services": {"db": {"command": ["db"], "readyTimeout": "604800001"}}
        }),
    ));
    let problems: Vec<&Problem> = report.by_rule(Rule::OutOfRange).collect();
    let paths: Vec<&str> = problems.iter().map(|p| field(p)).collect();
    assert_eq!(
        paths,
        [
            "spec.tools.track_order.http.retry.backoff",
            "spec.services.db.readyTimeout",
            "spec.toolTimeouts.default",
            "spec.toolTimeouts.refund",
            "spec.planStepTimeout"
        ],
        "{report}"
    );
    assert_eq!(
        problems[4].message,
        format!(
            "the duration is {huge}ms, longer than 168h (7 days), the most a duration in a spec may be; give a shorter one (a bare number counts milliseconds)"
        )
    );
    let bare = check_sandbox(good_sandbox().tap(|v| v["toolTimeouts"] = json!(huge)));
    assert_eq!(field(&only(&bare, Rule::OutOfRange)), "spec.toolTimeouts");
    let report = check_task(
        with(
            good_task(),
            json!({
                "policy": {"requestTimeout": "200h", "server": {"image": "vllm", "startupTimeout": "169h"}},
                "dataPipeline": {"source": "s3://ds-logs/v3/", "recordTimeout": "200h"}
            }),
        ),
        good_sandbox(),
    );
    let paths: Vec<&str> = report.by_rule(Rule::OutOfRange).map(field).collect();
    assert_eq!(
        paths,
        ["spec.dataPipeline.recordTimeout", "spec.policy.server.startupTimeout", "spec.policy.requestTimeout"],
        "{report}"
    );
    // A preprocessor with no time to answer is an error too.
    let report = check_task(
        with(good_task(), json!({"dataPipeline": {"source": "s3://ds-logs/v3/", "recordTimeout": "0s"}})),
        good_sandbox(),
    );
    assert_eq!(field(&only(&report, Rule::NonPositiveDuration)), "spec.dataPipeline.recordTimeout");
    // Exactly the bound is fine.
    let report = check_sandbox(with(good_sandbox(), json!({"planStepTimeout": "168h"})));
    assert!(report.by_rule(Rule::OutOfRange).next().is_none(), "{report}");
}

/// `data preprocess` refuses these when the trainer runs; before, validation
/// let them through (`preprocessor: shipping_delay_filter` in the example).
#[test]
fn a_preprocessor_a_run_would_refuse_is_an_error_naming_the_accepted_forms() {
    let preprocessor =
        |name: &str| check_task(with(good_task(), json!({"dataPipeline": {"preprocessor": name}})), good_sandbox());
    for good in ["builtin:trajectory", "exec:python3 \"my prep.py\" --mode 'a b'", "python:shop.prep.filter"] {
        let report = preprocessor(good);
        assert!(report.is_empty(), "{good}: {report}");
    }
    let forms = "builtin:trajectory, exec:PROGRAM ARGS..., python:module.function";
    for (bad, said) in [
        ("shipping_delay_filter", format!("preprocessor \"shipping_delay_filter\" is not one of {forms}")),
        (
            "shop.prep.filter",
            format!("preprocessor \"shop.prep.filter\" is not one of {forms}; for the Python function write python:shop.prep.filter"),
        ),
        ("exec:", format!("preprocessor \"exec:\" is not one of {forms}")),
        (
            "exec:python3 \"prep.py",
            "preprocessor exec:python3 \"prep.py: its command has an unclosed quote or a trailing backslash; quote as a shell does"
                .to_string(),
        ),
    ] {
        let report = preprocessor(bad);
        let problem = only(&report, Rule::InvalidPreprocessor);
        assert_eq!(field(&problem), "spec.dataPipeline.preprocessor");
        assert_eq!(problem.severity, Severity::Error);
        assert_eq!(problem.message, said);
    }
}

/// Object names (a Secret, a RuntimeClass, a LocalQueue) are subdomains:
/// up to 253 characters with no 63-character limit on a part; a queue name
/// is a pod label too, so at most 63.
#[test]
fn object_names_are_subdomains_and_a_queue_name_is_also_a_label_value() {
    let long = "s".repeat(100);
    let report = check_task(
        with(good_task(), json!({"policy": {"apiKeySecret": {"name": long, "key": "k"}}, "queueName": "q".repeat(63)})),
        good_sandbox(),
    );
    assert!(report.is_empty(), "{report}");
    let report = check_sandbox(with(good_sandbox(), json!({"runtimeClassName": long})));
    assert!(report.is_empty(), "{report}");
    let report = check_task(with(good_task(), json!({"queueName": "q".repeat(64)})), good_sandbox());
    let problem = only(&report, Rule::InvalidName);
    assert_eq!(field(&problem), "spec.queueName");
    assert!(
        problem.message.ends_with(
            "is not a Kueue LocalQueue name: it is 64 characters, and pods carry it as the label kueue.x-k8s.io/queue-name, at most 63"
        ),
        "{problem}"
    );
    let report = check_sandbox(with(good_sandbox(), json!({"runtimeClassName": "gVisor"})));
    assert_eq!(
        only(&report, Rule::InvalidName).message,
        "\"gVisor\" is not a RuntimeClass name: it has 'V'; names have only lowercase letters, digits, '-' and '.'"
    );
}

#[test]
fn a_bare_number_tool_timeout_is_a_warning_that_names_every_tool() {
    let report = check_sandbox(good_sandbox().tap(|v| v["toolTimeouts"] = json!(800)));
    let problem = only(&report, Rule::BareToolTimeout);
    assert_eq!(problem.severity, Severity::Warning);
    assert_eq!(field(&problem), "spec.toolTimeouts");
    assert!(problem.message.contains("applies to EVERY tool (refund, track_order)"), "{problem}");
    assert!(!report.has_errors(), "{report}");
}

#[test]
fn success_criteria_that_do_not_parse_point_at_the_column() {
    let report = check_task(
        with(
            good_task(),
            json!({"taskDefinition": {"successCriteria": ["user_satisfaction_score > 0.85", "avg_resolution_time < 90 seconds", "accuracy => 0.9"]}}),
        ),
        good_sandbox(),
    );
    let problems: Vec<&Problem> =
        report.by_rule(Rule::InvalidCriterion).filter(|p| p.severity == Severity::Error).collect();
    assert_eq!(problems.len(), 2, "{report}");
    assert_eq!(field(problems[0]), "spec.taskDefinition.successCriteria[1]");
    assert!(problems[0].message.contains("column 26"), "{}", problems[0]);
    assert!(problems[0].message.contains("without a space (90s"), "{}", problems[0]);
    assert!(problems[0].message.contains('^'), "{}", problems[0]);
    assert_eq!(field(problems[1]), "spec.taskDefinition.successCriteria[2]");
}

#[test]
fn unknown_sandbox_and_unknown_profile_name_what_exists() {
    let report = check_task(with(good_task(), json!({"sandboxRef": {"name": "shopp"}})), good_sandbox());
    let problem = only(&report, Rule::UnknownSandbox);
    assert_eq!(field(&problem), "spec.sandboxRef.name");
    assert!(
        problem.message.contains("available: shop") && problem.message.contains("Did you mean \"shop\"?"),
        "{problem}"
    );

    let report = check_task(with(good_task(), json!({"sandboxRef": {"profile": "prod"}})), good_sandbox());
    let problem = only(&report, Rule::UnknownProfile);
    assert_eq!(field(&problem), "spec.sandboxRef.profile");
    assert!(problem.message.contains("profiles: dev"), "{problem}");
}

#[test]
fn a_profile_that_breaks_the_spec_is_reported_under_the_profile() {
    let report = check_task(
        good_task(),
        with(good_sandbox(), json!({"profiles": {"dev": {"toolTimeouts": {"default": "0ms"}}}})),
    );
    let problem = only(&report, Rule::NonPositiveDuration);
    assert_eq!(problem.object.as_deref(), Some("SandboxConfig/shop (profile dev)"));
    let report = check_sandbox(with(good_sandbox(), json!({"profiles": {"Prod": {"maxSteps": "many"}}})));
    only(&report, Rule::InvalidName);
    let problem = only(&report, Rule::InvalidProfile);
    assert!(problem.message.contains("spec.maxSteps"), "{problem}");
}

#[test]
fn a_null_in_a_profile_fallback_patch_is_a_warning() {
    let report = check_sandbox(good_sandbox().tap(|v| {
        v["profiles"]["dev"]["fallbacks"] = json!({"track_order": {"memoryPatch": {"shipping_status": null}}});
    }));
    let problem = only(&report, Rule::InvalidProfile);
    assert_eq!(problem.severity, Severity::Warning);
    assert!(problem.message.contains("REMOVES"), "{problem}");
}

#[test]
fn bad_min_compute_capability_is_an_error() {
    for bad in ["8", "eight"] {
        let report =
            check_sandbox(with(good_sandbox(), json!({"gpu": {"required": true, "minComputeCapability": bad}})));
        let problem = only(&report, Rule::InvalidComputeCapability);
        assert_eq!(field(&problem), "spec.gpu.minComputeCapability");
        assert!(problem.message.contains("\"8.0\""), "{problem}");
    }
    let report = check_sandbox(with(good_sandbox(), json!({"gpu": {"minComputeCapability": "8.6", "count": 0}})));
    only(&report, Rule::InvalidGpu);
}

#[test]
fn zero_shards_and_zero_parallelism_are_errors() {
    let report = check_task(with(good_task(), json!({"shards": 0, "parallelism": 0})), good_sandbox());
    let paths: Vec<&str> = report.by_rule(Rule::InvalidShards).map(field).collect();
    assert_eq!(paths, ["spec.shards", "spec.parallelism"], "{report}");
    let report = check_task(with(good_task(), json!({"parallelism": 8})), good_sandbox());
    assert_eq!(only(&report, Rule::InvalidShards).severity, Severity::Warning);
}

#[test]
fn more_than_two_variants_and_duplicate_names_are_errors() {
    let variant = |name: &str| json!({"name": name, "sandboxRef": {"name": "shop"}});
    let report = check_task(
        with(good_task(), json!({"sandboxRef": null, "variants": [variant("a"), variant("b"), variant("a")]})),
        good_sandbox(),
    );
    assert_eq!(field(&only(&report, Rule::TooManyVariants)), "spec.variants");
    let problem = only(&report, Rule::DuplicateVariant);
    assert_eq!(field(&problem), "spec.variants[2].name");
    assert!(problem.message.contains("spec.variants[0]"), "{problem}");
}

#[test]
fn sandbox_ref_and_variants_are_exclusive_and_one_is_needed() {
    let report = check_task(with(good_task(), json!({"sandboxRef": null})), good_sandbox());
    only(&report, Rule::InvalidSandboxRef);
    let report = check_task(
        with(good_task(), json!({"variants": [{"name": "a", "sandboxRef": {"name": "shop"}}]})),
        good_sandbox(),
    );
    only(&report, Rule::InvalidSandboxRef);
    let report = check_task(
        with(good_task(), json!({"sandboxRef": null, "variants": [{"name": "A_1", "sandboxRef": {"name": "shop"}}]})),
        good_sandbox(),
    );
    only(&report, Rule::InvalidName);
}

#[test]
fn tool_definitions_need_exactly_one_kind_and_valid_parts() {
    let report = check_sandbox(json!({
        "tools": {
            "none": {},
            "both": {"http": {"url": "http://x"}, "exec": {"command": ["true"]}},
            "bad name": {"exec": {"command": []}},
            "templ": {"http": {"url": "ftp://x/{{id", "rateLimit": {"requestsPerSecond": 0, "burst": 0}}},
            "patch": {"exec": {"command": ["x"]}, "memoryPatch": {"status": "status"}},
            "default": {"exec": {"command": ["x"]}}
        }
    }));
    assert_eq!(report.by_rule(Rule::InvalidTool).count(), 6, "{report}");
    assert_eq!(report.by_rule(Rule::InvalidName).count(), 2, "{report}");
    only(&report, Rule::InvalidUrl);
    only(&report, Rule::InvalidTemplate);
}

#[test]
fn http_headers_need_a_token_name_and_a_value_without_line_breaks() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"tools": {"track_order": {"http": {"headers": {
            "bad header": "x", "X-Line": "a\nb", "X-Token": "Bearer {{order_id}}\t"
        }}}}}),
    ));
    let paths: Vec<&str> = report.by_rule(Rule::InvalidTool).map(field).collect();
    assert_eq!(
        paths,
        ["spec.tools.track_order.http.headers.X-Line", "spec.tools.track_order.http.headers[\"bad header\"]"],
        "{report}"
    );
}

#[test]
fn template_placeholders_that_are_not_parameters_are_warnings() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"tools": {"track_order": {"http": {"url": "http://x/orders/{{orderid}}"}}}}),
    ));
    let problem = only(&report, Rule::InvalidTemplate);
    assert_eq!(problem.severity, Severity::Warning);
    assert!(problem.message.contains("Did you mean \"order_id\"?"), "{problem}");
    // A call that sends the argument anyway fills it in: the warning does not say it renders empty for good.
    assert!(problem.message.contains("renders empty unless a call sends it anyway"), "{problem}");
}

#[test]
fn fallbacks_that_write_null_follow_the_null_write_policy() {
    // A merge patch cannot set null, so build the value by hand.
    let mut value = good_sandbox();
    value["fallbacks"]["track_order"]["memoryPatch"]["shipping_status"] = serde_json::Value::Null;
    let report = check_sandbox(value.clone());
    let problem = only(&report, Rule::NullMemoryWrite);
    assert_eq!(problem.severity, Severity::Warning);
    assert!(problem.message.contains("shipping_status"), "{problem}");
    value["memory"] = json!({"nullWrites": "error"});
    assert_eq!(only(&check_sandbox(value.clone()), Rule::NullMemoryWrite).severity, Severity::Error);
    value["memory"] = json!({"nullWrites": "allow"});
    assert!(!check_sandbox(value).contains(Rule::NullMemoryWrite));
}

#[test]
fn strict_memory_types_check_fallback_patches() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"memory": {"strictTypes": true, "schema": {"shipping_status": "integer"}}}),
    ));
    only(&report, Rule::InvalidMemoryPolicy);
    let report = check_sandbox(with(good_sandbox(), json!({"memory": {"strictTypes": true}})));
    assert_eq!(only(&report, Rule::InvalidMemoryPolicy).severity, Severity::Warning);
}

#[test]
fn an_empty_memory_key_is_refused_in_a_tool_and_a_fallback_memory_patch() {
    // Before: valid; the run wrote a key named "" and its delta named no key.
    let report = check_sandbox(with(
        good_sandbox(),
        json!({
            "tools": {"track_order": {"memoryPatch": {"": "/status", "eta": "/eta"}}},
            "fallbacks": {"track_order": {"memoryPatch": {"": "pending"}}}
        }),
    ));
    let fields: Vec<&str> = report.by_rule(Rule::InvalidMemoryPolicy).map(field).collect();
    assert_eq!(
        fields,
        ["spec.tools.track_order.memoryPatch[\"\"]", "spec.fallbacks.track_order.memoryPatch[\"\"]"],
        "{report}"
    );
    assert!(report.errors().all(|p| p.message.contains("a memory key cannot be empty")), "{report}");
}

#[test]
fn an_integral_float_in_an_integer_fallback_key_is_an_integer() {
    let strict = json!({"memory": {"strictTypes": true, "schema": {"n": "integer"}}});
    let fallback = |n: serde_json::Value| json!({"fallbacks": {"track_order": {"memoryPatch": {"n": n}}}});
    let whole = check_sandbox(with(with(good_sandbox(), strict.clone()), fallback(json!(2.0))));
    assert!(!whole.contains(Rule::InvalidMemoryPolicy), "{whole}");
    let fraction = check_sandbox(with(with(good_sandbox(), strict), fallback(json!(2.5))));
    only(&fraction, Rule::InvalidMemoryPolicy);
}

#[test]
fn injections_need_one_trigger_and_an_observation() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"injections": [
            {"observation": {"x": 1}},
            {"atStep": 0, "afterTool": "refund", "observation": {"x": 1}},
            {"atStep": 99, "observation": {"x": 1}},
            {"whenMemory": {"key": "", "equals": null}, "observation": null}
        ]}),
    ));
    let errors: Vec<&str> = report.by_rule(Rule::InvalidInjection).map(field).collect();
    assert_eq!(
        errors,
        [
            "spec.injections[0]",
            "spec.injections[1]",
            "spec.injections[1].atStep",
            "spec.injections[2].atStep",
            "spec.injections[3].whenMemory.key",
            "spec.injections[3].observation"
        ],
        "{report}"
    );
}

#[test]
fn reward_schedules_must_name_components_in_increasing_steps() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"rewards": {
            "components": {"correctness": {"weight": 1.0, "source": "tool_call_accuracy"}},
            "weightSchedule": [
                {"atTrainingStep": 100, "weights": {"corectness": 0.5}},
                {"atTrainingStep": 50, "weights": {"correctness": 0.2}}
            ]
        }}),
    ));
    let paths: Vec<&str> = report.by_rule(Rule::InvalidRewards).map(field).collect();
    assert_eq!(
        paths,
        ["spec.rewards.weightSchedule[0].weights.corectness", "spec.rewards.weightSchedule[1].atTrainingStep"]
    );
}

#[test]
fn policy_needs_one_source_a_model_and_sane_numbers() {
    let report = check_task(
        with(
            good_task(),
            json!({"policy": {"endpoint": "localhost:8000", "model": null, "scripted": "p.jsonl", "apiKeyEnv": "K", "apiKeyFile": "/k", "temperature": 3.0, "topLogprobs": 50, "maxTokens": 0}}),
        ),
        good_sandbox(),
    );
    assert_eq!(report.by_rule(Rule::InvalidPolicy).count(), 3, "{report}");
    only(&report, Rule::InvalidUrl);
    assert_eq!(report.by_rule(Rule::OutOfRange).count(), 3, "{report}");
}

#[test]
fn trace_settings_and_timeouts_longer_than_the_step_are_flagged() {
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"trace": {"topK": 50, "errorContext": false}, "planStepTimeout": "1s", "maxSteps": 0, "rollback": {"checkpointEvery": 0}}),
    ));
    assert_eq!(report.by_rule(Rule::InvalidTrace).count(), 2, "{report}");
    let step = only(&report, Rule::TimeoutExceedsStep);
    assert!(step.message.contains("\"track_order\" may run for 2s"), "{step}");
    assert_eq!(report.by_rule(Rule::OutOfRange).count(), 2, "{report}");
}

#[test]
fn a_local_test_set_is_read_when_a_base_dir_is_given() {
    let dir = std::env::temp_dir().join(format!("basecamp-api-local-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    std::fs::write(dir.join("tests.jsonl"), "{\"id\": \"a\", \"instruction\": \"x\"}\n\n{\"instruction\": \"y\"}\n")
        .expect("write");
    let spec = sandbox(good_sandbox());
    let report = validate_task(
        &task(with(good_task(), json!({"evaluation": {"testSet": "tests.jsonl"}}))),
        &[("shop", &spec)],
        &ValidationContext { base_dir: Some(&dir), ..Default::default() },
    );
    let blank = only(&report, Rule::BlankLine);
    assert!(blank.to_string().contains("tests.jsonl:2: blank line in the middle of the test set"), "{blank}");
    only(&report, Rule::MissingId);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_rule_has_a_pascal_case_category() {
    let report = check_task(with(good_task(), json!({"shards": 0})), good_sandbox());
    assert_eq!(report.problems()[0].category(), "InvalidShards");
}

/// `value.tap(|v| ...)`: edit a value in place in an expression.
trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}

impl Tap for serde_json::Value {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}

#[test]
fn a_policy_server_alone_is_a_policy_and_its_endpoint_is_derived() {
    let mut value = good_task();
    value["policy"] = json!({"model": "m", "server": {"image": "vllm/vllm-openai", "port": 8100}});
    let report = check_task(value.clone(), good_sandbox());
    assert!(report.is_empty(), "{report}");
    assert_eq!(task(value).policy.effective_endpoint().as_deref(), Some("http://127.0.0.1:8100/v1"));
}

#[test]
fn a_policy_server_on_the_sandbox_metrics_port_is_refused() {
    let mut value = good_task();
    value["policy"] = json!({"model": "m", "server": {"image": "vllm/vllm-openai", "port": 9464}});
    let messages = check_task(value, good_sandbox()).to_string();
    assert!(messages.contains("spec.policy.server.port"), "{messages}");
    assert!(messages.contains("port 9464 is the sandbox's metrics port"), "{messages}");
}

#[test]
fn a_policy_server_with_a_scripted_policy_or_without_an_image_is_refused() {
    let mut value = good_task();
    value["policy"] = json!({"scripted": "policy.jsonl", "server": {"image": " "}});
    let report = check_task(value, good_sandbox());
    let messages = report.to_string();
    assert!(messages.contains("not both"), "{messages}");
    assert!(messages.contains("spec.policy.server.image"), "{messages}");
}

#[test]
fn a_trainer_needs_a_checkpoint_location_and_positive_concurrency() {
    let report = check_task(
        with(
            good_task(),
            json!({"trainingConfig": {"image": "trainer:1", "maxConcurrentEvaluations": 0, "completionMarker": "a/b"}}),
        ),
        good_sandbox(),
    );
    let messages = report.to_string();
    assert!(messages.contains("spec.trainingConfig.checkpoints"), "{messages}");
    assert!(messages.contains("traces.destination"), "{messages}");
    assert!(messages.contains("spec.trainingConfig.maxConcurrentEvaluations"), "{messages}");
    assert!(messages.contains("spec.trainingConfig.completionMarker"), "{messages}");
}

#[test]
fn a_trainer_command_without_an_image_is_refused() {
    let report =
        check_task(with(good_task(), json!({"trainingConfig": {"command": ["python3", "train.py"]}})), good_sandbox());
    let problem = only(&report, Rule::InvalidManifest);
    assert_eq!(field(&problem), "spec.trainingConfig.command");
}

#[test]
fn a_resume_from_without_a_step_is_a_warning() {
    let training = json!({"trainingConfig": {"image": "trainer:1", "resumeFrom": "s3://ckpt/run/latest/"}});
    let report = check_task(with(good_task(), training), good_sandbox());
    let problem = only(&report, Rule::InvalidManifest);
    assert_eq!((field(&problem), problem.severity), ("spec.trainingConfig.resumeFrom", Severity::Warning));
    assert!(problem.message.contains("does not end in step-N/"), "{problem}");
    let named = json!({"trainingConfig": {"image": "trainer:1", "resumeFrom": "s3://ckpt/run/step-40/"}});
    assert_eq!(check_task(with(good_task(), named), good_sandbox()).by_rule(Rule::InvalidManifest).count(), 0);
}

#[test]
fn a_blank_trainer_image_is_refused_not_ignored() {
    let training = json!({"trainingConfig": {"image": " ", "command": ["python3", "train.py"]}});
    let report = check_task(with(good_task(), training), good_sandbox());
    let problem = only(&report, Rule::InvalidManifest);
    assert_eq!(field(&problem), "spec.trainingConfig.image");
    assert!(problem.message.contains("the trainer image is empty"), "{problem}");
}

#[test]
fn reward_components_must_name_a_source_the_sandbox_scores() {
    // An unknown source is scored 0 on every episode: the component silently does nothing.
    let report = check_sandbox(with(
        good_sandbox(),
        json!({"rewards": {"components": {
            "correctness": {"weight": 1.0, "source": "tool_call_accuracy"},
            "efficiency": {"weight": -0.05, "source": "stepz"},
            "helpfulness": {"weight": 0.5},
            "plan_step_f1": {"weight": 0.2}
        }}}),
    ));
    let problems: Vec<&Problem> = report.by_rule(Rule::InvalidRewards).collect();
    assert_eq!(problems.len(), 2, "{report}");
    assert_eq!(field(problems[0]), "spec.rewards.components.efficiency.source");
    assert!(problems[0].message.contains("\"stepz\""), "{}", problems[0]);
    assert!(problems[0].message.contains("always scores 0"), "{}", problems[0]);
    assert!(problems[0].message.contains("Did you mean \"steps\"?"), "{}", problems[0]);
    assert_eq!(field(problems[1]), "spec.rewards.components.helpfulness");
    assert!(problems[1].message.contains("add `source:`"), "{}", problems[1]);
    assert!(problems[1].message.contains("tool_call_accuracy"), "{}", problems[1]);
    assert_eq!(problems[0].severity, Severity::Error);
}

#[test]
fn success_criteria_that_can_never_be_met_are_warned_about() {
    let criteria = json!({"taskDefinition": {"successCriteria": [
        "tool_call_accuracy >= 0.9",
        "avg_resolution_time < 90s",
        "episodes == 50",
        "tool_call_acuracy >= 0.9",
        "user_satisfaction_score > 0.85",
        "tool_call_accuracy >= 2",
        "error_rate < 0",
        "plan_step_f1 >= 5s",
        "memory_consistency >= 100%"
    ]}});
    let report = check_task(with(good_task(), criteria), good_sandbox());
    let problems: Vec<&Problem> = report.by_rule(Rule::InvalidCriterion).collect();
    let paths: Vec<&str> = problems.iter().map(|p| field(p)).collect();
    assert_eq!(
        paths,
        (3..=7).map(|i| format!("spec.taskDefinition.successCriteria[{i}]")).collect::<Vec<_>>(),
        "{report}"
    );
    assert!(problems.iter().all(|p| p.severity == Severity::Warning), "{report}");
    assert!(problems[0].message.contains("not a metric any run reports"), "{}", problems[0]);
    assert!(problems[0].message.contains("Did you mean \"tool_call_accuracy\"?"), "{}", problems[0]);
    assert!(problems[1].message.contains("\"user_satisfaction_score\""), "{}", problems[1]);
    assert!(problems[2].message.contains("between 0 and 1"), "{}", problems[2]);
    assert!(problems[3].message.contains("between 0 and 1"), "{}", problems[3]);
    assert!(problems[4].message.contains("not a time"), "{}", problems[4]);
}

/// `not_measured_episodes <= 1%` bounds a count by 0.01 (no episode at
/// all), not the share it reads as: validation says so and names the rate.
#[test]
fn a_count_compared_with_a_fraction_is_warned_about() {
    let criteria = json!({"taskDefinition": {"successCriteria": [
        "not_measured_rate <= 1%",
        "not_measured_episodes <= 5",
        "not_measured_episodes <= 1%"
    ]}});
    let report = check_task(with(good_task(), criteria), good_sandbox());
    let problems: Vec<&Problem> = report.by_rule(Rule::InvalidCriterion).collect();
    assert_eq!(problems.len(), 1, "{report}");
    assert_eq!(field(problems[0]), "spec.taskDefinition.successCriteria[2]");
    assert_eq!(problems[0].severity, Severity::Warning);
    assert!(problems[0].message.contains("write `not_measured_rate <= 0.01`"), "{}", problems[0]);
}

#[test]
fn unknown_or_repeated_metrics_and_repeated_criteria_are_warnings() {
    let spec = json!({
        "taskDefinition": {"successCriteria": ["tool_call_accuracy >= 0.9", "tool_call_accuracy >= 0.9 "]},
        "evaluation": {"metrics": ["tool_call_accuracy", "bogus", "plan_step_f2", "tool_call_accuracy"]}
    });
    let report = check_task(with(good_task(), spec), good_sandbox());
    let metrics: Vec<&Problem> = report.by_rule(Rule::UnknownMetric).collect();
    let paths: Vec<&str> = metrics.iter().map(|p| field(p)).collect();
    assert_eq!(paths, ["spec.evaluation.metrics[1]", "spec.evaluation.metrics[2]", "spec.evaluation.metrics[3]"]);
    assert!(metrics.iter().all(|p| p.severity == Severity::Warning), "{report}");
    assert!(metrics[0].message.contains("\"bogus\" is not a metric any run reports"), "{}", metrics[0]);
    assert!(metrics[1].message.contains("Did you mean \"plan_step_f1\"?"), "{}", metrics[1]);
    assert!(metrics[2].message.contains("repeats evaluation.metrics[0]"), "{}", metrics[2]);
    let criteria: Vec<&Problem> = report.by_rule(Rule::InvalidCriterion).collect();
    assert_eq!(criteria.len(), 1, "{report}");
    assert_eq!(field(criteria[0]), "spec.taskDefinition.successCriteria[1]");
    assert!(criteria[0].message.contains("repeats successCriteria[0]"), "{}", criteria[0]);
    assert!(!report.has_errors(), "warnings only: {report}");
}

#[test]
fn checks_sharing_a_fixture_memo_read_the_file_once() {
    let dir = std::env::temp_dir().join(format!("basecamp-api-fixture-memo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    std::fs::write(dir.join("faq.jsonl"), "{\"tool\": \"faq\"}\n{\"tool\": \"zz\"}\n{\"tool\": \"zz\"}\n")
        .expect("write");
    let spec = sandbox(json!({
        "tools": {"faq": {"recorded": {"fixture": "faq.jsonl"}}},
        "profiles": {"dev": {"maxSteps": 3}}
    }));
    let undefined = |report: &Report| -> Vec<String> {
        report.problems().iter().filter(|p| p.rule == Rule::UndefinedTool).map(|p| p.to_string()).collect()
    };
    let memo = FixtureMemo::default();
    let ctx = ValidationContext { base_dir: Some(&dir), fixtures: Some(&memo), ..Default::default() };
    // The base spec and the profile: the undefined tool once, at its first line.
    let alone = undefined(&validate_sandbox("shop", &spec, &ctx));
    assert_eq!(alone.len(), 1, "{alone:#?}");
    assert!(alone[0].contains("faq.jsonl:2") && alone[0].contains("\"zz\""), "{alone:#?}");
    // Gone from disk, the file is still known to the memo: the task's check
    // says what the first read found, so it did not read the file again.
    std::fs::remove_file(dir.join("faq.jsonl")).expect("remove");
    let as_used = validate_task(&task(good_task()), &[("shop", &spec)], &ctx);
    // (good_task's compareArgs name a tool this spec lacks; only the fixture's problem is compared.)
    let from_fixture: Vec<String> = undefined(&as_used).into_iter().filter(|p| p.contains("faq.jsonl")).collect();
    assert_eq!(from_fixture, alone, "{as_used}");
    assert!(as_used.problems().iter().all(|p| p.rule != Rule::MissingFile), "{as_used}");
    // Without the memo, the check reads the file, and says it is missing.
    let unshared = ValidationContext { base_dir: Some(&dir), ..Default::default() };
    let missing = validate_task(&task(good_task()), &[("shop", &spec)], &unshared);
    assert!(missing.problems().iter().any(|p| p.rule == Rule::MissingFile), "{missing}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_local_test_set_that_cannot_be_read_is_at_the_field_that_names_it() {
    // Never created: nothing is read from it but the test set that is not there.
    let dir = std::env::temp_dir().join(format!("basecamp-api-no-test-set-{}", std::process::id()));
    let spec = sandbox(good_sandbox());
    let report = validate_task(
        &task(with(good_task(), json!({"evaluation": {"testSet": "nosuch.jsonl"}}))),
        &[("shop", &spec)],
        &ValidationContext { task_name: Some("t"), base_dir: Some(&dir), ..Default::default() },
    );
    let problem = report
        .problems()
        .iter()
        .find(|p| p.rule == Rule::MissingFile)
        .unwrap_or_else(|| panic!("a missing test set is a problem: {report:?}"));
    assert_eq!(problem.location, Location::Field("spec.evaluation.testSet".into()));
    assert!(problem.message.starts_with("cannot read the test set ") && problem.message.contains("nosuch.jsonl"));
}

/// The plan step's clock runs while the policy answers: a request timeout
/// longer than the step turns a slow model into `plan_step_timeout`
/// rollbacks, which nothing said before a run.
#[test]
fn a_policy_request_timeout_longer_than_the_plan_step_is_a_warning() {
    let defaulted = with(good_task(), json!({"policy": {"requestTimeout": null}}));
    let report = check_task(defaulted.clone(), good_sandbox());
    let problem = only(&report, Rule::TimeoutExceedsStep);
    assert_eq!((field(&problem), problem.severity), ("spec.policy.requestTimeout", Severity::Warning));
    assert!(problem.message.contains("up to 1m to answer (spec.policy.requestTimeout, the default)"), "{report}");
    assert!(
        problem.message.contains("ends after 3s (SandboxConfig/shop (profile dev) spec.planStepTimeout)"),
        "{report}"
    );
    // A step that fits the answer, a timeout that fits the step, a scripted policy: nothing to say.
    let roomy = with(good_sandbox(), json!({"planStepTimeout": "90s"}));
    assert_eq!(check_task(defaulted, roomy).by_rule(Rule::TimeoutExceedsStep).count(), 0);
    assert_eq!(check_task(good_task(), good_sandbox()).by_rule(Rule::TimeoutExceedsStep).count(), 0);
    let scripted = with(good_task(), json!({"policy": {"endpoint": null, "model": null, "scripted": "p.jsonl"}}));
    assert_eq!(check_task(scripted, good_sandbox()).by_rule(Rule::TimeoutExceedsStep).count(), 0);
}

#[test]
fn outage_timeout_is_bounded_and_said_unused_beside_a_server_or_a_script() {
    // An endpoint's: zero (give up at once) and minutes are fine.
    for fine in ["0s", "5m"] {
        let report = check_task(with(good_task(), json!({"policy": {"outageTimeout": fine}})), good_sandbox());
        assert!(report.is_empty(), "{fine}: {report}");
    }
    let report = check_task(with(good_task(), json!({"policy": {"outageTimeout": "-1s"}})), good_sandbox());
    assert_eq!(field(&only(&report, Rule::NonPositiveDuration)), "spec.policy.outageTimeout");
    let report = check_task(with(good_task(), json!({"policy": {"outageTimeout": "169h"}})), good_sandbox());
    assert_eq!(field(&only(&report, Rule::OutOfRange)), "spec.policy.outageTimeout");
    // Beside a server it is never read: a warning naming what is.
    let served = json!({"policy": {"endpoint": null, "server": {"image": "vllm"}, "outageTimeout": "5m"}});
    let report = check_task(with(good_task(), served), good_sandbox());
    let warning = only(&report, Rule::InvalidPolicy);
    assert_eq!((field(&warning), warning.severity), ("spec.policy.outageTimeout", Severity::Warning), "{report}");
    assert!(warning.message.contains("startupTimeout"), "{report}");
}
