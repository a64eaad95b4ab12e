//! Reading JSONL files (test sets, recorded-tool fixtures, scripted
//! policies) line by line with the rules users rely on: a UTF-8 BOM and
//! CRLF line ends are accepted, blank lines at the END are fine (a trailing
//! newline is normal), a blank line in the middle is an error, and every
//! error names the file and the 1-based line — a byte that is not UTF-8
//! too, and the lines around it are still read. Nothing is skipped
//! silently.

use std::fmt;

/// A line of a JSONL file that is not a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonlError {
    /// An empty (or whitespace-only) line followed by more rows.
    #[error("{file}:{line}: blank line in the middle of the {what}; remove it (only trailing newlines are allowed)")]
    BlankLine {
        /// The file as named by the user.
        file: String,
        /// 1-based line.
        line: u64,
        /// "test set", "fixture", ...
        what: &'static str,
    },
    /// Not valid JSON.
    #[error("{file}:{line}: invalid JSON: {message}")]
    InvalidJson {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// The parser's message (with the column).
        message: String,
    },
    /// A byte that is not UTF-8 (a file saved as Latin-1, a binary file).
    #[error(
        "{file}:{line}: the line is not UTF-8 text (byte {byte:#04X} at column {column}); save the {what} as UTF-8"
    )]
    NotUtf8 {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// 1-based byte column of the first byte that is not UTF-8.
        column: u64,
        /// That byte.
        byte: u8,
        /// "test set", "fixture", ...
        what: &'static str,
    },
    /// Valid JSON but not an object.
    #[error("{file}:{line}: expected a JSON object per line, found {found}")]
    NotAnObject {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// The JSON type found.
        found: &'static str,
    },
}

impl JsonlError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            JsonlError::BlankLine { .. } => "BlankLine",
            JsonlError::InvalidJson { .. } | JsonlError::NotUtf8 { .. } | JsonlError::NotAnObject { .. } => {
                "InvalidJson"
            }
        }
    }

    /// The 1-based line.
    pub fn line(&self) -> u64 {
        match self {
            JsonlError::BlankLine { line, .. }
            | JsonlError::InvalidJson { line, .. }
            | JsonlError::NotUtf8 { line, .. }
            | JsonlError::NotAnObject { line, .. } => *line,
        }
    }
}

/// One JSON object and the line it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonlRow {
    /// 1-based line.
    pub line: u64,
    /// The object.
    pub value: serde_json::Map<String, serde_json::Value>,
}

/// Every object in `text`, and every line that is not one. `file` names the
/// file in errors; `what` says what it is ("test set").
pub fn parse_jsonl(file: &str, what: &'static str, text: &str) -> (Vec<JsonlRow>, Vec<JsonlError>) {
    parse_jsonl_bytes(file, what, text.as_bytes())
}

/// [`parse_jsonl`] of a file's bytes: a line that is not UTF-8 is an error
/// naming its line and column, and the other lines are read.
pub fn parse_jsonl_bytes(file: &str, what: &'static str, bytes: &[u8]) -> (Vec<JsonlRow>, Vec<JsonlError>) {
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for row in jsonl_rows(file, what, bytes) {
        match row {
            Ok(row) => rows.push(row),
            Err(error) => errors.push(error),
        }
    }
    (rows, errors)
}

/// The rows of [`parse_jsonl_bytes`] and its errors, in line order, one at
/// a time: a caller that turns each row into its own type as it comes holds
/// one row's JSON value at a time, not the whole file's.
pub fn jsonl_rows<'a>(
    file: &'a str,
    what: &'static str,
    bytes: &'a [u8],
) -> impl Iterator<Item = Result<JsonlRow, JsonlError>> + 'a {
    content_lines(bytes).map(move |(line, line_bytes)| parse_row(file, what, line, line_bytes))
}

