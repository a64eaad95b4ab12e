//! Local copies of the objects the controller watches (reflector stores),
//! so that a reconcile with nothing to change reads nothing from the API
//! and writes nothing to it.
//!
//! The controller watches its Jobs, ConfigMaps and NetworkPolicies (to be
//! woken when they change) and the SandboxConfigs (to wake the tasks that
//! name them); each of those watches also fills a store here. A store may
//! lag the API server by a few events, so it is used only to decide that
//! there is nothing to do:
//!
//! - an object is applied again unless its cached copy carries the digest
//!   of the object the operator would apply now ([`stamp`]) *and* every
//!   field of it ([`holds`]) — so a spec change, a field removed from the
//!   desired object, an edit by hand and a deleted object are all applied;
//! - when something is to be done, the step reads the API as it would with
//!   no cache (a Job is read before it is replaced or suspended), so a
//!   stale copy costs a write, never a wrong one;
//! - a SandboxConfig missing from the store is read from the API; so is a
//!   Service (for the egress rule) in a namespace no store covers or before
//!   the first listing — one missing from a listed store does not exist.
//!
//! A stale copy that looks up to date is followed by the watch event that
//! made it stale, which wakes the task again.

use std::sync::Arc;

use basecamp_api::SandboxConfig;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceSpec};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::build::names::stable_hash;

/// The annotation holding the digest of the object as the operator last applied it.
pub const APPLIED_DIGEST_ANNOTATION: &str = "basecamp.dev/applied-digest";

/// What a cache keeps of an object, and what [`up_to_date`] compares: the
/// parts that can change under the operator, with the bulk that cannot
/// left out or hashed (1,000 tasks' Jobs and ConfigMaps in full were about
/// 40 MiB of the operator's memory).
pub trait Slim {
    /// Leaves out or hashes what need not be kept.
    fn slim(&mut self) {}
}

/// A Job's pod template is immutable and covered by its template-hash
/// annotation (a changed one replaces the Job): the cache keeps the rest
/// (metadata, `suspend`, parallelism, status).
impl Slim for Job {
    fn slim(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            spec.template = Default::default();
        }
    }
}

/// A ConfigMap's values (the resolved manifests) are kept as hashes.
impl Slim for ConfigMap {
    fn slim(&mut self) {
        for value in self.data.iter_mut().flat_map(|data| data.values_mut()) {
            *value = format!("fnv64:{}", stable_hash(value.as_bytes()));
        }
        for value in self.binary_data.iter_mut().flat_map(|data| data.values_mut()) {
            value.0 = format!("fnv64:{}", stable_hash(&value.0)).into_bytes();
        }
    }
}

impl Slim for NetworkPolicy {}

impl Slim for SandboxConfig {}

/// A Service is kept as what the egress rule reads of it: its selector and
/// ports (and type); its status, labels and annotations (often kubectl's
/// copy of the whole object) are left out.
impl Slim for Service {
    fn slim(&mut self) {
        self.status = None;
        self.metadata.annotations = None;
        self.metadata.labels = None;
        if let Some(spec) = self.spec.as_mut() {
            *spec = ServiceSpec {
                selector: spec.selector.take(),
                ports: spec.ports.take(),
                type_: spec.type_.take(),
                ..ServiceSpec::default()
            };
        }
    }
}

/// What a cache knows of an object.
#[derive(Debug, Clone)]
pub enum Cached<K> {
    /// No cache covers it, or not listed yet: ask the API.
    Unknown,
    /// Not there after the first listing: most likely it does not exist.
    Absent,
    /// This copy (slimmed).
    Present(Arc<K>),
}

/// What the cache knows of a Job (a present copy has no pod template).
pub type CachedJob = Cached<Job>;

/// The stores of one or more controllers (one per watched namespace).
#[derive(Clone, Default)]
pub struct Caches {
    jobs: Vec<Store<Job>>,
    config_maps: Vec<Store<ConfigMap>>,
    network_policies: Vec<Store<NetworkPolicy>>,
    sandboxes: Vec<Store<SandboxConfig>>,
    /// Each with the namespace it watches (`None`: all).
    services: Vec<(Option<String>, Store<Service>)>,
}

