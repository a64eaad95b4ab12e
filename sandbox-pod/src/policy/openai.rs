//! A policy behind any OpenAI-compatible chat-completions endpoint (vLLM,
//! SGLang, Ollama, hosted APIs).
//!
//! Each [`OpenAiPolicy::respond`] POSTs `{endpoint}/chat/completions` with the
//! model, the messages, the `tools` and `tool_choice`, `logprobs: true` and
//! `top_logprobs: K`, then reads the first choice into a [`PolicyResponse`].
//! Tool-call arguments arrive as a JSON *string*; text that does not parse
//! is kept verbatim as [`ToolArguments::Invalid`], a policy error on that
//! call for the agent loop to record, never a failure of the whole turn.
//! Nor is a logprobs block that cannot be used (a NaN, a field of the wrong
//! type): it is dropped with a warning, and the turn flagged as without
//! logprobs. `-Infinity`, bare as Python's `json` writes it or quoted, is a
//! real logprob and kept; alternatives beyond `top_logprobs` are cut to it
//! (the trace header's `top_k`). A completion cut off by the token limit or a
//! content filter, and a body that is not UTF-8, are warnings too.
//!
//! Transient failures (429, 5xx, connection errors, an answer cut off
//! midway, request timeouts) are retried a bounded number of times with
//! exponential backoff and jitter, honouring `Retry-After` /
//! `retry-after-ms`. The API key comes from an
//! environment variable or a file, is sent only as a `Bearer` header, and
//! appears in no `Debug` output, log line, error message or trace.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::raw_logits::RawLogits;
use super::throttle::Throttle;
use super::types::{
    FinishReason, PolicyRequest, PolicyResponse, TokenLogprob, ToolArguments, ToolCall, TopLogprob, Usage,
};

/// How much of an error body goes into a message.
const BODY_EXCERPT_CHARS: usize = 512;

/// The most of an error answer's body read: only its excerpt is shown, so a
/// huge error page costs no memory, and its status still decides a retry.
const ERROR_BODY_BYTES: usize = 64 * 1024;

/// Errors of configuring or calling an OpenAI-compatible policy endpoint.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpenAiError {
    #[error(
        "policy API key: environment variable {variable} is not set (or not UTF-8); set it, or read the key from a file instead"
    )]
    ApiKeyEnvMissing { variable: String },
    #[error("policy API key: cannot read {}: {source}", path.display())]
    ApiKeyFile {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("policy API key from {origin} is empty; put the key there or remove the API key setting")]
    ApiKeyEmpty { origin: String },
    #[error(
        "policy API key from {origin} cannot be sent in an HTTP header: it holds a line break or another control character; put the key there alone, on one line"
    )]
    ApiKeyNotAHeader { origin: String },
    #[error(
        "policy endpoint {endpoint:?} is not usable: {reason}; give the base URL of an OpenAI-compatible API, such as http://127.0.0.1:8000/v1"
    )]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("cannot set up the HTTP client for policy endpoint {endpoint}: {message}")]
    Client { endpoint: String, message: String },
    #[error("policy endpoint {endpoint} answered {status} after {attempts}{note}: {body}{hint}", hint = status_hint(*.status))]
    Status {
        endpoint: String,
        status: u16,
        attempts: Attempts,
        /// Why retrying stopped early, when it did (" (…)"), else empty.
        note: String,
        body: String,
    },
    #[error(
        "policy endpoint {endpoint} did not answer within the {timeout_ms} ms request timeout, after {attempts}; check the server or raise spec.policy.requestTimeout"
    )]
    Timeout { endpoint: String, timeout_ms: u64, attempts: Attempts },
    #[error("cannot reach policy endpoint {endpoint} after {attempts}: {message}")]
    Unreachable { endpoint: String, attempts: Attempts, message: String },
    #[error("request to policy endpoint {endpoint} failed after {attempts}: {message}")]
    Transport { endpoint: String, attempts: Attempts, message: String },
    #[error("policy endpoint {endpoint} answered 200 with something that is not a chat completion ({reason}): {body}")]
    MalformedResponse { endpoint: String, reason: String, body: String },
    #[error(
        "policy endpoint {endpoint} answered with more than {limit} bytes{seen}, the most one answer may hold: a \
         server writing without end, or raw_logits too large to send inline (hand them over as a file: raw_logits.path)"
    )]
    AnswerTooLarge {
        endpoint: String,
        limit: u64,
        /// " (Content-Length: N)" when the server said so up front, else empty.
        seen: String,
    },
}

/// The categories of the errors a turn can end in (the others come from
/// building the policy): the sandbox's `policy_errors_total` series exist at
/// zero for each from the start.
pub const TURN_ERROR_CATEGORIES: &[&str] = &[
    "PolicyRateLimited",
    "PolicyServerError",
    "PolicyRequestRejected",
    "PolicyTimeout",
    "PolicyUnreachable",
    "PolicyTransport",
    "PolicyMalformedResponse",
    "PolicyAnswerTooLarge",
];

impl OpenAiError {
    /// A fixed, bounded name for metrics labels and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::ApiKeyEnvMissing { .. } => "PolicyApiKeyMissing",
            Self::ApiKeyFile { .. } => "PolicyApiKeyUnreadable",
            Self::ApiKeyEmpty { .. } => "PolicyApiKeyEmpty",
            Self::ApiKeyNotAHeader { .. } => "PolicyApiKeyInvalid",
            Self::InvalidEndpoint { .. } => "PolicyEndpointInvalid",
            Self::Client { .. } => "PolicyClientSetup",
            Self::Status { status: 429, .. } => "PolicyRateLimited",
            Self::Status { status, .. } if *status >= 500 => "PolicyServerError",
            Self::Status { .. } => "PolicyRequestRejected",
            Self::Timeout { .. } => "PolicyTimeout",
            Self::Unreachable { .. } => "PolicyUnreachable",
            Self::Transport { .. } => "PolicyTransport",
            Self::MalformedResponse { .. } => "PolicyMalformedResponse",
            Self::AnswerTooLarge { .. } => "PolicyAnswerTooLarge",
        }
    }
}

