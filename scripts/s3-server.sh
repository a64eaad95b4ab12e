#!/usr/bin/env bash
# A real S3-compatible server (s3s-fs from crates.io) on loopback, for tests
# and local runs. The binary is built once into the Basecamp cache.
#
#   scripts/s3-server.sh install
#       Build s3s-fs 0.14.1 into $BASECAMP_CACHE/s3s-fs (default
#       ~/.cache/basecamp/s3s-fs) unless it is already there. Idempotent.
#   scripts/s3-server.sh path
#       Print the binary's path (fails when it is not installed).
#   scripts/s3-server.sh start PORT DATA_DIR [ACCESS_KEY] [SECRET_KEY]
#       Start it in the background on 127.0.0.1:PORT serving DATA_DIR (each
#       directory in it is a bucket: `mkdir DATA_DIR/my-bucket`), wait until
#       it accepts connections, and print `S3_ENDPOINT=http://127.0.0.1:PORT`
#       and `S3_PID=<pid>` (so `eval "$(scripts/s3-server.sh start ...)"`
#       works). Keys default to basecamp / basecamp-secret. Pid and log go
#       to DATA_DIR.s3s-fs.pid and DATA_DIR.s3s-fs.log.
#   scripts/s3-server.sh stop DATA_DIR
#       Stop the server started for DATA_DIR.
#
# Tests find the binary through $BASECAMP_S3S_FS or the cache path above;
# CI runs `scripts/s3-server.sh install` before `cargo test`.
set -euo pipefail

S3S_FS_VERSION=0.14.1
CACHE_DIR="${BASECAMP_CACHE:-$HOME/.cache/basecamp}"
ROOT="$CACHE_DIR/s3s-fs"
BIN="${BASECAMP_S3S_FS:-$ROOT/bin/s3s-fs}"

die() { echo "s3-server.sh: $*" >&2; exit 1; }

installed_version_ok() {
  [[ -x "$BIN" ]] || return 1
  # cargo records what it installed; a binary without the record (e.g. set
  # through BASECAMP_S3S_FS) is trusted as is.
  if [[ -f "$ROOT/.crates.toml" && "$BIN" == "$ROOT/bin/s3s-fs" ]]; then
    grep -q "s3s-fs $S3S_FS_VERSION " "$ROOT/.crates.toml"
  fi
}

cmd_install() {
  if installed_version_ok; then
    echo "s3s-fs $S3S_FS_VERSION already installed: $BIN"
    return 0
  fi
  [[ -z "${BASECAMP_S3S_FS:-}" ]] || die "BASECAMP_S3S_FS=$BASECAMP_S3S_FS is not an executable file"
  mkdir -p "$ROOT"
  local started=$SECONDS
  echo "installing s3s-fs $S3S_FS_VERSION into $ROOT (1.5 to 10 minutes on 2 cores, once)" >&2
  # --locked uses the versions the crate was published with; when those no
  # longer build with this toolchain, fall back to a fresh resolution.
  if ! cargo install s3s-fs --version "$S3S_FS_VERSION" --features binary --locked --root "$ROOT"; then
    echo "cargo install --locked failed; retrying without --locked" >&2
    cargo install s3s-fs --version "$S3S_FS_VERSION" --features binary --root "$ROOT"
  fi
  [[ -x "$ROOT/bin/s3s-fs" ]] || die "cargo install finished but $ROOT/bin/s3s-fs is missing"
  echo "installed $ROOT/bin/s3s-fs in $((SECONDS - started)) s"
}

cmd_path() {
  [[ -x "$BIN" ]] || die "s3s-fs is not installed at $BIN: run scripts/s3-server.sh install"
  echo "$BIN"
}

# The pid and log files sit next to the data directory (not in it: every
# directory in it is a bucket): DATA_DIR.s3s-fs.pid, DATA_DIR.s3s-fs.log.
state_file() { local data; data=$(realpath -m "$1"); echo "${data%/}.s3s-fs.$2"; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd_start() {
  [[ $# -ge 2 ]] || die "usage: start PORT DATA_DIR [ACCESS_KEY] [SECRET_KEY]"
  local port=$1 data=$2 key=${3:-basecamp} secret=${4:-basecamp-secret}
  [[ "$port" =~ ^[0-9]+$ ]] || die "PORT must be a number, got '$port'"
  [[ -x "$BIN" ]] || die "s3s-fs is not installed at $BIN: run scripts/s3-server.sh install"
  local pidf log
  pidf=$(state_file "$data" pid)
  log=$(state_file "$data" log)
  if [[ -f "$pidf" ]] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
    die "an s3s-fs for $data is already running (pid $(cat "$pidf")); stop it first: $0 stop $data"
  fi
  port_open "$port" && die "127.0.0.1:$port is already in use; pick another port"
  mkdir -p "$data"
  "$BIN" --host 127.0.0.1 --port "$port" --access-key "$key" --secret-key "$secret" "$data" \
    >"$log" 2>&1 &
  local pid=$!
  # Bounded wait: 200 x 0.1 s.
  for _ in $(seq 200); do
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$log" >&2
      die "s3s-fs exited during start-up (log above)"
    fi
    if port_open "$port"; then
      echo "$pid" >"$pidf"
      echo "S3_ENDPOINT=http://127.0.0.1:$port"
      echo "S3_PID=$pid"
      return 0
    fi
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  die "s3s-fs did not accept connections on 127.0.0.1:$port within 20 s (log: $log)"
}

cmd_stop() {
  [[ $# -ge 1 ]] || die "usage: stop DATA_DIR"
  local pidf pid
  pidf=$(state_file "$1" pid)
  [[ -f "$pidf" ]] || die "no pid file $pidf: no server was started for $1"
  pid=$(cat "$pidf")
  if kill "$pid" 2>/dev/null; then
    # Bounded wait: 50 x 0.1 s, then SIGKILL.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidf"
  echo "stopped s3s-fs for $1 (pid $pid)"
}

case "${1:-}" in
  install) shift; cmd_install "$@" ;;
  path) shift; cmd_path "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) die "usage: $0 install | path | start PORT DATA_DIR [ACCESS_KEY] [SECRET_KEY] | stop DATA_DIR" ;;
esac
