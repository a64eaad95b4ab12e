#!/usr/bin/env bash
# Lint and validate the Helm chart (charts/basecamp), offline. What
# `make chart-lint` and CI run.
#
#   scripts/chart-lint.sh [--keep] [--cluster]
#
# Checks, each reported PASS/FAIL (the script exits 1 when any fails):
#   crds          charts/basecamp/crds/ equals crds/ (fix: scripts/chart-tools.sh sync-crds)
#   generated     values.schema.json and dashboards/*.json equal what their
#                 generators in ci/gen/ write (edit the generators, rerun them)
#   lint          helm lint --strict, default values, ci/all-on-values.yaml and
#                 ci/minimal-values.yaml (everything optional off)
#   render        helm template --include-crds, the three values files
#   kubernetes    the rendered core objects and CRDs validated with
#                 kubernetes-validate --strict against Kubernetes 1.29 (the
#                 chart's kubeVersion floor) and 1.37
#   monitoring    ServiceMonitor / PodMonitor / PrometheusRule against strict
#                 schemas of their fields (ci/checks.py)
#   rules         promtool check rules on the rendered alerts, and
#                 promtool test rules (ci/rules-test.yaml): each alert fires
#                 on the series it is meant for
#   dashboards    dashboard structure and data links; every query (template
#                 variables substituted) parsed by promtool check rules
#   prometheus    every metric and label the dashboards and alerts use is in the
#                 metrics contract (ci/checks.py); then an hour of series that
#                 follow it is loaded into a real Prometheus (Debian's, on
#                 127.0.0.1, stopped at exit) and every dashboard query must
#                 return data
#   assertions    what each values file must render: RBAC rules exactly, PSS
#                 restricted, probes, leader election, watch namespaces, S3
#   names         with the longest release name Helm allows (53 characters)
#                 and ci/all-on-values.yaml: no two objects share a name, and
#                 names and label values fit the API server's limits
#   package       helm package, then the packaged chart renders exactly what the
#                 directory does (.helmignore leaves out nothing it needs)
#   notes         templates/NOTES.txt renders with each values file, with no
#                 "<no value>" and the next step (kubectl apply) in it
#   readme        every value in values.yaml has a row in the chart README's table,
#                 every flag the all-on Deployment passes the operator is in its
#                 command line there, and every `helm install|upgrade` in
#                 README.md and the chart README renders as `helm template`
#                 with the values it sets
#   schema        every ci/invalid/*.yaml fails helm template (and one helm
#                 lint) with the message its `# expect:` line names
#
# With --cluster, also against the live cluster of $KUBECONFIG (e.g. the e2e
# control plane: `source <dir>/env` after e2e/cluster/up.sh):
#   cluster       helm install into a fresh namespace that enforces the
#                 "restricted" Pod Security Standard, watching a second fresh
#                 namespace: the apiserver accepts every object and the CRDs;
#                 the Deployment's pods pass admission (and roll out on kwok
#                 nodes); the CRDs accept the example NOTES.txt points to
#                 (server dry run); `kubectl auth can-i` as the operator's
#                 ServiceAccount allows what it needs and refuses its
#                 neighbours (other namespaces, Secrets, deleting tasks). Then
#                 uninstall and delete both namespaces (the CRDs stay: Helm
#                 leaves CRDs on uninstall).
#
# Tools come from scripts/chart-tools.sh (built or installed once into
# ${BASECAMP_CACHE:-~/.cache/basecamp}/tools). --keep leaves the rendered
# files in the work directory it prints.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHART="$ROOT/charts/basecamp"
KEEP=0
CLUSTER=0
for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=1 ;;
    --cluster) CLUSTER=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "chart-lint: unknown argument $arg (--keep, --cluster)" >&2; exit 2 ;;
  esac
done

