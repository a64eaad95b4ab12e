//! `basecamp harness validate | convert`: every check the operator and the
//! sandbox make (the one shared validation function, the same words), over
//! YAML manifests, directories and the JSON harness form. Paths that hold no
//! HarnessTask or SandboxConfig at all fail validation: nothing was checked.
//!
//! A JSON harness file (`task_definition`, `data_pipeline`,
//! `training_config`, `evaluation`) is converted to a HarnessTask first; its
//! problems are reported with the JSON spelling of each field
//! (`data_pipeline.batch_size`) and the file's name. A converted task whose
//! name another file's task has (YAML or JSON) is defined twice, an error
//! at the JSON file's `task_definition.name`.
//!
//! Each problem is reported at the object it is about, found by where the
//! object came from (`Manifests::validate_each`), never by its name: a
//! YAML object's problems name it `Kind/name` as the operator does, with
//! its `file:line` when another object has that kind and name too.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use basecamp_api::harness_json::{self, Converted};
use basecamp_api::manifest::read_manifest_file;
use basecamp_api::testset::TestSet;
use basecamp_api::{Location, Manifests, Problem, Report, Rule};
use basecamp_sandbox::policy::scripted::MAX_REPORTED_LINES;
use basecamp_sandbox::policy::{ScriptedConfig, ScriptedError, ScriptedPolicy};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum HarnessCommand {
    /// Check manifests (files or directories; YAML or JSON harness files)
    /// and print every problem at once with its field path or file:line.
    /// Exit status 1 on any error.
    Validate {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The SandboxConfig a JSON harness file runs in (it has no field for it).
        #[arg(long)]
        sandbox: Option<String>,
    },
    /// Convert a JSON harness file into a HarnessTask manifest (YAML on stdout, or -o FILE).
    Convert {
        file: PathBuf,
        /// The SandboxConfig the task runs in (`spec.sandboxRef.name`).
        #[arg(long)]
        sandbox: Option<String>,
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
}

pub fn run(command: HarnessCommand) -> Result<ExitCode> {
    match command {
        HarnessCommand::Validate { paths, sandbox } => validate(&paths, sandbox.as_deref()),
        HarnessCommand::Convert { file, sandbox, out } => convert(&file, sandbox.as_deref(), out.as_deref()),
    }
}

/// The file's text when it is a JSON harness. A file that cannot be read
/// (one too large to be manifests included) is not: the YAML loader then
/// reports why.
fn is_json_harness(path: &Path) -> Option<String> {
    if !path.is_file() {
        return None;
    }
    let text = read_manifest_file(path).ok()?;
    (path.extension().is_some_and(|e| e == "json") || harness_json::is_harness_json(&text)).then_some(text)
}

/// A JSON harness file, converted and parsed as a manifest.
struct JsonHarness {
    file: String,
    /// `HarnessTask/<name>`, how validation names the converted task.
    object: String,
}

fn validate(paths: &[PathBuf], sandbox: Option<&str>) -> Result<ExitCode> {
    let (yaml, mut json): (Vec<&PathBuf>, Vec<&PathBuf>) = paths.iter().partition(|p| is_json_harness(p).is_none());
    // A JSON harness named twice is read once, as YAML files are (Manifests::load).
    let mut seen = std::collections::HashSet::new();
    json.retain(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())));
    let (mut manifests, mut report) =
        if yaml.is_empty() { (Manifests::default(), Report::new()) } else { Manifests::load(&yaml) };
    let mut converted_files = Vec::new();
    for path in json {
        let file = path.display().to_string();
        let text = is_json_harness(path).expect("partitioned as JSON");
        let Converted { manifest, report: problems, .. } = harness_json::convert(&file, &text, sandbox);
        report.extend(problems);
        if manifest.is_null() {
            continue;
        }
        let (mut more, parse_problems) = Manifests::parse(&file, &manifest.to_string());
        for problem in parse_problems.problems() {
            report.push(to_json_spelling(problem.clone(), &file, None));
        }
        // The converted manifest is one line; the task is defined where the
        // file's JSON object opens (what "first at FILE:LINE" names).
        let object_line = 1 + text[..text.len() - text.trim_start().len()].matches('\n').count() as u64;
        for task in &mut more.tasks {
            task.source.line = object_line;
            let name = task.object.metadata.name.clone().unwrap_or_default();
            converted_files.push(JsonHarness { file: file.clone(), object: format!("HarnessTask/{name}") });
        }
        manifests.tasks.extend(more.tasks);
        manifests.sandboxes.extend(more.sandboxes);
    }
    // `load` checked the YAML objects among themselves only. A converted task
    // that repeats one of them, or another JSON file's task, is reported at
    // its JSON file: those come after the YAML ones, so never first.
    for problem in manifests.duplicates().problems() {
        let Location::File { file, .. } = &problem.location else { continue };
        if let Some(j) = converted_files.iter().find(|j| &j.file == file) {
            let problem = Problem { location: Location::field("task_definition.name"), ..problem.clone() };
            report.push(to_json_spelling(problem, &j.file, Some(&j.object)));
        }
    }
    // Each problem at the object it is about, told by where the object came
    // from: a task of one name may be in a YAML manifest and in a JSON
    // harness (a duplicate, reported above) or in two namespaces.
    let checked = manifests.validate_each(None);
    let owned: HashSet<&Problem> =
        checked.iter().flat_map(|o| o.report.problems().iter().filter(|p| o.is_own(p))).collect();
    let mut labels: HashMap<&str, usize> = HashMap::new();
    for object in &checked {
        *labels.entry(object.label.as_str()).or_default() += 1;
    }
    for object in &checked {
        let source = object.source;
        for problem in object.report.problems() {
            if !object.is_own(problem) {
                // A SandboxConfig's, as this task uses it: said with that
                // SandboxConfig's own problems, unless only this use has it.
                if !owned.contains(problem) {
                    report.push(problem.clone());
                }
                continue;
            }
            let label = problem.object.as_deref().unwrap_or(&object.label);
            report.push(if converted_files.iter().any(|j| j.file == source.file) {
                to_json_spelling(problem.clone(), &source.file, Some(label))
            } else if labels[object.label.as_str()] > 1 {
                // `Kind/name` alone would not say which of them.
                Problem { object: Some(format!("{}:{} ({label})", source.file, source.line)), ..problem.clone() }
            } else {
                problem.clone()
            });
        }
    }
    report.extend(check_scripts(&manifests));
    report.extend(check_programs(&manifests));
    let objects = manifests.tasks.len() + manifests.sandboxes.len();
    if objects == 0 && !report.has_errors() {
        // Nothing was checked (an empty file, `kind` misspelt, another kind
        // only): passing it would let a broken manifest through CI. An error
        // like any other, so the count says it too.
        let named: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        report.push(Problem::error_at(
            Rule::InvalidManifest,
            Location::File { file: named.join(", "), line: None, column: None },
            "no HarnessTask or SandboxConfig to validate; give the files that define them",
        ));
    }
    let errors = report.errors().count();
    let warnings = report.problems().len() - errors;
    // Written, not print!ed: a closed stdout (`| grep -q`) is an error to return, not a panic.
    let mut stdout = std::io::stdout().lock();
    for problem in report.problems() {
        writeln!(stdout, "{problem}")?;
    }
    let summary =
        format!("{errors} error(s), {warnings} warning(s) in {objects} object(s) from {} path(s)", paths.len());
    if errors > 0 {
        basecamp_sandbox::stderr_line!("{summary}");
        Ok(ExitCode::FAILURE)
    } else {
        writeln!(stdout, "ok: {summary}")?;
        Ok(ExitCode::SUCCESS)
    }
}

