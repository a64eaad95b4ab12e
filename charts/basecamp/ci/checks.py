"""The checks of scripts/chart-lint.sh that need a YAML parser: splitting
rendered manifests, validating prometheus-operator objects, extracting alert
rules and dashboard queries for promtool, and asserting what the chart must
render for a given values file. Run with the kubernetes-validate venv's
Python (it has PyYAML and jsonschema):

    checks.py split RENDERED OUT_DIR          core.yaml (for kubernetes-validate) and monitoring.yaml
    checks.py monitoring RENDERED             ServiceMonitor/PodMonitor/PrometheusRule against strict schemas
    checks.py rules RENDERED OUT              the PrometheusRule groups as a promtool rules file
    checks.py dashboards DIR OUT              dashboard structure; every query as a recording rule in OUT
    checks.py assert default|all-on|minimal RENDERED  what those values must render
    checks.py names RENDERED                  no two objects share a name; names and label values fit their limits
    checks.py readme-flags RENDERED README    every operator flag the Deployment passes is in README's command line
    checks.py doc-commands HELM ROOT DOC...   every `helm install|upgrade` of DOC's sh blocks renders (helm template)
    checks.py crd-drift REPO_CRDS CHART_CRDS  the chart's crds/ equals the repository's
    checks.py readme VALUES README            every value has a row in README.md's table
    checks.py contract RULES...               every basecamp_* metric and label a query uses is in the contract
    checks.py synth OUT                       an hour of series following the contract, as OpenMetrics
    checks.py query URL RULES...              every query of RULES returns data from the Prometheus at URL

Each prints one line per problem ("file: where: what") and exits 1 on any.
"""

import json
import os
import re
import sys

import jsonschema
import yaml

problems = []


def problem(msg):
    problems.append(msg)
    print(f"  FAIL {msg}", file=sys.stderr)


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def name_of(doc):
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('namespace', '')}/{doc.get('metadata', {}).get('name')}"


# ---------------------------------------------------------------- split

def cmd_split(rendered, out_dir):
    core, monitoring = [], []
    for doc in load_docs(rendered):
        (monitoring if doc.get("apiVersion", "").startswith("monitoring.coreos.com/") else core).append(doc)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "core.yaml"), "w") as f:
        yaml.safe_dump_all(core, f, sort_keys=False)
    with open(os.path.join(out_dir, "monitoring.yaml"), "w") as f:
        yaml.safe_dump_all(monitoring, f, sort_keys=False)
    print(f"  {len(core)} core objects, {len(monitoring)} prometheus-operator objects")


# ---------------------------------------------------------------- monitoring
# Strict schemas of the prometheus-operator (monitoring.coreos.com/v1) fields
# the chart renders, written from the operator's API reference. Unknown
# fields fail, so a misspelt field is caught before a cluster rejects it.

STR = {"type": "string"}
STRMAP = {"type": "object", "additionalProperties": STR}
DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
LABEL_NAME = {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}
RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": LABEL_NAME}, "separator": STR, "targetLabel": STR,
    "regex": STR, "modulus": {"type": "integer"}, "replacement": STR,
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                        "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                        "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                        "dropequal", "DropEqual"]}}}
META = {"type": "object", "required": ["name"], "properties": {
    "name": STR, "namespace": STR, "labels": STRMAP, "annotations": STRMAP}}
SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": STRMAP, "matchExpressions": {"type": "array"}}}
NS_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": STR}}}
ENDPOINT_COMMON = {
    "port": STR, "path": STR, "scheme": {"enum": ["http", "https"]}, "interval": DURATION,
    "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
    "relabelings": {"type": "array", "items": RELABEL}, "metricRelabelings": {"type": "array", "items": RELABEL},
}


def cr(kind, spec):
    return {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                           "metadata": META, "spec": spec}}


MONITORING_SCHEMAS = {
    "ServiceMonitor": cr("ServiceMonitor", {
        "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
        "properties": {"jobLabel": STR, "namespaceSelector": NS_SELECTOR, "selector": SELECTOR,
                       "targetLabels": {"type": "array", "items": STR},
                       "endpoints": {"type": "array", "minItems": 1, "items": {
                           "type": "object", "additionalProperties": False, "properties": ENDPOINT_COMMON}}}}),
    "PodMonitor": cr("PodMonitor", {
        "type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
        "properties": {"jobLabel": STR, "namespaceSelector": NS_SELECTOR, "selector": SELECTOR,
                       "podTargetLabels": {"type": "array", "items": STR},
                       "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                           "type": "object", "additionalProperties": False, "properties": ENDPOINT_COMMON}}}}),
    "PrometheusRule": cr("PrometheusRule", {
        "type": "object", "additionalProperties": False, "required": ["groups"],
        "properties": {"groups": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "rules"],
            "properties": {"name": STR, "interval": DURATION, "limit": {"type": "integer"},
                           "labels": STRMAP, "partial_response_strategy": STR,
                           "rules": {"type": "array", "items": {
                               "type": "object", "additionalProperties": False, "required": ["expr"],
                               "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                               "properties": {"alert": STR, "record": STR,
                                              "expr": {"type": ["string", "integer"]}, "for": DURATION,
                                              "keep_firing_for": DURATION, "labels": STRMAP,
                                              "annotations": STRMAP}}}}}}}}),
}


