"""Every query of the chart's Grafana dashboards returns data from a real
Prometheus that scraped, during this run, the real operator (started with
the operator fixture, 1 s scrape interval) and real sandbox pods (this
module plays one task's pod inside `Player.scraped`, which registers it for
Prometheus with the labels the chart's PodMonitor gives). Template variables
are set to match everything (`.*`), `$__rate_interval` to 10 minutes, and a
variable's `label_values(...)` is asked over the last hour, as Grafana asks.
Error counters that only exist once an error happened may be empty.

The module's own task (`dash`, variant a of examples/ecommerce: timeouts,
429s and fallbacks; plus an injection after every `track_order`) gives
every dashboard data, so it runs alone too (`scripts/e2e.sh -k dashboards`).
A rate needs two scrapes of a series, so empty queries are asked again for
up to 20 s before they count as empty.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import delete_tasks, ecommerce_manifests
from kube import ROOT, E2EError, Kube, wait_until

DASHBOARDS = ["basecamp-evaluation.json", "basecamp-operator.json", "basecamp-sandbox.json"]
# Series that exist only after an event of their kind (none, no series).
ERROR_ONLY = ("basecamp_s3_operation_errors_total", "basecamp_reconcile_errors_total",
              "basecamp_sandbox_policy_errors_total")
TASK = "dash"


@pytest.fixture(scope="module")
def dash(kube: Kube, operator, prometheus, task_ns: str, bucket: str, player) -> str:
    """One finished task whose sandbox pod Prometheus scraped."""
    if prometheus is None:
        pytest.skip("prometheus is not installed (scripts/chart-tools.sh install promtool)")
    delete_tasks(kube, task_ns, [TASK])
    docs = ecommerce_manifests(TASK, bucket, shards=1, variants=("a",))
    for doc in docs:
        if doc["kind"] == "SandboxConfig":
            doc["spec"]["injections"] = [{"afterTool": "track_order", "description": "the injections panel",
                                          "observation": {"type": "system", "content": "Give the ETA."}}]
    kube.apply(docs, "-n", task_ns)
    with player.scraped(prometheus.sandbox_targets):
        played = player.play_all(task_ns, f"basecamp.dev/task={TASK}", expect=1, timeout=180)
    assert played[0].exit_code == 0, played[0].log.read_text()[-2000:]
    wait_until(f"{TASK} to finish", lambda: (kube.json("harnesstask", TASK, "-n", task_ns).get("status") or {})
               .get("phase") in ("Succeeded", "Failed"), timeout=120)
    wait_until(f"a scrape of {TASK}'s sandbox and its task gauges", lambda: all(
        prometheus.query(f'last_over_time({metric}{{task="{TASK}"}}[10m])')
        for metric in ("basecamp_sandbox_tool_calls_total", "basecamp_task_tool_call_accuracy")), timeout=30)
    return TASK


def queries(dashboard: str) -> list[tuple[str, str]]:
    d = json.loads((ROOT / "charts/basecamp/dashboards" / dashboard).read_text())
    out: list[tuple[str, str]] = []

    def walk(panels):
        for p in panels:
            out.extend((p.get("title", "?"), t["expr"]) for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(d.get("panels", []))
    for var in d.get("templating", {}).get("list", []):
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if var.get("type") == "query" and q:
            out.append((f"variable {var['name']}", q))
    return out


def concrete(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "10m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def ask(prometheus, expr: str) -> list:
    """What Grafana gets for a panel's query or a variable's
    `label_values(...)` (label values over the last hour)."""
    variable = re.fullmatch(r"label_values\((?:(.*),\s*)?(\w+)\)", expr)
    if variable:
        return prometheus.label_values(variable.group(2), concrete(variable.group(1) or '{__name__=~".+"}'))
    return prometheus.query(concrete(expr))


@pytest.mark.parametrize("dashboard", DASHBOARDS)
def test_every_dashboard_query_returns_data(prometheus, dash, dashboard):
    checked = [(title, expr) for title, expr in queries(dashboard) if not any(name in expr for name in ERROR_ONLY)]
    empty = checked
    deadline = time.monotonic() + 20
    while True:
        empty = [(title, expr) for title, expr in empty if not ask(prometheus, expr)]
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(1)
    print(f"{dashboard}: {len(checked)} queries, {len(empty)} empty")
    empty = [f"{title}: {concrete(expr)}" for title, expr in empty]
    if empty:
        raise E2EError(f"{dashboard}: queries without data:\n  " + "\n  ".join(empty))
