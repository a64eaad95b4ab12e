"""Broken manifests are refused with a clear message: by the API server
(schema, strict field validation, the CRDs' CEL rules) before anything is
stored, or, for what only Basecamp can judge, by the operator in the task's
status conditions and a Warning Event — never a crash loop."""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import delete_tasks
from kube import ROOT, Kube, condition, wait_until

BROKEN = ROOT / "examples/manifests/broken/shipping-broken.yaml"


def broken_docs() -> list[dict]:
    return list(yaml.safe_load_all(BROKEN.read_text()))


def rejected(kube: Kube, docs: list[dict], ns: str) -> str:
    r = kube.apply(docs, "-n", ns, "--dry-run=server", check=False)
    assert r.rc != 0, f"the API server accepted it:\n{yaml.safe_dump_all(docs)}"
    return r.err


def test_api_server_rejects_the_broken_example(kube: Kube, task_ns: str):
    kube.run("delete", "sandboxconfig", "shipping-tools", "-n", task_ns, "--ignore-not-found")
    r = kube.run("apply", "-n", task_ns, "-f", str(BROKEN), check=False)
    print(r.err)
    assert r.rc != 0
    assert 'unknown field "spec.planStepTimout"' in r.err, r.err
    assert "spec.shards" in r.err and "greater than or equal to 1" in r.err, r.err
    assert kube.get("harnesstask", "shipping-broken", "-n", task_ns) is None
    assert kube.get("sandboxconfig", "shipping-tools", "-n", task_ns) is None


def task_of(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "HarnessTask")


CEL_CASES = {
    "sandboxRef and variants": (
        lambda t: t["spec"].update(variants=[{"name": "a", "sandboxRef": {"name": "shipping-tools"}}]),
        "set exactly one of spec.sandboxRef (one sandbox) and spec.variants (an A/B test)",
    ),
    "neither sandboxRef nor variants": (
        lambda t: t["spec"].pop("sandboxRef"),
        "set exactly one of spec.sandboxRef (one sandbox) and spec.variants (an A/B test)",
    ),
    "duplicate variant names": (
        lambda t: (t["spec"].pop("sandboxRef"), t["spec"].update(variants=[
            {"name": "a", "sandboxRef": {"name": "sb-one"}}, {"name": "a", "sandboxRef": {"name": "sb-two"}}])),
        "variant names must be unique",
    ),
    "three variants": (
        lambda t: (t["spec"].pop("sandboxRef"), t["spec"].update(variants=[
            {"name": n, "sandboxRef": {"name": "sb-one"}} for n in ("a", "b", "c")])),
        "spec.variants: Too many: 3: must have at most 2 items",
    ),
    # Stored before, then unreadable as the u32 it is: the operator's watch of every task failed.
    "a count beyond its type": (
        lambda t: t["spec"].update(parallelism=5_000_000_000),
        "spec.parallelism in body should be less than or equal to",
    ),
    # Refused by the Job API (maxFailedIndexes) after it was stored: the task had no status.
    "more shards than an Indexed Job takes": (
        lambda t: t["spec"].update(shards=100_001),
        "spec.shards in body should be less than or equal to 100000",
    ),
    # Read by the operator as the API unreachable.
    "an empty sandbox name": (
        lambda t: t["spec"]["sandboxRef"].update(name=""),
        "spec.sandboxRef.name in body should be at least 1 chars long",
    ),
}


@pytest.mark.parametrize("case", list(CEL_CASES))
def test_cel_rules_reject(kube: Kube, task_ns: str, case: str):
    mutate, message = CEL_CASES[case]
    task = copy.deepcopy(task_of(broken_docs()))
    task["spec"]["shards"] = 1
    mutate(task)
    err = rejected(kube, [task], task_ns)
    print(f"{case}: {err.strip()}")
    assert message in err, err


def test_parallelism_above_shards_is_stored(kube: Kube, task_ns: str):
    """More pods allowed at once than there are shards is harmless (the Job
    runs them all): the API server stores it, and `basecamp harness validate`
    says so with a warning, not an error, as the operator does."""
    task = copy.deepcopy(task_of(broken_docs()))
    task["spec"].update(shards=2, parallelism=3)
    r = kube.apply([task], "-n", task_ns, "--dry-run=server", check=False)
    assert r.rc == 0, r.err


@pytest.fixture(scope="module")
def semantically_broken(kube: Kube, operator, task_ns: str) -> dict:
    """The broken example with the two schema errors fixed: the API server
    stores it, the operator must refuse it."""
    docs = broken_docs()
    sandbox = next(d for d in docs if d["kind"] == "SandboxConfig")
    sandbox["spec"]["planStepTimeout"] = sandbox["spec"].pop("planStepTimout")
    task_of(docs)["spec"]["shards"] = 1
    delete_tasks(kube, task_ns, ["shipping-broken"])
    kube.apply(docs, "-n", task_ns)

    def failed():
        t = kube.json("harnesstask", "shipping-broken", "-n", task_ns)
        return t if (t.get("status") or {}).get("phase") == "Failed" else None

    return wait_until("shipping-broken Failed", failed, timeout=60)


def test_operator_refuses_what_the_api_server_cannot_judge(kube: Kube, semantically_broken, task_ns: str):
    t = semantically_broken
    ready = condition(t, "Ready")
    print("Ready:", ready["reason"], ready["message"])
    assert ready["status"] == "False"
    message = ready["message"]
    for expected in ("versionId", "90 seconds", "track_ordr"):
        assert expected in message, f"{expected!r} not in {message!r}"
    assert t["status"]["observedGeneration"] == t["metadata"]["generation"]
    assert not kube.items("jobs", "-n", task_ns, "-l", "basecamp.dev/task=shipping-broken"), "a Job for an invalid task"
    uid = t["metadata"]["uid"]
    warnings = wait_until("a Warning Event", lambda: [
        e for e in kube.events(task_ns, "shipping-broken")
        if e["involvedObject"].get("uid") == uid and e["type"] == "Warning"], timeout=30)
    assert any("track_ordr" in (e.get("message") or "") for e in warnings), [e.get("message") for e in warnings]
    kube.run("delete", "harnesstask", "shipping-broken", "-n", task_ns, "--wait=true", "--timeout=60s", timeout=70)
    kube.run("delete", "sandboxconfig", "shipping-tools", "-n", task_ns)
