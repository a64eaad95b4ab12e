#!/usr/bin/env python3
"""A stand-in trainer that speaks Basecamp's training-loop contract
(operator/TRAINING.md) and trains nothing.

It reads what the operator gives a trainer container:

  BASECAMP_CHECKPOINTS        where checkpoints go (s3://bucket/prefix/ or a directory)
  BASECAMP_COMPLETION_MARKER  the object written last in each checkpoint (default COMPLETE)
  BASECAMP_RESUME_FROM        the checkpoint to resume from, .../step-N/ (optional)
  BASECAMP_DATASET            the preprocessed dataset, .../dataset/ with dataset.json
  BASECAMP_TRAINING_CONFIG    spec.trainingConfig as JSON (modelId, optimizer, lrSchedule)
  AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, [AWS_SESSION_TOKEN, AWS_REGION]

checks that the dataset exists and has rows (and that resumeFrom is a
complete checkpoint), then every --interval seconds writes the next of
--checkpoints checkpoints, step R+10, R+20, ... (R: resumeFrom's step, 0
without one): `step-N/model.json` first, `step-N/<marker>` last, so a
reader that sees the marker sees a whole checkpoint. One line per checkpoint
on stdout. Any failure exits 1 with one line saying what was wrong and
where, which Kubernetes keeps as the container's termination message.

Python's standard library only (S3 requests are signed with SigV4 here), so
the image is `python:3-slim` plus this file (see Dockerfile).

    python3 trainer.py --checkpoints 3 --interval 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import hmac
import json
import math
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path


class TrainerError(Exception):
    """A failure the trainer reports in one line and exits 1 on."""


# --- storage: s3://bucket/key through SigV4, or a local directory ------------------------------


class S3:
    """The few S3 calls a trainer needs (GET, PUT, HEAD), signed with AWS
    Signature Version 4; path-style against AWS_ENDPOINT_URL_S3 (s3s-fs,
    MinIO), virtual-hosted against AWS otherwise."""

    def __init__(self, env: dict[str, str]):
        self.endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "").rstrip("/")
        self.region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.access_key = env.get("AWS_ACCESS_KEY_ID", "")
        self.secret_key = env.get("AWS_SECRET_ACCESS_KEY", "")
        self.token = env.get("AWS_SESSION_TOKEN", "")

    def _url(self, bucket: str, key: str) -> tuple[str, str, str]:
        """(url, host, canonical path) of one object."""
        path = urllib.parse.quote(key, safe="/-_.~")
        if self.endpoint:
            base = urllib.parse.urlsplit(self.endpoint)
            canonical = f"{base.path.rstrip('/')}/{bucket}/{path}"
            return f"{base.scheme}://{base.netloc}{canonical}", base.netloc, canonical
        host = f"{bucket}.s3.{self.region}.amazonaws.com"
        return f"https://{host}/{path}", host, f"/{path}"

    def _headers(self, method: str, host: str, canonical_path: str, body: bytes) -> dict[str, str]:
        if not self.access_key:
            return {}
        now = dt.datetime.now(dt.timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = {"host": host, "x-amz-content-sha256": hashlib.sha256(body).hexdigest(), "x-amz-date": amz_date}
        if self.token:
            headers["x-amz-security-token"] = self.token
        signed = ";".join(sorted(headers))
        canonical_request = "\n".join([
            method, canonical_path, "",
            "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers)),
            signed, headers["x-amz-content-sha256"],
        ])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical_request.encode()).hexdigest()])
        key = ("AWS4" + self.secret_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={signature}")
        del headers["host"]  # urllib sends the same Host itself
        return headers

    def request(self, method: str, bucket: str, key: str, body: bytes = b"") -> bytes | None:
        """The response body; None on 404. Three tries on connection errors and 5xx."""
        url, host, canonical = self._url(bucket, key)
        last = ""
        for attempt in range(3):
            req = urllib.request.Request(url, data=body if method == "PUT" else None, method=method,
                                         headers=self._headers(method, host, canonical, body))
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return resp.read()
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                detail = e.read().decode(errors="replace")
                code = re.search(r"<Code>([^<]+)</Code>", detail)
                last = f"HTTP {e.code}{' ' + code.group(1) if code else ''}"
                if e.code < 500:
                    break
            except (urllib.error.URLError, OSError) as e:
                last = str(getattr(e, "reason", e))
            time.sleep(0.5 * (attempt + 1))
        raise TrainerError(f"S3 {method} s3://{bucket}/{key} at {self.endpoint or 'AWS'} failed: {last}")


class Store:
    """Objects under s3:// URIs or files under directories, by the same URI-ish names."""

    def __init__(self, env: dict[str, str]):
        self.s3 = S3(env)

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        bucket, _, key = uri[len("s3://"):].partition("/")
        if not bucket:
            raise TrainerError(f"{uri!r} names no bucket: write s3://bucket/prefix/")
        return bucket, key

    def get(self, uri: str) -> bytes | None:
        if uri.startswith("s3://"):
            return self.s3.request("GET", *self._split(uri))
        path = Path(uri)
        return path.read_bytes() if path.is_file() else None

    def exists(self, uri: str) -> bool:
        if uri.startswith("s3://"):
            return self.s3.request("HEAD", *self._split(uri)) is not None
        return Path(uri).is_file()

    def put(self, uri: str, body: bytes) -> None:
        if uri.startswith("s3://"):
            self.s3.request("PUT", *self._split(uri), body=body)
            return
        path = Path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(body)
        tmp.replace(path)


