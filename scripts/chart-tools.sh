#!/usr/bin/env bash
# The tools that check the Helm chart (charts/basecamp), built or installed
# once into the Basecamp cache and keyed by version, so a second run takes
# seconds.
#
#   scripts/chart-tools.sh install [helm|validate|promtool ...]
#       Install what is missing (all three when no name is given):
#         helm      built from its Go module (helm.sh/helm/v3/cmd/helm@$HELM_VERSION)
#                   into $CACHE/tools/helm-$HELM_VERSION-k1.37/helm
#         validate  kubernetes-validate $KV_VERSION (PyPI) in a venv at
#                   $CACHE/tools/kubernetes-validate-$KV_VERSION; it carries
#                   the Kubernetes OpenAPI schemas, so it validates offline
#         promtool  Debian's `prometheus` package (promtool and the prometheus
#                   server) when either is absent
#   scripts/chart-tools.sh path helm|validate|promtool|prometheus
#       Print the tool's path (fails when it is not installed).
#   scripts/chart-tools.sh env
#       Print HELM=..., KUBERNETES_VALIDATE=..., KV_PYTHON=... (a Python
#       with PyYAML and jsonschema), PROMTOOL=..., PROMETHEUS=... lines for
#       `eval "$(scripts/chart-tools.sh env)"` (installs what is missing).
#   scripts/chart-tools.sh sync-crds
#       Copy the generated CRDs (crds/*.yaml) into the chart
#       (charts/basecamp/crds/), removing chart CRDs that no longer exist.
#       `make crds` should run it after regenerating crds/;
#       scripts/chart-lint.sh fails when the two folders differ.
#
# $CACHE is ${BASECAMP_CACHE:-$HOME/.cache/basecamp}. GOMODCACHE and GOCACHE
# for the helm build live there too ($CACHE/go/mod, $CACHE/go/build), so the
# build neither reads nor fills the user's Go caches. $BASECAMP_HELM,
# $BASECAMP_KUBERNETES_VALIDATE, $BASECAMP_PROMTOOL and $BASECAMP_PROMETHEUS
# point at an existing binary instead.
set -euo pipefail

HELM_VERSION=v3.22.0
# The Kubernetes version helm assumes without a cluster (helm template,
# lint): its client-go's, v0.37 -> 1.37, as helm's own Makefile stamps it.
# Unstamped, `go install` leaves 1.20, older than the chart's kubeVersion.
HELM_KUBE_MAJOR=1
HELM_KUBE_MINOR=37
KV_VERSION=1.37.0
CACHE_DIR="${BASECAMP_CACHE:-$HOME/.cache/basecamp}"
TOOLS="$CACHE_DIR/tools"
HELM_BIN="${BASECAMP_HELM:-$TOOLS/helm-$HELM_VERSION-k$HELM_KUBE_MAJOR.$HELM_KUBE_MINOR/helm}"
KV_VENV="$TOOLS/kubernetes-validate-$KV_VERSION"
KV_BIN="${BASECAMP_KUBERNETES_VALIDATE:-$KV_VENV/bin/kubernetes-validate}"
PROMTOOL_BIN="${BASECAMP_PROMTOOL:-$(command -v promtool || echo /usr/bin/promtool)}"
PROMETHEUS_BIN="${BASECAMP_PROMETHEUS:-$(command -v prometheus || echo /usr/bin/prometheus)}"

die() { echo "chart-tools.sh: $*" >&2; exit 1; }
log() { echo "chart-tools.sh: $*" >&2; }

install_helm() {
  if [[ -x "$HELM_BIN" ]]; then
    return 0
  fi
  [[ -z "${BASECAMP_HELM:-}" ]] || die "BASECAMP_HELM=$BASECAMP_HELM is not an executable file"
  command -v go >/dev/null || die "go is not on PATH; helm $HELM_VERSION is built from its Go module"
  local dir started=$SECONDS
  dir=$(dirname "$HELM_BIN")
  mkdir -p "$dir" "$CACHE_DIR/go/mod" "$CACHE_DIR/go/build"
  log "building helm $HELM_VERSION into $dir (3 to 15 minutes on 2 cores, once)"
  # GOBIN into a temporary directory first: an interrupted build never
  # leaves a half-written binary at the cached path.
  local tmp
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  GOMODCACHE="$CACHE_DIR/go/mod" GOCACHE="$CACHE_DIR/go/build" GOBIN="$tmp" \
    GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 \
    go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$HELM_KUBE_MAJOR \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM_KUBE_MINOR \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$HELM_KUBE_MAJOR \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM_KUBE_MINOR" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" || { rm -rf "$tmp"; die "go install helm $HELM_VERSION failed"; }
  mv "$tmp/helm" "$HELM_BIN"
  rm -rf "$tmp"
  log "built $HELM_BIN in $((SECONDS - started)) s"
}

install_validate() {
  if [[ -x "$KV_BIN" ]]; then
    return 0
  fi
  [[ -z "${BASECAMP_KUBERNETES_VALIDATE:-}" ]] ||
    die "BASECAMP_KUBERNETES_VALIDATE=$BASECAMP_KUBERNETES_VALIDATE is not an executable file"
  command -v python3 >/dev/null || die "python3 is not on PATH; kubernetes-validate is a Python package"
  local started=$SECONDS
  mkdir -p "$TOOLS"
  log "installing kubernetes-validate $KV_VERSION into $KV_VENV"
  # A venv's scripts name their interpreter by absolute path, so it is built
  # in place; a failed install removes it so the next run starts clean.
  rm -rf "$KV_VENV"
  python3 -m venv "$KV_VENV" && "$KV_VENV/bin/pip" install --quiet --disable-pip-version-check \
    "kubernetes-validate==$KV_VERSION" ||
    { rm -rf "$KV_VENV"; die "pip install kubernetes-validate==$KV_VERSION failed"; }
  log "installed $KV_BIN in $((SECONDS - started)) s"
}

