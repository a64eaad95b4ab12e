# Shared helpers for e2e/cluster/*.sh (sourced, not executed).
# shellcheck shell=bash

CLUSTER_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$CLUSTER_SRC/versions.env"

BASECAMP_CACHE="${BASECAMP_CACHE:-$HOME/.cache/basecamp}"
# shellcheck disable=SC2034 # used by the scripts that source this file
K8S_BIN="$BASECAMP_CACHE/k8s/$K8S_VERSION/bin"
# shellcheck disable=SC2034
ETCD_BIN="$BASECAMP_CACHE/etcd/$ETCD_VERSION/bin"
# shellcheck disable=SC2034
KWOK_BIN="$BASECAMP_CACHE/kwok/$KWOK_VERSION/bin"

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# now_ms: wall clock in milliseconds.
now_ms() { date +%s%3N; }

# fmt_ms MS: "12.3s"
fmt_ms() { awk -v ms="$1" 'BEGIN { printf "%.1fs", ms / 1000 }'; }

# Expected `--version` output fragment for each binary.
expected_version() {
	case "$1" in
	kube-apiserver | kube-controller-manager | kube-scheduler) echo "Kubernetes $K8S_VERSION" ;;
	kubectl) echo "Client Version: $K8S_VERSION" ;;
	etcd) echo "etcd Version: ${ETCD_VERSION#v}" ;;
	kwok) echo "${KWOK_VERSION}" ;;
	*) return 1 ;;
	esac
}

version_cmd() {
	case "$1" in
	kubectl) echo "version --client" ;;
	*) echo "--version" ;;
	esac
}

# binary_ok PATH NAME: the binary exists and reports the pinned version.
binary_ok() {
	local path="$1" name="$2" out want
	[ -x "$path" ] || return 1
	want="$(expected_version "$name")"
	# shellcheck disable=SC2046
	out="$(timeout 20 "$path" $(version_cmd "$name") 2>&1)" || return 1
	case "$out" in *"$want"*) return 0 ;; *) return 1 ;; esac
}

# pick_free_ports N: prints N distinct free TCP ports on 127.0.0.1.
pick_free_ports() {
	python3 - "$1" <<'PY'
import socket, sys
n = int(sys.argv[1]); socks = []; ports = []
for _ in range(n):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s); ports.append(s.getsockname()[1])
for s in socks: s.close()
print(" ".join(map(str, ports)))
PY
}
