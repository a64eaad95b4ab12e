//! Secure defaults of sandbox pods: a non-root user, a read-only root file
//! system (traces and temporary files go to emptyDirs), no capabilities, no
//! privilege escalation, the runtime's default seccomp profile, and no
//! service-account token (the sandbox never talks to the API server).

use k8s_openapi::api::core::v1::{Capabilities, PodSecurityContext, SeccompProfile, SecurityContext};

/// The uid and gid sandbox pods run as (distroless `nonroot`).
pub const SANDBOX_UID: i64 = 65532;

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }
}

/// The pod-level security context.
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(SANDBOX_UID),
        run_as_group: Some(SANDBOX_UID),
        fs_group: Some(SANDBOX_UID),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// The security context of every container.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        privileged: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}
