//! Leader election on a `coordination.k8s.io/v1` Lease (`--lease-name`,
//! default `basecamp-operator`, in the operator's namespace), so that of
//! several replicas exactly one reconciles. Each installation needs its own
//! name: two releases in one namespace sharing a Lease would each wait for
//! the other. The holder renews the Lease every `renew_every`; another
//! replica takes it over once `renewTime + leaseDurationSeconds` has passed.
//! Every write carries the Lease's resourceVersion, so two replicas racing
//! for an expired Lease cannot both win (the loser gets 409 and waits).
//!
//! [`decide`] is the pure rule; [`LeaderElector`] the thin API part.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// The Lease's name without `--lease-name` (what every release used before
/// the flag, so an operator upgraded in place keeps its Lease).
pub const DEFAULT_LEASE_NAME: &str = "basecamp-operator";

/// What a candidate should do with the Lease as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Unheld or expired: take it over.
    TakeOver,
    /// Someone else holds a live Lease.
    Wait {
        /// The holder.
        holder: String,
    },
}

/// The rule (pure).
pub fn decide(lease: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease else { return Decision::Create };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == identity {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
    let expires =
        spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0.as_second().saturating_add(duration));
    match expires {
        Some(expires) if expires > now.as_second() => Decision::Wait { holder },
        _ => Decision::TakeOver,
    }
}

/// Why the Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The API call failed (other than losing a race).
    #[error("failed to {action} Lease {namespace}/{name}: {source}")]
    Api {
        /// What was attempted.
        action: &'static str,
        /// The namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// The cause.
        source: kube::Error,
    },
}

impl LeaderError {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        match self {
            LeaderError::Api { source, .. } => crate::controller::api_error::category(source),
        }
    }
}

/// A candidate for leadership.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
}

impl LeaderElector {
    /// A candidate named `identity` (the pod's name) for Lease `name` in `namespace`.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }

