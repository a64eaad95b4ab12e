//! Services: helper processes a sandbox starts before its first episode and
//! stops after its last — a mock tracking API, a fixture database — so a
//! task's tools have something real to talk to on this machine and in a pod
//! alike. A service listens on 127.0.0.1; tools find it through
//! `$(services.NAME.url)`, `$(services.NAME.host)` and
//! `$(services.NAME.port)` references in `http.url`, `http.headers`,
//! `http.body` and in `exec.command` / `exec.env`, expanded once when the
//! sandbox starts. (`{{...}}` placeholders stay what they are: call
//! arguments, filled in per call.)

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;

/// The readiness wait when `readyTimeout` is not set.
pub const DEFAULT_READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A helper process the sandbox runs next to the agent's episodes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// The program and its arguments (argv; no shell), e.g.
    /// `["python3", "services/tracking.py"]`. Relative paths resolve against
    /// the manifest's directory for `basecamp run`, the working directory in
    /// a pod. The process gets `HOST=127.0.0.1` and `PORT` in its
    /// environment and must listen there. A program that is not there, not
    /// on `PATH` or not executable is refused before any service starts.
    pub command: Vec<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The port on 127.0.0.1. Absent or 0: a free port chosen at start, so
    /// several sandboxes can run side by side. A fixed port another process
    /// already holds is refused before the service starts (that process
    /// would answer the readiness probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// An HTTP path polled until it answers 2xx, e.g. `/healthz`. Default:
    /// ready once the port accepts a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_path: Option<String>,
    /// How long to wait for readiness before the run fails.
    /// At most 7 days (168h). Default: 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_timeout: Option<Duration>,
}

impl ServiceSpec {
    /// How long to wait for readiness.
    pub fn ready_timeout(&self) -> std::time::Duration {
        self.ready_timeout.and_then(Duration::to_std).unwrap_or(DEFAULT_READY_TIMEOUT)
    }
}

/// What a reference may ask of a service.
pub const SERVICE_ATTRIBUTES: [&str; 3] = ["url", "host", "port"];

/// One `$(services.NAME.ATTR)` reference in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub service: String,
    pub attribute: String,
    /// Byte range of the whole `$(...)` in the text.
    pub range: std::ops::Range<usize>,
}

/// A malformed or unknown service reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {reason}; service references look like $(services.tracking.url), .host or .port")]
pub struct ServiceRefError {
    pub text: String,
    pub reason: String,
}

/// The `$(services.…)` references in `text`, in order. Other `$(` text is
/// left alone (a shell-looking string in an argument is not ours to judge).
pub fn service_refs(text: &str) -> Result<Vec<ServiceRef>, ServiceRefError> {
    const OPEN: &str = "$(services.";
    let mut refs = Vec::new();
    let mut from = 0;
    while let Some(offset) = text[from..].find(OPEN) {
        let start = from + offset;
        let inner_start = start + OPEN.len();
        let close = text[inner_start..].find(')').ok_or_else(|| ServiceRefError {
            text: text.to_string(),
            reason: format!("the reference at byte {start} is never closed with ')'"),
        })?;
        let inner = &text[inner_start..inner_start + close];
        let (service, attribute) = inner.split_once('.').ok_or_else(|| ServiceRefError {
            text: text.to_string(),
            reason: format!("$(services.{inner}) names no attribute"),
        })?;
        if service.is_empty() || !SERVICE_ATTRIBUTES.contains(&attribute) {
            return Err(ServiceRefError {
                text: text.to_string(),
                reason: format!(
                    "$(services.{inner}) is not a service reference (attributes: {})",
                    SERVICE_ATTRIBUTES.join(", ")
                ),
            });
        }
        let end = inner_start + close + 1;
        refs.push(ServiceRef { service: service.to_string(), attribute: attribute.to_string(), range: start..end });
        from = end;
    }
    Ok(refs)
}

/// Replaces every service reference in `text` with `lookup(service, attribute)`;
/// an unknown service is an error naming it.
pub fn expand_service_refs(
    text: &str,
    lookup: impl Fn(&str, &str) -> Option<String>,
) -> Result<String, ServiceRefError> {
    let refs = service_refs(text)?;
    if refs.is_empty() {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for r in refs {
        let value = lookup(&r.service, &r.attribute).ok_or_else(|| ServiceRefError {
            text: text.to_string(),
            reason: format!("no service named {:?} is defined in spec.services", r.service),
        })?;
        out.push_str(&text[last..r.range.start]);
        out.push_str(&value);
        last = r.range.end;
    }
    out.push_str(&text[last..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(service: &str, attribute: &str) -> Option<String> {
        (service == "tracking").then(|| match attribute {
            "url" => "http://127.0.0.1:4100".to_string(),
            "host" => "127.0.0.1".to_string(),
            _ => "4100".to_string(),
        })
    }

    #[test]
    fn references_expand_and_call_placeholders_stay() {
        let url = "$(services.tracking.url)/orders/{{order_id}}?port=$(services.tracking.port)";
        assert_eq!(expand_service_refs(url, lookup).unwrap(), "http://127.0.0.1:4100/orders/{{order_id}}?port=4100");
        assert_eq!(expand_service_refs("echo $(date)", lookup).unwrap(), "echo $(date)");
    }

    #[test]
    fn bad_references_say_what_is_wrong() {
        let err = expand_service_refs("$(services.billing.url)/x", lookup).unwrap_err();
        assert!(err.to_string().contains("no service named \"billing\""), "{err}");
        let err = service_refs("$(services.tracking.address)").unwrap_err();
        assert!(err.to_string().contains("attributes: url, host, port"), "{err}");
        let err = service_refs("$(services.tracking.url").unwrap_err();
        assert!(err.to_string().contains("never closed"), "{err}");
    }
}
