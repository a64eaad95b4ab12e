//! Recorded-tool fixtures: the answers a `recorded` tool gives, JSONL, one
//! entry per line:
//!
//! ```json
//! {"tool": "track_order", "arguments": {"order_id": "1042"}, "observation": {"status": "in_transit"}}
//! {"tool": "track_order", "arguments": {"order_id": "1043"}, "observation": {"error": "timeout"}, "timeout": true}
//! ```
//!
//! `tool` is required, and `observation` unless the entry fails;
//! `arguments` (default `{}`), `memoryPatch` (memory key -> value) and
//! `memoryRemove` (memory keys to delete: what a live tool answers as
//! `memory` and `memory_remove`), `timeout` (true: the call times out and the tool's fallback applies) and
//! `error` with an optional `errorType` (the call fails as the trace of a
//! real call recorded it, e.g. `rate_limited`) are optional. One file may hold
//! entries for several tools; validation checks that each names a tool the
//! sandbox defines.

use std::path::Path;

use serde::Deserialize;

use crate::jsonl::{ErrorList, JsonlError, parse_jsonl_bytes, parse_lines_as};
use crate::problem::{Location, Problem, Report, Rule, Severity};

/// One recorded answer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureEntry {
    /// The tool this answers for.
    pub tool: String,
    /// The call's arguments (matched canonically with `match: args`).
    #[serde(default)]
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// What the tool returns.
    #[serde(default)]
    pub observation: serde_json::Value,
    /// Memory writes made with the answer.
    #[serde(default)]
    pub memory_patch: Option<serde_json::Map<String, serde_json::Value>>,
    /// Memory keys deleted with the answer (after `memoryPatch`'s writes).
    #[serde(default)]
    pub memory_remove: Option<Vec<String>>,
    /// How long the tool takes to answer (`latencyMs`: milliseconds,
    /// fractional allowed), as the recorded call took: `trace replay` writes
    /// it so a slow call uses up its plan step's time again.
    #[serde(default, deserialize_with = "crate::duration::fractional_millis")]
    pub latency_ms: std::time::Duration,
    /// True: the call times out instead of answering.
    #[serde(default)]
    pub timeout: bool,
    /// The call fails with this message instead of answering.
    #[serde(default)]
    pub error: Option<String>,
    /// The failure's type as a trace records it (`rate_limited`,
    /// `http_status`, ...); default `tool_error`.
    #[serde(default)]
    pub error_type: Option<String>,
    /// 1-based line in the file (not read from the file).
    #[serde(skip)]
    pub line: u64,
}

/// A problem with one line of a fixture file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FixtureError {
    /// A blank or malformed line.
    #[error(transparent)]
    Jsonl(#[from] JsonlError),
    /// An entry with missing or mistyped fields.
    #[error("{file}:{line}: {field}: {message}")]
    InvalidEntry {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl FixtureError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            FixtureError::Jsonl(e) => e.category(),
            FixtureError::InvalidEntry { .. } => Rule::InvalidFixture.as_str(),
        }
    }

    /// The error as a report problem.
    pub fn to_problem(&self) -> Problem {
        let (file, line, rule) = match self {
            FixtureError::Jsonl(JsonlError::BlankLine { file, line, .. }) => (file, *line, Rule::BlankLine),
            FixtureError::Jsonl(JsonlError::InvalidJson { file, line, .. })
            | FixtureError::Jsonl(JsonlError::NotUtf8 { file, line, .. })
            | FixtureError::Jsonl(JsonlError::NotAnObject { file, line, .. }) => (file, *line, Rule::InvalidJson),
            FixtureError::InvalidEntry { file, line, .. } => (file, *line, Rule::InvalidFixture),
        };
        let text = self.to_string();
        let message = text.strip_prefix(&format!("{file}:{line}: ")).unwrap_or(&text).to_string();
        Problem { severity: Severity::Error, rule, object: None, location: Location::line(file.clone(), line), message }
    }
}