started=$SECONDS
# Assigned first: `eval "$(...)"` alone would hide a failed install.
TOOLS_ENV=$("$ROOT/scripts/chart-tools.sh" env) || { echo "chart-lint: the chart tools are not available (above)" >&2; exit 1; }
eval "$TOOLS_ENV"
echo "tools ready in $((SECONDS - started)) s: $HELM ($("$HELM" version --short 2>/dev/null)), $KUBERNETES_VALIDATE, $PROMTOOL"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/chart-lint.XXXXXX")
PROM_PID=""
cleanup() {
  [[ $(type -t cluster_cleanup) != function ]] || cluster_cleanup
  if [[ -n "$PROM_PID" ]]; then
    kill "$PROM_PID" 2>/dev/null || true
    wait "$PROM_PID" 2>/dev/null || true
  fi
  [[ $KEEP -eq 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT
[[ $KEEP -eq 0 ]] || echo "work directory: $WORK"

FAILED=()
check() {
  local name=$1
  shift
  echo "== $name"
  local t=$SECONDS
  if "$@"; then
    echo "PASS $name ($((SECONDS - t)) s)"
  else
    echo "FAIL $name ($((SECONDS - t)) s)"
    FAILED+=("$name")
  fi
}

checks() { "$KV_PYTHON" "$CHART/ci/checks.py" "$@"; }

# The two renderings every later check reads.
RELEASE_NS=basecamp
declare -A VALUES=([default]="" [all-on]="$CHART/ci/all-on-values.yaml" [minimal]="$CHART/ci/minimal-values.yaml")

crds() {
  shopt -s nullglob
  local generated=("$ROOT"/crds/*.yaml)
  if [[ ${#generated[@]} -eq 0 ]]; then
    echo "  crds/ holds no generated CRD YAML yet (make crds); the chart ships none either"
    checks crd-drift "$ROOT/crds" "$CHART/crds"
    return
  fi
  checks crd-drift "$ROOT/crds" "$CHART/crds"
}

generated() {
  local ok=0
  mkdir -p "$WORK/gen/dashboards"
  "$KV_PYTHON" "$CHART/ci/gen/schema.py" "$WORK/gen/values.schema.json" || return 1
  "$KV_PYTHON" "$CHART/ci/gen/dashboards.py" "$WORK/gen/dashboards" || return 1
  diff -u "$CHART/values.schema.json" "$WORK/gen/values.schema.json" ||
    { echo "  values.schema.json differs from ci/gen/schema.py's output: run python3 $CHART/ci/gen/schema.py"; ok=1; }
  diff -ru "$CHART/dashboards" "$WORK/gen/dashboards" ||
    { echo "  dashboards/ differ from ci/gen/dashboards.py's output: run python3 $CHART/ci/gen/dashboards.py"; ok=1; }
  return $ok
}

lint() {
  local ok=0
  local name args
  for name in "${!VALUES[@]}"; do
    args=(lint --strict "$CHART" --namespace "$RELEASE_NS")
    [[ -z "${VALUES[$name]}" ]] || args+=(-f "${VALUES[$name]}")
    "$HELM" "${args[@]}" || ok=1
  done
  return $ok
}

render() {
  local name args
  for name in "${!VALUES[@]}"; do
    args=(template release-name "$CHART" --namespace "$RELEASE_NS" --include-crds)
    [[ -z "${VALUES[$name]}" ]] || args+=(-f "${VALUES[$name]}")
    "$HELM" "${args[@]}" >"$WORK/$name.yaml" || return 1
    echo "  $name: $(grep -c '^kind:' "$WORK/$name.yaml") objects -> $WORK/$name.yaml"
    checks split "$WORK/$name.yaml" "$WORK/$name" || return 1
  done
}

kubernetes() {
  local ok=0 name version
  for name in "${!VALUES[@]}"; do
    for version in 1.29.0 1.37.0; do
      echo "  $name against Kubernetes $version"
      "$KUBERNETES_VALIDATE" --strict --quiet -k "$version" "$WORK/$name/core.yaml" || ok=1
    done
  done
  return $ok
}

monitoring() {
  local ok=0 name
  for name in "${!VALUES[@]}"; do
    checks monitoring "$WORK/$name.yaml" || ok=1
  done
  return $ok
}

rules() {
  checks rules "$WORK/all-on.yaml" "$WORK/rules.yaml" || return 1
  "$PROMTOOL" check rules "$WORK/rules.yaml" || return 1
  # promtool reads rule_files relative to the test file.
  cp "$CHART/ci/rules-test.yaml" "$WORK/rules-test.yaml"
  "$PROMTOOL" test rules "$WORK/rules-test.yaml"
}

dashboards() {
  checks dashboards "$CHART/dashboards" "$WORK/dashboard-queries.yaml" || return 1
  "$PROMTOOL" check rules "$WORK/dashboard-queries.yaml"
}

prometheus_check() {
  checks contract "$WORK/rules.yaml" "$WORK/dashboard-queries.yaml" || return 1
  local port
  checks synth "$WORK/synth.om" || return 1
  "$PROMTOOL" tsdb create-blocks-from openmetrics -q "$WORK/synth.om" "$WORK/tsdb" || return 1
  printf 'global:\n  scrape_interval: 1m\n' >"$WORK/prometheus.yml"
  port=$("$KV_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$PROMETHEUS" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$port" >"$WORK/prometheus.log" 2>&1 &
  PROM_PID=$!
  # Bounded wait: 300 x 0.1 s.
  local i
  for i in $(seq 300); do
    "$KV_PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/-/ready', timeout=1)" 2>/dev/null && break
    kill -0 "$PROM_PID" 2>/dev/null || { echo "  prometheus exited:"; tail -5 "$WORK/prometheus.log"; return 1; }
    sleep 0.1
  done
  [[ $i -lt 300 ]] || { echo "  prometheus not ready within 30 s"; return 1; }
  local ok=0
  checks query "http://127.0.0.1:$port" "$WORK/dashboard-queries.yaml" || ok=1
  kill "$PROM_PID" 2>/dev/null || true
  wait "$PROM_PID" 2>/dev/null || true
  PROM_PID=""
  return $ok
}

assertions() {
  local ok=0
  checks assert default "$WORK/default.yaml" || ok=1
  checks assert all-on "$WORK/all-on.yaml" || ok=1
  checks assert minimal "$WORK/minimal.yaml" || ok=1
  return $ok
}

# Names are cut to fit 63 characters in places; with a long release name a
# cut must not make two objects one.
names() {
  local release
  release=$(printf 'r%.0s' {1..53})
  "$HELM" template "$release" "$CHART" --namespace "$RELEASE_NS" -f "${VALUES[all-on]}" >"$WORK/long-name.yaml" || return 1
  checks names "$WORK/long-name.yaml"
}

package() {
  "$HELM" package "$CHART" --destination "$WORK/package" >/dev/null || return 1
  local tgz
  tgz=$(ls "$WORK"/package/basecamp-*.tgz)
  echo "  $(basename "$tgz"): $(tar tzf "$tgz" | wc -l) files, $(du -k "$tgz" | cut -f1) KiB"
  if tar tzf "$tgz" | grep -q '/ci/'; then
    echo "  FAIL the package holds ci/ files"; return 1
  fi
  "$HELM" template release-name "$tgz" --namespace "$RELEASE_NS" --include-crds -f "${VALUES[all-on]}" >"$WORK/package.yaml" || return 1
  diff -u "$WORK/all-on.yaml" "$WORK/package.yaml" >/dev/null ||
    { echo "  FAIL the packaged chart renders differently from charts/basecamp (see $WORK/package.yaml)"; return 1; }
}

# helm template skips NOTES.txt: render a copy of the chart in which the
# notes are the data of a ConfigMap.
notes() {
  local copy="$WORK/notes-chart" name args text ok=0
  rm -rf "$copy"
  cp -r "$CHART" "$copy"
  rm -f "$copy/templates/NOTES.txt"
  { echo '{{- define "basecamp.lint.notes" }}'; cat "$CHART/templates/NOTES.txt"; echo '{{- end }}'; } \
    >"$copy/templates/_lint_notes.tpl"
  printf '%s\n' 'apiVersion: v1' 'kind: ConfigMap' 'metadata: {name: notes}' 'data:' \
    '  NOTES.txt: {{ include "basecamp.lint.notes" . | toJson }}' >"$copy/templates/lint-notes.yaml"
  for name in "${!VALUES[@]}"; do
    args=(template release-name "$copy" --namespace "$RELEASE_NS" --show-only templates/lint-notes.yaml)
    [[ -z "${VALUES[$name]}" ]] || args+=(-f "${VALUES[$name]}")
    text=$("$HELM" "${args[@]}" | "$KV_PYTHON" -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["data"]["NOTES.txt"])') || return 1
    if grep -q "<no value>" <<<"$text"; then
      echo "  FAIL $name: NOTES.txt prints <no value>:"; grep -n "<no value>" <<<"$text"; ok=1
    elif ! grep -q "kubectl apply" <<<"$text"; then
      echo "  FAIL $name: NOTES.txt does not tell the user what to apply next"; ok=1
    else
      echo "  ok $name: $(wc -l <<<"$text") lines"
    fi
  done
  return $ok
}

readme() {
  local ok=0
  checks readme "$CHART/values.yaml" "$CHART/README.md" || ok=1
  checks readme-flags "$WORK/all-on.yaml" "$CHART/README.md" || ok=1
  checks doc-commands "$HELM" "$ROOT" "$ROOT/README.md" "$CHART/README.md" || ok=1
  return $ok
}

# Each ci/invalid/*.yaml names the error it must produce on its first line:
# `# expect: REGEX` (extended regex, matched against helm's stderr).
schema() {
  local ok=0 file expect err n=0
  shopt -s nullglob
  for file in "$CHART"/ci/invalid/*.yaml; do
    n=$((n + 1))
    expect=$(sed -n '1s/^# expect: //p' "$file")
    if [[ -z "$expect" ]]; then
      echo "  FAIL $file: its first line is not '# expect: REGEX'"
      ok=1
      continue
    fi
    if err=$("$HELM" template release-name "$CHART" -f "$file" 2>&1 >/dev/null); then
      echo "  FAIL $(basename "$file"): helm template accepted it"
      ok=1
    elif ! grep -Eq "$expect" <<<"$err"; then
      echo "  FAIL $(basename "$file"): the error does not match /$expect/:"
      sed 's/^/      /' <<<"$err"
      ok=1
    else
      echo "  ok $(basename "$file"): $(grep -E -m1 "$expect" <<<"$err" | cut -c1-200)"
    fi
  done
  [[ $n -gt 0 ]] || { echo "  FAIL no cases in $CHART/ci/invalid"; ok=1; }
  # helm lint reports the same schema errors (helm install runs the same
  # validation as helm template, but only once it reached a cluster).
  if err=$("$HELM" lint --strict "$CHART" -f "$CHART/ci/invalid/log-format.yaml" 2>&1); then
    echo "  FAIL helm lint accepted ci/invalid/log-format.yaml"
    ok=1
  elif ! grep -q "logFormat" <<<"$err"; then
    echo "  FAIL helm lint failed without naming logFormat: $err"
    ok=1
  else
    echo "  ok helm lint --strict refuses log-format.yaml too"
  fi
  return $ok
}

# Against a live cluster (--cluster): see the header.
cluster_check() {
  local kubectl
  kubectl=$(command -v kubectl || ls "${BASECAMP_CACHE:-$HOME/.cache/basecamp}"/k8s/*/bin/kubectl 2>/dev/null | tail -1) ||
    { echo "  kubectl is neither on PATH nor in the e2e cache"; return 1; }
  [[ -n "$kubectl" && -n "${KUBECONFIG:-}" ]] || { echo "  --cluster needs KUBECONFIG and kubectl"; return 1; }
  "$kubectl" get --raw /readyz >/dev/null || { echo "  the cluster of $KUBECONFIG is not ready"; return 1; }
  local suffix ns watched release sa ok=0
  suffix=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
  ns="chart-lint-$suffix"
  watched="chart-lint-$suffix-tasks"
  release="lint-$suffix"
  sa="$release-basecamp"
  CLUSTER_CLEANUP=("$kubectl" "$ns" "$watched" "$release")
  "$kubectl" create namespace "$ns" >/dev/null
  "$kubectl" label namespace "$ns" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/warn=restricted >/dev/null
  "$kubectl" create namespace "$watched" >/dev/null
  echo "  helm install $release into $ns (PSS restricted enforced), watching $watched"
  "$HELM" install "$release" "$CHART" --namespace "$ns" --kubeconfig "$KUBECONFIG" \
    --set "watchNamespaces={$watched}" --set operator.replicas=2 --timeout 2m >"$WORK/helm-install.log" 2>&1 ||
    { cat "$WORK/helm-install.log"; return 1; }
  # The apiserver's warnings (e.g. on CRD schemas) are worth seeing.
  sed -n -e 's/.*"\(Warning: .*\)"$/\1/p' -e 't' -e 's/.*\(Warning: .*\)$/\1/p' "$WORK/helm-install.log" |
    sed 's/\\"/"/g' | sort | uniq -c | sed 's/^ *\([0-9]*\) /  apiserver (x\1): /' || true
  # Pods pass Pod Security admission when the ReplicaSet can create them.
  local i pods=0
  for i in $(seq 60); do
    pods=$("$kubectl" -n "$ns" get pods -l "app.kubernetes.io/instance=$release" -o name | wc -l)
    [[ $pods -ge 2 ]] && break
    sleep 1
  done
  if [[ $pods -lt 2 ]]; then
    echo "  FAIL the Deployment's pods were not created within 60 s (Pod Security admission?):"
    "$kubectl" -n "$ns" get events --field-selector type=Warning -o custom-columns=REASON:.reason,MESSAGE:.message
    ok=1
  else
    echo "  ok $pods operator pods admitted under PSS restricted"
    # On kwok nodes the pods run and their probes pass (simulated); on a
    # cluster without nodes for them this only reports.
    if "$kubectl" -n "$ns" rollout status "deployment/$release-basecamp" --timeout=60s >/dev/null 2>&1; then
      echo "  ok deployment/$release-basecamp rolled out"
    else
      echo "  note: deployment/$release-basecamp did not become ready within 60 s (no nodes that run it?)"
    fi
  fi
  # What NOTES.txt tells the user to apply next is accepted by the CRDs.
  local example="$ROOT/examples/manifests/shipping-support.yaml"
  if [[ -f "$example" ]]; then
    if "$kubectl" apply --dry-run=server -n "$watched" -f "$example" >"$WORK/example.log" 2>&1; then
      echo "  ok the CRDs accept examples/manifests/shipping-support.yaml (server dry run)"
    else
      echo "  FAIL the CRDs refuse examples/manifests/shipping-support.yaml:"; sed 's/^/    /' "$WORK/example.log"; ok=1
    fi
  fi
  # The operator's rights as the authorizer sees them.
  local as=(--as "system:serviceaccount:$ns:$sa") verb resource where want got
  while read -r want verb resource where; do
    got=$("$kubectl" auth can-i "${as[@]}" "$verb" "$resource" ${where:+-n "$where"} 2>/dev/null || true)
    if [[ "$got" != "$want" ]]; then
      echo "  FAIL can-i $verb $resource ${where:+in $where}: $got, expected $want"
      ok=1
    fi
  done <<EOF_RIGHTS
yes watch harnesstasks.basecamp.dev $watched
yes patch harnesstasks.basecamp.dev $watched
yes patch harnesstasks.basecamp.dev/status $watched
yes update harnesstasks.basecamp.dev/finalizers $watched
yes list sandboxconfigs.basecamp.dev $watched
yes create jobs.batch $watched
yes delete configmaps $watched
yes get services $watched
yes watch services $watched
yes create networkpolicies.networking.k8s.io $watched
yes create events.events.k8s.io $watched
yes list nodes
yes update leases.coordination.k8s.io $ns
no patch harnesstasks.basecamp.dev default
no delete harnesstasks.basecamp.dev $watched
no update sandboxconfigs.basecamp.dev $watched
no get secrets $watched
no create pods $watched
no get services default
no create leases.coordination.k8s.io $watched
no update nodes
EOF_RIGHTS
  [[ $ok -ne 0 ]] || echo "  ok the operator's ServiceAccount may do what it needs and nothing checked beyond"
  cluster_cleanup
  return $ok
}

CLUSTER_CLEANUP=()
cluster_cleanup() {
  [[ ${#CLUSTER_CLEANUP[@]} -gt 0 ]] || return 0
  local kubectl=${CLUSTER_CLEANUP[0]} ns=${CLUSTER_CLEANUP[1]} watched=${CLUSTER_CLEANUP[2]} release=${CLUSTER_CLEANUP[3]}
  CLUSTER_CLEANUP=()
  "$HELM" uninstall "$release" --namespace "$ns" --kubeconfig "$KUBECONFIG" >/dev/null 2>&1 || true
  "$kubectl" delete namespace "$ns" "$watched" --wait=false >/dev/null 2>&1 || true
}

check crds crds
check generated generated
check lint lint
check render render
if [[ " ${FAILED[*]} " == *" render "* ]]; then
  echo "chart-lint: rendering failed; later checks need the rendered manifests" >&2
  exit 1
fi
check kubernetes kubernetes
check monitoring monitoring
check rules rules
check dashboards dashboards
check prometheus prometheus_check
check assertions assertions
check names names
check package package
check notes notes
check readme readme
check schema schema
if [[ $CLUSTER -eq 1 ]]; then
  check cluster cluster_check
fi

if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "chart-lint: FAILED: ${FAILED[*]} ($((SECONDS - started)) s)" >&2
  exit 1
fi
echo "chart-lint: all checks passed ($((SECONDS - started)) s)"
