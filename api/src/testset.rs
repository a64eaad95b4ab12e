//! Test sets: JSONL, one episode per line.
//!
//! ```json
//! {"id": "ord-1", "instruction": "Where is order 1042?",
//!  "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "1042"}, "compare_args": ["order_id"]}],
//!  "initial_memory": {}, "expected_memory": {"shipping_status": "in_transit"}}
//! ```
//!
//! `id` (a string or an integer) is required and unique. The input is
//! `messages` (chat messages, each with a `role`) or `instruction` (one user
//! message). Optional: `initial_memory`, `expected_memory` or
//! `expected_memory_hash` (not both), `expected_outputs`. Other keys are
//! kept in [`Episode::extra`]. [`TestSet::parse`] reports EVERY bad line,
//! each naming the file and line, never skipping one.
//!
//! Sharding is contiguous: shard `i` of `n` is one slice of the file in
//! order, and shard sizes differ by at most one (the first `len % n` shards
//! hold one more). Contiguous shards keep an episode's neighbours together in
//! traces and let the operator map an episode back to its shard by index.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;

use crate::jsonl::{ErrorList, JsonlError, json_type, jsonl_rows};
use crate::problem::{Location, Problem, Report, Rule, Severity};

/// One episode of a test set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Episode {
    /// Unique id (an integer id is kept as its decimal string).
    pub id: String,
    /// 1-based line in the file.
    pub line: u64,
    /// Chat messages given to the policy (each an object with a `role`).
    pub messages: Option<Vec<serde_json::Value>>,
    /// A single user instruction (used when `messages` is absent).
    pub instruction: Option<String>,
    /// The tool calls the agent should make, in order.
    pub expected_tool_calls: Vec<ExpectedToolCall>,
    /// Memory at the start of the episode.
    pub initial_memory: Option<serde_json::Map<String, serde_json::Value>>,
    /// Memory expected at the end.
    pub expected_memory: Option<serde_json::Map<String, serde_json::Value>>,
    /// Canonical hash of the memory expected at the end.
    pub expected_memory_hash: Option<String>,
    /// Expected final outputs (free form; reward components may read them).
    pub expected_outputs: Option<serde_json::Value>,
    /// Any other keys of the row.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A tool call the agent is expected to make.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedToolCall {
    /// Tool name.
    pub name: String,
    /// Expected arguments (an object; a string holding a JSON object, as in
    /// OpenAI logs, is accepted too).
    #[serde(default, deserialize_with = "arguments_object")]
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// The argument names compared for strict accuracy (all when absent).
    #[serde(default)]
    pub compare_args: Option<Vec<String>>,
}

fn arguments_object<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<serde_json::Map<String, serde_json::Value>, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::Object(map) => Ok(map),
        serde_json::Value::String(text) => match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            _ => Err(D::Error::custom("a string `arguments` must hold a JSON object")),
        },
        other => Err(D::Error::custom(format!("expected an object, found {}", json_type(&other)))),
    }
}

/// The typed part of a row, after `id` is taken out.
#[derive(Deserialize)]
struct Row {
    #[serde(default)]
    messages: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    #[serde(default)]
    instruction: Option<String>,
    #[serde(default)]
    expected_tool_calls: Vec<ExpectedToolCall>,
    #[serde(default)]
    initial_memory: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    expected_memory: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    expected_memory_hash: Option<String>,
    #[serde(default)]
    expected_outputs: Option<serde_json::Value>,
    #[serde(flatten)]
    extra: serde_json::Map<String, serde_json::Value>,
}

