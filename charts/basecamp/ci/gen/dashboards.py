"""Writes charts/basecamp/dashboards/*.json (or into the directory named as
the first argument): the four Grafana dashboards. Edit this, not the JSON:
scripts/chart-lint.sh fails when the committed dashboards differ from what
this writes. (A dashboard edited in Grafana can still be exported over the
JSON; then port the change here.)"""
import json
import os
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "dashboards")
DS = {"type": "prometheus", "uid": "${datasource}"}
TRACE_LINK = {
    "title": "Open the trace report of ${__field.labels.task} (${__field.labels.variant})",
    "url": "${traceviewer}/tasks/${__field.labels.namespace}/${__field.labels.task}?variant=${__field.labels.variant}",
    "targetBlank": True,
}
TRACE_LINK_SANDBOX = {
    "title": "Open the trace report of ${__field.labels.task}",
    "url": "${traceviewer}/tasks/${__field.labels.namespace}/${__field.labels.task}",
    "targetBlank": True,
}


class Board:
    def __init__(self):
        self.panels = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def row(self, title):
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def add(self, panel, w, h):
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        panel.setdefault("datasource", DS)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(expr, legend="", ref="A", instant=False, fmt=None):
    t = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend or "__auto",
         "range": not instant, "instant": instant}
    if fmt:
        t["format"] = fmt
    return t


def timeseries(title, targets, unit="short", desc="", links=None, minv=None, maxv=None, stack=False,
               overrides=None, legend_calcs=("lastNotNull", "mean")):
    custom = {"drawStyle": "line", "lineWidth": 2, "fillOpacity": 10, "showPoints": "never",
              "spanNulls": True, "axisSoftMin": minv}
    if stack:
        custom.update({"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60, "lineWidth": 1})
    defaults = {"unit": unit, "custom": {k: v for k, v in custom.items() if v is not None}}
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    if links:
        defaults["links"] = links
    return {"type": "timeseries", "title": title, "description": desc, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": list(legend_calcs)},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title, targets, unit="short", desc="", mappings=None, thresholds=None, links=None, color_mode="value"):
    defaults = {"unit": unit, "mappings": mappings or [],
                "thresholds": thresholds or {"mode": "absolute", "steps": [{"color": "text", "value": None}]}}
    if links:
        defaults["links"] = links
    return {"type": "stat", "title": title, "description": desc, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": color_mode, "graphMode": "none", "textMode": "value_and_name",
                        "justifyMode": "auto", "orientation": "auto"}}


def bargauge(title, targets, unit="short", desc="", minv=None, maxv=None, links=None, thresholds=None):
    defaults = {"unit": unit, "thresholds": thresholds or {"mode": "absolute", "steps": [{"color": "blue", "value": None}]}}
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    if links:
        defaults["links"] = links
    return {"type": "bargauge", "title": title, "description": desc, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}}


def var_query(name, label, query, multi=True, include_all=True, hide=0):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"{name}-query"}, "definition": query,
            "refresh": 2, "sort": 1, "multi": multi, "includeAll": include_all,
            "allValue": ".*" if include_all else None, "hide": hide,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if include_all else {}}


def var_datasource():
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False}


def var_traceviewer():
    # Filled in by the chart (grafana.traceViewerUrl); editable in Grafana's settings.
    return {"name": "traceviewer", "label": "Trace viewer URL", "type": "constant",
            "query": "__TRACE_VIEWER_URL__", "hide": 2,
            "current": {"text": "__TRACE_VIEWER_URL__", "value": "__TRACE_VIEWER_URL__"}}


def dashboard(uid, title, desc, board, variables, refresh="1m", time_from="now-24h"):
    return {
        "uid": uid, "title": title, "description": desc, "tags": ["basecamp"], "editable": True,
        "schemaVersion": 39, "version": 1, "graphTooltip": 1, "timezone": "", "refresh": refresh,
        "time": {"from": time_from, "to": "now"}, "timepicker": {},
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "Basecamp", "type": "dashboards", "tags": ["basecamp"], "asDropdown": True,
                   "includeVars": True, "keepTime": True}],
        "templating": {"list": variables},
        "panels": board.panels,
    }


PHASE_COLORS = {"pending": "yellow", "running": "blue", "succeeded": "green", "failed": "red"}