def cmd_monitoring(rendered):
    docs = [d for d in load_docs(rendered) if d.get("apiVersion", "").startswith("monitoring.coreos.com/")]
    for doc in docs:
        schema = MONITORING_SCHEMAS.get(doc.get("kind"))
        if schema is None:
            problem(f"{rendered}: {name_of(doc)}: no schema for this prometheus-operator kind")
            continue
        for err in sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path)):
            where = ".".join(str(p) for p in err.absolute_path) or "(root)"
            problem(f"{rendered}: {name_of(doc)}: {where}: {err.message}")
    print(f"  {len(docs)} prometheus-operator objects checked")


# ---------------------------------------------------------------- rules

def cmd_rules(rendered, out):
    groups = []
    for doc in load_docs(rendered):
        if doc.get("kind") == "PrometheusRule":
            groups.extend(doc["spec"]["groups"])
    if not groups:
        problem(f"{rendered}: no PrometheusRule groups rendered")
    with open(out, "w") as f:
        yaml.safe_dump({"groups": groups}, f, sort_keys=False)
    print(f"  {sum(len(g['rules']) for g in groups)} rules in {len(groups)} groups -> {out}")


# ---------------------------------------------------------------- dashboards

# Grafana's built-in interval variables become durations; every other
# variable becomes a regex that matches anything (it only appears inside
# label matchers), so the substituted query must still parse.
GRAFANA_DURATIONS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600",
                     "__interval_ms": "60000", "__range_ms": "3600000"}
VAR_RE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr):
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return GRAFANA_DURATIONS.get(name, ".*")
    return VAR_RE.sub(repl, expr)


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def check_links(path, where, links, variables):
    for link in links:
        url = link.get("url", "")
        if not url.startswith("${traceviewer}/tasks/"):
            problem(f"{path}: {where}: data link {url!r} does not point to ${{traceviewer}}/tasks/...")
        for ref in re.findall(r"\$\{(\w+)", url):
            if not ref.startswith("__") and ref not in variables:
                problem(f"{path}: {where}: data link uses undefined variable ${ref}")


def cmd_dashboards(directory, out):
    rules = []
    files = sorted(f for f in os.listdir(directory) if f.endswith(".json"))
    if not files:
        problem(f"{directory}: no dashboards")
    uids = {}
    for fname in files:
        path = os.path.join(directory, fname)
        try:
            with open(path) as f:
                dash = json.load(f)
        except json.JSONDecodeError as e:
            problem(f"{path}: not JSON: {e}")
            continue
        for key in ("uid", "title", "panels", "templating", "schemaVersion"):
            if key not in dash:
                problem(f"{path}: no top-level {key}")
        if dash.get("uid") in uids:
            problem(f"{path}: uid {dash.get('uid')} also used by {uids[dash['uid']]}")
        uids[dash.get("uid")] = path
        if "basecamp" not in dash.get("tags", []):
            problem(f"{path}: no basecamp tag (the dashboards link to each other by tag)")
        variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
        if variables.get("datasource", {}).get("type") != "datasource":
            problem(f"{path}: no datasource variable of type datasource")
        for required in ("namespace", "task") if fname != "basecamp-operator.json" else ():
            if required not in variables:
                problem(f"{path}: no {required} template variable")
        if "traceviewer" in variables and variables["traceviewer"].get("query") != "__TRACE_VIEWER_URL__":
            problem(f"{path}: the traceviewer variable must hold the chart's placeholder __TRACE_VIEWER_URL__")
        for name, var in variables.items():
            if var.get("type") == "query":
                q = var.get("query", {})
                q = q.get("query", "") if isinstance(q, dict) else q
                m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip()) or re.fullmatch(r"label_values\((\w+)\)", q.strip())
                if not m:
                    problem(f"{path}: variable {name}: query {q!r} is not label_values(SELECTOR, LABEL)")
                elif m.re.groups == 2:
                    rules.append((f"{fname} variable {name}", m.group(1)))
        ids = set()
        n_links = 0
        for panel in walk_panels(dash.get("panels", [])):
            pid = panel.get("id")
            where = f"panel {pid} {panel.get('title')!r}"
            if pid in ids:
                problem(f"{path}: {where}: duplicate panel id")
            ids.add(pid)
            if panel.get("type") == "row":
                continue
            if panel.get("datasource", {}).get("uid") != "${datasource}":
                problem(f"{path}: {where}: datasource is not ${{datasource}}")
            targets = panel.get("targets", [])
            if not targets:
                problem(f"{path}: {where}: no queries")
            for t in targets:
                expr = t.get("expr", "")
                if not expr:
                    problem(f"{path}: {where}: target {t.get('refId')} has no expr")
                    continue
                for ref in set(re.findall(r"\$\{?(\w+)", expr)):
                    if ref not in variables and ref not in GRAFANA_DURATIONS:
                        problem(f"{path}: {where}: query uses undefined variable ${ref}")
                rules.append((f"{fname} {where} {t.get('refId')}", expr))
            defaults = panel.get("fieldConfig", {}).get("defaults", {})
            links = list(defaults.get("links", []))
            for o in panel.get("fieldConfig", {}).get("overrides", []):
                for prop in o.get("properties", []):
                    if prop.get("id") == "links":
                        links.extend(prop["value"])
            check_links(path, where, links, variables)
            n_links += len(links)
        if fname == "basecamp-evaluation.json" and n_links < 6:
            problem(f"{path}: only {n_links} data links to the trace viewer; every per-task panel needs one")
        print(f"  {fname}: {len(ids)} panels, {n_links} trace links")
    # Each query becomes a recording rule, so `promtool check rules` parses
    # it with Prometheus' own parser.
    group = {"name": "dashboard-queries", "rules": []}
    for i, (where, expr) in enumerate(rules):
        group["rules"].append({"record": f"dashboard:query:{i}", "expr": substitute(expr),
                               "labels": {"source": where[:200]}})
    with open(out, "w") as f:
        yaml.safe_dump({"groups": [group]}, f, sort_keys=False, width=1000)
    print(f"  {len(rules)} queries -> {out}")


