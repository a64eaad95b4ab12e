"""Every query of the chart's Grafana dashboards returns data from a real
Prometheus that scraped the real operator during this run (started with the
operator fixture, 1 s scrape interval). Template variables are set to match
everything (`.*`) and `$__rate_interval` to the run's length.

Not covered: the Sandboxes dashboard. It reads sandbox pods' own /metrics
(`basecamp-sandbox run --listen`, scraped by the chart's PodMonitor on a port
named `metrics`), and the operator's pod template neither passes `--listen`
nor declares that port, so there is nothing to scrape (README.md, "Findings").
Error counters that only exist once an error happened may be empty.
"""

from __future__ import annotations

import json
import re

import pytest

from kube import ROOT, E2EError, wait_until

DASHBOARDS = ["basecamp-evaluation.json", "basecamp-operator.json"]
# Series that exist only after an error of their kind (no error, no series).
ERROR_ONLY = ("basecamp_s3_operation_errors_total", "basecamp_reconcile_errors_total")


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
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
            out.append((f"variable {var['name']}", f"group by ({m.group(2)}) ({m.group(1)})" if m else q))
    return out


def concrete(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "10m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


@pytest.mark.parametrize("dashboard", DASHBOARDS)
def test_every_dashboard_query_returns_data(prometheus, operator, dashboard):
    if prometheus is None:
        pytest.skip("prometheus is not installed (scripts/chart-tools.sh install promtool)")
    # The run's task gauges must have been scraped at least once.
    wait_until("a scrape with basecamp_task_tool_call_accuracy",
               lambda: prometheus.query("basecamp_task_tool_call_accuracy"), timeout=30)
    empty, checked = [], 0
    for title, expr in queries(dashboard):
        result = prometheus.query(concrete(expr))
        checked += 1
        if not result and not any(name in expr for name in ERROR_ONLY):
            empty.append(f"{title}: {concrete(expr)}")
    print(f"{dashboard}: {checked} queries, {len(empty)} empty")
    if empty:
        raise E2EError(f"{dashboard}: queries without data:\n  " + "\n  ".join(empty))
