"""The player's trainer-pod support, without a cluster: a trainer pod as
operator/TRAINING.md describes it (inject-basecamp, dataset, trainer),
played against a stub kubectl that serves the ConfigMap and records the
status patch. Checks the kubelet behaviour the training scenario relies on:
init containers in order, a failed one stopping the pod, `$(VAR)` and mount
paths, and FallbackToLogsOnError's message.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kube import ROOT
from play import Player, termination_message


class StubKube:
    """Answers the player's kubectl calls for one ConfigMap and records status patches."""

    def __init__(self, configmaps: dict[str, dict[str, str]]):
        self.configmaps = configmaps
        self.patches: list[dict] = []

    def json(self, kind: str, name: str, *_):
        assert kind == "configmap", kind
        return {"data": self.configmaps[name]}

    def get(self, *args):
        return None

    def run(self, *args, **_):
        assert args[:2] == ("patch", "pod"), args
        self.patches.append(json.loads(args[-1])["status"])


@pytest.fixture(scope="module")
def binaries() -> Path:
    value = os.environ.get("BASECAMP_E2E_BIN")
    if not value or not (Path(value) / "basecamp").exists():
        pytest.skip("BASECAMP_E2E_BIN with the basecamp binary is needed (scripts/e2e.sh sets it)")
    return Path(value)