# ---------------------------------------------------------------- assertions

def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def one(docs, kind, name=None):
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    if len(found) != 1:
        problem(f"expected exactly one {kind}{' ' + name if name else ''}, found {len(found)}")
        return {}
    return found[0]


def rules_of(role):
    return {(tuple(r.get("apiGroups", [])), tuple(r["resources"]), tuple(r["verbs"])) for r in role.get("rules", [])}


# What the operator is allowed: exactly this, no more (operator/RBAC.md).
EXPECTED_NAMESPACED_RULES = {
    (("basecamp.dev",), ("harnesstasks",), ("get", "list", "watch", "patch", "update")),
    (("basecamp.dev",), ("harnesstasks/status",), ("get", "patch", "update")),
    (("basecamp.dev",), ("harnesstasks/finalizers",), ("update",)),
    (("basecamp.dev",), ("sandboxconfigs",), ("get", "list", "watch")),
    (("batch",), ("jobs",), ("get", "list", "watch", "create", "patch", "delete")),
    (("",), ("pods",), ("get", "list")),
    (("",), ("services",), ("get", "list", "watch")),
    (("",), ("configmaps",), ("get", "list", "watch", "create", "patch", "delete")),
    (("networking.k8s.io",), ("networkpolicies",), ("get", "list", "watch", "create", "patch", "delete")),
    (("events.k8s.io",), ("events",), ("create", "patch")),
}
EXPECTED_NODE_RULES = {(("",), ("nodes",), ("get", "list", "watch"))}
EXPECTED_LEASE_RULES = {(("coordination.k8s.io",), ("leases",), ("get", "create", "update"))}


