//! Rules for one SandboxConfig spec: tools, timeouts, fallbacks, memory,
//! rollback, injections, rewards, trace settings, GPU and profiles.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::duration::Duration;
use crate::problem::{Location, Problem, Report, Rule, Severity};
use crate::profile::{ProfileError, resolve_profile};
use crate::sandbox::{NullWrites, REWARD_SOURCES, SandboxConfigSpec};
use crate::tool::{ToolSpec, template_placeholders};

use super::names::{dns_subdomain_violation, is_dns_label, is_tool_name};
use super::{FixtureMemo, ValidationContext, check_not_too_long, list, push_all, suggestion};

/// Problems of `spec` (as `SandboxConfig/<name>`) and, with `profile`, the
/// problems that only the profile-applied spec has (as
/// `SandboxConfig/<name> (profile <p>)`). A profile that does not exist is
/// not reported here: the referencing task reports it where it is named.
pub(super) fn check(
    name: &str,
    spec: &SandboxConfigSpec,
    profile: Option<&str>,
    ctx: &ValidationContext<'_>,
) -> Report {
    let label = format!("SandboxConfig/{name}");
    let mut report = Report::new();
    let mut base = profile_structure(spec);
    base.extend(rules(spec, ctx));
    push_all(&mut report, &label, base.iter().cloned());
    if let Some(profile) = profile {
        match resolve_profile(spec, Some(profile)) {
            Ok(resolved) => {
                let profile_label = format!("{label} (profile {profile})");
                for problem in rules(&resolved, ctx) {
                    if !base.contains(&problem) {
                        report.push(problem.in_object(&profile_label));
                    }
                }
            }
            Err(ProfileError::NotFound { .. }) => {}
            Err(error) => report.push(
                Problem::error(Rule::InvalidProfile, format!("spec.profiles.{profile}"), error.to_string())
                    .in_object(&label),
            ),
        }
    }
    report
}

/// `prefix.key`, or `prefix["key"]` when the key would be ambiguous in a path.
pub(super) fn key_path(prefix: &str, key: &str) -> String {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        format!("{prefix}.{key}")
    } else {
        format!("{prefix}[{key:?}]")
    }
}

/// A memory key `""` in a `memoryPatch`: no key a reader could name (a run
/// refuses such a write).
fn empty_memory_key(field: &str) -> Problem {
    Problem::error(
        Rule::InvalidMemoryPolicy,
        field,
        "a memory key cannot be empty; name the key this value is written to, e.g. eta",
    )
}

/// A reward component's score comes from the metric its `source` names (its
/// own name without one); the runner scores anything else as 0 on every
/// episode, so the component would silently do nothing.
fn check_reward_source(problems: &mut Vec<Problem>, path: &str, name: &str, source: Option<&str>) {
    let metric = source.unwrap_or(name);
    if REWARD_SOURCES.contains(&metric) {
        return;
    }
    let sources = REWARD_SOURCES.join(", ");
    let hint = suggestion(metric, REWARD_SOURCES.iter().copied());
    problems.push(match source {
        Some(source) => Problem::error(
            Rule::InvalidRewards,
            format!("{path}.source"),
            format!(
                "reward source {source:?} is not a metric the sandbox scores, so the component always scores 0; use one of: {sources}.{hint}"
            ),
        ),
        None => Problem::error(
            Rule::InvalidRewards,
            path,
            format!(
                "reward component {name:?} has no source and its name is not a metric the sandbox scores, so it always scores 0; add `source:` naming one of: {sources}.{hint}"
            ),
        ),
    });
}