/// A problem with one line of a test set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TestSetError {
    /// A blank or malformed line.
    #[error(transparent)]
    Jsonl(#[from] JsonlError),
    /// A row without `id`.
    #[error("{file}:{line}: test sample missing 'id' field; give every row a unique \"id\"")]
    MissingId {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
    },
    /// An `id` that is empty or not a string or integer.
    #[error("{file}:{line}: \"id\" must be a non-empty string or an integer, found {found}")]
    BadId {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// What was found.
        found: String,
    },
    /// The same `id` twice.
    #[error("{file}:{line}: duplicate id {id:?} (first used at line {first_line}); ids must be unique")]
    DuplicateId {
        /// The file.
        file: String,
        /// 1-based line of the second use.
        line: u64,
        /// 1-based line of the first use.
        first_line: u64,
        /// The id.
        id: String,
    },
    /// A field with the wrong shape.
    #[error("{file}:{line}: {field}: {message}")]
    InvalidRow {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// The field path in the row, e.g. `expected_tool_calls[0].name`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// No line holds an episode.
    #[error("{file}: the test set has no episodes")]
    Empty {
        /// The file.
        file: String,
    },
}

impl TestSetError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        self.rule().as_str()
    }

    /// The validation rule this error breaks.
    pub fn rule(&self) -> Rule {
        match self {
            TestSetError::Jsonl(JsonlError::BlankLine { .. }) => Rule::BlankLine,
            TestSetError::Jsonl(_) => Rule::InvalidJson,
            TestSetError::MissingId { .. } => Rule::MissingId,
            TestSetError::BadId { .. } => Rule::MissingId,
            TestSetError::DuplicateId { .. } => Rule::DuplicateId,
            TestSetError::InvalidRow { .. } => Rule::InvalidTestRow,
            TestSetError::Empty { .. } => Rule::EmptyTestSet,
        }
    }

    /// The error as a report problem (location file:line, the message
    /// without the `file:line:` prefix).
    pub fn to_problem(&self) -> Problem {
        let (file, line) = match self {
            TestSetError::Jsonl(JsonlError::BlankLine { file, line, .. })
            | TestSetError::Jsonl(JsonlError::InvalidJson { file, line, .. })
            | TestSetError::Jsonl(JsonlError::NotUtf8 { file, line, .. })
            | TestSetError::Jsonl(JsonlError::NotAnObject { file, line, .. })
            | TestSetError::MissingId { file, line }
            | TestSetError::BadId { file, line, .. }
            | TestSetError::DuplicateId { file, line, .. }
            | TestSetError::InvalidRow { file, line, .. } => (file.clone(), Some(*line)),
            TestSetError::Empty { file } => (file.clone(), None),
        };
        let text = self.to_string();
        let prefix = match line {
            Some(line) => format!("{file}:{line}: "),
            None => format!("{file}: "),
        };
        let message = text.strip_prefix(&prefix).unwrap_or(&text).to_string();
        Problem {
            severity: Severity::Error,
            rule: self.rule(),
            object: None,
            location: Location::File { file, line, column: None },
            message,
        }
    }
}

/// Every problem of a test set.
pub type TestSetErrors = ErrorList<TestSetError>;

impl TestSetErrors {
    /// The errors as a report.
    pub fn to_report(&self) -> Report {
        self.0.iter().map(TestSetError::to_problem).collect()
    }
}

/// Why a test set could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TestSetLoadError {
    /// `s3://` test sets are fetched by the storage layer, not here.
    #[error(
        "{uri}: this function reads local files; fetch s3:// test sets with the storage client and call TestSet::parse"
    )]
    Remote {
        /// The URI.
        uri: String,
    },
    /// The file cannot be read.
    #[error("cannot read test set {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file has bad lines.
    #[error("{0}")]
    Invalid(TestSetErrors),
}