def color_overrides(colors, by="displayName"):
    return [{"matcher": {"id": "byName" if by == "displayName" else by, "options": k},
             "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": v}}]} for k, v in colors.items()]


def evaluation():
    sel = 'namespace=~"$namespace", task=~"$task", variant=~"$variant"'
    legend = "{{namespace}}/{{task}} · {{variant}}"
    b = Board()
    b.row("Overview")
    b.add(stat("Tasks by phase", [target("sum by (phase) (basecamp_tasks)", "{{phase}}", instant=True)],
               desc="HarnessTasks in each phase, all namespaces (basecamp_tasks)."), 6, 5)
    b.add(stat("Success criteria", [target(f"basecamp_task_criteria_met{{{sel}}}", legend, instant=True)],
               desc="Whether each task variant meets its success criteria (basecamp_task_criteria_met). "
                    "Click a value for the trace report.",
               mappings=[{"type": "value", "options": {"0": {"text": "not met", "color": "red"},
                                                       "1": {"text": "met", "color": "green"}}}],
               links=[TRACE_LINK], color_mode="background"), 6, 5)
    b.add(stat("Episodes", [target(f"sum(basecamp_task_episodes{{{sel}}})", "episodes", instant=True)],
               desc="Episodes aggregated so far over the selected tasks and variants."), 4, 5)
    b.add(stat("Episodes not measured",
               [target(f"sum(basecamp_task_not_measured_episodes{{{sel}}}) or vector(0)", "not measured",
                       instant=True)],
               desc="Episodes the policy's server or a sandbox service failed (failure class policy_error or "
                    "service_exited): counted in Episodes, left out of every mean "
                    "(basecamp_task_not_measured_episodes). Above 0, the task's Degraded condition says "
                    "EpisodesNotMeasured and the task fails, unless a success criterion on not_measured_rate "
                    "or not_measured_episodes tolerates them.",
               thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None},
                                                         {"color": "orange", "value": 1}]},
               color_mode="background"), 4, 5)
    b.add(stat("Failed shards", [target(f'sum(basecamp_shards{{{sel}, state="failed"}}) or vector(0)',
                                        "failed", instant=True)],
               desc="Shards in state failed over the selected tasks.",
               thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None},
                                                         {"color": "red", "value": 1}]},
               color_mode="background"), 4, 5)

    b.row("Evaluation metrics per task and variant")
    metrics = [
        ("Tool call accuracy", "basecamp_task_tool_call_accuracy", "percentunit", 0, 1,
         "Share of expected tool calls the agent made with the right name and arguments."),
        ("Plan step F1", "basecamp_task_plan_step_f1", "percentunit", 0, 1,
         "F1 of the plan steps taken against the expected ones."),
        ("Memory consistency", "basecamp_task_memory_consistency", "percentunit", 0, 1,
         "Mean share of the expected memory keys that hold their expected value when an episode ends (1 or 0 against an expected memory hash)."),
        ("Error rate", "basecamp_task_error_rate", "percentunit", 0, 1,
         "Share of tool calls that ended in an error, a timeout or a fallback."),
        ("Success rate", "basecamp_task_success_rate", "percentunit", 0, 1,
         "Share of episodes with no failure: no tool error, every tool call right, the memory as expected."),
        ("Resolution time p95", "basecamp_task_resolution_seconds_p95", "s", 0, None,
         "95th percentile time an episode takes to resolve."),
        ("Episodes aggregated", "basecamp_task_episodes", "short", 0, None,
         "Episodes of finished shards aggregated into the metrics above."),
        ("Episodes not measured", "basecamp_task_not_measured_episodes", "short", 0, None,
         "Episodes the policy's server or a sandbox service failed (policy_error, service_exited): counted in "
         "the episodes aggregated, left out of every mean above."),
    ]
    for title, metric, unit, lo, hi, desc in metrics:
        b.add(timeseries(title, [target(f"{metric}{{{sel}}}", legend)], unit=unit, minv=lo, maxv=hi,
                         desc=desc + f" ({metric}). Click a point for the task's trace report.",
                         links=[TRACE_LINK]), 12, 8)

    b.row("A/B variants side by side")
    cols = [("A", "basecamp_task_tool_call_accuracy", "tool_call_accuracy"),
            ("B", "basecamp_task_plan_step_f1", "plan_step_f1"),
            ("C", "basecamp_task_memory_consistency", "memory_consistency"),
            ("D", "basecamp_task_error_rate", "error_rate"),
            ("H", "basecamp_task_success_rate", "success_rate"),
            ("E", "basecamp_task_resolution_seconds_p95", "resolution p95 (s)"),
            ("F", "basecamp_task_episodes", "episodes"),
            ("I", "basecamp_task_not_measured_episodes", "not measured"),
            ("G", "basecamp_task_criteria_met", "criteria met")]
    renames = {f"Value #{ref}": name for ref, _, name in cols}
    table = {
        "type": "table", "title": "Variants side by side",
        "description": "The latest value of every evaluation metric, one row per task variant: the two "
                       "variants of an A/B task sit on adjacent rows. Click a task for its trace report.",
        "targets": [target(f"max by (namespace, task, variant) ({m}{{{sel}}})", ref=ref, instant=True,
                           fmt="table") for ref, m, _ in cols],
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": renames,
                                           "indexByName": {"namespace": 0, "task": 1, "variant": 2}}},
            {"id": "sortBy", "options": {"sort": [{"field": "task"}]}},
        ],
        "fieldConfig": {"defaults": {"custom": {"align": "auto"}}, "overrides": [
            {"matcher": {"id": "byName", "options": "task"}, "properties": [{"id": "links", "value": [{
                "title": "Open the trace report of ${__data.fields.task} (${__data.fields.variant})",
                "url": "${traceviewer}/tasks/${__data.fields.namespace}/${__data.fields.task}"
                       "?variant=${__data.fields.variant}",
                "targetBlank": True}]}]},
        ] + [
            {"matcher": {"id": "byName", "options": n}, "properties": [
                {"id": "unit", "value": "percentunit"}, {"id": "decimals", "value": 3},
                {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "gradient"}},
                {"id": "color", "value": {"mode": "continuous-RdYlGr"}}, {"id": "min", "value": 0},
                {"id": "max", "value": 1}]}
            for n in ("tool_call_accuracy", "plan_step_f1", "memory_consistency", "success_rate")
        ] + [
            {"matcher": {"id": "byName", "options": "error_rate"}, "properties": [
                {"id": "unit", "value": "percentunit"}, {"id": "decimals", "value": 3}]},
            {"matcher": {"id": "byName", "options": "resolution p95 (s)"}, "properties": [
                {"id": "unit", "value": "s"}]},
            {"matcher": {"id": "byName", "options": "criteria met"}, "properties": [
                {"id": "mappings", "value": [{"type": "value", "options": {
                    "0": {"text": "not met", "color": "red"}, "1": {"text": "met", "color": "green"}}}]},
                {"id": "custom.cellOptions", "value": {"type": "color-text"}}]},
        ]},
        "options": {"showHeader": True, "cellHeight": "sm"},
    }
    b.add(table, 24, 9)
    b.add(bargauge("Tool call accuracy by variant",
                   [target(f"basecamp_task_tool_call_accuracy{{{sel}}}", "{{task}} · {{variant}}", instant=True)],
                   unit="percentunit", minv=0, maxv=1, links=[TRACE_LINK],
                   desc="Current tool_call_accuracy of each variant, side by side."), 12, 8)
    b.add(timeseries("Variant gap: tool call accuracy (best − worst variant)",
                     [target(f"max by (namespace, task) (basecamp_task_tool_call_accuracy{{{sel}}}) - "
                             f"min by (namespace, task) (basecamp_task_tool_call_accuracy{{{sel}}})",
                             "{{namespace}}/{{task}}")],
                     unit="percentunit", minv=0,
                     desc="The gap in tool_call_accuracy between a task's best and worst variant over time "
                          "(0 for single-variant tasks). `basecamp ab compare` gives the full A/B table."), 12, 8)

    b.row("Shards")
    b.add(timeseries("Shards by state", [target(f"sum by (state) (basecamp_shards{{{sel}}})", "{{state}}")],
                     stack=True, minv=0, overrides=color_overrides(PHASE_COLORS),
                     desc="Shards of the selected tasks in each state (pending, running, succeeded, failed)."),
          12, 8)
    b.add(bargauge("Shards per task variant and state",
                   [target(f"sum by (namespace, task, variant, state) (basecamp_shards{{{sel}}}) > 0",
                           "{{task}} · {{variant}} · {{state}}", instant=True)],
                   links=[TRACE_LINK],
                   desc="Current shard count of each task variant by state."), 12, 8)
    return dashboard("basecamp-evaluation", "Basecamp / Evaluation",
                     "Evaluation metrics of HarnessTasks per task and variant over time, A/B variants side "
                     "by side and shard states. Points link to the task's trace report.",
                     b, [var_datasource(),
                         var_query("namespace", "Namespace", "label_values(basecamp_task_episodes, namespace)"),
                         var_query("task", "Task",
                                   'label_values(basecamp_task_episodes{namespace=~"$namespace"}, task)'),
                         var_query("variant", "Variant",
                                   'label_values(basecamp_task_episodes{namespace=~"$namespace", task=~"$task"}, variant)'),
                         var_traceviewer()])


