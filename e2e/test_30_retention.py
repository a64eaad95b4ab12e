"""Deleting tasks: trace retention and garbage collection.

Two one-shard tasks from examples/ecommerce with the example's own success
criteria (variant a misses `memory_consistency >= 0.95`, so each ends
Failed/CriteriaNotMet with the observed value in the message): `keep`
(`retention: Retain`) and `drop` (`retention: Delete`). After they finish,
both are deleted: `drop`'s S3 prefixes (its shard traces and its reports)
are gone, `keep`'s are all still there, and the Jobs, ConfigMaps and pods
of both are garbage-collected through their owner references.
"""

from __future__ import annotations

import pytest

from conftest import delete_tasks, ecommerce_manifests
from kube import Kube, condition, s3_keys, wait_until

TASKS = {"keep": "Retain", "drop": "Delete"}


def task_keys(s3, bucket: str, ns: str, name: str) -> list[str]:
    return [k for k in s3_keys(s3, bucket, "traces/") if f"/{ns}/{name}/" in k]


@pytest.fixture(scope="module")
def finished(kube: Kube, operator, task_ns: str, bucket: str, player, s3) -> dict:
    delete_tasks(kube, task_ns, list(TASKS))
    docs = []
    for name, retention in TASKS.items():
        docs += ecommerce_manifests(name, bucket, retention=retention, shards=1, variants=("a",))
    kube.apply(docs, "-n", task_ns)
    for name in TASKS:
        played = player.play_all(task_ns, f"basecamp.dev/task={name}", expect=1, timeout=180)
        assert played[0].exit_code == 0, played[0].log.read_text()[-2000:]
    out = {}
    for name in TASKS:
        t = wait_until(f"{name} to finish", lambda n=name: (lambda t: t if (t.get("status") or {}).get("phase") in
                       ("Succeeded", "Failed") else None)(kube.json("harnesstask", n, "-n", task_ns)), timeout=120)
        wait_until(f"{name}'s index.json", lambda n=name: any(
            k.endswith(f"reports/{task_ns}/{n}/index.json") for k in task_keys(s3, bucket, task_ns, n)), timeout=60)
        owned = {
            kind: kube.items(kind, "-n", task_ns, "-l", f"basecamp.dev/task={name}")
            for kind in ("jobs", "configmaps", "pods")
        }
        out[name] = {"task": t, "keys": task_keys(s3, bucket, task_ns, name), "owned": owned}
    return out


def test_criteria_not_met_fails_the_task_naming_the_value(finished):
    for name in TASKS:
        t = finished[name]["task"]
        assert t["status"]["phase"] == "Failed", t["status"]
        failed = condition(t, "Failed")
        assert failed["reason"] == "CriteriaNotMet" and "memory_consistency >= 0.95" in failed["message"], failed
        assert "observed 0." in failed["message"], failed


def test_objects_are_owned_by_the_task(finished):
    for name in TASKS:
        uid = finished[name]["task"]["metadata"]["uid"]
        owned = finished[name]["owned"]
        assert len(owned["jobs"]) == 1 and len(owned["configmaps"]) == 1, {k: len(v) for k, v in owned.items()}
        for kind in ("jobs", "configmaps"):
            for obj in owned[kind]:
                refs = obj["metadata"].get("ownerReferences") or []
                assert any(r["uid"] == uid and r.get("controller") for r in refs), (kind, refs)
        # Traces of the shard, its summary, and the reports.
        keys = finished[name]["keys"]
        assert any(k.endswith("summary.json") for k in keys) and any(k.endswith(".trace") for k in keys), keys[:5]


def test_delete_removes_or_keeps_traces_and_collects_objects(kube: Kube, finished, task_ns: str, s3, bucket: str):
    kube.run("delete", "harnesstask", *TASKS, "-n", task_ns, "--wait=true", "--timeout=60s", timeout=70)
    assert task_keys(s3, bucket, task_ns, "drop") == [], "retention Delete left objects in S3"
    kept = task_keys(s3, bucket, task_ns, "keep")
    assert sorted(kept) == sorted(finished["keep"]["keys"]), "retention Retain lost objects"
    print(f"keep: {len(kept)} objects kept; drop: {len(finished['drop']['keys'])} objects deleted")
    for name in TASKS:
        for kind in ("jobs", "configmaps", "pods"):
            wait_until(f"{name}'s {kind} garbage-collected", lambda n=name, k=kind: not kube.items(
                k, "-n", task_ns, "-l", f"basecamp.dev/task={n}"), timeout=90)
    uids = {finished[n]["task"]["metadata"]["uid"] for n in TASKS}
    events = [e for e in kube.items("events", "-n", task_ns) if e["involvedObject"].get("uid") in uids]
    print("events:", sorted({(e["involvedObject"]["name"], e["reason"]) for e in events}))
