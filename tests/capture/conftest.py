"""Capture fixtures: a small target model, tokenized rows, and a capture pipeline per test."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from capture.files import sha256_of
from capture.store import CaptureStore
from common.store import connect
from tests.capture.helpers import build_model, make_rows, write_tokenized
from tests.harness import Child, Procs, wait_for

ROWS = 24


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("capture-model") / "model")


@pytest.fixture(scope="session")
def rows() -> list[list[int]]:
    return make_rows(ROWS)


@pytest.fixture
def tokenized(tmp_path: Path, rows: list[list[int]], model_dir: Path) -> Path:
    return write_tokenized(tmp_path / "tokenized", rows, model_dir)


class CaptureStack:
    """One test's capture roles, each started by its ``eaglegen`` command line."""

    def __init__(self, procs: Procs, redis_url: str, model_dir: Path, tmp: Path) -> None:
        self.procs = procs
        self.model_dir = model_dir
        self.tmp = tmp
        self.redis_url = redis_url
        tag = uuid.uuid4().hex[:8]
        self.env = {
            "EAGLEGEN_REDIS_URL": redis_url,
            "EAGLEGEN_CAPTURE_QUEUE": f"cq-{tag}",
            "EAGLEGEN_QUEUE": f"q-{tag}",
            "EAGLEGEN_BACKOFF_BASE": "0.05",
            "EAGLEGEN_BACKOFF_MAX": "0.3",
            "EAGLEGEN_LEASE_TTL": "20",
            "EAGLEGEN_RECONCILE_INTERVAL": "2",
            "EAGLEGEN_COLLECTOR_LOCK_TTL": "4",
        }

    def store(self, run: str) -> CaptureStore:
        return CaptureStore(connect(self.redis_url), "eaglegen", run)

    def worker(self, concurrency: int = 4, *more: str, **extra: str) -> Child:
        args = ["capture", "worker", "--model", str(self.model_dir), "--concurrency"]
        argv = [*args, str(concurrency), *more]
        return self.procs.start("capture-worker", argv, {**self.env, **extra})

    def enqueue(self, tokenized: Path, run: str, out: Path, layout: str, *more: str) -> Any:
        args = ["capture", "enqueue", str(tokenized), "--run", run, "--out", str(out)]
        return self.procs.run([*args, "--layout", layout, *more], self.env)

    def wait_complete(self, run: str, timeout: float = 180) -> None:
        store = self.store(run)
        wait_for(
            lambda: store.runs.counts().complete, timeout,
            lambda: f"run {run} complete ({store.runs.counts()})\n{self.procs.logs()}",
        )  # fmt: skip


@pytest.fixture
def capture_stack(procs: Procs, redis_url: str, rdb: Any, model_dir: Path, tmp_path: Path):
    return CaptureStack(procs, redis_url, model_dir, tmp_path)


def manifest(out: Path) -> list[dict[str, Any]]:
    """The manifest's lines."""
    path = out / "manifest.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def check_manifest(out: Path, rows: int) -> list[dict[str, Any]]:
    """Every row once, each file whole (its size and checksum as listed)."""
    lines = manifest(out)
    ids = Counter(line["id"] for line in lines)
    assert len(ids) == rows and max(ids.values()) == 1, ids.most_common(3)
    for line in lines:
        path = out / line["file"]
        assert path.stat().st_size == line["bytes"], line
        assert sha256_of(path) == line["sha256"], line
    return lines
