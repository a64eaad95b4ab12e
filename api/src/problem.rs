//! What validation returns: a [`Report`] of every [`Problem`] found, each with
//! a severity, a bounded [`Rule`] name (used as an Event reason and a metric
//! label), the object it belongs to, where it is (a field path such as
//! `spec.dataPipeline.source`, or `file:line`), and a message that says what is
//! wrong and what to do.
//!
//! The CLI prints a report line by line, the operator turns it into a status
//! condition and Events, the sandbox refuses to start on errors — all with the
//! same words.

use std::collections::HashSet;
use std::fmt;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Accepted, but probably not what the user meant.
    Warning,
    /// The task cannot run as written.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

macro_rules! rules {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// The rule a problem breaks: a fixed PascalCase name, safe to use as an
        /// Event reason or a metric label (bounded cardinality).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Rule {
            $($(#[$doc])* $name,)*
        }

        impl Rule {
            /// Every rule, for documentation and exhaustive tests.
            pub const ALL: &'static [Rule] = &[$(Rule::$name,)*];

            /// The rule's fixed PascalCase name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Rule::$name => stringify!($name),)*
                }
            }
        }
    };
}

rules! {
    /// A manifest file is not valid YAML.
    InvalidYaml,
    /// A manifest's fields have the wrong types or values for their schema.
    InvalidManifest,
    /// A field the schema does not know (usually a typo).
    UnknownField,
    /// A document of a kind Basecamp does not read (ignored).
    UnknownKind,
    /// A Basecamp kind with an apiVersion other than `basecamp.dev/v1alpha1`.
    WrongApiVersion,
    /// Two objects of the same kind and name.
    DuplicateObject,
    /// A name that Kubernetes, a Job or a tool-calling API will not accept.
    InvalidName,
    /// A file the spec names cannot be found or read.
    MissingFile,
    /// A duration that is zero or negative where it must be positive.
    NonPositiveDuration,
    /// `toolTimeouts` is a bare number, which applies to every tool.
    BareToolTimeout,
    /// A tool is referenced but not defined in `spec.tools`.
    UndefinedTool,
    /// A tool definition that cannot run (no kind, two kinds, empty command...).
    InvalidTool,
    /// A URL or body template with unbalanced or unknown placeholders.
    InvalidTemplate,
    /// A malformed `s3://` URI.
    InvalidS3Uri,
    /// An `s3://` URI with a query string (`?versionId=...`).
    S3UriQuery,
    /// An HTTP endpoint that is not a valid http(s) URL.
    InvalidUrl,
    /// A success criterion that does not parse.
    InvalidCriterion,
    /// An `evaluation.metrics` entry that no run reports, or one named twice.
    UnknownMetric,
    /// A `minComputeCapability` that is not `major.minor`.
    InvalidComputeCapability,
    /// A GPU requirement that cannot be satisfied as written.
    InvalidGpu,
    /// `sandboxRef` names a SandboxConfig that does not exist.
    UnknownSandbox,
    /// A `$(services.NAME...)` reference to a service that is not defined.
    UnknownService,
    /// A service that cannot start as written.
    InvalidService,
    /// No sandbox is referenced, or both `sandboxRef` and `variants` are set.
    InvalidSandboxRef,
    /// A profile that the SandboxConfig does not define.
    UnknownProfile,
    /// A profile overlay that does not apply cleanly.
    InvalidProfile,
    /// `shards` or `parallelism` out of range.
    InvalidShards,
    /// A number outside its allowed range (zero steps, a temperature of 5...).
    OutOfRange,
    /// A tool timeout longer than the plan-step timeout, so the step always fires first.
    TimeoutExceedsStep,
    /// More than two variants (an A/B test has two).
    TooManyVariants,
    /// Two variants with the same name.
    DuplicateVariant,
    /// A policy that cannot be called as written.
    InvalidPolicy,
    /// A `dataPipeline.preprocessor` that is none of the forms a run accepts.
    InvalidPreprocessor,
    /// An injection without exactly one trigger, or without an observation.
    InvalidInjection,
    /// Reward components or weight schedules that do not add up.
    InvalidRewards,
    /// A memory policy or memory patch that contradicts itself.
    InvalidMemoryPolicy,
    /// A configured write of `null` into memory (the classic fallback bug).
    NullMemoryWrite,
    /// Trace settings out of range.
    InvalidTrace,
    /// Trace destination or retention settings that do not work together.
    InvalidTraces,
    /// A blank line in the middle of a JSONL file.
    BlankLine,
    /// A JSONL line that is not valid JSON (or not an object).
    InvalidJson,
    /// A test-set row without an `id`.
    MissingId,
    /// Two test-set rows with the same `id`.
    DuplicateId,
    /// A test-set row whose fields have the wrong shape.
    InvalidTestRow,
    /// A test set without a single episode.
    EmptyTestSet,
    /// A test set on `s3://` that this process could not read.
    RemoteTestSet,
    /// A recorded-tool fixture whose entries are malformed.
    InvalidFixture,
    /// Evaluation settings that do not fit the test set or the tools.
    InvalidEvaluation,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a problem is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A field path inside the object, e.g. `spec.dataPipeline.source` or
    /// `spec.tools.track_order.http.url`.
    Field(String),
    /// A place in a file (a manifest, a test set, a fixture); line and
    /// column are 1-based.
    File {
        /// The file as the user named it.
        file: String,
        /// 1-based line, when known.
        line: Option<u64>,
        /// 1-based column, when known.
        column: Option<u64>,
    },
    /// The object as a whole.
    Object,
}

impl Location {
    /// A field path.
    pub fn field(path: impl Into<String>) -> Self {
        Location::Field(path.into())
    }

