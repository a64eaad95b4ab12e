"""The e-commerce A/B test on the cluster, GPU-scheduled.

Three HarnessTasks derived from examples/ecommerce (test set and traces on
S3), applied at once:

* `ab80`: both variants' SandboxConfigs ask `gpu: {required: false,
  minComputeCapability: "8.0", count: 1}`. Every pod must land on an A100
  or H100 node; played with the real basecamp-sandbox (which, finding no GPU
  on this machine, falls back to the CPU with a warning, as `required:
  false` allows), the task must succeed with per-variant shard counts,
  metrics, criteria, observedGeneration, Events, index.json and
  comparison.json in S3, and gauges for both variants on /metrics.
* `strict80`: `required: true`, >= 8.0. Scheduled on A100/H100 like the
  first; but this machine has no GPU, so the real binary refuses (exit 1),
  the pod failure policy fails the index at once and the task fails with the
  sandbox's reason: the "node lied" path, end to end.
* `need95`: `required: true`, >= 9.5. No node qualifies: the task's Degraded
  condition says so, naming what exists, and its pods stay Pending.
* `need16`: >= 8.0 but 16 GPUs a pod, on nodes of 8: Degraded the same way
  (the count is checked against each node's allocatable GPUs).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import delete_tasks, ecommerce_manifests, timed
from kube import E2EError, Kube, condition, s3_json, s3_keys, wait_until

TEST_SET_ROWS = 60
# The example's criteria, with memory consistency lowered to 0.8 so that both
# variants meet them and the task Succeeds (a's null fallback still shows as
# the lower value; test_30 keeps the example's 0.95 and expects CriteriaNotMet).
CRITERIA = ["tool_call_accuracy >= 0.9", "memory_consistency >= 0.8", "avg_resolution_time < 5s"]
SEL = "basecamp.dev/task={}"


def gpu(required: bool, cc: str) -> dict:
    return {"required": required, "minComputeCapability": cc, "count": 1}


@pytest.fixture(scope="module")
def applied(kube: Kube, operator, task_ns: str, bucket: str) -> dict:
    delete_tasks(kube, task_ns, ["ab80", "strict80", "need95", "need16"])
    docs = (
        ecommerce_manifests("ab80", bucket, gpu=gpu(False, "8.0"), criteria=CRITERIA)
        + ecommerce_manifests("strict80", bucket, gpu=gpu(True, "8.0"), shards=1, variants=("b",))
        + ecommerce_manifests("need95", bucket, gpu=gpu(True, "9.5"), shards=1, variants=("b",))
        + ecommerce_manifests("need16", bucket, gpu={**gpu(True, "8.0"), "count": 16}, shards=1, variants=("b",))
    )
    kube.apply(docs, "-n", task_ns)
    return {"ns": task_ns}


def node_cc(kube: Kube, node: str) -> tuple[int, int, str]:
    labels = kube.json("node", node)["metadata"]["labels"]
    return (int(labels.get("nvidia.com/gpu.compute.major", -1)), int(labels.get("nvidia.com/gpu.compute.minor", -1)),
            labels.get("nvidia.com/gpu.product", "no GPU"))


def scheduled_pods(kube: Kube, ns: str, task: str, count: int) -> list[dict]:
    def probe():
        pods = kube.items("pods", "-n", ns, "-l", SEL.format(task))
        return pods if len(pods) >= count and all(p["spec"].get("nodeName") for p in pods) else None

    return wait_until(f"{count} scheduled pods of {task}", probe, timeout=120)


def task(kube: Kube, ns: str, name: str) -> dict:
    return kube.json("harnesstask", name, "-n", ns)


def test_pods_land_only_on_nodes_with_compute_capability_8_0(kube: Kube, applied):
    ns = applied["ns"]
    for name, count in (("ab80", 4), ("strict80", 1)):
        pods = scheduled_pods(kube, ns, name, count)
        placed = []
        for pod in pods:
            major, minor, product = node_cc(kube, pod["spec"]["nodeName"])
            placed.append(f"{pod['metadata']['name']} -> {pod['spec']['nodeName']} ({product} {major}.{minor})")
            assert (major, minor) >= (8, 0), f"{name}: pod below compute capability 8.0: {placed[-1]}"
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits.get("nvidia.com/gpu") == "1", limits
        print(f"{name}:", *placed, sep="\n  ")


def no_capacity(kube: Kube, ns: str, name: str) -> dict:
    """The task's Degraded=True InsufficientGpuCapacity condition, once it has one."""
    def degraded():
        c = condition(task(kube, ns, name), "Degraded")
        return c if c and c["status"] == "True" and c["reason"] == "InsufficientGpuCapacity" else None

    c = wait_until(f"{name} Degraded=True InsufficientGpuCapacity", degraded, timeout=60)
    print(f"{name} Degraded:", c["message"])
    return c


