"""The training loop (operator/TRAINING.md) on the cluster, with the trainer
fixture of examples/training and the scripted policy standing in for the
served checkpoint.

`trainloop` (examples/training/task.yaml on variant a's SandboxConfig, 2
shards): the traces to train on and a previous run's checkpoint `step-10/`
are seeded in S3, `resumeFrom` points at it. The trainer pod is played in
the background (its `dataset` init container is the real `basecamp data
preprocess` reading the traces from S3; the trainer writes step-20, -30 and
-40 ten seconds apart), and so is every evaluation pod as it appears, so
step 20 is evaluated while the trainer still runs. Right after step 20's
evaluation pods finish the operator is SIGKILLed and started again, and
once more right after step 30 is recorded in status. Then:
the trainer Succeeded; steps 20, 30, 40 were each evaluated
exactly once (one Job per variant, shards x variants pods played), step 10
never; status.training.history, steps.json, one report per step, trace keys
under `trainloop@step-N/`, and the checkpoint gauges on /metrics (and in
Prometheus).

`trainbroken` and `trainshape`: the same task with `preprocessor:
python:no_such_module.fn` (not importable) and `python:prep.wrong_shape`
(examples/training/prep.py, in the trainer image, returns a dict). The
trainer pod fails in its `dataset` init container; the preprocessor's own
message reaches status.training.message and a Warning Event
`TrainerFailed`, the task fails, and no checkpoint is evaluated.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import POLICY_KEY, TEST_SET_KEY, delete_tasks, need, timed
from kube import ROOT, WORK, E2EError, Kube, gauge, s3_json, s3_keys, wait_until
from play import Background, Player
from test_60_dashboards import ask as ask_dashboard_query
from test_60_dashboards import concrete
from test_60_dashboards import queries as dashboard_queries

NAME = "trainloop"
# Broken preprocessors: the task, its preprocessor, what status.training.message must say (and must not).
BROKEN = {
    # Not importable at all: reported as such, not as a failure on some record.
    "trainbroken": ("python:no_such_module.fn",
                    ["python:no_such_module.fn", "cannot start", "No module named 'no_such_module'"], ["on record"]),
    # examples/training/prep.py, in the trainer image: imported, but returns a dict.
    "trainshape": ("python:prep.wrong_shape",
                   ["python:prep.wrong_shape", "expected [state_dict, action_dict, reward]"], ["No module named"]),
}
SHARDS = 2
VARIANTS = ("default",)  # sandboxRef: one variant, named "default"
RESUMED = 10
STEPS = (20, 30, 40)
MISNAMED = "step_25"
SEED_PREFIX = "seed/ecommerce-traces/"  # the dataset's source
TASK_LABEL = "basecamp.dev/task"
STEP_LABEL = "basecamp.dev/step"
ROLE_LABEL = "basecamp.dev/role"
TEST_SET_ROWS = 60
# Seconds between checkpoints: long enough that step 20 is evaluated while
# the trainer still runs (the operator polls a training task every 10 s).
TRAINER_INTERVAL_S = 10


def checkpoint_root(bucket: str, ns: str, name: str) -> str:
    """TRAINING.md's default `C`: <traces.destination>/checkpoints/<ns>/<task>/."""
    return f"s3://{bucket}/traces/checkpoints/{ns}/{name}/"


def key_of(uri: str, bucket: str) -> str:
    return uri.removeprefix(f"s3://{bucket}/")


def training_manifests(name: str, bucket: str, ns: str, *, preprocessor: str | None = None,
                       resume: bool = True) -> list[dict]:
    """examples/training/task.yaml and examples/ecommerce/sandbox-a.yaml,
    renamed, with every location on the e2e bucket."""
    task = yaml.safe_load((ROOT / "examples/training/task.yaml").read_text())
    sandbox = yaml.safe_load((ROOT / "examples/ecommerce/sandbox-a.yaml").read_text())
    sandbox["metadata"]["name"] = f"{name}-a"
    spec = task["spec"]
    task["metadata"]["name"] = name
    spec["sandboxRef"] = {"name": f"{name}-a"}
    spec["shards"] = SHARDS
    spec["evaluation"]["testSet"] = f"s3://{bucket}/{TEST_SET_KEY}"
    spec["policy"]["scripted"] = f"s3://{bucket}/{POLICY_KEY}"
    spec["traces"] = {"destination": f"s3://{bucket}/traces"}
    spec["dataPipeline"]["source"] = f"s3://{bucket}/{SEED_PREFIX}"
    if preprocessor:
        spec["dataPipeline"]["preprocessor"] = preprocessor
    training = spec["trainingConfig"]
    if resume:
        training["resumeFrom"] = f"{checkpoint_root(bucket, ns, name)}step-{RESUMED}/"
    else:
        training.pop("resumeFrom", None)
    command = training["command"]
    assert command[:2] == ["python3", "trainer.py"], command
    # Longer than the example's 2 s, so that checkpoints are evaluated while the trainer still runs.
    command[command.index("--interval") + 1] = str(TRAINER_INTERVAL_S)
    return [sandbox, task]


