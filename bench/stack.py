"""Processes of one benchmark scenario: simulators, workers, a collector; all stopped on exit.

Each scenario gets its own key prefix, run and queue in the benchmark database, so scenarios
never see each other's slots, caps or messages.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.enqueue_cmd import run_enqueue  # noqa: E402
from common.models import GenParams  # noqa: E402
from common.settings import Settings  # noqa: E402
from common.store import RunStore, connect  # noqa: E402
from worker.capacity import SlotTable  # noqa: E402

CLI = [sys.executable, "-m", "cli.main"]
# The simulator stands in for a GPU server, which has its own machine; here it shares two
# cores with the clients, and a client that takes its CPU slows the "server" down. Every
# client (EagleGen's processes and the baseline alike) therefore runs niced.
CLIENT = ["nice", "-n", "10"]
MODEL = "eaglegen-sim"


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.1
) -> None:
    """Poll until ``predicate`` holds; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def write_prompts(path: Path, n: int, tag: str) -> Path:
    """``n`` distinct single-turn prompts (the simulator derives each answer's length from it)."""
    with path.open("w") as out:
        for i in range(n):
            out.write(
                json.dumps({"id": f"{tag}-{i}", "prompt": f"{tag} question {i}: why?"}) + "\n"
            )
    return path


@dataclass
class Simulator:
    """One simulator process and its control endpoints."""

    url: str
    proc: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        """The OpenAI base URL."""
        return f"{self.url}/v1"

    def stats(self) -> dict[str, Any]:
        """GET /sim/stats."""
        body: dict[str, Any] = httpx.get(f"{self.url}/sim/stats", timeout=10).json()
        return body

    def configure(self, **change: Any) -> None:
        """POST /sim/config (capacity or pacing, mid-run)."""
        httpx.post(f"{self.url}/sim/config", json=change, timeout=10).raise_for_status()


@dataclass(frozen=True)
class Row:
    """One sample of a simulator's state."""

    at: float  # seconds since the sampler started
    running: int
    waiting: int
    slots: int  # the simulator's max_num_seqs at that moment
    tokens: int  # generated so far
    cap: int | None  # the endpoint's cap in Redis, when asked for


@dataclass
class Sampler:
    """Samples a simulator's running/waiting (and optionally a cap) in the background."""

    sim: Simulator
    cap: Callable[[], int | None] = lambda: None
    every: float = 0.2
    rows: list[Row] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Sampler:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            s = self.sim.stats()
            at = time.monotonic() - self._started
            row = Row(
                at, s["running"], s["waiting"], s["max_num_seqs"], s["tokens_generated"], self.cap()
            )
            self.rows.append(row)


class Stack:
    """The processes of one scenario, in the benchmark database."""

    def __init__(self, redis_url: str, workdir: Path, name: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.redis_url = redis_url
        self.prefix = f"bench-{name}-{tag}"
        self.queue = f"bench-{name}-{tag}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            "EAGLEGEN_REDIS_URL": redis_url,
            "EAGLEGEN_KEY_PREFIX": self.prefix,
            "EAGLEGEN_QUEUE": self.queue,
            "EAGLEGEN_RUN": name,
        }

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
        self.cleanup()

    def cleanup(self) -> None:
        """Delete this scenario's keys only: others may share the database."""
        r = connect(self.redis_url)
        for pattern in (f"{self.prefix}:*", f"{self.queue}*", f"_kombu.binding.{self.queue}*"):
            for key in r.scan_iter(match=pattern, count=1000):
                r.delete(key)

    def settings(self, run: str) -> Settings:
        """Settings as the scenario's processes see them, for ``run``."""
        return Settings(
            redis_url=self.redis_url,
            key_prefix=self.prefix,
            queue=self.queue,
            run=run,
            endpoints=self.env.get("EAGLEGEN_ENDPOINTS", "http://x/v1"),
        )

    def store(self, run: str) -> RunStore:
        """The store of one run of this scenario."""
        return RunStore(connect(self.redis_url), self.prefix, run)

    def start(
        self, name: str, args: list[str], env: dict[str, str], client: bool = True
    ) -> subprocess.Popen[bytes]:
        """Start a child process of the ``eaglegen`` command, logging to the scenario folder.

        Clients run at a lower priority than the simulator (see ``CLIENT``).
        """
        log = (self.dir / f"{name}-{len(self.procs)}.log").open("wb")
        full = {**os.environ, **self.env, **env, "PYTHONUNBUFFERED": "1"}
        command = [*CLIENT, *CLI, *args] if client else [*CLI, *args]
        proc = subprocess.Popen(command, cwd=ROOT, env=full, stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def simulator(self, *options: str) -> Simulator:
        """Start a simulator and wait until it answers."""
        port = free_port()
        args = ["simulate", "--port", str(port), *options]
        proc = self.start("simulator", args, {}, client=False)
        sim = Simulator(f"http://127.0.0.1:{port}", proc)

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"simulator exited; see {self.dir}")
            try:
                return httpx.get(f"{sim.url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, "the simulator")
        return sim

    def worker(self, concurrency: int, **env: str) -> subprocess.Popen[bytes]:
        """Start a worker process."""
        args = ["worker", "--concurrency", str(concurrency), "--loglevel", "WARNING"]
        return self.start("worker", args, env)

    def collector(self, run: str, out: Path) -> subprocess.Popen[bytes]:
        """Start a collector for ``run``."""
        return self.start("collector", ["collect", "--run", run, "--out", str(out)], {})

    def enqueue(self, run: str, source: Path) -> None:
        """Enqueue in this process (a CLI start-up would count against EagleGen's time)."""
        settings = self.settings(run)
        run_enqueue(
            settings,
            self.store(run),
            str(source),
            GenParams(max_tokens=2048),
            "auto",
            None,
            None,
            None,
        )

    def enqueue_held(self, run: str, source: Path) -> float:
        """Enqueue with every endpoint drained, then let the work go; returns the enqueue time.

        The clock of a run then starts, as the baseline's does, with every prompt at hand: the
        producer's batching (256 at a time) is a one-off start-up cost, not saturation.
        """
        urls = self.env["EAGLEGEN_ENDPOINTS"].split(",")
        table = SlotTable(connect(self.redis_url), self.prefix, dict.fromkeys(urls, 1), 30)
        for url in urls:
            table.drain(url)
        started = time.monotonic()
        self.enqueue(run, source)
        enqueue_s = time.monotonic() - started
        for url in urls:
            table.undrain(url)
        return enqueue_s

    def wait_done(self, run: str, timeout: float, written: bool = True) -> None:
        """Until every sample of ``run`` is answered (and on disk when ``written``)."""
        store = self.store(run)

        def done() -> bool:
            counts = store.counts()
            if counts.total == 0:  # would read as complete
                raise RuntimeError(f"run {run} vanished: was the database flushed under us?")
            return counts.complete if written else counts.done + counts.failed == counts.total

        wait_until(done, timeout, f"run {run} to complete", every=0.05)

    def warm_up(self, tmp: Path) -> None:
        """A few samples through the workers, so start-up costs stay out of the timings."""
        run = f"warmup-{uuid.uuid4().hex[:6]}"
        self.enqueue(run, write_prompts(tmp / f"{run}.jsonl", 4, run))
        self.wait_done(run, 120, written=False)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM one child and wait for it."""
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.procs.remove(proc)

    def stop_all(self) -> None:
        """SIGTERM every child, SIGKILL the ones that linger."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def rss_mib(pid: int) -> float:
    """Resident set size of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
