"""The chart installs with helm, and its ServiceAccount can do exactly what
operator/RBAC.md lists — asked of the API server's own authorizer
(`kubectl auth can-i --as=system:serviceaccount:...`) — and not more."""

from conftest import RELEASE_NS, SA, TASK_NS
from kube import Kube

USER = f"system:serviceaccount:{RELEASE_NS}:{SA}"

# (verb, resource, namespace or None for all namespaces / cluster scope), from operator/RBAC.md.
ALLOWED = [
    *[(v, "harnesstasks.basecamp.dev", None) for v in ("get", "list", "watch", "patch", "update")],
    *[(v, "harnesstasks.basecamp.dev/status", None) for v in ("get", "patch", "update")],
    ("update", "harnesstasks.basecamp.dev/finalizers", None),
    *[(v, "sandboxconfigs.basecamp.dev", None) for v in ("get", "list", "watch")],
    *[(v, "jobs.batch", None) for v in ("get", "list", "watch", "create", "patch", "delete")],
    *[(v, "pods", None) for v in ("get", "list")],  # read-only: the trainer pod's termination message
    *[(v, "services", None) for v in ("get", "list", "watch")],  # read-only: the Service an endpoint names (egress rule)
    *[(v, "configmaps", None) for v in ("get", "list", "watch", "create", "patch", "delete")],
    *[(v, "networkpolicies.networking.k8s.io", None) for v in ("get", "list", "watch", "create", "patch", "delete")],
    *[(v, "events.events.k8s.io", None) for v in ("create", "patch")],
    *[(v, "leases.coordination.k8s.io", RELEASE_NS) for v in ("get", "create", "update")],
    *[(v, "nodes", None) for v in ("get", "list", "watch")],
]

DENIED = [
    ("delete", "nodes", None),
    ("patch", "nodes", None),
    ("get", "secrets", None),
    ("list", "secrets", None),
    ("get", "secrets", RELEASE_NS),
    ("get", "secrets", TASK_NS),
    ("create", "pods/exec", TASK_NS),
    ("create", "pods", TASK_NS),
    ("delete", "pods", None),
    ("watch", "pods", None),
    ("patch", "pods", None),
    ("create", "pods/exec", None),
    ("get", "pods/log", TASK_NS),
    ("patch", "services", None),
    ("create", "services", TASK_NS),
    ("create", "harnesstasks.basecamp.dev", None),
    ("delete", "harnesstasks.basecamp.dev", None),
    ("create", "sandboxconfigs.basecamp.dev", None),
    ("update", "jobs.batch", None),
    ("delete", "namespaces", None),
    ("create", "leases.coordination.k8s.io", TASK_NS),
    ("delete", "leases.coordination.k8s.io", RELEASE_NS),
    ("create", "serviceaccounts/token", RELEASE_NS),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", None),
    ("impersonate", "users", None),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("*", "*", None),
]


def test_helm_install_creates_the_operator(kube: Kube, chart):
    dep = chart["deployment"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == SA
    assert kube.get("crd", "harnesstasks.basecamp.dev") is not None
    assert kube.get("crd", "sandboxconfigs.basecamp.dev") is not None
    assert kube.get("serviceaccount", SA, "-n", RELEASE_NS) is not None
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--s3-secret=basecamp-s3" in args and "--leader-elect" in args, args


def test_service_account_can_do_what_rbac_md_lists(kube: Kube, chart):
    missing = [f"{v} {r} ({ns or 'all'})" for v, r, ns in ALLOWED if not kube.can_i(v, r, USER, ns)]
    assert not missing, f"{USER} lacks: {missing}"


def test_service_account_cannot_do_more(kube: Kube, chart):
    extra = [f"{v} {r} ({ns or 'all'})" for v, r, ns in DENIED if kube.can_i(v, r, USER, ns)]
    assert not extra, f"{USER} may also: {extra}"


def test_operator_runs_as_the_service_account(operator):
    # The token kubeconfig really authenticates as the SA: the SA can list
    # nodes but not secrets, through the same kubeconfig the operator uses.
    sa = Kube(operator.kubeconfig)
    assert sa.run("get", "nodes", "-o", "name").out.count("node/") == 9
    denied = sa.run("get", "secrets", "-n", RELEASE_NS, check=False)
    assert denied.rc != 0 and "forbidden" in denied.err.lower(), denied.err
    assert "basecamp_" in operator.metrics()
