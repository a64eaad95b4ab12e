//! A scripted policy: responses read from a JSONL file, for tests, demos
//! and replaying an episode without a model.
//!
//! # Format
//!
//! One JSON object a line. A file takes one of two forms.
//!
//! **One script for every episode**: each line is a response, answered in
//! order (turn 0 is the first line). Every episode replays the same script.
//!
//! ```text
//! {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "A1"}}]}
//! {"content": "Your order A1 has shipped."}
//! ```
//!
//! **A script per episode** (what `basecamp run` uses for a test set): each
//! line is `{"episode": ID, "turns": [response, ...]}`, where `ID` is the
//! test set row's `id`. Each id appears once; an episode the file does not
//! script is an error when the policy is asked about it (naming the file).
//! Fifty episodes are fifty lines.
//!
//! ```text
//! {"episode": "ep-1", "turns": [{"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "A1"}}]}, {"content": "Shipped."}]}
//! {"episode": "ep-2", "turns": [{"content": "I cannot help with that."}]}
//! ```
//!
//! A **response** has these fields, all optional but at least one of
//! `content`, `tool_calls` or `error`:
//!
//! - `content`: the assistant's text (a final answer when there are no tool calls);
//! - `tool_calls`: `[{"name", "arguments", "id"?}]`. `arguments` is an object,
//!   or a string holding JSON text as an API would send it, so invalid JSON
//!   (`"{\"order_id\": "`) can be scripted to test policy errors. `id`
//!   defaults to `call_<turn>_<index>`. Names are not checked: an unknown
//!   tool is for the executor to refuse;
//! - `finish_reason`: default `tool_calls` when there are tool calls, else `stop`;
//! - `logprobs`: `[{"token", "logprob", "token_id"?, "top_logprobs"?: [{"token", "logprob", "token_id"?}], "entropy"?, "kl"?}]`;
//!   without it a tool turn is flagged `logprobs_missing`, as it would be from a server.
//!   `entropy` and `kl` (nats; `kl` may be `"inf"`) are what raw logits gave
//!   when a trace was recorded: `basecamp trace replay` writes them so the
//!   replayed records, `logit_divergence` and its rewards are the recorded ones;
//! - `usage`: `{"prompt_tokens", "completion_tokens"}`;
//! - `raw_logits`: the turn's full-vocabulary logits as a safetensors file
//!   (`{"path": "turn-0.safetensors", "reference"?, "tensor"?, "token_ids"?}`,
//!   a relative path taken from the script's directory; see
//!   [`super::raw_logits`]); the `token_logit` records are derived from them;
//! - `delay_ms`: wait this many milliseconds (fractional allowed) before
//!   answering (to exercise plan-step timeouts; `basecamp trace replay` writes
//!   the recorded turn's latency here);
//! - `error`: fail this turn with this message, as an unreachable policy would.
//!
//! Unknown fields are errors (a typo must not silently change a test). The
//! lines are read as test sets are ([`basecamp_api::jsonl`]): a trailing
//! newline, or blank lines at the end, are fine; a blank or malformed line
//! in the middle, or one that is not UTF-8, is an error naming `file:line`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use basecamp_api::jsonl::{JsonlError, JsonlRow, jsonl_rows};
use serde::Deserialize;
use serde_json::Value;

use super::raw_logits::RawLogits;
use super::types::{
    FinishReason, PolicyRequest, PolicyResponse, TokenLogprob, ToolArguments, ToolCall, TopLogprob, Usage,
};

/// The model name scripted responses report.
pub const SCRIPTED_MODEL: &str = "scripted";