install_promtool() {
  if [[ -x "$PROMTOOL_BIN" && -x "$PROMETHEUS_BIN" ]]; then
    return 0
  fi
  [[ -z "${BASECAMP_PROMTOOL:-}" || -x "$PROMTOOL_BIN" ]] ||
    die "BASECAMP_PROMTOOL=$BASECAMP_PROMTOOL is not an executable file"
  [[ -z "${BASECAMP_PROMETHEUS:-}" || -x "$PROMETHEUS_BIN" ]] ||
    die "BASECAMP_PROMETHEUS=$BASECAMP_PROMETHEUS is not an executable file"
  log "promtool or prometheus is missing: installing Debian's prometheus package"
  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  # The package installs a service but does not start it here (no init in
  # containers); chart-lint starts its own server on loopback.
  "${sudo[@]}" apt-get install -y --no-install-recommends prometheus >&2 ||
    { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends prometheus >&2; } ||
    die "apt-get install prometheus failed; install it and set BASECAMP_PROMTOOL / BASECAMP_PROMETHEUS"
  PROMTOOL_BIN=$(command -v promtool) || die "prometheus installed but promtool is not on PATH"
  PROMETHEUS_BIN=$(command -v prometheus) || die "prometheus installed but prometheus is not on PATH"
}

tool_path() {
  case "$1" in
    helm) [[ -x "$HELM_BIN" ]] || die "helm is not installed: run $0 install helm"; echo "$HELM_BIN" ;;
    validate) [[ -x "$KV_BIN" ]] || die "kubernetes-validate is not installed: run $0 install validate"; echo "$KV_BIN" ;;
    promtool) [[ -x "$PROMTOOL_BIN" ]] || die "promtool is not installed: run $0 install promtool"; echo "$PROMTOOL_BIN" ;;
    prometheus) [[ -x "$PROMETHEUS_BIN" ]] || die "prometheus is not installed: run $0 install promtool"; echo "$PROMETHEUS_BIN" ;;
    *) die "unknown tool '$1' (helm, validate, promtool, prometheus)" ;;
  esac
}

# One installer at a time per cache: concurrent chart-lint runs wait here
# instead of building the same tool twice into the same place.
lock_tools() {
  mkdir -p "$TOOLS"
  exec 9>"$TOOLS/.install.lock"
  if ! flock -n 9; then
    log "another chart-tools.sh is installing into $TOOLS; waiting (up to 30 min)"
    flock -w 1800 9 || die "timed out waiting for $TOOLS/.install.lock"
  fi
}

cmd_install() {
  local names=("$@")
  [[ ${#names[@]} -gt 0 ]] || names=(helm validate promtool)
  if [[ ! -x "$HELM_BIN" || ! -x "$KV_BIN" || ! -x "$PROMTOOL_BIN" || ! -x "$PROMETHEUS_BIN" ]]; then
    lock_tools
  fi
  for name in "${names[@]}"; do
    case "$name" in
      helm) install_helm ;;
      validate) install_validate ;;
      promtool) install_promtool ;;
      *) die "unknown tool '$name' (helm, validate, promtool)" ;;
    esac
  done
}

cmd_env() {
  cmd_install
  echo "HELM=$(tool_path helm)"
  echo "KUBERNETES_VALIDATE=$(tool_path validate)"
  local kv_python
  kv_python="$(dirname "$(tool_path validate)")/python"
  [[ -x "$kv_python" ]] || kv_python=$(command -v python3)
  echo "KV_PYTHON=$kv_python"
  echo "PROMTOOL=$(tool_path promtool)"
  echo "PROMETHEUS=$(tool_path prometheus)"
}

cmd_sync_crds() {
  local root src dst
  root=$(cd "$(dirname "$0")/.." && pwd)
  src="$root/crds"
  dst="$root/charts/basecamp/crds"
  mkdir -p "$dst"
  shopt -s nullglob
  local generated=("$src"/*.yaml)
  [[ ${#generated[@]} -gt 0 ]] || die "$src holds no CRD YAML yet (make crds generates it); nothing to copy"
  local f
  for f in "$dst"/*.yaml; do
    [[ -f "$src/$(basename "$f")" ]] || { rm -f "$f"; echo "removed $f"; }
  done
  for f in "${generated[@]}"; do
    cmp -s "$f" "$dst/$(basename "$f")" || { cp "$f" "$dst/"; echo "copied $(basename "$f") into $dst"; }
  done
}

case "${1:-}" in
  install) shift; cmd_install "$@" ;;
  path) [[ $# -eq 2 ]] || die "usage: $0 path helm|validate|promtool|prometheus"; tool_path "$2" ;;
  env) cmd_env ;;
  sync-crds) cmd_sync_crds ;;
  *) die "usage: $0 install [helm|validate|promtool ...] | path helm|validate|promtool|prometheus | env | sync-crds" ;;
esac
