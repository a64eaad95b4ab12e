#!/usr/bin/env bash
# Bounded self-test of the e2e cluster: up.sh, then
#   0. the literal affinity term `minor Gt -1` (for >= 8.0) is rejected by the
#      API server ("-1" is not a valid label value): for MINOR = 0 Basecamp must
#      emit `major In [M]` alone as the second term;
#   1. a Pod (nvidia.com/gpu: 1) with Basecamp's affinity for compute
#      capability >= 8.0 lands on an A100/H100 node, and an Indexed Job of
#      8 pods x 4 GPUs fills exactly the two A100 and two H100 nodes;
#   2. a pod asking for >= 9.5 stays Pending with a FailedScheduling event;
#   3. the Job's pods are "played" to Succeeded, half through kwok's
#      annotation stage, half through a direct status patch, and the Job
#      controller counts 8 completions (Job Complete);
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

# affinity MAJOR MINOR [literal]: Basecamp's node affinity for compute capability
# >= MAJOR.MINOR: term `major Gt MAJOR` OR term `major In [MAJOR]` AND
# `minor Gt MINOR-1`. For MINOR = 0 the API server REJECTS `minor Gt -1`
# ("-1" is not a valid label value), so the second term is then `major In
# [MAJOR]` alone (same meaning). Pass "literal" to get the rejected form.
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
AFF
	if [ "$2" -gt 0 ] || [ "${3:-}" = literal ]; then
		echo "              - {key: nvidia.com/gpu.compute.minor, operator: Gt, values: [\"$(($2 - 1))\"]}"
	fi
}
job() { # NAME COMPLETIONS BACKOFF_LIMIT MAJOR MINOR GPUS [literal]
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
$(affinity "$4" "$5" "${7:-}")
      containers:
      - name: sandbox
        image: registry.invalid/basecamp-sandbox:e2e
        resources:
          limits:
            nvidia.com/gpu: "$6"
JOB
}
pod() { # NAME MAJOR MINOR: a Pod asking for 1 GPU of compute capability >= MAJOR.MINOR
	cat <<POD
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels:
    smoke: $1
spec:
  restartPolicy: Never
$(affinity "$2" "$3" | sed "s/^    //")
  containers:
  - name: sandbox
    image: registry.invalid/basecamp-sandbox:e2e
    resources:
      limits:
        nvidia.com/gpu: "1"
POD
}
# wait_until SECONDS DESCRIPTION COMMAND...
wait_until() {
	local secs="$1" what="$2"
	local deadline=$((SECONDS + secs))
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || fail "timed out after ${secs}s: $what"
		sleep 0.5
	done
	log "ok: $what"
}
count_phase() { # SELECTOR PHASE
	kubectl get pods -l "$1" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c "^$2\$" || true
}
phase_is() { [ "$(count_phase "$1" "$2")" -eq "$3" ]; }

# ---- 0. the literal `minor Gt -1` form is rejected
step "Job cc80-literal: 'nvidia.com/gpu.compute.minor Gt -1' must be rejected by the API server"
if out="$(job cc80-literal 1 0 8 0 1 literal | k apply --dry-run=server -f - 2>&1)"; then
	fail "the API server accepted 'minor Gt -1' (expected a validation error): $out"
fi
echo "$out" | grep -q 'Invalid value: "-1"' || fail "unexpected error for 'minor Gt -1': $out"
echo "  rejected as expected: ${out:0:160}..."

# ---- 1. >= 8.0 lands on A100/H100 only
# pod_nodes SELECTOR: "pod node" lines; check_cc8 SELECTOR: all on A100/H100 nodes.
pod_nodes() { kubectl get pods -l "$1" -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}'; }
check_cc8() {
	local bad=0 pod node product major minor
	echo "  pod -> node (product, compute capability):"
	while read -r pod node; do
		read -r product major minor <<<"$(kubectl get node "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.product} {.metadata.labels.nvidia\.com/gpu\.compute\.major} {.metadata.labels.nvidia\.com/gpu\.compute\.minor}')"
		echo "    $pod -> $node ($product, $major.$minor)"
		case "$product" in NVIDIA-A100-SXM4-80GB | NVIDIA-H100-80GB-HBM3) ;; *) bad=1 ;; esac
		[ "${major:-0}" -ge 8 ] || bad=1
	done < <(pod_nodes "$1")
	[ $bad -eq 0 ] || fail "a pod ($1) was scheduled onto a node below compute capability 8.0"
}

step "Pod cc80-pod: nvidia.com/gpu: 1, compute capability >= 8.0"
pod cc80-pod 8 0 | k apply -f -
wait_until $T "cc80-pod Running (kwok)" phase_is smoke=cc80-pod Running 1
check_cc8 smoke=cc80-pod
k delete pod cc80-pod --wait=true --timeout=${T}s >/dev/null