@pytest.fixture(scope="module")
def traces(binaries: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("play-trainer") / "traces"
    subprocess.run([str(binaries / "basecamp"), "run", str(ROOT / "examples/ecommerce"), "--variant", "b",
                    "--shards", "1", "--out", str(out), "--no-progress"], check=True, capture_output=True,
                   timeout=120)
    return out


def trainer_pod(name: str, traces: Path, checkpoints: Path, preprocessor: str | None = None) -> dict:
    """A trainer pod shaped as TRAINING.md says (kwok has made it Running)."""
    env = [
        {"name": "BASECAMP_CHECKPOINTS", "value": f"{checkpoints}/"},
        {"name": "BASECAMP_DATASET", "value": f"{checkpoints}/dataset/"},
        {"name": "BASECAMP_COMPLETION_MARKER", "value": "COMPLETE"},
        {"name": "BASECAMP_TRAINING_CONFIG", "value": json.dumps({"modelId": "m", "optimizer": "adamw"})},
    ]
    args = ["data", "preprocess", str(traces), "--config", "/etc/basecamp/manifests.yaml", "--out",
            "$(BASECAMP_DATASET)"]
    if preprocessor:
        args += ["--preprocessor", preprocessor]
    bin_mount = {"name": "basecamp-bin", "mountPath": "/basecamp/bin"}
    return {
        "metadata": {"name": name, "namespace": "unit", "labels": {"basecamp.dev/role": "trainer"}},
        "spec": {
            "initContainers": [
                {"name": "inject-basecamp", "image": "basecamp:e2e", "command": ["/usr/local/bin/basecamp-operator"],
                 "args": ["inject-sandbox", "--from", "/usr/local/bin/basecamp", "--to", "/basecamp/bin/basecamp"],
                 "volumeMounts": [bin_mount]},
                {"name": "dataset", "image": "fixture", "command": ["/basecamp/bin/basecamp"], "args": args,
                 "env": env, "terminationMessagePolicy": "FallbackToLogsOnError",
                 "volumeMounts": [{**bin_mount, "readOnly": True},
                                  {"name": "manifests", "mountPath": "/etc/basecamp", "readOnly": True}]},
            ],
            "containers": [
                {"name": "trainer", "image": "fixture", "env": env, "terminationMessagePolicy": "FallbackToLogsOnError",
                 "command": ["python3", "trainer.py", "--checkpoints", "2", "--interval", "0"]},
            ],
            "volumes": [{"name": "basecamp-bin", "emptyDir": {}},
                        {"name": "manifests", "configMap": {"name": "cm"}}],
        },
    }


def player_for(binaries: Path) -> tuple[Player, StubKube]:
    manifests = "---\n".join((ROOT / p).read_text() for p in ("examples/training/task.yaml",
                                                              "examples/ecommerce/sandbox-a.yaml"))
    kube = StubKube({"cm": {"manifests.yaml": manifests}})
    player = Player(kube, binaries / "basecamp-sandbox", ROOT / "examples/ecommerce",  # type: ignore[arg-type]
                    basecamp_bin=binaries / "basecamp", training_files=ROOT / "examples/training")
    return player, kube


def test_termination_message_is_the_last_80_lines_and_2048_bytes(tmp_path: Path):
    log = tmp_path / "log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    message = termination_message(log)
    assert message.splitlines()[0] == "line 20" and message.splitlines()[-1] == "line 99"
    log.write_text("short\n" + "x" * 3000 + "\nerror: the last words\n")
    message = termination_message(log)
    assert len(message.encode()) == 2048 and message.endswith("error: the last words\n")


def test_trainer_pod_runs_dataset_then_trainer(binaries: Path, traces: Path, tmp_path: Path):
    player, kube = player_for(binaries)
    played = player.play_trainer(trainer_pod("good", traces, tmp_path / "ckpt"))
    assert played.containers == {"inject-basecamp": 0, "dataset": 0, "trainer": 0}, played
    dataset = json.loads((tmp_path / "ckpt/dataset/dataset.json").read_text())
    # The task's dataPipeline.batchSize, read from the ConfigMap's manifests.
    assert dataset["rows"] > 0 and dataset.get("batchSize", dataset.get("batch_size")) == 16, dataset
    for step in (10, 20):
        assert json.loads((tmp_path / f"ckpt/step-{step}/model.json").read_text())["dataset"]["rows"] == dataset["rows"]
        assert (tmp_path / f"ckpt/step-{step}/COMPLETE").exists()
    [status] = kube.patches
    assert status["phase"] == "Succeeded"
    assert [(s["name"], s["state"]["terminated"]["exitCode"]) for s in status["initContainerStatuses"]] == [
        ("inject-basecamp", 0), ("dataset", 0)]
    [trainer] = status["containerStatuses"]
    assert trainer["state"]["terminated"]["exitCode"] == 0 and "message" not in trainer["state"]["terminated"]


def test_failed_dataset_container_stops_the_pod_with_its_message(binaries: Path, traces: Path, tmp_path: Path):
    player, kube = player_for(binaries)
    played = player.play_trainer(trainer_pod("broken", traces, tmp_path / "ckpt", "python:no_such_module.fn"))
    assert played.containers == {"inject-basecamp": 0, "dataset": 1}, played
    [status] = kube.patches
    assert status["phase"] == "Failed"
    assert {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"} in status["conditions"]
    dataset = status["initContainerStatuses"][1]["state"]["terminated"]
    assert dataset["exitCode"] == 1 and "No module named 'no_such_module'" in dataset["message"], dataset
    assert len(dataset["message"].encode()) <= 2048
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert not (tmp_path / "ckpt/step-10").exists()


def test_failed_trainer_reports_its_last_line(binaries: Path, traces: Path, tmp_path: Path):
    player, kube = player_for(binaries)
    pod = trainer_pod("no-resume", traces, tmp_path / "ckpt")
    for c in pod["spec"]["initContainers"][1:] + pod["spec"]["containers"]:
        c["env"] = c["env"] + [{"name": "BASECAMP_RESUME_FROM", "value": f"{tmp_path}/ckpt/step-7/"}]
    played = player.play_trainer(pod)
    assert played.containers == {"inject-basecamp": 0, "dataset": 0, "trainer": 1}, played
    trainer = kube.patches[0]["containerStatuses"][0]["state"]["terminated"]
    assert trainer["message"].strip().endswith("step-7/COMPLETE does not exist"), trainer
    assert yaml.safe_dump(kube.patches[0])  # a valid patch body
