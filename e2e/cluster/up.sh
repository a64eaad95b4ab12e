#!/usr/bin/env bash
# Start a Kubernetes control plane on loopback for Basecamp's e2e tests:
# etcd, kube-apiserver (Node,RBAC), kube-controller-manager, kube-scheduler and
# kwok with the fake GPU nodes of nodes.yaml. Binaries come from build.sh.
# Usage: e2e/cluster/up.sh [DIR]   (default ${TMPDIR:-/tmp}/basecamp-e2e)
# Writes DIR/kubeconfig and DIR/env (`source DIR/env` sets KUBECONFIG, PATH, ports,
# pids); stop with e2e/cluster/down.sh DIR.
# Env: BASECAMP_CACHE, BASECAMP_E2E_TIMEOUT (seconds per wait, default 120),
#      BASECAMP_E2E_KEEP_ON_FAILURE=1 (leave processes running if up.sh fails).
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

case "${1:-}" in -h | --help) sed -n '2,9p' "$0"; exit 0 ;; esac
DIR="${1:-${TMPDIR:-/tmp}/basecamp-e2e}"
WAIT="${BASECAMP_E2E_TIMEOUT:-120}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd -P)"
T_START="$(now_ms)"

for tool in openssl curl python3 base64 setsid; do
	command -v "$tool" >/dev/null || die "$tool is required but not on PATH"
done

# Already running? Reuse it when healthy, otherwise clean up what is left.
if [ -f "$DIR/env" ]; then
	# shellcheck disable=SC1091
	if (. "$DIR/env" && timeout 10 kubectl get --raw /readyz >/dev/null 2>&1); then
		log "cluster in $DIR is already up (source $DIR/env)"
		exit 0
	fi
	log "stale state in $DIR; stopping leftovers first"
	"$CLUSTER_SRC/down.sh" "$DIR" >&2
fi

# Binaries (a warm build.sh is a few seconds of version checks).
"$CLUSTER_SRC/build.sh" >"$DIR/build.out" 2>&1 || { cat "$DIR/build.out" >&2; die "build.sh failed (see above)"; }
KUBECTL="$K8S_BIN/kubectl"

rm -rf "$DIR/etcd" "$DIR/pki" "$DIR/logs" "$DIR/pids" "$DIR"/*.kubeconfig "$DIR/kubeconfig" "$DIR/env"
mkdir -p "$DIR/pki" "$DIR/logs" "$DIR/pids"
chmod 700 "$DIR/pki"

cleanup_on_error() {
	local rc=$?
	[ $rc -eq 0 ] && return
	echo "up.sh failed (exit $rc); last lines of the component logs in $DIR/logs:" >&2
	for f in "$DIR"/logs/*.log; do
		[ -s "$f" ] || continue
		case "$f" in */openssl.log) continue ;; esac
		echo "--- $f" >&2
		tail -n 15 "$f" >&2
	done
	if [ "${BASECAMP_E2E_KEEP_ON_FAILURE:-0}" != 1 ]; then
		"$CLUSTER_SRC/down.sh" "$DIR" >&2 || true
	fi
}
trap cleanup_on_error EXIT

# ---------------------------------------------------------------- ports
read -r ETCD_PORT ETCD_PEER_PORT API_PORT KCM_PORT SCHED_PORT KWOK_PORT <<<"$(pick_free_ports 6)"

