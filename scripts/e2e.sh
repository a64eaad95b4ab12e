#!/usr/bin/env bash
# End-to-end tests of Basecamp against a real Kubernetes control plane
# (etcd + kube-apiserver with RBAC + controller-manager + scheduler, kwok GPU
# nodes), a real S3 server (s3s-fs) and the real binaries, all on 127.0.0.1.
#
#   scripts/e2e.sh [PYTEST ARGS...]      e.g. scripts/e2e.sh -k gpu
#
# 1. builds what is missing: the cluster binaries (e2e/cluster/build.sh,
#    cached), helm and s3s-fs (cached), and basecamp-operator,
#    basecamp-sandbox and basecamp (cargo, default target dir);
# 2. starts the cluster (e2e/cluster/up.sh) and s3s-fs with a bucket;
# 3. runs the scenarios in e2e/ with pytest (e2e/README.md says what each
#    checks): the chart installed with helm, the operator run here as the
#    chart's ServiceAccount, sandbox pods played by the real basecamp-sandbox.
# Everything started is stopped on exit (a trap), pass or fail.
#
# Environment:
#   BASECAMP_E2E_WORK      state directory (default ${TMPDIR:-/tmp}/basecamp-e2e-run)
#   BASECAMP_E2E_KEEP=1    keep the cluster and S3 running after the tests
#   BASECAMP_E2E_BENCH=1   also run the 1,000-task operator benchmark (e2e/bench_operator.py,
#                          writes bench/results/operator.json); `-k scale` runs only it
#   E2E_TIMEOUT            overall bound in seconds for pytest (default 2400)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="${BASECAMP_E2E_WORK:-${TMPDIR:-/tmp}/basecamp-e2e-run}"
CLUSTER_DIR="$WORK/cluster"
S3_DATA="$WORK/s3"
E2E_TIMEOUT="${E2E_TIMEOUT:-2400}"
T0=$SECONDS