impl TestSetLoadError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            TestSetLoadError::Remote { .. } => Rule::RemoteTestSet.as_str(),
            TestSetLoadError::Io { .. } => Rule::MissingFile.as_str(),
            TestSetLoadError::Invalid(errors) => errors.0.first().map_or("InvalidTestRow", TestSetError::category),
        }
    }

    /// The error as report problems.
    pub fn to_report(&self) -> Report {
        match self {
            TestSetLoadError::Invalid(errors) => errors.to_report(),
            TestSetLoadError::Remote { uri } => Report::from_iter([Problem {
                severity: Severity::Warning,
                rule: Rule::RemoteTestSet,
                object: None,
                location: Location::File { file: uri.clone(), line: None, column: None },
                message: "not checked here: the test set is on S3".to_string(),
            }]),
            TestSetLoadError::Io { path, source } => Report::from_iter([Problem::error_at(
                Rule::MissingFile,
                Location::File { file: path.clone(), line: None, column: None },
                format!("cannot read the test set: {source}"),
            )]),
        }
    }
}

/// `index` is not below `count`, or `count` is zero.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shard {index} of {count} does not exist; shards are numbered 0..{count} and count must be at least 1")]
pub struct ShardError {
    /// The shard asked for.
    pub index: u32,
    /// The number of shards.
    pub count: u32,
}

impl ShardError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        "InvalidShards"
    }
}

/// A parsed test set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TestSet {
    /// The file as named by the user (used in messages).
    pub name: String,
    /// Episodes in file order.
    pub episodes: Vec<Episode>,
}

impl TestSet {
    /// Parses a test set; `name` is used in messages (`tests.jsonl:17: ...`).
    pub fn parse(name: &str, text: &str) -> Result<TestSet, TestSetErrors> {
        TestSet::parse_bytes(name, text.as_bytes())
    }

    /// [`TestSet::parse`] of a file's bytes: a line that is not UTF-8 is an
    /// error naming it, and the other lines are still read.
    pub fn parse_bytes(name: &str, bytes: &[u8]) -> Result<TestSet, TestSetErrors> {
        let mut errors: Vec<(u64, TestSetError)> = Vec::new();
        let mut episodes = Vec::new();
        let mut first_line_of: HashMap<String, u64> = HashMap::new();
        // Row by row: each row's JSON value is dropped once it is an episode.
        for row in jsonl_rows(name, "test set", bytes) {
            let row = match row {
                Ok(row) => row,
                Err(e) => {
                    errors.push((e.line(), TestSetError::Jsonl(e)));
                    continue;
                }
            };
            match parse_row(name, row) {
                Ok(episode) => {
                    if let Some(first_line) = first_line_of.get(&episode.id) {
                        errors.push((
                            episode.line,
                            TestSetError::DuplicateId {
                                file: name.to_string(),
                                line: episode.line,
                                first_line: *first_line,
                                id: episode.id.clone(),
                            },
                        ));
                    } else {
                        first_line_of.insert(episode.id.clone(), episode.line);
                    }
                    episodes.push(episode);
                }
                Err(row_errors) => errors.extend(row_errors.into_iter().map(|e| (line_of(&e), e))),
            }
        }
        if episodes.is_empty() && errors.is_empty() {
            errors.push((0, TestSetError::Empty { file: name.to_string() }));
        }
        if errors.is_empty() {
            Ok(TestSet { name: name.to_string(), episodes })
        } else {
            errors.sort_by_key(|(line, _)| *line);
            Err(ErrorList(errors.into_iter().map(|(_, e)| e).collect()))
        }
    }

    /// Loads a local test set. `s3://` locations are refused with
    /// [`TestSetLoadError::Remote`]: the storage layer fetches them and calls
    /// [`TestSet::parse`].
    pub fn load(path: impl AsRef<Path>) -> Result<TestSet, TestSetLoadError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        if name.starts_with("s3://") {
            return Err(TestSetLoadError::Remote { uri: name });
        }
        let bytes = std::fs::read(path).map_err(|source| TestSetLoadError::Io { path: name.clone(), source })?;
        TestSet::parse_bytes(&name, &bytes).map_err(TestSetLoadError::Invalid)
    }

    /// Number of episodes.
    pub fn len(&self) -> usize {
        self.episodes.len()
    }

    /// True without episodes.
    pub fn is_empty(&self) -> bool {
        self.episodes.is_empty()
    }

    /// The episode with `id`.
    pub fn get(&self, id: &str) -> Option<&Episode> {
        self.episodes.iter().find(|e| e.id == id)
    }

    /// Shard `index` of `count` (0-based): a contiguous slice, sizes
    /// differing by at most one. A shard may be empty when there are more
    /// shards than episodes.
    pub fn shard(&self, index: u32, count: u32) -> Result<&[Episode], ShardError> {
        shard_range(self.episodes.len(), index, count).map(|range| &self.episodes[range])
    }
}

