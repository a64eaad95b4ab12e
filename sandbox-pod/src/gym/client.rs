//! A client of the sandbox's HTTP API, for `basecamp sandbox inject` and
//! scripts: driver mode's `--listen` server and server mode answer the same
//! injection endpoint with the same body, so one client serves both.

use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};

/// What an episode id is escaped of in a path: all but RFC 3986's unreserved characters.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// Why a request to the sandbox failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("{endpoint:?} is not a sandbox endpoint: {reason}; give the base URL, e.g. http://127.0.0.1:8090")]
    BadEndpoint { endpoint: String, reason: String },
    #[error("cannot reach the sandbox at {url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("the sandbox at {url} answered {status} {category}: {message}")]
    Refused { url: String, status: u16, category: String, message: String },
    #[error("the sandbox at {url} answered {status} with a body that is not the sandbox API's JSON: {body}")]
    Unexpected { url: String, status: u16, body: String },
}

impl ClientError {
    /// A fixed name for the kind of failure.
    pub fn category(&self) -> &'static str {
        match self {
            Self::BadEndpoint { .. } => "BadEndpoint",
            Self::Unreachable { .. } => "SandboxUnreachable",
            Self::Refused { .. } => "SandboxRefused",
            Self::Unexpected { .. } => "UnexpectedAnswer",
        }
    }
}

/// A sandbox at one base URL.
#[derive(Debug, Clone)]
pub struct SandboxClient {
    base: String,
    http: reqwest::Client,
}

/// `{"error": {"category", "message"}}`, as every error answer of the API.
fn api_error(body: &Value) -> Option<(String, String)> {
    let error = body.get("error")?;
    Some((error.get("category")?.as_str()?.to_string(), error.get("message")?.as_str()?.to_string()))
}

impl SandboxClient {
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, ClientError> {
        let bad =
            |reason: &str| ClientError::BadEndpoint { endpoint: endpoint.to_string(), reason: reason.to_string() };
        let base = endpoint.trim().trim_end_matches('/');
        let rest = base
            .strip_prefix("http://")
            .or_else(|| base.strip_prefix("https://"))
            .ok_or_else(|| bad("it does not start with http:// or https://"))?;
        if rest.is_empty() || rest.contains(['?', '#']) {
            return Err(bad("it names no host, or carries a query"));
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("basecamp/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Self { base: base.to_string(), http })
    }

    /// The URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs `body` to `path`; a 2xx answer's JSON, or the API's error.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let url = self.url(path);
        let response = self
            .http
            .post(&url)
            .json(body)
            .send()
            .await
            .map_err(|e| ClientError::Unreachable { url: url.clone(), cause: error_chain(&e) })?;
        let status = response.status().as_u16();
        let text =
            response.text().await.map_err(|e| ClientError::Unreachable { url: url.clone(), cause: error_chain(&e) })?;
        let parsed: Option<Value> = serde_json::from_str(&text).ok();
        match parsed {
            Some(value) if (200..300).contains(&status) => Ok(value),
            Some(value) if api_error(&value).is_some() => {
                let (category, message) = api_error(&value).expect("checked just above");
                Err(ClientError::Refused { url, status, category, message })
            }
            _ => Err(ClientError::Unexpected { url, status, body: text.chars().take(300).collect() }),
        }
    }

    /// Injects `observation` into `episode`, at `at_step` or its next step.
    pub async fn inject(
        &self,
        episode: &str,
        observation: Value,
        at_step: Option<u32>,
        id: Option<&str>,
    ) -> Result<Value, ClientError> {
        let mut body = json!({"observation": observation});
        if let Some(step) = at_step {
            body["at_step"] = json!(step);
        }
        if let Some(id) = id {
            body["id"] = json!(id);
        }
        let path = format!("/v1/episodes/{}/inject", utf8_percent_encode(episode, PATH_SEGMENT));
        self.post_json(&path, &body).await
    }
}

/// An error with its causes, `a: b: c` (reqwest's own message omits them).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_a_base_url() {
        assert!(SandboxClient::new("http://127.0.0.1:8090/", Duration::from_secs(1)).is_ok());
        for bad in ["127.0.0.1:8090", "ftp://x", "http://", "http://h/?q=1"] {
            let err = SandboxClient::new(bad, Duration::from_secs(1)).unwrap_err();
            assert_eq!(err.category(), "BadEndpoint", "{bad}");
        }
        let client = SandboxClient::new("http://h:1/", Duration::from_secs(1)).unwrap();
        assert_eq!(client.url("/v1/episodes"), "http://h:1/v1/episodes");
    }
}
