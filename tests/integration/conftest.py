"""Real Redis, real simulator, real Celery worker processes.

Redis comes from EAGLEGEN_TEST_REDIS_URL (default db 15 on the local server), flushed before
and after each test. Unreachable Redis skips the tests locally but fails them in CI.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from common.settings import Settings
from common.store import RunStore, connect

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "cli.main"]


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str | Callable[[], str], every: float = 0.1
) -> None:
    """Poll until ``predicate`` holds; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    if not predicate():
        text = what() if callable(what) else what
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {text}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reachable_redis(variable: str, default: str) -> str:
    """The Redis URL in ``variable`` (or ``default``): skipped locally when down, failed in CI."""
    url = os.environ.get(variable, default)
    try:
        connect(url).ping()
    except redis.RedisError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {url} is needed in CI: {exc}")
        pytest.skip(f"no Redis at {url}: {exc}")
    return url


@pytest.fixture(scope="session")
def redis_url() -> str:
    return reachable_redis("EAGLEGEN_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = connect(redis_url)
    client.flushdb()
    yield client
    client.flushdb()


class Procs:
    """Child processes of a test, all stopped at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}-{len(self.procs)}.log").open("wb")
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([*CLI, *args], cwd=ROOT, env=full_env, stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def run(self, args: list[str], env: dict[str, str], timeout: float = 120):
        return subprocess.run(
            [*CLI, *args],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.tmp.glob("*.log"))


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(p.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


class Stack:
    """One test's pipeline: its run, queue and settings, and ways to start each role."""

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
        }
        self.settings = Settings(redis_url=redis_url, run=self.run_name)
        self.store = RunStore(connect(redis_url), self.settings.key_prefix, self.run_name)

    def simulator(self, *options: str) -> str:
        port = free_port()
        proc = self.procs.start("simulator", ["simulate", "--port", str(port), *options], {})
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"simulator exited: {self.procs.logs()}")
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 30, "the simulator to answer /health")
        self.env["EAGLEGEN_ENDPOINTS"] = f"{url}/v1"
        return url

    def worker(self, concurrency: int = 8, **extra: str) -> subprocess.Popen[bytes]:
        env = {**self.env, **extra}
        return self.procs.start("worker", ["worker", "--concurrency", str(concurrency)], env)

    def collector(self) -> subprocess.Popen[bytes]:
        return self.procs.start("collector", ["collect", "--out", str(self.out)], self.env)

    def enqueue(self, source: str | Path, *options: str):
        result = self.procs.run(["enqueue", str(source), *options], self.env)
        assert result.returncode == 0, result.stderr
        return result

    def queue_keys(self) -> list[str]:
        """The broker's lists for this test's queue, one per priority step."""
        from common.keys import PRIORITY_SEP, PRIORITY_STEPS

        queue = self.env["EAGLEGEN_QUEUE"]
        return [queue if p == 0 else f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]

    def queued(self) -> int:
        """Task messages waiting in this test's queue."""
        return sum(self.store.r.llen(key) for key in self.queue_keys())

    def wait_complete(self, timeout: float = 120) -> None:
        wait_for(
            lambda: self.store.counts().complete,
            timeout,
            lambda: f"run completion ({self.store.counts()})\n{self.procs.logs()}",
        )

    def lines(self) -> list[dict]:
        import json

        return (
            [json.loads(x) for x in self.out.read_text().splitlines()] if self.out.exists() else []
        )


@pytest.fixture
def stack(procs: Procs, redis_url: str, rdb: redis.Redis, tmp_path: Path) -> Stack:
    return Stack(procs, redis_url, tmp_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