# ---------------------------------------------------------------- PKI
PKI="$DIR/pki"
ossl() { openssl "$@" >>"$DIR/logs/openssl.log" 2>&1 || die "openssl $1 failed (see $DIR/logs/openssl.log)"; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 -subj "/CN=basecamp-e2e-ca" \
	-keyout "$PKI/ca.key" -out "$PKI/ca.crt"
# sign NAME SUBJECT [SAN]: an EC P-256 key and a CA-signed certificate.
sign() {
	local name="$1" subj="$2" san="${3:-}" ext="$PKI/$1.ext"
	if [ -n "$san" ]; then
		printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$san" >"$ext"
	else
		printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' >"$ext"
	fi
	ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" -keyout "$PKI/$name.key" -out "$PKI/$name.csr"
	ossl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 3650 -extfile "$ext" -out "$PKI/$name.crt"
}
sign apiserver "/CN=kube-apiserver" \
	"IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin "/O=system:masters/CN=basecamp-e2e-admin"
sign kube-controller-manager "/CN=system:kube-controller-manager"
sign kube-scheduler "/CN=system:kube-scheduler"
sign kwok "/O=system:masters/CN=kwok"
sign kwok-serving "/CN=kwok" "IP:127.0.0.1,DNS:localhost"
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
sign front-proxy-client "/CN=front-proxy-client"
# Service-account token signing key pair (RSA: RS256 tokens, what most clients expect).
ossl genrsa -out "$PKI/sa.key" 2048
ossl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"

# ---------------------------------------------------------------- kubeconfigs
b64() { base64 -w0 <"$1"; }
write_kubeconfig() { # FILE USER CERTNAME
	cat >"$1" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: basecamp-e2e
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(b64 "$PKI/$3.crt")
    client-key-data: $(b64 "$PKI/$3.key")
contexts:
- name: basecamp-e2e
  context:
    cluster: basecamp-e2e
    user: $2
    namespace: default
current-context: basecamp-e2e
KCFG
	chmod 600 "$1"
}
write_kubeconfig "$DIR/kubeconfig" basecamp-e2e-admin admin
write_kubeconfig "$DIR/kube-controller-manager.kubeconfig" system:kube-controller-manager kube-controller-manager
write_kubeconfig "$DIR/kube-scheduler.kubeconfig" system:kube-scheduler kube-scheduler
write_kubeconfig "$DIR/kwok.kubeconfig" kwok kwok
export KUBECONFIG="$DIR/kubeconfig"

# ---------------------------------------------------------------- processes
# start NAME BINARY ARGS...: runs in its own session, logs to DIR/logs/NAME.log.
start() {
	local name="$1"
	shift
	setsid "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
	echo $! >"$DIR/pids/$name"
	log "started $name (pid $!)"
}
alive() { kill -0 "$(cat "$DIR/pids/$1")" 2>/dev/null; }
# wait_for NAME DESCRIPTION COMMAND...: poll until COMMAND succeeds, NAME dies, or WAIT s pass.
wait_for() {
	local name="$1" what="$2" deadline=$((SECONDS + WAIT))
	shift 2
	until "$@" >/dev/null 2>&1; do
		alive "$name" || die "$name exited while waiting for $what (log: $DIR/logs/$name.log)"
		[ $SECONDS -lt $deadline ] || die "timed out after ${WAIT}s waiting for $what (log: $DIR/logs/$name.log)"
		sleep 0.5
	done
	log "$what ($(fmt_ms $(($(now_ms) - T_START))) since start)"
}
https_ok() { curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$1"; }
insecure_ok() { curl -fsSk --max-time 5 "$1"; }

start etcd "$ETCD_BIN/etcd" \
	--name=basecamp-e2e --data-dir="$DIR/etcd" \
	--listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster="basecamp-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
	--unsafe-no-fsync --log-level=warn
wait_for etcd "etcd healthy on 127.0.0.1:$ETCD_PORT" curl -fsS --max-time 5 "http://127.0.0.1:$ETCD_PORT/health"

start kube-apiserver "$K8S_BIN/kube-apiserver" \
	--etcd-servers="http://127.0.0.1:$ETCD_PORT" \
	--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
	--cert-dir="$PKI/apiserver-generated" \
	--tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
	--client-ca-file="$PKI/ca.crt" \
	--kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority="$PKI/ca.crt" \
	--authorization-mode=Node,RBAC \
	--requestheader-client-ca-file="$PKI/ca.crt" --requestheader-allowed-names=front-proxy-client \
	--requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
	--requestheader-extra-headers-prefix=X-Remote-Extra- \
	--proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
	--service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-cluster-ip-range=10.96.0.0/16 \
	--endpoint-reconciler-type=none \
	--allow-privileged=true --profiling=false --v=1
wait_for kube-apiserver "kube-apiserver /readyz on https://127.0.0.1:$API_PORT" https_ok "https://127.0.0.1:$API_PORT/readyz"

start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
	--kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
	--authentication-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
	--authorization-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
	--bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$PKI/kcm-generated" \
	--controllers='*' --use-service-account-credentials=true \
	--service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
	--cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
	--leader-elect=false --profiling=false --v=1
start kube-scheduler "$K8S_BIN/kube-scheduler" \
	--kubeconfig="$DIR/kube-scheduler.kubeconfig" \
	--authentication-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
	--authorization-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
	--bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --cert-dir="$PKI/scheduler-generated" \
	--leader-elect=false --profiling=false --v=1
start kwok "$KWOK_BIN/kwok" \
	--kubeconfig="$DIR/kwok.kubeconfig" --config="$CLUSTER_SRC/kwok-stages.yaml" \
	--manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
	--node-ip=127.0.0.1 --node-port="$KWOK_PORT" --server-address="127.0.0.1:$KWOK_PORT" \
	--tls-cert-file="$PKI/kwok-serving.crt" --tls-private-key-file="$PKI/kwok-serving.key" \
	--cidr=10.0.0.1/16 --node-lease-duration-seconds=40

# Nodes go in now; kwok marks them Ready while the controllers start.
"$KUBECTL" apply -f "$CLUSTER_SRC/nodes.yaml" >"$DIR/logs/nodes-apply.log" 2>&1 ||
	die "kubectl apply -f nodes.yaml failed: $(cat "$DIR/logs/nodes-apply.log")"
wait_for kube-controller-manager "kube-controller-manager /healthz" insecure_ok "https://127.0.0.1:$KCM_PORT/healthz"
wait_for kube-scheduler "kube-scheduler /healthz" insecure_ok "https://127.0.0.1:$SCHED_PORT/healthz"
wait_for kwok "kwok /healthz" insecure_ok "https://127.0.0.1:$KWOK_PORT/healthz"
# Pods need the default ServiceAccount (created by kube-controller-manager).
wait_for kube-controller-manager "ServiceAccount default/default" "$KUBECTL" get serviceaccount default -n default

all_nodes_ready() {
	local want have
	want="$(grep -c '^kind: Node' "$CLUSTER_SRC/nodes.yaml")"
	have="$("$KUBECTL" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$')"
	[ "$have" -ge "$want" ] &&
		# and untainted (node lifecycle may add not-ready taints until it sees Ready)
		[ -z "$("$KUBECTL" get nodes -o jsonpath='{.items[*].spec.taints}')" ]
}
wait_for kwok "all $(grep -c '^kind: Node' "$CLUSTER_SRC/nodes.yaml") nodes Ready and untainted" all_nodes_ready

# ---------------------------------------------------------------- env
{
	echo "# Basecamp e2e cluster, written by e2e/cluster/up.sh at $(date -u +%FT%TZ). source this file."
	printf 'export KUBECONFIG=%q\n' "$DIR/kubeconfig"
	# shellcheck disable=SC2016 # $PATH expands when env is sourced
	printf 'export PATH=%q:"$PATH"\n' "$K8S_BIN"
	printf 'export BASECAMP_E2E_DIR=%q\n' "$DIR"
	printf 'export BASECAMP_E2E_KUBECTL=%q\n' "$KUBECTL"
	printf 'export BASECAMP_E2E_API_SERVER=%q\n' "https://127.0.0.1:$API_PORT"
	printf 'export BASECAMP_E2E_CA=%q\n' "$PKI/ca.crt"
	for v in ETCD_PORT ETCD_PEER_PORT API_PORT KCM_PORT SCHED_PORT KWOK_PORT; do
		printf 'export BASECAMP_E2E_%s=%s\n' "$v" "${!v}"
	done
	for name in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do
		printf 'export BASECAMP_E2E_PID_%s=%s\n' "$(echo "$name" | tr 'a-z-' 'A-Z_')" "$(cat "$DIR/pids/$name")"
	done
} >"$DIR/env.tmp"
mv "$DIR/env.tmp" "$DIR/env"
trap - EXIT
echo "cluster ready in $(fmt_ms $(($(now_ms) - T_START))): API https://127.0.0.1:$API_PORT, $("$KUBECTL" get nodes --no-headers | wc -l) nodes"
echo "  source $DIR/env    # KUBECONFIG=$DIR/kubeconfig"
echo "  $CLUSTER_SRC/down.sh $DIR"
