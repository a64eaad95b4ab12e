//! Reading manifests: multi-document YAML files (or directories of them)
//! holding HarnessTasks and SandboxConfigs, with errors that name the file,
//! the line and the field path.
//!
//! Each document is read in three passes, so that one mistake does not hide
//! the others:
//!
//! 1. YAML syntax (serde-saphyr), errors with file:line:column;
//! 2. unknown fields, found by walking the document against the CRD's own
//!    schema — the same rule as the apiserver's strict field validation
//!    (`kubectl apply` refuses unknown fields). `#[serde(deny_unknown_fields)]`
//!    is not used: it stops at the first unknown field, cannot be combined
//!    with `flatten`, and would make the operator refuse objects written by
//!    a newer CRD. Every unknown field is reported, with a "did you mean";
//!    its line is found by searching the document for the key (best effort:
//!    given only when the key occurs once). `metadata` is checked against
//!    ObjectMeta's keys, with its name and namespace (the `metadata` module);
//! 3. types, by deserializing the document straight from YAML, so a type
//!    error has both its field path and its line. A duration that does not
//!    parse is said, and the document read again without it, so it hides
//!    neither the object's other problems nor what validation finds.
//!
//! A task uses the SandboxConfigs of its own namespace, as the operator
//! resolves `sandboxRef`. A document without `metadata.namespace` lands in
//! whatever namespace it is applied to (`kubectl apply -f DIR`), so it may
//! share any: a task without one may use a SandboxConfig of any namespace,
//! a SandboxConfig without one serves a task of any, and two objects of
//! one kind and name are duplicates unless both give different namespaces.
//!
//! Documents of other groups' kinds are reported as `UnknownKind` warnings
//! and skipped, so a file may also hold, say, a Secret; another kind under
//! a `basecamp.dev` apiVersion (`SandboxConfg`) is an error with a "did you
//! mean", as `kubectl apply` refuses it; `sandboxconfig` is not another
//! kind but SandboxConfig in the wrong case, an error (kinds are
//! case-sensitive).

mod metadata;

use std::path::{Path, PathBuf};

use crate::problem::{Location, Problem, Report, Rule, Severity};
use crate::sandbox::{SandboxConfig, SandboxConfigSpec};
use crate::task::HarnessTask;
use crate::validate::{FixtureMemo, ValidationContext, validate_sandbox, validate_task};

/// Where an object came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file as named (a path).
    pub file: String,
    /// 1-based line where the document starts.
    pub line: u64,
}

/// An object and where it came from.
#[derive(Debug, Clone)]
pub struct Loaded<T> {
    /// The object.
    pub object: T,
    /// Its file and line.
    pub source: Source,
}

impl<T> Loaded<T> {
    /// The directory of the file the object came from (relative paths in
    /// the spec are resolved against it); `.` for a bare file name, whose
    /// parent is the empty path (a process cannot start in "").
    pub fn base_dir(&self) -> PathBuf {
        match Path::new(&self.source.file).parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }
}

/// The HarnessTasks and SandboxConfigs read from some files.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// HarnessTasks in file order.
    pub tasks: Vec<Loaded<HarnessTask>>,
    /// SandboxConfigs in file order.
    pub sandboxes: Vec<Loaded<SandboxConfig>>,
    /// SandboxConfigs whose documents were found but could not be read (a
    /// field of the wrong type): `(namespace, name)` and where. A task that
    /// references one is told so, not that it does not exist.
    pub unreadable_sandboxes: Vec<Loaded<(Option<String>, String)>>,
}

/// Why a manifest could not be read (each becomes a [`Problem`]).
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A file or directory that cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A directory without `.yaml` / `.yml` files.
    #[error("{path}: no .yaml or .yml files in this directory")]
    EmptyDirectory {
        /// The directory.
        path: String,
    },
    /// Not YAML.
    #[error("{file}:{line}:{column}: invalid YAML: {message}")]
    Yaml {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
        /// The parser's message.
        message: String,
    },
    /// A document that is not an object, or a field of the wrong type.
    #[error("{file}:{line}: {path}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// The field path (`spec.shards`), or `.` for the document.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl ManifestError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            ManifestError::Io { .. } | ManifestError::EmptyDirectory { .. } => Rule::MissingFile.as_str(),
            ManifestError::Yaml { .. } => Rule::InvalidYaml.as_str(),
            ManifestError::Invalid { .. } => Rule::InvalidManifest.as_str(),
        }
    }

    /// The error as a report problem.
    pub fn to_problem(&self) -> Problem {
        match self {
            ManifestError::Io { path, source } => {
                Problem::error_at(Rule::MissingFile, file_location(path, None), format!("cannot read it: {source}"))
            }
            ManifestError::EmptyDirectory { path } => Problem::error_at(
                Rule::MissingFile,
                file_location(path, None),
                "no .yaml or .yml files in this directory",
            ),
            ManifestError::Yaml { file, line, column, message } => Problem::error_at(
                Rule::InvalidYaml,
                Location::File { file: file.clone(), line: Some(*line), column: Some(*column) },
                format!("invalid YAML: {message}"),
            ),
            ManifestError::Invalid { file, line, path, message } => {
                Problem::error_at(Rule::InvalidManifest, file_location(file, Some(*line)), format!("{path}: {message}"))
            }
        }
    }
}

fn file_location(file: &str, line: Option<u64>) -> Location {
    Location::File { file: file.to_string(), line, column: None }
}

impl Manifests {
    /// Reads every file (or every `.yaml`/`.yml` file of every directory,
    /// sorted by name), returning what could be read and every problem.
    /// A file named twice (`dir dir/task.yaml`, `./a.yaml a.yaml`) is read once.
    pub fn load(paths: &[impl AsRef<Path>]) -> (Manifests, Report) {
        let mut manifests = Manifests::default();
        let mut report = Report::new();
        let mut read = std::collections::HashSet::new();
        for path in paths {
            let path = path.as_ref();
            let files = match manifest_files(path) {
                Ok(files) => files,
                Err(error) => {
                    report.push(error.to_problem());
                    continue;
                }
            };
            for file in files {
                if !read.insert(std::fs::canonicalize(&file).unwrap_or_else(|_| file.clone())) {
                    continue;
                }
                let name = file.display().to_string();
                match read_manifest_file(&file) {
                    Ok(text) => {
                        let (more, problems) = Manifests::parse(&name, &text);
                        manifests.tasks.extend(more.tasks);
                        manifests.sandboxes.extend(more.sandboxes);
                        manifests.unreadable_sandboxes.extend(more.unreadable_sandboxes);
                        report.extend(problems);
                    }
                    Err(source) => report.push(ManifestError::Io { path: name, source }.to_problem()),
                }
            }
        }
        report.extend(manifests.duplicates());
        (manifests, report)
    }

    /// Parses one file's text; `file` names it in messages.
    pub fn parse(file: &str, text: &str) -> (Manifests, Report) {
        let mut manifests = Manifests::default();
        let mut report = Report::new();
        for document in split_documents(text) {
            parse_document(file, &document, &mut manifests, &mut report);
        }
        (manifests, report)
    }

    /// The SandboxConfig called `name` that a task in `task_namespace` uses,
    /// as the operator resolves `sandboxRef` in the task's namespace: one in
    /// that namespace or without one (see [`may_share_namespace`]), never
    /// another namespace's.
    pub fn referenced_sandbox(
        &self,
        task_namespace: Option<&str>,
        name: &str,
    ) -> Result<&Loaded<SandboxConfig>, SandboxRefError> {
        let named: Vec<&Loaded<SandboxConfig>> =
            self.sandboxes.iter().filter(|s| s.object.metadata.name.as_deref() == Some(name)).collect();
        let namespaces_of = |sandboxes: &[&Loaded<SandboxConfig>]| {
            let mut namespaces: Vec<String> =
                sandboxes.iter().filter_map(|s| s.object.metadata.namespace.clone()).collect();
            namespaces.sort_unstable();
            namespaces.dedup();
            namespaces
        };
        let usable: Vec<&Loaded<SandboxConfig>> = named
            .iter()
            .copied()
            .filter(|s| may_share_namespace(task_namespace, s.object.metadata.namespace.as_deref()))
            .collect();
        let namespaces = namespaces_of(&usable);
        match (usable.first(), task_namespace) {
            (None, Some(task_namespace)) if !named.is_empty() => Err(SandboxRefError::OtherNamespace {
                name: name.to_string(),
                namespaces: namespaces_of(&named),
                task_namespace: task_namespace.to_string(),
            }),
            (None, _) => Err(SandboxRefError::Missing { name: name.to_string() }),
            // Only a task without a namespace can see two; which it gets
            // depends on where it is applied.
            (Some(_), None) if namespaces.len() > 1 => {
                Err(SandboxRefError::Ambiguous { name: name.to_string(), namespaces })
            }
            (Some(sandbox), _) => Ok(sandbox),
        }
    }

    /// Validates every task against the sandboxes in the same namespace and
    /// every sandbox on its own, reading local files (test sets, fixtures)
    /// relative to each manifest's directory.
    pub fn validate(&self) -> Report {
        self.validate_in(None)
    }

    /// [`Manifests::validate`], reading local files relative to `base_dir`
    /// when given (what `basecamp-sandbox run --base-dir` resolves against)
    /// instead of each manifest's directory.
    pub fn validate_in(&self, base_dir: Option<&Path>) -> Report {
        let mut report = Report::new();
        for object in self.validate_each(base_dir) {
            report.extend(object.report);
        }
        report
    }

