//! The NetworkPolicy of a task's sandbox pods: ingress only to the
//! `metrics` port (9464) from the peers of `--sandbox-metrics-from` (none
//! given: no ingress at all), and egress only to DNS, the policy endpoint,
//! the HTTP tools' hosts and S3.
//!
//! The `metrics` port serves `/metrics`, `/healthz` and live injection
//! alike, so the peers allowed to scrape may also inject. An empty peer
//! list means no ingress rule, never a rule without `from` (which would
//! admit anyone).
//!
//! NetworkPolicy matches pods and IP addresses, not host names. An
//! endpoint given as an IP literal is allowed as that address (`/32` or
//! `/128`) and port. One that names a Kubernetes Service (`name`,
//! `name.namespace`, `name.namespace.svc[.cluster.local]`) that the
//! controller found ([`BuildInput::services`]) with a pod selector is
//! allowed to that Service's pods on the port it forwards to (its
//! `targetPort`: the policy is checked after the Service's address
//! translation, so a rule for the Service port alone would block a Service
//! whose `port` and `targetPort` differ). Any other host name opens its
//! port (e.g. 443) to any address, which is the most a NetworkPolicy can
//! say about a name. Loopback endpoints (a policy-server sidecar, the
//! sandbox's own services) need no rule, and a tool URL whose host is a
//! template placeholder is skipped.
//!
//! The trainer pod of a training task (`basecamp.dev/role=trainer`) is not
//! selected: it runs the user's training code, which fetches base models
//! and writes checkpoints wherever its configuration says.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use basecamp_api::task::SANDBOX_METRICS_PORT;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;

use super::BuildInput;
use super::names::{ROLE_LABEL, ROLE_TRAINER, TASK_LABEL, label_value, labels, network_policy_name};

/// A place pods must reach: a host (name or IP literal) and a TCP port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// Host name or IP address (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// A Service an endpoint's host name may refer to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What the NetworkPolicy needs of a Service the controller found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServiceTarget {
    /// `spec.selector`; empty for a Service without one (ExternalName, or
    /// Endpoints managed by hand), which gets no pod rule.
    pub selector: BTreeMap<String, String>,
    /// Its TCP ports: `port` and the `targetPort` it forwards to (a number
    /// or a container port's name).
    pub ports: Vec<(i32, IntOrString)>,
}

impl ServiceTarget {
    /// From a Service read from the API.
    pub fn of(service: &k8s_openapi::api::core::v1::Service) -> Self {
        let spec = service.spec.clone().unwrap_or_default();
        let ports = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.protocol.as_deref().is_none_or(|protocol| protocol == "TCP"))
            .map(|p| (p.port, p.target_port.unwrap_or(IntOrString::Int(p.port))))
            .collect();
        Self { selector: spec.selector.unwrap_or_default(), ports }
    }

    /// The egress rule to this Service's pods for a connection to `port`;
    /// `None` when it selects no pods or has no such port.
    fn rule(&self, service: &ServiceRef, port: u16) -> Option<NetworkPolicyEgressRule> {
        if self.selector.is_empty() {
            return None;
        }
        let (_, target) = self.ports.iter().find(|(p, _)| *p == i32::from(port))?;
        let peer = NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some([(NAMESPACE_NAME_LABEL.to_string(), service.namespace.clone())].into()),
                match_expressions: None,
            }),
            pod_selector: Some(LabelSelector { match_labels: Some(self.selector.clone()), match_expressions: None }),
            ip_block: None,
        };
        let ports =
            vec![NetworkPolicyPort { port: Some(target.clone()), protocol: Some("TCP".into()), end_port: None }];
        Some(NetworkPolicyEgressRule { to: Some(vec![peer]), ports: Some(ports) })
    }
}

/// The label the API server puts on every namespace: its name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The Service a host name refers to from a pod in `namespace`, by the
/// cluster DNS's rules: `name`, `name.namespace`, `name.namespace.svc` and
/// `name.namespace.svc.<cluster domain>`. `None` for IP literals and other
/// names (`api.example.com`). A two-label name such as `example.com` is a
/// candidate too; the lookup simply finds no Service.
pub fn service_ref(host: &str, namespace: &str) -> Option<ServiceRef> {
    if host.parse::<IpAddr>().is_ok() {
        return None;
    }
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    let (name, namespace) = match labels.as_slice() {
        [name] => (*name, namespace),
        [name, namespace] | [name, namespace, "svc", ..] => (*name, *namespace),
        _ => return None,
    };
    let dns_label = |s: &str, first_digit_ok: bool| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
            && (first_digit_ok || !s.starts_with(|c: char| c.is_ascii_digit()))
    };
    (dns_label(name, false) && dns_label(namespace, true))
        .then(|| ServiceRef { namespace: namespace.to_string(), name: name.to_string() })
}

