//! What the operator was started with that shapes the objects it builds:
//! the sandbox image, how pods reach S3, Job retry and clean-up limits, how
//! long a sandbox pod waits for a final scrape, who may scrape it, and how
//! often a training task's checkpoints are polled.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;

/// Where the `basecamp-sandbox` binary lives in the Basecamp image.
pub const SANDBOX_BINARY_IN_IMAGE: &str = "/usr/local/bin/basecamp-sandbox";
/// Where the `basecamp` CLI lives in the Basecamp image (the trainer pod's
/// `inject-basecamp` init container copies it for `basecamp data preprocess`).
pub const CLI_BINARY_IN_IMAGE: &str = "/usr/local/bin/basecamp";
/// Where the `basecamp-operator` binary lives in the Basecamp image (the
/// init container uses its `inject-sandbox` command: the image has no shell
/// and no `cp`).
pub const OPERATOR_BINARY_IN_IMAGE: &str = "/usr/local/bin/basecamp-operator";

/// Settings that reach the built objects.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The Basecamp image (sandbox binary, operator binary).
    pub sandbox_image: String,
    /// An S3-compatible endpoint passed to pods as `AWS_ENDPOINT_URL_S3`
    /// and allowed by the NetworkPolicy; `None` for AWS S3 (HTTPS, 443).
    pub s3_endpoint: Option<String>,
    /// `imagePullSecrets` of every pod the operator builds (sandbox,
    /// evaluation and trainer pods): Secrets that must exist in each task's
    /// namespace. Empty: none (the namespace's ServiceAccount's, if any).
    pub image_pull_secrets: Vec<String>,
    /// `imagePullPolicy` of the containers that run the Basecamp image
    /// ([`Self::sandbox_image`]: the sandbox container without a tools
    /// image, the init containers that copy its binaries). `None`:
    /// Kubernetes' default. Users' images (tools, trainer, policy server)
    /// keep theirs.
    pub image_pull_policy: Option<String>,
    /// The S3 region passed to pods as `AWS_REGION` (the operator's own,
    /// `--s3-region` or `AWS_REGION`); `None`: the pods resolve it themselves
    /// (the SDK's chain, `us-east-1` without one), which a bucket elsewhere
    /// refuses.
    pub s3_region: Option<String>,
    /// A Secret in the task's namespace whose keys become the sandbox's
    /// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...).
    pub s3_secret: Option<String>,
    /// `ttlSecondsAfterFinished` of the Jobs.
    pub job_ttl_seconds: i32,
    /// `backoffLimitPerIndex`: retries of one shard.
    pub backoff_limit_per_index: i32,
    /// Where `basecamp serve` runs; `status.reportUrl` links the task's page there.
    pub report_base_url: Option<String>,
    /// How often a training task is looked at while its trainer runs or
    /// checkpoint evaluations are queued or running, in seconds.
    pub checkpoint_poll_seconds: u64,
    /// `basecamp-sandbox run --metrics-linger`: how long a sandbox pod waits
    /// for a first scrape before its first episode, and, once its shard is
    /// done, keeps serving `/metrics` for a scrape of its final counts (each
    /// wait ends as soon as the scrape was served). Zero: no waits.
    pub sandbox_metrics_linger: std::time::Duration,
    /// `--sandbox-metrics-from`: who may reach the sandbox pods' `metrics`
    /// port (9464) through the task's NetworkPolicy. The port also takes
    /// live injections, so these peers may inject too. Empty: no ingress
    /// rule at all (nothing may connect), never "from anywhere".
    pub sandbox_metrics_from: Vec<NetworkPolicyPeer>,
}

/// The default [`Settings::sandbox_metrics_linger`]: one scrape interval
/// of 30 s (the Prometheus Operator's default) plus 15 s for Prometheus to
/// discover a new pod and for a slow scrape.
pub const DEFAULT_SANDBOX_METRICS_LINGER: std::time::Duration = std::time::Duration::from_secs(45);

impl Default for Settings {
    fn default() -> Self {
        Self {
            sandbox_image: "basecamp:dev".into(),
            s3_endpoint: None,
            s3_region: None,
            image_pull_secrets: Vec::new(),
            image_pull_policy: None,
            s3_secret: None,
            job_ttl_seconds: 7 * 24 * 3600,
            backoff_limit_per_index: 2,
            report_base_url: None,
            checkpoint_poll_seconds: 10,
            sandbox_metrics_linger: DEFAULT_SANDBOX_METRICS_LINGER,
            sandbox_metrics_from: Vec::new(),
        }
    }
}

