"""kubectl, S3 and waiting helpers shared by the e2e scenarios.

Everything goes through the real `kubectl` (the one matching the server,
from e2e/cluster) with the admin kubeconfig unless a scenario asks for
another identity; every call and every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import boto3
import yaml
from botocore.config import Config as BotoConfig

ROOT = Path(os.environ.get("BASECAMP_E2E_ROOT", Path(__file__).resolve().parent.parent))
WORK = Path(os.environ.get("BASECAMP_E2E_WORK", "/tmp/basecamp-e2e-run"))


class E2EError(AssertionError):
    pass


def free_port() -> int:
    """A port free on 127.0.0.1 right now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(what: str, probe: Callable[[], Any], timeout: float = 120, interval: float = 0.5) -> Any:
    """Calls `probe` until it returns something truthy; fails after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except (subprocess.CalledProcessError, E2EError, KeyError, json.JSONDecodeError) as e:
            last_error = e
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise E2EError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Kube:
    """A kubectl bound to one kubeconfig."""

    def __init__(self, kubeconfig: str | Path, kubectl: str | None = None):
        self.kubeconfig = str(kubeconfig)
        self.kubectl = kubectl or os.environ.get("BASECAMP_E2E_KUBECTL", "kubectl")

    def run(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60) -> Result:
        env = dict(os.environ, KUBECONFIG=self.kubeconfig)
        p = subprocess.run(
            [self.kubectl, *args], input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and p.returncode != 0:
            raise E2EError(f"kubectl {' '.join(args)} failed (exit {p.returncode}): {p.stderr.strip()}")
        return Result(p.returncode, p.stdout, p.stderr)

    def json(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json").out)

    def get(self, *args: str) -> Any | None:
        r = self.run("get", *args, "-o", "json", check=False)
        if r.rc != 0:
            if "NotFound" in r.err or "not found" in r.err:
                return None
            raise E2EError(f"kubectl get {' '.join(args)}: {r.err.strip()}")
        return json.loads(r.out)

    def items(self, *args: str) -> list[dict]:
        return self.json(*args)["items"]

    def apply(self, docs: list[dict] | dict, *extra: str, check: bool = True) -> Result:
        if isinstance(docs, dict):
            docs = [docs]
        return self.run("apply", *extra, "-f", "-", input=yaml.safe_dump_all(docs), check=check)

    def can_i(self, verb: str, resource: str, as_user: str, namespace: str | None = None) -> bool:
        """`kubectl auth can-i` (the SubjectAccessReview the API server
        itself answers); `resource` may be `harnesstasks.basecamp.dev/status`."""
        resource, _, sub = resource.partition("/")
        args = ["auth", "can-i", verb, resource, f"--as={as_user}"]
        args += [f"--subresource={sub}"] if sub else []
        args += ["-n", namespace] if namespace else ["--all-namespaces"]
        r = self.run(*args, check=False)
        answer = r.out.strip()
        if answer not in ("yes", "no"):
            raise E2EError(f"kubectl {' '.join(args)}: unexpected answer {r.out!r} {r.err!r}")
        return answer == "yes"

    def events(self, namespace: str, name: str, kind: str = "HarnessTask") -> list[dict]:
        # events.k8s.io Events (what the operator's recorder writes) are also
        # served as core/v1 Events; the field selector works on the latter.
        return self.items(
            "events", "-n", namespace, "--field-selector", f"involvedObject.kind={kind},involvedObject.name={name}"
        )


def gauge(text: str, metric: str, **labels: str) -> float | None:
    """The value of `metric` with these labels (any order) in Prometheus text format."""
    for line in text.splitlines():
        m = re.match(rf"^{metric}\{{([^}}]*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return None


def s3_client():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["BASECAMP_E2E_S3_ENDPOINT"],
        aws_access_key_id=os.environ["BASECAMP_E2E_S3_ACCESS_KEY"],
        aws_secret_access_key=os.environ["BASECAMP_E2E_S3_SECRET_KEY"],
        region_name="us-east-1",
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def s3_keys(s3, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def s3_json(s3, bucket: str, key: str) -> Any:
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def condition(task: dict, type_: str) -> dict | None:
    for c in (task.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None