def check_pss_restricted(dep):
    pod = dep["spec"]["template"]["spec"]
    psc = pod.get("securityContext", {})
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        where = f"Deployment {dep['metadata']['name']} container {c['name']}"
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            problem(f"{where}: runAsNonRoot is not true")
        if sc.get("allowPrivilegeEscalation") is not False:
            problem(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problem(f"{where}: readOnlyRootFilesystem is not true")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            problem(f"{where}: capabilities.drop is not [ALL]")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp != "RuntimeDefault":
            problem(f"{where}: seccompProfile is {seccomp}, not RuntimeDefault")
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            got = c.get(probe, {}).get("httpGet", {})
            if got.get("path") != path or got.get("port") != "metrics":
                problem(f"{where}: {probe} is {got}, not {path} on port metrics")
        if not c.get("resources", {}).get("requests"):
            problem(f"{where}: no resource requests")


def container(dep):
    return dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def assert_common(docs):
    dep = one(docs, "Deployment")
    if not dep:
        return None
    check_pss_restricted(dep)
    c = container(dep)
    args = c.get("args", [])
    if args[:1] != ["run"]:
        problem(f"operator args do not start with the run subcommand: {args}")
    metrics_port = c["ports"][0]["containerPort"]
    # all-on binds to IPv6 (operator.metricsBindAddress: "::"), in brackets.
    if not {f"--metrics-addr=0.0.0.0:{metrics_port}", f"--metrics-addr=[::]:{metrics_port}"} & set(args):
        problem(f"--metrics-addr does not match the metrics port {metrics_port}: {args}")
    env = env_of(c)
    if env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.namespace":
        problem("POD_NAMESPACE does not come from the downward API (metadata.namespace)")
    if "RUST_LOG" not in env:
        problem("no RUST_LOG")
    if not any(a.startswith("--sandbox-image=") for a in args):
        problem("no --sandbox-image")
    for cm in by_kind(docs, "ConfigMap"):
        for key, text in cm.get("data", {}).items():
            if key.endswith(".json"):
                if "__TRACE_VIEWER_URL__" in text:
                    problem(f"ConfigMap {cm['metadata']['name']}: the trace viewer placeholder was not filled in")
                json.loads(text)
    crds = {d["metadata"]["name"] for d in by_kind(docs, "CustomResourceDefinition")}
    return dep, c, args, env, crds


def assert_minimal(docs):
    kinds = sorted({d["kind"] for d in docs})
    if kinds != ["CustomResourceDefinition", "Deployment"] and kinds != ["Deployment"]:
        problem(f"minimal values render {kinds}, not only the Deployment (and the CRDs)")
    dep = one(docs, "Deployment")
    if not dep:
        return
    pod = dep["spec"]["template"]["spec"]
    if pod.get("serviceAccountName") != "platform-managed-basecamp":
        problem(f"the Deployment does not use serviceAccount.name: {pod.get('serviceAccountName')}")
    c = container(dep)
    if "--leader-elect" in c.get("args", []):
        problem("--leader-elect passed although leaderElection.enabled is false")
    for probe in ("livenessProbe", "readinessProbe"):
        if probe in c:
            problem(f"{probe} rendered although disabled")
    print(f"  minimal: {len(docs)} objects, {len(problems)} problems")


def cmd_assert(which, rendered):
    docs = load_docs(rendered)
    if which == "minimal":
        return assert_minimal(docs)
    got = assert_common(docs)
    if got is None:
        return
    dep, c, args, env, crds = got
    dashboards = [cm for cm in by_kind(docs, "ConfigMap") if cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    if len(dashboards) != 4:
        problem(f"expected 4 dashboard ConfigMaps labelled grafana_dashboard=1, found {len(dashboards)}")
    if which == "default":
        if dep["spec"]["replicas"] != 1:
            problem("default replicas is not 1")
        if "--leader-elect" not in args or "--lease-namespace=$(POD_NAMESPACE)" not in args:
            problem(f"leader election is not on by default: {args}")
        # Each release its own Lease (two in one namespace would wait on each other).
        if "--lease-name=release-name-basecamp-operator" not in args:
            problem(f"the Lease is not named after the release: {args}")
        if any(a.startswith("--namespaces") for a in args):
            problem("--namespaces is set although watchNamespaces is empty")
        if c["image"] != "basecamp:0.1.0" or "--sandbox-image=basecamp:0.1.0" not in args:
            problem(f"image/sandbox image do not default to basecamp:<appVersion>: {c['image']} {args}")
        cr = one(docs, "ClusterRole", "release-name-basecamp")
        if cr and rules_of(cr) != EXPECTED_NAMESPACED_RULES:
            problem(f"ClusterRole rules differ from the operator's needs: {sorted(rules_of(cr) ^ EXPECTED_NAMESPACED_RULES)}")
        one(docs, "ClusterRoleBinding", "release-name-basecamp")
        if by_kind(docs, "Role") and [r["metadata"]["name"] for r in by_kind(docs, "Role")] != ["release-name-basecamp-leader-election"]:
            problem(f"unexpected Roles: {[name_of(r) for r in by_kind(docs, 'Role')]}")
        for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "PodDisruptionBudget", "NetworkPolicy"):
            if by_kind(docs, kind):
                problem(f"{kind} is rendered although off by default")
        if env.get("RUST_LOG", {}).get("value") != "info,kube=warn":
            problem(f"RUST_LOG default is not info,kube=warn: {env.get('RUST_LOG')}")
        if any(k.startswith("AWS_") for k in env):
            problem(f"AWS_* env set although s3.* is empty: {sorted(k for k in env if k.startswith('AWS_'))}")
    else:
        if dep["spec"]["replicas"] != 2:
            problem("replicas is not 2")
        one(docs, "PodDisruptionBudget")
        if "--namespaces=agents-dev,agents-prod" not in args:
            problem(f"--namespaces does not list the watch namespaces: {args}")
        for flag in ("--s3-secret=sandbox-s3", "--job-ttl-seconds=86400", "--shard-retries=4"):
            if flag not in args:
                problem(f"{flag} not passed: {args}")
        if f"--metrics-addr=[::]:{c['ports'][0]['containerPort']}" not in args:
            problem(f"--metrics-addr is not operator.metricsBindAddress :: in brackets: {args}")
        if "--sandbox-image=registry.example.com/ml/basecamp-tools:2026.11" not in args:
            problem(f"--sandbox-image is not sandbox.image: {args}")
        # Sandbox pods pull the same images from the same registry.
        for flag in ("--sandbox-image-pull-secret=regcred", "--sandbox-image-pull-policy=Always"):
            if flag not in args:
                problem(f"{flag} not passed (imagePullSecrets, image.pullPolicy): {args}")
        if "--log-format=text" not in args or env["RUST_LOG"]["value"] != "info,basecamp_operator=debug,kube=warn":
            problem("log format/level not passed")
        if env.get("AWS_ENDPOINT_URL_S3", {}).get("value") != "http://minio.storage.svc:9000" or \
                env.get("AWS_REGION", {}).get("value") != "us-east-1":
            problem("S3 endpoint/region not passed")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            ref = env.get(key, {}).get("valueFrom", {}).get("secretKeyRef", {})
            if ref != {"name": "basecamp-s3", "key": key}:
                problem(f"{key} does not come from Secret basecamp-s3: {ref}")
        pod = dep["spec"]["template"]["spec"]
        for field in ("priorityClassName", "nodeSelector", "tolerations", "affinity", "imagePullSecrets",
                      "topologySpreadConstraints"):
            if not pod.get(field):
                problem(f"pod {field} not set")
        roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(docs, "Role")}
        for ns in ("agents-dev", "agents-prod"):
            role = roles.get((ns, "release-name-basecamp"))
            if not role:
                problem(f"no Role in watched namespace {ns}")
            elif rules_of(role) != EXPECTED_NAMESPACED_RULES:
                problem(f"Role in {ns} differs from the operator's needs")
            if not any(b["metadata"]["namespace"] == ns for b in by_kind(docs, "RoleBinding")):
                problem(f"no RoleBinding in watched namespace {ns}")
        if any(r["metadata"]["name"] == "release-name-basecamp" for r in by_kind(docs, "ClusterRole")):
            problem("a ClusterRole for tasks is rendered although watchNamespaces is a list")
        lease = roles.get(("basecamp", "release-name-basecamp-leader-election"))
        if not lease or rules_of(lease) != EXPECTED_LEASE_RULES:
            problem("the leader-election Role in the release namespace is missing or wrong")
        pm = one(docs, "PodMonitor")
        if pm:
            targets = {r.get("targetLabel") for r in pm["spec"]["podMetricsEndpoints"][0].get("relabelings", [])}
            if not {"task", "variant", "shard"} <= targets:
                problem(f"PodMonitor does not copy task/variant/shard pod labels: {targets}")
            if pm["spec"]["selector"]["matchLabels"] != {"app.kubernetes.io/name": "basecamp-sandbox"}:
                problem("PodMonitor does not select app.kubernetes.io/name=basecamp-sandbox")
            if pm["spec"]["namespaceSelector"] != {"matchNames": ["agents-dev", "agents-prod"]}:
                problem("PodMonitor does not select the watched namespaces")
        one(docs, "ServiceMonitor")
        netpol = one(docs, "NetworkPolicy")
        if netpol:
            ingress = netpol["spec"]["ingress"]
            if len(ingress) != 1 or ingress[0]["ports"] != [{"port": "metrics", "protocol": "TCP"}] or \
                    ingress[0].get("from") != [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]:
                problem(f"the operator NetworkPolicy does not admit only the monitoring namespace to the metrics port: {ingress}")
            if netpol["spec"]["egress"] != [{}]:
                problem(f"the operator NetworkPolicy does not allow all egress by default: {netpol['spec']['egress']}")
        rule = one(docs, "PrometheusRule")
        if rule:
            alerts = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
            need = {"BasecampOperatorDown", "BasecampReconcileErrors", "BasecampTaskCriteriaNotMet",
                    "BasecampShardsFailing", "BasecampEpisodesNotMeasured"}
            if not need <= alerts:
                problem(f"alerts missing: {sorted(need - alerts)}")
        for cm in dashboards:
            if cm["metadata"]["namespace"] != "monitoring":
                problem(f"dashboard ConfigMap {cm['metadata']['name']} not in grafana.dashboards.namespace")
            dash = json.loads(next(iter(cm["data"].values())))
            for var in dash["templating"]["list"]:
                if var["name"] == "traceviewer" and var["query"] != "https://basecamp.example.com/viewer":
                    problem(f"{cm['metadata']['name']}: traceviewer is {var['query']!r}, not grafana.traceViewerUrl "
                            "without its trailing slash")
    # Every ClusterRole/ClusterRoleBinding the operator gets is one of these.
    allowed = {"release-name-basecamp", "release-name-basecamp-nodes", "release-name-basecamp-view",
               "release-name-basecamp-edit"}
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        for d in by_kind(docs, kind):
            if d["metadata"]["name"] not in allowed:
                problem(f"unexpected {kind} {d['metadata']['name']}")
    nodes = one(docs, "ClusterRole", "release-name-basecamp-nodes")
    if nodes and rules_of(nodes) != EXPECTED_NODE_RULES:
        problem("the nodes ClusterRole grants more or less than nodes get/list/watch")
    print(f"  {which}: {len(docs)} objects, {len(problems)} problems")


