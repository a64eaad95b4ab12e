#!/usr/bin/env bash
# Fuzzes the .trace reader for a bounded time, seeded with the golden files.
#
#   trace/fuzz/run.sh                 # 60 s
#   FUZZ_SECONDS=600 trace/fuzz/run.sh
#
# Needs the nightly toolchain (cargo-fuzz builds with sanitizers); installs
# cargo-fuzz if it is missing. Crashes land in trace/fuzz/artifacts/read_trace/
# and the script exits non-zero; reproduce one with
#   cargo +nightly fuzz run read_trace trace/fuzz/artifacts/read_trace/crash-...
set -euo pipefail

cd "$(dirname "$0")"
target=read_trace
seconds="${FUZZ_SECONDS:-60}"

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

corpus="corpus/$target"
mkdir -p "$corpus"
cp ../tests/golden/*.trace "$corpus/"

cargo +nightly fuzz build "$target"
cargo +nightly fuzz run "$target" "$corpus" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1
