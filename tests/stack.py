"""One test's pipeline: its run, queue and settings, and a way to start each role."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from common.settings import Settings
from common.store import RunStore, connect
from tests.harness import Child, Procs, start_simulator, wait_for


class Stack:
    """The roles of one test, each started by its ``eaglegen`` command line."""

    def __init__(self, procs: Procs, redis_url: str, tmp: Path) -> None:
        self.procs = procs
        self.tmp = tmp
        self.run_name = f"t-{uuid.uuid4().hex[:8]}"
        self.out = tmp / "out.jsonl"
        self.env = {
            "EAGLEGEN_REDIS_URL": redis_url,
            "EAGLEGEN_RUN": self.run_name,
            "EAGLEGEN_QUEUE": f"q-{self.run_name}",
            "EAGLEGEN_BACKOFF_BASE": "0.05",
            "EAGLEGEN_BACKOFF_MAX": "0.3",
            "EAGLEGEN_MAX_RETRIES": "4",
            "EAGLEGEN_LEASE_TTL": "20",
            # Generous: on a loaded 2-core machine a healthy stream can pause for seconds, and
            # an abandoned stream keeps its server slot until the server notices.
            "EAGLEGEN_STALL_TIMEOUT": "60",
            # A worker stopped at the end of a test hands its in-flight samples back after this
            # (the default 20 s made some teardowns wait 20 s for streams nobody reads).
            "EAGLEGEN_SHUTDOWN_GRACE": "2",
        }
        self.settings = Settings(redis_url=redis_url, run=self.run_name)
        self.store = RunStore(connect(redis_url), self.settings.key_prefix, self.run_name)

    def simulator(self, *options: str) -> str:
        """Start a simulator, point the roles at it; its URL (without ``/v1``)."""
        sim = start_simulator(self.procs, *options)
        self.env["EAGLEGEN_ENDPOINTS"] = sim.endpoint
        return sim.url

    def worker(self, concurrency: int = 8, **extra: str) -> Child:
        env = {**self.env, **extra}
        return self.procs.start("worker", ["worker", "--concurrency", str(concurrency)], env)

    def collector(self) -> Child:
        return self.procs.start("collector", ["collect", "--out", str(self.out)], self.env)

    def enqueue(self, source: str | Path, *options: str) -> subprocess.CompletedProcess[str]:
        result = self.procs.run(["enqueue", str(source), *options], self.env)
        assert result.returncode == 0, result.stderr
        return result

    def enqueue_unchecked(
        self, source: str | Path, *options: str
    ) -> subprocess.CompletedProcess[str]:
        """``enqueue`` while no server answers (its parameters unchecked, with a warning): how a
        run meets a server that refuses what enqueue could not check."""
        from tests.harness import free_port

        closed = {"EAGLEGEN_ENDPOINTS": f"http://127.0.0.1:{free_port()}/v1"}
        result = self.procs.run(["enqueue", str(source), *options], {**self.env, **closed})
        assert result.returncode == 0, result.stderr
        assert "not checked against" in result.stderr
        return result

    def queue_keys(self) -> list[str]:
        """The broker's lists for this test's queue, one per priority step."""
        from broker.layout import queue_lists

        return queue_lists(self.env["EAGLEGEN_QUEUE"])

    def queued(self) -> int:
        """Task messages waiting in this test's queue."""
        return sum(self.store.r.llen(key) for key in self.queue_keys())

    def wait_complete(self, timeout: float = 120) -> None:
        wait_for(
            lambda: self.store.counts().complete,
            timeout,
            lambda: f"run completion ({self.store.counts()})\n{self.procs.logs()}",
        )

    def lines(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(x) for x in self.out.read_text().splitlines()]