def clean_s3(s3, bucket: str, ns: str, names: list[str]) -> None:
    """Removes what an earlier run against a kept cluster left for these tasks."""
    doomed = []
    for key in s3_keys(s3, bucket, "traces/"):
        if any(f"/{ns}/{n}/" in key or f"/{ns}/{n}@step-" in key for n in names):
            doomed.append(key)
    for i in range(0, len(doomed), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in doomed[i:i + 1000]]})


def seed(s3, bucket: str, ns: str) -> None:
    """Traces to train on (one local `basecamp run` of the example, uploaded)
    and the checkpoint `step-10/` that `trainloop` resumes from."""
    out = WORK / "play" / "training-seed"  # made by this build each time: the trace format may have changed
    shutil.rmtree(out, ignore_errors=True)
    binary = Path(need("BASECAMP_E2E_BIN")) / "basecamp"
    subprocess.run([str(binary), "run", str(ROOT / "examples/ecommerce"), "--variant", "b", "--shards", "1",
                    "--out", str(out), "--no-progress"], check=True, capture_output=True, timeout=180)
    traces = sorted(out.glob("**/*.trace"))
    assert len(traces) == TEST_SET_ROWS, f"{len(traces)} traces in {out}"
    for path in traces:
        s3.upload_file(str(path), bucket, SEED_PREFIX + str(path.relative_to(out)))
    step = key_of(checkpoint_root(bucket, ns, NAME), bucket) + f"step-{RESUMED}/"
    s3.put_object(Bucket=bucket, Key=step + "model.json", Body=json.dumps({"step": RESUMED, "loss": 1.5}).encode())
    s3.put_object(Bucket=bucket, Key=step + "COMPLETE", Body=b"{}")
    # A complete checkpoint whose name is not step-<N>: named in status and a Warning, never evaluated.
    misnamed = key_of(checkpoint_root(bucket, ns, NAME), bucket) + f"{MISNAMED}/"
    s3.put_object(Bucket=bucket, Key=misnamed + "model.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=misnamed + "COMPLETE", Body=b"{}")


def task(kube: Kube, ns: str, name: str) -> dict:
    return kube.json("harnesstask", name, "-n", ns)


def training(kube: Kube, ns: str, name: str) -> dict:
    return (task(kube, ns, name).get("status") or {}).get("training") or {}


def history_steps(kube: Kube, ns: str, name: str) -> list[int]:
    return [h["step"] for h in training(kube, ns, name).get("history") or []]


@pytest.fixture(scope="module")
def loop(kube: Kube, operator, task_ns: str, bucket: str, s3, player: Player) -> dict:
    """Runs the scenario once; the tests below check what it left."""
    ns = task_ns
    delete_tasks(kube, ns, [NAME, *BROKEN])
    clean_s3(s3, bucket, ns, [NAME, f"{NAME}-run2", *BROKEN])
    with timed("seeding traces and step-10"):
        seed(s3, bucket, ns)
    docs = training_manifests(NAME, bucket, ns)
    for name, (preprocessor, *_) in BROKEN.items():
        docs += training_manifests(name, bucket, ns, preprocessor=preprocessor, resume=False)
    kube.apply(docs, "-n", ns)
    good = Background(player, ns, f"{TASK_LABEL}={NAME}", parallel=5, timeout=600)
    broken = Background(player, ns, f"{TASK_LABEL} in ({','.join(BROKEN)})", parallel=2, timeout=600)
    facts: dict = {"ns": ns, "bucket": bucket}
    try:
        first = STEPS[0]

        seen: list[tuple[str, tuple[int, ...]]] = []  # (status.training.phase, .evaluating) as it changed
        facts["training_seen"] = seen

        def first_evaluation_played():
            tr = training(kube, ns, NAME)
            now = (tr.get("phase") or "", tuple(tr.get("evaluating") or ()))
            if not seen or seen[-1] != now:
                seen.append(now)
            done = [p for p in good.results() if p.labels.get(STEP_LABEL) == str(first)]
            return done if len(done) == SHARDS * len(VARIANTS) else None

        with timed(f"trainer start to step {first}'s evaluation pods finished"):
            done = wait_until(f"step {first}'s {SHARDS * len(VARIANTS)} evaluation pods played",
                              first_evaluation_played, timeout=240)
        assert all(p.exit_code == 0 for p in done), [(p.pod, p.exit_code, p.log.read_text()[-2000:]) for p in done]
        # Crash 1: step 20's pods are done, its aggregation may be under way
        # (steps.json, Event, status) or not started.
        facts["history_at_kill"] = [
            crash_and_restart(operator, kube, ns, f"step {first}'s evaluation pods finished")]
        # Crash 2: right after step 30 is in status.training.history.
        wait_until(f"step {STEPS[1]} in status.training.history",
                   lambda: STEPS[1] in history_steps(kube, ns, NAME), timeout=180)
        facts["history_at_kill"].append(crash_and_restart(operator, kube, ns, f"step {STEPS[1]} was recorded"))

        def loop_done():
            tr = training(kube, ns, NAME)
            finished = (tr.get("phase") in ("Succeeded", "Failed") and history_steps(kube, ns, NAME) == list(STEPS)
                        and not tr.get("evaluating") and not tr.get("queued"))
            return tr if finished else None

        with timed("restart to every checkpoint evaluated"):
            facts["training"] = wait_until(f"{NAME}: trainer finished, steps {STEPS} in status.training.history",
                                           loop_done, timeout=300)

        def task_done():
            t = task(kube, ns, NAME)
            return t if (t.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

        facts["task"] = wait_until(f"{NAME} to finish", task_done, timeout=120)
        # Quiet for a poll interval and more: nothing new may start after the loop finished.
        time.sleep(12)
        facts["played"] = good.stop()
        facts["played_broken"] = broken.stop()
    except BaseException:
        good.abort()
        broken.abort()
        raise
    facts["operator_log"] = operator.log()
    return facts


def task_events(kube: Kube, t: dict) -> list[dict]:
    """This task's Events (not those of an earlier task of the same name on a kept cluster)."""
    return [e for e in kube.events(t["metadata"]["namespace"], t["metadata"]["name"])
            if e["involvedObject"].get("uid") == t["metadata"]["uid"]]


def crash_and_restart(operator, kube: Kube, ns: str, when: str) -> list[int]:
    """SIGKILLs the operator and starts a fresh one; returns the history it left."""
    code = operator.stop(signal.SIGKILL)
    history = history_steps(kube, ns, NAME)
    print(f"operator SIGKILLed (exit {code}) right after {when}; status.training.history then: {history}")
    time.sleep(2)
    operator.start()
    print(f"operator restarted (start #{operator.starts})")
    return history


def evaluation_pods(played, step: int) -> list:
    return [p for p in played if p.labels.get(ROLE_LABEL) == "evaluation" and p.labels.get(STEP_LABEL) == str(step)]


def test_trainer_resumed_and_succeeded(kube: Kube, loop, s3, bucket: str):
    ns = loop["ns"]
    [trainer] = [p for p in loop["played"] if p.labels.get(ROLE_LABEL) == "trainer"]
    log = trainer.log.read_text()
    print(f"trainer pod {trainer.pod}: {trainer.containers} in {trainer.seconds:.1f}s\n{log}")
    assert trainer.containers.get("dataset") == 0 and trainer.containers.get("trainer") == 0, trainer.containers
    assert f"resuming from step {RESUMED}" in log and f"checkpoint step {STEPS[-1]}" in log, log
    [job] = kube.items("jobs", "-n", ns, "-l", f"{TASK_LABEL}={NAME},{ROLE_LABEL}=trainer")
    assert job["spec"].get("backoffLimit") == 0, job["spec"].get("backoffLimit")
    assert job["status"].get("succeeded") == 1, job["status"]
    assert job["metadata"]["ownerReferences"][0]["name"] == NAME
    tr = loop["training"]
    assert tr["phase"] == "Succeeded", tr
    assert tr.get("resumedFromStep") == RESUMED, tr
    # status.training followed the trainer while it ran, and step 20 was
    # evaluated while training went on (not only once it finished).
    seen = loop["training_seen"]
    print("status.training (phase, evaluating) as it changed:", seen)
    assert any(phase == "Running" for phase, _ in seen), seen
    assert ("Running", (STEPS[0],)) in seen, seen
    pod = kube.items("pods", "-n", ns, "-l", f"{TASK_LABEL}={NAME},{ROLE_LABEL}=trainer")[0]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
    assert container["resources"]["limits"].get("nvidia.com/gpu") == "1", container["resources"]
    node = kube.json("node", pod["spec"]["nodeName"])
    assert int(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) >= 1, pod["spec"]["nodeName"]
    # The dataset the init container wrote from the traces on S3, and what the trainer read from it.
    root = key_of(checkpoint_root(bucket, ns, NAME), bucket)
    dataset = s3_json(s3, bucket, root + "dataset/dataset.json")
    print("dataset.json:", {k: v for k, v in dataset.items() if k != "batches"})
    assert dataset["rows"] > 0 and dataset.get("batchSize", dataset.get("batch_size")) == 16, dataset
    assert dataset.get("version") == "v1" and dataset.get("source") == f"s3://{bucket}/{SEED_PREFIX}", dataset
    model = s3_json(s3, bucket, root + f"step-{STEPS[-1]}/model.json")
    assert model["resumed_from_step"] == RESUMED and model["dataset"]["rows"] == dataset["rows"], model


def test_each_checkpoint_evaluated_exactly_once(kube: Kube, loop):
    ns = loop["ns"]
    played = loop["played"]
    counts = {step: len(evaluation_pods(played, step)) for step in (RESUMED, *STEPS)}
    print("evaluation pods played per step:", counts, "; history when the operator was killed:",
          loop["history_at_kill"])
    assert counts == {RESUMED: 0, **{s: SHARDS * len(VARIANTS) for s in STEPS}}, counts
    failed = [(p.pod, p.exit_code) for p in played if p.exit_code != 0]
    assert not failed, failed
    jobs = kube.items("jobs", "-n", ns, "-l", f"{TASK_LABEL}={NAME},{ROLE_LABEL}=evaluation")
    per_step: dict[str, list[str]] = {}
    for job in jobs:
        per_step.setdefault(job["metadata"]["labels"][STEP_LABEL], []).append(job["metadata"]["name"])
    assert {k: sorted(v) for k, v in per_step.items()} == {
        str(s): sorted(f"{NAME}-s{s}-{v}" for v in VARIANTS) for s in STEPS}, per_step
    for job in jobs:
        assert job["status"].get("succeeded") == SHARDS and not job["status"].get("failed"), job["status"]
    pods = kube.items("pods", "-n", ns, "-l", f"{TASK_LABEL}={NAME},{ROLE_LABEL}=evaluation")
    assert len(pods) == SHARDS * len(VARIANTS) * len(STEPS), [p["metadata"]["name"] for p in pods]
    root = checkpoint_root(loop["bucket"], ns, NAME)
    for pod in pods:
        sandbox = next(c for c in pod["spec"]["containers"] if c["name"] == "sandbox")
        step = pod["metadata"]["labels"][STEP_LABEL]
        assert sandbox["args"][sandbox["args"].index("--checkpoint-step") + 1] == step, sandbox["args"]
        env = {e["name"]: e.get("value") for e in sandbox.get("env") or []}
        assert env.get("BASECAMP_CHECKPOINT") == f"{root}step-{step}/" and env.get("BASECAMP_STEP") == step, env


def test_an_event_per_evaluated_checkpoint(kube: Kube, loop):
    events = [e for e in task_events(kube, loop["task"]) if e["reason"] == "CheckpointEvaluated"]
    notes = [e.get("message") or e.get("note") or "" for e in events]
    print("CheckpointEvaluated:", *(f"{n} (series {(e.get('series') or {}).get('count', 1)})"
                                    for n, e in zip(notes, events)), sep="\n  ")
    # The operator writes steps.json, then the Event, then status; a step
    # found in steps.json but never shown in status gets its Event when
    # adopted. So at least once for step 20 (killed around its recording),
    # exactly once for 30 and 40 (recorded by operators that finished their work).
    for step in STEPS:
        count = sum(f"checkpoint step {step} evaluated" in n for n in notes)
        assert count >= 1 if step == STEPS[0] else count == 1, (step, notes)


def test_a_misnamed_checkpoint_directory_is_named_and_not_evaluated(kube: Kube, loop, bucket: str):
    assert loop["training"].get("ignoredDirectories") == [MISNAMED], loop["training"]
    notes = [e.get("note") or e.get("message") or "" for e in task_events(kube, loop["task"])
             if e["reason"] == "CheckpointDirectoryIgnored" and e.get("type") == "Warning"]
    where = f"{checkpoint_root(bucket, loop['ns'], NAME)}{MISNAMED}/"
    assert notes and all(n.startswith(f"{where} is not evaluated: ") and "step-<N>" in n for n in notes), notes
    assert not [h for h in loop["training"]["history"] if MISNAMED in h["checkpoint"]], loop["training"]["history"]


def test_history_and_steps_json(loop, s3, bucket: str):
    ns = loop["ns"]
    tr = loop["training"]
    print(json.dumps({k: v for k, v in tr.items() if k != "history"}, indent=1))
    history = tr["history"]
    assert [h["step"] for h in history] == list(STEPS), history
    for h in history:
        assert h["phase"] == "Succeeded", h
        assert h["checkpoint"] == f"{checkpoint_root(bucket, ns, NAME)}step-{h['step']}/", h
        for v in VARIANTS:
            assert 0.0 <= h["metrics"][v]["tool_call_accuracy"] <= 1.0, h
    assert tr.get("latestStep") == STEPS[-1], tr
    root = checkpoint_root(bucket, ns, NAME)
    assert (tr.get("checkpoints"), tr.get("dataset"), tr.get("checkpointsFound"), tr.get("job")) == (
        root, f"{root}dataset/", len(STEPS), f"{NAME}-train"), tr
    steps = s3_json(s3, bucket, f"traces/reports/{ns}/{NAME}/steps.json")
    assert [s["step"] for s in steps] == list(STEPS), steps
    differences = [
        (s["step"], v, k, s["metrics"][v].get(k), h["metrics"].get(v, {}).get(k))
        for s, h in zip(steps, history)
        for v in s["metrics"]
        for k in sorted(set(s["metrics"][v]) | set(h["metrics"].get(v, {})))
        if s["metrics"][v].get(k) != h["metrics"].get(v, {}).get(k)
    ]
    assert not differences, f"(step, variant, metric, steps.json, status): {differences}"


def test_a_report_and_traces_per_step(loop, s3, bucket: str):
    ns = loop["ns"]
    all_keys = s3_keys(s3, bucket, "traces/")
    assert not [k for k in all_keys if f"{NAME}@step-{RESUMED}/" in k], "step 10 was evaluated"
    for step in STEPS:
        run = f"{NAME}@step-{step}"
        rows = s3_json(s3, bucket, f"traces/reports/{ns}/{run}/index.json")
        rows = rows if isinstance(rows, list) else rows.get("rows") or rows.get("episodes")
        assert len(rows) == TEST_SET_ROWS * len(VARIANTS), (step, len(rows))
        assert len({(r["variant"], r["id"]) for r in rows}) == len(rows), f"step {step}: an episode counted twice"
        traces = [k for k in all_keys if re.search(rf"/{ns}/{re.escape(run)}/[^/]+/[^/]+/", k) and k.endswith(".trace")]
        assert len(traces) == TEST_SET_ROWS * len(VARIANTS), (step, len(traces))
        summaries = [k for k in all_keys if f"/{ns}/{run}/" in k and k.endswith("summary.json")]
        assert len(summaries) == SHARDS * len(VARIANTS), (step, summaries)


def test_checkpoint_gauges(operator, loop, prometheus):
    ns = loop["ns"]
    text = operator.metrics()
    step = gauge(text, "basecamp_checkpoint_step", namespace=ns, task=NAME)
    accuracy = gauge(text, "basecamp_checkpoint_tool_call_accuracy", namespace=ns, task=NAME, variant=VARIANTS[0])
    checkpoint_lines = [line for line in text.splitlines() if line.startswith("basecamp_checkpoint_")]
    assert step == STEPS[-1], checkpoint_lines
    assert accuracy is not None and 0.0 <= accuracy <= 1.0, checkpoint_lines
    if prometheus is None:
        return
    selector = f'{{namespace="{ns}",task="{NAME}"}}'

    def newest_step_scraped():
        result = prometheus.query(f"basecamp_checkpoint_step{selector}")
        return result if result and float(result[0]["value"][1]) == STEPS[-1] else None

    wait_until(f"basecamp_checkpoint_step{selector} == {STEPS[-1]} in Prometheus", newest_step_scraped, timeout=30)
    # The gauge went through the earlier steps too: what the Training dashboard plots against.
    earliest = prometheus.query(f"min_over_time(basecamp_checkpoint_step{selector}[15m])")
    assert float(earliest[0]["value"][1]) <= STEPS[1], earliest
    empty = []
    for title, expr in dashboard_queries("basecamp-training.json"):
        if not ask_dashboard_query(prometheus, expr):
            empty.append(f"{title}: {concrete(expr)}")
    assert not empty, "Training dashboard queries without data:\n  " + "\n  ".join(empty)


def test_task_finished_after_the_loop(loop):
    st = loop["task"]["status"]
    print(json.dumps({k: st.get(k) for k in ("phase", "shards", "metrics")}, indent=1))
    # The variant's own Jobs (the policy as configured) ran as for any task; a's tool_call_accuracy meets 0.9.
    assert st["phase"] == "Succeeded", st
    assert st["shards"]["default"] == {"total": SHARDS, "succeeded": SHARDS, "failed": 0, "running": 0}, st["shards"]


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_preprocessor_fails_the_trainer_with_its_message(kube: Kube, loop, s3, bucket: str, name: str):
    ns = loop["ns"]
    _, expected, unexpected = BROKEN[name]
    trainers = [p for p in loop["played_broken"]
                if p.labels.get(ROLE_LABEL) == "trainer" and p.labels.get(TASK_LABEL) == name]
    assert [p.containers for p in trainers] == [{"inject-basecamp": 0, "dataset": 1}], trainers

    def failed():
        t = task(kube, ns, name)
        tr = (t.get("status") or {}).get("training") or {}
        return t if tr.get("phase") == "Failed" and t["status"].get("phase") == "Failed" else None

    try:
        t = wait_until(f"{name}: training and task Failed", failed, timeout=60)
    except E2EError:
        raise E2EError(f"{name} did not fail: {json.dumps(task(kube, ns, name).get('status'), indent=1)}")
    tr = t["status"]["training"]
    print(f"{name} status.training.message: {tr.get('message')}")
    message = tr.get("message") or ""
    for text in expected:
        assert text in message, (text, message, trainers[0].log.read_text()[-2000:])
    for text in unexpected:
        assert text not in message, (text, message)
    [job] = kube.items("jobs", "-n", ns, "-l", f"{TASK_LABEL}={name},{ROLE_LABEL}=trainer")
    assert job["status"].get("failed") == 1 and not job["status"].get("succeeded"), job["status"]
    events = task_events(kube, t)
    warnings = [e for e in events if e["type"] == "Warning" and e["reason"] == "TrainerFailed"]
    assert warnings, [(e["type"], e["reason"], e.get("message")) for e in events]
    assert expected[0] in (warnings[0].get("message") or warnings[0].get("note") or ""), warnings[0]
    assert not kube.items("jobs", "-n", ns, "-l", f"{TASK_LABEL}={name},{ROLE_LABEL}=evaluation")
    assert not tr.get("history") and not tr.get("evaluating"), tr
    assert not [k for k in s3_keys(s3, bucket, key_of(checkpoint_root(bucket, ns, name), bucket))
                if "/step-" in k], "the broken trainer wrote checkpoints"


def test_a_changed_checkpoint_root_is_a_warning_naming_the_steps_kept(kube: Kube, loop, bucket: str):
    """Last in this file: it restarts trainloop's trainer under another root (and deletes the task after)."""
    ns = loop["ns"]
    before = checkpoint_root(bucket, ns, NAME)
    after = checkpoint_root(bucket, ns, f"{NAME}-run2")
    try:
        changed_root_warned(kube, ns, before, after)
    finally:
        delete_tasks(kube, ns, [NAME])


def changed_root_warned(kube: Kube, ns: str, before: str, after: str) -> None:
    kube.run("patch", "harnesstask", NAME, "-n", ns, "--type=merge", "-p",
             json.dumps({"spec": {"trainingConfig": {"checkpoints": after}}}))
    wait_until("status.training.checkpoints is the new root",
               lambda: training(kube, ns, NAME).get("checkpoints") == after, timeout=60)

    def warned():
        return [e.get("note") or e.get("message") or "" for e in task_events(kube, task(kube, ns, NAME))
                if e["reason"] == "CheckpointRootChanged" and e.get("type") == "Warning"] or None

    [note] = wait_until("a CheckpointRootChanged Warning", warned, timeout=30)
    steps = ", ".join(map(str, STEPS))
    assert note.startswith(f"the checkpoint root changed from {before} to {after}; steps {steps} were evaluated"), note
    assert history_steps(kube, ns, NAME) == list(STEPS), "the history is kept"
