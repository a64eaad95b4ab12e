//! `http` tools: a request built from templates filled with the call's
//! arguments, behind a per-tool rate limit.
//!
//! Templates use `{{name}}` (or a dotted path, `{{order.id}}`). In the URL
//! the value is percent-encoded, and a value that would make a `.` or `..`
//! path segment (which URL parsers resolve) is refused; in a JSON body template a string that is
//! exactly `{{name}}` becomes the argument's JSON value, and any other
//! string has the values interpolated as text. Without a body template,
//! POST/PUT/PATCH send the arguments as the JSON body.
//!
//! A successful answer's body is the observation: its JSON when it parses
//! (a JSON content type that does not parse is `invalid_json`), otherwise
//! its text. A body that is not UTF-8 (an image, a PDF, text in another
//! charset) fails as `invalid_output`, naming its content type: replacement
//! characters would reach the policy and the trace as if they were the answer.
//!
//! A failed answer (any status but 2xx) is only quoted in its error: the
//! first KiB of its body is read, never the rest, so its size does not
//! matter and a 5xx with a large error page is retried like any other.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use super::{DEFAULT_MAX_RESPONSE_BYTES, ToolError, ToolOutput, excerpt};

/// Requests per second and burst of one tool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub requests_per_second: f64,
    pub burst: u32,
}

#[derive(Clone)]
pub struct HttpTool {
    pub url_template: String,
    pub method: Method,
    pub headers: Vec<(String, String)>,
    pub body_template: Option<Value>,
    pub max_response_bytes: u64,
    /// Retries of 429/5xx answers; `None` fails on the first.
    pub retry: Option<basecamp_api::tool::HttpRetry>,
    client: reqwest::Client,
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    /// The quota `limiter` was built from, for [`HttpTool::with_own_limiter`].
    quota: Option<Quota>,
}

impl std::fmt::Debug for HttpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTool")
            .field("method", &self.method)
            .field("url_template", &self.url_template)
            .field("rate_limited", &self.limiter.is_some())
            .finish_non_exhaustive()
    }
}

impl HttpTool {
    pub fn new(client: reqwest::Client, method: Method, url_template: impl Into<String>) -> Self {
        Self {
            url_template: url_template.into(),
            method,
            headers: Vec::new(),
            body_template: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            retry: None,
            client,
            limiter: None,
            quota: None,
        }
    }

    /// Limits this tool to `limit`; calls wait for a slot (inside their timeout).
    pub fn with_rate_limit(mut self, limit: RateLimit) -> Result<Self, String> {
        if !(limit.requests_per_second.is_finite() && limit.requests_per_second > 0.0) {
            return Err(format!("requestsPerSecond must be a positive number, got {}", limit.requests_per_second));
        }
        let burst = NonZeroU32::new(limit.burst.max(1)).expect("max(1) is non-zero");
        // The limiter counts nanoseconds in a u64 (584 years) and panics past
        // that, for one request's period and for a full burst's.
        let too_slow = || {
            format!(
                "requestsPerSecond {} with a burst of {burst} is too slow for the rate limiter \
                 (one request's period times the burst must stay under 584 years); raise it, or drop the rate limit",
                limit.requests_per_second
            )
        };
        let period = Duration::try_from_secs_f64(1.0 / limit.requests_per_second).map_err(|_| too_slow())?;
        if period.checked_mul(burst.get()).is_none_or(|full| u64::try_from(full.as_nanos()).is_err()) {
            return Err(too_slow());
        }
        let quota = Quota::with_period(period).ok_or("the rate limit's period is zero")?.allow_burst(burst);
        self.limiter = Some(Arc::new(RateLimiter::direct(quota)));
        self.quota = Some(quota);
        Ok(self)
    }

    /// The same tool with a rate limiter of its own (a clone shares the
    /// limiter): each shard of a local run limits its calls as its pod would.
    pub fn with_own_limiter(&self) -> Self {
        Self { limiter: self.quota.map(|quota| Arc::new(RateLimiter::direct(quota))), ..self.clone() }
    }

    /// One call: the request, and its retries when the answer says "try
    /// again" and the tool has a retry policy. The executor's timeout bounds
    /// the whole loop, waits included.
    pub async fn call(&self, arguments: &Value) -> Result<ToolOutput, ToolError> {
        self.call_until(arguments, None, &AtomicU32::new(0)).await
    }