/// Host and port of an `http(s)://` URL (default ports 80 and 443); `None`
/// for anything else, and for hosts that are template placeholders.
pub fn endpoint_of(url: &str) -> Option<Endpoint> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (host, after) = inner.split_once(']')?;
        (host.to_string(), after.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() || host.contains(['{', '}', '$', '(', ')']) {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port,
    };
    Some(Endpoint { host: host.to_ascii_lowercase(), port })
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Every endpoint the task's pods call: policy, HTTP tools, S3.
pub fn endpoints(input: &BuildInput<'_>) -> BTreeSet<Endpoint> {
    let mut urls: Vec<String> = Vec::new();
    if let Some(endpoint) = &input.task.spec.policy.endpoint {
        urls.push(endpoint.clone());
    }
    for variant in &input.variants {
        urls.extend(variant.spec.tools.values().filter_map(|tool| tool.http.as_ref()).map(|http| http.url.clone()));
    }
    urls.push(input.settings.s3_endpoint.clone().unwrap_or_else(|| "https://s3.amazonaws.com".to_string()));
    urls.iter().filter_map(|u| endpoint_of(u)).filter(|e| !is_loopback(&e.host)).collect()
}

fn tcp(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort { port: Some(IntOrString::Int(i32::from(port))), protocol: Some("TCP".into()), end_port: None }
}

fn dns_rule() -> NetworkPolicyEgressRule {
    let port = |protocol: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(53)),
        protocol: Some(protocol.into()),
        end_port: None,
    };
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector::default()),
            pod_selector: Some(LabelSelector {
                match_labels: Some([("k8s-app".to_string(), "kube-dns".to_string())].into()),
                match_expressions: None,
            }),
            ip_block: None,
        }]),
        ports: Some(vec![port("UDP"), port("TCP")]),
    }
}

fn endpoint_rule(endpoint: &Endpoint) -> NetworkPolicyEgressRule {
    let to = endpoint.host.parse::<IpAddr>().ok().map(|ip| {
        let cidr = match ip {
            IpAddr::V4(v4) => format!("{v4}/32"),
            IpAddr::V6(v6) => format!("{v6}/128"),
        };
        vec![NetworkPolicyPeer { ip_block: Some(IPBlock { cidr, except: None }), ..Default::default() }]
    });
    NetworkPolicyEgressRule { to, ports: Some(vec![tcp(endpoint.port)]) }
}

/// The ingress rules: the `metrics` port from the configured peers, or
/// none. `None` rather than an empty list, so that the applied object has
/// no `ingress` field and a later apply with peers adds exactly one rule.
fn ingress_rules(peers: &[NetworkPolicyPeer]) -> Option<Vec<NetworkPolicyIngressRule>> {
    (!peers.is_empty()).then(|| {
        vec![NetworkPolicyIngressRule { from: Some(peers.to_vec()), ports: Some(vec![tcp(SANDBOX_METRICS_PORT)]) }]
    })
}

/// The NetworkPolicy.
pub fn network_policy(input: &BuildInput<'_>) -> NetworkPolicy {
    let endpoints = endpoints(input);
    // Host names that are not a found Service open only their port; one rule per distinct port suffices.
    let mut rules = vec![dns_rule()];
    let mut open_ports = BTreeSet::new();
    for endpoint in &endpoints {
        if endpoint.host.parse::<IpAddr>().is_ok() {
            rules.push(endpoint_rule(endpoint));
            continue;
        }
        let service_rule = service_ref(&endpoint.host, input.namespace)
            .and_then(|service| input.services.get(&service).and_then(|t| t.rule(&service, endpoint.port)));
        match service_rule {
            Some(rule) if !rules.contains(&rule) => rules.push(rule),
            Some(_) => {}
            None => {
                open_ports.insert(endpoint.port);
            }
        }
    }
    rules.extend(open_ports.into_iter().map(|port| NetworkPolicyEgressRule { to: None, ports: Some(vec![tcp(port)]) }));
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(network_policy_name(input.name)),
            namespace: Some(input.namespace.to_string()),
            labels: Some(labels(input.name, None)),
            owner_references: Some(vec![input.owner.clone()]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some([(TASK_LABEL.to_string(), label_value(input.name))].into()),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: ROLE_LABEL.to_string(),
                    operator: "NotIn".to_string(),
                    values: Some(vec![ROLE_TRAINER.to_string()]),
                }]),
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: ingress_rules(&input.settings.sandbox_metrics_from),
            egress: Some(rules),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_from_urls() {
        let e = |host: &str, port| Some(Endpoint { host: host.into(), port });
        assert_eq!(endpoint_of("https://api.example.com/v1"), e("api.example.com", 443));
        assert_eq!(endpoint_of("http://10.0.0.7:8000/v1"), e("10.0.0.7", 8000));
        assert_eq!(endpoint_of("http://user:pw@Shop.internal"), e("shop.internal", 80));
        assert_eq!(endpoint_of("http://[fd00::1]:9000/x"), e("fd00::1", 9000));
        assert_eq!(endpoint_of("http://$(services.mock.host):8080/track"), None);
        assert_eq!(endpoint_of("http://{host}/track"), None);
        assert_eq!(endpoint_of("ftp://x"), None);
        assert_eq!(endpoint_of("http://x:notaport/"), None);
    }
}