fn find<K>(stores: &[Store<K>], namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let key = ObjectRef::new(name).within(namespace);
    stores.iter().find_map(|store| store.get(&key))
}

/// Whether every store has had its first complete listing (so an object
/// missing from them was missing from the API moments ago).
fn listed<K>(stores: &[Store<K>]) -> bool
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    !stores.is_empty() && stores.iter().all(is_listed)
}

fn is_listed<K>(store: &Store<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
}

impl Caches {
    /// What the cache knows of the Job `namespace/name`.
    pub fn job_state(&self, namespace: &str, name: &str) -> CachedJob {
        match find(&self.jobs, namespace, name) {
            Some(job) => CachedJob::Present(job),
            None if listed(&self.jobs) => CachedJob::Absent,
            None => CachedJob::Unknown,
        }
    }

    /// The cached Jobs of `namespace` that `keep` selects (slimmed: no pod
    /// template); `None` before every store's first listing.
    pub fn jobs_where(&self, namespace: &str, keep: impl Fn(&Job) -> bool) -> Option<Vec<Job>> {
        listed(&self.jobs).then(|| {
            self.jobs
                .iter()
                .flat_map(|store| store.state())
                .filter(|job| job.namespace().as_deref() == Some(namespace) && keep(job))
                .map(|job| job.as_ref().clone())
                .collect()
        })
    }

    /// The cached ConfigMap `namespace/name`.
    pub fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
        find(&self.config_maps, namespace, name)
    }

    /// The cached NetworkPolicy `namespace/name`.
    pub fn network_policy(&self, namespace: &str, name: &str) -> Option<Arc<NetworkPolicy>> {
        find(&self.network_policies, namespace, name)
    }

    /// The cached SandboxConfig `namespace/name`.
    pub fn sandbox(&self, namespace: &str, name: &str) -> Option<Arc<SandboxConfig>> {
        find(&self.sandboxes, namespace, name)
    }

    /// What the caches know of the Service `namespace/name`: `Unknown` when
    /// no store watches that namespace (or none has listed it yet, as when
    /// the operator may not watch Services).
    pub fn service(&self, namespace: &str, name: &str) -> Cached<Service> {
        let key = ObjectRef::new(name).within(namespace);
        let mut listed = false;
        for (_, store) in self.services.iter().filter(|(scope, _)| scope.as_deref().is_none_or(|s| s == namespace)) {
            if let Some(service) = store.get(&key) {
                return Cached::Present(service);
            }
            listed |= is_listed(store);
        }
        if listed { Cached::Absent } else { Cached::Unknown }
    }

    /// Watches the Jobs of `api` (with `config`), keeping their copies here.
    pub fn watch_jobs(&mut self, api: Api<Job>, config: watcher::Config) -> Watch<Job> {
        let (store, stream) = reflect(api, config);
        self.jobs.push(store);
        stream
    }

    /// Watches ConfigMaps, keeping their copies here.
    pub fn watch_config_maps(&mut self, api: Api<ConfigMap>, config: watcher::Config) -> Watch<ConfigMap> {
        let (store, stream) = reflect(api, config);
        self.config_maps.push(store);
        stream
    }

    /// Watches NetworkPolicies, keeping their copies here.
    pub fn watch_network_policies(&mut self, api: Api<NetworkPolicy>, config: watcher::Config) -> Watch<NetworkPolicy> {
        let (store, stream) = reflect(api, config);
        self.network_policies.push(store);
        stream
    }

    /// Watches SandboxConfigs, keeping their copies here.
    pub fn watch_sandboxes(&mut self, api: Api<SandboxConfig>, config: watcher::Config) -> Watch<SandboxConfig> {
        let (store, stream) = reflect(api, config);
        self.sandboxes.push(store);
        stream
    }

    /// Watches the Services of `namespace` (`None`: all), keeping their copies here.
    pub fn watch_services(
        &mut self,
        namespace: Option<&str>,
        config: watcher::Config,
        client: Client,
    ) -> Watch<Service> {
        let api = match namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        };
        let (store, stream) = reflect(api, config);
        self.services.push((namespace.map(str::to_string), store));
        stream
    }
}

