"""Plays sandbox pods: kwok runs no containers, so this runs the real
`basecamp-sandbox` for a pod exactly as the kubelet would, then writes the
outcome back as the pod's status.

For one Running pod:
  * its `sandbox` container's command, args and env, with `$(VAR)` expanded
    from that env the way the kubelet expands it (JOB_COMPLETION_INDEX comes
    from the pod's `batch.kubernetes.io/job-completion-index` annotation
    through the downward API; `secretKeyRef`/`envFrom` Secrets are read from
    the cluster);
  * each volume gets a directory of its own standing in for its mount path
    (a ConfigMap's files written into it; emptyDirs empty): only the path
    prefixes in args are rewritten, `--listen` becomes a free loopback port,
    and `--metrics-linger` becomes 0s (nothing scrapes a played pod: waiting
    for a final scrape would only slow the run) — unless the pod is played
    inside `Player.scraped(...)`: then its port is registered for the test's
    Prometheus with the labels the chart's PodMonitor gives, and it lingers
    long enough to be scraped;
  * the process starts in a directory holding the example's files (tools/,
    services/, policy.jsonl) standing in for the tools image's WORKDIR (the
    pod sets no workingDir), apart from the ConfigMap's directory, as in a
    real pod: the operator's `--base-dir .` is what finds them;
  * the binary's exit status becomes the pod's phase (Succeeded on 0, else
    Failed) with the container's terminated state and exit code, a status
    patch as e2e/cluster/smoke.sh shows, so the Job controller counts it.

Trainer pods (label basecamp.dev/role=trainer, operator/TRAINING.md) are
played container by container, as the kubelet runs them:
  * `inject-*` init containers copy Basecamp's binaries into their emptyDir:
    here the locally built binaries are linked into the directory standing
    for that volume;
  * every other init container (`dataset`: `/basecamp/bin/basecamp data
    preprocess ...`) and then the `trainer` container run their command and
    args (`$(VAR)` expanded, mount paths rewritten to the volumes'
    directories) with the container's env, in a directory holding the
    trainer image's files (examples/training) standing for the image's
    WORKDIR, or in its volume's directory when `workingDir` is a mount (an
    emptyDir there hides the image's files, as in a real pod); an init
    container that fails stops the pod there, as with restartPolicy Never;
  * the pod's terminal status carries initContainerStatuses and
    containerStatuses with each container's terminated state and exit code,
    and, for a failed container with terminationMessagePolicy
    FallbackToLogsOnError, `message` = the tail of its log (the last 80 lines,
    at most 2048 bytes), as the kubelet sets it.
`Background` plays every pod of a selector as it starts, so a trainer that
sleeps between checkpoints runs while the evaluation pods it causes are played.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kube import WORK, E2EError, Kube, free_port

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# The pod labels the chart's sandbox PodMonitor turns into task/variant/shard (values.yaml).
SCRAPE_LABELS = {"task": "basecamp.dev/task", "variant": "basecamp.dev/variant",
                 "shard": "batch.kubernetes.io/job-completion-index"}
SANDBOX_CONTAINER = "sandbox"
ROLE_LABEL = "basecamp.dev/role"
TRAINER_ROLE = "trainer"
# The kubelet's FallbackToLogsOnError: at most this many lines and bytes of the log's tail.
TERMINATION_LOG_LINES = 80
TERMINATION_LOG_BYTES = 2048
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass
class Played:
    pod: str
    index: str
    exit_code: int
    seconds: float
    log: Path
    labels: dict[str, str] = field(default_factory=dict)
    # Trainer pods: every container run, in order, with its exit code.
    containers: dict[str, int] = field(default_factory=dict)


@dataclass
class Ran:
    """One container run here: its exit code and times."""
    name: str
    exit_code: int
    started: datetime
    finished: datetime
    log: Path


@dataclass
class Player:
    kube: Kube
    sandbox_bin: Path
    files: Path  # the example's directory (tools/, services/, policy.jsonl)
    basecamp_bin: Path | None = None  # the `basecamp` CLI (a trainer pod's dataset init container)
    training_files: Path | None = None  # the trainer image's files (examples/training)
    played: dict[str, Played] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: dict[int, subprocess.Popen] = field(default_factory=dict)  # what abort() kills
    # Set by scraped(): where to register sandbox pods for Prometheus, and their linger.
    scrape_targets: Path | None = None
    scrape_linger: str = "0s"

    @contextmanager
    def scraped(self, targets: Path, linger: str = "10s"):
        """Sandbox pods played inside are scraped: each registers its
        metrics port in `targets` (Prometheus file discovery) while it runs,
        waits for a first scrape before its episodes and lingers after them
        (both `--metrics-linger`) so that discovery and a scrape catch its
        series at zero and its final counts."""
        self.scrape_targets, self.scrape_linger = targets, linger
        try:
            yield self
        finally:
            self.scrape_targets, self.scrape_linger = None, "0s"

    def play(self, pod: dict, timeout: float = 600) -> Played:
        """Runs the pod's sandbox container here and records its outcome on the pod."""
        meta = pod["metadata"]
        name, ns = meta["name"], meta["namespace"]
        spec = pod["spec"]
        container = next(c for c in spec["containers"] if c["name"] == SANDBOX_CONTAINER)
        root = WORK / "play" / ns / name
        shutil.rmtree(root, ignore_errors=True)
        image_dir = root / "image"  # the tools image's WORKDIR
        shutil.copytree(self.files, image_dir, ignore=shutil.ignore_patterns("*.yaml", "__pycache__", "generate.py"))
        # Volumes: ConfigMaps are written out; everything else is an emptyDir.
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        prefixes: list[tuple[str, str]] = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            local = root / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                cm = self.kube.json("configmap", volume["configMap"]["name"], "-n", ns)
                for key, text in (cm.get("data") or {}).items():
                    (local / key).write_text(text)
            prefixes.append((mount["mountPath"], str(local)))
        working_dir = container.get("workingDir")
        cwd = Path(rewrite(working_dir, prefixes)) if working_dir else image_dir
        env = container_env(self.kube, pod, container)
        targets = self.scrape_targets
        port = free_port() if targets else 0
        args = loopback_listen([rewrite(expand(a, env), prefixes) for a in container.get("args") or []],
                               port, self.scrape_linger if targets else "0s")
        target_file = targets / f"{ns}_{name}.json" if targets else None
        if target_file:
            pod_labels = meta.get("labels") or {}
            labels = {"namespace": ns, "pod": name, "container": SANDBOX_CONTAINER,
                      **{k: pod_labels[v] for k, v in SCRAPE_LABELS.items() if v in pod_labels}}
            target_file.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": labels}]))
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
            out.write(f"$ {' '.join(argv)}\n# cwd: {cwd}\n# env: {sorted(env)}\n")
            out.flush()
            proc = subprocess.Popen(argv, cwd=cwd, env=run_env, stdout=out, stderr=subprocess.STDOUT)
            self.running[proc.pid] = proc
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
            self.running.pop(proc.pid, None)
        if target_file:
            target_file.unlink(missing_ok=True)
        seconds = time.monotonic() - t0
        self.finish(pod, code, started, log)
        played = Played(name, env.get("JOB_COMPLETION_INDEX", "?"), code, seconds, log, dict(meta.get("labels") or {}))
        with self.lock:
            self.played[name] = played
        return played

    def finish(self, pod: dict, code: int, started: datetime, log: Path) -> None:
        """Writes the container's exit as the pod's terminal status (with the
        kubelet's FallbackToLogsOnError message when it failed)."""
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        container = next(c for c in pod["spec"]["containers"] if c["name"] == SANDBOX_CONTAINER)
        fmt = TIME_FORMAT
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started.strftime(fmt),
            "finishedAt": datetime.now(timezone.utc).strftime(fmt),
        }
        if code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            terminated["message"] = termination_message(log)
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
                    "state": {"terminated": terminated},
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
                    futures.append(pool.submit(self.play_pod, pod))
                time.sleep(0.5)
        return [f.result() for f in futures]

    def play_pod(self, pod: dict) -> Played:
        """A trainer pod as a trainer, anything else as a sandbox pod."""
        if (pod["metadata"].get("labels") or {}).get(ROLE_LABEL) == TRAINER_ROLE:
            return self.play_trainer(pod)
        return self.play(pod)

    def play_trainer(self, pod: dict, timeout: float = 600) -> Played:
        """Runs a trainer pod's init containers, then its containers, here (see
        the module docs), and records the outcome on the pod."""
        meta, spec = pod["metadata"], pod["spec"]
        name, ns = meta["name"], meta["namespace"]
        if self.basecamp_bin is None or self.training_files is None:
            raise E2EError(f"pod {name}: a trainer pod needs Player.basecamp_bin and Player.training_files")
        root = WORK / "play" / ns / name
        shutil.rmtree(root, ignore_errors=True)
        image_dir = root / "image"  # the trainer image's WORKDIR
        shutil.copytree(self.training_files, image_dir, ignore=shutil.ignore_patterns("__pycache__"))
        volume_dirs = self.volume_dirs(pod, root / "volumes")
        deadline = time.monotonic() + timeout
        t0 = time.monotonic()
        ran: list[Ran] = []
        for container in spec.get("initContainers") or []:
            if container.get("restartPolicy") == "Always":
                raise E2EError(f"pod {name}: sidecar {container['name']} in a trainer pod is not played")
            if container["name"].startswith("inject-"):
                ran.append(self.inject(container, volume_dirs, root))
            else:
                ran.append(self.run_container(pod, container, volume_dirs, image_dir, root, deadline))
            if ran[-1].exit_code != 0:
                break
        else:
            for container in spec["containers"]:
                ran.append(self.run_container(pod, container, volume_dirs, image_dir, root, deadline))
        self.finish_containers(pod, ran)
        failed = next((r for r in ran if r.exit_code != 0), None)
        played = Played(name, TRAINER_ROLE, failed.exit_code if failed else 0, time.monotonic() - t0,
                        (failed or ran[-1]).log, dict(meta.get("labels") or {}), {r.name: r.exit_code for r in ran})
        with self.lock:
            self.played[name] = played
        return played

    def volume_dirs(self, pod: dict, base: Path) -> dict[str, Path]:
        """One local directory per volume: a ConfigMap's files written out, emptyDirs empty."""
        dirs: dict[str, Path] = {}
        ns = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes") or []:
            path = base / volume["name"]
            path.mkdir(parents=True)
            if "configMap" in volume:
                cm = self.kube.json("configmap", volume["configMap"]["name"], "-n", ns)
                for key, text in (cm.get("data") or {}).items():
                    (path / key).write_text(text)
            elif "emptyDir" not in volume:
                raise E2EError(f"pod {pod['metadata']['name']}: volume {volume['name']} is neither a ConfigMap "
                               f"nor an emptyDir: not played")
            dirs[volume["name"]] = path
        return dirs

    def inject(self, container: dict, volume_dirs: dict[str, Path], root: Path) -> Ran:
        """An `inject-*` init container copies Basecamp's binaries into its
        emptyDir: the local builds are linked there instead."""
        started = datetime.now(timezone.utc)
        binaries = {"basecamp": self.basecamp_bin, "basecamp-sandbox": self.sandbox_bin}
        log = root / f"{container['name']}.log"
        lines = []
        for mount in container.get("volumeMounts") or []:
            if mount.get("readOnly"):
                continue
            for binary, local in binaries.items():
                if local is not None:
                    (volume_dirs[mount["name"]] / binary).symlink_to(local)
                    lines.append(f"{mount['mountPath']}/{binary} -> {local}")
        log.write_text("\n".join(lines) + "\n")
        return Ran(container["name"], 0, started, datetime.now(timezone.utc), log)

    def run_container(self, pod: dict, container: dict, volume_dirs: dict[str, Path], image_dir: Path, root: Path,
                      deadline: float) -> Ran:
        """Runs one container's command and args here, in the image's
        directory (or its workingDir's volume), with its env."""
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        prefixes = [(m["mountPath"], str(volume_dirs[m["name"]])) for m in container.get("volumeMounts") or []]
        env = container_env(self.kube, pod, container)
        argv = [rewrite(expand(a, env), prefixes) for a in [*(container.get("command") or []),
                                                            *(container.get("args") or [])]]
        if not argv:
            raise E2EError(f"pod {name}: container {container['name']} has no command (an image entrypoint "
                           "cannot be played)")
        cwd = image_dir
        working_dir = container.get("workingDir")
        if working_dir:
            mounted = rewrite(working_dir, prefixes)
            cwd = Path(mounted) if mounted != working_dir else image_dir
        log = root / f"{container['name']}.log"
        (root / f"{container['name']}.cmd").write_text(f"$ {' '.join(argv)}\n# cwd: {cwd}\n# env: {sorted(env)}\n")
        run_env = {"PATH": os.environ["PATH"], **env}
        started = datetime.now(timezone.utc)
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, cwd=cwd, env=run_env, stdout=out, stderr=subprocess.STDOUT)
            self.running[proc.pid] = proc
            pid_file = WORK / "pids" / f"trainer-{ns}-{name}-{container['name']}"
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(f"{proc.pid}\n")
            try:
                code = proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = 137
            pid_file.unlink(missing_ok=True)
            self.running.pop(proc.pid, None)
        return Ran(container["name"], code, started, datetime.now(timezone.utc), log)

    def finish_containers(self, pod: dict, ran: list[Ran]) -> None:
        """Writes a multi-container pod's terminal status: one terminated
        state per container run, `waiting` for those never started."""
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        spec = pod["spec"]
        by_name = {r.name: r for r in ran}
        ok = all(r.exit_code == 0 for r in ran)
        init_ok = all(by_name.get(c["name"]) is not None and by_name[c["name"]].exit_code == 0
                      for c in spec.get("initContainers") or [])

        def state(container: dict, initializing: bool) -> dict:
            r = by_name.get(container["name"])
            base = {"name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": False,
                    "restartCount": 0, "started": False}
            if r is None:
                return {**base, "state": {"waiting": {"reason": "PodInitializing" if initializing else "Error"}}}
            terminated = {
                "exitCode": r.exit_code,
                "reason": "Completed" if r.exit_code == 0 else "Error",
                "startedAt": r.started.strftime(TIME_FORMAT),
                "finishedAt": r.finished.strftime(TIME_FORMAT),
            }
            if r.exit_code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                terminated["message"] = termination_message(r.log)
            return {**base, "state": {"terminated": terminated}}

        conditions = [{"type": "Ready", "status": "False", "reason": "PodCompleted" if ok else "PodFailed"}]
        if not init_ok:
            conditions.append({"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"})
        status = {
            "phase": "Succeeded" if ok else "Failed",
            "conditions": conditions,
            "initContainerStatuses": [state(c, False) for c in spec.get("initContainers") or []],
            "containerStatuses": [state(c, not init_ok) for c in spec["containers"]],
        }
        self.kube.run("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-p",
                      json.dumps({"status": status}))