# --- the trainer ------------------------------------------------------------------------------------


def prefix(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def step_of(checkpoint: str) -> int:
    """The N of a checkpoint location `.../step-N/` (zero padding allowed)."""
    m = re.search(r"(?:^|/)step-(\d+)/?$", checkpoint)
    if not m:
        raise TrainerError(f"BASECAMP_RESUME_FROM={checkpoint!r} does not end in step-N/: "
                           "point trainingConfig.resumeFrom at a checkpoint written as <checkpoints>/step-N/")
    return int(m.group(1))


def learning_rate(config: dict, step: int) -> float:
    """lrSchedule {type: cosine|constant, lr, warmup_steps, total_steps} at `step`."""
    schedule = config.get("lrSchedule") or {}
    peak = float(schedule.get("lr", 2e-5))
    warmup = int(schedule.get("warmup_steps", 0))
    total = int(schedule.get("total_steps", 1000))
    if warmup and step < warmup:
        return peak * step / warmup
    if schedule.get("type", "cosine") == "constant":
        return peak
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def read_dataset(store: Store, env: dict[str, str]) -> dict:
    dataset = env.get("BASECAMP_DATASET")
    if not dataset:
        raise TrainerError("BASECAMP_DATASET is not set: this trainer needs the task's spec.dataPipeline "
                           "(the operator then preprocesses it into <checkpoints>/dataset/)")
    where = prefix(dataset) + "dataset.json"
    body = store.get(where)
    if body is None:
        raise TrainerError(f"no dataset at {where}: the dataset init container did not write it "
                           "(see `kubectl logs <trainer pod> -c dataset`)")
    try:
        manifest = json.loads(body)
    except ValueError as e:
        raise TrainerError(f"{where} is not JSON ({e})") from None
    rows = manifest.get("rows") if isinstance(manifest, dict) else None
    if not isinstance(rows, int) or rows <= 0:
        raise TrainerError(f"{where} holds no rows ({rows!r}): check dataPipeline.source and the preprocessor")
    return {"location": prefix(dataset), "rows": rows, "batches": len(manifest.get("batches") or []),
            "preprocessor": manifest.get("preprocessor"), "version": manifest.get("version")}


def train(args: argparse.Namespace, env: dict[str, str]) -> int:
    checkpoints = env.get("BASECAMP_CHECKPOINTS")
    if not checkpoints:
        raise TrainerError("BASECAMP_CHECKPOINTS is not set: run this as a HarnessTask's trainingConfig.command "
                           "(or export it: s3://bucket/prefix/ or a directory)")
    checkpoints = prefix(checkpoints)
    marker = env.get("BASECAMP_COMPLETION_MARKER") or "COMPLETE"
    try:
        config = json.loads(env.get("BASECAMP_TRAINING_CONFIG") or "{}")
    except ValueError as e:
        raise TrainerError(f"BASECAMP_TRAINING_CONFIG is not JSON ({e})") from None
    store = Store(env)

    resume_from = env.get("BASECAMP_RESUME_FROM") or ""
    start, resumed = 0, None
    if resume_from:
        start = step_of(resume_from)
        if not store.exists(prefix(resume_from) + marker):
            raise TrainerError(f"resumeFrom {prefix(resume_from)} is not a complete checkpoint: "
                               f"{prefix(resume_from)}{marker} does not exist")
        previous = store.get(prefix(resume_from) + "model.json")
        resumed = json.loads(previous) if previous else {}
        print(f"resuming from step {start} ({prefix(resume_from)})", flush=True)

    dataset = read_dataset(store, env)
    print(f"dataset: {dataset['rows']} rows in {dataset['batches']} batch(es) at {dataset['location']}", flush=True)

    for i in range(1, args.checkpoints + 1):
        time.sleep(args.interval)
        step = start + i * args.step_size
        location = f"{checkpoints}step-{step}/"
        model = {
            "step": step,
            "resumed_from": prefix(resume_from) if resume_from else None,
            "resumed_from_step": start if resume_from else None,
            "previous_loss": (resumed or {}).get("loss"),
            "model_id": config.get("modelId") or env.get("BASECAMP_MODEL_ID"),
            "optimizer": config.get("optimizer"),
            "lr": learning_rate(config, step),
            "loss": round(2.0 / math.log(step + math.e), 6),
            "dataset": dataset,
            "task": env.get("BASECAMP_TASK"),
            "written_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        store.put(location + "model.json", json.dumps(model, indent=1).encode())
        # Written last: the operator evaluates a checkpoint only once this exists.
        store.put(location + marker, json.dumps({"step": step}).encode())
        print(f"checkpoint step {step}: {location} (lr {model['lr']:.3g}, loss {model['loss']})", flush=True)
    print(f"done: {args.checkpoints} checkpoint(s), steps {start + args.step_size}.."
          f"{start + args.checkpoints * args.step_size}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=3, help="checkpoints to write (default 3)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds before each checkpoint (default 2)")
    parser.add_argument("--step-size", type=int, default=10, help="training steps between checkpoints (default 10)")
    args = parser.parse_args(argv)
    if args.checkpoints < 1 or args.step_size < 1 or args.interval < 0:
        parser.error("--checkpoints and --step-size must be at least 1, --interval at least 0")
    # Deleted Job, drained node: stop at once; a checkpoint without its marker is never evaluated.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return train(args, dict(os.environ))
    except TrainerError as e:
        print(f"trainer: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