/// The objects a watch saw change (or go), for the controller's triggers.
/// The store is updated before an object comes out of the stream.
pub type Watch<K> = BoxStream<'static, Result<K, watcher::Error>>;

fn reflect<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Watch<K>)
where
    K: Resource<DynamicType = ()> + Slim + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    // managedFields are most of a small object's size and never read here.
    let watch = watcher(api, config).default_backoff().modify(|object| {
        object.managed_fields_mut().clear();
        object.slim();
    });
    (reader, reflector::reflector(writer, watch).touched_objects().boxed())
}

/// The digest of `object` as it would be applied (its own digest annotation left out).
pub fn digest<K: Resource + Serialize>(object: &K) -> String {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut)
        && let Some(annotations) = metadata.get_mut("annotations").and_then(Value::as_object_mut)
    {
        annotations.remove(APPLIED_DIGEST_ANNOTATION);
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    stable_hash(value.to_string().as_bytes())
}

/// `object` with its digest annotation set: what `apply` sends.
pub fn stamp<K: Resource + Serialize + Clone>(object: &K) -> K {
    let digest = digest(object);
    let mut stamped = object.clone();
    stamped.annotations_mut().insert(APPLIED_DIGEST_ANNOTATION.to_string(), digest);
    stamped
}

/// Whether `live` (a cached, slimmed copy) is already what applying
/// `stamped` (from [`stamp`]) would make it: it carries the same digest and
/// holds every field of it, slimmed alike.
pub fn up_to_date<K: Resource + Serialize + Slim + Clone>(stamped: &K, live: &K) -> bool {
    let digest = stamped.annotations().get(APPLIED_DIGEST_ANNOTATION);
    if digest.is_none() || live.annotations().get(APPLIED_DIGEST_ANNOTATION) != digest {
        return false;
    }
    let mut want = stamped.clone();
    want.slim();
    match (serde_json::to_value(&want), serde_json::to_value(live)) {
        (Ok(want), Ok(have)) => match first_difference(&have, &want) {
            None => true,
            Some(field) => {
                tracing::debug!(name = %live.name_any(), %field, "the cached copy differs from the desired object");
                false
            }
        },
        _ => false,
    }
}

/// Whether `have` holds every field of `want` with the same value: maps may
/// carry more keys (fields the API server defaults or others own), lists
/// must have the same length and hold each element in order, scalars must be
/// equal. An empty map in `want` (`emptyDir: {}`) is held by any map. A
/// missing field holds a zero value (`false`, `0`, `""`, `[]`, `{}`): the API
/// server leaves those out of what it returns (Go's `omitempty`), as it
/// does with a volume mount's `readOnly: false`.
pub fn holds(have: &Value, want: &Value) -> bool {
    first_difference(have, want).is_none()
}

fn is_zero(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Null => true,
    }
}

/// The JSON pointer of the first field of `want` that `have` does not hold
/// (see [`holds`]); `None` when it holds them all.
pub fn first_difference(have: &Value, want: &Value) -> Option<String> {
    match (have, want) {
        (Value::Object(have), Value::Object(want)) => want.iter().find_map(|(key, want)| {
            let at = |rest: String| format!("/{}{rest}", key.replace('~', "~0").replace('/', "~1"));
            match have.get(key) {
                Some(have) => first_difference(have, want).map(at),
                None if is_zero(want) => None,
                None => Some(at(String::new())),
            }
        }),
        (Value::Array(have), Value::Array(want)) if have.len() == want.len() => have
            .iter()
            .zip(want)
            .enumerate()
            .find_map(|(i, (have, want))| first_difference(have, want).map(|rest| format!("/{i}{rest}"))),
        (have, want) if have == want => None,
        _ => Some(String::new()),
    }
}