def test_task_asking_9_5_gets_the_no_capacity_condition(kube: Kube, applied):
    ns = applied["ns"]
    c = no_capacity(kube, ns, "need95")
    assert "0 of 8 GPU nodes satisfy compute capability >= 9.5" in c["message"], c["message"]
    for product in ("A100", "H100", "V100", "T4"):
        assert product in c["message"], f"the message should name what exists ({product}): {c['message']}"
    # Its pod exists and stays Pending, unscheduled.
    pods = wait_until("need95's pod", lambda: kube.items("pods", "-n", ns, "-l", SEL.format("need95")), timeout=60)
    assert all(p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName") for p in pods)
    events = kube.events(ns, "need95")
    assert any(e["reason"] == "InsufficientGpuCapacity" for e in events), [e["reason"] for e in events]


def test_task_asking_16_gpus_a_pod_gets_the_no_capacity_condition(kube: Kube, applied):
    c = no_capacity(kube, applied["ns"], "need16")
    assert "0 of 8 GPU nodes satisfy compute capability >= 8.0, 16 GPUs per pod" in c["message"], c["message"]
    assert "8 GPUs allocatable" in c["message"], c["message"]


def test_play_ab80_and_strict80(kube: Kube, applied, player):
    ns = applied["ns"]
    with timed("playing ab80 (4 shards)"):
        played = player.play_all(ns, SEL.format("ab80"), expect=4, timeout=300)
    for p in played:
        print(f"  {p.pod} index {p.index}: exit {p.exit_code} in {p.seconds:.1f}s")
    assert all(p.exit_code == 0 for p in played), [(p.pod, p.exit_code, p.log.read_text()[-2000:]) for p in played]
    log = played[0].log.read_text()
    assert "falling back to CPU" in log, log[-2000:]
    strict = player.play_all(ns, SEL.format("strict80"), expect=1, timeout=120)
    assert strict[0].exit_code == 1, strict[0].log.read_text()[-2000:]
    assert "GPU" in strict[0].log.read_text()


def test_ab80_succeeds_with_full_status(kube: Kube, applied):
    ns = applied["ns"]

    def done():
        t = task(kube, ns, "ab80")
        return t if (t.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    t = wait_until("ab80 to finish", done, timeout=180)
    st = t["status"]
    print(json.dumps({k: st.get(k) for k in ("phase", "shards", "metrics", "criteria", "accuracy")}, indent=1))
    assert st["phase"] == "Succeeded", st
    assert st["observedGeneration"] == t["metadata"]["generation"]
    for v in ("a", "b"):
        assert st["shards"][v] == {"total": 2, "succeeded": 2, "failed": 0, "running": 0}, st["shards"]
        for metric in ("tool_call_accuracy", "plan_step_f1", "memory_consistency"):
            assert metric in st["metrics"][v], (v, st["metrics"][v])
        assert sorted(st["aggregatedShards"][v]) == [0, 1]
    assert st["shardsSummary"] == "4/4"
    criteria = {(c["variant"], c["criterion"]): c for c in st["criteria"]}
    assert len(criteria) == 6, criteria
    assert all(c["met"] for c in st["criteria"]), st["criteria"]
    # Variant a's fallback writes null into memory; b fixes it.
    a, b = (criteria[(v, "memory_consistency >= 0.8")]["observed"] for v in ("a", "b"))
    assert a < b == 1.0, (a, b)
    assert st["deltas"]["memory_consistency"] > 0
    ready = condition(t, "Ready")
    assert ready and ready["status"] == "True"
    succeeded = condition(t, "Succeeded")
    assert succeeded and succeeded["status"] == "True" and succeeded["observedGeneration"] == t["metadata"]["generation"]


def test_ab80_events(kube: Kube, applied):
    uid = task(kube, applied["ns"], "ab80")["metadata"]["uid"]

    def mine():
        return [e for e in kube.events(applied["ns"], "ab80") if e["involvedObject"].get("uid") == uid]

    wait_until("the CriteriaMet Event of ab80", lambda: any(e["reason"] == "CriteriaMet" for e in mine()), timeout=30)
    events = mine()
    reasons = [e["reason"] for e in events]
    print("ab80 events:", *(f"{e['type']} {e['reason']}: {e.get('message') or e.get('note')}" for e in events),
          sep="\n  ")
    assert events, "no Events for ab80"
    assert all(e["source"].get("component") or e.get("reportingComponent") for e in events)
    assert "CriteriaMet" in reasons, reasons
    warnings = [f"{e['reason']}: {e.get('message')}" for e in events if e["type"] == "Warning"]
    assert not warnings, warnings


def test_ab80_index_and_comparison_in_s3(s3, bucket: str, applied):
    prefix = f"traces/reports/{applied['ns']}/ab80/"
    keys = wait_until("index.json and comparison.json", lambda: (
        lambda k: k if {prefix + "index.json", prefix + "comparison.json"} <= set(k) else None)(
        s3_keys(s3, bucket, prefix)), timeout=60)
    print("report keys:", keys)
    index = s3_json(s3, bucket, prefix + "index.json")
    rows = index if isinstance(index, list) else index.get("rows") or index.get("episodes")
    assert len(rows) == 2 * TEST_SET_ROWS, len(rows)
    pairs = {(r["variant"], r["id"]) for r in rows}
    assert len(pairs) == 2 * TEST_SET_ROWS, "an episode is counted twice"
    trace_keys = [r["trace"] for r in rows if r.get("trace")] or [r.get("trace_key") for r in rows]
    assert all(trace_keys), rows[0]
    # Every trace an index row points to exists in S3.
    all_keys = set(s3_keys(s3, bucket, "traces/"))
    missing = [k for k in trace_keys if k.removeprefix(f"s3://{bucket}/") not in all_keys]
    assert not missing, missing[:5]
    comparison = s3_json(s3, bucket, prefix + "comparison.json")
    assert "memory_consistency" in json.dumps(comparison)


def test_operator_metrics_for_both_variants(operator, applied):
    text = operator.metrics()
    for v in ("a", "b"):
        pattern = rf'^basecamp_task_tool_call_accuracy\{{[^}}]*task="ab80"[^}}]*variant="{v}"[^}}]*\}} ([0-9.e+-]+)$'
        m = re.search(pattern, text, re.M)
        if m is None:  # label order may differ
            m = re.search(rf'^basecamp_task_tool_call_accuracy\{{(?=[^}}]*task="ab80")(?=[^}}]*variant="{v}")[^}}]*\}} (\S+)$',
                          text, re.M)
        assert m, f"no basecamp_task_tool_call_accuracy for ab80/{v}:\n" + "\n".join(
            l for l in text.splitlines() if "tool_call_accuracy" in l)
        assert 0.0 <= float(m.group(1)) <= 1.0


def test_strict80_fails_with_the_sandbox_gpu_refusal(kube: Kube, applied):
    ns = applied["ns"]

    def failed():
        t = task(kube, ns, "strict80")
        return t if (t.get("status") or {}).get("phase") == "Failed" else None

    try:
        t = wait_until("strict80 Failed", failed, timeout=120)
    except E2EError:
        raise E2EError(f"strict80 did not fail: {json.dumps(task(kube, ns, 'strict80').get('status'), indent=1)}")
    st = t["status"]
    print(json.dumps({k: st.get(k) for k in ("phase", "shards", "conditions")}, indent=1))
    assert st["shards"]["b"]["failed"] == 1, st["shards"]
    # The condition quotes the sandbox's own last error line (its pod's
    # termination message), so nobody has to find the pod to learn why.
    failed_condition = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed_condition["reason"] == "ShardsFailed", failed_condition
    assert failed_condition["message"].startswith(
        "1 of 1 shards failed; the last: variant b, shard 0: the sandbox exited with code 1: error ["), \
        failed_condition
    assert "GPU" in failed_condition["message"], failed_condition
    job = kube.items("jobs", "-n", ns, "-l", SEL.format("strict80"))[0]
    assert job["status"].get("failed", 0) == 1, job["status"]  # FailIndex on exit 1: no retry


def apply_counts(operator) -> dict[tuple[str, str], float]:
    return {(m.group(1), m.group(2)): float(m.group(3)) for m in re.finditer(
        r'^basecamp_applies_total\{kind="([^"]+)",result="([^"]+)"\} (\S+)$', operator.metrics(), re.M)}


def test_a_settled_task_is_reconciled_from_the_caches_without_a_write(kube: Kube, operator, applied):
    """The operator's watches keep copies of its objects: a reconcile with
    nothing to change (here woken by an annotation on the task) finds each
    applied object up to date and sends nothing. This is what the real API
    server returns for the objects, defaults and all, not a mock's echo."""
    ns = applied["ns"]

    def settled():
        # Run alone, this test can start while the fixture's tasks are still being created.
        for name in ("ab80", "strict80", "need95"):
            t = task(kube, ns, name)
            if t.get("status", {}).get("observedGeneration") != t["metadata"]["generation"]:
                return None
        counts = apply_counts(operator)
        time.sleep(1.0)
        return counts if apply_counts(operator) == counts else None

    before = wait_until("the fixture's tasks to settle", settled, timeout=60)
    pokes = 3
    for i in range(pokes):
        kube.run("annotate", "harnesstask", "need95", "-n", ns, f"e2e.basecamp.dev/poke={i}", "--overwrite")
        wait_until(f"reconcile {i + 1} of need95", lambda: apply_counts(operator).get(("NetworkPolicy", "unchanged"), 0)
                   >= before.get(("NetworkPolicy", "unchanged"), 0) + i + 1, timeout=30)
    after = apply_counts(operator)
    print(json.dumps({f"{k}/{r}": [before.get((k, r), 0), v] for (k, r), v in sorted(after.items())}, indent=1))
    for kind in ("ConfigMap", "NetworkPolicy", "Job"):
        assert after.get((kind, "unchanged"), 0) >= before.get((kind, "unchanged"), 0) + pokes, kind
        assert after.get((kind, "applied"), 0) == before.get((kind, "applied"), 0), f"{kind} applied again"


def test_a_finished_job_removed_by_its_ttl_reruns_only_for_a_changed_template(kube: Kube, applied):
    """A finished Job is removed by its TTL (deleted here by hand, as the TTL
    controller does) and the task's status keeps its result. An edit that
    leaves the variant's pod template as it was (the success criteria) runs
    no shard again; one that changes it (the shard count) does. Last in this
    file: it leaves strict80 running, and deletes it."""
    ns = applied["ns"]
    sel = SEL.format("strict80")
    wait_until("strict80 Failed", lambda: task(kube, ns, "strict80").get("status", {}).get("phase") == "Failed",
               timeout=120)
    try:
        kube.run("delete", "jobs", "-n", ns, "-l", sel, "--wait=true", "--timeout=60s", timeout=70)

        def caught_up(generation: int):
            t = task(kube, ns, "strict80")
            return t if t.get("status", {}).get("observedGeneration") == generation else None

        patch = {"spec": {"taskDefinition": {"successCriteria": ["tool_call_accuracy >= 0.5"]}}}
        kube.run("patch", "harnesstask", "strict80", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        generation = task(kube, ns, "strict80")["metadata"]["generation"]
        t = wait_until("strict80's status for the criteria edit", lambda: caught_up(generation), timeout=60)
        time.sleep(2.0)  # a Job created by that reconcile is in the API by now
        assert kube.items("jobs", "-n", ns, "-l", sel) == [], "a criteria edit ran the finished shards again"
        st = t["status"]
        assert st["phase"] == "Failed" and st["shards"]["b"]["failed"] == 1, st
        assert st["jobTemplates"].get("b"), st

        kube.run("patch", "harnesstask", "strict80", "-n", ns, "--type=merge", "-p", '{"spec": {"shards": 2}}')
        jobs = wait_until("strict80's Job for 2 shards",
                          lambda: [j for j in kube.items("jobs", "-n", ns, "-l", sel)
                                   if j["spec"].get("completions") == 2], timeout=60)
        assert jobs[0]["metadata"]["annotations"]["basecamp.dev/template-hash"] != st["jobTemplates"]["b"]
    finally:
        delete_tasks(kube, ns, ["strict80"])
