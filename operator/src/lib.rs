//! The Basecamp operator: HarnessTasks reconciled into GPU-scheduled,
//! sharded sandbox Jobs, their results aggregated from S3 into status,
//! Events and Prometheus gauges.
//!
//! - [`crdgen`]: the CRD YAML under `crds/` and its drift check;
//! - [`build`]: the desired objects (ConfigMap, Indexed Jobs, NetworkPolicy)
//!   from a spec alone — pure, no API calls;
//! - [`controller`]: the reconcile pipeline
//!   `dereference -> validate -> build -> apply -> update_status`;
//! - [`training`]: the training loop — trainer Job, checkpoint discovery,
//!   checkpoint evaluations (operator/TRAINING.md);
//! - [`metrics`], [`server`]: `/metrics`, `/healthz`, `/readyz`;
//! - [`leader`]: leader election on a coordination.k8s.io Lease;
//! - [`settings`]: what the operator was started with.

pub mod build;
pub mod controller;
pub mod crdgen;
pub mod inject;
pub mod leader;
pub mod metrics;
pub mod server;
pub mod settings;
pub mod training;

/// The field manager of every server-side apply, and the Event reporter.
pub const FIELD_MANAGER: &str = "basecamp-operator";

#[cfg(test)]
pub mod testing;
