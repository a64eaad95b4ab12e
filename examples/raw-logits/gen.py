#!/usr/bin/env python3
"""The raw-logits example: a scripted policy that sends each turn's
full-vocabulary logits, plus reference logits, as inline safetensors.

    python3 gen.py                 # (re)write tests.jsonl and policy.jsonl (deterministic)
    python3 gen.py --check RUN     # compare RUN's summary.json files with the float64 oracle

Standard library only. The safetensors files are written by hand (an 8-byte
little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}} padded with spaces to 8 bytes, then the raw little-endian
data), read back by hand, and the expected KL(p || q) of every token is
computed here in float64 from the values exactly as stored (F32 or BF16), so
the sandbox's numbers are checked against an implementation that shares no
code with it. e2e/test_80_raw_logits.py imports this module for the same
purpose.

Each episode looks an order up (one recorded tool) and answers. Turn 0 (the
tool call) sends F32 logits, turn 1 (the answer) BF16; the reference is the
policy's logits plus Gaussian noise whose size grows from episode to episode,
so the per-token KL is small but nonzero and spans 0.01.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import random
import struct
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOCAB = 2048
SEED = 20261130
# (episode id, order id, reference noise sigma). KL ~ sigma^2 / 2 times the
# policy's spread, so the first episodes stay under 0.01 and the last go over.
EPISODES = [
    ("order-1", "A-1001", 0.05),
    ("order-2", "A-1002", 0.10),
    ("order-3", "A-1003", 0.20),
    ("order-4", "A-1004", 0.35),
    ("order-5", "A-1005", 0.50),
]
# Tokens per turn: the tool call, then the answer.
ROWS = (3, 2)
DTYPES = ("F32", "BF16")
LOGITS, REFERENCE = "logits", "reference"
# The threshold of the README's `basecamp trace search` example.
SEARCH_KL = 0.01


# --- number formats -------------------------------------------------------

def f32(x: float) -> float:
    """`x` rounded to float32, as stored."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x: float) -> int:
    """The bfloat16 bit pattern of `x` (float32 rounded to nearest even)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def bf16_value(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def bf16(x: float) -> float:
    """`x` rounded to bfloat16, as stored."""
    return bf16_value(bf16_bits(x))


# --- safetensors ----------------------------------------------------------

def safetensors(tensors: dict[str, tuple[str, list[int], list[float]]]) -> bytes:
    """A safetensors file of `{name: (dtype, shape, values)}`, dtype F32 or BF16."""
    header: dict[str, dict] = {}
    data = bytearray()
    for name, (dtype, shape, values) in tensors.items():
        assert math.prod(shape) == len(values), (name, shape, len(values))
        start = len(data)
        if dtype == "F32":
            data += struct.pack(f"<{len(values)}f", *values)
        elif dtype == "BF16":
            data += struct.pack(f"<{len(values)}H", *(bf16_bits(v) for v in values))
        else:
            raise ValueError(f"unsupported dtype {dtype}")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [start, len(data)]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + bytes(data)


def read_safetensors(blob: bytes) -> dict[str, tuple[list[int], list[float]]]:
    """`{name: (shape, values)}` of a safetensors file with F32 or BF16 tensors."""
    (size,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8:8 + size])
    body = blob[8 + size:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        raw = body[start:end]
        if meta["dtype"] == "F32":
            values = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        elif meta["dtype"] == "BF16":
            values = [bf16_value(b) for b in struct.unpack(f"<{len(raw) // 2}H", raw)]
        else:
            raise ValueError(f"{name}: unsupported dtype {meta['dtype']}")
        out[name] = (meta["shape"], values)
    return out


# --- the float64 oracle ---------------------------------------------------

def log_softmax(row: list[float]) -> list[float]:
    m = max(row)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def entropy(row: list[float]) -> float:
    """Entropy of softmax(row) in nats, float64."""
    return max(0.0, -math.fsum(math.exp(a) * a for a in log_softmax(row)))


def kl(p_row: list[float], q_row: list[float]) -> float:
    """KL(softmax(p) || softmax(q)) in nats, float64."""
    lp, lq = log_softmax(p_row), log_softmax(q_row)
    return max(0.0, math.fsum(math.exp(a) * (a - b) for a, b in zip(lp, lq)))


def rows_of(shape: list[int], values: list[float]) -> list[list[float]]:
    vocab = shape[-1]
    return [values[i:i + vocab] for i in range(0, len(values), vocab)]


def turn_tokens(raw_logits: dict) -> list[dict]:
    """Per token of one turn's `raw_logits` (inline), from its bytes: the
    emitted id, its log-probability, the entropy and KL(p || q)."""
    tensors = read_safetensors(base64.b64decode(raw_logits["safetensors_base64"]))
    p = rows_of(*tensors[raw_logits.get("tensor", LOGITS)])
    q = rows_of(*tensors[raw_logits["reference"]])
    ids = raw_logits["token_ids"]
    return [{"token_id": i, "logprob": log_softmax(a)[i], "entropy": entropy(a), "kl": kl(a, b)}
            for i, a, b in zip(ids, p, q)]


def expected(policy_lines: list[str]) -> dict[str, dict]:
    """Per episode of a scripted policy file: its tokens by trace step (the
    turn's step is its index + 1) and its logit_divergence (the mean KL of
    its tokens, as the sandbox defines it)."""
    out = {}
    for line in policy_lines:
        if not line.strip():
            continue
        script = json.loads(line)
        steps = {step: turn_tokens(turn["raw_logits"])
                 for step, turn in enumerate(script["turns"], start=1) if "raw_logits" in turn}
        kls = [t["kl"] for tokens in steps.values() for t in tokens]
        out[script["episode"]] = {"steps": steps, "kl": kls, "logit_divergence": math.fsum(kls) / len(kls)}
    return out


def steps_over(per_episode: dict[str, dict], threshold: float) -> set[tuple[str, int]]:
    """(episode, step) pairs with a token whose KL exceeds `threshold`: what
    `basecamp trace search 'token_logit.kl > THRESHOLD'` must find."""
    return {(episode, step) for episode, e in per_episode.items()
            for step, tokens in e["steps"].items() if any(t["kl"] > threshold for t in tokens)}


def relative(pairs: list[tuple[float, float]]) -> float:
    """||got - want|| / ||want|| over (got, want) pairs."""
    diff = math.fsum((g - w) ** 2 for g, w in pairs)
    norm = math.fsum(w ** 2 for _, w in pairs)
    return math.sqrt(diff / norm) if norm else math.sqrt(diff)


def check_tokens(episode: str, want: dict, records: list[tuple[int, dict]], rel_tol: float) -> list[str]:
    """A trace's token_logit records (step, proto3 JSON) against the oracle."""
    failures = []
    got_steps = {}
    for step, record in records:
        got_steps.setdefault(step, []).append(record)
    if sorted(got_steps) != sorted(want["steps"]):
        return [f"{episode}: token_logit records at steps {sorted(got_steps)}, expected {sorted(want['steps'])}"]
    pairs = {"kl": [], "entropy": [], "logprob": []}
    for step, tokens in want["steps"].items():
        got = sorted(got_steps[step], key=lambda r: r.get("position", 0))
        if [r.get("tokenId", 0) for r in got] != [t["token_id"] for t in tokens]:
            failures.append(f"{episode} step {step}: token ids {[r.get('tokenId', 0) for r in got]}, "
                            f"expected {[t['token_id'] for t in tokens]}")
        for name, values in pairs.items():
            values += [(r.get(name, 0.0), t[name]) for r, t in zip(got, tokens)]
    for name, values in pairs.items():
        rel = relative(values)
        if rel > rel_tol:
            failures.append(f"{episode}: token {name} relative error {rel:.1e} > {rel_tol:.0e}")
    return failures


