"""Nothing lost, nothing counted twice, across an operator crash and a
kube-apiserver restart.

An A/B task of 2 x 2 shards runs while:
  1. shard a/0 finishes, and the operator is killed (SIGKILL) at once;
  2. shard a/1 finishes while no operator runs;
  3. the operator starts again (a fresh process, same ServiceAccount);
  4. kube-apiserver is stopped and started again with the same command line
     (etcd keeps the state), while the operator is watching; down longer than
     the Lease renew deadline, the operator exits on purpose and is started
     again, as the kubelet would;
  5. shards b/0 and b/1 finish.
The task must Succeed with index.json holding exactly one row per test-set
episode and variant, and the operator must still be running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from conftest import delete_tasks, ecommerce_manifests
from kube import E2EError, Kube, s3_json, wait_until
from test_20_gpu_ab import CRITERIA, TEST_SET_ROWS

NAME = "resilient"


def restart_apiserver() -> float:
    """Stops kube-apiserver (SIGTERM, then waits) and starts it again with
    its exact command line, log appended, pid file updated for down.sh.
    Returns the seconds the API was down."""
    cluster = Path(os.environ["BASECAMP_E2E_DIR"])
    pid_file = cluster / "pids/kube-apiserver"
    pid = int(pid_file.read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    environ = dict(
        line.split(b"=", 1) for line in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in line)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    # Graceful shutdown may wait up to a minute for open watches; give it 20 s.
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
        time.sleep(1)
    log = open(cluster / "logs/kube-apiserver.log", "ab")
    proc = subprocess.Popen(argv, env=environ, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    pid_file.write_text(f"{proc.pid}\n")
    ca = os.environ["BASECAMP_E2E_CA"]
    url = os.environ["BASECAMP_E2E_API_SERVER"] + "/readyz"

    def ready():
        if proc.poll() is not None:
            raise E2EError(f"kube-apiserver exited with {proc.returncode} on restart")
        try:
            return requests.get(url, verify=ca, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_until("kube-apiserver /readyz after its restart", ready, timeout=120)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def resilient(kube: Kube, operator, task_ns: str, bucket: str) -> str:
    delete_tasks(kube, task_ns, [NAME])
    kube.apply(ecommerce_manifests(NAME, bucket, criteria=CRITERIA), "-n", task_ns)
    return task_ns


def pod_of(kube: Kube, ns: str, variant: str, index: int) -> dict:
    sel = f"basecamp.dev/task={NAME},basecamp.dev/variant={variant},batch.kubernetes.io/job-completion-index={index}"
    return wait_until(f"pod {variant}/{index} Running", lambda: [
        p for p in kube.items("pods", "-n", ns, "-l", sel) if p["status"].get("phase") == "Running"], timeout=90)[0]


def test_operator_crash_and_apiserver_restart_lose_nothing(kube: Kube, resilient, operator, player, s3, bucket):
    ns = resilient
    first = player.play(pod_of(kube, ns, "a", 0))
    assert first.exit_code == 0, first.log.read_text()[-2000:]
    code = operator.stop(signal.SIGKILL)
    print(f"operator killed (exit {code}) right after shard a/0 finished")
    second = player.play(pod_of(kube, ns, "a", 1))
    assert second.exit_code == 0
    operator.start()
    print(f"operator restarted (start #{operator.starts})")

    def a_counted():
        st = kube.json("harnesstask", NAME, "-n", ns).get("status") or {}
        return sorted((st.get("aggregatedShards") or {}).get("a", [])) == [0, 1]

    wait_until("the restarted operator to count a/0 and a/1", a_counted, timeout=90)
    down = restart_apiserver()
    print(f"kube-apiserver restarted, down {down:.1f}s")
    # Down longer than the Lease's 15 s renew deadline, the operator exits on
    # purpose (a fresh start campaigns again); the kubelet would restart it.
    time.sleep(1)
    if operator.proc.poll() is not None:
        assert "lost leadership" in operator.log(), operator.log()[-2000:]
        print(f"operator exited (code {operator.proc.returncode}, lost leadership); restarting it as the kubelet would")
        operator.start()
    for index in (0, 1):
        played = player.play(pod_of(kube, ns, "b", index))
        assert played.exit_code == 0

    def done():
        t = kube.json("harnesstask", NAME, "-n", ns)
        return t if (t.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    t = wait_until(f"{NAME} to finish", done, timeout=180)
    st = t["status"]
    assert st["phase"] == "Succeeded", st
    assert {v: sorted(s) for v, s in st["aggregatedShards"].items()} == {"a": [0, 1], "b": [0, 1]}
    for v in ("a", "b"):
        assert st["shards"][v] == {"total": 2, "succeeded": 2, "failed": 0, "running": 0}, st["shards"]
    rows = s3_json(s3, bucket, f"traces/reports/{ns}/{NAME}/index.json")
    rows = rows if isinstance(rows, list) else rows.get("rows") or rows.get("episodes")
    per_variant = {v: sorted(r["id"] for r in rows if r["variant"] == v) for v in ("a", "b")}
    for v, ids in per_variant.items():
        assert len(ids) == TEST_SET_ROWS and len(set(ids)) == TEST_SET_ROWS, (v, len(ids), len(set(ids)))
    assert operator.ready(), "the operator died across the kube-apiserver restart"
    text = operator.metrics()
    assert f'task="{NAME}"' in text
    kube.run("delete", "harnesstask", NAME, "-n", ns, "--wait=true", "--timeout=60s", timeout=70)