/// What to check after an answer with this status, when the status says
/// more than its body may: the endpoint's path, the model, the API key.
fn status_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => "; check the API key (spec.policy.apiKeyEnv, apiKeyFile or apiKeySecret)",
        404 => {
            "; check spec.policy.endpoint (`/chat/completions` is appended to it; most servers want it to end in \
             `/v1`) and spec.policy.model"
        }
        _ => "",
    }
}

/// A count of attempts that prints as "1 attempt" / "4 attempts".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts(pub u32);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => f.write_str("1 attempt"),
            n => write!(f, "{n} attempts"),
        }
    }
}

/// Where the API key comes from. The source names a variable or a file,
/// never the key itself, so it is safe to print.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ApiKeySource {
    /// No `Authorization` header (a local vLLM, Ollama).
    #[default]
    None,
    /// The value of this environment variable.
    Env(String),
    /// The content of this file, surrounding whitespace trimmed (a mounted Secret).
    File(PathBuf),
}

impl ApiKeySource {
    /// Reads the key. Done once, when the policy is built.
    pub fn load(&self) -> Result<Option<ApiKey>, OpenAiError> {
        let (key, origin) = match self {
            Self::None => return Ok(None),
            Self::Env(variable) => {
                let key = std::env::var(variable)
                    .map_err(|_| OpenAiError::ApiKeyEnvMissing { variable: variable.clone() })?;
                (key, format!("environment variable {variable}"))
            }
            Self::File(path) => {
                let key = std::fs::read_to_string(path)
                    .map_err(|e| OpenAiError::ApiKeyFile { path: path.clone(), source: Arc::new(e) })?;
                (key, format!("file {}", path.display()))
            }
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(OpenAiError::ApiKeyEmpty { origin });
        }
        // Found now rather than as "builder error: failed to parse header value" in every episode.
        if reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
            return Err(OpenAiError::ApiKeyNotAHeader { origin });
        }
        Ok(Some(ApiKey(key.to_owned())))
    }
}

/// A loaded API key. Its `Debug` is redacted, it has no `Display`, and it
/// is not `Serialize`: the only way out is the request header.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Bounded retries with exponential backoff and jitter.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The wait before the second attempt; doubled for each further one.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// The longest `Retry-After` honoured; a server asking for more is
    /// reported at once rather than waited for.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based): `initial * 2^(attempt-1)`,
    /// capped at `max_backoff`, then scaled by a random factor in [0.5, 1] so
    /// many sandboxes hitting one server do not retry in lockstep.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(31);
        let base = self.initial_backoff.saturating_mul(1u32 << exponent).min(self.max_backoff);
        base.mul_f64(0.5 + 0.5 * fastrand::f64())
    }
}

/// The most bytes one answer may hold by default: 1 GiB, room for the
/// top-20 logprobs of tens of thousands of tokens, or inline raw logits of
/// a few thousand tokens over a 129k vocabulary in bf16.
pub const MAX_ANSWER_BYTES: u64 = 1 << 30;

/// How to reach and sample an OpenAI-compatible policy.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiConfig {
    /// The API's base URL, e.g. `http://127.0.0.1:8000/v1`; requests go to `{endpoint}/chat/completions`.
    pub endpoint: String,
    pub model: String,
    pub api_key: ApiKeySource,
    /// Ask for `logprobs: true` (on by default; off for servers that refuse it).
    pub logprobs: bool,
    /// Alternatives per token (`top_logprobs`).
    pub top_logprobs: u32,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// One attempt, from sending to the last byte of the answer.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub retry: RetryPolicy,
    /// The most bytes one answer may hold ([`MAX_ANSWER_BYTES`]): a server
    /// that writes without end fails the turn instead of the sandbox's memory.
    pub max_answer_bytes: u64,
    /// Adapt the requests at once to the endpoint's 429s ([`Throttle`]; on
    /// by default). Off, a 429 is only retried, as every request of every
    /// episode under way retries it: the peer of `make bench-rate-limits`.
    pub adapt_to_rate_limits: bool,
    /// Extra top-level request fields for a particular server, e.g. vLLM's
    /// `{"return_tokens_as_token_ids": true}`. The fields above take precedence.
    pub extra_body: Map<String, Value>,
}

impl OpenAiConfig {
    /// Defaults: no API key, logprobs with top 5, 60 s request timeout, 4 attempts.
    pub fn new(endpoint: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            model: model.into(),
            api_key: ApiKeySource::None,
            logprobs: true,
            top_logprobs: 5,
            temperature: None,
            max_tokens: None,
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            max_answer_bytes: MAX_ANSWER_BYTES,
            adapt_to_rate_limits: true,
            extra_body: Map::new(),
        }
    }
}

/// A client of one OpenAI-compatible endpoint. Cheap to share: `respond`
/// takes `&self` and the HTTP connection pool is reused across episodes.
#[derive(Debug, Clone)]
pub struct OpenAiPolicy {
    config: OpenAiConfig,
    api_key: Option<ApiKey>,
    /// The endpoint as errors print it (no userinfo).
    endpoint: String,
    chat_url: reqwest::Url,
    /// `<endpoint>/models`: asked whether the endpoint is back after an outage.
    models_url: reqwest::Url,
    http: reqwest::Client,
    /// How many requests go at once while the endpoint answers 429, and
    /// whether an episode may start; shared by every clone. `None` when
    /// the config says not to adapt.
    throttle: Option<Arc<Throttle>>,
}