/// Scripts for no row of the test set are named one warning each up to this
/// many; more are one warning naming the first ones.
const NAMED_UNPLAYED_SCRIPTS: usize = 5;

/// The scripted policies the tasks name, read as a run reads them (their
/// format is the sandbox's, which the shared validation does not know): a
/// line a run would refuse is an error; rows of the test set with no script
/// (each such episode ends with a policy error) and scripts for no row
/// (never played) are warnings. A file that is not there is the shared
/// validation's to say.
fn check_scripts(manifests: &Manifests) -> Vec<Problem> {
    let mut problems = Vec::new();
    for task in &manifests.tasks {
        let spec = &task.object.spec;
        let Some(script) = spec.policy.scripted.as_deref().filter(|p| !p.contains("://")) else { continue };
        let label = format!("HarnessTask/{}", task.object.metadata.name.as_deref().unwrap_or_default());
        let field = "spec.policy.scripted";
        let path = task.base_dir().join(script);
        let policy = match ScriptedPolicy::load_all(&ScriptedConfig { path: path.clone() }) {
            Ok(policy) => policy,
            Err(errors) => {
                // Every bad line at once, as the test set's are.
                for error in errors.iter().filter(|e| !matches!(e, ScriptedError::Read { .. })) {
                    problems.push(Problem::error(Rule::InvalidPolicy, field, error.to_string()).in_object(&label));
                }
                if errors.len() == MAX_REPORTED_LINES {
                    problems.push(
                        Problem::warning(
                            Rule::InvalidPolicy,
                            field,
                            format!("only the first {MAX_REPORTED_LINES} bad lines of {} are listed", path.display()),
                        )
                        .in_object(&label),
                    );
                }
                continue;
            }
        };
        let test_set = &spec.evaluation.test_set;
        let (Some(scripted), false) = (policy.scripted_episodes(), test_set.contains("://")) else { continue };
        let Ok(rows) = TestSet::load(task.base_dir().join(test_set)) else { continue };
        // Sets, not scans: a test set and a script of 100k lines each are checked in milliseconds.
        let script_ids: HashSet<&str> = scripted.iter().map(|(id, _)| *id).collect();
        let row_ids: HashSet<&str> = rows.episodes.iter().map(|e| e.id.as_str()).collect();
        let unscripted: Vec<&str> =
            rows.episodes.iter().map(|e| e.id.as_str()).filter(|id| !script_ids.contains(id)).collect();
        if !unscripted.is_empty() {
            let mut named: Vec<String> = unscripted.iter().take(5).map(|id| format!("{id:?}")).collect();
            if unscripted.len() > named.len() {
                named.push("…".into());
            }
            problems.push(
                Problem::warning(
                    Rule::InvalidPolicy,
                    field,
                    format!(
                        "{} of the {} rows of {test_set} have no script in {} ({}); each of their episodes ends with a policy error",
                        unscripted.len(),
                        rows.len(),
                        path.display(),
                        named.join(", ")
                    ),
                )
                .in_object(&label),
            );
        }
        let mut unplayed: Vec<(&str, usize)> =
            scripted.iter().copied().filter(|(id, _)| !row_ids.contains(id)).collect();
        unplayed.sort_by_key(|(_, line)| *line);
        if unplayed.len() <= NAMED_UNPLAYED_SCRIPTS {
            for (id, line) in unplayed {
                problems.push(
                    Problem::warning(
                        Rule::InvalidPolicy,
                        field,
                        format!(
                            "{}:{line}: scripts episode {id:?}, which is no row of {test_set}; it is never played",
                            path.display()
                        ),
                    )
                    .in_object(&label),
                );
            }
        } else {
            // One warning, not one a line: a script written for another test set would bury the rest.
            let named: Vec<String> = unplayed
                .iter()
                .take(NAMED_UNPLAYED_SCRIPTS)
                .map(|(id, line)| format!("{id:?} (line {line})"))
                .collect();
            problems.push(
                Problem::warning(
                    Rule::InvalidPolicy,
                    field,
                    format!(
                        "{} of the {} episodes scripted in {} are no row of {test_set} and are never played: {}, …",
                        unplayed.len(),
                        scripted.len(),
                        path.display(),
                        named.join(", ")
                    ),
                )
                .in_object(&label),
            );
        }
    }
    problems
}