step "Indexed Job cc80: 8 pods x nvidia.com/gpu: 4 (= every GPU with compute capability >= 8.0)"
job cc80 8 0 8 0 4 | k apply -f -
SEL=batch.kubernetes.io/job-name=cc80
wait_until $T "8 cc80 pods Running (kwok)" phase_is $SEL Running 8
check_cc8 $SEL
NODES_USED="$(pod_nodes $SEL | awk '{print $2}' | sort -u | tr '\n' ' ')"
[ "$NODES_USED" = "kwok-a100-0 kwok-a100-1 kwok-h100-0 kwok-h100-1 " ] ||
	fail "cc80 pods should fill exactly the A100 and H100 nodes, got: $NODES_USED"

# ---- 2. >= 9.5 stays Pending with FailedScheduling
step "Pod cc95: compute capability >= 9.5 must stay Pending"
pod cc95 9 5 | k apply -f -
failed_scheduling() {
	kubectl get events --field-selector involvedObject.kind=Pod,involvedObject.name=cc95,reason=FailedScheduling \
		-o jsonpath='{.items[0].message}' | grep -q .
}
wait_until $T "FailedScheduling event for cc95" failed_scheduling
echo "  event: $(kubectl get events --field-selector involvedObject.name=cc95,reason=FailedScheduling -o jsonpath='{.items[0].message}')"
[ "$(kubectl get pod cc95 -o jsonpath='{.status.phase}/{.spec.nodeName}')" = "Pending/" ] ||
	fail "cc95 is not Pending/unscheduled: $(kubectl get pod cc95 -o wide)"

# ---- 3. play the cc80 pods to Succeeded
step "play cc80 pods: indexes 0-3 via annotation e2e.basecamp.dev/phase=Succeeded, 4-7 via status patch"
phase_is $SEL Running 8 || fail "cc80 pods left Running on their own (kwok must not complete pods until played)"
now="$(date -u +%FT%TZ)"
for idx in 0 1 2 3 4 5 6 7; do
	pod="$(kubectl get pods -l "$SEL,batch.kubernetes.io/job-completion-index=$idx" -o jsonpath='{.items[0].metadata.name}')"
	if [ "$idx" -lt 4 ]; then
		k annotate pod "$pod" e2e.basecamp.dev/phase=Succeeded >/dev/null
	else
		k patch pod "$pod" --subresource=status --type=merge -p "$(printf '{"status":{"phase":"Succeeded","conditions":[{"type":"Ready","status":"False","reason":"PodCompleted"}],"containerStatuses":[{"name":"sandbox","image":"registry.invalid/basecamp-sandbox:e2e","imageID":"","ready":false,"restartCount":0,"started":false,"state":{"terminated":{"exitCode":0,"reason":"Completed","startedAt":"%s","finishedAt":"%s"}}}]}}' "$now" "$now")" >/dev/null
	fi
done
k wait --for=condition=Complete job/cc80 --timeout=${T}s
[ "$(kubectl get job cc80 -o jsonpath='{.status.succeeded}')" = 8 ] || fail "job cc80: .status.succeeded != 8"
echo "  job cc80: succeeded=$(kubectl get job cc80 -o jsonpath='{.status.succeeded}') completedIndexes=$(kubectl get job cc80 -o jsonpath='{.status.completedIndexes}')"

# ---- 4. a pod played to Failed fails its Job
step "Job fail1: pod played to Failed (exit code 3) via annotation"
job fail1 1 0 8 0 1 | k apply -f -
wait_until $T "fail1 pod Running" phase_is batch.kubernetes.io/job-name=fail1 Running 1
pod="$(kubectl get pods -l batch.kubernetes.io/job-name=fail1 -o jsonpath='{.items[0].metadata.name}')"
k annotate pod "$pod" e2e.basecamp.dev/exit-code=3 e2e.basecamp.dev/phase=Failed >/dev/null
k wait --for=condition=Failed job/fail1 --timeout=${T}s
code="$(kubectl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}')"
[ "$code" = 3 ] || fail "fail1 pod exit code is '$code', want 3"
echo "  job fail1: Failed ($(kubectl get job fail1 -o jsonpath='{.status.conditions[?(@.type=="Failed")].reason}')), pod exit code $code"

ok=1
echo "smoke summary: up.sh ready in $(fmt_ms $UP_MS); cc80 pods on: $NODES_USED; cc95 Pending+FailedScheduling; cc80 Complete (8/8); fail1 Failed"