/// Errors of loading a script or answering from it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ScriptedError {
    #[error("cannot read scripted policy {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("scripted policy {} holds no responses; add one JSON response a line, or {{\"episode\": ..., \"turns\": [...]}} lines", path.display())]
    Empty { path: PathBuf },
    /// A line that is blank, not JSON, not an object or not UTF-8.
    #[error(transparent)]
    Jsonl(#[from] JsonlError),
    #[error("{}:{line}: {message}", path.display())]
    Line { path: PathBuf, line: usize, message: String },
    #[error("{}:{line}: episode `{episode}` is already scripted at line {first_line}; give each episode one line", path.display())]
    DuplicateEpisode { path: PathBuf, line: usize, first_line: usize, episode: String },
    #[error(
        "scripted policy {} has no script for episode `{episode}` (it scripts {count} episodes: {examples}); add a line {{\"episode\": \"{episode}\", \"turns\": [...]}}",
        path.display()
    )]
    UnknownEpisode { path: PathBuf, episode: String, count: usize, examples: String },
    #[error(
        "{}:{line}: the script {whose} has {turns} turns, but the policy was asked for turn {requested} (0-based); did the agent loop go on after the scripted final answer?",
        path.display()
    )]
    OutOfTurns { path: PathBuf, line: usize, whose: String, turns: usize, requested: u32 },
    #[error("{}:{line}: scripted failure for episode `{episode}` turn {turn}: {message}", path.display())]
    ScriptedFailure { path: PathBuf, line: usize, episode: String, turn: u32, message: String },
}

/// The categories of the errors a turn can end in (the others come from
/// loading the script): the sandbox's `policy_errors_total` series exist at
/// zero for each from the start.
pub const TURN_ERROR_CATEGORIES: &[&str] =
    &["ScriptedPolicyUnknownEpisode", "ScriptedPolicyOutOfTurns", "ScriptedPolicyFailure"];

impl ScriptedError {
    /// A fixed, bounded name for metrics labels and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Read { .. } => "ScriptedPolicyUnreadable",
            Self::Empty { .. } => "ScriptedPolicyEmpty",
            Self::Jsonl(_) | Self::Line { .. } => "ScriptedPolicyInvalidLine",
            Self::DuplicateEpisode { .. } => "ScriptedPolicyDuplicateEpisode",
            Self::UnknownEpisode { .. } => "ScriptedPolicyUnknownEpisode",
            Self::OutOfTurns { .. } => "ScriptedPolicyOutOfTurns",
            Self::ScriptedFailure { .. } => "ScriptedPolicyFailure",
        }
    }
}