/// One failed attempt, before deciding whether to try again.
#[derive(Debug, Clone)]
enum Failure {
    Status {
        status: u16,
        retry_after: Option<Duration>,
        body: String,
    },
    Timeout,
    Unreachable(String),
    Transport {
        message: String,
        retryable: bool,
    },
    /// More than `max_answer_bytes`; `seen` as [`OpenAiError::AnswerTooLarge`] has it.
    TooLarge {
        seen: String,
    },
}

impl OpenAiPolicy {
    /// Checks the endpoint and loads the API key.
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiError> {
        let (endpoint, chat_url) = chat_completions_url(&config.endpoint)?;
        let mut models_url = chat_url.clone();
        // The chat URL ends in /chat/completions (appended to the endpoint).
        models_url.path_segments_mut().expect("an http(s) URL has a path").pop().pop().push("models");
        let api_key = config.api_key.load()?;
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.connect_timeout)
            .user_agent(concat!("basecamp-sandbox/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OpenAiError::Client { endpoint: endpoint.clone(), message: error_chain(&e) })?;
        let throttle = config.adapt_to_rate_limits.then(Arc::default);
        Ok(Self { config, api_key, endpoint, chat_url, models_url, http, throttle })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The endpoint as errors print it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The requests at once this endpoint's 429s allow, shared by every
    /// clone of this policy; an episode starts only while no request waits.
    pub fn throttle(&self) -> Option<&Arc<Throttle>> {
        self.throttle.as_ref()
    }

    /// `<endpoint>/models`, the URL [`OpenAiPolicy::answers`] asks.
    pub fn models_url(&self) -> &str {
        self.models_url.as_str()
    }

    /// One `GET <endpoint>/models` with the API key, taking at most
    /// `timeout`: `Ok` when the endpoint answers anything but what
    /// [`respond`](Self::respond) would try again (408, 429, 5xx) — a 401
    /// or 404 comes from a server that is up — else that answer or the error.
    pub async fn answers(&self, timeout: Duration) -> Result<(), String> {
        let mut request = self.http.get(self.models_url.clone()).timeout(timeout);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        match request.send().await {
            Ok(response) if !worth_retrying(response.status().as_u16()) => Ok(()),
            Ok(response) => Err(format!("status {}", response.status())),
            Err(e) => Err(format!("error: {}", self.redact(&error_chain(&e)))),
        }
    }

    /// The request body for `request`.
    pub fn request_body(&self, request: &PolicyRequest<'_>) -> Value {
        let mut body = self.config.extra_body.clone();
        body.insert("model".into(), json!(self.config.model));
        body.insert("messages".into(), json!(request.messages));
        if !request.tools.is_empty() {
            body.insert("tools".into(), json!(request.tools));
            body.insert("tool_choice".into(), request.tool_choice.to_openai());
        }
        if self.config.logprobs {
            body.insert("logprobs".into(), json!(true));
            body.insert("top_logprobs".into(), json!(self.config.top_logprobs));
        }
        if let Some(temperature) = self.config.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        if let Some(max_tokens) = self.config.max_tokens {
            body.insert("max_tokens".into(), json!(max_tokens));
        }
        Value::Object(body)
    }

    /// Asks the policy for its next turn, retrying transient failures.
    pub async fn respond(&self, request: &PolicyRequest<'_>) -> Result<PolicyResponse, OpenAiError> {
        let body = self.request_body(request);
        let max_attempts = self.config.retry.max_attempts.max(1);
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = match &self.throttle {
                Some(throttle) => {
                    request.retrying.set_queued(true);
                    let sent = throttle.request().await;
                    request.retrying.set_queued(false);
                    Some(sent)
                }
                None => None,
            };
            let failure = match self.attempt(&body).await {
                Ok(bytes) => {
                    if let Some(sent) = &sent {
                        sent.answered();
                    }
                    return self.parse(&bytes, request.turn, started.elapsed(), attempt);
                }
                Err(failure) => failure,
            };
            let retryable = match &failure {
                Failure::Status { status, .. } => worth_retrying(*status),
                Failure::Timeout | Failure::Unreachable(_) => true,
                Failure::Transport { retryable, .. } => *retryable,
                // The same question would get the same answer.
                Failure::TooLarge { .. } => false,
            };
            let retry_after = match &failure {
                Failure::Status { retry_after, .. } => *retry_after,
                _ => None,
            };
            let too_long = retry_after.filter(|wait| *wait > self.config.retry.max_retry_after);
            if let Failure::Status { status: 429, .. } = failure
                && let Some(lowered) = sent.as_ref().and_then(|sent| sent.rate_limited(retry_after))
            {
                self.say_lowered(lowered);
            }
            if !retryable || attempt >= max_attempts || too_long.is_some() {
                let note = too_long.map_or_else(String::new, |wait| {
                    format!(
                        " (it asked to retry after {:.1} s, more than the {:.1} s allowed)",
                        wait.as_secs_f64(),
                        self.config.retry.max_retry_after.as_secs_f64()
                    )
                });
                return Err(self.give_up(failure, Attempts(attempt), note));
            }
            drop(sent);
            let delay = retry_after.unwrap_or_else(|| self.config.retry.backoff(attempt));
            request.retrying.note(attempt, self.give_up(failure.clone(), Attempts(attempt), String::new()).into());
            tracing::warn!(
                endpoint = %self.endpoint,
                attempt,
                max_attempts,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                failure = %failure.summary(),
                "policy request failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// A 429 lowered the requests at once: said on stderr when no limit
    /// was this low before (the run's pace is news), else logged.
    fn say_lowered(&self, lowered: super::throttle::Lowered) {
        let super::throttle::Lowered { from, to, new_low } = lowered;
        if new_low {
            crate::stderr_line!(
                "warning: policy endpoint {} answered 429 (too many requests): at most {to} request(s) at once \
                 from now on, down from {from}, and no episode starts while one waits; more go again while it \
                 answers without 429",
                self.endpoint
            );
        } else {
            tracing::info!(endpoint = %self.endpoint, from, to, "policy endpoint answered 429; fewer requests at once");
        }
    }

    /// One HTTP attempt: the body of a 2xx answer, or what went wrong.
    async fn attempt(&self, body: &Value) -> Result<Vec<u8>, Failure> {
        let mut request = self.http.post(self.chat_url.clone()).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let mut response = request.send().await.map_err(|e| self.classify(&e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let success = status.is_success();
        // An error answer is only excerpted: more of it than that is not read.
        let at_most = if success { self.config.max_answer_bytes } else { ERROR_BODY_BYTES as u64 };
        if success && let Some(length) = response.content_length().filter(|length| *length > at_most) {
            return Err(Failure::TooLarge { seen: format!(" (Content-Length: {length})") });
        }
        let (bytes, cut) = self.read_at_most(&mut response, at_most).await?;
        if !success {
            let body = self.excerpt(&String::from_utf8_lossy(&bytes), cut);
            return Err(Failure::Status { status: status.as_u16(), retry_after, body });
        }
        if cut {
            return Err(Failure::TooLarge { seen: String::new() });
        }
        Ok(bytes)
    }

    /// Up to `at_most` bytes of `response`'s body, and whether there was
    /// more (left unread).
    async fn read_at_most(&self, response: &mut reqwest::Response, at_most: u64) -> Result<(Vec<u8>, bool), Failure> {
        let at_most = usize::try_from(at_most).unwrap_or(usize::MAX);
        let mut bytes = Vec::with_capacity(response.content_length().map_or(0, |n| (n as usize).min(at_most)));
        // Headers came, then the body broke off (a server restarting, a proxy
        // timing out): worth another try, however reqwest names the error.
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| Failure::Transport { message: self.redact(&error_chain(&e)), retryable: true })?
        {
            let room = at_most - bytes.len();
            if chunk.len() > room {
                bytes.extend_from_slice(&chunk[..room]);
                return Ok((bytes, true));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok((bytes, false))
    }

    fn classify(&self, error: &reqwest::Error) -> Failure {
        if error.is_timeout() {
            Failure::Timeout
        } else if error.is_connect() {
            Failure::Unreachable(self.redact(&error_chain(error)))
        } else {
            // A connection dropped mid-answer is worth another try; a request
            // that could not even be built is not.
            Failure::Transport {
                message: self.redact(&error_chain(error)),
                retryable: error.is_request() || error.is_body(),
            }
        }
    }

    fn give_up(&self, failure: Failure, attempts: Attempts, note: String) -> OpenAiError {
        let endpoint = self.endpoint.clone();
        match failure {
            Failure::Status { status, body, .. } => OpenAiError::Status { endpoint, status, attempts, note, body },
            Failure::Timeout => OpenAiError::Timeout {
                endpoint,
                timeout_ms: u64::try_from(self.config.request_timeout.as_millis()).unwrap_or(u64::MAX),
                attempts,
            },
            Failure::Unreachable(message) => OpenAiError::Unreachable { endpoint, attempts, message },
            Failure::Transport { message, .. } => OpenAiError::Transport { endpoint, attempts, message },
            Failure::TooLarge { seen } => {
                OpenAiError::AnswerTooLarge { endpoint, limit: self.config.max_answer_bytes, seen }
            }
        }
    }

    fn parse(&self, bytes: &[u8], turn: u32, latency: Duration, attempts: u32) -> Result<PolicyResponse, OpenAiError> {
        let (text, not_utf8) = decode_body(bytes);
        let mut response =
            parse_chat_completion(&text, &self.config.model, turn, latency, attempts).map_err(|reason| {
                OpenAiError::MalformedResponse {
                    endpoint: self.endpoint.clone(),
                    reason,
                    body: self.excerpt(&text, false),
                }
            })?;
        response.warnings.extend(not_utf8);
        if self.config.logprobs && self.config.top_logprobs > 0 {
            cap_alternatives(&mut response, self.config.top_logprobs as usize);
            flag_missing_alternatives(&mut response, self.config.top_logprobs);
        }
        Ok(response)
    }

    /// The start of a body for an error message, with the API key blanked
    /// out in case the server echoes it. `cut`: `text` is the start of a body that was not read to its end.
    fn excerpt(&self, text: &str, cut: bool) -> String {
        let excerpt = match text.char_indices().nth(BODY_EXCERPT_CHARS) {
            Some((at, _)) if cut => format!("{}… (more than {} bytes)", &text[..at], text.len()),
            Some((at, _)) => format!("{}… ({} bytes in all)", &text[..at], text.len()),
            None => text.to_owned(),
        };
        let excerpt = self.redact(&excerpt);
        if excerpt.trim().is_empty() { "(empty body)".to_owned() } else { excerpt }
    }

    fn redact(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) => text.replace(key.expose(), "<redacted>"),
            None => text.to_owned(),
        }
    }
}

impl Failure {
    fn summary(&self) -> String {
        match self {
            Self::Status { status, .. } => format!("HTTP {status}"),
            Self::Timeout => "request timeout".to_owned(),
            Self::Unreachable(message) | Self::Transport { message, .. } => message.clone(),
            Self::TooLarge { .. } => "answer too large".to_owned(),
        }
    }
}

/// The body as text. JSON is UTF-8; bytes that are not are replaced with
/// U+FFFD, and the turn says so (its text is not what the model wrote).
fn decode_body(bytes: &[u8]) -> (std::borrow::Cow<'_, str>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.into(), None),
        Err(e) => (
            String::from_utf8_lossy(bytes),
            Some(format!(
                "the answer is not valid UTF-8 (first bad byte at offset {}); its invalid bytes were replaced \
                 with U+FFFD",
                e.valid_up_to()
            )),
        ),
    }
}

/// Keeps the `k` first alternatives of each token, as asked for: the trace
/// header promises at most `top_k`, and `trace validate` holds it to that.
fn cap_alternatives(response: &mut PolicyResponse, k: usize) {
    let Some(tokens) = response.logprobs.as_mut() else { return };
    let (mut capped, mut most) = (0, 0);
    for token in tokens.iter_mut().filter(|token| token.top.len() > k) {
        capped += 1;
        most = most.max(token.top.len());
        token.top.truncate(k);
    }
    if capped > 0 {
        response.warnings.push(format!(
            "{capped} token(s) came with more alternatives than the {k} asked for (up to {most}); the first {k} \
             were kept"
        ));
    }
}

/// Says so when the server sent logprobs but not one alternative for any
/// token although `k` were asked for (a server that ignores `top_logprobs`):
/// the trace's top-k would be empty without a word.
fn flag_missing_alternatives(response: &mut PolicyResponse, k: u32) {
    let Some(tokens) = response.logprobs.as_ref().filter(|tokens| !tokens.is_empty()) else { return };
    if tokens.iter().all(|token| token.top.is_empty()) {
        response.warnings.push(format!(
            "the logprobs came without alternatives for any of the {} token(s), though top_logprobs {k} was asked \
             for (does the server honour top_logprobs?): the trace's top-k lists are empty",
            tokens.len()
        ));
    }
}

/// Validates the endpoint; returns it as errors print it (userinfo removed)
/// and the chat-completions URL.
/// An answer that may change if asked again: 408 and 429 say "not now"; a
/// 5xx may be a server restarting.
fn worth_retrying(status: u16) -> bool {
    matches!(status, 408 | 429) || status >= 500
}

fn chat_completions_url(endpoint: &str) -> Result<(String, reqwest::Url), OpenAiError> {
    let invalid = |reason: String| OpenAiError::InvalidEndpoint { endpoint: strip_userinfo(endpoint), reason };
    let trimmed = endpoint.trim().trim_end_matches('/');
    if trimmed.ends_with("/chat/completions") {
        return Err(invalid("it ends in /chat/completions, which is appended to it".to_owned()));
    }
    let mut url = reqwest::Url::parse(&format!("{trimmed}/chat/completions")).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!("scheme `{}` is not http or https", url.scheme())));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("it has a query string or fragment".to_owned()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("credentials in the URL are not supported; use the API key setting".to_owned()));
    }
    url.set_query(None);
    Ok((trimmed.to_owned(), url))
}

fn strip_userinfo(endpoint: &str) -> String {
    match reqwest::Url::parse(endpoint) {
        Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
            // Both setters only fail for URLs that cannot have credentials at all.
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        _ => endpoint.to_owned(),
    }
}

/// The wait a 429/503 asks for: `retry-after-ms` (OpenAI), else
/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return seconds(ms / 1000.0);
    }
    let value = header(RETRY_AFTER.as_str())?;
    if let Ok(secs) = value.parse::<f64>() {
        return seconds(secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn seconds(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs >= 0.0).then(|| Duration::try_from_secs_f64(secs).ok()).flatten()
}

/// The error and its sources, outermost first: reqwest's own message alone
/// ("error sending request") does not say what went wrong.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

// ---- the response ----------------------------------------------------------

#[derive(Deserialize)]
struct WireCompletion {
    #[serde(default)]
    model: Option<String>,
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    logprobs: Option<Value>,
    /// Basecamp's extension: full-vocabulary logits (`super::raw_logits`).
    #[serde(default)]
    raw_logits: Option<Value>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<Value>>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Deserialize)]