    /// [`Manifests::validate_in`] object by object, tasks first: each
    /// object's problems with the file and line it came from, so that two
    /// objects of one kind and name (in two namespaces, or a YAML manifest's
    /// task and a converted JSON harness's) are told apart by where they
    /// are, not by their `Kind/name`.
    pub fn validate_each(&self, base_dir: Option<&Path>) -> Vec<ObjectReport<'_>> {
        let mut reports = Vec::new();
        // A fixture is checked with its SandboxConfig, each profile of it and
        // each task using it: read once.
        let fixtures = FixtureMemo::default();
        for task in &self.tasks {
            let namespace = task.object.metadata.namespace.as_deref();
            // Each name once, and only those the task can use: a reference
            // to another is reported as not found, then told why.
            let mut names: Vec<&str> =
                self.sandboxes.iter().filter_map(|s| s.object.metadata.name.as_deref()).collect();
            names.sort_unstable();
            names.dedup();
            let sandboxes: Vec<(&str, &SandboxConfigSpec)> = names
                .into_iter()
                .filter_map(|name| self.referenced_sandbox(namespace, name).ok().map(|s| (name, &s.object.spec)))
                .collect();
            let base_dir = base_dir.map_or_else(|| task.base_dir(), Path::to_path_buf);
            let ctx = ValidationContext {
                task_name: task.object.metadata.name.as_deref(),
                test_set: None,
                base_dir: Some(&base_dir),
                fixtures: Some(&fixtures),
            };
            let problems = validate_task(&task.object.spec, &sandboxes, &ctx);
            reports.push(ObjectReport {
                label: ctx.task_label(),
                source: &task.source,
                report: self.unreadable_not_missing(&task.object, problems),
            });
        }
        for sandbox in &self.sandboxes {
            let base_dir = base_dir.map_or_else(|| sandbox.base_dir(), Path::to_path_buf);
            let ctx = ValidationContext { base_dir: Some(&base_dir), fixtures: Some(&fixtures), ..Default::default() };
            let name = sandbox.object.metadata.name.as_deref().unwrap_or("");
            reports.push(ObjectReport {
                label: format!("SandboxConfig/{name}"),
                source: &sandbox.source,
                report: validate_sandbox(name, &sandbox.object.spec, &ctx),
            });
        }
        reports
    }

    /// `problems` of `task`, with "SandboxConfig not found" replaced by why
    /// the task cannot use it: for a SandboxConfig whose document could not
    /// be read, what happened to it (its own error is reported where it
    /// is); for one in another namespace (or, for a task without a
    /// namespace, in several), where it is.
    fn unreadable_not_missing(&self, task: &HarnessTask, problems: Report) -> Report {
        let namespace = task.metadata.namespace.as_deref();
        let refs: Vec<(String, &str)> = if task.spec.variants.is_empty() {
            task.spec.sandbox_ref.iter().map(|r| ("spec.sandboxRef.name".to_string(), r.name.as_str())).collect()
        } else {
            let variants = task.spec.variants.iter().enumerate();
            variants
                .map(|(i, v)| (format!("spec.variants[{i}].sandboxRef.name"), v.sandbox_ref.name.as_str()))
                .collect()
        };
        let mut report = Report::new();
        for mut problem in problems.problems().iter().cloned() {
            let referenced = match &problem.location {
                Location::Field(path) if problem.rule == Rule::UnknownSandbox => {
                    refs.iter().find(|(p, _)| p == path).map(|(_, name)| *name)
                }
                _ => None,
            };
            let unreadable = referenced.and_then(|name| {
                self.unreadable_sandboxes
                    .iter()
                    .find(|u| may_share_namespace(u.object.0.as_deref(), namespace) && u.object.1 == name)
            });
            if let Some(unreadable) = unreadable {
                problem.message = format!(
                    "SandboxConfig {:?} ({}:{}) could not be read, so this variant cannot run; fix the error reported for it",
                    unreadable.object.1, unreadable.source.file, unreadable.source.line
                );
            } else if let Some(Err(unusable)) = referenced.map(|name| self.referenced_sandbox(namespace, name))
                && !matches!(unusable, SandboxRefError::Missing { .. })
            {
                problem.message = unusable.to_string();
            }
            report.push(problem);
        }
        report
    }

    /// Each object of a kind and name already defined in a namespace it
    /// may share (see [`may_share_namespace`]), as an error at its place
    /// naming the first. [`Manifests::load`] reports these; a caller that
    /// adds objects afterwards (converted JSON harness files) checks again.
    pub fn duplicates(&self) -> Report {
        let mut report = Report::new();
        let mut seen: Vec<(&str, Option<&str>, &str, &Source)> = Vec::new();
        let objects = self
            .tasks
            .iter()
            .map(|t| ("HarnessTask", &t.object.metadata, &t.source))
            .chain(self.sandboxes.iter().map(|s| ("SandboxConfig", &s.object.metadata, &s.source)));
        for (kind, metadata, source) in objects {
            let Some(name) = metadata.name.as_deref() else { continue };
            let namespace = metadata.namespace.as_deref();
            if let Some((_, _, _, first)) =
                seen.iter().find(|(k, ns, n, _)| *k == kind && may_share_namespace(*ns, namespace) && *n == name)
            {
                report.push(Problem::error_at(
                    Rule::DuplicateObject,
                    file_location(&source.file, Some(source.line)),
                    format!("{kind} {name:?} is defined twice (first at {}:{}); rename one", first.file, first.line),
                ));
            } else {
                seen.push((kind, namespace, name, source));
            }
        }
        report
    }
}

/// What validation found in one object ([`Manifests::validate_each`]).
#[derive(Debug, Clone)]
pub struct ObjectReport<'a> {
    /// `HarnessTask/<name>` or `SandboxConfig/<name>`: how the object's own
    /// problems name it.
    pub label: String,
    /// The file and line the object came from.
    pub source: &'a Source,
    /// Its problems. A task's include those of the SandboxConfigs it uses,
    /// as it uses them (a profile applied), named by their own label.
    pub report: Report,
}

impl ObjectReport<'_> {
    /// True for a problem of the object itself (a SandboxConfig's with one
    /// of its profiles applied too), not of another object it uses.
    pub fn is_own(&self, problem: &Problem) -> bool {
        problem.object.as_deref().is_some_and(|object| {
            object == self.label
                || object.strip_prefix(self.label.as_str()).is_some_and(|rest| rest.starts_with(" (profile "))
        })
    }
}

/// Whether two objects may end up in the same namespace. A document
/// without `metadata.namespace` lands in whatever namespace it is applied
/// to (`kubectl apply -f DIR`, `-n`), so it may share any namespace.
pub fn may_share_namespace(a: Option<&str>, b: Option<&str>) -> bool {
    a.is_none() || b.is_none() || a == b
}

/// Why a task cannot use the SandboxConfig its `sandboxRef` names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxRefError {
    /// No SandboxConfig of that name.
    #[error("SandboxConfig {name:?} is not in the manifests")]
    Missing {
        /// The name referenced.
        name: String,
    },
    /// SandboxConfigs of that name, each in a namespace other than the task's.
    #[error(
        "SandboxConfig {name:?} is in namespace {}, the task in {task_namespace}; a task uses the SandboxConfigs of its own namespace, so define {name:?} in {task_namespace} (or without a namespace) or move the task",
        namespaces.join(" and ")
    )]
    OtherNamespace {
        /// The name referenced.
        name: String,
        /// Where SandboxConfigs of that name are.
        namespaces: Vec<String>,
        /// The task's namespace.
        task_namespace: String,
    },
    /// A task without a namespace and SandboxConfigs of that name in several.
    #[error(
        "SandboxConfig {name:?} is in namespaces {}, and the task has no namespace, so which one it uses depends on where it is applied; give the task metadata.namespace",
        namespaces.join(" and ")
    )]
    Ambiguous {
        /// The name referenced.
        name: String,
        /// Where SandboxConfigs of that name are.
        namespaces: Vec<String>,
    },
}

/// The most a file of manifests may hold. The API server takes objects of
/// about 1.5 MiB; a file far larger is not manifests (`/dev/zero`, a data
/// set named by mistake), and reading it whole could take all memory.
const MAX_MANIFEST_FILE_BYTES: u64 = 16 << 20;

/// A manifest file's text (YAML, or a JSON harness), refusing one larger
/// than any file of manifests without reading it whole.
pub fn read_manifest_file(file: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(file)?.take(MAX_MANIFEST_FILE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_MANIFEST_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "more than {} MiB, larger than any file of manifests (the API server takes objects of about 1.5 MiB); is it the right file?",
            MAX_MANIFEST_FILE_BYTES >> 20
        )));
    }
    Ok(text)
}

fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let io = |source| ManifestError::Io { path: path.display().to_string(), source };
    if !path.is_dir() {
        std::fs::metadata(path).map_err(io)?;
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(io)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ManifestError::EmptyDirectory { path: path.display().to_string() });
    }
    Ok(files)
}

/// One YAML document: its text, padded with blank lines so that line numbers
/// from the parser are line numbers in the file.
struct Document {
    /// The line a problem with the document as a whole is reported at: its
    /// first line of content (not the `---` before it, nor a comment).
    first_line: u64,
    padded: String,
    lines: Vec<(u64, String)>,
}

/// Splits a YAML stream at `---` (and `...`) lines. Document markers must
/// be at column 0 and cannot occur inside a scalar, so this is exact.
fn split_documents(text: &str) -> Vec<Document> {
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    let mut documents = Vec::new();
    let mut current: Vec<(u64, String)> = Vec::new();
    let mut start_line = 1;
    let flush = |current: &mut Vec<(u64, String)>, start_line: u64, documents: &mut Vec<Document>| {
        if current.iter().any(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#')) {
            let mut padded = "\n".repeat(start_line.saturating_sub(1) as usize);
            for (_, line) in current.iter() {
                padded.push_str(line);
                padded.push('\n');
            }
            let content = |l: &str| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with('#') && l != "---"
            };
            let first_line = current.iter().find(|(_, l)| content(l)).map_or(start_line, |(n, _)| *n);
            documents.push(Document { first_line, padded, lines: std::mem::take(current) });
        }
        current.clear();
    };
    for (index, line) in text.lines().enumerate() {
        let number = index as u64 + 1;
        let is_start = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        let is_end = line == "..." || line.starts_with("... ");
        if is_start || is_end {
            flush(&mut current, start_line, &mut documents);
            start_line = number;
            if is_start {
                current.push((number, line.to_string()));
            } else {
                start_line = number + 1;
            }
            continue;
        }
        current.push((number, line.to_string()));
    }
    flush(&mut current, start_line, &mut documents);
    documents
}