def expected_task_divergence(per_episode: dict[str, dict]) -> float:
    """A variant's logit_divergence: the mean over its episodes."""
    return math.fsum(e["logit_divergence"] for e in per_episode.values()) / len(per_episode)


# --- the example ----------------------------------------------------------

def turn_logits(rng: random.Random, rows: int, sigma: float, dtype: str) -> dict:
    """One turn's logits (a peaked row each), reference, emitted tokens."""
    store = f32 if dtype == "F32" else bf16
    p, q, emitted = [], [], []
    for _ in range(rows):
        row = [rng.gauss(0.0, 1.0) for _ in range(VOCAB)]
        row[rng.randrange(VOCAB)] += rng.uniform(4.0, 10.0)
        row = [store(x) for x in row]
        p += row
        q += [store(x + rng.gauss(0.0, sigma)) for x in row]
        probs = [math.exp(x) for x in log_softmax(row)]
        emitted.append(rng.choices(range(VOCAB), weights=probs)[0])
    blob = safetensors({LOGITS: (dtype, [rows, VOCAB], p), REFERENCE: (dtype, [rows, VOCAB], q)})
    return {
        "safetensors_base64": base64.b64encode(blob).decode(),
        "reference": REFERENCE,
        "token_ids": emitted,
    }


def build() -> tuple[list[dict], list[dict], list[dict]]:
    """The test set, the scripted policy and the tool's recorded answers."""
    rng = random.Random(SEED)
    tests, scripts, fixture = [], [], []
    for episode, order, sigma in EPISODES:
        tests.append({
            "id": episode,
            "instruction": f"Where is my order {order}?",
            "expected_tool_calls": [{"name": "lookup_order", "arguments": {"order_id": order}}],
        })
        fixture.append({"tool": "lookup_order", "arguments": {"order_id": order},
                        "observation": {"order_id": order, "status": "in_transit"}})
        call = {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": order}}],
                "raw_logits": turn_logits(rng, ROWS[0], sigma, DTYPES[0])}
        answer = {"content": f"Order {order} is in transit.",
                  "raw_logits": turn_logits(rng, ROWS[1], sigma, DTYPES[1])}
        scripts.append({"episode": episode, "turns": [call, answer]})
    return tests, scripts, fixture