struct WireLogprobs {
    #[serde(default)]
    content: Option<Vec<WireTokenLogprob>>,
}

#[derive(Deserialize)]
struct WireTokenLogprob {
    token: String,
    #[serde(deserialize_with = "logprob_value")]
    logprob: f64,
    #[serde(default, alias = "id")]
    token_id: Option<i64>,
    #[serde(default)]
    top_logprobs: Vec<WireTopLogprob>,
}

#[derive(Deserialize)]
struct WireTopLogprob {
    token: String,
    #[serde(deserialize_with = "logprob_value")]
    logprob: f64,
    #[serde(default, alias = "id")]
    token_id: Option<i64>,
}

/// A logprob as servers write it: a number, or, for a token the model could
/// not emit, `-Infinity` (also `Infinity`, `NaN`) as a string, as Python's
/// `json` writes them bare and [`quote_non_finite_numbers`] quotes them.
fn logprob_value<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Wire {
        Number(f64),
        Text(String),
    }
    match Wire::deserialize(deserializer)? {
        Wire::Number(number) => Ok(number),
        Wire::Text(text) => match text.trim() {
            "-Infinity" | "-inf" => Ok(f64::NEG_INFINITY),
            "Infinity" | "+Infinity" | "inf" => Ok(f64::INFINITY),
            "NaN" | "nan" => Ok(f64::NAN),
            other => Err(serde::de::Error::custom(format!("logprob {other:?} is not a number"))),
        },
    }
}