def sandbox():
    sel = 'namespace=~"$namespace", task=~"$task", tool=~"$tool"'
    sel_nt = 'namespace=~"$namespace", task=~"$task"'
    rate = "[$__rate_interval]"
    b = Board()
    b.row("Tool calls")
    b.add(timeseries("Tool calls by status",
                     [target(f"sum by (status) (rate(basecamp_sandbox_tool_calls_total{{{sel}}}{rate}))", "{{status}}")],
                     unit="reqps", stack=True, minv=0,
                     overrides=color_overrides({"ok": "green", "error": "red", "timeout": "orange",
                                                "fallback": "yellow", "rolled_back": "purple", "refused": "dark-red"}),
                     desc="Tool calls per second through the sandbox executors, by step status."), 12, 8)
    b.add(timeseries("Tool call latency by tool",
                     [target(f"histogram_quantile({q}, sum by (le, tool) (rate(basecamp_sandbox_tool_call_duration_seconds_bucket{{{sel}}}{rate})))",
                             "{{tool}} p" + str(int(q * 100)), ref=r) for q, r in ((0.5, "A"), (0.95, "B"), (0.99, "C"))],
                     unit="s", minv=0,
                     desc="p50, p95 and p99 latency of tool calls, fallbacks included."), 12, 8)
    b.add({"type": "heatmap", "title": "Tool call latency distribution",
           "description": "All selected tools' call latencies per time bucket.",
           "targets": [target(f"sum by (le) (increase(basecamp_sandbox_tool_call_duration_seconds_bucket{{{sel}}}{rate}))",
                              "{{le}}", fmt="heatmap")],
           "fieldConfig": {"defaults": {"unit": "s"}, "overrides": []},
           "options": {"calculate": False, "yAxis": {"unit": "s"}, "color": {"scheme": "Oranges", "mode": "scheme"},
                       "cellGap": 1, "tooltip": {"show": True, "yHistogram": True}}}, 12, 8)
    b.add(timeseries("Calls per tool",
                     [target(f"sum by (tool) (rate(basecamp_sandbox_tool_calls_total{{{sel}}}{rate}))", "{{tool}}")],
                     unit="reqps", minv=0, desc="Tool calls per second, by tool."), 12, 8)
    b.row("Timeouts and fallbacks")
    b.add(timeseries("Timeouts by task and tool",
                     [target(f"sum by (namespace, task, tool) (rate(basecamp_sandbox_tool_timeouts_total{{{sel}}}{rate}))",
                             "{{namespace}}/{{task}} · {{tool}}")],
                     unit="reqps", minv=0, links=[TRACE_LINK_SANDBOX],
                     desc="Tool calls per second that hit their tool timeout. Click a point for the task's "
                          "trace report (error.type=timeout steps)."), 12, 8)
    b.add(timeseries("Timeout ratio by tool",
                     [target(f"sum by (tool) (rate(basecamp_sandbox_tool_timeouts_total{{{sel}}}{rate})) / "
                             f"sum by (tool) (rate(basecamp_sandbox_tool_calls_total{{{sel}}}{rate}))", "{{tool}}")],
                     unit="percentunit", minv=0, maxv=1,
                     desc="Share of each tool's calls that time out; the BasecampSandboxToolTimeouts alert "
                          "fires above prometheusRule.sandboxToolTimeouts.ratio."), 12, 8)
    b.add(timeseries("Fallbacks by tool",
                     [target(f"sum by (tool) (rate(basecamp_sandbox_tool_fallbacks_total{{{sel}}}{rate}))", "{{tool}}")],
                     unit="reqps", minv=0,
                     desc="Tool calls answered by the tool's fallback observation."), 12, 8)
    b.add(timeseries("Rollbacks",
                     [target(f"sum by (namespace, task) (rate(basecamp_sandbox_rollbacks_total{{{sel_nt}}}{rate}))",
                             "{{namespace}}/{{task}}")],
                     unit="ops", minv=0, links=[TRACE_LINK_SANDBOX],
                     desc="Plan steps rolled back to the last stable checkpoint (rollback_trace.json)."), 12, 8)
    b.row("Episodes and policy")
    b.add(timeseries("Episodes by outcome",
                     [target(f"sum by (outcome) (rate(basecamp_sandbox_episodes_total{{{sel_nt}}}{rate}))", "{{outcome}}")],
                     unit="ops", stack=True, minv=0,
                     overrides=color_overrides({"completed": "green", "max_steps": "yellow", "error": "red",
                                                "cancelled": "purple"}),
                     desc="Finished episodes per second by outcome."), 8, 8)
    b.add(timeseries("Injections by trigger",
                     [target(f"sum by (trigger) (rate(basecamp_sandbox_injections_total{{{sel_nt}}}{rate}))", "{{trigger}}")],
                     unit="ops", minv=0, desc="Observation injections delivered into episodes."), 8, 8)
    b.add(timeseries("Policy errors by category",
                     [target(f"sum by (category) (rate(basecamp_sandbox_policy_errors_total{{{sel_nt}}}{rate}))", "{{category}}")],
                     unit="ops", minv=0, desc="Failed policy turns (the policy server) by error category."), 8, 8)
    b.add(timeseries("Shards waiting for their policy",
                     [target(f"sum by (namespace, task, variant) (basecamp_sandbox_waiting_for_policy{{{sel_nt}}})",
                             "{{namespace}}/{{task}} · {{variant}}")],
                     minv=0, stack=True,
                     desc="Shards that start no episode because their policy failed episode after episode (an "
                          "outage) and they wait for it to answer again: a hosted endpoint's /models, up to "
                          "spec.policy.outageTimeout, or a policy server's readiness URL, up to its startupTimeout. "
                          "The BasecampSandboxWaitingForPolicy alert fires after "
                          "prometheusRule.sandboxWaitingForPolicy.for."), 24, 6)
    b.add(timeseries("Policy 429s",
                     [target(f"sum by (namespace, task, variant) (rate(basecamp_sandbox_policy_rate_limited_total"
                             f"{{{sel_nt}}}{rate}))", "{{namespace}}/{{task}} · {{variant}}")],
                     unit="reqps", minv=0,
                     desc="Answers 429 (too many requests) of the policy's endpoint, retried or not. Each lowers "
                          "the requests a shard sends at once (see the next panel) instead of failing episodes: "
                          "a run that keeps meeting 429 asks more of the endpoint than its rate limit allows."), 12, 6)
    b.add(timeseries("Requests at once under 429s",
                     [target(f"basecamp_sandbox_policy_requests_at_once_limit{{{sel_nt}}}",
                             "{{namespace}}/{{task}} · {{variant}} · shard {{shard}}")],
                     minv=0,
                     desc="The most requests a shard sends its policy's endpoint at once since it answered 429: "
                          "halved at a 429, raised by one as the endpoint answers without; no episode starts while "
                          "a request waits. 0 while a shard never met 429 (it sends as many as its episodes ask)."), 12, 6)
    return dashboard("basecamp-sandbox", "Basecamp / Sandboxes",
                     "Tool calls, latency, timeouts and fallbacks, rollbacks, episodes, policy errors and outages from "
                     "sandbox pods (the chart's PodMonitor adds the task, variant and shard labels).",
                     b, [var_datasource(),
                         var_query("namespace", "Namespace", "label_values(basecamp_sandbox_tool_calls_total, namespace)"),
                         var_query("task", "Task",
                                   'label_values(basecamp_sandbox_tool_calls_total{namespace=~"$namespace"}, task)'),
                         var_query("tool", "Tool",
                                   'label_values(basecamp_sandbox_tool_calls_total{namespace=~"$namespace", task=~"$task"}, tool)'),
                         var_traceviewer()], refresh="30s", time_from="now-6h")


