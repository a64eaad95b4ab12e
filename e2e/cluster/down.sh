#!/usr/bin/env bash
# Stop the e2e cluster that up.sh started in DIR (pids from DIR/pids). Idempotent.
# Usage: e2e/cluster/down.sh [DIR] [--purge]   (default ${TMPDIR:-/tmp}/basecamp-e2e)
#   --purge also deletes DIR's generated state (etcd data, PKI, logs, kubeconfigs).
set -euo pipefail

DIR="" PURGE=0
for arg in "$@"; do
	case "$arg" in
	--purge) PURGE=1 ;;
	-h | --help) sed -n '2,4p' "$0"; exit 0 ;;
	*) DIR="$arg" ;;
	esac
done
DIR="${DIR:-${TMPDIR:-/tmp}/basecamp-e2e}"
if [ ! -d "$DIR" ]; then
	echo "nothing to stop: $DIR does not exist"
	exit 0
fi
DIR="$(cd "$DIR" && pwd -P)"

# ours PID: the process is alive and was started by up.sh for this DIR
# (its command line names DIR), so a recycled pid is never signalled.
ours() {
	[ -r "/proc/$1/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "$DIR/"
}

stopped=0
# Reverse start order: kwok and the controllers first, etcd last.
for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
	f="$DIR/pids/$name"
	[ -f "$f" ] || continue
	pid="$(cat "$f")"
	if [[ "$pid" =~ ^[0-9]+$ ]] && ours "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 50); do
			ours "$pid" || break
			sleep 0.2
		done
		if ours "$pid"; then
			echo "$name (pid $pid) ignored SIGTERM for 10s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.2
		fi
		echo "stopped $name (pid $pid)"
		stopped=$((stopped + 1))
	fi
	rm -f "$f"
done
rm -f "$DIR/env"
if [ "$PURGE" = 1 ]; then
	rm -rf "$DIR/etcd" "$DIR/pki" "$DIR/logs" "$DIR/pids" "$DIR"/*.kubeconfig "$DIR/kubeconfig" "$DIR/build.out"
	rmdir "$DIR" 2>/dev/null || true
fi
echo "e2e cluster in $DIR is down ($stopped process(es) stopped)"
