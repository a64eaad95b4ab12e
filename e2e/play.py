"""Plays sandbox pods: kwok runs no containers, so this runs the real
`basecamp-sandbox` for a pod exactly as the kubelet would, then writes the
outcome back as the pod's status.

For one Running pod:
  * its `sandbox` container's command, args and env, with `$(VAR)` expanded
    from that env the way the kubelet expands it (JOB_COMPLETION_INDEX comes
    from the pod's `batch.kubernetes.io/job-completion-index` annotation
    through the downward API; `secretKeyRef`/`envFrom` Secrets are read from
    the cluster);
  * the ConfigMap volume's files written to a directory standing in for its
    mount path, and the emptyDir mounted at the working directory: only the
    path prefixes in args are rewritten;
  * the working directory holds the example's files (tools/, services/,
    policy.jsonl), as a tools image would. basecamp-sandbox resolves relative
    paths in the manifests against the manifests' own directory, so the
    ConfigMap's files go into that same directory (see README.md, "Findings");
  * the binary's exit status becomes the pod's phase (Succeeded on 0, else
    Failed) with the container's terminated state and exit code, a status
    patch as e2e/cluster/smoke.sh shows, so the Job controller counts it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kube import WORK, E2EError, Kube

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
SANDBOX_CONTAINER = "sandbox"


@dataclass
class Played:
    pod: str
    index: str
    exit_code: int
    seconds: float
    log: Path


@dataclass
class Player:
    kube: Kube
    sandbox_bin: Path
    files: Path  # the example's directory (tools/, services/, policy.jsonl)
    played: dict[str, Played] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def play(self, pod: dict, timeout: float = 600) -> Played:
        """Runs the pod's sandbox container here and records its outcome on the pod."""
        meta = pod["metadata"]
        name, ns = meta["name"], meta["namespace"]
        spec = pod["spec"]
        container = next(c for c in spec["containers"] if c["name"] == SANDBOX_CONTAINER)
        root = WORK / "play" / ns / name
        shutil.rmtree(root, ignore_errors=True)
        workdir = root / "work"
        shutil.copytree(self.files, workdir, ignore=shutil.ignore_patterns("*.yaml", "__pycache__", "generate.py"))
        # Volumes: ConfigMaps are written out; everything else is an emptyDir.
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        prefixes: list[tuple[str, str]] = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                cm = self.kube.json("configmap", volume["configMap"]["name"], "-n", ns)
                for key, text in (cm.get("data") or {}).items():
                    (workdir / key).write_text(text)
                prefixes.append((mount["mountPath"], str(workdir)))
            elif mount["mountPath"] == container.get("workingDir"):
                prefixes.append((mount["mountPath"], str(workdir)))
            elif mount["mountPath"] == "/tmp":
                (root / "tmp").mkdir(exist_ok=True)
                prefixes.append(("/tmp", str(root / "tmp")))
        env = container_env(self.kube, pod, container)
        args = [rewrite(expand(a, env), prefixes) for a in container.get("args") or []]
        command = [expand(c, env) for c in container["command"]]
        if not command[0].endswith("basecamp-sandbox"):
            raise E2EError(f"pod {name}: unexpected sandbox command {command}")
        # The image's binary is the one built here; PATH as an image would set it.
        argv = [str(self.sandbox_bin), *args]
        run_env = {"PATH": os.environ["PATH"], **env}
        log = root / "sandbox.log"
        started = datetime.now(timezone.utc)
        t0 = time.monotonic()
        with open(log, "w") as out:
            out.write(f"$ {' '.join(argv)}\n# env: {sorted(env)}\n")
            out.flush()
            proc = subprocess.Popen(argv, cwd=workdir, env=run_env, stdout=out, stderr=subprocess.STDOUT)
            pid_file = WORK / "pids" / f"sandbox-{ns}-{name}"
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(f"{proc.pid}\n")  # scripts/e2e.sh stops it if pytest is killed
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = 137
            pid_file.unlink(missing_ok=True)
        seconds = time.monotonic() - t0
        self.finish(pod, code, started)
        played = Played(name, env.get("JOB_COMPLETION_INDEX", "?"), code, seconds, log)
        with self.lock:
            self.played[name] = played
        return played

    def finish(self, pod: dict, code: int, started: datetime) -> None:
        """Writes the container's exit as the pod's terminal status."""
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        container = next(c for c in pod["spec"]["containers"] if c["name"] == SANDBOX_CONTAINER)
        fmt = "%Y-%m-%dT%H:%M:%SZ"
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted" if code == 0 else "PodFailed"}],
            "containerStatuses": [
                {
                    "name": SANDBOX_CONTAINER,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Completed" if code == 0 else "Error",
                            "startedAt": started.strftime(fmt),
                            "finishedAt": datetime.now(timezone.utc).strftime(fmt),
                        }
                    },
                }
            ],
        }
        self.kube.run("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-p",
                      json.dumps({"status": status}))

    def running_unplayed(self, namespace: str, selector: str) -> list[dict]:
        pods = self.kube.items("pods", "-n", namespace, "-l", selector)
        return [
            p for p in pods
            if p["status"].get("phase") == "Running" and p["metadata"]["name"] not in self.played
            and not p["metadata"].get("deletionTimestamp")
        ]

    def play_all(self, namespace: str, selector: str, expect: int, parallel: int = 2, timeout: float = 900,
                 until: Callable[[], bool] | None = None) -> list[Played]:
        """Plays every pod matching `selector` as it becomes Running (retried
        pods too) until `expect` pods have finished (or `until()` is true)."""
        deadline = time.monotonic() + timeout
        futures: list[Future] = []
        with ThreadPoolExecutor(parallel) as pool:
            while True:
                finished = [f.result() for f in futures if f.done()]
                if (until() if until is not None else len(finished) >= expect):
                    break
                if time.monotonic() > deadline:
                    raise E2EError(f"timed out playing pods {selector} in {namespace}: {len(finished)} of {expect} done")
                for pod in self.running_unplayed(namespace, selector):
                    with self.lock:  # taken: the next listing skips it
                        self.played[pod["metadata"]["name"]] = Played(pod["metadata"]["name"], "?", -1, 0, Path())
                    futures.append(pool.submit(self.play, pod))
                time.sleep(0.5)
        return [f.result() for f in futures]