def operator():
    sel = 'job=~"$job"'
    rate = "[$__rate_interval]"
    b = Board()
    b.row("Operator health")
    b.add(stat("Operator pods up", [target(f"sum(up{{{sel}}})", "up", instant=True)],
               thresholds={"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]},
               color_mode="background", desc="Operator pods Prometheus scrapes successfully."), 6, 5)
    b.add(stat("Reconciles / s", [target(f"sum(rate(basecamp_reconcile_duration_seconds_count{{{sel}}}{rate}))",
                                         "reconciles", instant=True)], unit="ops"), 6, 5)
    b.add(stat("Reconcile errors / s", [target(f"sum(rate(basecamp_reconcile_errors_total{{{sel}}}{rate})) or vector(0)",
                                               "errors", instant=True)], unit="ops",
               thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 0.01}]},
               color_mode="background"), 6, 5)
    b.add(stat("Reconcile p99", [target(f"histogram_quantile(0.99, sum by (le) (rate(basecamp_reconcile_duration_seconds_bucket{{{sel}}}{rate})))",
                                        "p99", instant=True)], unit="s"), 6, 5)
    b.add(timeseries("Reconcile rate", [target(f"sum(rate(basecamp_reconcile_duration_seconds_count{{{sel}}}{rate}))", "reconciles")],
                     unit="ops", minv=0, desc="Reconciles per second."), 12, 8)
    b.add(timeseries("Reconcile errors by category",
                     [target(f"sum by (category) (rate(basecamp_reconcile_errors_total{{{sel}}}{rate}))", "{{category}}")],
                     unit="ops", minv=0, stack=True,
                     desc="Reconcile errors per second by category (the Event reason on the task)."), 12, 8)
    b.add(timeseries("Reconcile duration",
                     [target(f"histogram_quantile({q}, sum by (le) (rate(basecamp_reconcile_duration_seconds_bucket{{{sel}}}{rate})))",
                             f"p{int(q * 100)}", ref=r) for q, r in ((0.5, "A"), (0.95, "B"), (0.99, "C"))],
                     unit="s", minv=0, desc="Reconcile duration percentiles."), 12, 8)
    b.add(timeseries("Tasks by phase", [target("sum by (phase) (basecamp_tasks)", "{{phase}}")],
                     minv=0, stack=True, desc="HarnessTasks in each phase."), 12, 8)
    b.row("S3")
    b.add(timeseries("S3 operation latency p95",
                     [target(f"histogram_quantile(0.95, sum by (le, operation) (rate(basecamp_s3_operation_duration_seconds_bucket{{{sel}}}{rate})))",
                             "{{operation}}")],
                     unit="s", minv=0, desc="p95 latency of the operator's S3 operations (aggregating shard results)."), 12, 8)
    b.add(timeseries("S3 operation errors",
                     [target(f"sum by (operation) (rate(basecamp_s3_operation_errors_total{{{sel}}}{rate}))", "{{operation}}")],
                     unit="ops", minv=0, desc="Failed S3 operations per second, by operation."), 12, 8)
    return dashboard("basecamp-operator", "Basecamp / Operator",
                     "Health of the Basecamp operator: scrape status, reconcile rate, errors and duration, S3.",
                     b, [var_datasource(),
                         var_query("job", "Job", "label_values(basecamp_reconcile_duration_seconds_count, job)",
                                   include_all=True)], refresh="30s", time_from="now-6h")


