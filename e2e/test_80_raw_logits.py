"""Raw logits end to end: a policy that sends full-vocabulary logits.

Task `rawlogits` is examples/raw-logits (one variant, one shard, five
episodes): its scripted policy, uploaded to S3 with the test set, carries
every turn's logits and reference logits as inline safetensors (a pod
fetches only the script, so nothing rides beside it). The pod is played by
the real basecamp-sandbox in a copy of the example's directory (the
recorded tool's fixture). Checked against the example's own float64 oracle
(examples/raw-logits/gen.py, which reads the safetensors bytes back out of
the script and shares no code with the sandbox):

* the task Succeeds (both criteria of the example, `logit_divergence < 0.05`
  among them) and `status.metrics[default].logit_divergence` is the mean of
  the episodes' mean per-token KL within 1e-4 relative;
* the gauge `basecamp_task_logit_divergence` on the operator's /metrics and
  in Prometheus has that value;
* on S3: the shard's summary.json has each episode's divergence; every
  token_logit record of the five traces has the oracle's token id,
  log-probability, entropy and KL; `basecamp trace search s3://...
  'token_logit.kl > 0.01'` finds exactly the steps the oracle says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import delete_tasks, need, timed
from kube import ROOT, WORK, E2EError, Kube, gauge, s3_json, s3_keys, wait_until
from play import Player

EXAMPLE = ROOT / "examples/raw-logits"
sys.path.insert(0, str(EXAMPLE))
import gen  # noqa: E402  (the example's generator and float64 oracle)

NAME = "rawlogits"
VARIANT = "default"
TEST_SET_KEY = "testsets/raw-logits/tests.jsonl"
POLICY_KEY = "testsets/raw-logits/policy.jsonl"
SEL = f"basecamp.dev/task={NAME}"
REL_TOL = 1e-4


def manifests(bucket: str) -> list[dict]:
    """examples/raw-logits/task.yaml renamed, its files on S3."""
    docs = list(yaml.safe_load_all((EXAMPLE / "task.yaml").read_text()))
    sandbox = next(d for d in docs if d["kind"] == "SandboxConfig")
    task = next(d for d in docs if d["kind"] == "HarnessTask")
    sandbox["metadata"]["name"] = f"{NAME}-tools"
    task["metadata"]["name"] = NAME
    task["spec"]["sandboxRef"]["name"] = f"{NAME}-tools"
    task["spec"]["evaluation"]["testSet"] = f"s3://{bucket}/{TEST_SET_KEY}"
    task["spec"]["policy"]["scripted"] = f"s3://{bucket}/{POLICY_KEY}"
    task["spec"]["traces"] = {"destination": f"s3://{bucket}/traces"}
    task["spec"]["shards"] = 1
    return [sandbox, task]


def close(got: float, want: float) -> bool:
    return abs(got - want) <= REL_TOL * abs(want)


@pytest.fixture(scope="module")
def oracle() -> dict:
    """Per episode: the tokens and logit_divergence computed here in float64."""
    want = gen.expected((EXAMPLE / "policy.jsonl").read_text().splitlines())
    assert len(want) == len(gen.EPISODES)
    return want


@pytest.fixture(scope="module")
def run(kube: Kube, operator, task_ns: str, bucket: str, s3) -> dict:
    """Applies the task, plays its pod and waits for the task to finish."""
    ns = task_ns
    delete_tasks(kube, ns, [NAME])
    stale = [k for k in s3_keys(s3, bucket, "traces/") if f"/{ns}/{NAME}/" in k]
    if stale:  # an earlier run against a kept cluster
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in stale]})
    s3.upload_file(str(EXAMPLE / "tests.jsonl"), bucket, TEST_SET_KEY)
    s3.upload_file(str(EXAMPLE / "policy.jsonl"), bucket, POLICY_KEY)
    kube.apply(manifests(bucket), "-n", ns)
    binaries = Path(need("BASECAMP_E2E_BIN"))
    # The example's directory stands for the tools image (fixtures/orders.jsonl).
    player = Player(kube, binaries / "basecamp-sandbox", EXAMPLE)
    with timed(f"playing {NAME} (1 shard)"):
        played = player.play_all(ns, SEL, expect=1, timeout=180)
    assert [p.exit_code for p in played] == [0], [(p.pod, p.exit_code, p.log.read_text()[-3000:]) for p in played]

    def done():
        t = kube.json("harnesstask", NAME, "-n", ns)
        return t if (t.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    task = wait_until(f"{NAME} to finish", done, timeout=120)
    return {"ns": ns, "task": task, "played": played[0], "basecamp": str(binaries / "basecamp")}


def test_task_succeeds_with_the_oracle_divergence(run, oracle):
    st = run["task"]["status"]
    print(json.dumps({k: st.get(k) for k in ("phase", "shards", "metrics", "criteria")}, indent=1))
    assert st["phase"] == "Succeeded", st
    assert st["shards"][VARIANT] == {"total": 1, "succeeded": 1, "failed": 0, "running": 0}, st["shards"]
    want = gen.expected_task_divergence(oracle)
    got = st["metrics"][VARIANT]["logit_divergence"]
    print(f"status.metrics[{VARIANT}].logit_divergence {got:.8f}, float64 {want:.8f}, "
          f"rel err {abs(got - want) / want:.1e}")
    assert close(got, want), (got, want)
    criteria = {c["criterion"]: c for c in st["criteria"]}
    divergence = criteria["logit_divergence < 0.05"]
    assert divergence["met"] and close(divergence["observed"], want), divergence
    assert all(c["met"] for c in st["criteria"]), st["criteria"]


def test_the_gauge_on_metrics_and_in_prometheus(run, oracle, operator, prometheus):
    want = gen.expected_task_divergence(oracle)
    labels = {"namespace": run["ns"], "task": NAME, "variant": VARIANT}
    text = operator.metrics()
    got = gauge(text, "basecamp_task_logit_divergence", **labels)
    assert got is not None, "no basecamp_task_logit_divergence for rawlogits:\n" + "\n".join(
        line for line in text.splitlines() if "logit_divergence" in line)
    print(f"/metrics basecamp_task_logit_divergence {got:.8f}, float64 {want:.8f}")
    assert close(got, want), (got, want)
    if prometheus is None:
        pytest.skip("prometheus is not installed (scripts/chart-tools.sh install promtool)")
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    result = wait_until(f"basecamp_task_logit_divergence{{{selector}}} in Prometheus",
                        lambda: prometheus.query(f"basecamp_task_logit_divergence{{{selector}}}"), timeout=30)
    scraped = float(result[0]["value"][1])
    print(f"Prometheus basecamp_task_logit_divergence {scraped:.8f}")
    assert close(scraped, want), (scraped, want)


def shard_keys(s3, bucket: str, ns: str) -> list[str]:
    return [k for k in s3_keys(s3, bucket, "traces/") if f"/{ns}/{NAME}/{VARIANT}/" in k]


def test_summary_and_token_records_on_s3(run, oracle, s3, bucket: str):
    keys = shard_keys(s3, bucket, run["ns"])
    summaries = [k for k in keys if k.endswith("summary.json")]
    traces = [k for k in keys if k.endswith(".trace")]
    assert len(summaries) == 1 and len(traces) == len(oracle), keys
    summary = s3_json(s3, bucket, summaries[0])
    episodes = {e["id"]: e for e in summary["episodes"]}
    assert sorted(episodes) == sorted(oracle)
    for episode, want in oracle.items():
        got = episodes[episode]["metrics"]["logit_divergence"]
        print(f"{episode}: summary.json {got:.8f}, float64 {want['logit_divergence']:.8f}, "
              f"rel err {abs(got - want['logit_divergence']) / want['logit_divergence']:.1e}")
        assert close(got, want["logit_divergence"]), (episode, got, want["logit_divergence"])
    # Every token record, downloaded and read with `basecamp trace parse`.
    local = WORK / "play" / NAME / "traces"
    local.mkdir(parents=True, exist_ok=True)
    failures = []
    for key in traces:
        episode = Path(key).stem
        path = local / Path(key).name
        s3.download_file(bucket, key, str(path))
        failures += gen.check_tokens(episode, oracle[episode], gen.trace_records(run["basecamp"], path), REL_TOL)
    assert not failures, failures


def test_trace_search_on_s3_finds_the_high_kl_tokens(run, oracle, s3, bucket: str):
    # The shard's prefix, <dest>/<yyyy>/<mm>/<dd>/<ns>/<task>/<variant>/<shard>/, listed by the CLI itself.
    prefixes = {k.rsplit("/", 1)[0] + "/" for k in shard_keys(s3, bucket, run["ns"]) if k.endswith(".trace")}
    assert len(prefixes) == 1, prefixes
    source = f"s3://{bucket}/{prefixes.pop()}"
    env = dict(os.environ,
               AWS_ENDPOINT_URL_S3=need("BASECAMP_E2E_S3_ENDPOINT"),
               AWS_ACCESS_KEY_ID=need("BASECAMP_E2E_S3_ACCESS_KEY"),
               AWS_SECRET_ACCESS_KEY=need("BASECAMP_E2E_S3_SECRET_KEY"),
               AWS_REGION="us-east-1")
    query = f"token_logit.kl > {gen.SEARCH_KL}"
    p = subprocess.run([run["basecamp"], "trace", "search", "--json", query, source],
                       capture_output=True, text=True, env=env, timeout=120)
    if p.returncode != 0:
        raise E2EError(f"basecamp trace search failed (exit {p.returncode}): {p.stderr}")
    found = {(m["episode"], m["step"]) for m in map(json.loads, p.stdout.splitlines())}
    expected = gen.steps_over(oracle, gen.SEARCH_KL)
    print(f"basecamp trace search '{query}' {source}: {sorted(found)}")
    assert found == expected, (sorted(found), sorted(expected))
    files = {json.loads(line)["file"] for line in p.stdout.splitlines()}
    assert all(f.startswith(source) for f in files), files
    assert expected and len(expected) < 2 * len(oracle), "the threshold should split the steps"