    fn err(&self, action: &'static str) -> impl FnOnce(kube::Error) -> LeaderError + '_ {
        move |source| LeaderError::Api { action, namespace: self.namespace.clone(), name: self.name.clone(), source }
    }

    /// Tries to acquire or renew the Lease once; `true` when we hold it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, LeaderError> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await.map_err(self.err("read"))?;
        let decision = decide(current.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now);
        let seconds = i32::try_from(self.lease_duration.as_secs()).unwrap_or(15);
        let lost_race = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.is_conflict() || s.is_already_exists());
        match (decision, current) {
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if lost_race(&e) => Ok(false),
                    Err(e) => Err(self.err("create")(e)),
                }
            }
            (Decision::Wait { .. }, _) | (_, None) => Ok(false),
            (decision, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if decision == Decision::TakeOver {
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                }
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(MicroTime(now));
                match self.api.replace(&self.name, &PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if lost_race(&e) => Ok(false),
                    Err(e) => Err(self.err("update")(e)),
                }
            }
        }
    }

    /// Waits until we hold the Lease.
    pub async fn acquire(&self) -> Result<(), LeaderError> {
        loop {
            if self.try_acquire_or_renew().await? {
                tracing::info!(identity = %self.identity, "became the leader");
                return Ok(());
            }
            tokio::time::sleep(self.renew_every).await;
        }
    }

    /// Gives the Lease up (on graceful shutdown), so another replica takes
    /// over at once instead of after `leaseDurationSeconds`. Best effort.
    pub async fn release(&self) -> Result<(), LeaderError> {
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(self.err("read"))? else { return Ok(()) };
        let Some(spec) = lease.spec.as_mut().filter(|s| s.holder_identity.as_deref() == Some(self.identity.as_str()))
        else {
            return Ok(());
        };
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api.replace(&self.name, &PostParams::default(), &lease).await.map(|_| ()).map_err(self.err("release"))
    }

    /// Renews until a renewal fails or is lost; returns why leadership ended.
    pub async fn keep(&self) -> String {
        let mut failing_since: Option<std::time::Instant> = None;
        loop {
            tokio::time::sleep(self.renew_every).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => failing_since = None,
                Ok(false) => return "another replica holds the Lease".to_string(),
                Err(error) => {
                    let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                    tracing::warn!(%error, "cannot renew the Lease");
                    if since.elapsed() >= self.lease_duration {
                        return format!("the Lease could not be renewed for {:?}: {error}", self.lease_duration);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Reply, call, verify};
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/basecamp-operator";

    async fn attempt(script: Vec<crate::testing::Call>) -> (Result<bool, LeaderError>, Vec<crate::testing::Seen>) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let elector = LeaderElector::new(Client::new(service, "default"), "ops", DEFAULT_LEASE_NAME, "me");
        let verifier = tokio::spawn(verify(handle, script));
        let result =
            tokio::time::timeout(Duration::from_secs(10), elector.try_acquire_or_renew()).await.expect("finished");
        let seen = match verifier.await {
            Ok(seen) => seen,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        (result, seen)
    }

    fn lease(holder: &str, renewed: Timestamp) -> serde_json::Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": DEFAULT_LEASE_NAME, "namespace": "ops", "resourceVersion": "41"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": MicroTime(renewed), "leaseTransitions": 3},
        })
    }

    #[tokio::test]
    async fn creates_the_lease_when_there_is_none() {
        let not_found =
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
        let (result, seen) = attempt(vec![
            call("GET", LEASE, Reply::Json(404, not_found)),
            call("POST", "/apis/coordination.k8s.io/v1/namespaces/ops/leases", Reply::Echo),
        ])
        .await;
        assert!(result.expect("no error"));
        assert_eq!(seen[1].body["spec"]["holderIdentity"], "me");
        assert_eq!(seen[1].body["spec"]["leaseDurationSeconds"], 15);
    }

    #[tokio::test]
    async fn waits_while_another_replica_holds_a_live_lease() {
        let (result, _) = attempt(vec![call("GET", LEASE, Reply::Json(200, lease("other", Timestamp::now())))]).await;
        assert!(!result.expect("no error"));
    }

    #[tokio::test]
    async fn takes_over_an_expired_lease_with_a_compare_and_swap() {
        let expired = Timestamp::now() - jiff::SignedDuration::from_secs(60);
        let (result, seen) = attempt(vec![
            call("GET", LEASE, Reply::Json(200, lease("other", expired))),
            call("PUT", LEASE, Reply::Echo),
        ])
        .await;
        assert!(result.expect("no error"));
        assert_eq!(seen[1].body["metadata"]["resourceVersion"], "41");
        assert_eq!(seen[1].body["spec"]["holderIdentity"], "me");
        assert_eq!(seen[1].body["spec"]["leaseTransitions"], 4);
    }

    #[tokio::test]
    async fn release_gives_up_only_our_own_lease() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let elector = LeaderElector::new(Client::new(service, "default"), "ops", DEFAULT_LEASE_NAME, "me");
        let script =
            vec![call("GET", LEASE, Reply::Json(200, lease("me", Timestamp::now()))), call("PUT", LEASE, Reply::Echo)];
        let verifier = tokio::spawn(verify(handle, script));
        elector.release().await.expect("released");
        let seen = verifier.await.expect("verifier");
        assert!(seen[1].body["spec"]["holderIdentity"].is_null());
        assert_eq!(
            decide(
                Some(&serde_json::from_value(seen[1].body["spec"].clone()).expect("spec")),
                "other",
                Timestamp::now()
            ),
            Decision::TakeOver
        );

        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let elector = LeaderElector::new(Client::new(service, "default"), "ops", DEFAULT_LEASE_NAME, "me");
        let verifier =
            tokio::spawn(verify(handle, vec![call("GET", LEASE, Reply::Json(200, lease("other", Timestamp::now())))]));
        elector.release().await.expect("nothing to release");
        verifier.await.expect("no write to another replica's Lease");
    }

    /// Two releases in one namespace: each campaigns for its own Lease, so
    /// one's live Lease does not keep the other waiting.
    #[tokio::test]
    async fn a_named_lease_is_the_only_one_read_and_written() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let elector = LeaderElector::new(Client::new(service, "default"), "ops", "second-basecamp-operator", "me");
        let not_found =
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
        let named = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/second-basecamp-operator";
        let script = vec![
            call("GET", named, Reply::Json(404, not_found)),
            call("POST", "/apis/coordination.k8s.io/v1/namespaces/ops/leases", Reply::Echo),
        ];
        let verifier = tokio::spawn(verify(handle, script));
        let acquired =
            tokio::time::timeout(Duration::from_secs(10), elector.try_acquire_or_renew()).await.expect("finished");
        assert!(acquired.expect("no error"), "no other release's Lease stands in the way");
        let seen = verifier.await.expect("verifier");
        assert_eq!(seen[1].body["metadata"]["name"], "second-basecamp-operator");
    }

    #[tokio::test]
    async fn losing_the_race_is_not_an_error() {
        let expired = Timestamp::now() - jiff::SignedDuration::from_secs(60);
        let conflict =
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409});
        let (result, _) = attempt(vec![
            call("GET", LEASE, Reply::Json(200, lease("other", expired))),
            call("PUT", LEASE, Reply::Json(409, conflict)),
        ])
        .await;
        assert!(!result.expect("no error"));
    }

    fn spec(holder: &str, renewed: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).expect("time"))),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    #[test]
    fn the_lease_rule() {
        let now = Timestamp::from_second(1_000).expect("time");
        assert_eq!(decide(None, "me", now), Decision::Create);
        assert_eq!(decide(Some(&spec("me", 990, 15)), "me", now), Decision::Renew);
        assert_eq!(decide(Some(&spec("other", 990, 15)), "me", now), Decision::Wait { holder: "other".into() });
        assert_eq!(decide(Some(&spec("other", 980, 15)), "me", now), Decision::TakeOver, "expired at 995");
        assert_eq!(decide(Some(&spec("", 999, 15)), "me", now), Decision::TakeOver, "released");
        assert_eq!(
            decide(Some(&LeaseSpec { holder_identity: Some("other".into()), ..Default::default() }), "me", now),
            Decision::TakeOver
        );
    }
}
