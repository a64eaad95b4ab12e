//! `dereference`: read what a task refers to — the SandboxConfigs its
//! variants name and, when a sandbox asks for particular GPUs, the nodes
//! (for the capacity check). A missing SandboxConfig is a value here (the
//! validate step turns it into a clear condition), not an error. And the
//! Services the task's endpoints name ([`services`]), for the egress rules.

use std::collections::{BTreeMap, BTreeSet};

use basecamp_api::{HarnessTask, SandboxConfig};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::cache::{Cached, Caches};
use crate::build::network_policy::{ServiceRef, ServiceTarget};

/// What a task refers to, as read from the API.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// Every SandboxConfig name the task references, and the object when it exists.
    pub sandboxes: BTreeMap<String, Option<SandboxConfig>>,
    /// The cluster's nodes, when some sandbox constrains GPUs and the
    /// operator may list nodes; `None` otherwise.
    pub nodes: Option<Vec<Node>>,
}

/// Why the references could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DereferenceError {
    /// Reading a SandboxConfig failed (other than "not found").
    #[error("failed to read SandboxConfig {namespace}/{name}: {source}")]
    Sandbox {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The cause.
        source: kube::Error,
    },
}

impl DereferenceError {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        match self {
            DereferenceError::Sandbox { source, .. } => super::api_error::category(source),
        }
    }
}

fn constrains_gpus(sandbox: &SandboxConfig) -> bool {
    let constrains = |gpu: Option<&basecamp_api::GpuRequirement>| {
        gpu.is_some_and(|g| {
            g.gpu_count() > 0 || g.min_compute_capability.is_some() || g.product.is_some() || g.min_memory_gib.is_some()
        })
    };
    constrains(sandbox.spec.gpu.as_ref())
        || sandbox.spec.profiles.values().any(|p| p.0.get("gpu").is_some_and(|g| g.is_object()))
}

/// How long a reconcile waits for the node cache's first listing.
const NODE_CACHE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the SandboxConfigs (in name order; from `caches` when there, a
/// miss is read from the API) and, if needed, the nodes:
/// from `node_cache` (a reflector the operator keeps) when there is one,
/// else by listing them.
pub async fn dereference(
    client: &Client,
    caches: &Caches,
    task: &HarnessTask,
    node_cache: Option<&Store<Node>>,
) -> Result<World, DereferenceError> {
    let namespace = task.namespace().unwrap_or_default();
    let sandboxes_api: Api<SandboxConfig> = Api::namespaced(client.clone(), &namespace);
    let mut names: Vec<String> = task.spec.effective_variants().into_iter().map(|v| v.sandbox_ref.name).collect();
    names.sort();
    names.dedup();
    let mut world = World::default();
    for name in names {
        if let Some(cached) = caches.sandbox(&namespace, &name) {
            world.sandboxes.insert(name, Some(cached.as_ref().clone()));
            continue;
        }
        let found = sandboxes_api.get_opt(&name).await.map_err(|source| DereferenceError::Sandbox {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
        world.sandboxes.insert(name, found);
    }
    if world.sandboxes.values().flatten().any(constrains_gpus) {
        if let Some(cache) = node_cache {
            match tokio::time::timeout(NODE_CACHE_WAIT, cache.wait_until_ready()).await {
                Ok(Ok(())) => world.nodes = Some(cache.state().iter().map(|n| n.as_ref().clone()).collect()),
                _ => tracing::warn!(
                    "the node cache is not ready (can the operator watch nodes?); skipping the GPU capacity check"
                ),
            }
            return Ok(world);
        }
        let nodes: Api<Node> = Api::all(client.clone());
        match nodes.list(&ListParams::default()).await {
            Ok(list) => world.nodes = Some(list.items),
            // The capacity check is advice; without node access the Jobs still run.
            Err(error) => tracing::warn!(%error, "cannot list nodes; skipping the GPU capacity check"),
        }
    }
    Ok(world)
}

/// Reads the Services that the task's endpoint host names may refer to
/// (`build::network_policy::service_ref`). One that does not exist, or that
/// the operator may not read (a namespace it does not watch), is left out,
/// and its host name then opens its port to any address, as it would
/// without this lookup: the rule gets narrower when the Service is known,
/// never absent. The Service caches answer first; only a Service they do
/// not cover (a namespace not watched, or no right to watch Services) is
/// read from the API.
pub async fn services(
    client: &Client,
    caches: &Caches,
    candidates: BTreeSet<ServiceRef>,
) -> BTreeMap<ServiceRef, ServiceTarget> {
    let mut found = BTreeMap::new();
    for service in candidates {
        match caches.service(&service.namespace, &service.name) {
            Cached::Present(object) => {
                found.insert(service, ServiceTarget::of(&object));
                continue;
            }
            Cached::Absent => continue,
            Cached::Unknown => {}
        }
        let api: Api<Service> = Api::namespaced(client.clone(), &service.namespace);
        match api.get_opt(&service.name).await {
            Ok(Some(object)) => {
                found.insert(service, ServiceTarget::of(&object));
            }
            Ok(None) => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {
                tracing::debug!(namespace = %service.namespace, name = %service.name, "may not read the Service; its port stays open to any address");
            }
            Err(error) => {
                tracing::warn!(namespace = %service.namespace, name = %service.name, %error, "cannot read the Service; its port stays open to any address");
            }
        }
    }
    found
}