# ---------------------------------------------------------------- names

# A Service's name is a DNS label (63); other objects' names DNS subdomains (253).
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def cmd_names(rendered):
    """What the API server would refuse or silently merge with a long release
    name: two objects of one kind and namespace with one name (the second
    overwrites the first), names and label values over their limits."""
    docs = load_docs(rendered)
    seen = {}
    for doc in docs:
        meta = doc.get("metadata", {})
        name = meta.get("name", "")
        group = doc.get("apiVersion", "").rpartition("/")[0]
        key = (group, doc.get("kind"), meta.get("namespace"), name)
        if key in seen:
            problem(f"{name_of(doc)}: rendered twice (the second overwrites the first)")
        seen[key] = doc
        if doc.get("kind") == "Service" and (len(name) > 63 or not DNS_LABEL.match(name)):
            problem(f"{name_of(doc)}: a Service name must be a DNS label of at most 63 characters ({len(name)})")
        elif len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            problem(f"{name_of(doc)}: not a DNS subdomain of at most 253 characters ({len(name)})")
        for key, value in (meta.get("labels") or {}).items():
            if len(str(value)) > 63:
                problem(f"{name_of(doc)}: label {key} is {len(str(value))} characters, over 63")
    print(f"  {len(docs)} objects, {len(seen)} distinct names")


# ---------------------------------------------------------------- documented flags

def cmd_readme_flags(rendered, readme):
    """Every flag of the rendered operator command line (ci/all-on-values.yaml
    passes them all), but operator.extraArgs, appears in the README's
    description of it."""
    dep = one(load_docs(rendered), "Deployment")
    if not dep:
        return
    with open(readme) as f:
        text = f.read()
    flags = {a.split("=", 1)[0] for a in container(dep).get("args", []) if a.startswith("--")}
    flags -= {"--example-flag"}  # ci/all-on-values.yaml's operator.extraArgs
    for flag in sorted(flags):
        if f"{flag}=" not in text and f"{flag} " not in text:
            problem(f"{readme}: the operator's command line does not mention {flag}, which the chart passes")
    print(f"  {len(flags)} flags, each in the README")


# ---------------------------------------------------------------- documented commands

# Flags of helm install/upgrade that helm template has no use for; the value
# says whether one takes an argument.
HELM_ONLY_FLAGS = {"--create-namespace": False, "--reuse-values": False, "--wait": False, "--atomic": False,
                   "--install": False, "--timeout": True}