def termination_message(log: Path) -> str:
    """The kubelet's FallbackToLogsOnError message: the log's last 80 lines, at most 2048 bytes of them."""
    data = log.read_bytes()
    lines = data.splitlines(keepends=True)[-TERMINATION_LOG_LINES:]
    tail = b"".join(lines)[-TERMINATION_LOG_BYTES:]
    return tail.decode(errors="replace")


class Background:
    """Plays every pod matching `selector` in `namespace` as it becomes
    Running, in background threads, until stopped: a long trainer runs while
    the evaluation pods its checkpoints cause are played."""

    def __init__(self, player: Player, namespace: str, selector: str, parallel: int = 3, timeout: float = 900):
        self.player, self.namespace, self.selector = player, namespace, selector
        self.deadline = time.monotonic() + timeout
        self.pool = ThreadPoolExecutor(parallel)
        self.futures: list[Future] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=f"play {selector}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stopping.is_set():
                if time.monotonic() > self.deadline:
                    raise E2EError(f"playing {self.selector} in {self.namespace} ran past its deadline")
                for pod in self.player.running_unplayed(self.namespace, self.selector):
                    with self.player.lock:
                        self.player.played[pod["metadata"]["name"]] = Played(pod["metadata"]["name"], "?", -1, 0,
                                                                             Path())
                    self.futures.append(self.pool.submit(self.player.play_pod, pod))
                self.stopping.wait(0.5)
        except BaseException as e:  # reported by results()/stop()
            self.error = e

    def results(self) -> list[Played]:
        """What has finished so far (a failed play raises here)."""
        if self.error is not None:
            raise self.error
        return [f.result() for f in list(self.futures) if f.done()]

    def running(self) -> int:
        return sum(1 for f in list(self.futures) if not f.done())

    def stop(self, timeout: float = 120) -> list[Played]:
        """Stops looking for new pods, waits (bounded) for those being played."""
        self.stopping.set()
        self.thread.join(10)
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.running():
            raise E2EError(f"{self.running()} pods of {self.selector} still playing {timeout:.0f}s after stop")
        return self.results()

    def abort(self) -> None:
        """After a failure: stops looking for pods and kills every process
        the player runs (a trainer sleeping between checkpoints would keep
        the interpreter from exiting)."""
        self.stopping.set()
        for proc in list(self.player.running.values()):
            proc.kill()
        self.pool.shutdown(wait=False, cancel_futures=True)


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


def loopback_listen(args: list[str], port: int = 0, linger: str = "0s") -> list[str]:
    """A pod's sandbox listens on all interfaces at a fixed port (its
    `metrics` port); played here, many at once, it listens on a loopback
    port instead (0: any free one) and lingers for a final scrape `linger`
    (0s when nothing scrapes it).

    >>> loopback_listen(["run", "--listen", "0.0.0.0:9464", "--metrics-linger", "45s", "--metrics-linger=1m"])
    ['run', '--listen', '127.0.0.1:0', '--metrics-linger', '0s', '--metrics-linger=0s']
    >>> loopback_listen(["run", "--listen", "0.0.0.0:9464", "--metrics-linger", "45s"], 9999, "10s")
    ['run', '--listen', '127.0.0.1:9999', '--metrics-linger', '10s']
    """
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--listen" and i + 1 < len(out):
            out[i + 1] = f"127.0.0.1:{port}"
        elif arg == "--metrics-linger" and i + 1 < len(out):
            out[i + 1] = linger
        elif arg.startswith("--metrics-linger="):
            out[i] = f"--metrics-linger={linger}"
    return out


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