#[cfg(test)]
impl Caches {
    /// Caches holding these objects, as the watches would have filled them.
    pub(crate) fn holding(
        jobs: Vec<Job>,
        config_maps: Vec<ConfigMap>,
        network_policies: Vec<NetworkPolicy>,
        sandboxes: Vec<SandboxConfig>,
    ) -> Self {
        Self {
            jobs: vec![filled(jobs)],
            config_maps: vec![filled(config_maps)],
            network_policies: vec![filled(network_policies)],
            sandboxes: vec![filled(sandboxes)],
            services: Vec::new(),
        }
    }

    /// These caches and a listed store of the Services of `namespace` (`None`: all).
    pub(crate) fn with_services(mut self, namespace: Option<&str>, services: Vec<Service>) -> Self {
        self.services.push((namespace.map(str::to_string), filled(services)));
        self
    }
}

#[cfg(test)]
fn filled<K>(objects: Vec<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Slim + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for mut object in objects {
        object.slim();
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use serde_json::json;

    fn config_map(data: &[(&str, &str)], labels: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("eval-sandbox".into()),
                namespace: Some("team-a".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    /// What the API server returns for an applied object: the fields sent,
    /// plus what it adds (uid, resourceVersion, defaults, others' labels).
    fn as_stored(applied: &ConfigMap) -> ConfigMap {
        let mut live = applied.clone();
        live.slim();
        live.metadata.uid = Some("uid-7".into());
        live.metadata.resource_version = Some("42".into());
        live.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        live.labels_mut().insert("added-by-someone-else".into(), "x".into());
        live
    }

    #[test]
    fn an_applied_object_is_up_to_date_until_the_desired_or_the_live_one_changes() {
        let want = stamp(&config_map(&[("manifests.yaml", "a: 1")], &[("app", "basecamp")]));
        let live = as_stored(&want);
        assert!(up_to_date(&want, &live), "what the API returns for what was applied");

        let changed = stamp(&config_map(&[("manifests.yaml", "a: 2")], &[("app", "basecamp")]));
        assert!(!up_to_date(&changed, &live), "the desired data changed");

        let fewer_labels = config_map(&[("manifests.yaml", "a: 1")], &[]);
        let mut slimmed = fewer_labels.clone();
        slimmed.slim();
        assert!(
            holds(&serde_json::to_value(&live).unwrap(), &serde_json::to_value(&slimmed).unwrap()),
            "the live object holds every field of the smaller one ..."
        );
        assert!(
            !up_to_date(&stamp(&fewer_labels), &live),
            "... but a field the operator stopped applying must go: the digest tells"
        );

        let mut edited = want.clone();
        edited.data.as_mut().unwrap().insert("manifests.yaml".into(), "edited: by hand".into());
        assert!(!up_to_date(&want, &as_stored(&edited)), "an edit by hand of an applied field is undone");

        let unstamped = config_map(&[("manifests.yaml", "a: 1")], &[("app", "basecamp")]);
        assert!(!up_to_date(&unstamped, &as_stored(&unstamped)), "an object without a digest is always applied");
        assert!(!up_to_date(&want, &as_stored(&unstamped)), "a live object from before digests is applied once");
    }

    #[test]
    fn the_cache_keeps_a_job_without_its_pod_template_and_a_config_map_with_hashed_values() {
        let mut map = config_map(&[("manifests.yaml", "a: 1")], &[]);
        map.slim();
        assert_eq!(map.data.unwrap()["manifests.yaml"], format!("fnv64:{}", stable_hash(b"a: 1")));
        let mut job: Job = serde_json::from_value(json!({
            "metadata": {"name": "eval-a", "annotations": {"basecamp.dev/template-hash": "h"}},
            "spec": {"suspend": true, "template": {"spec": {"containers": [{"name": "sandbox", "image": "x"}]}}},
            "status": {"completedIndexes": "0-1"},
        }))
        .unwrap();
        job.slim();
        let kept = serde_json::to_value(&job).unwrap();
        assert_eq!(kept["spec"], json!({"suspend": true, "template": {}}));
        assert_eq!(kept["status"]["completedIndexes"], "0-1");
        assert_eq!(kept["metadata"]["annotations"]["basecamp.dev/template-hash"], "h");
    }

    #[test]
    fn the_digest_ignores_its_own_annotation_and_nothing_else() {
        let object = config_map(&[("k", "v")], &[("app", "basecamp")]);
        assert_eq!(digest(&object), digest(&stamp(&object)));
        assert_ne!(digest(&object), digest(&config_map(&[("k", "w")], &[("app", "basecamp")])));
    }

    #[test]
    fn a_service_is_present_absent_or_unknown_by_the_namespaces_the_stores_watch() {
        let service = |namespace: &str, name: &str| Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                annotations: Some(
                    [("kubectl.kubernetes.io/last-applied-configuration".into(), "x".repeat(4000))].into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                selector: Some([("app".into(), name.into())].into()),
                cluster_ip: Some("10.96.0.7".into()),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        };
        assert!(matches!(Caches::default().service("a", "vllm"), Cached::Unknown), "no store: ask the API");
        let one = Caches::default().with_services(Some("a"), vec![service("a", "vllm")]);
        let Cached::Present(kept) = one.service("a", "vllm") else { panic!("a/vllm is cached") };
        assert_eq!(kept.spec.as_ref().and_then(|s| s.selector.clone()), Some([("app".into(), "vllm".into())].into()));
        assert!(kept.metadata.annotations.is_none() && kept.spec.as_ref().is_some_and(|s| s.cluster_ip.is_none()));
        assert!(matches!(one.service("a", "other"), Cached::Absent), "listed, not there");
        assert!(matches!(one.service("b", "vllm"), Cached::Unknown), "namespace b is not watched");
        let all = Caches::default().with_services(None, vec![service("b", "vllm")]);
        assert!(matches!(all.service("b", "vllm"), Cached::Present(_)));
        assert!(matches!(all.service("c", "vllm"), Cached::Absent), "a cluster-wide store covers every namespace");
        let (unlisted, _writer) = reflector::store::<Service>();
        let mut waiting = Caches::default();
        waiting.services.push((Some("a".into()), unlisted));
        assert!(matches!(waiting.service("a", "vllm"), Cached::Unknown), "not listed yet (or no right to watch)");
    }

    #[test]
    fn holds_compares_maps_as_subsets_and_lists_element_by_element() {
        let have = json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}], "f": {}}, "extra": true});
        assert!(holds(&have, &json!({"a": 1, "b": {"c": [1, {"d": 2}]}})));
        assert!(holds(&have, &json!({"b": {"f": {}}})));
        assert!(!holds(&have, &json!({"a": 2})));
        assert!(!holds(&have, &json!({"missing": 1})));
        assert!(
            holds(&have, &json!({"b": {"c": [1, {"d": 2, "readOnly": false}]}, "gone": "", "none": [], "zero": 0})),
            "the API server leaves zero values out"
        );
        assert!(!holds(&have, &json!({"b": {"c": [1, {"readOnly": true}]}})));
        assert!(!holds(&have, &json!({"b": {"c": [1]}})), "a list with an element fewer is a change");
        assert!(!holds(&have, &json!({"b": {"c": [1, {"d": 2}, 3]}})));
        assert!(!holds(&have, &json!({"b": {"c": [{"d": 2}, 1]}})), "order matters");
        assert!(!holds(&json!({"a": "1"}), &json!({"a": 1})));
        assert_eq!(first_difference(&have, &json!({"b": {"c": [1, {"d": 5}]}})).as_deref(), Some("/b/c/1/d"));
        assert_eq!(first_difference(&have, &json!({"a/b": 1})).as_deref(), Some("/a~1b"));
        assert_eq!(first_difference(&have, &json!({"b": {"c": []}})).as_deref(), Some("/b/c"));
    }
}