/// Why a fixture could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum FixtureLoadError {
    /// The file cannot be read.
    #[error("cannot read fixture {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file has bad lines.
    #[error("{0}")]
    Invalid(ErrorList<FixtureError>),
}

impl FixtureLoadError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            FixtureLoadError::Io { .. } => Rule::MissingFile.as_str(),
            FixtureLoadError::Invalid(errors) => errors.0.first().map_or("InvalidFixture", FixtureError::category),
        }
    }

    /// The error as report problems.
    pub fn to_report(&self) -> Report {
        match self {
            FixtureLoadError::Io { path, source } => Report::from_iter([Problem::error_at(
                Rule::MissingFile,
                Location::File { file: path.clone(), line: None, column: None },
                format!("cannot read the fixture: {source}"),
            )]),
            FixtureLoadError::Invalid(errors) => errors.0.iter().map(FixtureError::to_problem).collect(),
        }
    }
}

/// A parsed fixture file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fixture {
    /// The file as named by the user.
    pub name: String,
    /// Entries in file order.
    pub entries: Vec<FixtureEntry>,
}

impl Fixture {
    /// Parses a fixture; `name` is used in messages.
    pub fn parse(name: &str, text: &str) -> Result<Fixture, ErrorList<FixtureError>> {
        Fixture::parse_bytes(name, text.as_bytes())
    }

    /// [`Fixture::parse`] of a file's bytes: a line that is not UTF-8 is an
    /// error naming it, and the other lines are still read.
    pub fn parse_bytes(name: &str, bytes: &[u8]) -> Result<Fixture, ErrorList<FixtureError>> {
        if let Some(lines) = parse_lines_as::<FixtureEntry>(bytes) {
            let entries = lines.into_iter().map(|(line, entry)| FixtureEntry { line, ..entry }).collect();
            return Ok(Fixture { name: name.to_string(), entries });
        }
        // Something is wrong: every line again, through a JSON value, to say what and where.
        let (rows, jsonl_errors) = parse_jsonl_bytes(name, "fixture", bytes);
        let mut errors: Vec<FixtureError> = jsonl_errors.into_iter().map(FixtureError::Jsonl).collect();
        let mut entries = Vec::new();
        for row in rows {
            match serde_path_to_error::deserialize::<_, FixtureEntry>(serde_json::Value::Object(row.value)) {
                Ok(mut entry) => {
                    entry.line = row.line;
                    entries.push(entry);
                }
                Err(e) => errors.push(FixtureError::InvalidEntry {
                    file: name.to_string(),
                    line: row.line,
                    field: e.path().to_string(),
                    message: e.into_inner().to_string(),
                }),
            }
        }
        if errors.is_empty() {
            Ok(Fixture { name: name.to_string(), entries })
        } else {
            errors.sort_by_key(|e| match e {
                FixtureError::Jsonl(j) => j.line(),
                FixtureError::InvalidEntry { line, .. } => *line,
            });
            Err(ErrorList(errors))
        }
    }