    /// [`Self::call`] for a caller that gives up at `deadline`: a retry whose
    /// wait (`Retry-After` or the backoff) would end at or past it is not
    /// made, and the call fails with the answer it got, saying why, instead
    /// of sleeping into a timeout that hides the server's answer. Each
    /// request sent again is counted in `sent_again` as it goes out, so a
    /// caller whose timeout drops this future still knows how many were.
    pub async fn call_until(
        &self,
        arguments: &Value,
        deadline: Option<Instant>,
        sent_again: &AtomicU32,
    ) -> Result<ToolOutput, ToolError> {
        let attempts = self.retry.as_ref().map_or(1, |r| r.attempts.max(1));
        let mut attempt = 1;
        loop {
            if attempt > 1 {
                sent_again.fetch_add(1, Ordering::Relaxed);
            }
            let answer = match self.attempt(arguments).await {
                Ok(answer) => answer,
                // A retried call that then failed otherwise (the service went away): say it was retried.
                Err(error) if attempt > 1 => return Err(error.with_note(&format!("attempt {attempt} of {attempts}"))),
                Err(error) => return Err(error),
            };
            match answer {
                Answer::Done(output) => return Ok(output),
                Answer::Failed { error, status, retry_after } => {
                    let retried = self.retry.as_ref().filter(|r| attempt < attempts && r.retries_status(status));
                    let Some(retry) = retried else {
                        // The retries are counted in the trace's `retries` too; the message says why it stopped.
                        return Err(if attempt > 1 {
                            error.with_note(&format!("gave up after {attempt} attempts"))
                        } else {
                            error
                        });
                    };
                    let wait =
                        retry_after.as_ref().map_or_else(|| retry.backoff_before(attempt + 1), |(wait, _)| *wait);
                    if deadline.is_some_and(|deadline| Instant::now() + wait >= deadline) {
                        let why = match &retry_after {
                            Some((_, header)) => format!("Retry-After: {header}"),
                            None => format!("the backoff of {} ms", wait.as_millis()),
                        };
                        return Err(error.with_note(&format!(
                            "not retried: {why} ends past the tool's timeout; attempt {attempt} of {attempts}"
                        )));
                    }
                    attempt += 1;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn attempt(&self, arguments: &Value) -> Result<Answer, ToolError> {
        let url = fill_url(&self.url_template, arguments)?;
        let mut request = self.client.request(self.method.clone(), &url);
        for (name, value) in &self.headers {
            let (name, value) = header(name, fill_text(value, arguments, |s| s.to_string())?)?;
            request = request.header(name, value);
        }
        match &self.body_template {
            Some(template) => request = request.json(&fill_json(template, arguments)?),
            None if matches!(self.method, Method::POST | Method::PUT | Method::PATCH) => {
                request = request.json(arguments)
            }
            None => {}
        }
        if let Some(limiter) = &self.limiter {
            limiter.until_ready().await;
        }
        let mut response = request.send().await.map_err(|e| ToolError::Transport(error_chain(&e)))?;
        let status = response.status();
        let content_type =
            response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
        let is_json = content_type.as_deref().is_some_and(|ct| ct.contains("json"));
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Some((parse_retry_after(v)?, v.trim().to_string())));
        let status = status.as_u16();
        if !(200..300).contains(&status) {
            // Only quoted, so only its start is read: a 5xx with an error
            // page past max_response_bytes is still retried.
            let quoted = quote_body_start(&mut response).await;
            let error = match status {
                429 => ToolError::RateLimited(quoted),
                _ => ToolError::HttpStatus { status, body: quoted },
            };
            return Ok(Answer::Failed { error, status, retry_after });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| ToolError::Transport(error_chain(&e)))? {
            if (body.len() + chunk.len()) as u64 > self.max_response_bytes {
                return Err(ToolError::ResponseTooLarge { limit: self.max_response_bytes });
            }
            body.extend_from_slice(&chunk);
        }
        let text = || excerpt(&String::from_utf8_lossy(&body), QUOTED_BODY_BYTES);
        let response_bytes = body.len() as u64;
        let value = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) if is_json => return Err(ToolError::InvalidJson(format!("{e}; body starts with {:?}", text()))),
                Err(_) => match String::from_utf8(body) {
                    Ok(text) => Value::String(text),
                    Err(e) => return Err(not_text(content_type.as_deref(), &e)),
                },
            }
        };
        ToolOutput::from_json(value, response_bytes).map(Answer::Done)
    }
}