fn parse_document(file: &str, document: &Document, manifests: &mut Manifests, report: &mut Report) {
    let value: serde_json::Value = match serde_saphyr::from_str(&document.padded) {
        Ok(value) => value,
        Err(error) => {
            let (line, column) = location_of(&error, document.first_line);
            report.push(
                ManifestError::Yaml { file: file.into(), line, column, message: message_of(&error, None) }.to_problem(),
            );
            // A task naming it hears that it could not be read, not that there is none.
            if let Some(named) = sandbox_named_in(document) {
                let source = Source { file: file.to_string(), line: document.first_line };
                manifests.unreadable_sandboxes.push(Loaded { object: named, source });
            }
            return;
        }
    };
    let invalid = |path: &str, message: String| {
        ManifestError::Invalid { file: file.into(), line: document.first_line, path: path.into(), message }.to_problem()
    };
    let serde_json::Value::Object(object) = &value else {
        if !value.is_null() {
            report.push(invalid(
                ".",
                "a manifest document must be a mapping with apiVersion, kind, metadata and spec".into(),
            ));
        }
        return;
    };
    let Some(kind) = basecamp_kind(file, document, object.get("kind"), object.get("apiVersion"), report) else {
        return;
    };
    let api_version = object.get("apiVersion").filter(|v| !v.is_null());
    let at_api_version =
        || file_location(file, Some(line_of_key(document, "apiVersion").unwrap_or(document.first_line)));
    match api_version {
        Some(value) if !value.is_string() => report.push(Problem::error_at(
            Rule::InvalidManifest,
            at_api_version(),
            format!(
                "apiVersion is the {} {value}, not a string; write apiVersion: {}",
                json_type(value),
                crate::API_VERSION
            ),
        )),
        _ => {
            let api_version = api_version.and_then(serde_json::Value::as_str).unwrap_or("");
            if api_version != crate::API_VERSION {
                report.push(Problem::error_at(
                    Rule::WrongApiVersion,
                    at_api_version(),
                    format!("apiVersion: {api_version:?}; {kind} is served as apiVersion: {}", crate::API_VERSION),
                ));
            }
        }
    }
    metadata::check(file, document, kind, object.get("metadata"), report);
    let name = object.get("metadata").and_then(|m| m.get("name")).and_then(serde_json::Value::as_str);
    let mut wrong_types_found: Vec<WrongType> = Vec::new();
    if let Some(schema) = crate::crd::schema_of(kind) {
        let mut found = SchemaFindings::default();
        for (key, child) in object {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
                continue;
            }
            match schema.get("properties").and_then(|p| p.get(key)) {
                Some(child_schema) => against_schema(child, child_schema, key, key, &mut found),
                None => {
                    found.unknown.push(UnknownField { path: key.clone(), key: key.clone(), known: known_keys(schema) })
                }
            }
        }
        wrong_types_found = found.wrong;
        for field in found.unknown {
            let hint = crate::validate::suggestion(&field.key, field.known.iter().map(String::as_str));
            let line = line_of_key(document, &field.key);
            report.push(Problem::error_at(
                Rule::UnknownField,
                file_location(file, Some(line.unwrap_or(document.first_line))),
                format!("{}: unknown field {:?} in {kind}; remove it or fix its name.{hint}", field.path, field.key),
            ));
        }
    }
    // The typed read goes on past durations that do not parse (each joins the wrong types, at its line),
    // and stops at its first other error.
    let source = Source { file: file.to_string(), line: document.first_line };
    let result = match kind {
        "HarnessTask" => read_typed::<HarnessTask>(document, &value, kind, &mut wrong_types_found)
            .map(|object| manifests.tasks.push(Loaded { object, source })),
        _ => read_typed::<SandboxConfig>(document, &value, kind, &mut wrong_types_found)
            .map(|object| manifests.sandboxes.push(Loaded { object, source })),
    };
    // Said after the typed read, which stops at its first error: that one is said once, in the typed read's
    // words where they know more (a number's range), else in the schema walk's.
    let line_of = |field: &WrongType| {
        field.line.or_else(|| line_of_field(document, &field.key, &field.path)).unwrap_or(document.first_line)
    };
    wrong_types_found.sort_by_key(line_of);
    // The typed read's words win for a number it could not take (they give its range); for a
    // mapping or a list where a number belongs, the schema walk's say what the field is.
    let mut say_wrong_types = |typed: Option<(&str, u64, String)>| {
        let mut typed = typed;
        for field in &wrong_types_found {
            let line = line_of(field);
            let (line, message) = match typed.take_if(|(path, _, _)| *path == field.path) {
                Some((path, typed_line, message))
                    if matches!(field.expected.as_str(), "integer" | "number")
                        && value_at(&value, path).and_then(collection_kind).is_none() =>
                {
                    (typed_line, message)
                }
                _ => (line, field.message.clone()),
            };
            report.push(
                ManifestError::Invalid { file: file.into(), line, path: field.path.clone(), message }.to_problem(),
            );
        }
        if let Some((path, line, message)) = typed {
            report
                .push(ManifestError::Invalid { file: file.into(), line, path: path.to_string(), message }.to_problem());
        }
    };
    let Err(refused) = result else {
        say_wrong_types(None);
        return;
    };
    if kind == "SandboxConfig"
        && let Some(name) = name
    {
        let namespace = object
            .get("metadata")
            .and_then(|m| m.get("namespace"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        let source = Source { file: file.to_string(), line: document.first_line };
        manifests.unreadable_sandboxes.push(Loaded { object: (namespace, name.to_string()), source });
    }
    say_wrong_types(Some((&refused.path, refused.line, refused.message)));
}

/// The typed read's first error that is not a duration's.
struct Refused {
    path: String,
    line: u64,
    message: String,
}

/// Reads a document as `T`. Serde stops at the first value it refuses, so
/// a duration that does not parse (`timeout: 5 parsecs`) hid every other
/// problem of the object: the durations and types after it, and all that
/// validation finds. So each such duration is added to `wrong` (with its
/// field path and line) and the document read again without it; the object
/// read is then checked with that field's default. Any other error ends
/// the read, as before.
fn read_typed<T: serde::de::DeserializeOwned>(
    document: &Document,
    value: &serde_json::Value,
    kind: &str,
    wrong: &mut Vec<WrongType>,
) -> Result<T, Refused> {
    // The document without the durations found so far, once there is one.
    let mut rest: Option<serde_json::Value> = None;
    let mut text = std::borrow::Cow::Borrowed(document.padded.as_str());
    loop {
        let (path, error) = match deserialize_yaml::<T>(&text) {
            Ok(object) => return Ok(object),
            Err(boxed) => *boxed,
        };
        let key = last_key(&path).to_string();
        let read = rest.as_ref().unwrap_or(value);
        // A read again is of text written here: its lines are not the file's.
        let line = match rest {
            None => location_of(&error, document.first_line).0,
            Some(_) => line_of_field(document, &key, &path).unwrap_or(document.first_line),
        };
        let refused = Refused { message: message_of(&error, value_at(read, &path)), path, line };
        if !is_bad_duration(kind, read, &refused.path) {
            return Err(refused);
        }
        let without = rest.get_or_insert_with(|| value.clone());
        let Some(again) = remove_at(without, &refused.path).then(|| serde_saphyr::to_string(without).ok()).flatten()
        else {
            return Err(refused);
        };
        text = std::borrow::Cow::Owned(again);
        let Refused { path, line, message } = refused;
        wrong.push(WrongType { path, key, expected: "duration".into(), message, line: Some(line) });
    }
}

/// Whether the typed read refused the value at `path` as a duration that
/// does not parse: a single value the duration parser refuses, where the
/// kind's schema has a duration.
fn is_bad_duration(kind: &str, document: &serde_json::Value, path: &str) -> bool {
    use serde::Deserialize as _;
    let Some(found) = value_at(document, path).filter(|v| !v.is_null() && collection_kind(v).is_none()) else {
        return false;
    };
    takes_a_duration(kind, path) && crate::duration::Duration::deserialize(found).is_err()
}

/// Whether the kind's schema has a duration at `path`: an int-or-string
/// (a resource quantity is one too, but takes any single value, so the
/// typed read never refuses one that is not a duration), or `toolTimeouts`
/// (a duration, or a map of them) or one of its entries.
fn takes_a_duration(kind: &str, path: &str) -> bool {
    let Some(mut schema) = crate::crd::schema_of(kind) else { return false };
    for segment in path.split('.') {
        let (key, indexes) = segment.split_once('[').unwrap_or((segment, ""));
        if !key.is_empty() {
            if key == "toolTimeouts" && schema.pointer("/properties/toolTimeouts").is_some() {
                return true;
            }
            let child =
                schema.get("properties").and_then(|p| p.get(key)).or_else(|| schema.get("additionalProperties"));
            let Some(child) = child else { return false };
            schema = child;
        }
        for _ in indexes.split('[').filter(|i| !i.is_empty()) {
            let Some(items) = schema.get("items") else { return false };
            schema = items;
        }
    }
    schema.get("x-kubernetes-int-or-string").and_then(serde_json::Value::as_bool) == Some(true)
}

/// Removes the mapping entry at `path`; false when `path` does not end in one.
fn remove_at(document: &mut serde_json::Value, path: &str) -> bool {
    let (parent, key) = match path.rsplit_once('.') {
        Some((parent, key)) => (value_at_mut(document, parent), key),
        None => (Some(document), path),
    };
    if key.contains('[') {
        return false;
    }
    parent.and_then(serde_json::Value::as_object_mut).is_some_and(|map| map.remove(key).is_some())
}

/// The last key of a field path (`backoff` of `spec.tools.t.http.retry.backoff`).
fn last_key(path: &str) -> &str {
    let last = path.rsplit('.').next().unwrap_or(path);
    last.split('[').next().unwrap_or(last)
}

/// The line of a field: of its key when the document has it once, else
/// found along its path.
fn line_of_field(document: &Document, key: &str, path: &str) -> Option<u64> {
    line_of_key(document, key).or_else(|| line_of_path(document, path))
}

/// The namespace and name of the SandboxConfig a document that is not
/// valid YAML defines, read from its lines as they are usually written
/// (`kind: SandboxConfig` at the top level; `name:` and `namespace:` one
/// level into `metadata:`); `None` when they do not say.
fn sandbox_named_in(document: &Document) -> Option<(Option<String>, String)> {
    let value_of = |line: &str, key: &str| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let value = rest.split(" #").next().unwrap_or("").trim().trim_matches(|c| c == '"' || c == '\'');
        (!value.is_empty()).then(|| value.to_string())
    };
    let lines: Vec<&str> = document.lines.iter().map(|(_, line)| line.as_str()).collect();
    if !lines.iter().any(|line| value_of(line, "kind").as_deref() == Some("SandboxConfig")) {
        return None;
    }
    let metadata = lines.iter().position(|line| line.trim_end() == "metadata:")?;
    let indent = |line: &str| line.len() - line.trim_start().len();
    let block: Vec<&str> =
        lines[metadata + 1..].iter().copied().take_while(|line| line.starts_with(' ') || line.is_empty()).collect();
    let level = indent(block.first()?);
    let field =
        |key: &str| block.iter().filter(|line| indent(line) == level).find_map(|line| value_of(line.trim_start(), key));
    Some((field("namespace"), field("name")?))
}

