#!/usr/bin/env bash
# Run the CUDA kernels of gpu/src/cuda/logits.cu on the CPU (no GPU needed)
# and hold them to the float64 oracle: builds the emulator with g++ (C++20)
# and runs `cargo test -p basecamp-gpu --test emulated_kernel` with it.
# Takes about 2 minutes on 2 cores (one std::thread per CUDA thread).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${TMPDIR:-/tmp}/basecamp-cuda-emulate"
g++ -std=c++20 -O2 -pthread -Wall -Wno-unknown-pragmas -o "$out" "$here/emulate.cpp"
cd "$here/../../.."
BASECAMP_CUDA_EMULATOR="$out" cargo test -p basecamp-gpu --test emulated_kernel -- --nocapture "$@"