fn parse_row(file: &str, what: &'static str, line: u64, line_bytes: &[u8]) -> Result<JsonlRow, JsonlError> {
    let line_text = std::str::from_utf8(line_bytes).map_err(|error| {
        let at = error.valid_up_to();
        let (column, byte) = (at as u64 + 1, line_bytes[at]);
        JsonlError::NotUtf8 { file: file.to_string(), line, column, byte, what }
    })?;
    if line_text.trim().is_empty() {
        return Err(JsonlError::BlankLine { file: file.to_string(), line, what });
    }
    match serde_json::from_str::<serde_json::Value>(line_text) {
        Ok(serde_json::Value::Object(value)) => Ok(JsonlRow { line, value }),
        Ok(other) => Err(JsonlError::NotAnObject { file: file.to_string(), line, found: json_type(&other) }),
        Err(e) => Err(JsonlError::InvalidJson { file: file.to_string(), line, message: e.to_string() }),
    }
}

/// The lines of a JSON Lines file up to its last one with content, with
/// their 1-based numbers: a leading BOM is dropped, `\r\n` ends a line as
/// `\n` does, and trailing blank lines are not lines.
pub fn content_lines(bytes: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    let bytes = bytes.strip_prefix("\u{FEFF}".as_bytes()).unwrap_or(bytes);
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l)).collect();
    let last_content = lines.iter().rposition(|l| !is_blank(l)).map_or(0, |i| i + 1);
    lines.into_iter().take(last_content).enumerate().map(|(index, line)| (index as u64 + 1, line))
}

fn is_blank(line: &[u8]) -> bool {
    std::str::from_utf8(line).is_ok_and(|l| l.trim().is_empty())
}

/// Every line parsed straight into a `T`, without the [`serde_json::Value`]
/// of each that [`parse_jsonl_bytes`] builds (several times faster on a long
/// file), or `None` as soon as a line is blank, not UTF-8 or not a `T`: the
/// caller then parses with [`parse_jsonl_bytes`], which says what is wrong
/// where. When this succeeds, it reads what that would.
pub fn parse_lines_as<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<Vec<(u64, T)>> {
    content_lines(bytes)
        .map(|(line, bytes)| {
            let text = std::str::from_utf8(bytes).ok().filter(|t| !t.trim().is_empty())?;
            serde_json::from_str(text).ok().map(|value| (line, value))
        })
        .collect()
}

pub fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Several errors, shown one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorList<E>(pub Vec<E>);

impl<E: fmt::Display> fmt::Display for ErrorList<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for ErrorList<E> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_newlines_are_fine_and_middle_blanks_are_not() {
        let (rows, errors) = parse_jsonl("t.jsonl", "test set", "{\"a\":1}\n{\"a\":2}\n\n\n");
        assert_eq!(rows.len(), 2);
        assert!(errors.is_empty());
        let (rows, errors) = parse_jsonl("t.jsonl", "test set", "{\"a\":1}\n\n{\"a\":2}\n");
        assert_eq!(rows.len(), 2);
        assert_eq!(
            errors[0].to_string(),
            "t.jsonl:2: blank line in the middle of the test set; remove it (only trailing newlines are allowed)"
        );
    }

    #[test]
    fn bom_and_crlf_are_accepted() {
        let (rows, errors) = parse_jsonl("t.jsonl", "test set", "\u{FEFF}{\"a\":1}\r\n{\"a\":2}\r\n");
        assert_eq!((rows.len(), errors.len()), (2, 0));
        assert_eq!(rows[1].line, 2);
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let (_, errors) = parse_jsonl("t.jsonl", "test set", "{\"a\":1}\n{\"a\":\n[1]\n");
        assert_eq!(errors.len(), 2);
        assert!(errors[0].to_string().starts_with("t.jsonl:2: invalid JSON: "), "{}", errors[0]);
        assert_eq!(errors[1].to_string(), "t.jsonl:3: expected a JSON object per line, found an array");
        assert_eq!(errors[1].category(), "InvalidJson");
    }
}