impl Settings {
    /// [`Self::image_pull_secrets`] as a pod's `imagePullSecrets`; `None`
    /// when there are none, so a pod without them is built as before.
    pub fn pod_image_pull_secrets(&self) -> Option<Vec<LocalObjectReference>> {
        (!self.image_pull_secrets.is_empty())
            .then(|| self.image_pull_secrets.iter().map(|name| LocalObjectReference { name: name.clone() }).collect())
    }
}

/// The values `--sandbox-image-pull-policy` takes (Kubernetes' `imagePullPolicy`).
pub const IMAGE_PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];

/// An example of `--sandbox-metrics-from`, for error messages and docs.
pub const SANDBOX_METRICS_FROM_EXAMPLE: &str =
    r#"[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#;

/// Why a `--sandbox-metrics-from` value was refused. The messages do not
/// name the flag: the command line's parser puts it in front.
#[derive(Debug, thiserror::Error)]
pub enum MetricsFromError {
    /// Not JSON.
    #[error(
        "not JSON: {message}; give a JSON array of NetworkPolicyPeer objects, such as {SANDBOX_METRICS_FROM_EXAMPLE}"
    )]
    NotJson {
        /// The parser's message (with line and column).
        message: String,
    },
    /// JSON, but not an array.
    #[error(
        "expected a JSON array of NetworkPolicyPeer objects, got {found}; wrap one peer in [ ], such as {SANDBOX_METRICS_FROM_EXAMPLE}"
    )]
    NotAnArray {
        /// What was given instead (`an object`, `a string`, ...).
        found: &'static str,
    },
    /// An item is not a NetworkPolicyPeer.
    #[error("[{index}] is not a NetworkPolicyPeer: {message}")]
    NotAPeer {
        /// Its position in the array.
        index: usize,
        /// The deserializer's message.
        message: String,
    },
    /// A field NetworkPolicyPeer does not have. Kubernetes' types ignore
    /// unknown fields, so a typo such as `podSelectr` would otherwise
    /// silently become an empty peer or an empty selector (all pods).
    #[error(
        "{path}: unknown field; a NetworkPolicyPeer has podSelector, namespaceSelector and ipBlock, a LabelSelector matchLabels and matchExpressions, an ipBlock cidr and except"
    )]
    UnknownField {
        /// Where, e.g. `[0].podSelector.matchLabel`.
        path: String,
    },
    /// A peer with none of the three fields (the API server refuses it).
    #[error("[{index}] selects nothing: give podSelector, namespaceSelector or ipBlock")]
    EmptyPeer {
        /// Its position in the array.
        index: usize,
    },
    /// `ipBlock` together with a selector (the API server refuses it).
    #[error("[{index}]: ipBlock cannot be combined with podSelector or namespaceSelector; make them two peers")]
    IpBlockWithSelector {
        /// Its position in the array.
        index: usize,
    },
    /// A CIDR that does not parse.
    #[error("{path}: {cidr:?} is not a CIDR such as 10.0.0.0/8 or fd00::/8")]
    BadCidr {
        /// Where, e.g. `[1].ipBlock.cidr`.
        path: String,
        /// The value.
        cidr: String,
    },
}

/// Parses `--sandbox-metrics-from`: a JSON array of Kubernetes
/// NetworkPolicyPeer objects. `[]` (or a blank value) is no peer at all.
/// Refuses at start-up what the API server would refuse on every task's
/// NetworkPolicy (an empty peer, ipBlock with a selector, a bad CIDR), and
/// unknown fields, which Kubernetes' types would drop without a word.
pub fn parse_sandbox_metrics_from(text: &str) -> Result<Vec<NetworkPolicyPeer>, MetricsFromError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| MetricsFromError::NotJson { message: e.to_string() })?;
    let items = match &value {
        serde_json::Value::Array(items) => items,
        other => return Err(MetricsFromError::NotAnArray { found: basecamp_api::jsonl::json_type(other) }),
    };
    let mut peers = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let peer: NetworkPolicyPeer = serde_json::from_value(item.clone())
            .map_err(|e| MetricsFromError::NotAPeer { index, message: e.to_string() })?;
        let kept = serde_json::to_value(&peer).expect("a NetworkPolicyPeer serializes to JSON");
        if let Some(path) = first_dropped_field(item, &kept, format!("[{index}]")) {
            return Err(MetricsFromError::UnknownField { path });
        }
        let selects = peer.pod_selector.is_some() || peer.namespace_selector.is_some();
        match &peer.ip_block {
            None if !selects => return Err(MetricsFromError::EmptyPeer { index }),
            Some(_) if selects => return Err(MetricsFromError::IpBlockWithSelector { index }),
            Some(block) => {
                check_cidr(&block.cidr, || format!("[{index}].ipBlock.cidr"))?;
                for (at, except) in block.except.iter().flatten().enumerate() {
                    check_cidr(except, || format!("[{index}].ipBlock.except[{at}]"))?;
                }
            }
            None => {}
        }
        peers.push(peer);
    }
    Ok(peers)
}

