//! Basecamp's API: the `HarnessTask` and `SandboxConfig` types, the harness
//! spec and the one validation function shared by the sandbox, the operator
//! and the CLI.
//!
//! Empty until the sandbox runtime issue defines the spec types.