def container_env(kube: Kube, pod: dict, container: dict) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom, then env)."""
    ns = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref = source.get("secretRef") or source.get("configMapRef")
        kind = "secret" if "secretRef" in source else "configmap"
        obj = kube.get(kind, ref["name"], "-n", ns)
        if obj is None:
            if ref.get("optional"):
                continue
            raise E2EError(f"pod {pod['metadata']['name']}: envFrom {kind} {ref['name']} not found")
        for k, v in (obj.get("data") or {}).items():
            env[source.get("prefix", "") + k] = base64.b64decode(v).decode() if kind == "secret" else v
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "valueFrom" in var:
            vf = var["valueFrom"]
            if "fieldRef" in vf:
                env[var["name"]] = field_ref(pod, vf["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in vf:
                ref = vf["secretKeyRef"]
                secret = kube.get("secret", ref["name"], "-n", ns)
                if secret is None or ref["key"] not in (secret.get("data") or {}):
                    raise E2EError(f"secret {ref['name']} key {ref['key']} missing")
                env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            else:
                raise E2EError(f"unsupported valueFrom {vf}")
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: a defined variable is replaced,
    `$$` escapes, anything else stays as written."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def rewrite(arg: str, prefixes: list[tuple[str, str]]) -> str:
    for mount, local in sorted(prefixes, key=lambda p: -len(p[0])):
        if arg == mount or arg.startswith(mount + "/"):
            return local + arg[len(mount):]
    return arg


def field_ref(pod: dict, path: str) -> str:
    m = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
    if m:
        value = (pod["metadata"].get(m.group(1)) or {}).get(m.group(2))
        if value is None:
            raise E2EError(f"pod {pod['metadata']['name']}: fieldRef {path} is not set")
        return value
    simple = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
              "spec.nodeName": pod["spec"].get("nodeName", "")}
    if path in simple:
        return simple[path]
    raise E2EError(f"unsupported fieldRef {path}")