/// How much of a body an error message quotes.
const QUOTED_BODY_BYTES: usize = 200;

/// How much of a failed answer's body is read, at most: enough for the
/// quote once surrounding whitespace is trimmed.
const FAILED_BODY_READ_BYTES: usize = 1024;

/// The start of a failed answer's body, for its error message (marked `…`
/// when cut). The rest is never read. A body that breaks off is quoted as
/// far as it came: the status is the answer, not the body.
async fn quote_body_start(response: &mut reqwest::Response) -> String {
    let mut start = Vec::new();
    let mut cut = false;
    while let Ok(Some(chunk)) = response.chunk().await {
        start.extend_from_slice(&chunk);
        if start.len() > FAILED_BODY_READ_BYTES {
            start.truncate(FAILED_BODY_READ_BYTES);
            cut = true;
            break;
        }
    }
    if let Err(e) = std::str::from_utf8(&start)
        && cut
        && e.error_len().is_none()
    {
        start.truncate(e.valid_up_to()); // a character the cut split
    }
    let mut quoted = excerpt(&String::from_utf8_lossy(&start), QUOTED_BODY_BYTES);
    if cut && !quoted.ends_with('…') {
        quoted.push('…');
    }
    quoted
}

/// A body that is neither JSON nor UTF-8 text (an image, a PDF, text in
/// another charset): an error that says so, rather than text with
/// replacement characters that the policy would read as the answer.
fn not_text(content_type: Option<&str>, e: &std::string::FromUtf8Error) -> ToolError {
    let body = e.as_bytes();
    let start: Vec<String> = body.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let more = if body.len() > start.len() { " …" } else { "" };
    ToolError::InvalidOutput(format!(
        "the response body is not UTF-8 text (Content-Type: {}; {} bytes, the first byte that is not UTF-8 at \
         offset {}; it starts {}{more}); an HTTP tool's answer must be JSON or UTF-8 text",
        content_type.unwrap_or("none"),
        body.len(),
        e.utf8_error().valid_up_to(),
        start.join(" "),
    ))
}

/// What one attempt got: a result, or a failed status that may be retried.
enum Answer {
    Done(ToolOutput),
    /// `retry_after`: the wait the server asked for, and its header as sent.
    Failed {
        error: ToolError,
        status: u16,
        retry_after: Option<(Duration, String)>,
    },
}

impl ToolError {
    /// Adds `note` to an HTTP call's error (after its body excerpt or reason), keeping its type.
    fn with_note(self, note: &str) -> Self {
        match self {
            Self::RateLimited(body) => Self::RateLimited(format!("{body} ({note})")),
            Self::HttpStatus { status, body } => Self::HttpStatus { status, body: format!("{body} ({note})") },
            Self::Transport(why) => Self::Transport(format!("{why} ({note})")),
            Self::InvalidJson(why) => Self::InvalidJson(format!("{why} ({note})")),
            Self::InvalidOutput(why) => Self::InvalidOutput(format!("{why} ({note})")),
            other => other,
        }
    }
}

/// The longest `Retry-After` wait honoured: the tool's timeout cuts a longer
/// wait short anyway.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// `Retry-After` as seconds (fractions allowed) or an HTTP date, capped at
/// [`MAX_RETRY_AFTER`].
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<f64>() {
        // A count of seconds too large for a Duration (1e20, inf) is a very
        // long wait, not a panic: it gets the cap like any other long one.
        Ok(seconds) if seconds >= 0.0 => Duration::try_from_secs_f64(seconds).unwrap_or(MAX_RETRY_AFTER),
        Ok(_) => return None,
        Err(_) => {
            httpdate::parse_http_date(value).ok()?.duration_since(std::time::SystemTime::now()).unwrap_or_default()
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// reqwest hides the useful part ("connection refused") in the source chain.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn lookup<'a>(arguments: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(arguments, |v, part| v.get(part))
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Replaces every `{{path}}` in `template`, passing each value's text through `encode`.
fn fill_text(template: &str, arguments: &Value, encode: impl Fn(&str) -> String) -> Result<String, ToolError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| ToolError::Arguments(format!("template {template:?} has an unclosed `{{{{`")))?;
        let path = after[..end].trim();
        let value = lookup(arguments, path).ok_or_else(|| {
            ToolError::Arguments(format!("the template needs argument `{path}`, which the call did not pass"))
        })?;
        out.push_str(&encode(&as_text(value)));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// One request header, or which one cannot be sent and why (reqwest's own
/// error is "builder error: failed to parse header value", naming neither).
fn header(name: &str, value: String) -> Result<(HeaderName, HeaderValue), ToolError> {
    let header_name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| ToolError::Arguments(format!("header {name:?} is not a valid HTTP header name")))?;
    let header_value = HeaderValue::try_from(value).map_err(|_| {
        ToolError::Arguments(format!(
            "header {name}: its value holds a line break or another control character (from the call's arguments?), which an HTTP header cannot carry"
        ))
    })?;
    Ok((header_name, header_value))
}