/// The Basecamp kind a document is read as, or `None` to skip it. Another
/// group's kind is a warning (a file may hold a Secret too); another kind
/// under a `basecamp.dev` apiVersion (`SandboxConfg`) is an error with a
/// did-you-mean, as `kubectl apply` refuses it; a Basecamp kind in the
/// wrong case is an error, since kinds are case-sensitive, and the
/// document is read as the kind it means, so its other mistakes are found.
fn basecamp_kind(
    file: &str,
    document: &Document,
    kind: Option<&serde_json::Value>,
    api_version: Option<&serde_json::Value>,
    report: &mut Report,
) -> Option<&'static str> {
    const KINDS: [&str; 2] = ["HarnessTask", "SandboxConfig"];
    let at_kind = || file_location(file, Some(line_of_key(document, "kind").unwrap_or(document.first_line)));
    if let Some(value) = kind.filter(|v| !v.is_string() && !v.is_null()) {
        // `[SandboxConfig]`: the kind it holds is plain.
        let meant = match value.as_array().map(Vec::as_slice) {
            Some([item]) => item.as_str().and_then(|k| KINDS.iter().find(|known| known.eq_ignore_ascii_case(k))),
            _ => None,
        };
        let write = match meant {
            Some(known) => format!("kind: {known}"),
            None => KINDS.map(|known| format!("kind: {known}")).join(" or "),
        };
        report.push(Problem::error_at(
            Rule::InvalidManifest,
            at_kind(),
            format!("kind is the {} {value}, not a string; write {write}", json_type(value)),
        ));
        return meant.copied();
    }
    let kind = kind.and_then(serde_json::Value::as_str).unwrap_or("");
    if let Some(known) = KINDS.iter().find(|known| known.eq_ignore_ascii_case(kind)) {
        if kind != *known {
            report.push(Problem::error_at(
                Rule::InvalidManifest,
                at_kind(),
                format!(
                    "kind: {kind:?}: kinds are case-sensitive, so Kubernetes does not know this one. Did you mean {known:?}?"
                ),
            ));
        }
        return Some(known);
    }
    let api_version = api_version.and_then(serde_json::Value::as_str).unwrap_or("");
    if !kind.is_empty() && api_version.split('/').next() == Some(crate::GROUP) {
        let hint = crate::validate::suggestion(kind, KINDS);
        report.push(Problem::error_at(
            Rule::InvalidManifest,
            at_kind(),
            format!(
                "kind: {kind:?} is not a Basecamp kind ({}), but apiVersion {api_version} is Basecamp's, so Kubernetes refuses the document; fix the kind.{hint}",
                KINDS.join(", ")
            ),
        ));
        return None;
    }
    if kind.is_empty() && api_version.split('/').next() == Some(crate::GROUP) {
        report.push(Problem::error_at(
            Rule::InvalidManifest,
            file_location(file, Some(document.first_line)),
            format!(
                "a document of apiVersion {api_version} without `kind`, so Kubernetes refuses it; write {}",
                KINDS.map(|known| format!("kind: {known}")).join(" or ")
            ),
        ));
        return None;
    }
    let what = if kind.is_empty() { "a document without `kind`".to_string() } else { format!("kind {kind:?}") };
    report.push(Problem {
        severity: Severity::Warning,
        rule: Rule::UnknownKind,
        object: None,
        location: file_location(file, Some(document.first_line)),
        message: format!("{what} is not a Basecamp kind ({}); skipped", KINDS.join(", ")),
    });
    None
}

fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "list",
        serde_json::Value::Object(_) => "mapping",
    }
}

/// Deserializes YAML text, returning on error the field path (`.` for the
/// document) and the parser's error, which carries the line.
fn deserialize_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, Box<(String, serde_saphyr::Error)>> {
    let mut path = None;
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize::<_, T>(de).map_err(|e| {
            path = Some(e.path().to_string());
            e.into_inner()
        })
    })
    .map_err(|error| Box::new((path.unwrap_or_else(|| ".".to_string()), error)))
}

struct UnknownField {
    path: String,
    key: String,
    known: Vec<String>,
}

fn known_keys(schema: &serde_json::Value) -> Vec<String> {
    schema
        .get("properties")
        .and_then(serde_json::Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// A value of another type than the CRD's schema gives its field: the API
/// server refuses the object. Found for every field at once; the typed
/// read stops at its first error, which is then not said a second time.
/// Also a duration that does not parse (`expected` is `duration`), which
/// the typed read says and goes on past.
struct WrongType {
    path: String,
    /// The last key on the way, for the line.
    key: String,
    /// The schema's type for the field.
    expected: String,
    message: String,
    /// Its line, when the typed read said it (else found by its key or path).
    line: Option<u64>,
}

/// The type the schema gives a field, when it gives exactly one (a field
/// that is an int or a string, or untyped, has none to check).
fn schema_type(schema: &serde_json::Value) -> Option<&str> {
    if schema.get("x-kubernetes-int-or-string").and_then(serde_json::Value::as_bool) == Some(true) {
        return None;
    }
    schema.get("type").and_then(serde_json::Value::as_str)
}

/// "an integer", "a mapping", … for a schema type.
fn a_type(schema_type: &str) -> &'static str {
    match schema_type {
        // As the typed read says it ("expected a whole number from 0 to …").
        "integer" => "a whole number",
        "number" => "a number",
        "boolean" => "a boolean",
        "string" => "a string",
        "object" => "a mapping",
        "array" => "a list",
        _ => "a value",
    }
}

/// What is wrong with `value` where the schema wants `expected`, if anything.
fn wrong_type_message(value: &serde_json::Value, expected: &str) -> Option<String> {
    use serde_json::Value;
    let fits = match expected {
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        _ => true,
    };
    if fits {
        return None;
    }
    let quoted_scalar = |text: &str| match expected {
        "integer" => text.trim().parse::<i128>().is_ok(),
        "number" => text.trim().parse::<f64>().is_ok(),
        "boolean" => matches!(text.trim(), "true" | "false"),
        _ => false,
    };
    Some(match value {
        // What the YAML reader here takes for the number or boolean it looks like.
        Value::String(text) if quoted_scalar(text) => format!(
            "{text:?} is quoted: a string, not {}; the API server refuses it, so write it unquoted",
            a_type(expected)
        ),
        // Said as YAML read it (`1.10` is 1.1, `no` false), so the value to quote is the one written.
        Value::Number(_) | Value::Bool(_) if expected == "string" => format!(
            "YAML reads this as the {} {value}, not a string; the API server refuses it, so quote the value as written",
            if value.is_boolean() { "boolean" } else { "number" }
        ),
        Value::String(text) => format!("expected {}, found the string {text:?}", a_type(expected)),
        Value::Object(_) => format!("expected {}, found a mapping", a_type(expected)),
        Value::Array(_) => format!("expected {}, found a list", a_type(expected)),
        other => format!("expected {}, found the {} {other}", a_type(expected), json_type(other)),
    })
}

/// What a document holds that its kind's schema does not allow.
#[derive(Default)]
struct SchemaFindings {
    /// Fields the schema does not define.
    unknown: Vec<UnknownField>,
    /// Values of another type than the schema gives their field.
    wrong: Vec<WrongType>,
}

/// Walks `value` along `schema`, collecting its unknown fields and its values
/// of the wrong type (whose insides are not walked); `key` is the last key on
/// the way (for its line).
fn against_schema(
    value: &serde_json::Value,
    schema: &serde_json::Value,
    path: &str,
    key: &str,
    found: &mut SchemaFindings,
) {
    if value.is_null()
        || schema.get("x-kubernetes-preserve-unknown-fields").and_then(serde_json::Value::as_bool) == Some(true)
    {
        return;
    }
    if let Some(expected) = schema_type(schema)
        && let Some(message) = wrong_type_message(value, expected)
    {
        let (path, key, expected) = (path.to_string(), key.to_string(), expected.to_string());
        found.wrong.push(WrongType { path, key, expected, message, line: None });
        return;
    }
    match value {
        serde_json::Value::Object(map) => {
            let properties = schema.get("properties").and_then(serde_json::Value::as_object);
            let additional = schema.get("additionalProperties");
            for (child_key, child) in map {
                let child_path = join_path(path, child_key);
                let additional_schema = additional.filter(|a| a.is_object());
                if let Some(child_schema) = properties.and_then(|p| p.get(child_key)).or(additional_schema) {
                    against_schema(child, child_schema, &child_path, child_key, found);
                } else if additional.and_then(serde_json::Value::as_bool) != Some(true) && properties.is_some() {
                    found.unknown.push(UnknownField {
                        path: child_path,
                        key: child_key.clone(),
                        known: known_keys(schema),
                    });
                }
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    against_schema(item, item_schema, &format!("{path}[{index}]"), key, found);
                }
            }
        }
        _ => {}
    }
}

fn join_path(prefix: &str, key: &str) -> String {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        format!("{prefix}.{key}")
    } else {
        format!("{prefix}[{key:?}]")
    }
}

/// The line where `key:` occurs in the document (as a block or flow
/// mapping key), when it occurs exactly once.
fn line_of_key(document: &Document, key: &str) -> Option<u64> {
    let mut found = document.lines.iter().filter(|(_, line)| holds_key(line, key));
    let first = found.next()?;
    if found.next().is_some() { None } else { Some(first.0) }
}