/// The body with the bare `NaN`, `Infinity` and `-Infinity` that Python's
/// `json` (and servers built on it) write quoted, so that it parses as
/// JSON; `None` when there are none outside strings.
fn quote_non_finite_numbers(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_string, mut escaped, mut changed) = (false, false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if let Some(word) = ["-Infinity", "Infinity", "NaN"].into_iter().find(|w| rest.starts_with(w)) {
            out.push('"');
            out.push_str(word);
            out.push('"');
            rest = &rest[word.len()..];
            changed = true;
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    changed.then_some(out)
}

/// Why a logprobs block cannot be used as it is: a NaN, or a probability
/// above 1 (`-inf`, a token that could not be emitted, is a real logprob).
fn unusable_logprob(tokens: &[TokenLogprob]) -> Option<String> {
    let bad = |logprob: f32| logprob.is_nan() || logprob == f32::INFINITY;
    tokens.iter().enumerate().find_map(|(position, token)| {
        if bad(token.logprob) {
            return Some(format!("the logprob of the token at position {position} is {}", token.logprob));
        }
        let (rank, top) = token.top.iter().enumerate().find(|(_, top)| bad(top.logprob))?;
        Some(format!("alternative {rank} of the token at position {position} has logprob {}", top.logprob))
    })
}

/// Reads a chat-completions body. Only a body that is not a completion at
/// all is an error; a bad tool call or logprobs block is recorded in the
/// response (invalid arguments, warnings) instead. `turn` makes the ids
/// given to calls the server sent without one unique in the episode.
pub fn parse_chat_completion(
    text: &str,
    configured_model: &str,
    turn: u32,
    latency: Duration,
    attempts: u32,
) -> Result<PolicyResponse, String> {
    let completion: WireCompletion = match serde_json::from_str(text) {
        Ok(completion) => completion,
        Err(e) => match quote_non_finite_numbers(text) {
            Some(quoted) => serde_json::from_str(&quoted).map_err(|_| e.to_string())?,
            None => return Err(e.to_string()),
        },
    };
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err("`choices` is empty".to_owned());
    };
    let mut warnings = Vec::new();
    let tool_calls = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(index, call)| parse_tool_call(turn, index, call, &mut warnings))
        .collect();
    let logprobs = match choice.logprobs {
        None | Some(Value::Null) => None,
        Some(value) => match serde_json::from_value::<WireLogprobs>(value) {
            Ok(logprobs) => {
                let tokens: Option<Vec<TokenLogprob>> =
                    logprobs.content.map(|tokens| tokens.into_iter().map(token_logprob).collect());
                match tokens.as_deref().and_then(unusable_logprob) {
                    Some(why) => {
                        warnings.push(format!("the logprobs block could not be used and was dropped: {why}"));
                        None
                    }
                    None => tokens,
                }
            }
            Err(e) => {
                warnings.push(format!("the logprobs block could not be read and was dropped: {e}"));
                None
            }
        },
    };
    let raw_logits = match choice.raw_logits {
        None | Some(Value::Null) => None,
        Some(value) => match RawLogits::from_json(&value, None) {
            Ok(raw) => Some(raw),
            Err(e) => {
                warnings.push(format!("the raw_logits block could not be read and was dropped: {e}"));
                None
            }
        },
    };
    let finish_reason = choice.finish_reason.as_deref().map(FinishReason::parse);
    match finish_reason {
        Some(FinishReason::Length) => warnings.push(
            "the completion was cut off at the token limit (finish_reason `length`): its text or tool-call \
             arguments may be incomplete; raise spec.policy.maxTokens or the server's context length"
                .to_owned(),
        ),
        Some(FinishReason::ContentFilter) => warnings.push(
            "the server's content filter stopped the completion (finish_reason `content_filter`): its text may be \
             missing or incomplete"
                .to_owned(),
        ),
        _ => {}
    }
    Ok(PolicyResponse {
        model: completion.model.filter(|m| !m.is_empty()).unwrap_or_else(|| configured_model.to_owned()),
        content: choice.message.content,
        tool_calls,
        finish_reason,
        logprobs,
        raw_logits,
        usage: completion.usage.map(|u| Usage {
            prompt_tokens: u32::try_from(u.prompt_tokens).unwrap_or(u32::MAX),
            completion_tokens: u32::try_from(u.completion_tokens).unwrap_or(u32::MAX),
        }),
        latency,
        attempts,
        warnings,
    })
}