    /// A line in a file.
    pub fn line(file: impl Into<String>, line: u64) -> Self {
        Location::File { file: file.into(), line: Some(line), column: None }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Field(path) => f.write_str(path),
            Location::File { file, line: Some(line), column: Some(column) } => write!(f, "{file}:{line}:{column}"),
            Location::File { file, line: Some(line), column: None } => write!(f, "{file}:{line}"),
            Location::File { file, .. } => f.write_str(file),
            Location::Object => Ok(()),
        }
    }
}

/// One thing wrong (or suspicious) in a task, a sandbox, a test set or a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Problem {
    /// Error or warning.
    pub severity: Severity,
    /// The rule broken; its name is the bounded category.
    pub rule: Rule,
    /// The object, e.g. `HarnessTask/shipping-ab` or
    /// `SandboxConfig/tracking-a (profile prod)`; `None` for files.
    pub object: Option<String>,
    /// Where in the object or file.
    pub location: Location,
    /// What is wrong and what to do.
    pub message: String,
}

impl Problem {
    /// An error at a field path.
    pub fn error(rule: Rule, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { severity: Severity::Error, rule, object: None, location: Location::field(path), message: message.into() }
    }

    /// A warning at a field path.
    pub fn warning(rule: Rule, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { severity: Severity::Warning, ..Self::error(rule, path, message) }
    }

    /// An error somewhere else than a field path.
    pub fn error_at(rule: Rule, location: Location, message: impl Into<String>) -> Self {
        Self { severity: Severity::Error, rule, object: None, location, message: message.into() }
    }

    /// The same problem, attributed to `object` (unless it already names one).
    pub fn in_object(mut self, object: &str) -> Self {
        if self.object.is_none() {
            self.object = Some(object.to_string());
        }
        self
    }

    /// The bounded category (the rule's name).
    pub fn category(&self) -> &'static str {
        self.rule.as_str()
    }

    /// True for errors.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.severity)?;
        if let Some(object) = &self.object {
            write!(f, "{object}: ")?;
        }
        if self.location != Location::Object {
            write!(f, "{}: ", self.location)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found, in the order found, without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    problems: Vec<Problem>,
    /// The same problems, so that a duplicate is found without a scan
    /// (a test set of 100,000 rows can hold as many problems).
    seen: HashSet<Problem>,
}

impl Report {
    /// An empty report.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a problem unless the same one is already there.
    pub fn push(&mut self, problem: Problem) {
        if self.seen.insert(problem.clone()) {
            self.problems.push(problem);
        }
    }

    /// Adds every problem of `other`.
    pub fn extend(&mut self, other: impl IntoIterator<Item = Problem>) {
        for problem in other {
            self.push(problem);
        }
    }

    /// All problems, in order.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Errors only.
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| p.severity == Severity::Error)
    }

    /// Warnings only.
    pub fn warnings(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| p.severity == Severity::Warning)
    }

    /// True when at least one problem is an error.
    pub fn has_errors(&self) -> bool {
        self.errors().next().is_some()
    }

    /// True when nothing was found.
    pub fn is_empty(&self) -> bool {
        self.problems.is_empty()
    }

    /// Number of problems.
    pub fn len(&self) -> usize {
        self.problems.len()
    }

    /// True when some problem breaks `rule`.
    pub fn contains(&self, rule: Rule) -> bool {
        self.problems.iter().any(|p| p.rule == rule)
    }

    /// The problems breaking `rule`.
    pub fn by_rule(&self, rule: Rule) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(move |p| p.rule == rule)
    }

    /// Attributes every problem that names no object to `object`.
    pub fn in_object(self, object: &str) -> Self {
        self.problems.into_iter().map(|p| p.in_object(object)).collect()
    }
}

impl IntoIterator for Report {
    type Item = Problem;
    type IntoIter = std::vec::IntoIter<Problem>;

    fn into_iter(self) -> Self::IntoIter {
        self.problems.into_iter()
    }
}

impl<'a> IntoIterator for &'a Report {
    type Item = &'a Problem;
    type IntoIter = std::slice::Iter<'a, Problem>;

    fn into_iter(self) -> Self::IntoIter {
        self.problems.iter()
    }
}

impl FromIterator<Problem> for Report {
    fn from_iter<I: IntoIterator<Item = Problem>>(iter: I) -> Self {
        let mut report = Report::new();
        report.extend(iter);
        report
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for problem in &self.problems {
            writeln!(f, "{problem}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_pascal_case_and_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for rule in Rule::ALL {
            let name = rule.as_str();
            assert!(name.chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{name}");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric()), "{name}");
            assert!(seen.insert(name), "duplicate {name}");
        }
    }

    #[test]
    fn problems_render_object_location_and_message() {
        let p = Problem::error(Rule::InvalidShards, "spec.shards", "shards is 0").in_object("HarnessTask/t");
        assert_eq!(p.to_string(), "error: HarnessTask/t: spec.shards: shards is 0");
        let p = Problem::error_at(Rule::BlankLine, Location::line("tests.jsonl", 17), "blank line");
        assert_eq!(p.to_string(), "error: tests.jsonl:17: blank line");
        assert_eq!(p.category(), "BlankLine");
    }

    #[test]
    fn report_drops_exact_duplicates_and_counts_errors() {
        let mut report = Report::new();
        report.push(Problem::warning(Rule::BareToolTimeout, "spec.toolTimeouts", "w"));
        report.push(Problem::warning(Rule::BareToolTimeout, "spec.toolTimeouts", "w"));
        assert_eq!(report.len(), 1);
        assert!(!report.has_errors());
        report.push(Problem::error(Rule::UndefinedTool, "spec.fallbacks.x", "e"));
        assert!(report.has_errors());
        assert_eq!(report.errors().count(), 1);
        assert_eq!(report.warnings().count(), 1);
    }
}