/// The path of the first key of `given` that did not survive a round trip
/// through the typed peer (`kept`): a field the type does not know. Nulls
/// are absent values, not unknown fields.
fn first_dropped_field(given: &serde_json::Value, kept: &serde_json::Value, path: String) -> Option<String> {
    match (given, kept) {
        (serde_json::Value::Object(given), serde_json::Value::Object(kept)) => {
            given.iter().filter(|(_, v)| !v.is_null()).find_map(|(key, v)| match kept.get(key) {
                None => Some(format!("{path}.{key}")),
                Some(k) => first_dropped_field(v, k, format!("{path}.{key}")),
            })
        }
        (serde_json::Value::Array(given), serde_json::Value::Array(kept)) => given
            .iter()
            .zip(kept)
            .enumerate()
            .find_map(|(at, (v, k))| first_dropped_field(v, k, format!("{path}[{at}]"))),
        _ => None,
    }
}

fn check_cidr(cidr: &str, path: impl FnOnce() -> String) -> Result<(), MetricsFromError> {
    let valid = cidr.split_once('/').is_some_and(|(addr, bits)| {
        let max = match addr.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => 32,
            Ok(IpAddr::V6(_)) => 128,
            Err(_) => return false,
        };
        bits.parse::<u8>().is_ok_and(|bits| bits <= max)
    });
    if valid { Ok(()) } else { Err(MetricsFromError::BadCidr { path: path(), cidr: cidr.to_string() }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_of_every_kind_parse() {
        let peers = parse_sandbox_metrics_from(
            r#"[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}},
                 "podSelector":{"matchExpressions":[{"key":"app.kubernetes.io/name","operator":"In","values":["prometheus"]}]}},
                {"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}},
                {"podSelector":{}}]"#,
        )
        .expect("valid peers");
        assert_eq!(peers.len(), 3);
        let monitoring = peers[0].namespace_selector.as_ref().and_then(|s| s.match_labels.as_ref());
        assert_eq!(
            monitoring.and_then(|l| l.get("kubernetes.io/metadata.name")).map(String::as_str),
            Some("monitoring")
        );
        assert_eq!(peers[1].ip_block.as_ref().map(|b| b.cidr.as_str()), Some("10.0.0.0/8"));
        assert_eq!(peers[2].pod_selector, Some(Default::default()), "an empty podSelector: every pod of the namespace");
        assert_eq!(parse_sandbox_metrics_from(SANDBOX_METRICS_FROM_EXAMPLE).expect("the example").len(), 1);
    }

    #[test]
    fn an_empty_array_or_value_is_no_peer_not_anyone() {
        assert!(parse_sandbox_metrics_from("[]").expect("[]").is_empty());
        assert!(parse_sandbox_metrics_from("  ").expect("blank").is_empty());
    }

    #[test]
    fn what_the_api_server_or_the_types_would_take_wrongly_is_refused() {
        let refused = |text: &str| parse_sandbox_metrics_from(text).expect_err(text).to_string();
        assert!(refused("[{").starts_with("not JSON:"), "{}", refused("[{"));
        assert!(
            refused(r#"{"podSelector":{}}"#)
                .contains("expected a JSON array of NetworkPolicyPeer objects, got an object")
        );
        assert!(refused("null").contains("got null"));
        assert!(refused(r#"["monitoring"]"#).starts_with("[0] is not a NetworkPolicyPeer"));
        // k8s_openapi drops unknown fields: checked here instead.
        assert!(refused(r#"[{"podSelectr":{}}]"#).starts_with("[0].podSelectr: unknown field"));
        assert!(
            refused(r#"[{"podSelector":{}},{"podSelector":{"matchLabel":{"a":"b"}}}]"#)
                .starts_with("[1].podSelector.matchLabel: unknown field"),
            "a typo inside a selector would otherwise select every pod"
        );
        assert!(refused(r#"[{}]"#).contains("[0] selects nothing"));
        assert!(refused(r#"[{"ipBlock":{"cidr":"10.0.0.0/8"},"podSelector":{}}]"#).contains("cannot be combined"));
        assert!(
            refused(r#"[{"ipBlock":{"cidr":"10.0.0.0"}}]"#).contains("[0].ipBlock.cidr: \"10.0.0.0\" is not a CIDR")
        );
        assert!(
            refused(r#"[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/33"]}}]"#)
                .contains("[0].ipBlock.except[0]")
        );
    }
}