/// Whether `line` holds `key:` as a mapping key (block or flow, quoted or not).
fn holds_key(line: &str, key: &str) -> bool {
    let needles = [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")];
    let is_key_at = |index: usize| {
        line[..index].chars().next_back().is_none_or(|c| c.is_whitespace() || matches!(c, '{' | ',' | '-'))
    };
    needles.iter().any(|needle| line.match_indices(needle.as_str()).any(|(index, _)| is_key_at(index)))
}

/// The line of a field path (`spec.tools.t.description`): each key looked
/// for after the line of the one before, so a key the document uses many
/// times (`weight`, `command`) is found where this path has it.
fn line_of_path(document: &Document, path: &str) -> Option<u64> {
    let mut from = 0;
    let mut line = None;
    for key in path.split('.').map(|segment| segment.split('[').next().unwrap_or(segment)).filter(|k| !k.is_empty()) {
        let at = document.lines[from..].iter().position(|(_, text)| holds_key(text, key))? + from;
        line = Some(document.lines[at].0);
        from = at;
    }
    line
}

fn location_of(error: &serde_saphyr::Error, fallback_line: u64) -> (u64, u64) {
    match error.location() {
        Some(location) if location.line() > 0 => (location.line(), location.column().max(1)),
        _ => (fallback_line, 1),
    }
}

/// The parser's message as a sentence: without its location (the problem
/// gives file:line) or alias notes, and with the parser's own terms (`u32`,
/// budgets, option names) in the user's. `found` is the value at the
/// error's field, when known.
fn message_of(error: &serde_saphyr::Error, found: Option<&serde_json::Value>) -> String {
    use serde_saphyr::{Error, MessageFormatter as _};
    let mut inner = error;
    while let Error::WithSnippet { error, .. } | Error::AliasError { error, .. } = inner {
        inner = error;
    }
    let collection = found.and_then(collection_kind);
    let found = found.map(|value| format!(", found {value}")).unwrap_or_default();
    let text = match inner {
        Error::InvalidScalar { ty, .. } => format!("{}{found}", expected_scalar(ty)),
        // A mapping or a list where a number, a boolean or a string belongs: the
        // parser names only the token it wanted ("expected string scalar").
        Error::Unexpected { expected: "string scalar", .. } => format!(
            "expected a single value (a number, a string or true/false), found {}",
            collection.unwrap_or("a mapping or a list")
        ),
        // A duration, a quantity, …: serde's "invalid type: map, expected …".
        Error::SerdeInvalidType { expected, .. } if let Some(kind) = collection => {
            format!("expected {}, found {kind}", expected_kind(expected))
        }
        Error::DuplicateMappingKey { key: Some(key), .. } => {
            format!("{key} is given twice in the same mapping; keep one")
        }
        Error::DuplicateMappingKey { key: None, .. } => "a key is given twice in the same mapping; keep one".into(),
        Error::Budget { breach, .. } => budget_message(breach),
        other => serde_saphyr::UserMessageFormatter.format_message(other).into_owned(),
    };
    // The text may quote the file (a key); it goes to a terminal.
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// "a mapping" or "a list" for a value that is one (not a single value).
fn collection_kind(value: &serde_json::Value) -> Option<&'static str> {
    match value {
        serde_json::Value::Object(_) => Some("a mapping"),
        serde_json::Value::Array(_) => Some("a list"),
        _ => None,
    }
}

/// What serde's "expected …" names, in the user's terms where it names a
/// Rust type (k8s-openapi's `Quantity`) rather than describing the value.
fn expected_kind(serde_expected: &str) -> String {
    match serde_expected {
        "Quantity" => "a quantity such as 500m, 2 or 1Gi".into(),
        rust if !rust.contains(' ') => expected_scalar(rust).trim_start_matches("expected ").to_string(),
        described => described.to_string(),
    }
}

/// What a scalar of the Rust type `ty` must look like.
fn expected_scalar(ty: &str) -> String {
    let max = match ty {
        "u8" => u64::from(u8::MAX),
        "u16" => u64::from(u16::MAX),
        "u32" => u64::from(u32::MAX),
        "u64" | "usize" => u64::MAX,
        "i8" | "i16" | "i32" | "i64" | "isize" => return "expected a whole number".into(),
        "f32" | "f64" => return "expected a number".into(),
        "bool" => return "expected true or false".into(),
        other => return format!("expected a value of type {other}"),
    };
    format!("expected a whole number from 0 to {max}")
}

/// A resource limit of the YAML parser, which stops hostile or runaway
/// documents (alias bombs, deep nesting) long before memory runs out.
fn budget_message(breach: &serde_saphyr::budget::BudgetBreach) -> String {
    use serde_saphyr::budget::BudgetBreach;
    match breach {
        BudgetBreach::Nodes { nodes } => format!(
            "the document expands to more than {} values: aliases (*name) of anchors that hold aliases multiply it (a \"billion laughs\"); a manifest is far smaller, so write the values out",
            nodes.saturating_sub(1)
        ),
        BudgetBreach::Aliases { aliases } => {
            format!(
                "the document uses more than {} aliases (*name); a manifest needs far fewer",
                aliases.saturating_sub(1)
            )
        }
        BudgetBreach::Depth { depth } => format!(
            "the document is nested more than {} levels deep; no manifest field is, so look for unclosed brackets or runaway indentation",
            depth.saturating_sub(1)
        ),
        other => format!("the document is too large or too complex to be a manifest (parser limit: {other:?})"),
    }
}

/// The value at a field path as serde_path_to_error writes it
/// (`spec.tools.t.exec.command[0]`), when the path can be followed.
fn value_at<'v>(document: &'v serde_json::Value, path: &str) -> Option<&'v serde_json::Value> {
    document.pointer(&json_pointer(path)?)
}

/// [`value_at`], to change it.
fn value_at_mut<'v>(document: &'v mut serde_json::Value, path: &str) -> Option<&'v mut serde_json::Value> {
    document.pointer_mut(&json_pointer(path)?)
}