/// Problems about the profiles themselves, before any is applied.
fn profile_structure(spec: &SandboxConfigSpec) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (name, overlay) in &spec.profiles {
        let path = key_path("spec.profiles", name);
        if !is_dns_label(name) {
            problems.push(Problem::error(
                Rule::InvalidName,
                &path,
                format!("profile name {name:?} must be a DNS label (lowercase letters, digits and '-'), e.g. \"dev\", \"prod\""),
            ));
        }
        if overlay.0.contains_key("profiles") {
            problems.push(Problem::error(
                Rule::InvalidProfile,
                format!("{path}.profiles"),
                "profiles cannot nest; move these settings into the profile itself",
            ));
        }
        if let Some(serde_json::Value::Object(fallbacks)) = overlay.0.get("fallbacks") {
            for (tool, fallback) in fallbacks {
                let Some(serde_json::Value::Object(patch)) = fallback.get("memoryPatch") else { continue };
                for (key, value) in patch {
                    if value.is_null() {
                        problems.push(Problem::warning(
                            Rule::InvalidProfile,
                            format!("{}.memoryPatch.{key}", key_path(&format!("{path}.fallbacks"), tool)),
                            format!(
                                "a null in a profile REMOVES {key:?} from the base fallback's memoryPatch (JSON merge \
                                 patch); it does not write null. To write null, set it in the base spec or in a \
                                 separate SandboxConfig"
                            ),
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// Every rule on a spec whose profile (if any) is applied.
fn rules(spec: &SandboxConfigSpec, ctx: &ValidationContext<'_>) -> Vec<Problem> {
    let mut problems = Vec::new();
    let tools: Vec<&str> = spec.tools.keys().map(String::as_str).collect();
    let undefined = |path: String, tool: &str, used_as: &str| {
        Problem::error(
            Rule::UndefinedTool,
            path,
            format!(
                "{used_as} names tool {tool:?}, which is not defined in spec.tools (defined: {}); define it or fix the name.{}",
                list(&tools, 8),
                suggestion(tool, tools.iter().copied())
            ),
        )
    };

    for (name, tool) in &spec.tools {
        check_tool(name, tool, spec, &mut problems);
    }
    // A fixture file is read once, however many tools answer from it: its
    // problems are reported once.
    let mut fixtures: Vec<PathBuf> = Vec::new();
    for recorded in spec.tools.values().filter_map(|t| t.recorded.as_ref()) {
        if let Some(file) = ctx.local_file(&recorded.fixture).filter(|_| !recorded.fixture.trim().is_empty())
            && !fixtures.contains(&file)
        {
            check_fixture(&file, spec, ctx.fixtures, &mut problems);
            fixtures.push(file);
        }
    }
    check_services(spec, &mut problems);

    // Timeouts.
    if let Some(timeouts) = &spec.tool_timeouts {
        if timeouts.is_bare() {
            let timeout = timeouts.tool_timeout_for("");
            problems.push(Problem::warning(
                Rule::BareToolTimeout,
                "spec.toolTimeouts",
                format!(
                    "toolTimeouts is a bare duration ({timeout}), so it applies to EVERY tool ({}); a fast database \
                     call and a slow API then share one limit. Write a map instead: {{default: {timeout}, <slow_tool>: 2s}}",
                    list(&tools, 8)
                ),
            ));
        }
        for tool in timeouts.named_tools() {
            if !spec.tools.contains_key(tool) {
                problems.push(undefined(key_path("spec.toolTimeouts", tool), tool, "toolTimeouts"));
            }
        }
        for (suffix, timeout) in timeouts.entries() {
            check_duration(&mut problems, &format!("spec.toolTimeouts{suffix}"), timeout);
        }
    }
    if let Some(step) = spec.plan_step_timeout {
        check_duration(&mut problems, "spec.planStepTimeout", step);
    }
    let step = spec.plan_step_timeout();
    if step.is_positive() {
        for name in &tools {
            let timeout = spec.tool_timeout_for(name);
            if timeout > step {
                problems.push(Problem::warning(
                    Rule::TimeoutExceedsStep,
                    "spec.toolTimeouts",
                    format!(
                        "tool {name:?} may run for {timeout} but a plan step times out after {step} \
                         (planStepTimeout), so the step rolls back before the tool's own timeout and fallback can \
                         apply; raise planStepTimeout or lower the tool's timeout"
                    ),
                ));
            }
        }
    }

    // Fallbacks.
    for (tool, fallback) in &spec.fallbacks {
        let path = key_path("spec.fallbacks", tool);
        if !spec.tools.contains_key(tool) {
            problems.push(undefined(path.clone(), tool, "a fallback"));
        }
        for (key, value) in fallback.memory_patch.iter().flatten() {
            let key_field = key_path(&format!("{path}.memoryPatch"), key);
            if key.is_empty() {
                problems.push(empty_memory_key(&key_field));
            }
            if value.is_null() {
                let policy = spec.memory.null_writes();
                let text = format!(
                    "the fallback of {tool:?} writes null into memory key {key:?}: every timeout or failure of the \
                     tool erases what the agent knew (the classic `shipping_status = None` bug). Write a real value \
                     such as \"pending\" or \"unknown\""
                );
                match policy {
                    NullWrites::Allow => {}
                    NullWrites::Warn => problems.push(Problem::warning(Rule::NullMemoryWrite, key_field.clone(), text)),
                    NullWrites::Error => problems.push(Problem::error(
                        Rule::NullMemoryWrite,
                        key_field.clone(),
                        format!(
                            "{text}; memory.nullWrites is `error`, so the write would be refused and the step fail"
                        ),
                    )),
                }
            }
            if spec.memory.strict_types
                && let Some(expected) = spec.memory.schema.get(key)
                && !value.is_null()
                && !expected.matches(value)
            {
                problems.push(Problem::error(
                    Rule::InvalidMemoryPolicy,
                    key_field,
                    format!(
                        "memory.schema says {key:?} is {}, but the fallback writes {value}; with strictTypes the \
                         write would be refused",
                        expected.as_str()
                    ),
                ));
            }
        }
    }

    if spec.max_steps == Some(0) {
        problems.push(Problem::error(
            Rule::OutOfRange,
            "spec.maxSteps",
            "maxSteps is 0, so no episode can take a step; remove it (default 20) or set a positive number",
        ));
    }

    // Trace settings.
    let top_k = spec.trace.top_k();
    if top_k > 20 {
        problems.push(Problem::error(
            Rule::InvalidTrace,
            "spec.trace.topK",
            format!("topK is {top_k}, but OpenAI-compatible servers return at most 20 top_logprobs; use 20 or less (default 5)"),
        ));
    }
    if spec.trace.error_context == Some(false) {
        problems.push(Problem::warning(
            Rule::InvalidTrace,
            "spec.trace.errorContext",
            "errorContext is false: a failing episode will say only \"execution terminated due to error\" with no \
             cause, memory snapshot or last tool payloads; leave it on unless traces are too large",
        ));
    }

    // Memory.
    if spec.memory.strict_types && spec.memory.schema.is_empty() {
        problems.push(Problem::warning(
            Rule::InvalidMemoryPolicy,
            "spec.memory.strictTypes",
            "strictTypes is on but memory.schema is empty, so nothing is checked; add key types, e.g. {shipping_status: string}",
        ));
    }

    if spec.rollback.checkpoint_every == Some(0) {
        problems.push(Problem::error(
            Rule::OutOfRange,
            "spec.rollback.checkpointEvery",
            "checkpointEvery is 0; use 1 (a checkpoint after every step, the default) or more",
        ));
    }

    // Injections.
    for (index, injection) in spec.injections.iter().enumerate() {
        let path = format!("spec.injections[{index}]");
        let triggers = injection.triggers_set();
        if triggers.len() != 1 {
            let found = if triggers.is_empty() { "none".to_string() } else { triggers.join(" and ") };
            problems.push(Problem::error(
                Rule::InvalidInjection,
                &path,
                format!("an injection needs exactly one trigger (atStep, afterTool or whenMemory); found {found}"),
            ));
        }
        if let Some(tool) = &injection.after_tool
            && !spec.tools.contains_key(tool)
        {
            problems.push(undefined(format!("{path}.afterTool"), tool, "an injection's afterTool"));
        }
        if injection.at_step == Some(0) {
            problems.push(Problem::error(
                Rule::InvalidInjection,
                format!("{path}.atStep"),
                "steps are numbered from 1; atStep 0 never fires",
            ));
        }
        if let Some(at_step) = injection.at_step
            && at_step > spec.max_steps()
        {
            problems.push(Problem::warning(
                Rule::InvalidInjection,
                format!("{path}.atStep"),
                format!("atStep {at_step} is beyond maxSteps ({}), so it never fires", spec.max_steps()),
            ));
        }
        if let Some(when) = &injection.when_memory
            && when.key.trim().is_empty()
        {
            problems.push(Problem::error(
                Rule::InvalidInjection,
                format!("{path}.whenMemory.key"),
                "the memory key is empty",
            ));
        }
        if injection.observation.is_null() {
            problems.push(Problem::error(
                Rule::InvalidInjection,
                format!("{path}.observation"),
                "the observation is null; inject a JSON value, e.g. {type: system, content: \"...\"}",
            ));
        }
    }

    // Rewards.
    if let Some(rewards) = &spec.rewards {
        for (name, component) in &rewards.components {
            let path = key_path("spec.rewards.components", name);
            if !component.weight.is_finite() {
                problems.push(Problem::error(
                    Rule::InvalidRewards,
                    format!("{path}.weight"),
                    "the weight must be a finite number",
                ));
            }
            check_reward_source(&mut problems, &path, name, component.source.as_deref());
        }
        let mut previous: Option<u64> = None;
        for (index, change) in rewards.weight_schedule.iter().enumerate() {
            let path = format!("spec.rewards.weightSchedule[{index}]");
            if let Some(previous) = previous
                && change.at_training_step <= previous
            {
                problems.push(Problem::error(
                    Rule::InvalidRewards,
                    format!("{path}.atTrainingStep"),
                    format!("atTrainingStep {} is not after the previous entry's {previous}; list changes in increasing step order", change.at_training_step),
                ));
            }
            previous = Some(change.at_training_step);
            for (name, weight) in &change.weights {
                if !rewards.components.contains_key(name) {
                    problems.push(Problem::error(
                        Rule::InvalidRewards,
                        key_path(&format!("{path}.weights"), name),
                        format!(
                            "reward component {name:?} is not defined in spec.rewards.components (defined: {}).{}",
                            list(rewards.components.keys(), 8),
                            suggestion(name, rewards.components.keys().map(String::as_str))
                        ),
                    ));
                }
                if !weight.is_finite() {
                    problems.push(Problem::error(
                        Rule::InvalidRewards,
                        key_path(&format!("{path}.weights"), name),
                        "the weight must be a finite number",
                    ));
                }
            }
        }
    }

    // GPU.
    if let Some(gpu) = &spec.gpu {
        if let Err(error) = gpu.min_compute_capability() {
            problems.push(Problem::error(
                Rule::InvalidComputeCapability,
                "spec.gpu.minComputeCapability",
                error.to_string(),
            ));
        }
        if gpu.count == Some(0) && (gpu.required || gpu.min_compute_capability.is_some()) {
            problems.push(Problem::error(
                Rule::InvalidGpu,
                "spec.gpu.count",
                "count is 0 but a GPU is required (required or minComputeCapability is set); use 1 or more, or drop the requirement",
            ));
        }
        if gpu.min_memory_gib == Some(0) {
            problems.push(Problem::warning(
                Rule::OutOfRange,
                "spec.gpu.minMemoryGiB",
                "minMemoryGiB 0 selects every GPU; remove it",
            ));
        }
    }
    if let Some(resources) = &spec.resources {
        let names_gpu = |map: &Option<std::collections::BTreeMap<String, _>>| {
            map.as_ref().is_some_and(|m| m.contains_key("nvidia.com/gpu"))
        };
        if names_gpu(&resources.limits) || names_gpu(&resources.requests) {
            problems.push(Problem::warning(
                Rule::InvalidGpu,
                "spec.resources",
                "resources names nvidia.com/gpu; set spec.gpu.count instead, so node affinity on compute capability is derived too",
            ));
        }
    }

    if let Some(image) = &spec.image
        && (image.trim().is_empty() || image.chars().any(char::is_whitespace))
    {
        problems.push(Problem::error(Rule::InvalidName, "spec.image", format!("{image:?} is not an image reference")));
    }
    if let Some(class) = &spec.runtime_class_name
        && let Some(why) = dns_subdomain_violation(class)
    {
        problems.push(Problem::error(
            Rule::InvalidName,
            "spec.runtimeClassName",
            format!("{class:?} is not a RuntimeClass name: {why}"),
        ));
    }
    problems
}

/// A duration of the spec: greater than zero, and not longer than the most a spec may give.
pub(super) fn check_duration(problems: &mut Vec<Problem>, path: &str, duration: Duration) {
    if !duration.is_positive() {
        problems.push(Problem::error(
            Rule::NonPositiveDuration,
            path,
            format!("the duration is {duration}; it must be greater than zero (e.g. \"800ms\", \"3s\")"),
        ));
    }
    check_not_too_long(problems, path, duration);
}

fn check_tool(name: &str, tool: &ToolSpec, spec: &SandboxConfigSpec, problems: &mut Vec<Problem>) {
    let path = key_path("spec.tools", name);
    if !is_tool_name(name) {
        problems.push(Problem::error(
            Rule::InvalidName,
            &path,
            format!(
                "tool name {name:?} is not accepted by chat-completions APIs: use 1-64 letters, digits, '_' and '-'"
            ),
        ));
    }
    if name == crate::timeouts::DEFAULT_KEY {
        problems.push(Problem::error(
            Rule::InvalidName,
            &path,
            "a tool cannot be called \"default\": that key of toolTimeouts is the default timeout; rename the tool",
        ));
    }
    let kinds = tool.kinds_set();
    if kinds.len() != 1 {
        let found = if kinds.is_empty() { "none".to_string() } else { kinds.join(" and ") };
        problems.push(Problem::error(
            Rule::InvalidTool,
            &path,
            format!("a tool needs exactly one of http, exec or recorded; found {found}"),
        ));
    }
    let parameter_names: Option<BTreeSet<&str>> = tool
        .parameters
        .as_ref()
        .and_then(|p| p.get("properties"))
        .and_then(serde_json::Value::as_object)
        .map(|props| props.keys().map(String::as_str).collect());
    if let Some(parameters) = &tool.parameters {
        let is_object_schema = parameters.get("type").and_then(serde_json::Value::as_str) == Some("object");
        if !is_object_schema {
            problems.push(Problem::warning(
                Rule::InvalidTool,
                format!("{path}.parameters"),
                "parameters should be a JSON Schema with `type: object` (function arguments are an object)",
            ));
        }
    }
    for (key, pointer) in &tool.memory_patch {
        if key.is_empty() {
            problems.push(empty_memory_key(&key_path(&format!("{path}.memoryPatch"), key)));
        }
        if !(pointer.is_empty() || pointer.starts_with('/')) {
            problems.push(Problem::error(
                Rule::InvalidTool,
                key_path(&format!("{path}.memoryPatch"), key),
                format!("{pointer:?} is not a JSON pointer into the result; write \"/{pointer}\" (or \"\" for the whole result)"),
            ));
        }
    }
    if let Some(http) = &tool.http {
        check_http(&path, http, parameter_names.as_ref(), spec, problems);
    }
    if let Some(exec) = &tool.exec {
        let command = exec.command.iter().enumerate().map(|(i, arg)| (format!("{path}.exec.command[{i}]"), arg));
        let env = exec.env.iter().map(|(k, v)| (key_path(&format!("{path}.exec.env"), k), v));
        for (field, text) in command.chain(env) {
            check_service_refs(&field, text, spec, problems);
        }
    }
    if let Some(exec) = &tool.exec
        && exec.command.first().is_none_or(|program| program.trim().is_empty())
    {
        problems.push(Problem::error(
            Rule::InvalidTool,
            format!("{path}.exec.command"),
            "the command is empty; give the program and its arguments, e.g. [python3, tools/refund.py]",
        ));
    }
    if let Some(recorded) = &tool.recorded
        && recorded.fixture.trim().is_empty()
    {
        problems.push(Problem::error(
            Rule::InvalidTool,
            format!("{path}.recorded.fixture"),
            "the fixture path is empty",
        ));
    }
}

fn check_http(
    path: &str,
    http: &crate::tool::HttpTool,
    parameter_names: Option<&BTreeSet<&str>>,
    spec: &SandboxConfigSpec,
    problems: &mut Vec<Problem>,
) {
    // A URL that starts with a service reference is an http URL once expanded.
    let url = http.url.replacen("$(services.", "http://127.0.0.1/$(", 1);
    let url = if http.url.starts_with("$(services.") { url.as_str() } else { http.url.as_str() };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        problems.push(Problem::error(
            Rule::InvalidUrl,
            format!("{path}.http.url"),
            format!("{:?} is not an http:// or https:// URL", http.url),
        ));
    }
    let mut templates = vec![(format!("{path}.http.url"), http.url.as_str())];
    if let Some(body) = &http.body {
        templates.push((format!("{path}.http.body"), body.as_str()));
    }
    for (header, value) in &http.headers {
        let field = key_path(&format!("{path}.http.headers"), header);
        check_header(&field, header, value, problems);
        templates.push((field, value.as_str()));
    }
    for (field, template) in templates {
        check_service_refs(&field, template, spec, problems);
        match template_placeholders(template) {
            Err(error) => problems.push(Problem::error(Rule::InvalidTemplate, field, error.to_string())),
            Ok(names) => {
                let Some(parameters) = parameter_names else { continue };
                for name in names {
                    let root = name.split('.').next().unwrap_or(&name);
                    if !parameters.contains(root) {
                        problems.push(Problem::warning(
                            Rule::InvalidTemplate,
                            field.clone(),
                            format!(
                                "placeholder {{{{{name}}}}} is not one of the tool's parameters ({}): the policy is not told of it, so it renders empty unless a call sends it anyway.{}",
                                list(parameters.iter(), 8),
                                super::suggestion(root, parameters.iter().copied())
                            ),
                        ));
                    }
                }
            }
        }
    }
    if let Some(retry) = &http.retry {
        if !(2..=10).contains(&retry.attempts) {
            problems.push(Problem::error(
                Rule::InvalidTool,
                format!("{path}.http.retry.attempts"),
                format!("attempts counts the first call too: use 2 to 10 (got {})", retry.attempts),
            ));
        }
        for (i, status) in retry.on_status.iter().enumerate() {
            if !(400..=599).contains(status) {
                problems.push(Problem::error(
                    Rule::InvalidTool,
                    format!("{path}.http.retry.onStatus[{i}]"),
                    format!("{status} is not an error status (400-599); only failed answers are retried"),
                ));
            }
        }
        if let Some(backoff) = retry.backoff {
            check_duration(problems, &format!("{path}.http.retry.backoff"), backoff);
        }
    }
    if let Some(limit) = &http.rate_limit {
        if !(limit.requests_per_second.is_finite() && limit.requests_per_second > 0.0) {
            problems.push(Problem::error(
                Rule::InvalidTool,
                format!("{path}.http.rateLimit.requestsPerSecond"),
                "requestsPerSecond must be greater than zero (it is per SECOND: 100 per minute is 1.67)",
            ));
        }
        if limit.burst == Some(0) {
            problems.push(Problem::error(
                Rule::InvalidTool,
                format!("{path}.http.rateLimit.burst"),
                "burst 0 admits no request; use 1 or more",
            ));
        }
    }
}

/// `$(services.…)` references in a tool field must name a defined service.
/// What an HTTP header can carry (RFC 9110): a name of token characters,
/// a value without line breaks or other control characters. Values filled
/// from arguments are checked again when sent.
fn check_header(field: &str, name: &str, value: &str, problems: &mut Vec<Problem>) {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        problems.push(Problem::error(
            Rule::InvalidTool,
            field,
            format!(
                "{name:?} is not an HTTP header name: use letters, digits and !#$%&'*+-.^_`|~ (no spaces or colons)"
            ),
        ));
    }
    if value.chars().any(|c| (c < ' ' && c != '\t') || c == '\u{7f}') {
        problems.push(Problem::error(
            Rule::InvalidTool,
            field,
            "the value holds a line break or another control character, which an HTTP header cannot carry",
        ));
    }
}

fn check_service_refs(field: &str, text: &str, spec: &SandboxConfigSpec, problems: &mut Vec<Problem>) {
    match crate::service::service_refs(text) {
        Err(error) => problems.push(Problem::error(Rule::InvalidTemplate, field, error.to_string())),
        Ok(refs) => {
            for r in refs.iter().filter(|r| !spec.services.contains_key(&r.service)) {
                problems.push(Problem::error(
                    Rule::UnknownService,
                    field,
                    format!(
                        "$(services.{}.{}) names service {:?}, which is not defined in spec.services (defined: {}).{}",
                        r.service,
                        r.attribute,
                        r.service,
                        list(spec.services.keys(), 8),
                        suggestion(&r.service, spec.services.keys().map(String::as_str))
                    ),
                ));
            }
        }
    }
}

/// Services: a name usable in references, a command, a sane readiness probe.
fn check_services(spec: &SandboxConfigSpec, problems: &mut Vec<Problem>) {
    for (name, service) in &spec.services {
        let path = key_path("spec.services", name);
        if !is_dns_label(name) {
            problems.push(Problem::error(
                Rule::InvalidName,
                &path,
                format!(
                    "service name {name:?} must be a DNS label (lowercase letters, digits and '-'), e.g. \"tracking\""
                ),
            ));
        }
        if service.command.first().is_none_or(|program| program.trim().is_empty()) {
            problems.push(Problem::error(
                Rule::InvalidService,
                format!("{path}.command"),
                "the command is empty; give the program and its arguments, e.g. [python3, services/tracking.py]",
            ));
        }
        if let Some(ready) = &service.ready_path
            && !ready.starts_with('/')
        {
            problems.push(Problem::error(
                Rule::InvalidService,
                format!("{path}.readyPath"),
                format!("{ready:?} is not an HTTP path; write \"/{ready}\""),
            ));
        }
        if let Some(timeout) = service.ready_timeout {
            check_duration(problems, &format!("{path}.readyTimeout"), timeout);
        }
    }
    let ports: Vec<(&String, u16)> =
        spec.services.iter().filter_map(|(n, s)| s.port.filter(|p| *p != 0).map(|p| (n, p))).collect();
    for (i, (name, port)) in ports.iter().enumerate() {
        if let Some((other, _)) = ports[..i].iter().find(|(_, p)| p == port) {
            problems.push(Problem::error(
                Rule::InvalidService,
                format!("{}.port", key_path("spec.services", name)),
                format!("port {port} is also the port of service {other:?}; give each its own, or 0 for a free one"),
            ));
        }
    }
}

fn check_fixture(
    file: &std::path::Path,
    spec: &SandboxConfigSpec,
    memo: Option<&FixtureMemo>,
    problems: &mut Vec<Problem>,
) {
    let facts = FixtureMemo::facts(memo, file);
    match &facts.tools {
        Err(report) => problems.extend(report.problems().iter().cloned()),
        Ok(tools) => {
            for (tool, line) in tools.iter().filter(|(tool, _)| !spec.tools.contains_key(tool)) {
                problems.push(Problem {
                    severity: Severity::Error,
                    rule: Rule::UndefinedTool,
                    object: None,
                    location: Location::line(facts.name.clone(), *line),
                    message: format!(
                        "the fixture records tool {tool:?}, which is not defined in spec.tools (defined: {}).{}",
                        list(spec.tools.keys(), 8),
                        suggestion(tool, spec.tools.keys().map(String::as_str))
                    ),
                });
            }
        }
    }
    for (line, field) in &facts.empty_memory_keys {
        let what = if field == "memoryPatch" {
            "writes the empty memory key \"\": a call answered from this entry is refused (error type memory_key), \
             as the tool's own write would be"
        } else {
            "removes the empty memory key \"\", which no write can make: it does nothing"
        };
        problems.push(Problem {
            severity: Severity::Warning,
            rule: Rule::InvalidFixture,
            object: None,
            location: Location::line(facts.name.clone(), *line),
            message: format!("{field} {what}"),
        });
    }
}