/// The episode indices of shard `index` of `count` for `len` episodes.
pub fn shard_range(len: usize, index: u32, count: u32) -> Result<Range<usize>, ShardError> {
    if count == 0 || index >= count {
        return Err(ShardError { index, count });
    }
    let (index, count) = (index as usize, count as usize);
    let base = len / count;
    let extra = len % count;
    let start = index * base + index.min(extra);
    let size = base + usize::from(index < extra);
    Ok(start..start + size)
}

fn line_of(error: &TestSetError) -> u64 {
    match error {
        TestSetError::Jsonl(e) => e.line(),
        TestSetError::MissingId { line, .. }
        | TestSetError::BadId { line, .. }
        | TestSetError::DuplicateId { line, .. }
        | TestSetError::InvalidRow { line, .. } => *line,
        TestSetError::Empty { .. } => 0,
    }
}

/// The fields a row may have; any other key is kept in [`Episode::extra`].
const FIELDS: [&str; 8] = [
    "id",
    "messages",
    "instruction",
    "expected_tool_calls",
    "initial_memory",
    "expected_memory",
    "expected_memory_hash",
    "expected_outputs",
];

fn parse_row(file: &str, row: crate::jsonl::JsonlRow) -> Result<Episode, Vec<TestSetError>> {
    let line = row.line;
    let mut value = row.value;
    let mut errors = Vec::new();
    let invalid = |field: &str, message: String| TestSetError::InvalidRow {
        file: file.to_string(),
        line,
        field: field.to_string(),
        message,
    };
    let id = match value.remove("id") {
        None | Some(serde_json::Value::Null) => {
            errors.push(TestSetError::MissingId { file: file.to_string(), line });
            None
        }
        Some(serde_json::Value::String(id)) if !id.trim().is_empty() => Some(id),
        Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        Some(other) => {
            let found = match &other {
                serde_json::Value::String(_) => "an empty string".to_string(),
                other => json_type(other).to_string(),
            };
            errors.push(TestSetError::BadId { file: file.to_string(), line, found });
            None
        }
    };
    // The fields the row gives, even empty (`"expected_tool_calls": []`).
    let given: Vec<String> = value.keys().cloned().collect();
    let row: Option<Row> = match serde_path_to_error::deserialize(serde_json::Value::Object(value)) {
        Ok(row) => Some(row),
        Err(e) => {
            let field = e.path().to_string();
            errors.push(invalid(&field, e.into_inner().to_string()));
            None
        }
    };
    if let Some(row) = &row {
        // A misspelt field would be kept as extra data and the row scored without it
        // (`expected_tool_call`: every correct call counted as unexpected).
        for key in row.extra.keys() {
            // A field the row gives, or one it could not give with those (`expected_memory_hash`
            // beside `expected_memory`), is not what a key was meant to be.
            let excluded = |field: &str| match field {
                "id" => true,
                "expected_memory_hash" => given.iter().any(|g| g == "expected_memory"),
                "expected_memory" => given.iter().any(|g| g == "expected_memory_hash"),
                field => given.iter().any(|g| g == field),
            };
            // Two edits at most (`expected_memroy`, `expected_tool_call`): a longer way off
            // (`expected_outcome`) is the row's own data, not a slip.
            let field = FIELDS
                .iter()
                .copied()
                .filter(|field| !excluded(field))
                .map(|field| (crate::validate::edit_distance(key, field), field))
                .filter(|(distance, _)| *distance <= 2)
                .min_by_key(|(distance, _)| *distance)
                .map(|(_, field)| field);
            if let Some(field) = field {
                errors.push(invalid(
                    key,
                    format!(
                        "{key:?} is not a test-set field; did you mean {field:?}? (a row's other keys are kept as \
                         extra data, so this one would be ignored)"
                    ),
                ));
            }
        }
        if row.messages.is_none() && row.instruction.is_none() {
            errors.push(invalid(
                "messages",
                "the row has neither \"messages\" nor \"instruction\"; give the episode its input".into(),
            ));
        } else if row.messages.as_ref().is_some_and(Vec::is_empty) && row.instruction.is_none() {
            // The policy would be asked to answer no conversation at all.
            errors.push(invalid(
                "messages",
                "is empty and the row has no \"instruction\"; give the episode its input".into(),
            ));
        }
        for (index, message) in row.messages.iter().flatten().enumerate() {
            if !message.get("role").is_some_and(serde_json::Value::is_string) {
                errors.push(invalid(&format!("messages[{index}]"), "a message needs a string \"role\"".into()));
            }
        }
        if row.expected_memory.is_some() && row.expected_memory_hash.is_some() {
            errors.push(invalid(
                "expected_memory_hash",
                "set \"expected_memory\" or \"expected_memory_hash\", not both".into(),
            ));
        }
        for (index, call) in row.expected_tool_calls.iter().enumerate() {
            if call.name.trim().is_empty() {
                errors.push(invalid(&format!("expected_tool_calls[{index}].name"), "the tool name is empty".into()));
            }
            for arg in call.compare_args.iter().flatten() {
                if !call.arguments.contains_key(arg) {
                    errors.push(invalid(
                        &format!("expected_tool_calls[{index}].compare_args"),
                        format!("{arg:?} is not one of the expected arguments; compare only arguments you list"),
                    ));
                }
            }
        }
    }
    match (id, row) {
        (Some(id), Some(row)) if errors.is_empty() => Ok(Episode {
            id,
            line,
            messages: row.messages.map(|m| m.into_iter().map(serde_json::Value::Object).collect()),
            instruction: row.instruction,
            expected_tool_calls: row.expected_tool_calls,
            initial_memory: row.initial_memory,
            expected_memory: row.expected_memory,
            expected_memory_hash: row.expected_memory_hash,
            expected_outputs: row.expected_outputs,
            extra: row.extra,
        }),
        _ => Err(errors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = concat!(
        r#"{"id": "a", "instruction": "where is 1", "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}, "compare_args": ["order_id"]}], "expected_memory": {"s": "x"}}"#,
        "\n",
        r#"{"id": 2, "messages": [{"role": "user", "content": "hi"}], "expected_tool_calls": [{"name": "t", "arguments": "{\"k\": 1}"}], "split": "dev"}"#,
        "\n",
    );

    fn errors(text: &str) -> Vec<String> {
        TestSet::parse("tests.jsonl", text).expect_err("invalid").0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn parses_rows_with_their_lines() {
        let set = TestSet::parse("tests.jsonl", GOOD).expect("valid");
        assert_eq!(set.len(), 2);
        assert_eq!(set.episodes[0].expected_tool_calls[0].name, "track_order");
        assert_eq!(set.episodes[1].id, "2");
        assert_eq!(set.episodes[1].line, 2);
        assert_eq!(set.episodes[1].expected_tool_calls[0].arguments["k"], 1);
        assert_eq!(set.episodes[1].extra["split"], "dev");
        assert!(set.get("a").is_some());
    }

    #[test]
    fn a_trailing_newline_is_fine() {
        assert!(TestSet::parse("tests.jsonl", &format!("{GOOD}\n")).is_ok());
        assert!(TestSet::parse("tests.jsonl", GOOD.trim_end()).is_ok());
    }

    #[test]
    fn a_blank_line_in_the_middle_names_file_and_line() {
        let text = GOOD.replacen('\n', "\n\n", 1);
        let errors = errors(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("tests.jsonl:2: blank line in the middle of the test set"), "{}", errors[0]);
    }

    #[test]
    fn a_malformed_line_names_file_and_line() {
        let text = format!("{GOOD}{{\"id\": \"c\", \"instruction\": \n");
        let errors = errors(&text);
        assert!(errors[0].starts_with("tests.jsonl:3: invalid JSON: "), "{errors:?}");
    }

    #[test]
    fn missing_empty_and_duplicate_ids_are_errors() {
        let text = concat!(
            r#"{"id": "a", "instruction": "x"}"#,
            "\n",
            r#"{"instruction": "no id"}"#,
            "\n",
            r#"{"id": "", "instruction": "empty"}"#,
            "\n",
            r#"{"id": "a", "instruction": "again"}"#,
            "\n"
        );
        let errors = errors(text);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert_eq!(errors[0], "tests.jsonl:2: test sample missing 'id' field; give every row a unique \"id\"");
        assert!(errors[1].starts_with("tests.jsonl:3: \"id\" must be a non-empty string"), "{}", errors[1]);
        assert_eq!(errors[2], "tests.jsonl:4: duplicate id \"a\" (first used at line 1); ids must be unique");
    }

    #[test]
    fn row_shape_errors_have_field_paths() {
        let text = concat!(
            r#"{"id": "a"}"#,
            "\n",
            r#"{"id": "b", "instruction": "x", "expected_tool_calls": [{"arguments": {}}]}"#,
            "\n",
            r#"{"id": "c", "instruction": "x", "expected_tool_calls": [{"name": "t", "arguments": {"a": 1}, "compare_args": ["b"]}]}"#,
            "\n",
            r#"{"id": "d", "instruction": "x", "expected_memory": {}, "expected_memory_hash": "ab"}"#,
            "\n"
        );
        let errors = errors(&format!("{text}{}\n", r#"{"id": "e", "messages": []}"#));
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors[0].contains("neither \"messages\" nor \"instruction\""), "{}", errors[0]);
        // Before: accepted, and the policy asked to answer no conversation.
        assert_eq!(
            errors[4],
            "tests.jsonl:5: messages: is empty and the row has no \"instruction\"; give the episode its input"
        );
        assert!(errors[1].starts_with("tests.jsonl:2: expected_tool_calls[0]"), "{}", errors[1]);
        assert!(errors[2].contains("\"b\" is not one of the expected arguments"), "{}", errors[2]);
        assert!(errors[3].contains("not both"), "{}", errors[3]);
    }

    #[test]
    fn a_misspelt_field_is_an_error_and_other_keys_are_extra_data() {
        let text = concat!(
            r#"{"id": "a", "instruction": "x", "expected_tool_call": [{"name": "t"}], "expected_memroy": {"s": 1}}"#,
            "\n",
            // Keys that are no field's near miss are the row's own data; so is a near miss of a field given
            // (even empty), of one the row cannot have beside its own, or one further off.
            r#"{"id": "b", "instruction": "x", "category": "shipping", "expected_outputs": 1, "expected_output": 2}"#,
            "\n",
            r#"{"id": "c", "instruction": "x", "expected_tool_calls": [], "unexpected_tool_calls": [], "expected_outcome": "ok", "expected_memory": {}, "expected_memory_diff": {}}"#,
            "\n"
        );
        // Before: both kept as extra data, and row a scored as expecting no calls and no memory.
        assert_eq!(
            errors(text),
            [
                "tests.jsonl:1: expected_memroy: \"expected_memroy\" is not a test-set field; did you mean \
                 \"expected_memory\"? (a row's other keys are kept as extra data, so this one would be ignored)",
                "tests.jsonl:1: expected_tool_call: \"expected_tool_call\" is not a test-set field; did you mean \
                 \"expected_tool_calls\"? (a row's other keys are kept as extra data, so this one would be ignored)",
            ]
        );
        let set = TestSet::parse("tests.jsonl", text.split_inclusive('\n').nth(1).unwrap()).unwrap();
        let extra: Vec<&str> = set.get("b").unwrap().extra.keys().map(String::as_str).collect();
        assert_eq!(extra, ["category", "expected_output"]);
    }

    #[test]
    fn an_empty_file_is_an_error_and_problems_carry_file_and_line() {
        let errs = TestSet::parse("tests.jsonl", "\n").expect_err("empty");
        assert_eq!(errs.0[0].category(), "EmptyTestSet");
        let report = TestSet::parse(
            "tests.jsonl",
            "{\"id\":\"a\",\"instruction\":\"x\"}\n\n{\"id\":\"b\",\"instruction\":\"y\"}\n",
        )
        .expect_err("blank")
        .to_report();
        let problem = &report.problems()[0];
        assert_eq!(problem.location, Location::line("tests.jsonl", 2));
        assert_eq!(problem.rule, Rule::BlankLine);
        assert!(problem.to_string().starts_with("error: tests.jsonl:2: blank line"), "{problem}");
    }

    #[test]
    fn shards_are_contiguous_and_balanced() {
        let ranges: Vec<_> = (0..3).map(|i| shard_range(10, i, 3).expect("valid")).collect();
        assert_eq!(ranges, [0..4, 4..7, 7..10]);
        assert_eq!(shard_range(2, 3, 4).expect("empty shard"), 2..2);
        assert!(shard_range(10, 3, 3).is_err());
        assert!(shard_range(10, 0, 0).is_err());
        let text: String = (0..5).map(|i| format!("{{\"id\": {i}, \"instruction\": \"x\"}}\n")).collect();
        let set = TestSet::parse("t.jsonl", &text).expect("valid");
        let ids: Vec<&str> = set.shard(1, 2).expect("shard").iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["3", "4"]);
    }

    #[test]
    fn a_line_that_is_not_utf8_is_named_by_file_and_line() {
        let dir = std::env::temp_dir().join(format!("basecamp-api-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let path = dir.join("tests.jsonl");
        // Latin-1 "café" on line 2; line 3 repeats id 1.
        std::fs::write(
            &path,
            b"{\"id\": 1, \"instruction\": \"x\"}\n{\"id\": 2, \"instruction\": \"caf\xe9\"}\n{\"id\": 1, \"instruction\": \"y\"}\n",
        )
        .expect("write");
        let name = path.display().to_string();
        // Before: "cannot read test set <file>: stream did not contain valid UTF-8", no line.
        let error = TestSet::load(&path).expect_err("not UTF-8");
        let lines: Vec<String> = error.to_string().lines().map(str::to_string).collect();
        assert_eq!(
            lines[0],
            format!("{name}:2: the line is not UTF-8 text (byte 0xE9 at column 30); save the test set as UTF-8")
        );
        assert!(
            lines[1].starts_with(&format!("{name}:3: duplicate id \"1\"")),
            "the other lines are still read: {lines:?}"
        );
        assert_eq!(error.category(), "InvalidJson");
        assert_eq!(error.to_report().problems()[0].location, Location::line(name, 2));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn load_reads_local_files_and_refuses_s3() {
        let dir = std::env::temp_dir().join(format!("basecamp-api-testset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let path = dir.join("tests.jsonl");
        std::fs::write(&path, GOOD).expect("write");
        assert_eq!(TestSet::load(&path).expect("load").len(), 2);
        let err = TestSet::load("s3://bucket/tests.jsonl").expect_err("remote");
        assert_eq!(err.category(), "RemoteTestSet");
        let err = TestSet::load(dir.join("missing.jsonl")).expect_err("missing");
        assert_eq!(err.category(), "MissingFile");
        std::fs::remove_dir_all(&dir).ok();
    }
}