def write() -> None:
    tests, scripts, fixture = build()
    (HERE / "tests.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tests))
    (HERE / "fixtures").mkdir(exist_ok=True)
    (HERE / "fixtures/orders.jsonl").write_text("".join(json.dumps(f) + "\n" for f in fixture))
    (HERE / "policy.jsonl").write_text("".join(json.dumps(s, separators=(",", ":")) + "\n" for s in scripts))
    want = expected((HERE / "policy.jsonl").read_text().splitlines())
    for episode, e in want.items():
        print(f"{episode}: logit_divergence {e['logit_divergence']:.6f} "
              f"(token KL {min(e['kl']):.5f} .. {max(e['kl']):.5f})")
    print(f"variant logit_divergence {expected_task_divergence(want):.6f}")


def trace_records(basecamp: str, trace: Path) -> list[tuple[int, dict]]:
    """The token_logit records of a trace, via `basecamp trace parse`."""
    out = subprocess.run([basecamp, "trace", "parse", str(trace)], capture_output=True, text=True, check=True)
    return [(r["step"], r["tokenLogit"]) for r in json.loads(out.stdout)["records"] if "tokenLogit" in r]


def check(run: Path, basecamp: str | None, rel_tol: float = 1e-4) -> int:
    """Compares RUN's summary.json files (every episode and the variant's
    aggregate) with the float64 oracle; with `basecamp`, also every token's
    KL and entropy in the traces, and what `basecamp trace search` finds.
    Returns the process exit status."""
    want = expected((HERE / "policy.jsonl").read_text().splitlines())
    summaries = sorted(run.rglob("summary.json"))
    if not summaries:
        print(f"no summary.json under {run}", file=sys.stderr)
        return 1
    failures, seen, aggregates, traces = [], {}, [], {}
    for path in summaries:
        summary = json.loads(path.read_text())
        aggregates.append(summary["aggregate"]["means"].get("logit_divergence"))
        for episode in summary.get("episodes", []):
            seen[episode["id"]] = (episode.get("metrics") or {}).get("logit_divergence")
            traces[episode["id"]] = path.parent / episode["trace_file"]
    for episode, e in want.items():
        got = seen.get(episode)
        if got is None:
            failures.append(f"{episode}: no logit_divergence in any summary.json")
            continue
        rel = abs(got - e["logit_divergence"]) / e["logit_divergence"]
        print(f"{episode}: sandbox {got:.8f}  float64 {e['logit_divergence']:.8f}  rel err {rel:.1e}")
        if rel > rel_tol:
            failures.append(f"{episode}: relative error {rel:.1e} > {rel_tol:.0e}")
    total = expected_task_divergence(want)
    if len(aggregates) == 1 and aggregates[0] is not None:
        rel = abs(aggregates[0] - total) / total
        print(f"summary aggregate: sandbox {aggregates[0]:.8f}  float64 {total:.8f}  rel err {rel:.1e}")
        if rel > rel_tol:
            failures.append(f"aggregate logit_divergence: relative error {rel:.1e} > {rel_tol:.0e}")
    if basecamp:
        for episode, e in want.items():
            if episode in traces:
                failures += check_tokens(episode, e, trace_records(basecamp, traces[episode]), rel_tol)
        tokens = sum(len(e["kl"]) for e in want.values())
        print(f"traces: {tokens} token_logit records checked (token id, logprob, entropy, kl)")
        out = subprocess.run([basecamp, "trace", "search", "--json", f"token_logit.kl > {SEARCH_KL}", str(run)],
                             capture_output=True, text=True, check=True)
        found = {(m["episode"], m["step"]) for m in map(json.loads, out.stdout.splitlines())}
        expect = steps_over(want, SEARCH_KL)
        print(f"trace search 'token_logit.kl > {SEARCH_KL}': {len(found)} steps, expected {len(expect)}")
        if found != expect:
            failures.append(f"trace search found {sorted(found)}, expected {sorted(expect)}")
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    print("FAILED" if failures else "OK: the sandbox agrees with the float64 oracle")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", type=Path, metavar="RUN", help="a `basecamp run` output directory to verify")
    parser.add_argument("--basecamp", metavar="BIN",
                        help="the basecamp CLI: with --check, also verify every token in the traces and trace search")
    args = parser.parse_args()
    if args.check:
        return check(args.check, args.basecamp)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