CHECKPOINT_METRICS = [
    ("Tool call accuracy", "tool_call_accuracy"),
    ("Plan step F1", "plan_step_f1"),
    ("Memory consistency", "memory_consistency"),
    ("Error rate", "error_rate"),
    ("Success rate", "success_rate"),
]


def xychart(title, targets, x_field, desc="", links=None, unit="percentunit"):
    """Points (x = the field named x_field, y = every other field), the
    queries joined on their timestamps: each scrape is one (step, value) pair."""
    defaults = {"unit": unit, "min": 0, "max": 1,
                "custom": {"show": "points+lines", "pointSize": {"fixed": 7}, "lineWidth": 1}}
    if links:
        defaults["links"] = links
    return {"type": "xychart", "title": title, "description": desc, "targets": targets,
            "transformations": [{"id": "joinByField", "options": {"byField": "Time", "mode": "outer"}}],
            "fieldConfig": {"defaults": defaults, "overrides": [
                {"matcher": {"id": "byName", "options": x_field},
                 "properties": [{"id": "unit", "value": "none"}, {"id": "min"}, {"id": "max"}]}]},
            "options": {"seriesMapping": "auto", "dims": {"x": x_field},
                        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "single"}}}


def training():
    sel_t = 'namespace=~"$namespace", task=~"$task"'
    sel = sel_t + ', variant=~"$variant"'
    step = f"max by (namespace, task) (basecamp_checkpoint_step{{{sel_t}}})"
    step_link = {"title": "Open the trace report of step ${__data.fields.step}",
                 "url": "${traceviewer}/tasks/${namespace}/${task}@step-${__data.fields.step}",
                 "targetBlank": True}
    b = Board()
    b.row("Task graph: metrics against the training step")
    for title, metric in CHECKPOINT_METRICS:
        b.add(xychart(f"{title} against training step",
                      [target(step, "step", ref="A"),
                       target(f"basecamp_checkpoint_{metric}{{{sel}}}", "{{variant}}", ref="B")],
                      "step", links=[step_link],
                      desc=f"{metric} of each evaluated checkpoint (basecamp_checkpoint_{metric}) against its "
                           "training step (basecamp_checkpoint_step). Click a point for that checkpoint's trace report."),
              12, 9)
    b.row("Checkpoints over time")
    b.add(stat("Newest evaluated step", [target(f"basecamp_checkpoint_step{{{sel_t}}}", "{{task}}", instant=True)],
               desc="The newest checkpoint whose evaluation finished (status.training.latestStep). "
                    "Click it for that checkpoint's trace report.",
               links=[{"title": "Open the trace report of ${__field.labels.task} step ${__value.raw}",
                       "url": "${traceviewer}/tasks/${__field.labels.namespace}/${__field.labels.task}@step-${__value.raw}",
                       "targetBlank": True}]), 6, 8)
    b.add(timeseries("Evaluated step over time", [target(f"basecamp_checkpoint_step{{{sel_t}}}", "{{task}}")],
                     minv=0, desc="How far training got, as evaluated: the newest evaluated step over time."), 9, 8)
    b.add(timeseries("Newest checkpoint's tool call accuracy",
                     [target(f"basecamp_checkpoint_tool_call_accuracy{{{sel}}}", "{{task}} · {{variant}}")],
                     unit="percentunit", minv=0, maxv=1,
                     desc="tool_call_accuracy of the newest evaluated checkpoint over time."), 9, 8)
    return dashboard("basecamp-training", "Basecamp / Training",
                     "The training loop of one HarnessTask: every evaluated checkpoint's metrics against its "
                     "training step (the task graph); each point links to that checkpoint's trace report.",
                     b, [var_datasource(),
                         var_query("namespace", "Namespace", "label_values(basecamp_checkpoint_step, namespace)",
                                   multi=False, include_all=False),
                         var_query("task", "Task",
                                   'label_values(basecamp_checkpoint_step{namespace=~"$namespace"}, task)',
                                   multi=False, include_all=False),
                         var_query("variant", "Variant",
                                   'label_values(basecamp_checkpoint_tool_call_accuracy{namespace=~"$namespace", task=~"$task"}, variant)'),
                         var_traceviewer()], time_from="now-7d")


os.makedirs(OUT, exist_ok=True)
for name, fn in (("evaluation", evaluation), ("sandbox", sandbox), ("operator", operator), ("training", training)):
    with open(os.path.join(OUT, f"basecamp-{name}.json"), "w") as f:
        json.dump(fn(), f, indent=2, ensure_ascii=False)
        f.write("\n")