/// What a value in a URL is encoded for: everything but RFC 3986's
/// unreserved characters, which "should not be created by URI producers"
/// encoded (a server matching the raw path sees `A-1.json`, not `A%2D1%2Ejson`).
const URL_VALUE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn fill_url(template: &str, arguments: &Value) -> Result<String, ToolError> {
    let url = fill_text(template, arguments, |s| utf8_percent_encode(s, URL_VALUE).to_string())?;
    // A URL parser resolves `.` and `..` segments, encoded (`%2E%2E`) or
    // not: `/orders/{{id}}/refund` with id `..` would call `/refund`.
    if dot_segments(&url) > dot_segments(template) {
        return Err(ToolError::Arguments(format!(
            "the call's arguments make a `.` or `..` segment in the URL path ({url}), \
             which would send the request to another path"
        )));
    }
    Ok(url)
}

/// How many `.`/`..` segments (in any percent-encoding) the path of `url` has.
fn dot_segments(url: &str) -> usize {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let path = path.split_once("://").map_or(path, |(_, rest)| rest.split_once('/').map_or("", |(_, p)| p));
    path.split('/')
        .filter(|segment| {
            let segment = segment.to_ascii_lowercase().replace("%2e", ".");
            segment == "." || segment == ".."
        })
        .count()
}

