#!/usr/bin/env bash
# Bounded self-test of the e2e cluster: up.sh, then
#   1. an Indexed Job (6 pods, nvidia.com/gpu: 1) with Basecamp's affinity for
#      compute capability >= 8.0 lands only on A100/H100 nodes;
#   2. a pod asking for >= 9.5 stays Pending with a FailedScheduling event;
#   3. the Job's pods are "played" to Succeeded, half through kwok's
#      annotation stage, half through a direct status patch, and the Job
#      controller counts 6 completions (Job Complete);
#   4. a pod played to Failed (exit code 3) fails its Job (backoffLimit 0);
# then down.sh. Usage: e2e/cluster/smoke.sh [DIR]  (default ${TMPDIR:-/tmp}/basecamp-e2e-smoke)
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

DIR="${1:-${TMPDIR:-/tmp}/basecamp-e2e-smoke}"
T=60 # seconds per wait
T0="$(now_ms)"
ok=0
finish() {
	local rc=$?
	if [ $rc -ne 0 ] || [ $ok -ne 1 ]; then
		echo "SMOKE FAILED (exit $rc); component logs kept in $DIR/logs" >&2
		if [ -n "${KUBECONFIG:-}" ] && [ -f "$KUBECONFIG" ]; then
			timeout 20 kubectl get nodes,pods,jobs -o wide >&2 || true
			timeout 20 kubectl get events --sort-by=.lastTimestamp >&2 || true
		fi
		"$CLUSTER_SRC/down.sh" "$DIR" >&2 || true
		[ $rc -ne 0 ] || rc=1
	else
		"$CLUSTER_SRC/down.sh" "$DIR" --purge
		echo "SMOKE PASSED in $(fmt_ms $(($(now_ms) - T0)))"
	fi
	exit $rc
}
trap finish EXIT

step() { log "== $*"; }
fail() { die "smoke: $*"; }

step "up.sh $DIR"
t="$(now_ms)"
"$CLUSTER_SRC/up.sh" "$DIR"
UP_MS=$(($(now_ms) - t))
# shellcheck disable=SC1091
. "$DIR/env"
k() { timeout 30 kubectl "$@"; }

# affinity MAJOR MINOR: Basecamp's node affinity for compute capability >= MAJOR.MINOR.
affinity() {
	cat <<AFF
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - {key: nvidia.com/gpu.compute.major, operator: Gt, values: ["$1"]}
            - matchExpressions:
              - {key: nvidia.com/gpu.compute.major, operator: In, values: ["$1"]}
              - {key: nvidia.com/gpu.compute.minor, operator: Gt, values: ["$(($2 - 1))"]}
AFF
}
job() { # NAME COMPLETIONS BACKOFF_LIMIT MAJOR MINOR
	cat <<JOB
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
spec:
  completionMode: Indexed
  completions: $2
  parallelism: $2
  backoffLimit: $3
  template:
    spec:
      restartPolicy: Never
$(affinity "$4" "$5")
      containers:
      - name: sandbox
        image: registry.invalid/basecamp-sandbox:e2e
        resources:
          limits:
            nvidia.com/gpu: "1"
JOB
}
# wait_until SECONDS DESCRIPTION COMMAND...
wait_until() {
	local deadline=$((SECONDS + $1)) what="$2"
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || fail "timed out after ${1}s: $what"
		sleep 0.5
	done
	log "ok: $what"
}
count_phase() { # SELECTOR PHASE
	kubectl get pods -l "$1" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c "^$2\$" || true
}
phase_is() { [ "$(count_phase "$1" "$2")" -eq "$3" ]; }

# ---- 1. >= 8.0 lands on A100/H100 only
step "Indexed Job cc80: 6 pods, nvidia.com/gpu: 1, compute capability >= 8.0"
job cc80 6 0 8 0 | k apply -f -
SEL=batch.kubernetes.io/job-name=cc80
wait_until $T "6 cc80 pods Running (kwok)" phase_is $SEL Running 6
echo "pod -> node (product, compute capability):"
bad=0
while read -r pod node; do
	read -r product major minor <<<"$(kubectl get node "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.product} {.metadata.labels.nvidia\.com/gpu\.compute\.major} {.metadata.labels.nvidia\.com/gpu\.compute\.minor}')"
	echo "  $pod -> $node ($product, $major.$minor)"
	case "$product" in NVIDIA-A100-SXM4-80GB | NVIDIA-H100-80GB-HBM3) ;; *) bad=1 ;; esac
	[ "$major" -ge 8 ] || bad=1
