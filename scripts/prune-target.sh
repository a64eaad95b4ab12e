#!/usr/bin/env bash
# Keeps the shared cargo target directory from growing without bound.
#
# Every change to a crate's code or features builds its test and bench
# executables under a new hash; cargo never removes the old ones, and they
# are the bulk of the directory (100-400 MB each). For every executable name
# this keeps the newest build and deletes the older ones. Libraries stay:
# different feature sets of one crate legitimately coexist under different
# hashes. Deleting a build cargo still wanted costs a rebuild, never a wrong
# result: cargo rebuilds any output that is missing.
#
# Two targets may share a name (tests/run.rs of two packages are both
# `run-<hash>`), so an executable is known by its name and the crate root its
# dep-info file (`<name>-<hash>.d`, beside it) names first.
#
# Usage: scripts/prune-target.sh [TARGET_DIR]   (default: $CARGO_TARGET_DIR)
set -euo pipefail
target="${1:-${CARGO_TARGET_DIR:?set CARGO_TARGET_DIR or pass the target directory}}"
[[ -d "$target" ]] || exit 0

freed=0
removed=0
for dir in "$target"/{debug,release}/{deps,examples}; do
  [[ -d "$dir" ]] || continue
  # Executables are named <crate>-<16 hex digits>, without an extension.
  # Newest first; the first of each name is kept.
  declare -A seen=()
  while IFS= read -r -d '' line; do
    path="${line#* }"
    file="${path##*/}"
    [[ "${file##*-}" =~ ^[0-9a-f]{16}$ ]] || continue
    root=""
    if [[ -f "$path.d" ]]; then
      read -r _ root _ <"$path.d" || true
    fi
    stem="${file%-*} $root"
    if [[ -n "${seen[$stem]:-}" ]]; then
      size=$(stat -c %s "$path")
      rm -f "$path" "$path.d"
      freed=$((freed + size))
      removed=$((removed + 1))
    else
      seen[$stem]=1
    fi
  done < <(find "$dir" -maxdepth 1 -type f -perm -u+x ! -name '*.*' -printf '%T@ %p\0' | sort -z -rn)
  unset seen
done
echo "prune-target: removed $removed stale executables, $((freed / 1024 / 1024)) MiB, from $target"
