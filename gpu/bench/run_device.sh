#!/usr/bin/env bash
# The GPU session's one device call: correctness on the GPU, the kernel
# benchmark, the copy ceiling and the PyTorch peers, in one run, into
# $OUT/gpu.json (copy it to bench/results/gpu.json afterwards).
#
# The device machine has no Rust toolchain (and no network), so build here
# first, then carry the binaries:
#
#   gpu/bench/run_device.sh --prepare        # here: release-builds into gpu/bench/bin/
#   run(command="bash gpu/bench/run_device.sh", carry=["gpu/bench/bin"], timeout_s=590)
#
# Steps on the device (each logged under $OUT): nvidia-smi (read-only
# queries), the GPU integration tests (gpu/tests/gpu_logits.rs), `gpu_bench
# check` (every row shape, dtype, alignment vs float64), `gpu_bench bench`
# (copy ceiling; T in {256, 4096, 16384} x {bf16, f32} x {single, pair}),
# the peer script (PyTorch eager and torch.compile), then the merge and a
# short table. Targets (T >= 4096): >= 80% of the copy bandwidth, >= 3x
# eager, >= 1.2x torch.compile; "met" is computed from the measurements only.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=gpu/bench/bin

if [[ "${1:-}" == "--prepare" ]]; then
    set -e
    cargo build --release -p basecamp-gpu --example gpu_bench
    mkdir -p "$BIN"
    # CARGO_TARGET_DIR (the CI cache) or ./target: wherever cargo built it.
    target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    cp "$target_dir/release/examples/gpu_bench" "$BIN/"
    test_bin=$(cargo test --release -p basecamp-gpu --test gpu_logits --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_logits":
        print(m["executable"])' | tail -1)
    cp "$test_bin" "$BIN/gpu_logits"
    strip "$BIN/gpu_bench" "$BIN/gpu_logits" 2>/dev/null || true
    ls -la "$BIN"
    echo "prepared: carry gpu/bench/bin (glibc here: $(ldd --version | head -1))"
    exit 0
fi

OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/run.log"; }

# Libraries: the driver's, and NVRTC. cudarc (built for CUDA 12.8 names) looks
# for libnvrtc.so or libnvrtc.so.12; a CUDA 13 machine may only have .so.13,
# so link whichever is found as libnvrtc.so in a folder of our own.
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
    [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
nvrtc=$( (ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null;
          python3 - <<'PY' 2>/dev/null
import glob, site, sys
for p in site.getsitepackages() + [site.getusersitepackages()]:
    for f in glob.glob(p + "/nvidia/cu*/lib/libnvrtc.so*") + glob.glob(p + "/nvidia/cuda_nvrtc/lib/libnvrtc.so*"):
        print(f)
PY
) | grep -v -e alt -e builtins | head -1)
if [[ -n "$nvrtc" ]]; then
    mkdir -p /tmp/basecamp-nvrtc
    ln -sf "$nvrtc" /tmp/basecamp-nvrtc/libnvrtc.so
    LD_LIBRARY_PATH="/tmp/basecamp-nvrtc:$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
fi
export LD_LIBRARY_PATH
log "nvrtc: ${nvrtc:-NOT FOUND}; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"

if [[ ! -x "$BIN/gpu_bench" ]]; then
    if command -v cargo >/dev/null; then
        log "building (no carried binaries)"
        cargo build --release -p basecamp-gpu --example gpu_bench 2>&1 | tail -3
        mkdir -p "$BIN" && cp target/release/examples/gpu_bench "$BIN/"
    else
        log "no $BIN/gpu_bench and no cargo: run 'gpu/bench/run_device.sh --prepare' here and carry gpu/bench/bin"
        exit 2
    fi
fi

status=0
if [[ -x "$BIN/gpu_logits" ]]; then
    log "GPU integration tests (gpu/tests/gpu_logits.rs)"
    timeout 90 "$BIN/gpu_logits" --nocapture --test-threads 1 > "$OUT/tests.log" 2>&1 || status=1
    tail -5 "$OUT/tests.log"
fi
log "gpu_bench check"
timeout 100 "$BIN/gpu_bench" check > "$OUT/check.log" 2>&1 || status=1
grep -E "FAIL|error|check:" "$OUT/check.log" | tail -8
log "gpu_bench bench"
timeout 160 "$BIN/gpu_bench" bench "$OUT/gpu_kernel.json" > "$OUT/bench.log" 2>&1 || status=1
peer=""
for p in shared/bench/gpu_logit_peer.py ../shared/bench/gpu_logit_peer.py gpu/bench/gpu_logit_peer.py; do
    [[ -f "$p" ]] && { peer="$p"; break; }
done
log "PyTorch peers ($peer)"
PYTHONUNBUFFERED=1 OUT="$OUT" timeout 220 python3 "$peer" > "$OUT/peer.log" 2>&1 || status=1
tail -3 "$OUT/peer.log"

log "merge into $OUT/gpu.json"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:
        return {"error": repr(e)}
kernel, peer = load("gpu_kernel.json"), load("gpu_logit_peer.json")
peer_rows = {(r.get("dtype"), r.get("T")): r for r in peer.get("rows", []) if "T" in r}
peer_copy = next((r["GBps"] for r in peer.get("rows", []) if r.get("op") == "d2d_copy"), None)
copy = kernel.get("copy_GBps")
compare, targets = [], []
for r in kernel.get("rows", []):
    if not r.get("kl"):
        continue
    p = peer_rows.get((r["dtype"], r["T"]), {})
    row = {"dtype": r["dtype"], "T": r["T"], "kernel_ms": r["ms"]["median"], "kernel_GBps": r["GBps"],
           "fraction_of_copy": r["fraction_of_copy"],
           "fraction_of_peer_copy": (r["GBps"] / peer_copy) if peer_copy else None,
           "eager_both_ms": p.get("eager_both_ms"), "compiled_both_ms": p.get("compiled_both_ms")}
    row["speedup_vs_eager"] = (p["eager_both_ms"] / r["ms"]["median"]) if p.get("eager_both_ms") else None
    row["speedup_vs_compiled"] = (p["compiled_both_ms"] / r["ms"]["median"]) if p.get("compiled_both_ms") else None
    compare.append(row)
    if r["T"] >= 4096:
        for name, value, need in [("fraction_of_copy", row["fraction_of_copy"], 0.8),
                                  ("speedup_vs_eager", row["speedup_vs_eager"], 3.0),
                                  ("speedup_vs_compiled", row["speedup_vs_compiled"], 1.2)]:
            targets.append({"dtype": r["dtype"], "T": r["T"], "target": f"{name} >= {need}",
                            "measured": value, "met": value is not None and value >= need})
doc = {"bench": "gpu_logits", "kernel": kernel, "peer": peer, "compare_pair": compare, "targets": targets,
       "note": "pair = top-5 + log-sum-exp + entropy + KL(p||q) in one kernel; the peer's 'both' = topk(5) + logsumexp + KL"}
json.dump(doc, open(os.path.join(out, "gpu.json"), "w"), indent=1)
print("| dtype | T | kernel ms | GB/s | of copy | vs eager | vs compile |")
print("|---|---|---|---|---|---|---|")
f = lambda v, spec: "-" if v is None else format(v, spec)
for c in compare:
    print(f"| {c['dtype']} | {c['T']} | {c['kernel_ms']:.3f} | {c['kernel_GBps']:.0f} | {100*c['fraction_of_copy']:.0f}% | "
          f"{f(c['speedup_vs_eager'], '.2f')}x | {f(c['speedup_vs_compiled'], '.2f')}x |")
print("targets met:", sum(t["met"] for t in targets), "of", len(targets))
PY
grep -E "^\|" "$OUT/bench.log" | head -16
exit $status
