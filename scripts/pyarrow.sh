#!/usr/bin/env bash
# pyarrow in a venv of its own, the independent Parquet reader the tests of
# `basecamp data preprocess --format parquet` check the batches with
# (cli/tests/preprocess.rs). Installed once into the Basecamp cache, keyed
# by version, so a second run takes a moment.
#
#   scripts/pyarrow.sh install
#       Create $CACHE/tools/pyarrow-$PYARROW_VERSION (a venv with pyarrow
#       from PyPI) unless it is already there. Idempotent.
#   scripts/pyarrow.sh path
#       Print the venv's python (fails when it is not installed).
#
# $CACHE is ${BASECAMP_CACHE:-$HOME/.cache/basecamp}. Tests find the python
# through $BASECAMP_PYARROW_PYTHON or the cache path above, and fail (not
# skip) without it, saying to run `make test-deps`, which runs this script.
set -euo pipefail

PYARROW_VERSION=26.0.1
CACHE_DIR="${BASECAMP_CACHE:-$HOME/.cache/basecamp}"
TOOLS="$CACHE_DIR/tools"
VENV="$TOOLS/pyarrow-$PYARROW_VERSION"
PYTHON="${BASECAMP_PYARROW_PYTHON:-$VENV/bin/python}"

die() { echo "pyarrow.sh: $*" >&2; exit 1; }
log() { echo "pyarrow.sh: $*" >&2; }

# Installed means the python imports this pyarrow, not only that a venv exists.
installed() {
  [[ -x "$PYTHON" ]] && "$PYTHON" -c "import pyarrow, sys; sys.exit(pyarrow.__version__ != '$PYARROW_VERSION')" 2>/dev/null
}

cmd_install() {
  if installed; then
    log "pyarrow $PYARROW_VERSION already installed: $PYTHON"
    return 0
  fi
  [[ -z "${BASECAMP_PYARROW_PYTHON:-}" ]] ||
    die "BASECAMP_PYARROW_PYTHON=$BASECAMP_PYARROW_PYTHON does not import pyarrow $PYARROW_VERSION"
  command -v python3 >/dev/null || die "python3 is not on PATH; pyarrow is a Python package"
  mkdir -p "$TOOLS"
  # One installer at a time per cache (the lock chart-tools.sh takes too).
  exec 9>"$TOOLS/.install.lock"
  if ! flock -n 9; then
    log "another installer is writing into $TOOLS; waiting (up to 30 min)"
    flock -w 1800 9 || die "timed out waiting for $TOOLS/.install.lock"
  fi
  if installed; then
    return 0
  fi
  local started=$SECONDS
  log "installing pyarrow $PYARROW_VERSION into $VENV"
  # A venv's scripts name their interpreter by absolute path, so it is built
  # in place; a failed install removes it so the next run starts clean.
  rm -rf "$VENV"
  python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: \
    "pyarrow==$PYARROW_VERSION" ||
    { rm -rf "$VENV"; die "pip install pyarrow==$PYARROW_VERSION failed"; }
  installed || { rm -rf "$VENV"; die "pyarrow $PYARROW_VERSION installed but does not import"; }
  log "installed pyarrow $PYARROW_VERSION ($PYTHON) in $((SECONDS - started)) s"
}

cmd_path() {
  installed || die "pyarrow $PYARROW_VERSION is not installed at $VENV: run $0 install (or make test-deps)"
  echo "$PYTHON"
}

case "${1:-}" in
  install) cmd_install ;;
  path) cmd_path ;;
  *) die "usage: $0 install | path" ;;
esac