/// Where the script is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedConfig {
    pub path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedResponse {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ScriptedToolCall>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    logprobs: Option<Vec<ScriptedToken>>,
    #[serde(default)]
    usage: Option<ScriptedUsage>,
    #[serde(default, deserialize_with = "basecamp_api::duration::fractional_millis")]
    delay_ms: Duration,
    #[serde(default)]
    error: Option<String>,
    /// Full-vocabulary logits (`super::raw_logits`), as written.
    #[serde(default)]
    raw_logits: Option<Value>,
    /// `raw_logits` read, a relative path resolved against the script's directory.
    #[serde(skip)]
    raw: Option<RawLogits>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedToolCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedToken {
    token: String,
    logprob: f32,
    #[serde(default)]
    token_id: Option<i32>,
    #[serde(default)]
    top_logprobs: Vec<ScriptedTop>,
    #[serde(default)]
    entropy: Option<f32>,
    #[serde(default, deserialize_with = "kl_value")]
    kl: Option<f32>,
}

/// A KL in nats: a number, or `"inf"` (JSON has no infinity; a token the
/// reference gives probability 0 has KL = +inf).
fn kl_value<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<f32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Kl {
        Number(f32),
        Text(String),
    }
    match Kl::deserialize(deserializer)? {
        Kl::Number(kl) => Ok(Some(kl)),
        Kl::Text(text) if text == "inf" => Ok(Some(f32::INFINITY)),
        Kl::Text(text) => Err(serde::de::Error::custom(format!("kl {text:?} is neither a number nor \"inf\""))),
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedTop {
    token: String,
    logprob: f32,
    #[serde(default)]
    token_id: Option<i32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedUsage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct EpisodeLine {
    #[serde(deserialize_with = "episode_id")]
    episode: String,
    turns: Vec<ScriptedResponse>,
}

/// The test-set row an episode line answers: a string, or an integer as a
/// test set's integer `id` is read (its decimal text).
fn episode_id<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Text(String),
        Whole(u64),
        Negative(i64),
    }
    Ok(match Id::deserialize(deserializer)? {
        Id::Text(text) => text,
        Id::Whole(n) => n.to_string(),
        Id::Negative(n) => n.to_string(),
    })
}

/// A response with the line it came from.
#[derive(Debug, Clone, PartialEq)]
struct Turn {
    line: usize,
    response: ScriptedResponse,
}

#[derive(Debug, Clone, PartialEq)]
enum Script {
    /// One script, replayed for every episode.
    Shared(Vec<Turn>),
    /// Episode id -> its line and turns.
    PerEpisode(BTreeMap<String, (usize, Vec<ScriptedResponse>)>),
}

/// Answers from a JSONL script (see the module doc for the format).
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedPolicy {
    path: PathBuf,
    /// Shared by the clones (the shards of a local run).
    script: Arc<Script>,
}

impl ScriptedPolicy {
    /// The test-set rows a per-episode script answers, with each one's
    /// line; `None` for one script shared by every episode.
    pub fn scripted_episodes(&self) -> Option<Vec<(&str, usize)>> {
        match self.script.as_ref() {
            Script::Shared(_) => None,
            Script::PerEpisode(episodes) => Some(episodes.iter().map(|(id, (line, _))| (id.as_str(), *line)).collect()),
        }
    }

    /// Reads and checks the whole script; every problem names `file:line`.
    /// The error is the first in the file ([`ScriptedPolicy::load_all`] has them all).
    pub fn load(config: &ScriptedConfig) -> Result<Self, ScriptedError> {
        Self::load_all(config).map_err(first_error)
    }

    /// [`ScriptedPolicy::load`], with every bad line of the file (at most
    /// [`MAX_REPORTED_LINES`]), in line order: what `harness validate` lists.
    pub fn load_all(config: &ScriptedConfig) -> Result<Self, Vec<ScriptedError>> {
        let bytes = std::fs::read(&config.path)
            .map_err(|e| vec![ScriptedError::Read { path: config.path.clone(), source: Arc::new(e) }])?;
        Self::parse_bytes_all(&config.path, &bytes)
    }

    /// Parses script text; `path` is what errors name.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ScriptedError> {
        Self::parse_bytes(path, text.as_bytes())
    }

    /// [`ScriptedPolicy::parse`] of a file's bytes: a line that is not
    /// UTF-8 is an error naming its line and column.
    pub fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<Self, ScriptedError> {
        Self::parse_bytes_all(path, bytes).map_err(first_error)
    }

    /// [`ScriptedPolicy::parse_bytes`] with every bad line (at most
    /// [`MAX_REPORTED_LINES`]), in line order, never an empty list.
    pub fn parse_bytes_all(path: &Path, bytes: &[u8]) -> Result<Self, Vec<ScriptedError>> {
        let file = path.display().to_string();
        let mut reader = ScriptReader::new(path);
        let mut errors = Vec::new();
        // Line by line, each row's JSON value dropped once it is read.
        for row in jsonl_rows(&file, "scripted policy", bytes) {
            if let Err(error) = row.map_err(ScriptedError::from).and_then(|row| reader.read(row)) {
                errors.push(error);
                if errors.len() == MAX_REPORTED_LINES {
                    break;
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        reader.finish().map_err(|error| vec![error])
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The episodes scripted one by one (empty for a shared script).
    pub fn episodes(&self) -> Vec<&str> {
        match &*self.script {
            Script::Shared(_) => Vec::new(),
            Script::PerEpisode(episodes) => episodes.keys().map(String::as_str).collect(),
        }
    }

    /// The ids among `episode_ids` this script cannot answer, so a run can
    /// refuse a test set up front instead of failing episode by episode.
    /// Always empty for a shared script.
    pub fn missing_episodes<'a>(&self, episode_ids: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        match &*self.script {
            Script::Shared(_) => Vec::new(),
            Script::PerEpisode(episodes) => episode_ids.into_iter().filter(|id| !episodes.contains_key(*id)).collect(),
        }
    }

    /// The scripted response for `request.turn` of `request.episode_id`.
    pub async fn respond(&self, request: &PolicyRequest<'_>) -> Result<PolicyResponse, ScriptedError> {
        let started = Instant::now();
        let (line, response) = self.lookup(request)?;
        if !response.delay_ms.is_zero() {
            tokio::time::sleep(response.delay_ms).await;
        }
        if let Some(message) = &response.error {
            return Err(ScriptedError::ScriptedFailure {
                path: self.path.clone(),
                line,
                episode: request.episode_id.clone(),
                turn: request.turn,
                message: message.clone(),
            });
        }
        Ok(to_response(response, request.turn, started.elapsed()))
    }

    fn lookup(&self, request: &PolicyRequest<'_>) -> Result<(usize, &ScriptedResponse), ScriptedError> {
        let turn = usize::try_from(request.turn).unwrap_or(usize::MAX);
        match &*self.script {
            Script::Shared(turns) => match turns.get(turn) {
                Some(t) => Ok((t.line, &t.response)),
                None => Err(ScriptedError::OutOfTurns {
                    path: self.path.clone(),
                    line: turns.last().map_or(0, |t| t.line),
                    whose: "shared by every episode".to_owned(),
                    turns: turns.len(),
                    requested: request.turn,
                }),
            },
            Script::PerEpisode(episodes) => {
                let Some((line, turns)) = episodes.get(&request.episode_id) else {
                    let mut examples: Vec<&str> = episodes.keys().take(5).map(String::as_str).collect();
                    if episodes.len() > examples.len() {
                        examples.push("…");
                    }
                    return Err(ScriptedError::UnknownEpisode {
                        path: self.path.clone(),
                        episode: request.episode_id.clone(),
                        count: episodes.len(),
                        examples: examples.join(", "),
                    });
                };
                turns.get(turn).map(|r| (*line, r)).ok_or_else(|| ScriptedError::OutOfTurns {
                    path: self.path.clone(),
                    line: *line,
                    whose: format!("for episode `{}`", request.episode_id),
                    turns: turns.len(),
                    requested: request.turn,
                })
            }
        }
    }
}

/// At most this many bad lines of one script are reported: enough to fix a
/// file in one pass, bounded for a file that is no script at all.
pub const MAX_REPORTED_LINES: usize = 100;

/// The first of a non-empty error list (what a run reports).
fn first_error(errors: Vec<ScriptedError>) -> ScriptedError {
    errors.into_iter().next().expect("an error list is never empty")
}

/// A script being read one line at a time; a bad line is reported and the
/// next one read as if it were not there.
struct ScriptReader<'p> {
    path: &'p Path,
    /// The directory relative paths (`raw_logits.path`) are taken from.
    base: &'p Path,
    shared: Vec<Turn>,
    episodes: BTreeMap<String, (usize, Vec<ScriptedResponse>)>,
    /// The line that decided the file's form, and whether it is per-episode.
    form: Option<(usize, bool)>,
}

impl<'p> ScriptReader<'p> {
    fn new(path: &'p Path) -> Self {
        let base = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        Self { path, base, shared: Vec::new(), episodes: BTreeMap::new(), form: None }
    }

    fn line_error(&self, line: usize, message: String) -> ScriptedError {
        ScriptedError::Line { path: self.path.to_owned(), line, message }
    }

    /// Reads one line into the script.
    fn read(&mut self, row: JsonlRow) -> Result<(), ScriptedError> {
        let line = usize::try_from(row.line).unwrap_or(usize::MAX);
        let per_episode = row.value.contains_key("episode");
        let value = Value::Object(row.value);
        match self.form {
            None => self.form = Some((line, per_episode)),
            Some((first, was_per_episode)) if was_per_episode != per_episode => {
                let (this, that) = if per_episode {
                    ("an {\"episode\", \"turns\"} line", "response lines")
                } else {
                    ("a response line", "{\"episode\", \"turns\"} lines")
                };
                return Err(self.line_error(
                    line,
                    format!("{this} in a file of {that} (decided by line {first}); use one form per file"),
                ));
            }
            Some(_) => {}
        }
        if per_episode { self.read_episode(line, value) } else { self.read_response(line, value) }
    }

    /// `{"episode": ID, "turns": [...]}`.
    fn read_episode(&mut self, line: usize, value: Value) -> Result<(), ScriptedError> {
        let mut episode: EpisodeLine =
            serde_json::from_value(value).map_err(|e| self.line_error(line, format!("invalid episode line: {e}")))?;
        if episode.episode.trim().is_empty() {
            return Err(self.line_error(line, "`episode` is empty; use the test set row's id".to_owned()));
        }
        if episode.turns.is_empty() {
            return Err(self.line_error(line, format!("episode `{}` has no turns", episode.episode)));
        }
        for (turn, response) in episode.turns.iter_mut().enumerate() {
            check_response(response, self.base).map_err(|m| self.line_error(line, format!("turns[{turn}]: {m}")))?;
        }
        if let Some((first_line, _)) = self.episodes.get(&episode.episode) {
            return Err(ScriptedError::DuplicateEpisode {
                path: self.path.to_owned(),
                line,
                first_line: *first_line,
                episode: episode.episode,
            });
        }
        self.episodes.insert(episode.episode, (line, episode.turns));
        Ok(())
    }

    /// One response of a script shared by every episode.
    fn read_response(&mut self, line: usize, value: Value) -> Result<(), ScriptedError> {
        // `{"id": …, "turns": […]}` is an episode's line with its key misnamed, not a bad response.
        if value.get("turns").is_some() {
            return Err(self.line_error(
                line,
                "a line with \"turns\" scripts one episode and needs \"episode\": the id of the test-set row it \
                 answers"
                    .to_owned(),
            ));
        }
        let mut response: ScriptedResponse =
            serde_json::from_value(value).map_err(|e| self.line_error(line, format!("invalid response: {e}")))?;
        check_response(&mut response, self.base).map_err(|m| self.line_error(line, m))?;
        self.shared.push(Turn { line, response });
        Ok(())
    }

    /// The script read, once every line was good.
    fn finish(self) -> Result<ScriptedPolicy, ScriptedError> {
        let script = match self.form {
            None => return Err(ScriptedError::Empty { path: self.path.to_owned() }),
            Some((_, true)) => Script::PerEpisode(self.episodes),
            _ => Script::Shared(self.shared),
        };
        Ok(ScriptedPolicy { path: self.path.to_owned(), script: Arc::new(script) })
    }
}

/// Checks a response and reads its `raw_logits` (relative paths against `base`).
fn check_response(response: &mut ScriptedResponse, base: &Path) -> Result<(), String> {
    if response.content.is_none() && response.tool_calls.is_empty() && response.error.is_none() {
        return Err("a response needs `content`, `tool_calls` or `error`".to_owned());
    }
    for (index, call) in response.tool_calls.iter().enumerate() {
        if call.name.trim().is_empty() {
            return Err(format!("tool_calls[{index}].name is empty"));
        }
        if call.id.as_ref().is_some_and(|id| id.trim().is_empty()) {
            return Err(format!("tool_calls[{index}].id is empty; leave it out for a generated one"));
        }
    }
    for (index, token) in response.logprobs.iter().flatten().enumerate() {
        let finite = token.logprob.is_finite() && token.top_logprobs.iter().all(|t| t.logprob.is_finite());
        if !finite {
            return Err(format!("logprobs[{index}] holds a logprob that is not a finite number"));
        }
        if token.entropy.is_some_and(|h| !(h.is_finite() && h >= 0.0)) {
            return Err(format!("logprobs[{index}].entropy must be a finite number >= 0"));
        }
        if token.kl.is_some_and(|kl| kl.is_nan() || kl < 0.0) {
            return Err(format!("logprobs[{index}].kl must be a number >= 0 or \"inf\""));
        }
    }
    if let Some(value) = &response.raw_logits {
        response.raw = Some(RawLogits::from_json(value, Some(base)).map_err(|m| format!("raw_logits: {m}"))?);
    }
    Ok(())
}

fn to_response(scripted: &ScriptedResponse, turn: u32, latency: Duration) -> PolicyResponse {
    let tool_calls: Vec<ToolCall> = scripted
        .tool_calls
        .iter()
        .enumerate()
        .map(|(index, call)| ToolCall {
            id: call.id.clone().unwrap_or_else(|| format!("call_{turn}_{index}")),
            name: call.name.clone(),
            arguments: match &call.arguments {
                None => ToolArguments::Parsed(Value::Object(Default::default())),
                Some(Value::String(raw)) => ToolArguments::parse(raw),
                Some(value) => ToolArguments::from_value(value.clone(), value.to_string()),
            },
        })
        .collect();
    let finish_reason = match &scripted.finish_reason {
        Some(reason) => FinishReason::parse(reason),
        None if tool_calls.is_empty() => FinishReason::Stop,
        None => FinishReason::ToolCalls,
    };
    PolicyResponse {
        model: SCRIPTED_MODEL.to_owned(),
        content: scripted.content.clone(),
        tool_calls,
        finish_reason: Some(finish_reason),
        logprobs: scripted.logprobs.as_ref().map(|tokens| {
            tokens
                .iter()
                .map(|t| TokenLogprob {
                    token: t.token.clone(),
                    token_id: t.token_id,
                    logprob: t.logprob,
                    top: t
                        .top_logprobs
                        .iter()
                        .map(|top| TopLogprob {
                            token: top.token.clone(),
                            token_id: top.token_id,
                            logprob: top.logprob,
                        })
                        .collect(),
                    entropy: t.entropy,
                    kl: t.kl,
                })
                .collect()
        }),
        raw_logits: scripted.raw.clone(),
        usage: scripted.usage.map(|u| Usage { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens }),
        latency,
        attempts: 1,
        warnings: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_a_turn_can_end_in_has_a_declared_category() {
        let (path, episode) = (PathBuf::from("script.jsonl"), "e1".to_string());
        let turn_errors = [
            ScriptedError::UnknownEpisode {
                path: path.clone(),
                episode: episode.clone(),
                count: 0,
                examples: String::new(),
            },
            ScriptedError::OutOfTurns { path: path.clone(), line: 1, whose: String::new(), turns: 1, requested: 1 },
            ScriptedError::ScriptedFailure { path, line: 1, episode, turn: 0, message: String::new() },
        ];
        let categories: Vec<&str> = turn_errors.iter().map(ScriptedError::category).collect();
        assert_eq!(categories, TURN_ERROR_CATEGORIES);
    }

    /// Every bad line, in line order, for `harness validate` (before: only
    /// the first); a run still reports the first.
    #[test]
    fn every_bad_line_is_reported_and_a_run_gets_the_first() {
        let text = "{\"tool_calls\": []}\n{\"content\": \"ok\"}\n{\"id\": \"e1\", \"turns\": []}\n{not json\n";
        let path = Path::new("script.jsonl");
        let errors = ScriptedPolicy::parse_bytes_all(path, text.as_bytes()).unwrap_err();
        let said: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(said.len(), 3, "{said:#?}");
        assert!(
            said[0].starts_with("script.jsonl:1: a response needs `content`, `tool_calls` or `error`"),
            "{said:#?}"
        );
        assert!(said[1].starts_with("script.jsonl:3: a line with \"turns\" scripts one episode"), "{said:#?}");
        assert!(said[2].starts_with("script.jsonl:4:"), "{said:#?}");
        assert_eq!(ScriptedPolicy::parse(path, text).unwrap_err().to_string(), said[0]);
        // Bounded: a file that is no script at all.
        let junk = "x\n".repeat(MAX_REPORTED_LINES * 3);
        assert_eq!(ScriptedPolicy::parse(path, &junk).map(|_| ()).unwrap_err().category(), "ScriptedPolicyInvalidLine");
        assert_eq!(ScriptedPolicy::parse_bytes_all(path, junk.as_bytes()).unwrap_err().len(), MAX_REPORTED_LINES);
    }

    fn parse(text: &str) -> Result<ScriptedPolicy, ScriptedError> {
        ScriptedPolicy::parse(Path::new("script.jsonl"), text)
    }

    #[test]
    fn blank_line_in_the_middle_names_file_and_line() {
        let err = parse("{\"content\": \"a\"}\n\n{\"content\": \"b\"}\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "script.jsonl:2: blank line in the middle of the scripted policy; remove it (only trailing newlines are allowed)"
        );
        // Trailing blank lines are fine.
        assert!(parse("{\"content\": \"a\"}\n\n\n").is_ok());
    }

    #[test]
    fn malformed_and_unknown_fields_name_the_line() {
        let err = parse("{\"content\": \"a\"}\n{\"content\": \n").unwrap_err().to_string();
        assert!(err.starts_with("script.jsonl:2: invalid JSON: "), "{err}");
        let err = parse("{\"contnet\": \"a\"}\n").unwrap_err().to_string();
        assert!(err.starts_with("script.jsonl:1: invalid response: unknown field `contnet`"), "{err}");
        let err = parse("{\"finish_reason\": \"stop\"}\n").unwrap_err().to_string();
        assert!(err.contains("needs `content`, `tool_calls` or `error`"), "{err}");
        let err = parse("[1]\n").unwrap_err().to_string();
        assert_eq!(err, "script.jsonl:1: expected a JSON object per line, found an array");
    }

    /// The file is read line by line (one row's JSON value at a time): the
    /// error reported is still the first in the file, of either kind.
    #[test]
    fn the_first_problem_in_the_file_is_the_one_reported() {
        let err = parse("{\"contnet\": \"a\"}\n{\"content\": \n").unwrap_err().to_string();
        assert!(err.starts_with("script.jsonl:1: invalid response: unknown field `contnet`"), "{err}");
        let err = parse("{\"content\": \"a\"}\n[1]\n{\"contnet\": \"a\"}\n").unwrap_err().to_string();
        assert_eq!(err, "script.jsonl:2: expected a JSON object per line, found an array");
    }

    #[test]
    fn forms_do_not_mix_and_episodes_are_unique() {
        let err = parse("{\"episode\": \"a\", \"turns\": [{\"content\": \"x\"}]}\n{\"content\": \"y\"}\n").unwrap_err();
        assert_eq!(err.category(), "ScriptedPolicyInvalidLine");
        assert!(err.to_string().starts_with("script.jsonl:2: a response line"), "{err}");
        let err = parse(
            "{\"episode\": \"a\", \"turns\": [{\"content\": \"x\"}]}\n{\"episode\": \"a\", \"turns\": [{\"content\": \"y\"}]}\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "script.jsonl:2: episode `a` is already scripted at line 1; give each episode one line"
        );
        let err =
            parse("{\"episode\": \"a\", \"turns\": [{\"content\": \"x\"}, {\"tool_calls\": [{\"name\": \"\"}]}]}\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("script.jsonl:1: turns[1]: tool_calls[0].name is empty"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_is_fractional_milliseconds_on_tokio_s_clock_and_never_negative() {
        let policy = parse("{\"content\": \"a\", \"delay_ms\": 1500.5}\n").unwrap();
        let started = tokio::time::Instant::now();
        let request = PolicyRequest::new("e", 0, Vec::new(), Vec::new());
        policy.respond(&request).await.unwrap();
        // tokio's timer ends a sleep on its next millisecond tick.
        let (delay, elapsed) = (Duration::from_micros(1_500_500), started.elapsed());
        assert!(delay <= elapsed && elapsed <= delay + Duration::from_millis(1), "{elapsed:?}");
        let err = parse("{\"content\": \"a\", \"delay_ms\": -1}\n").unwrap_err().to_string();
        assert!(
            err.starts_with("script.jsonl:1: invalid response: must be a number of milliseconds from 0 to"),
            "{err}"
        );
    }

    #[test]
    fn empty_file_is_an_error() {
        assert_eq!(parse("\n \n").unwrap_err().category(), "ScriptedPolicyEmpty");
    }

    #[test]
    fn turns_map_to_responses() {
        let policy = parse(concat!(
            r#"{"tool_calls": [{"name": "lookup", "arguments": {"id": 1}}, {"name": "lookup", "arguments": "{\"id\": "}]}"#,
            "\n",
            r#"{"content": "done", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}"#,
            "\n"
        ))
        .unwrap();
        let Script::Shared(turns) = &*policy.script else { panic!("shared") };
        let first = to_response(&turns[0].response, 0, Duration::ZERO);
        assert_eq!(first.tool_calls[0].id, "call_0_0");
        assert_eq!(first.tool_calls[1].arguments.invalid().unwrap().error_type, "invalid_json");
        assert_eq!(first.finish_reason, Some(FinishReason::ToolCalls));
        assert!(first.logprobs_missing());
        let second = to_response(&turns[1].response, 1, Duration::ZERO);
        assert!(second.is_final());
        assert_eq!(second.finish_reason, Some(FinishReason::Stop));
        assert_eq!(second.usage, Some(Usage { prompt_tokens: 3, completion_tokens: 1 }));
    }

    #[test]
    fn recorded_entropy_and_kl_reach_the_token_records_and_bad_ones_are_refused() {
        let policy = parse(concat!(
            r#"{"content": "ok", "logprobs": [{"token": "o", "logprob": -0.5, "entropy": 1.25, "kl": 0.0625},"#,
            r#" {"token": "k", "logprob": -0.25, "kl": "inf"}, {"token": "!", "logprob": -1.0}]}"#,
            "\n"
        ))
        .unwrap();
        let Script::Shared(turns) = &*policy.script else { panic!("shared") };
        let records: Vec<_> = to_response(&turns[0].response, 0, Duration::ZERO)
            .logprobs
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, t)| t.to_token_logit(i as u32))
            .collect();
        assert_eq!((records[0].entropy, records[0].kl), (Some(1.25), Some(0.0625)));
        assert_eq!((records[1].entropy, records[1].kl), (None, Some(f32::INFINITY)));
        assert_eq!((records[2].entropy, records[2].kl), (None, None));

        for (token, says) in [
            (r#""kl": -0.5"#, "logprobs[0].kl must be a number >= 0 or \"inf\""),
            (r#""kl": "infinity""#, "kl \"infinity\" is neither a number nor \"inf\""),
            (r#""entropy": -1"#, "logprobs[0].entropy must be a finite number >= 0"),
        ] {
            let line = format!(r#"{{"content": "x", "logprobs": [{{"token": "x", "logprob": -1, {token}}}]}}"#);
            let err = parse(&line).unwrap_err().to_string();
            assert!(err.starts_with("script.jsonl:1: ") && err.contains(says), "{token}: {err}");
        }
    }
}