fn parse_tool_call(turn: u32, index: usize, call: &Value, warnings: &mut Vec<String>) -> ToolCall {
    let id = match call.get("id").and_then(Value::as_str).filter(|id| !id.is_empty()) {
        Some(id) => id.to_owned(),
        None => {
            let id = format!("call_{turn}_{index}");
            warnings.push(format!("tool call {index} has no id; using {id}"));
            id
        }
    };
    let function = call.get("function");
    let name = function.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or_default().to_owned();
    if name.is_empty() {
        warnings.push(format!("tool call {index} ({id}) has no function name"));
    }
    let arguments = match function.and_then(|f| f.get("arguments")) {
        Some(Value::String(raw)) => ToolArguments::parse(raw),
        None | Some(Value::Null) => {
            warnings.push(format!("tool call {index} ({id}) has no arguments; using {{}}"));
            ToolArguments::Parsed(Value::Object(Map::new()))
        }
        // Some servers (Ollama) send the object itself rather than its text.
        Some(value) => ToolArguments::from_value(value.clone(), value.to_string()),
    };
    ToolCall { id, name, arguments }
}

fn token_logprob(wire: WireTokenLogprob) -> TokenLogprob {
    let (token, token_id) = token_and_id(wire.token, wire.token_id);
    TokenLogprob {
        token,
        token_id,
        logprob: wire.logprob as f32,
        top: wire
            .top_logprobs
            .into_iter()
            .map(|top| {
                let (token, token_id) = token_and_id(top.token, top.token_id);
                TopLogprob { token, token_id, logprob: top.logprob as f32 }
            })
            .collect(),
        entropy: None,
        kl: None,
    }
}