    /// Loads a local fixture file.
    pub fn load(path: impl AsRef<Path>) -> Result<Fixture, FixtureLoadError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| FixtureLoadError::Io { path: name.clone(), source })?;
        Fixture::parse_bytes(&name, &bytes).map_err(FixtureLoadError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_with_lines() {
        let text = "{\"tool\": \"t\", \"arguments\": {\"a\": 1}, \"observation\": {\"ok\": true}}\n{\"tool\": \"u\", \"observation\": null, \"timeout\": true}\n";
        let fixture = Fixture::parse("f.jsonl", text).expect("valid");
        assert_eq!(fixture.entries.len(), 2);
        assert_eq!(fixture.entries[1].line, 2);
        assert!(fixture.entries[1].timeout);
        let text = "{\"tool\": \"t\", \"observation\": 1, \"memoryPatch\": {\"a\": 1}, \"memoryRemove\": [\"b\"]}\n";
        let fixture = Fixture::parse("f.jsonl", text).expect("valid");
        assert_eq!(fixture.entries[0].memory_remove, Some(vec!["b".to_string()]));
    }

    #[test]
    fn latency_is_fractional_milliseconds_and_never_negative() {
        let text =
            "{\"tool\": \"t\", \"observation\": 1, \"latencyMs\": 1200.25}\n{\"tool\": \"t\", \"observation\": 1}\n";
        let fixture = Fixture::parse("f.jsonl", text).expect("valid");
        assert_eq!(fixture.entries[0].latency_ms, std::time::Duration::from_micros(1_200_250));
        assert_eq!(fixture.entries[1].latency_ms, std::time::Duration::ZERO);
        for (bad, says) in [("-5", "got -5"), ("1e12", "from 0 to 604800000 (168h)"), ("\"2s\"", "expected f64")] {
            let text = format!("{{\"tool\": \"t\", \"observation\": 1, \"latencyMs\": {bad}}}\n");
            let errors = Fixture::parse("f.jsonl", &text).expect_err(bad).0;
            let message = errors[0].to_string();
            assert!(message.starts_with("f.jsonl:1: latencyMs: ") && message.contains(says), "{bad}: {message}");
        }
    }

    #[test]
    fn bad_entries_name_file_line_and_field() {
        let text = "{\"observation\": 1}\n\n{\"tool\": \"t\", \"observation\": 1, \"extra\": 2}\n";
        let errors = Fixture::parse("f.jsonl", text).expect_err("invalid").0;
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].to_string().starts_with("f.jsonl:1: "), "{}", errors[0]);
        assert!(errors[0].to_string().contains("tool"), "{}", errors[0]);
        assert_eq!(errors[1].category(), "BlankLine");
        assert!(errors[2].to_string().contains("extra"), "{}", errors[2]);
        assert_eq!(errors[2].to_problem().location, Location::line("f.jsonl", 3));
        // Before, loading such a file said only "stream did not contain valid UTF-8".
        let latin1 = b"{\"tool\": \"t\", \"observation\": 1}\n{\"tool\": \"caf\xe9\", \"observation\": 1}\n";
        let errors = Fixture::parse_bytes("f.jsonl", latin1).expect_err("not UTF-8").0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].to_problem().location, Location::line("f.jsonl", 2));
        assert!(errors[0].to_string().contains("not UTF-8 text (byte 0xE9 at column 14)"), "{}", errors[0]);
    }

    /// Read straight into entries (a file with nothing wrong) or through a
    /// JSON value per line (how a file with problems is read, to report
    /// them): the same entries with the same lines.
    #[test]
    fn a_good_file_reads_the_same_as_through_json_values() {
        let lines = [
            r#"{"tool": "t", "arguments": {"id": 1, "nested": {"b": [1, 2.5, null]}}, "observation": {"ok": true}}"#,
            r#"{"tool": "u", "observation": "text", "latencyMs": 0.25, "timeout": false}"#,
            r#"{"tool": "t", "observation": 1, "memoryPatch": {"a": 1}, "memoryRemove": ["b"], "error": "down", "errorType": "http_status"}"#,
            r#"{"tool": "é", "observation": 18446744073709551615, "arguments": {"big": -9223372036854775808, "f": 1e300}}"#,
        ];
        let text = format!("\u{FEFF}{}\r\n{}\n{}\r\n{}\n\n  \n", lines[0], lines[1], lines[2], lines[3]);
        let fixture = Fixture::parse("f.jsonl", &text).expect("valid");
        let through_values: Vec<FixtureEntry> = lines
            .iter()
            .enumerate()
            .map(|(i, line)| {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                FixtureEntry { line: i as u64 + 1, ..serde_json::from_value(value).unwrap() }
            })
            .collect();
        assert_eq!(fixture.entries, through_values);
        // A line with a key twice is read as a JSON value reads it (the last wins), as before.
        let twice = Fixture::parse("f.jsonl", r#"{"tool": "t", "observation": 1, "observation": 2}"#).expect("valid");
        assert_eq!(twice.entries[0].observation, serde_json::json!(2));
    }
}