fn fill_json(template: &Value, arguments: &Value) -> Result<Value, ToolError> {
    Ok(match template {
        Value::String(s) => {
            let trimmed = s.trim();
            let whole = trimmed.strip_prefix("{{").and_then(|r| r.strip_suffix("}}"));
            match whole.filter(|inner| !inner.contains("{{")) {
                Some(path) => lookup(arguments, path.trim()).cloned().ok_or_else(|| {
                    ToolError::Arguments(format!(
                        "the body template needs argument `{}`, which the call did not pass",
                        path.trim()
                    ))
                })?,
                None => Value::String(fill_text(s, arguments, |t| t.to_string())?),
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(|i| fill_json(i, arguments)).collect::<Result<_, _>>()?),
        Value::Object(map) => Value::Object(
            map.iter().map(|(k, v)| Ok((k.clone(), fill_json(v, arguments)?))).collect::<Result<_, ToolError>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn url_values_are_percent_encoded() {
        let url = fill_url("http://h/track/{{order_id}}?q={{q}}", &json!({"order_id": "A/1 2", "q": 3})).unwrap();
        assert_eq!(url, "http://h/track/A%2F1%202?q=3");
        let args = json!({"file": "ORD-1_v2.json~", "q": "a?b#c&d=é"});
        let url = fill_url("http://h/files/{{file}}?q={{q}}", &args).unwrap();
        assert_eq!(url, "http://h/files/ORD-1_v2.json~?q=a%3Fb%23c%26d%3D%C3%A9");
    }

    #[test]
    fn a_value_that_would_be_a_dot_segment_is_refused() {
        for id in ["..", "."] {
            let err = fill_url("http://h/orders/{{id}}/refund?x=1", &json!({"id": id})).unwrap_err();
            assert_eq!(err.error_type(), "bad_arguments");
            assert!(err.to_string().contains("segment in the URL path (http://h/orders/"), "{err}");
        }
        let err = fill_url("http://h/{{a}}{{b}}/x", &json!({"a": ".", "b": "."})).unwrap_err();
        assert_eq!(err.error_type(), "bad_arguments");
        for (template, id) in
            [("http://h/orders/{{id}}", "a..b"), ("http://h/o?q={{id}}", ".."), ("http://h/../{{id}}", "x")]
        {
            assert!(fill_url(template, &json!({"id": id})).is_ok(), "{template} {id}");
        }
        assert_eq!(fill_url("http://h/o/{{id}}", &json!({"id": "../admin"})).unwrap(), "http://h/o/..%2Fadmin");
        assert_eq!(fill_url("http://h/o/{{id}}", &json!({"id": "%2E%2E"})).unwrap(), "http://h/o/%252E%252E");
    }

    #[test]
    fn a_header_value_with_a_line_break_names_the_header() {
        let value = fill_text("Bearer {{token}}", &json!({"token": "a\r\nX-Admin: 1"}), |s| s.to_string()).unwrap();
        let err = header("Authorization", value).unwrap_err();
        assert_eq!(err.error_type(), "bad_arguments");
        assert!(err.to_string().contains("header Authorization: its value holds a line break"), "{err}");
        assert!(header("bad name", "x".into()).unwrap_err().to_string().contains("\"bad name\""));
        assert!(header("X-Ok", "Bearer a\tb".into()).is_ok());
    }

    #[test]
    fn a_rate_limit_too_slow_to_count_is_an_error_not_a_panic() {
        let tool = || HttpTool::new(reqwest::Client::new(), Method::GET, "http://h/");
        for (requests_per_second, burst) in [(1e-30, 1), (1e-12, 1), (1e-6, 100_000)] {
            let err = tool().with_rate_limit(RateLimit { requests_per_second, burst }).unwrap_err();
            assert!(err.contains("is too slow for the rate limiter"), "{err}");
        }
        let err = tool().with_rate_limit(RateLimit { requests_per_second: 1e-12, burst: 1 }).unwrap_err();
        assert!(err.starts_with("requestsPerSecond 0.000000000001 with a burst of 1 is too slow"), "{err}");
        assert!(tool().with_rate_limit(RateLimit { requests_per_second: 1e-6, burst: 1000 }).is_ok());
    }

    #[test]
    fn a_clone_shares_the_rate_limit_and_another_shards_tool_has_its_own() {
        let limited = HttpTool::new(reqwest::Client::new(), Method::GET, "http://h/")
            .with_rate_limit(RateLimit { requests_per_second: 1.0, burst: 1 })
            .unwrap();
        let (clone, own) = (limited.clone(), limited.with_own_limiter());
        let limiter = |t: &HttpTool| t.limiter.clone().expect("rate limited");
        assert!(Arc::ptr_eq(&limiter(&limited), &limiter(&clone)), "episodes of a shard share one limit");
        assert!(!Arc::ptr_eq(&limiter(&limited), &limiter(&own)), "another shard limits its own calls");
        // The same quota: one slot, taken at once, the next a second later.
        assert!(limiter(&limited).check().is_ok() && limiter(&limited).check().is_err());
        assert!(limiter(&own).check().is_ok() && limiter(&own).check().is_err());
        let unlimited = HttpTool::new(reqwest::Client::new(), Method::GET, "http://h/");
        assert!(unlimited.with_own_limiter().limiter.is_none());
    }

    #[test]
    fn a_retry_after_too_large_for_a_duration_is_capped_not_a_panic() {
        for huge in ["1e20", "1e300", "inf", "18446744073709551616"] {
            assert_eq!(parse_retry_after(huge), Some(MAX_RETRY_AFTER), "{huge}");
        }
        assert_eq!(parse_retry_after(" 1.5 "), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("120"), Some(MAX_RETRY_AFTER));
        for refused in ["-1", "NaN", "-inf", "soon"] {
            assert_eq!(parse_retry_after(refused), None, "{refused}");
        }
    }

    #[test]
    fn missing_argument_names_it() {
        let err = fill_url("http://h/{{order.id}}", &json!({"order": {}})).unwrap_err();
        assert_eq!(err.error_type(), "bad_arguments");
        assert!(err.to_string().contains("`order.id`"), "{err}");
    }

    #[test]
    fn body_template_keeps_json_types_for_whole_placeholders() {
        let body = fill_json(
            &json!({"id": "{{order.id}}", "note": "order {{order.id}} late", "fixed": 1}),
            &json!({"order": {"id": 42}}),
        )
        .unwrap();
        assert_eq!(body, json!({"id": 42, "note": "order 42 late", "fixed": 1}));
    }
}
