//! The `basecamp-operator` binary: crdgen's exit codes and messages, the
//! `run` flags, and a clear error without a cluster.

use std::process::Command;

fn operator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_basecamp-operator"))
}

#[test]
fn crdgen_writes_then_check_passes_and_drift_exits_1_naming_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = operator().args(["crdgen", "--out"]).arg(dir.path()).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let check = operator().args(["crdgen", "--check"]).arg(dir.path()).output().expect("runs");
    assert_eq!(check.status.code(), Some(0), "{}", String::from_utf8_lossy(&check.stderr));
    std::fs::write(dir.path().join("sandboxconfigs.basecamp.dev.yaml"), "# edited\n").expect("edit");
    let drift = operator().args(["crdgen", "--check"]).arg(dir.path()).output().expect("runs");
    assert_eq!(drift.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&drift.stderr);
    assert!(stderr.contains("sandboxconfigs.basecamp.dev.yaml differs") && stderr.contains("make crds"), "{stderr}");
    assert!(!stderr.contains("harnesstasks"), "only the drifting file is named: {stderr}");
}

#[test]
fn run_documents_its_flags_and_their_environment_variables() {
    let out = operator().args(["run", "--help"]).output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--namespaces",
        "BASECAMP_WATCH_NAMESPACES",
        "--metrics-addr",
        "0.0.0.0:8080",
        "--leader-elect",
        "--lease-namespace",
        "POD_NAMESPACE",
        "--sandbox-image",
        "BASECAMP_SANDBOX_IMAGE",
        "--log-format",
        "--s3-endpoint",
        "--s3-secret",
        "--checkpoint-poll-seconds",
        "BASECAMP_CHECKPOINT_POLL_SECONDS",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn run_without_a_cluster_says_so_and_exits_1() {
    let home = tempfile::tempdir().expect("tmp");
    let out = operator()
        .args(["run", "--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", home.path().join("missing-kubeconfig"))
        .env("HOME", home.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach the Kubernetes API"), "{stderr}");
}
