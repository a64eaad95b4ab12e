#!/usr/bin/env bash
# Build (once) and cache the e2e control-plane binaries from pinned Go modules:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok.
# Binaries land in ${BASECAMP_CACHE:-$HOME/.cache/basecamp}/{k8s,etcd,kwok}/<version>/bin/.
# A warm run only checks that each binary exists and reports the pinned version.
# Usage: e2e/cluster/build.sh [--force]
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

FORCE=0
for arg in "$@"; do
	case "$arg" in
	--force) FORCE=1 ;;
	-h | --help) sed -n '2,7p' "$0"; exit 0 ;;
	*) die "unknown argument: $arg" ;;
	esac
done

command -v go >/dev/null || die "the Go toolchain (go >= 1.26) is not on PATH"

# Go caches live under the Basecamp cache so rebuilds are incremental and
# independent of the user's GOPATH. GOTOOLCHAIN=local: never download a toolchain.
export GOMODCACHE="$BASECAMP_CACHE/go/mod"
export GOCACHE="$BASECAMP_CACHE/go/build"
export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-modcacherw -buildvcs=false -mod=readonly"
mkdir -p "$BASECAMP_CACHE" "$K8S_BIN" "$ETCD_BIN" "$KWOK_BIN" "$BASECAMP_CACHE/logs"

# One build at a time per cache (tests may call this concurrently).
exec 9>"$BASECAMP_CACHE/.build.lock"
if ! flock -n 9; then
	log "another build.sh holds $BASECAMP_CACHE/.build.lock; waiting (up to 60 min)"
	flock -w 3600 9 || die "timed out waiting for $BASECAMP_CACHE/.build.lock"
fi

# The pins in versions.env must be the ones in the committed go.mod files.
check_pin() { # gomod module version
	grep -Eq "^[[:space:]]*(require[[:space:]]+)?$2[[:space:]]+$3([[:space:]]|$)" "$CLUSTER_SRC/$1" ||
		die "$1 does not pin $2 $3 (versions.env and go.mod disagree)"
}
check_pin go/k8s/go.mod k8s.io/kubernetes "$K8S_VERSION"
check_pin go/etcd/go.mod go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check_pin go/kwok/go.mod sigs.k8s.io/kwok "$KWOK_VERSION"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
if grep -E '=>[[:space:]]*k8s\.io/[a-z0-9-]+[[:space:]]+v' "$CLUSTER_SRC/go/k8s/go.mod" | grep -v "[[:space:]]$STAGING_VERSION\$" >&2; then
	die "go/k8s/go.mod: every k8s.io staging module must be replaced by $STAGING_VERSION (lines above)"
fi

# Version stamps, as Kubernetes' own build sets them (fixed date: reproducible).
k8s_ldflags() {
	local minor v p
	v="$K8S_VERSION"
	minor="$(echo "$v" | cut -d. -f2)"
	p="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		p="$p -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		p="$p -X $pkg.gitTreeState=clean -X $pkg.buildDate=2026-01-01T00:00:00Z"
	done
	echo "$p"
}

SUMMARY=()
# build_one NAME MODULE_DIR PACKAGE OUT_DIR LDFLAGS MODULE@VERSION
build_one() {
	local name="$1" moddir="$CLUSTER_SRC/$2" pkg="$3" outdir="$4" ldflags="$5" modver="$6"
	local out="$outdir/$name" logf="$BASECAMP_CACHE/logs/build-$name.log" t0 t1
	if [ "$FORCE" = 0 ] && binary_ok "$out" "$name"; then
		SUMMARY+=("$(printf '%-24s cached   %s' "$name" "$out")")
		return 0
	fi
	log "building $name from $pkg ($modver) ... (log: $logf)"
	t0="$(now_ms)"
	if ! (cd "$moddir" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp.$$" "$pkg") >"$logf" 2>&1; then
		rm -f "$out.tmp.$$"
		printf 'ERROR: building %s failed\n  package: %s\n  module:  %s (go.mod: %s/go.mod)\n  go:      %s\n--- last 40 lines of %s ---\n' \
			"$name" "$pkg" "$modver" "$moddir" "$(go version)" "$logf" >&2
		tail -n 40 "$logf" >&2
		exit 1
	fi
	mv -f "$out.tmp.$$" "$out"
	t1="$(now_ms)"
	if ! binary_ok "$out" "$name"; then
		# shellcheck disable=SC2046
		die "$out was built but '$name $(version_cmd "$name")' does not report '$(expected_version "$name")': $("$out" $(version_cmd "$name") 2>&1 | head -3)"
	fi
	SUMMARY+=("$(printf '%-24s built in %-8s %s' "$name" "$(fmt_ms $((t1 - t0)))" "$out")")
	log "built $name in $(fmt_ms $((t1 - t0)))"
}

T0="$(now_ms)"
K8S_LD="$(k8s_ldflags)"
build_one etcd go/etcd go.etcd.io/etcd/server/v3 "$ETCD_BIN" "-s -w" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	build_one "$b" go/k8s "k8s.io/kubernetes/cmd/$b" "$K8S_BIN" "$K8S_LD" "k8s.io/kubernetes@$K8S_VERSION"
done
build_one kwok go/kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_BIN" "-s -w" "sigs.k8s.io/kwok@$KWOK_VERSION"

echo "e2e control-plane binaries (cache: $BASECAMP_CACHE):"
printf '  %s\n' "${SUMMARY[@]}"
echo "total: $(fmt_ms $(($(now_ms) - T0)))"