/// A field path (`spec.tools.t.exec.command[0]`) as a JSON pointer
/// (`/spec/tools/t/exec/command/0`); `None` for an index that is not a number.
fn json_pointer(path: &str) -> Option<String> {
    let mut pointer = String::new();
    for segment in path.split('.') {
        let (key, indexes) = segment.split_once('[').unwrap_or((segment, ""));
        if !key.is_empty() {
            pointer.push('/');
            pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
        }
        for index in indexes.split('[').filter(|i| !i.is_empty()) {
            pointer.push('/');
            pointer.push_str(&index.strip_suffix(']')?.parse::<usize>().ok()?.to_string());
        }
    }
    Some(pointer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_file_name_resolves_against_the_current_directory() {
        let at = |file: &str| Loaded { object: (), source: Source { file: file.into(), line: 1 } }.base_dir();
        assert_eq!(at("task.yaml"), PathBuf::from("."));
        assert_eq!(at("./task.yaml"), PathBuf::from("."));
        assert_eq!(at("examples/ecommerce/task.yaml"), PathBuf::from("examples/ecommerce"));
        assert_eq!(at("/etc/basecamp/task.yaml"), PathBuf::from("/etc/basecamp"));
    }

    fn examples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/manifests")
    }

    #[test]
    fn a_problem_with_a_whole_document_is_at_its_first_line_not_the_separator() {
        // Before: lines 2 and 5, the `---` before each document.
        let text = "kind: SandboxConfig\n---\n# a note\nhello\n---\n\nmetadata: {name: x}\n";
        let (_, report) = Manifests::parse("m.yaml", text);
        let at: Vec<(Location, &str)> =
            report.problems().iter().map(|p| (p.location.clone(), p.message.split(':').next().unwrap())).collect();
        assert!(at.iter().any(|(l, _)| *l == Location::line("m.yaml", 4)), "{report}");
        assert!(at.iter().any(|(l, _)| *l == Location::line("m.yaml", 7)), "{report}");
    }

    #[test]
    fn the_example_manifest_loads_and_validates_clean() {
        let (manifests, report) = Manifests::load(&[examples().join("shipping-support.yaml")]);
        assert!(report.is_empty(), "{report}");
        assert_eq!(manifests.tasks.len(), 1);
        assert_eq!(manifests.sandboxes.len(), 1);
        let task = &manifests.tasks[0];
        assert_eq!(task.object.metadata.name.as_deref(), Some("shipping-support"));
        assert!(task.source.line > 1, "the task is the second document");
        let namespace = task.object.metadata.namespace.as_deref();
        let sandbox = manifests.referenced_sandbox(namespace, "shipping-tools").expect("sandbox");
        assert_eq!(sandbox.object.spec.tool_timeout_for("track_order").as_millis(), 2_000);
        let report = manifests.validate();
        assert!(report.is_empty(), "{report}");
    }

    #[test]
    fn a_directory_loads_its_yaml_files() {
        let (manifests, report) = Manifests::load(&[examples()]);
        assert!(report.is_empty(), "{report}");
        assert_eq!((manifests.tasks.len(), manifests.sandboxes.len()), (1, 1));
        let (_, report) = Manifests::load(&[examples().join("fixtures")]);
        assert_eq!(report.problems()[0].rule, Rule::MissingFile);
        let (_, report) = Manifests::load(&[examples().join("nope.yaml")]);
        assert_eq!(report.problems()[0].rule, Rule::MissingFile);
    }

    #[test]
    fn a_file_named_twice_is_read_once() {
        // Before: its task was "defined twice (first at <the same file>:1)".
        let file = examples().join("shipping-support.yaml");
        let (manifests, report) =
            Manifests::load(&[examples(), file.clone(), examples().join(".").join("shipping-support.yaml")]);
        assert!(report.is_empty(), "{report}");
        assert_eq!((manifests.tasks.len(), manifests.sandboxes.len()), (1, 1));
        assert!(manifests.validate().is_empty(), "{}", manifests.validate());
    }

    #[test]
    fn the_broken_manifest_reports_all_five_mistakes() {
        let (manifests, mut report) = Manifests::load(&[examples().join("broken")]);
        report.extend(manifests.validate());
        let errors: Vec<&Problem> = report.errors().collect();
        let rules: Vec<Rule> = errors.iter().map(|p| p.rule).collect();
        assert_eq!(
            rules,
            [Rule::UnknownField, Rule::InvalidCriterion, Rule::S3UriQuery, Rule::InvalidShards, Rule::UndefinedTool],
            "{report}"
        );
        let unknown = errors[0].to_string();
        assert!(unknown.contains("shipping-broken.yaml:23: spec.planStepTimout: unknown field"), "{unknown}");
        assert!(unknown.contains("Did you mean \"planStepTimeout\"?"), "{unknown}");
        // And what the typo costs: the plan step left at its default 3 s, under the policy's 60 s.
        let warnings: Vec<&Problem> = report.warnings().collect();
        assert_eq!(warnings.iter().map(|p| p.rule).collect::<Vec<_>>(), [Rule::TimeoutExceedsStep], "{report}");
        assert!(warnings[0].message.contains("ends after 3s"), "{report}");
    }

    #[test]
    fn yaml_syntax_errors_name_file_line_and_column() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {name: a}\nspec: {}\n---\nkind: HarnessTask\nspec: [1, 2\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        assert_eq!(manifests.sandboxes.len(), 1);
        let problem = &report.problems()[0];
        assert_eq!(problem.rule, Rule::InvalidYaml);
        match &problem.location {
            Location::File { file, line, column } => {
                assert_eq!(file, "m.yaml");
                assert_eq!(*line, Some(7));
                assert!(column.is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_task_referencing_a_sandbox_that_is_not_valid_yaml_is_not_told_it_is_missing() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  labels: {team: a}\n  name: shop-a # the shop\n  namespace: \"team-a\"\nspec:\n  maxSteps: [1\n---\napiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {name: t, namespace: team-a}\nspec:\n  taskDefinition: {}\n  evaluation: {testSet: s3://bucket/tests.jsonl}\n  policy: {endpoint: http://localhost:8000/v1, model: m}\n  sandboxRef: {name: shop-a}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        assert!(report.problems()[0].message.starts_with("invalid YAML"), "{report}");
        assert_eq!(manifests.unreadable_sandboxes[0].object, (Some("team-a".to_string()), "shop-a".to_string()));
        // Before: "SandboxConfig \"shop-a\" not found (available: none)", sending the user to look for it.
        let validation = manifests.validate();
        let problem = validation.by_rule(Rule::UnknownSandbox).next().expect("the reference is still an error");
        assert!(problem.message.contains("SandboxConfig \"shop-a\" (m.yaml:1) could not be read"), "{problem}");
    }

    #[test]
    fn type_errors_name_the_field_path_and_line() {
        let text = "# comment\n---\napiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  name: a\nspec:\n  maxSteps: many\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        assert!(manifests.sandboxes.is_empty());
        let problem = &report.problems()[0];
        assert_eq!(problem.rule, Rule::InvalidManifest);
        assert_eq!(problem.location, Location::line("m.yaml", 8));
        assert!(problem.message.starts_with("spec.maxSteps: "), "{problem}");
        assert_eq!(
            ManifestError::Io { path: "x".into(), source: std::io::ErrorKind::NotFound.into() }.category(),
            "MissingFile"
        );
    }

    #[test]
    fn a_task_referencing_a_sandbox_that_did_not_parse_is_not_told_it_is_missing() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {name: shop-a}\nspec:\n  maxSteps: many\n---\napiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {name: shop-b}\nspec: {}\n---\napiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {name: t}\nspec:\n  taskDefinition: {}\n  evaluation: {testSet: s3://bucket/tests.jsonl}\n  policy: {endpoint: http://localhost:8000/v1, model: m}\n  variants:\n    - {name: a, sandboxRef: {name: shop-a}}\n    - {name: b, sandboxRef: {name: shop-b}}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        assert_eq!(report.len(), 1, "{report}");
        assert!(report.problems()[0].message.starts_with("spec.maxSteps: "), "{report}");
        let validation = manifests.validate();
        // Before: "SandboxConfig \"shop-a\" not found (available: shop-b) ... Did you mean \"shop-b\"?"
        let problem = validation.by_rule(Rule::UnknownSandbox).next().expect("the reference is still an error");
        assert_eq!(problem.location, Location::field("spec.variants[0].sandboxRef.name"));
        assert!(!problem.message.contains("not found") && !problem.message.contains("Did you mean"), "{problem}");
        assert!(problem.message.contains("SandboxConfig \"shop-a\" (m.yaml:1) could not be read"), "{problem}");
        assert_eq!(validation.errors().count(), 1, "{validation}");
    }

    #[test]
    fn yaml_errors_read_as_sentences_without_parser_internals() {
        let head = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\n";
        let message = |text: &str| {
            let (_, report) = Manifests::parse("m.yaml", &format!("{head}{text}"));
            assert_eq!(report.len(), 1, "{report}");
            report.problems()[0].message.clone()
        };
        // A type error on an aliased value: before, the message was cut at
        // its alias note and ended in "(used".
        let aliased = message("metadata: {name: a, labels: {steps: &n many}}\nspec:\n  maxSteps: *n\n");
        assert!(aliased.starts_with("spec.maxSteps: expected a whole number from 0 to 4294967295"), "{aliased}");
        assert!(!aliased.contains("(used") && !aliased.contains("u32"), "{aliased}");
        let negative = message("metadata: {name: a}\nspec:\n  maxSteps: -1\n");
        assert_eq!(negative, "spec.maxSteps: expected a whole number from 0 to 4294967295, found -1");
        // Before: "budget breached: Nodes { nodes: 250001 } at line 5, column 35 (defined at ... (used".
        let mut bomb =
            String::from("metadata: {name: a}\nspec:\n  x0: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for (i, (anchor, alias)) in
            ["b", "c", "d", "e", "f", "g"].iter().zip(["a", "b", "c", "d", "e", "f"]).enumerate()
        {
            let items = vec![format!("*{alias}"); 9].join(", ");
            bomb.push_str(&format!("  x{}: &{anchor} [{items}]\n", i + 1));
        }
        let bomb = message(&bomb);
        assert!(bomb.starts_with("invalid YAML: the document expands to more than"), "{bomb}");
        assert!(bomb.contains("aliases") && !bomb.contains("Nodes {") && !bomb.contains("(used"), "{bomb}");
        // Before: "... set DuplicateKeyPolicy in Options if acceptable".
        let duplicate = message("metadata: {name: a}\nspec:\n  maxSteps: 3\n  maxSteps: 5\n");
        assert_eq!(duplicate, "invalid YAML: maxSteps is given twice in the same mapping; keep one");
    }

    #[test]
    fn names_that_are_numbers_too_long_or_bad_namespaces_say_what_is_wrong() {
        let problem = |metadata: &str| {
            let text =
                format!("apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {metadata}\nspec: {{}}\n");
            let (_, report) = Manifests::parse("m.yaml", &text);
            assert_eq!(report.len(), 1, "{report}");
            report.problems()[0].clone()
        };
        // Before: "every SandboxConfig needs metadata.name", though it has one.
        let number = problem("{name: 12345}");
        assert_eq!(number.rule, Rule::InvalidName);
        assert!(
            number.message.contains("metadata.name is the number 12345") && number.message.contains("\"12345\""),
            "{number}"
        );
        // Before: "is not a Kubernetes name (lowercase letters, digits, '-' and '.')", which it was.
        let long = problem(&format!("{{name: {}}}", "a".repeat(300)));
        assert!(long.message.contains("300 characters") && long.message.contains("at most 253"), "{long}");
        // A name is a subdomain: 253 characters, no 63-character limit on a part (that is a
        // label's). Before: 64-253 characters without dots were refused as not a Kubernetes name.
        for name in ["a".repeat(64), "a".repeat(253), format!("{}.b", "a".repeat(100))] {
            let text = format!(
                "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {{name: {name}}}\nspec: {{}}\n"
            );
            let (manifests, report) = Manifests::parse("m.yaml", &text);
            assert!(report.is_empty() && manifests.sandboxes.len() == 1, "{}: {report}", name.len());
        }
        // The rule broken is named.
        let underscore = problem("{name: shop_a}");
        assert_eq!(
            underscore.message,
            "metadata.name \"shop_a\" is not a Kubernetes name: it has '_'; names have only lowercase letters, digits, '-' and '.'"
        );
        // Before: accepted; the API server refuses it.
        let namespace = problem("{name: a, namespace: Team A}");
        assert_eq!(namespace.rule, Rule::InvalidName);
        assert!(
            namespace.message.starts_with("metadata.namespace \"Team A\" is not a Kubernetes namespace"),
            "{namespace}"
        );
    }

    #[test]
    fn an_unknown_metadata_key_is_an_error_with_a_did_you_mean() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  name: a\n  namespce: team-a\nspec: {}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        // Before: accepted, and the object went to the default namespace.
        assert_eq!(report.len(), 1, "{report}");
        let problem = &report.problems()[0];
        assert_eq!(problem.rule, Rule::UnknownField);
        assert_eq!(problem.location, Location::line("m.yaml", 5));
        assert_eq!(
            problem.message,
            "metadata.namespce: unknown field \"namespce\" in SandboxConfig; remove it or fix its name. Did you mean \"namespace\"?"
        );
        assert_eq!(manifests.sandboxes.len(), 1, "the rest of the document is still read");
        // What kubectl get -o yaml writes back is accepted as it is.
        let exported = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  name: a\n  namespace: team-a\n  generateName: a-\n  labels: {team: a}\n  annotations: {note: x}\n  uid: 0b6d2c3e-8f1a-4c2b-9d7e-1f2a3b4c5d6e\n  resourceVersion: \"42\"\n  generation: 3\n  creationTimestamp: \"2026-11-30T10:00:00Z\"\n  finalizers: [basecamp.dev/cleanup]\n  ownerReferences: []\n  managedFields: [{manager: kubectl, operation: Apply}]\nspec: {}\n";
        let (_, report) = Manifests::parse("m.yaml", exported);
        assert!(report.is_empty(), "{report}");
    }

    #[test]
    fn a_scalar_of_another_type_than_the_crd_gives_is_an_error_at_its_line() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  name: a\nspec:\n  maxSteps: \"4\"\n  tools:\n    t:\n      description: 7\n      exec: {command: [\"true\"]}\n";
        let (_, report) = Manifests::parse("m.yaml", text);
        // Before: both read as what they look like; kubectl apply is refused by the API server.
        let messages: Vec<(Location, &str)> =
            report.problems().iter().map(|p| (p.location.clone(), p.message.as_str())).collect();
        assert_eq!(
            messages,
            [
                (
                    Location::line("m.yaml", 6),
                    "spec.maxSteps: \"4\" is quoted: a string, not a whole number; the API server refuses it, so \
                     write it unquoted"
                ),
                (
                    Location::line("m.yaml", 9),
                    "spec.tools.t.description: YAML reads this as the number 7, not a string; the API server refuses \
                     it, so quote the value as written"
                ),
            ],
            "{report}"
        );
        // A key the document has many times is placed where this path has it (before: the document's line).
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  name: a\nspec:\n  tools:\n    s:\n      description: fine\n      exec: {command: [\"true\"]}\n    t:\n      description: 1.10\n      exec: {command: [\"true\"]}\n";
        let (_, report) = Manifests::parse("m.yaml", text);
        let problem = &report.problems()[0];
        assert_eq!(problem.location, Location::line("m.yaml", 11), "{report}");
        assert!(problem.message.contains("YAML reads this as the number 1.1"), "{report}");
        // Every one at once: the typed read stops at its first, and says it only when this walk did not.
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  name: a\nspec:\n  maxSteps: many\n  rollback: [true]\n  trace:\n    errorContext: \"false\"\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        assert!(manifests.sandboxes.is_empty(), "maxSteps cannot be read");
        let messages: Vec<String> = report.problems().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            messages,
            [
                "error: m.yaml:6: spec.maxSteps: expected a whole number from 0 to 4294967295, found \"many\"",
                "error: m.yaml:7: spec.rollback: expected a mapping, found a list",
                "error: m.yaml:9: spec.trace.errorContext: \"false\" is quoted: a string, not a boolean; the API \
                 server refuses it, so write it unquoted",
            ],
        );
    }

    /// Before: "expected string scalar" (the parser's token) for every number,
    /// and "invalid type: map, expected Quantity" for a quantity.
    #[test]
    fn a_mapping_or_a_list_where_a_single_value_belongs_says_what_was_expected_and_found() {
        let task = |field: &str| {
            let text = std::fs::read_to_string(examples().join("shipping-support.yaml")).unwrap();
            let (_, report) = Manifests::parse("m.yaml", &text.replace("  shards: 2\n", &format!("  {field}\n")));
            let messages: Vec<String> = report.problems().iter().map(|p| p.message.clone()).collect();
            assert_eq!(messages.len(), 1, "{report}");
            messages[0].clone()
        };
        assert_eq!(task("shards: {n: 2}"), "spec.shards: expected a whole number, found a mapping");
        assert_eq!(task("shards: [2]"), "spec.shards: expected a whole number, found a list");
        let sandbox = |patch: &str| {
            let text = format!(
                "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {{name: a}}\nspec:\n  {patch}\n"
            );
            let (_, report) = Manifests::parse("m.yaml", &text);
            let messages: Vec<String> = report.problems().iter().map(|p| p.to_string()).collect();
            assert_eq!(messages.len(), 1, "{report}");
            messages[0].clone()
        };
        assert_eq!(
            sandbox("maxSteps: {a: 1}"),
            "error: m.yaml:5: spec.maxSteps: expected a whole number, found a mapping"
        );
        assert_eq!(
            sandbox("planStepTimeout: [5s]"),
            "error: m.yaml:5: spec.planStepTimeout: expected a duration such as \"800ms\", \"1.5s\", \"2m\", or an \
             integer number of milliseconds, found a list"
        );
        assert_eq!(
            sandbox("resources: {requests: {cpu: {x: 1}}}"),
            "error: m.yaml:5: spec.resources.requests.cpu: expected a quantity such as 500m, 2 or 1Gi, found a mapping"
        );
        assert_eq!(
            sandbox("rewards: {components: {c: {weight: [1], source: tool_call_accuracy}}}"),
            "error: m.yaml:5: spec.rewards.components.c.weight: expected a number, found a list"
        );
        // A number the schema does not type is said by what the parser wanted.
        let error = serde_saphyr::from_str::<u32>("{a: 1}").unwrap_err();
        assert_eq!(
            message_of(&error, Some(&serde_json::json!({"a": 1}))),
            "expected a single value (a number, a string or true/false), found a mapping"
        );
    }

    #[test]
    fn labels_and_annotations_are_strings_with_the_label_syntax() {
        let text_with = |metadata: &str| {
            format!(
                "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata:\n  name: a\n{metadata}spec: {{}}\n"
            )
        };
        let problems = |metadata: &str| {
            let (manifests, report) = Manifests::parse("m.yaml", &text_with(metadata));
            assert_eq!(manifests.sandboxes.len(), 1, "the rest of the document is still read: {report}");
            report.problems().to_vec()
        };
        // Before: both accepted; the API server refuses a number or a boolean there.
        let typed = problems("  labels:\n    team: 1\n  annotations:\n    enabled: true\n");
        assert_eq!(typed.len(), 2, "{typed:?}");
        assert_eq!(typed[0].rule, Rule::InvalidManifest);
        assert_eq!(typed[0].location, Location::line("m.yaml", 6));
        assert_eq!(typed[0].message, "metadata.labels.team is the number 1, not a string; quote it: team: \"1\"");
        assert_eq!(typed[1].location, Location::line("m.yaml", 8));
        assert_eq!(
            typed[1].message,
            "metadata.annotations.enabled is the boolean true, not a string; quote it: enabled: \"true\""
        );
        // Label syntax: keys (an optional DNS-subdomain prefix) and values.
        let long = "v".repeat(64);
        let syntax = problems(&format!(
            "  labels:\n    app.kubernetes.io/name: shop\n    empty: ''\n    bad key: x\n    tier: -x\n    size: {long}\n    Team/x: v\n"
        ));
        let mut messages: Vec<&str> = syntax.iter().map(|p| p.message.as_str()).collect();
        messages.sort_unstable();
        assert_eq!(messages.len(), 4, "{messages:#?}");
        assert_eq!(messages[0], "metadata.labels.size is 64 characters; label values are at most 63");
        assert!(messages[1].starts_with("metadata.labels.tier: \"-x\" is not a label value"), "{messages:#?}");
        assert!(messages[2].starts_with("metadata.labels[\"Team/x\"]: \"Team/x\" is not a label key"), "{messages:#?}");
        assert!(
            messages[3].starts_with("metadata.labels[\"bad key\"]: \"bad key\" is not a label key"),
            "{messages:#?}"
        );
        // A missing value is the type check's, once.
        let (_, null) = Manifests::parse("m.yaml", &text_with("  labels:\n    team:\n"));
        assert_eq!(null.len(), 1, "{null}");
        assert_eq!(null.problems()[0].message, "metadata.labels.team: null is not allowed here");
        assert!(syntax.iter().all(|p| p.rule == Rule::InvalidName), "{syntax:?}");
        let annotation = problems("  annotations:\n    note: '-free text, any length: fine-'\n    a b: x\n");
        assert_eq!(annotation.len(), 1, "{annotation:?}");
        assert!(annotation[0].message.starts_with("metadata.annotations[\"a b\"]: \"a b\" is not an annotation key"));
    }

    #[test]
    fn every_unknown_field_is_reported_not_just_the_first() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {name: a}\nspec:\n  tools:\n    t:\n      http: {url: 'http://x', methd: GET}\n  trace: {levle: full}\n  gpu: {minComputeCapability: '8.0'}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        let paths: Vec<String> = report.by_rule(Rule::UnknownField).map(|p| p.message.clone()).collect();
        assert_eq!(paths.len(), 2, "{report}");
        assert!(paths[0].starts_with("spec.tools.t.http.methd"), "{paths:?}");
        assert!(paths[1].starts_with("spec.trace.levle") && paths[1].contains("Did you mean \"level\"?"), "{paths:?}");
        // Unknown fields do not stop the typed parse: other checks still run.
        assert_eq!(manifests.sandboxes.len(), 1);
    }

    #[test]
    fn a_bad_duration_is_one_problem_among_the_objects_others() {
        let text = "apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata: {name: sb}
spec:
  tools:
    track:
      http: {url: 'http://localhost:1/x', retry: {attempts: 2, backoff: 2 fortnights}}
  toolTimeouts: {default: 800ms, track: 5 parsecs}
  planStepTimeout: 0s
  fallbacks:
    nosuch: {observation: {}}
  profiles:
    slow: {toolTimeouts: soon}
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata: {name: t}
spec:
  shards: 0
  taskDefinition: {}
  evaluation: {testSet: s3://bucket/tests.jsonl}
  policy: {endpoint: 'http://localhost:8000/v1', model: m, requestTimeout: 5 parsecs}
  sandboxRef: {name: sb}
";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        let said: Vec<(Location, &str)> =
            report.problems().iter().map(|p| (p.location.clone(), p.message.as_str())).collect();
        // Before: only the first, the backoff; the object was not read, so nothing else was checked.
        let bad = |line: u64, path: &str, input: &str| {
            (Location::line("m.yaml", line), format!("{path}: invalid duration {input:?}: "))
        };
        let expected = [
            bad(7, "spec.tools.track.http.retry.backoff", "2 fortnights"),
            bad(8, "spec.toolTimeouts.track", "5 parsecs"),
            bad(22, "spec.policy.requestTimeout", "5 parsecs"),
        ];
        assert_eq!(said.len(), expected.len(), "{report}");
        for ((location, message), (expected_location, start)) in said.iter().zip(&expected) {
            assert_eq!(location, expected_location, "{message}");
            assert!(message.starts_with(start.as_str()), "{message}");
        }
        assert!(report.problems().iter().all(|p| p.rule == Rule::InvalidManifest && p.is_error()));
        // Both objects are read, so validation finds the rest of what is wrong.
        assert_eq!((manifests.sandboxes.len(), manifests.tasks.len()), (1, 1));
        let validation = manifests.validate();
        let problem_at = |rule: Rule| validation.by_rule(rule).map(|p| p.location.to_string()).collect::<Vec<_>>();
        assert_eq!(problem_at(Rule::NonPositiveDuration), ["spec.planStepTimeout"], "{validation}");
        assert_eq!(problem_at(Rule::UndefinedTool), ["spec.fallbacks.nosuch"], "{validation}");
        assert_eq!(problem_at(Rule::InvalidShards), ["spec.shards"], "{validation}");
        // A profile is read when validation applies it, as before.
        let profile = validation.problems().iter().find(|p| p.location == Location::field("spec.profiles.slow"));
        assert!(profile.is_some_and(|p| p.message.contains("invalid duration \"soon\"")), "{validation}");
        assert_eq!(validation.errors().count(), 4, "{validation}");
    }

    #[test]
    fn a_duration_is_still_read_past_only_when_its_field_takes_one() {
        // A quantity is an int-or-string too, but takes any single value; a
        // string where a number belongs is a type error that ends the read.
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {name: sb}\nspec:\n  planStepTimeout: soon\n  resources: {limits: {memory: 1Gi}}\n  trace: {topK: lots}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        let messages: Vec<&str> = report.problems().iter().map(|p| p.message.as_str()).collect();
        assert_eq!(messages.len(), 2, "{report}");
        assert!(messages[0].starts_with("spec.planStepTimeout: invalid duration \"soon\""), "{messages:?}");
        assert!(messages[1].starts_with("spec.trace.topK: "), "{messages:?}");
        assert!(manifests.sandboxes.is_empty(), "a type error other than a duration's still ends the read");
        assert_eq!(manifests.unreadable_sandboxes.len(), 1);
    }

    #[test]
    fn unknown_fields_inside_profiles_and_tool_timeouts_forms() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {name: a}\nspec:\n  tools:\n    t: {exec: {command: [x]}}\n  toolTimeouts: 800\n  profiles:\n    dev:\n      trace: {topk: 3}\n      toolTimeouts: {default: 1s, t: 2s}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        let problem = report.by_rule(Rule::UnknownField).next().expect("unknown field in profile");
        assert!(problem.message.starts_with("spec.profiles.dev.trace.topk"), "{problem}");
        assert!(problem.message.contains("Did you mean \"topK\"?"), "{problem}");
        assert_eq!(problem.location, Location::line("m.yaml", 10));
        assert_eq!(report.len(), 1, "{report}");
        let validation = manifests.validate();
        assert_eq!(validation.by_rule(Rule::BareToolTimeout).count(), 1, "{validation}");
        assert!(!validation.has_errors(), "{validation}");
    }

    #[test]
    fn other_kinds_are_skipped_with_a_warning_and_api_versions_checked() {
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n---\napiVersion: basecamp.dev/v1\nkind: SandboxConfig\nmetadata: {name: a}\nspec: {}\n---\napiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {name: a}\nspec: {}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        assert_eq!(report.by_rule(Rule::UnknownKind).next().map(|p| p.severity), Some(Severity::Warning));
        assert_eq!(report.by_rule(Rule::WrongApiVersion).count(), 1, "{report}");
        assert_eq!(manifests.sandboxes.len(), 2);
        assert_eq!(manifests.duplicates().by_rule(Rule::DuplicateObject).count(), 1);
    }

    #[test]
    fn a_kind_in_the_wrong_case_is_an_error_naming_the_right_one() {
        let text = "apiVersion: basecamp.dev/v1alpha1\nkind: sandboxconfig\nmetadata: {name: a}\nspec: {}\n";
        let (manifests, report) = Manifests::parse("m.yaml", text);
        // Before: a warning ("not a Basecamp kind; skipped"); kubectl apply fails on it.
        assert_eq!(report.len(), 1, "{report}");
        let problem = &report.problems()[0];
        assert_eq!((problem.severity, problem.rule), (Severity::Error, Rule::InvalidManifest));
        assert_eq!(problem.location, Location::line("m.yaml", 2));
        assert_eq!(
            problem.message,
            "kind: \"sandboxconfig\": kinds are case-sensitive, so Kubernetes does not know this one. Did you mean \"SandboxConfig\"?"
        );
        assert_eq!(manifests.sandboxes.len(), 1, "read as the kind it means, so its other mistakes are found too");
    }

    #[test]
    fn a_kind_basecamp_does_not_have_under_its_api_version_is_an_error_with_a_did_you_mean() {
        let read = |head: &str| {
            let (manifests, report) = Manifests::parse("m.yaml", &format!("{head}metadata: {{name: a}}\nspec: {{}}\n"));
            assert_eq!(report.len(), 1, "{report}");
            (manifests, report.problems()[0].clone())
        };
        // Before: a warning ("not a Basecamp kind ...; skipped"); kubectl apply fails on it.
        let (manifests, problem) = read("apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfg\n");
        assert_eq!((problem.severity, problem.rule), (Severity::Error, Rule::InvalidManifest));
        assert_eq!(problem.location, Location::line("m.yaml", 2));
        assert_eq!(
            problem.message,
            "kind: \"SandboxConfg\" is not a Basecamp kind (HarnessTask, SandboxConfig), but apiVersion basecamp.dev/v1alpha1 is Basecamp's, so Kubernetes refuses the document; fix the kind. Did you mean \"SandboxConfig\"?"
        );
        assert!(manifests.sandboxes.is_empty() && manifests.tasks.is_empty());
        let (_, problem) = read("apiVersion: basecamp.dev/v1\nkind: HarnessTsk\n");
        assert_eq!(problem.severity, Severity::Error);
        assert!(problem.message.ends_with("fix the kind. Did you mean \"HarnessTask\"?"), "{problem}");
        let (_, problem) = read("apiVersion: basecamp.dev/v1alpha1\nkind: Widget\n");
        assert_eq!(problem.severity, Severity::Error);
        assert!(problem.message.ends_with("so Kubernetes refuses the document; fix the kind."), "{problem}");
        // Another group's kinds are still skipped: a file may hold a ConfigMap too.
        let (_, problem) = read("apiVersion: v1\nkind: ConfigMap\n");
        assert_eq!((problem.severity, problem.rule), (Severity::Warning, Rule::UnknownKind));
        let (_, problem) = read("apiVersion: apps.basecamp.dev/v1\nkind: SandboxConfg\n");
        assert_eq!((problem.severity, problem.rule), (Severity::Warning, Rule::UnknownKind));
    }

    #[test]
    fn a_kind_or_api_version_that_is_not_a_string_is_named_for_what_it_is() {
        let message = |head: &str| {
            let (_, report) = Manifests::parse("m.yaml", &format!("{head}metadata: {{name: a}}\nspec: {{}}\n"));
            assert_eq!(report.len(), 1, "{report}");
            let problem = report.problems()[0].clone();
            assert_eq!((problem.severity, problem.rule), (Severity::Error, Rule::InvalidManifest), "{problem}");
            problem.message
        };
        // Before: "a document without `kind` is not a Basecamp kind ...; skipped", a warning.
        assert_eq!(
            message("apiVersion: basecamp.dev/v1alpha1\nkind: [SandboxConfig]\n"),
            "kind is the list [\"SandboxConfig\"], not a string; write kind: SandboxConfig"
        );
        assert_eq!(
            message("apiVersion: basecamp.dev/v1alpha1\nkind: 7\n"),
            "kind is the number 7, not a string; write kind: HarnessTask or kind: SandboxConfig"
        );
        // Before: "apiVersion: \"\"; SandboxConfig is served as apiVersion: basecamp.dev/v1alpha1".
        assert_eq!(
            message("apiVersion: [basecamp.dev/v1alpha1]\nkind: SandboxConfig\n"),
            "apiVersion is the list [\"basecamp.dev/v1alpha1\"], not a string; write apiVersion: basecamp.dev/v1alpha1"
        );
    }

    #[test]
    fn a_sandbox_defined_twice_is_an_error_naming_both_and_listed_once() {
        let dir = std::env::temp_dir().join(format!("basecamp-api-twice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let sandbox = |name: &str| {
            format!("apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {{name: {name}}}\nspec: {{}}\n")
        };
        let task = "apiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {name: t}\nspec:\n  taskDefinition: {}\n  evaluation: {testSet: s3://bucket/tests.jsonl}\n  policy: {endpoint: http://localhost:8000/v1, model: m}\n  sandboxRef: {name: shop-z}\n";
        std::fs::write(dir.join("a.yaml"), format!("{}---\n{}---\n{task}", sandbox("shop-a"), sandbox("shop-b")))
            .expect("write");
        std::fs::write(dir.join("b.yaml"), sandbox("shop-a")).expect("write");
        let (manifests, report) = Manifests::load(&[&dir]);
        let duplicate = report.by_rule(Rule::DuplicateObject).next().expect("the second definition is an error");
        let (first, second) = (dir.join("a.yaml").display().to_string(), dir.join("b.yaml").display().to_string());
        assert_eq!(duplicate.location, Location::line(second, 1));
        assert!(duplicate.message.contains(&format!("(first at {first}:1)")), "{duplicate}");
        // Before: "(available: shop-a, shop-b, shop-a)".
        let validation = manifests.validate();
        let unknown = validation.by_rule(Rule::UnknownSandbox).next().expect("shop-z is not defined");
        assert!(unknown.message.contains("(available: shop-a, shop-b)"), "{unknown}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// SandboxConfigs `s` in these namespaces (`None`: no `metadata.namespace`)
    /// and, when `task` names one, a HarnessTask `t` there that uses `s`.
    fn namespaced(sandboxes: &[Option<&str>], task: Option<Option<&str>>) -> String {
        let metadata = |name: &str, namespace: Option<&str>| match namespace {
            Some(namespace) => format!("{{name: {name}, namespace: {namespace}}}"),
            None => format!("{{name: {name}}}"),
        };
        let mut documents: Vec<String> = sandboxes
            .iter()
            .map(|namespace| {
                format!(
                    "apiVersion: basecamp.dev/v1alpha1\nkind: SandboxConfig\nmetadata: {}\nspec: {{}}\n",
                    metadata("s", *namespace)
                )
            })
            .collect();
        if let Some(namespace) = task {
            documents.push(format!(
                "apiVersion: basecamp.dev/v1alpha1\nkind: HarnessTask\nmetadata: {}\nspec:\n  taskDefinition: {{}}\n  evaluation: {{testSet: s3://bucket/tests.jsonl}}\n  policy: {{endpoint: http://localhost:8000/v1, model: m}}\n  sandboxRef: {{name: s}}\n",
                metadata("t", namespace)
            ));
        }
        documents.join("---\n")
    }

    #[test]
    fn a_sandbox_without_a_namespace_is_a_duplicate_of_one_in_any_namespace() {
        let duplicates = |namespaces: &[Option<&str>]| {
            let (manifests, report) = Manifests::parse("m.yaml", &namespaced(namespaces, None));
            assert!(report.is_empty(), "{report}");
            manifests.duplicates().problems().to_vec()
        };
        // Before: not duplicates, though `kubectl apply -f` puts the first in
        // the namespace it applies to, `default` too, where one replaces the other.
        let found = duplicates(&[None, Some("default")]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, Rule::DuplicateObject);
        // Line 6, the second object's first line (5 is the `---` before it).
        assert_eq!(found[0].location, Location::line("m.yaml", 6));
        assert_eq!(found[0].message, "SandboxConfig \"s\" is defined twice (first at m.yaml:1); rename one");
        assert_eq!(duplicates(&[Some("team-a"), None]).len(), 1);
        assert_eq!(duplicates(&[Some("team-a"), Some("team-a")]).len(), 1);
        assert!(duplicates(&[Some("team-a"), Some("team-b")]).is_empty());
    }

    #[test]
    fn a_task_uses_the_sandbox_of_its_own_namespace_or_one_without_a_namespace() {
        let validation = |sandboxes: &[Option<&str>], task: Option<&str>| {
            let (manifests, report) = Manifests::parse("m.yaml", &namespaced(sandboxes, Some(task)));
            assert!(report.is_empty(), "{report}");
            manifests.validate()
        };
        // Before: "not found", though `kubectl apply -f` puts `s` in team-a with the task.
        let without_namespace = validation(&[None], Some("team-a"));
        assert!(!without_namespace.has_errors(), "{without_namespace}");
        assert!(!validation(&[Some("team-b"), Some("team-a")], Some("team-a")).has_errors());
        assert!(!validation(&[Some("team-a")], None).has_errors());
        // Before: "SandboxConfig \"s\" not found (available: none)".
        let elsewhere = validation(&[Some("team-b")], Some("team-a"));
        let problem = elsewhere.by_rule(Rule::UnknownSandbox).next().expect("team-b's s is not team-a's");
        assert_eq!(problem.location, Location::field("spec.sandboxRef.name"));
        assert!(
            problem.message.starts_with("SandboxConfig \"s\" is in namespace team-b, the task in team-a;"),
            "{problem}"
        );
        assert_eq!(elsewhere.errors().count(), 1, "{elsewhere}");
        // A task without a namespace lands where it is applied: team-a's or team-b's.
        let either = validation(&[Some("team-a"), Some("team-b")], None);
        let problem = either.by_rule(Rule::UnknownSandbox).next().expect("which s is not known");
        assert!(problem.message.starts_with("SandboxConfig \"s\" is in namespaces team-a and team-b"), "{problem}");
        assert_eq!(either.errors().count(), 1, "{either}");
    }

    #[test]
    fn yaml_round_trip_keeps_the_spec() {
        let (manifests, report) = Manifests::load(&[examples().join("shipping-support.yaml")]);
        assert!(report.is_empty(), "{report}");
        for sandbox in &manifests.sandboxes {
            let yaml = serde_saphyr::to_string(&sandbox.object).expect("to yaml");
            let (again, report) = Manifests::parse("again.yaml", &yaml);
            assert!(report.is_empty(), "{report}\n{yaml}");
            assert_eq!(again.sandboxes[0].object.spec, sandbox.object.spec);
        }
        for task in &manifests.tasks {
            let yaml = serde_saphyr::to_string(&task.object).expect("to yaml");
            let (again, report) = Manifests::parse("again.yaml", &yaml);
            assert!(report.is_empty(), "{report}\n{yaml}");
            assert_eq!(again.tasks[0].object.spec, task.object.spec);
        }
    }
}
