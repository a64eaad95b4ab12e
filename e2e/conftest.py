"""Session fixtures: the cluster (started by scripts/e2e.sh), the chart
installed with helm, the operator run here as the chart's ServiceAccount,
the task namespace with the e-commerce test set on S3, and the pod player.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kube import ROOT, WORK, E2EError, Kube, free_port, s3_client, wait_until  # noqa: E402
from play import Player, container_env  # noqa: E402

RELEASE = "basecamp"
RELEASE_NS = "basecamp"
SA = "basecamp"  # the chart's full name for release "basecamp"
TASK_NS = "e2e"
S3_SECRET = "basecamp-s3"
TEST_SET_KEY = "testsets/ecommerce/tests.jsonl"
POLICY_KEY = "testsets/ecommerce/policy.jsonl"


def record_pid(name: str, pid: int) -> None:
    """scripts/e2e.sh's trap stops what is recorded here if pytest itself is killed."""
    (WORK / "pids").mkdir(parents=True, exist_ok=True)
    (WORK / "pids" / name).write_text(f"{pid}\n")


def need(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        pytest.exit(f"{var} is not set: run the e2e tests through scripts/e2e.sh", returncode=2)
    return value


@pytest.fixture(scope="session")
def kube() -> Kube:
    return Kube(need("KUBECONFIG"))


@pytest.fixture(scope="session")
def s3():
    return s3_client()


@pytest.fixture(scope="session")
def bucket() -> str:
    return need("BASECAMP_E2E_S3_BUCKET")


def secret_manifest(namespace: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": S3_SECRET, "namespace": namespace},
        "stringData": {
            "AWS_ACCESS_KEY_ID": need("BASECAMP_E2E_S3_ACCESS_KEY"),
            "AWS_SECRET_ACCESS_KEY": need("BASECAMP_E2E_S3_SECRET_KEY"),
        },
    }


@pytest.fixture(scope="session")
def chart(kube: Kube) -> dict:
    """`helm install` of charts/basecamp pointing the operator at the S3 server.
    Returns the values used and the operator's Deployment."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NS}})
    kube.apply(secret_manifest(RELEASE_NS))
    values = {
        "operator": {"logFormat": "text", "logLevel": "info,basecamp_operator=debug,kube=warn"},
        "s3": {
            "endpoint": need("BASECAMP_E2E_S3_ENDPOINT"),
            "region": "us-east-1",
            "credentials": {"existingSecret": S3_SECRET},
        },
        "sandbox": {"s3Secret": S3_SECRET, "image": {"repository": "basecamp", "tag": "e2e"}},
        "image": {"tag": "e2e"},
    }
    values_file = WORK / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm = need("BASECAMP_E2E_HELM")
    p = subprocess.run(
        [helm, "upgrade", "--install", RELEASE, str(ROOT / "charts/basecamp"), "-n", RELEASE_NS, "-f", str(values_file),
         "--wait", "--timeout", "120s"],
        capture_output=True, text=True, timeout=180, env=dict(os.environ),
    )
    if p.returncode != 0:
        raise E2EError(f"helm install failed: {p.stderr}\n{p.stdout}")
    deployment = kube.json("deployment", SA, "-n", RELEASE_NS)
    return {"values": values, "deployment": deployment, "helm_output": p.stdout}


def sa_kubeconfig(kube: Kube) -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount with a
    token from the TokenRequest API, so RBAC really applies."""
    token = kube.run("create", "token", SA, "-n", RELEASE_NS, "--duration=3h").out.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": need("BASECAMP_E2E_API_SERVER"),
                                                 "certificate-authority": need("BASECAMP_E2E_CA")}}],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "e2e", "user": SA, "namespace": RELEASE_NS}}],
        "current-context": "operator",
    }
    path = WORK / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class Operator:
    """The real basecamp-operator, run here with the command line and
    environment of the chart's Deployment (its pod, which kwok schedules but
    does not run, gives the downward-API values)."""

    def __init__(self, kube: Kube, deployment: dict, kubeconfig: Path):
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        pod = wait_until("the operator Deployment's pod to be Running on a kwok node",
                         lambda: [p for p in kube.items("pods", "-n", RELEASE_NS, "-l", selector)
                                  if p["status"].get("phase") == "Running"], timeout=120)[0]
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "operator")
        self.env = container_env(kube, pod, container)
        self.args = []
        for arg in container.get("args") or []:
            if arg.startswith("--metrics-addr="):
                arg = f"--metrics-addr=127.0.0.1:{self.port}"
            self.args.append(arg)
        from play import expand

        self.args = [expand(a, self.env) for a in self.args]
        self.pod_name = pod["metadata"]["name"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "the operator is already running"
        self.starts += 1
        log = open(WORK / f"operator-{self.starts}.log", "w")
        env = {"PATH": os.environ["PATH"], "HOME": str(WORK), "KUBECONFIG": str(self.kubeconfig), **self.env}
        self.proc = subprocess.Popen([str(self.binary()), *self.args], env=env, stdout=log, stderr=subprocess.STDOUT)
        record_pid("basecamp-operator", self.proc.pid)
        wait_until("the operator's /readyz", self.ready, timeout=60)

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise E2EError(f"the operator exited (code {self.proc.returncode if self.proc else None}); "
                           f"log: {WORK}/operator-{self.starts}.log")
        try:
            return requests.get(self.url + "/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    @staticmethod
    def binary() -> Path:
        """The benchmark's release build when scripts/e2e.sh made one, else the debug build."""
        release = os.environ.get("BASECAMP_E2E_OPERATOR_BIN")
        return Path(release) if release else Path(need("BASECAMP_E2E_BIN")) / "basecamp-operator"

    def build(self) -> str:
        return "release" if self.binary().parent.name == "release" else "debug"

    def metrics(self) -> str:
        if self.proc is None or self.proc.poll() is not None:
            raise E2EError(f"the operator is not running (exit {self.proc.returncode if self.proc else None}; "
                           f"a concurrent scripts/e2e.sh with the same BASECAMP_E2E_WORK stops it); "
                           f"log: {WORK}/operator-{self.starts}.log")
        return requests.get(self.url + "/metrics", timeout=5).text

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def log(self) -> str:
        return (WORK / f"operator-{self.starts}.log").read_text(errors="replace")


class Prometheus:
    """Debian's prometheus scraping the operator on loopback every second
    (job `basecamp-metrics`, the metrics Service's name, as the chart's
    ServiceMonitor would name it; honor_labels as the ServiceMonitor sets),
    and the sandbox pods the player registers in `sandbox_targets` (job
    `basecamp-sandbox`, file discovery standing in for the chart's
    PodMonitor: the pod's namespace, name and container, and its task,
    variant and shard labels)."""

    def __init__(self, binary: str, target: str):
        self.port = free_port()
        data = WORK / "prometheus"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        self.sandbox_targets = data / "sandboxes"
        self.sandbox_targets.mkdir()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "basecamp-metrics", "honor_labels": True, "static_configs": [{"targets": [target]}]},
                # Scraped less often than a played shard lasts (a few seconds or
                # less), as a chart's 15 s PodMonitor scrapes real pods: the
                # sandbox waits for a first scrape (its series at zero) before its
                # episodes and for one of its final counts after them
                # (--metrics-linger), so every rate() panel still has data.
                {"job_name": "basecamp-sandbox", "scrape_interval": "3s", "scrape_timeout": "2s",
                 "file_sd_configs": [{"files": [str(self.sandbox_targets / "*.json")], "refresh_interval": "1s"}]},
            ],
        }
        (data / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc = subprocess.Popen(
            [binary, f"--config.file={data / 'prometheus.yml'}", f"--storage.tsdb.path={data / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(WORK / "prometheus.log", "w"), stderr=subprocess.STDOUT)
        record_pid("prometheus", self.proc.pid)
        wait_until("prometheus /-/ready", self.ready, timeout=60)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise E2EError(f"prometheus exited ({self.proc.returncode}); log: {WORK}/prometheus.log")
        try:
            return requests.get(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def query(self, expr: str) -> list:
        r = requests.get(f"http://127.0.0.1:{self.port}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise E2EError(f"prometheus query failed: {expr}: {body}")
        return body["data"]["result"]

    def label_values(self, label: str, match: str, seconds: float = 3600) -> list[str]:
        """The values of `label` on series matching `match` over the last
        `seconds`, as Grafana's label_values(match, label) asks for them."""
        now = time.time()
        r = requests.get(f"http://127.0.0.1:{self.port}/api/v1/label/{label}/values",
                         params={"match[]": match, "start": now - seconds, "end": now}, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise E2EError(f"prometheus label values failed: {label} of {match}: {body}")
        return body["data"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def operator(kube: Kube, chart: dict):
    op = Operator(kube, chart["deployment"], sa_kubeconfig(kube))
    op.start()
    yield op
    op.stop()


@pytest.fixture(scope="session", autouse=True)
def prometheus(request):
    """Started with the operator (when prometheus is installed), so the
    dashboards test sees the whole run's series."""
    binary = os.environ.get("BASECAMP_E2E_PROMETHEUS")
    if not binary or not any("operator" in item.fixturenames for item in request.session.items):
        yield None
        return
    op = request.getfixturevalue("operator")
    prom = Prometheus(binary, f"127.0.0.1:{op.port}")
    yield prom
    prom.stop()


@pytest.fixture(scope="session")
def task_ns(kube: Kube, s3, bucket: str) -> str:
    """The namespace tasks run in: the sandbox pods' S3 Secret, and the
    e-commerce test set uploaded to S3."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TASK_NS}})
    kube.apply(secret_manifest(TASK_NS))
    s3.upload_file(str(ROOT / "examples/ecommerce/tests.jsonl"), bucket, TEST_SET_KEY)
    s3.upload_file(str(ROOT / "examples/ecommerce/policy.jsonl"), bucket, POLICY_KEY)
    return TASK_NS


@pytest.fixture(scope="session")
def player(kube: Kube) -> Player:
    binaries = Path(need("BASECAMP_E2E_BIN"))
    return Player(kube, binaries / "basecamp-sandbox", ROOT / "examples/ecommerce",
                  basecamp_bin=binaries / "basecamp", training_files=ROOT / "examples/training")


def ecommerce_manifests(name: str, bucket: str, *, gpu: dict | None = None, retention: str | None = None,
                        shards: int = 2, variants: tuple[str, ...] = ("a", "b"),
                        criteria: list[str] | None = None) -> list[dict]:
    """The HarnessTask and SandboxConfigs of examples/ecommerce, renamed
    `<name>`, `<name>-a`, `<name>-b`, with the test set, the scripted policy
    and the trace destination on S3, and optionally a GPU requirement and a retention."""
    src = ROOT / "examples/ecommerce"
    task = yaml.safe_load((src / "task.yaml").read_text())
    docs = []
    for variant in variants:
        sandbox = yaml.safe_load((src / f"sandbox-{variant}.yaml").read_text())
        sandbox["metadata"]["name"] = f"{name}-{variant}"
        if gpu is not None:
            sandbox["spec"]["gpu"] = gpu
        docs.append(sandbox)
    task["metadata"]["name"] = name
    if criteria is not None:
        task["spec"]["taskDefinition"]["successCriteria"] = criteria
    task["spec"]["evaluation"]["testSet"] = f"s3://{bucket}/{TEST_SET_KEY}"
    # Pods have no local files of the task: the operator wants the scripted policy on S3 too.
    task["spec"]["policy"]["scripted"] = f"s3://{bucket}/{POLICY_KEY}"
    task["spec"]["traces"] = {"destination": f"s3://{bucket}/traces"}
    if retention:
        task["spec"]["traces"]["retention"] = retention
    task["spec"]["variants"] = [{"name": v, "sandboxRef": {"name": f"{name}-{v}"}} for v in variants]
    task["spec"]["shards"] = shards
    task["spec"]["parallelism"] = shards
    docs.append(task)
    return docs


def delete_tasks(kube: Kube, namespace: str, names: list[str], timeout: int = 60) -> None:
    """Deletes tasks left by an earlier run against a kept cluster (the
    operator, running, removes their finalizers)."""
    if names:
        kube.run("delete", "harnesstask", *names, "-n", namespace, "--ignore-not-found", "--wait=true",
                 f"--timeout={timeout}s", timeout=timeout + 10)


def pytest_sessionfinish(session, exitstatus):
    # Keep the played pods' logs only when something failed.
    if exitstatus == 0 and os.environ.get("BASECAMP_E2E_KEEP") != "1":
        shutil.rmtree(WORK / "play", ignore_errors=True)


def timed(what: str):
    """Context manager printing how long a step took (pytest -s / -rA shows it)."""

    class _T:
        def __enter__(self):
            self.t = time.monotonic()
            return self

        def __exit__(self, *exc):
            print(f"[timing] {what}: {time.monotonic() - self.t:.1f}s")

    return _T()


def pytest_collection_modifyitems(config, items):
    """Benchmarks (bench_*.py) run only with BASECAMP_E2E_BENCH=1, and last."""
    bench = [i for i in items if Path(str(i.fspath)).name.startswith("bench_")]
    if os.environ.get("BASECAMP_E2E_BENCH") != "1":
        for item in bench:
            item.add_marker(pytest.mark.skip(reason="a benchmark: set BASECAMP_E2E_BENCH=1"))
    items[:] = [i for i in items if i not in bench] + bench