/// The exec tools' and services' programs, judged as a run on this
/// machine judges them before its first episode (not on `PATH`, not there,
/// not executable). Warnings: a run here refuses each, but a manifest
/// written for the cluster names programs of the sandbox image, which this
/// machine need not have.
fn check_programs(manifests: &Manifests) -> Vec<Problem> {
    let mut problems = Vec::new();
    for sandbox in &manifests.sandboxes {
        let label = format!("SandboxConfig/{}", sandbox.object.metadata.name.as_deref().unwrap_or_default());
        for (field, message) in basecamp_sandbox::config::program_problems(&sandbox.object.spec, &sandbox.base_dir()) {
            let rule = if field.starts_with("spec.services.") { Rule::InvalidService } else { Rule::InvalidTool };
            let message = format!(
                "{message} (on this machine: `basecamp run` here refuses it; the image the sandbox pods run must have it)"
            );
            problems.push(Problem::warning(rule, field, message).in_object(&label));
        }
    }
    problems
}

/// A problem of a converted JSON harness, told in the JSON file's terms.
fn to_json_spelling(mut problem: Problem, file: &str, object: Option<&str>) -> Problem {
    problem.location = match problem.location {
        Location::Field(path) => Location::Field(harness_json::json_path(&path)),
        // Lines of the generated manifest mean nothing to the user.
        Location::File { file: f, .. } if f == file => Location::File { file: f, line: None, column: None },
        other => other,
    };
    if let Some(object) = object {
        problem.object = Some(format!("{file} ({object})"));
    }
    // Field paths quoted in the message, too.
    problem.message = problem
        .message
        .split(' ')
        .map(|word| {
            let bare = word.trim_end_matches(['.', ',', ';', '?']);
            // "batchSize" or `testSet` (serde's "missing field `testSet`").
            let quoted = bare.len() > 2
                && ((bare.starts_with('"') && bare.ends_with('"')) || (bare.starts_with('`') && bare.ends_with('`')))
                && bare[1..bare.len() - 1].chars().all(|c| c.is_ascii_alphanumeric());
            if word.starts_with("spec.") || (quoted && word.chars().any(|c| c.is_ascii_uppercase())) {
                harness_json::json_path(word)
            } else {
                word.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    problem
}

fn convert(file: &Path, sandbox: Option<&str>, out: Option<&Path>) -> Result<ExitCode> {
    let name = file.display().to_string();
    if let Some(out) = out
        && let (Ok(a), Ok(b)) = (std::fs::canonicalize(file), std::fs::canonicalize(out))
        && a == b
    {
        bail!("{name}: -o would replace the JSON harness with its conversion; write the manifest to another file");
    }
    let text = read_manifest_file(file).with_context(|| format!("cannot read {name}"))?;
    let converted = harness_json::convert(&name, &text, sandbox);
    let mut report = converted.report;
    if !converted.manifest.is_null() {
        // What `validate` says of the converted object on its own (an unknown field such as a
        // misspelt `resume_frm`, a wrong type): a manifest with it would not apply.
        let (parsed, parse_problems) = Manifests::parse(&name, &converted.manifest.to_string());
        for problem in parse_problems.problems() {
            report.push(to_json_spelling(problem.clone(), &name, None));
        }
        // ... and what the task's own rules say (a criterion that does not
        // parse, a batch size of 0): the checks `validate` makes of the task
        // alone. Which SandboxConfig it names, and the files it names, are
        // for `validate` with the manifests beside it: not read here.
        for task in &parsed.tasks {
            let ctx = basecamp_api::validate::ValidationContext {
                task_name: task.object.metadata.name.as_deref(),
                ..Default::default()
            };
            let own = basecamp_api::validate::validate_task(&task.object.spec, &[], &ctx);
            // Named `FILE (HarnessTask/name)`, as `validate` names them.
            for problem in own.problems().iter().filter(|p| p.rule != Rule::UnknownSandbox) {
                let object = problem.object.clone();
                report.push(to_json_spelling(problem.clone(), &name, object.as_deref()));
            }
        }
    }
    if report.has_errors() || converted.manifest.is_null() {
        for problem in report.problems() {
            basecamp_sandbox::stderr_line!("{problem}");
        }
        bail!("{name} cannot be converted");
    }
    for problem in report.problems() {
        basecamp_sandbox::stderr_line!("{problem}");
    }
    let yaml = serde_saphyr::to_string(&converted.manifest).context("cannot write YAML")?;
    let yaml = format!("# Converted from {name} by `basecamp harness convert`.\n{yaml}");
    match out {
        Some(path) => std::fs::write(path, &yaml).with_context(|| format!("cannot write {}", path.display()))?,
        None => std::io::stdout().lock().write_all(yaml.as_bytes())?,
    }
    for note in &converted.notes {
        basecamp_sandbox::stderr_line!("note: {name}: {note}");
    }
    if sandbox.is_none() && converted.manifest["spec"].get("sandboxRef").is_none() {
        basecamp_sandbox::stderr_line!(
            "note: the task names no SandboxConfig yet; add spec.sandboxRef (or convert with --sandbox NAME)"
        );
    }
    if converted.manifest["spec"]["policy"].as_object().is_some_and(|p| p.is_empty()) {
        basecamp_sandbox::stderr_line!(
            "note: the task has no policy yet; set spec.policy.endpoint (OpenAI-compatible) or spec.policy.scripted"
        );
    }
    Ok(ExitCode::SUCCESS)
}