/// A token id from a `token_id` field, or from vLLM's
/// `return_tokens_as_token_ids` form `"token_id:1234"`.
fn token_and_id(token: String, id: Option<i64>) -> (String, Option<i32>) {
    let id = id.and_then(|id| i32::try_from(id).ok());
    if id.is_some() {
        return (token, id);
    }
    match token.strip_prefix("token_id:").and_then(|n| n.parse::<i32>().ok()) {
        Some(id) => (token, Some(id)),
        None => (token, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_a_turn_can_end_in_has_a_declared_category() {
        let (endpoint, attempts) = ("http://127.0.0.1:1/v1".to_string(), Attempts(1));
        let status = |status| OpenAiError::Status {
            endpoint: endpoint.clone(),
            status,
            attempts,
            note: String::new(),
            body: String::new(),
        };
        let turn_errors = [
            status(429),
            status(503),
            status(400),
            OpenAiError::Timeout { endpoint: endpoint.clone(), timeout_ms: 1, attempts },
            OpenAiError::Unreachable { endpoint: endpoint.clone(), attempts, message: String::new() },
            OpenAiError::Transport { endpoint: endpoint.clone(), attempts, message: String::new() },
            OpenAiError::MalformedResponse { endpoint: endpoint.clone(), reason: String::new(), body: String::new() },
            OpenAiError::AnswerTooLarge { endpoint, limit: 1, seen: String::new() },
        ];
        let categories: Vec<&str> = turn_errors.iter().map(OpenAiError::category).collect();
        assert_eq!(categories, TURN_ERROR_CATEGORIES);
    }

    #[test]
    fn attempts_read_naturally() {
        assert_eq!(Attempts(1).to_string(), "1 attempt");
        assert_eq!(Attempts(4).to_string(), "4 attempts");
    }

    #[test]
    fn endpoint_validation() {
        let (shown, url) = chat_completions_url("http://127.0.0.1:8000/v1/").unwrap();
        assert_eq!(shown, "http://127.0.0.1:8000/v1");
        assert_eq!(url.as_str(), "http://127.0.0.1:8000/v1/chat/completions");
        for bad in ["127.0.0.1:8000", "ftp://host/v1", "http://h/v1?x=1", "not a url", "http://h/v1/chat/completions/"]
        {
            let err = chat_completions_url(bad).unwrap_err();
            assert_eq!(err.category(), "PolicyEndpointInvalid", "{bad}: {err}");
        }
        let err = chat_completions_url("http://user:hunter2@host/v1").unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn the_models_url_is_beside_chat_completions() {
        for (endpoint, models) in [
            ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/models"),
            ("https://api.example.com/openai/v1", "https://api.example.com/openai/v1/models"),
            ("http://127.0.0.1:8000", "http://127.0.0.1:8000/models"),
        ] {
            let policy = OpenAiPolicy::new(OpenAiConfig::new(endpoint, "m")).unwrap();
            assert_eq!(policy.models_url(), models, "{endpoint}");
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let retry = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            max_retry_after: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let first = retry.backoff(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
            let third = retry.backoff(3);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400), "{third:?}");
            assert!(retry.backoff(40) <= Duration::from_millis(1000));
        }
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers, now), None);
        headers.insert(RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(3)));
        headers.insert(RETRY_AFTER, "Wed, 21 Oct 2015 07:28:10 GMT".parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(10)));
        headers.insert(RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers, now), None);
        headers.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_millis(250)));
        headers.insert("retry-after-ms", "-1".parse().unwrap());
        headers.insert(RETRY_AFTER, "-5".parse().unwrap());
        assert_eq!(retry_after(&headers, now), None);
    }

    #[test]
    fn api_key_debug_is_redacted() {
        let key = ApiKey("sk-secret-123".into());
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        assert!(!format!("{:?}", Some(key)).contains("sk-secret"));
    }

    #[test]
    fn api_key_sources_fail_clearly() {
        let err = ApiKeySource::Env("BASECAMP_TEST_SURELY_UNSET_VAR".into()).load().unwrap_err();
        assert_eq!(err.category(), "PolicyApiKeyMissing");
        assert!(err.to_string().contains("BASECAMP_TEST_SURELY_UNSET_VAR"));
        let err = ApiKeySource::File("/nonexistent/basecamp/key".into()).load().unwrap_err();
        assert_eq!(err.category(), "PolicyApiKeyUnreadable");
        assert!(err.to_string().contains("/nonexistent/basecamp/key"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "  \n").unwrap();
        assert_eq!(ApiKeySource::File(path.clone()).load().unwrap_err().category(), "PolicyApiKeyEmpty");
        std::fs::write(&path, "sk-abc\nsk-def\n").unwrap();
        let err = ApiKeySource::File(path.clone()).load().unwrap_err();
        assert_eq!(err.category(), "PolicyApiKeyInvalid");
        assert!(!err.to_string().contains("sk-abc"), "the key is never printed: {err}");
        std::fs::write(&path, "sk-abc\n").unwrap();
        assert_eq!(ApiKeySource::File(path).load().unwrap(), Some(ApiKey("sk-abc".into())));
    }

    #[test]
    fn parses_tool_calls_logprobs_and_usage() {
        let body = json!({
            "id": "chatcmpl-1", "model": "qwen",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": "{\"id\": 7}"}},
                    {"type": "function", "function": {"name": "lookup", "arguments": "{\"id\": "}},
                    {"id": "call_c", "type": "function", "function": {"name": "notify", "arguments": {"to": "x"}}}
                ]},
                "finish_reason": "tool_calls",
                "logprobs": {"content": [
                    {"token": "token_id:17", "logprob": -0.25, "bytes": [1], "top_logprobs": [
                        {"token": "token_id:17", "logprob": -0.25}, {"token": "token_id:99", "logprob": -1.5}
                    ]},
                    {"token": "x", "logprob": -9999.0, "top_logprobs": []}
                ]}
            }],
            "usage": {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129}
        });
        let resp = parse_chat_completion(&body.to_string(), "configured", 3, Duration::from_millis(5), 2).unwrap();
        assert_eq!(resp.model, "qwen");
        assert_eq!(resp.tool_calls.len(), 3);
        assert_eq!(resp.tool_calls[0].arguments, ToolArguments::Parsed(json!({"id": 7})));
        assert_eq!(resp.tool_calls[1].id, "call_3_1");
        assert_eq!(resp.tool_calls[1].arguments.invalid().unwrap().error_type, "invalid_json");
        assert_eq!(resp.tool_calls[2].arguments, ToolArguments::Parsed(json!({"to": "x"})));
        assert_eq!(resp.warnings.len(), 1, "{:?}", resp.warnings);
        let logprobs = resp.logprobs.as_ref().unwrap();
        assert_eq!(logprobs[0].token_id, Some(17));
        assert_eq!(logprobs[0].top[1].token_id, Some(99));
        assert_eq!(logprobs[1].token_id, None);
        assert_eq!(resp.usage, Some(Usage { prompt_tokens: 120, completion_tokens: 9 }));
        assert_eq!(resp.finish_reason, Some(FinishReason::ToolCalls));
        assert!(!resp.logprobs_missing());
    }

    #[test]
    fn a_malformed_logprobs_block_is_a_warning_not_a_failure() {
        let body = json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop",
            "logprobs": {"content": [{"token": 5}]}}]});
        let resp = parse_chat_completion(&body.to_string(), "configured", 0, Duration::ZERO, 1).unwrap();
        assert_eq!(resp.model, "configured");
        assert_eq!(resp.logprobs, None);
        assert!(resp.warnings[0].contains("logprobs"), "{:?}", resp.warnings);
    }

    #[test]
    fn raw_logits_in_a_choice_are_read_and_a_bad_block_is_a_warning() {
        let choice = |raw: Value| {
            json!({"choices": [{"message": {"tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]}, "raw_logits": raw}]})
            .to_string()
        };
        let resp = parse_chat_completion(
            &choice(json!({"path": "/shared/t0.safetensors", "reference": "trainer"})),
            "m",
            0,
            Duration::ZERO,
            1,
        )
        .unwrap();
        let raw = resp.raw_logits.as_ref().expect("raw logits");
        assert_eq!(raw.source, super::super::RawLogitsSource::File("/shared/t0.safetensors".into()));
        assert!(!resp.logprobs_missing(), "raw logits stand for the logprobs");

        let resp =
            parse_chat_completion(&choice(json!({"path": "t0.safetensors"})), "m", 0, Duration::ZERO, 1).unwrap();
        assert_eq!(resp.raw_logits, None);
        assert!(resp.logprobs_missing());
        assert!(
            resp.warnings[0].starts_with(
                "the raw_logits block could not be read and was dropped: path \"t0.safetensors\" is relative"
            ),
            "{:?}",
            resp.warnings
        );
    }

    #[test]
    fn a_cut_off_or_filtered_completion_is_flagged() {
        let finished = |reason: &str| {
            let body = json!({"choices": [{"message": {"content": "Your order"}, "finish_reason": reason}]});
            parse_chat_completion(&body.to_string(), "m", 0, Duration::ZERO, 1).unwrap().warnings
        };
        assert!(finished("stop").is_empty());
        assert!(
            finished("length")[0].starts_with("the completion was cut off at the token limit"),
            "{:?}",
            finished("length")
        );
        assert!(finished("content_filter")[0].starts_with("the server's content filter stopped the completion"));
    }

    #[test]
    fn bare_non_finite_numbers_are_quoted_outside_strings_only() {
        assert_eq!(quote_non_finite_numbers(r#"{"a": 1}"#), None);
        assert_eq!(quote_non_finite_numbers(r#"{"t": "NaN -Infinity \" NaN"}"#), None);
        assert_eq!(
            quote_non_finite_numbers(r#"{"t": "\"NaN", "l": -Infinity, "m": [NaN, Infinity]}"#).as_deref(),
            Some(r#"{"t": "\"NaN", "l": "-Infinity", "m": ["NaN", "Infinity"]}"#)
        );
    }

    #[test]
    fn not_a_completion_is_an_error() {
        assert!(parse_chat_completion("<html>", "m", 0, Duration::ZERO, 1).is_err());
        assert!(parse_chat_completion(r#"{"choices": []}"#, "m", 0, Duration::ZERO, 1).unwrap_err().contains("empty"));
        assert!(
            parse_chat_completion(r#"{"error": {"message": "x"}}"#, "m", 0, Duration::ZERO, 1)
                .unwrap_err()
                .contains("choices")
        );
    }
}