def doc_commands(path):
    """(line, argv) of each `helm install` / `helm upgrade` in the ```sh
    blocks of a Markdown file, continuation lines joined."""
    import shlex
    commands, in_sh, pending, start = [], False, "", 0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                in_sh = not in_sh and stripped in ("```sh", "```bash", "```shell")
                continue
            if not in_sh:
                continue
            if not pending:
                start = number
            pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
            if stripped.endswith("\\"):
                continue
            command, pending = pending, ""
            if re.match(r"helm (install|upgrade) ", command):
                commands.append((start, shlex.split(command, comments=True)))
    return commands


def cmd_doc_commands(helm, root, *docs):
    """Renders each documented install/upgrade command as `helm template`
    with the same values, from the repository root (the commands name
    charts/basecamp): a value the chart does not take fails here, not for
    the user who copies it."""
    import subprocess
    n = 0
    for doc in docs:
        for line, argv in doc_commands(doc):
            n += 1
            args, rest = ["template"], iter(argv[2:])
            for arg in rest:
                flag = arg.split("=", 1)[0]
                if flag in HELM_ONLY_FLAGS:
                    if HELM_ONLY_FLAGS[flag] and "=" not in arg:
                        next(rest, None)
                    continue
                args.append(arg)
            where = f"{os.path.relpath(doc, root)}:{line}"
            result = subprocess.run([helm, *args], cwd=root, capture_output=True, text=True)
            if result.returncode != 0:
                problem(f"{where}: `{' '.join(argv)}` does not render: {result.stderr.strip()}")
            else:
                print(f"  ok {where}: {' '.join(argv)[:120]}")
    if n == 0:
        problem(f"no helm install/upgrade command found in {', '.join(docs)}")


# ---------------------------------------------------------------- CRD drift

def cmd_crd_drift(repo_dir, chart_dir):
    def yamls(d):
        return sorted(f for f in os.listdir(d) if f.endswith((".yaml", ".yml"))) if os.path.isdir(d) else []
    repo, chart = yamls(repo_dir), yamls(chart_dir)
    for f in sorted(set(repo) | set(chart)):
        if f not in chart:
            problem(f"{chart_dir}/{f} is missing (run scripts/chart-tools.sh sync-crds)")
        elif f not in repo:
            problem(f"{chart_dir}/{f} has no counterpart in {repo_dir} (run scripts/chart-tools.sh sync-crds)")
        else:
            with open(os.path.join(repo_dir, f), "rb") as a, open(os.path.join(chart_dir, f), "rb") as b:
                if a.read() != b.read():
                    problem(f"{chart_dir}/{f} differs from {repo_dir}/{f} (run scripts/chart-tools.sh sync-crds)")
    for f in chart:
        for doc in load_docs(os.path.join(chart_dir, f)):
            if doc.get("kind") != "CustomResourceDefinition":
                problem(f"{chart_dir}/{f}: holds a {doc.get('kind')}, not a CustomResourceDefinition")
    print(f"  {len(repo)} CRD files in {repo_dir}, {len(chart)} in {chart_dir}")


# ---------------------------------------------------------------- README