done < <(kubectl get pods -l $SEL -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}')
[ $bad -eq 0 ] || fail "a cc80 pod was scheduled onto a node below compute capability 8.0"
NODES_USED="$(kubectl get pods -l $SEL -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | tr '\n' ' ')"

# ---- 2. >= 9.5 stays Pending with FailedScheduling
step "Pod cc95: compute capability >= 9.5 must stay Pending"
{
	cat <<POD
apiVersion: v1
kind: Pod
metadata:
  name: cc95
spec:
  restartPolicy: Never
POD
	affinity 9 5 | sed "s/^    //"
	cat <<POD
  containers:
  - name: sandbox
    image: registry.invalid/basecamp-sandbox:e2e
    resources:
      limits:
        nvidia.com/gpu: "1"
POD
} | k apply -f -
failed_scheduling() {
	kubectl get events --field-selector involvedObject.kind=Pod,involvedObject.name=cc95,reason=FailedScheduling \
		-o jsonpath='{.items[0].message}' | grep -q .
}
wait_until $T "FailedScheduling event for cc95" failed_scheduling
echo "  event: $(kubectl get events --field-selector involvedObject.name=cc95,reason=FailedScheduling -o jsonpath='{.items[0].message}')"
[ "$(kubectl get pod cc95 -o jsonpath='{.status.phase}/{.spec.nodeName}')" = "Pending/" ] ||
	fail "cc95 is not Pending/unscheduled: $(kubectl get pod cc95 -o wide)"

# ---- 3. play the cc80 pods to Succeeded
step "play cc80 pods: indexes 0-2 via annotation e2e.basecamp.dev/phase=Succeeded, 3-5 via status patch"
now="$(date -u +%FT%TZ)"
for idx in 0 1 2 3 4 5; do
	pod="$(kubectl get pods -l "$SEL,batch.kubernetes.io/job-completion-index=$idx" -o jsonpath='{.items[0].metadata.name}')"
	if [ "$idx" -lt 3 ]; then
		k annotate pod "$pod" e2e.basecamp.dev/phase=Succeeded >/dev/null
	else
		k patch pod "$pod" --subresource=status --type=merge -p "$(printf '{"status":{"phase":"Succeeded","conditions":[{"type":"Ready","status":"False","reason":"PodCompleted"}],"containerStatuses":[{"name":"sandbox","image":"registry.invalid/basecamp-sandbox:e2e","imageID":"","ready":false,"restartCount":0,"started":false,"state":{"terminated":{"exitCode":0,"reason":"Completed","startedAt":"%s","finishedAt":"%s"}}}]}}' "$now" "$now")" >/dev/null
	fi
done
k wait --for=condition=Complete job/cc80 --timeout=${T}s
[ "$(kubectl get job cc80 -o jsonpath='{.status.succeeded}')" = 6 ] || fail "job cc80: .status.succeeded != 6"
echo "  job cc80: succeeded=$(kubectl get job cc80 -o jsonpath='{.status.succeeded}') completedIndexes=$(kubectl get job cc80 -o jsonpath='{.status.completedIndexes}')"

# ---- 4. a pod played to Failed fails its Job
step "Job fail1: pod played to Failed (exit code 3) via annotation"
job fail1 1 0 8 0 | k apply -f -
wait_until $T "fail1 pod Running" phase_is batch.kubernetes.io/job-name=fail1 Running 1
pod="$(kubectl get pods -l batch.kubernetes.io/job-name=fail1 -o jsonpath='{.items[0].metadata.name}')"
k annotate pod "$pod" e2e.basecamp.dev/exit-code=3 e2e.basecamp.dev/phase=Failed >/dev/null
k wait --for=condition=Failed job/fail1 --timeout=${T}s
code="$(kubectl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}')"
[ "$code" = 3 ] || fail "fail1 pod exit code is '$code', want 3"
echo "  job fail1: Failed ($(kubectl get job fail1 -o jsonpath='{.status.conditions[?(@.type=="Failed")].reason}')), pod exit code $code"

ok=1
echo "smoke summary: up.sh ready in $(fmt_ms $UP_MS); cc80 pods on: $NODES_USED; cc95 Pending+FailedScheduling; cc80 Complete (6/6); fail1 Failed"