log() { printf '[e2e %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The test driver's Python modules (pytest, boto3, requests, PyYAML).
if ! python3 -c 'import pytest, boto3, requests, yaml' 2>/dev/null; then
	log "installing the e2e driver's Python modules (pytest boto3 requests pyyaml)"
	python3 -m pip install --quiet pytest boto3 requests pyyaml || die "cannot install pytest boto3 requests pyyaml with pip"
fi

# stop_recorded: the operator, sandboxes and prometheus the tests started (pids in
# $WORK/pids, written by e2e/conftest.py), in case pytest was killed first.
stop_recorded() {
	local f pid pids=()
	for f in "$WORK"/pids/*; do
		[ -f "$f" ] || continue
		pid="$(cat "$f")"
		case "$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" in
		*basecamp-operator* | *basecamp-sandbox* | *prometheus*) kill "$pid" 2>/dev/null && pids+=("$pid") ;;
		esac
		rm -f "$f"
	done
	# A sandbox on SIGTERM still flushes and uploads; 10 s, then SIGKILL.
	local deadline=$((SECONDS + 10)) alive
	while :; do
		alive=0
		for pid in "${pids[@]}"; do ! kill -0 "$pid" 2>/dev/null || alive=1; done
		if [ $alive -eq 0 ] || [ $SECONDS -ge $deadline ]; then break; fi
		sleep 0.5
	done
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
	local rc=$?
	if [ "${BASECAMP_E2E_KEEP:-0}" = 1 ]; then
		log "BASECAMP_E2E_KEEP=1: leaving the cluster ($CLUSTER_DIR) and S3 ($S3_DATA) running"
	else
		stop_recorded
		[ ! -f "$S3_DATA.s3s-fs.pid" ] || scripts/s3-server.sh stop "$S3_DATA" >/dev/null 2>&1 || true
		if [ "$rc" -eq 0 ]; then
			e2e/cluster/down.sh "$CLUSTER_DIR" --purge >/dev/null 2>&1 || true
		else
			e2e/cluster/down.sh "$CLUSTER_DIR" >/dev/null 2>&1 || true
			log "logs kept: $CLUSTER_DIR/logs, $WORK/operator*.log, $WORK/play/"
		fi
	fi
	log "e2e $([ "$rc" -eq 0 ] && echo PASSED || echo "FAILED (exit $rc)") in $((SECONDS - T0)) s"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$WORK"
# A previous run's leftovers (a kept cluster, an S3 server) are stopped first.
stop_recorded
[ ! -f "$S3_DATA.s3s-fs.pid" ] || scripts/s3-server.sh stop "$S3_DATA" >/dev/null 2>&1 || true
e2e/cluster/down.sh "$CLUSTER_DIR" --purge >/dev/null 2>&1 || true
rm -rf "$S3_DATA" "$WORK/play"

log "build: cluster binaries (cached), helm, s3s-fs"
t=$SECONDS
timeout 3600 e2e/cluster/build.sh
timeout 1800 scripts/chart-tools.sh install helm >/dev/null
timeout 1200 scripts/s3-server.sh install >/dev/null
log "build: basecamp-operator, basecamp-sandbox, basecamp (cargo)"
timeout 3600 cargo build --quiet -p basecamp-operator -p basecamp-sandbox -p basecamp-cli
BUILD_S=$((SECONDS - t))
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
export BASECAMP_E2E_BIN="$TARGET_DIR/debug"
for bin in basecamp-operator basecamp-sandbox basecamp; do
	[ -x "$BASECAMP_E2E_BIN/$bin" ] || die "$BASECAMP_E2E_BIN/$bin was not built"
done
if [ "${BASECAMP_E2E_BENCH:-}" = 1 ]; then
	# The benchmark measures what ships: the operator's release build.
	log "build: basecamp-operator --release (for the benchmark)"
	timeout 3600 cargo build --quiet --release -p basecamp-operator
	export BASECAMP_E2E_OPERATOR_BIN="$TARGET_DIR/release/basecamp-operator"
fi

log "cluster: up.sh $CLUSTER_DIR"
t=$SECONDS
BASECAMP_E2E_TIMEOUT=180 timeout 600 e2e/cluster/up.sh "$CLUSTER_DIR"
UP_S=$((SECONDS - t))
# shellcheck disable=SC1091
. "$CLUSTER_DIR/env"

log "s3: s3s-fs on 127.0.0.1 with bucket basecamp-e2e"
mkdir -p "$S3_DATA/basecamp-e2e"
S3_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
eval "$(scripts/s3-server.sh start "$S3_PORT" "$S3_DATA" basecamp basecamp-secret)"
export BASECAMP_E2E_S3_ENDPOINT="$S3_ENDPOINT" BASECAMP_E2E_S3_BUCKET=basecamp-e2e
export BASECAMP_E2E_S3_ACCESS_KEY=basecamp BASECAMP_E2E_S3_SECRET_KEY=basecamp-secret
export BASECAMP_E2E_WORK="$WORK" BASECAMP_E2E_ROOT="$ROOT"
BASECAMP_E2E_HELM="$(scripts/chart-tools.sh path helm)"
export BASECAMP_E2E_HELM
BASECAMP_E2E_PROMETHEUS="$(scripts/chart-tools.sh path prometheus 2>/dev/null || true)"
export BASECAMP_E2E_PROMETHEUS

# For reruns against a kept cluster: . "$WORK/env" && python3 -m pytest e2e -k ...
{
	echo ". '$CLUSTER_DIR/env'"
	for var in BASECAMP_E2E_S3_ENDPOINT BASECAMP_E2E_S3_BUCKET BASECAMP_E2E_S3_ACCESS_KEY BASECAMP_E2E_S3_SECRET_KEY \
		BASECAMP_E2E_WORK BASECAMP_E2E_ROOT BASECAMP_E2E_HELM BASECAMP_E2E_PROMETHEUS BASECAMP_E2E_BIN; do
		printf 'export %s=%q\n' "$var" "${!var}"
	done
} >"$WORK/env"

log "ready after $((SECONDS - T0)) s (builds ${BUILD_S} s, up.sh ${UP_S} s); running e2e/ with pytest"
set +e
timeout --kill-after=30 "$E2E_TIMEOUT" python3 -m pytest e2e -p no:cacheprovider -v -rA --durations=0 "$@"
rc=$?
set -e
[ $rc -ne 124 ] || log "pytest ran past E2E_TIMEOUT=${E2E_TIMEOUT}s"
exit $rc