def cmd_readme(values_path, readme_path):
    with open(values_path) as f:
        values = yaml.safe_load(f)
    with open(readme_path) as f:
        text = f.read()
    section = text.split("\n## Values\n", 1)[-1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([^`]+)` \|", section, re.M))

    def leaves(node, prefix):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                yield from leaves(v, f"{prefix}.{k}" if prefix else k)
        else:
            yield prefix

    n = 0
    for path in leaves(values, ""):
        n += 1
        parts = path.split(".")
        # A row for the value itself, or for a multi-segment parent that is
        # documented as a whole (operator.resources, ...).
        if not any(".".join(parts[:i]) in rows for i in range(len(parts), 1, -1)) and path not in rows:
            problem(f"{readme_path}: value {path} has no row in the Values table")
    for row in rows:
        node = values
        for part in row.split("."):
            if not isinstance(node, dict) or part not in node:
                problem(f"{readme_path}: the Values table documents {row}, which values.yaml does not have")
                break
            node = node[part]
    print(f"  {n} values, {len(rows)} documented rows")


# ---------------------------------------------------------------- metrics contract
# The series the dashboards and alerts read: the operator's (operator/src/
# metrics.rs) and the sandbox's (sandbox-pod/src/metrics.rs), with the
# labels Prometheus adds (job, instance; namespace/pod and, through the
# chart's PodMonitor, task/variant/shard on sandbox series).

VARIANT = ("namespace", "task", "variant")
OPERATOR_TARGET = ("job", "instance")
SANDBOX_TARGET = ("job", "instance", "namespace", "pod", "container", "task", "variant", "shard")
CONTRACT = {
    # name: (type, labels, target labels)
    **{m: ("gauge", VARIANT, OPERATOR_TARGET) for m in (
        "basecamp_task_tool_call_accuracy", "basecamp_task_plan_step_f1", "basecamp_task_memory_consistency",
        "basecamp_task_error_rate", "basecamp_task_success_rate", "basecamp_task_resolution_seconds_p95",
        "basecamp_task_episodes", "basecamp_task_not_measured_episodes", "basecamp_task_criteria_met")},
    **{f"basecamp_checkpoint_{m}": ("gauge", VARIANT, OPERATOR_TARGET) for m in (
        "tool_call_accuracy", "plan_step_f1", "memory_consistency", "error_rate", "success_rate")},
    "basecamp_checkpoint_step": ("gauge", ("namespace", "task"), OPERATOR_TARGET),
    "basecamp_tasks": ("gauge", ("phase",), OPERATOR_TARGET),
    "basecamp_shards": ("gauge", VARIANT + ("state",), OPERATOR_TARGET),
    "basecamp_reconcile_duration_seconds": ("histogram", (), OPERATOR_TARGET),
    "basecamp_reconcile_errors_total": ("counter", ("category",), OPERATOR_TARGET),
    "basecamp_s3_operation_errors_total": ("counter", ("operation",), OPERATOR_TARGET),
    "basecamp_s3_operation_duration_seconds": ("histogram", ("operation",), OPERATOR_TARGET),
    "basecamp_sandbox_tool_call_duration_seconds": ("histogram", ("tool",), SANDBOX_TARGET),
    "basecamp_sandbox_tool_calls_total": ("counter", ("tool", "status"), SANDBOX_TARGET),
    "basecamp_sandbox_tool_timeouts_total": ("counter", ("tool",), SANDBOX_TARGET),
    "basecamp_sandbox_tool_fallbacks_total": ("counter", ("tool",), SANDBOX_TARGET),
    "basecamp_sandbox_rollbacks_total": ("counter", (), SANDBOX_TARGET),
    "basecamp_sandbox_injections_total": ("counter", ("trigger",), SANDBOX_TARGET),
    "basecamp_sandbox_episodes_total": ("counter", ("outcome",), SANDBOX_TARGET),
    "basecamp_sandbox_policy_errors_total": ("counter", ("category",), SANDBOX_TARGET),
    "basecamp_sandbox_waiting_for_policy": ("gauge", (), SANDBOX_TARGET),
    "basecamp_sandbox_policy_rate_limited_total": ("counter", (), SANDBOX_TARGET),
    "basecamp_sandbox_policy_requests_at_once_limit": ("gauge", (), SANDBOX_TARGET),
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                "unless", "le"}


def series_names(name):
    kind = CONTRACT[name][0]
    if kind == "histogram":
        return {f"{name}_bucket": name, f"{name}_sum": name, f"{name}_count": name}
    return {name: name}


def rule_exprs(paths):
    for path in paths:
        with open(path) as f:
            for group in yaml.safe_load(f)["groups"]:
                for rule in group["rules"]:
                    where = rule.get("labels", {}).get("source") or rule.get("alert") or rule.get("record")
                    yield path, where, str(rule["expr"])


def cmd_contract(*paths):
    known = {}
    for name in CONTRACT:
        known.update(series_names(name))
    n = 0
    for path, where, expr in rule_exprs(paths):
        n += 1
        # Strip string literals so label values are not read as names.
        bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
        used = set(re.findall(r"\bbasecamp_[a-z0-9_]+", bare))
        for metric in used:
            if metric not in known:
                problem(f"{path}: {where}: metric {metric} is not in the metrics contract")
        families = [known[m] for m in used if m in known]
        if not families:
            continue
        allowed = set(PROMQL_WORDS)
        for fam in families:
            _, labels, target = CONTRACT[fam]
            allowed.update(labels, target)
        for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", bare):
            for label in filter(None, (l.strip() for l in group.split(","))):
                if label not in allowed:
                    problem(f"{path}: {where}: label {label} is not a label of {sorted(set(families))}")
        for matchers in re.findall(r"\{([^}]*)\}", bare):
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers):
                if label not in allowed and label != "__name__":
                    problem(f"{path}: {where}: matcher on {label}, not a label of {sorted(set(families))}")
    print(f"  {n} expressions checked against {len(CONTRACT)} metric families")


def cmd_synth(out):
    """An hour of 15 s samples ending now, for every family of the contract:
    two variants (a, b) of task agents-dev/shipping, two tools, every state."""
    import time
    end = int(time.time()) // 15 * 15
    steps = range(end - 3600, end + 1, 15)
    lines = []
    op = {"job": "basecamp-metrics", "instance": "10.0.0.1:8080"}
    sb = {"job": "basecamp/basecamp-sandbox", "instance": "10.0.1.1:9090", "namespace": "agents-dev",
          "pod": "shipping-a-0-abcde", "container": "sandbox", "task": "shipping", "variant": "a", "shard": "0"}

    def fmt(labels):
        return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"

    def family(name, kind, series):
        lines.append(f"# TYPE {name} {kind}")
        for labels, value_at in series:
            sample_name = name + ("_total" if kind == "counter" else "")
            for i, t in enumerate(steps):
                lines.append(f"{sample_name}{fmt(labels)} {value_at(i)} {t}")

    def histogram(name, base, buckets, per_step):
        lines.append(f"# TYPE {name} histogram")
        for labels in base:
            for le in buckets + ["+Inf"]:
                frac = 1.0 if le == "+Inf" else min(1.0, float(le) / (float(buckets[-1]) * 0.8))
                for i, t in enumerate(steps):
                    lines.append(f"{name}_bucket{fmt(dict(labels, le=le))} {round(i * per_step * frac)} {t}")
            for i, t in enumerate(steps):
                lines.append(f"{name}_count{fmt(labels)} {i * per_step} {t}")
            for i, t in enumerate(steps):
                lines.append(f"{name}_sum{fmt(labels)} {i * per_step * 0.3} {t}")

    variants = [dict(op, namespace="agents-dev", task="shipping", variant=v) for v in ("a", "b")]
    gauges = {"tool_call_accuracy": 0.8, "plan_step_f1": 0.7, "memory_consistency": 0.9, "error_rate": 0.05,
              "success_rate": 0.75,
              "resolution_seconds_p95": 12.5, "episodes": 200, "not_measured_episodes": 4, "criteria_met": 1}
    for metric, value in gauges.items():
        family(f"basecamp_task_{metric}", "gauge",
               [(l, (lambda i, v=value, k=k: v * (1 - 0.1 * k))) for k, l in enumerate(variants)])
    # A checkpoint every 20 samples (5 minutes), 10 training steps apart.
    family("basecamp_checkpoint_step", "gauge",
           [(dict(op, namespace="agents-dev", task="shipping"), lambda i: 10 * (i // 20 + 1))])
    for metric, value in gauges.items():
        if metric in ("tool_call_accuracy", "plan_step_f1", "memory_consistency", "error_rate", "success_rate"):
            family(f"basecamp_checkpoint_{metric}", "gauge",
                   [(l, (lambda i, v=value, k=k: round(v * (0.5 + 0.02 * (i // 20)) * (1 - 0.1 * k), 4)))
                    for k, l in enumerate(variants)])
    family("up", "gauge", [(dict(op, namespace="basecamp"), lambda i: 1)])
    family("basecamp_tasks", "gauge", [(dict(op, phase=p), lambda i: 2) for p in ("Running", "Succeeded")])
    family("basecamp_shards", "gauge", [(dict(l, state=s), lambda i: 3) for l in variants
                                        for s in ("pending", "running", "succeeded", "failed")])
    histogram("basecamp_reconcile_duration_seconds", [op], ["0.01", "0.1", "1", "10"], 5)
    family("basecamp_reconcile_errors", "counter", [(dict(op, category="S3Unavailable"), lambda i: i)])
    family("basecamp_s3_operation_errors", "counter", [(dict(op, operation="get_object"), lambda i: i)])
    histogram("basecamp_s3_operation_duration_seconds", [dict(op, operation="get_object")], ["0.01", "0.1", "1"], 3)
    tools = [dict(sb, tool=t) for t in ("track_order", "lookup_user")]
    histogram("basecamp_sandbox_tool_call_duration_seconds", tools, ["0.01", "0.1", "1", "10"], 4)
    family("basecamp_sandbox_tool_calls", "counter",
           [(dict(t, status=s), lambda i: 2 * i) for t in tools for s in ("ok", "timeout", "fallback", "error")])
    for name in ("tool_timeouts", "tool_fallbacks"):
        family(f"basecamp_sandbox_{name}", "counter", [(t, lambda i: i) for t in tools])
    family("basecamp_sandbox_rollbacks", "counter", [(sb, lambda i: i // 4)])
    family("basecamp_sandbox_injections", "counter", [(dict(sb, trigger="at_step"), lambda i: i // 2)])
    family("basecamp_sandbox_episodes", "counter", [(dict(sb, outcome=o), lambda i: i) for o in ("completed", "error")])
    family("basecamp_sandbox_policy_errors", "counter", [(dict(sb, category="PolicyTimeout"), lambda i: i // 3)])
    family("basecamp_sandbox_waiting_for_policy", "gauge", [(sb, lambda i: 1)])
    family("basecamp_sandbox_policy_rate_limited", "counter", [(sb, lambda i: 3 * i)])
    family("basecamp_sandbox_policy_requests_at_once_limit", "gauge", [(sb, lambda i: 2)])
    lines.append("# EOF")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"  {len(lines)} lines, {len(steps)} samples per series, ending at {end} -> {out}")


def cmd_query(url, *paths):
    import urllib.parse
    import urllib.request
    n = 0
    for path, where, expr in rule_exprs(paths):
        n += 1
        q = urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=30) as r:
                body = json.load(r)
        except Exception as e:  # an HTTP 400 carries Prometheus' parse error
            detail = e.read().decode() if hasattr(e, "read") else str(e)
            problem(f"{path}: {where}: query failed: {detail[:300]}: {expr}")
            continue
        result = body.get("data", {}).get("result", [])
        if not result:
            problem(f"{path}: {where}: no data from series that follow the metrics contract: {expr}")
    print(f"  {n} queries returned data")


def main(argv):
    cmds = {"split": (cmd_split, 2), "monitoring": (cmd_monitoring, 1), "rules": (cmd_rules, 2),
            "dashboards": (cmd_dashboards, 2), "assert": (cmd_assert, 2), "names": (cmd_names, 1),
            "doc-commands": (cmd_doc_commands, -3), "readme-flags": (cmd_readme_flags, 2),            "crd-drift": (cmd_crd_drift, 2),
            "readme": (cmd_readme, 2), "contract": (cmd_contract, -1), "synth": (cmd_synth, 1),
            "query": (cmd_query, -2)}
    nargs = cmds[argv[1]][1] if len(argv) >= 2 and argv[1] in cmds else None
    if nargs is None or (len(argv) - 2 != nargs if nargs >= 0 else len(argv) - 2 < -nargs):
        print(__doc__, file=sys.stderr)
        return 2
    cmds[argv[1]][0](*argv[2:])
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
