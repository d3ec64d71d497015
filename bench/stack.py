"""Processes of one benchmark scenario: simulators, workers, a collector; all stopped on exit.

Each scenario gets its own key prefix, run and queue in the benchmark database, so scenarios
never see each other's slots, caps or messages.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.enqueue_cmd import run_enqueue
from common.models import GenParams
from common.settings import Settings
from common.store import RunStore, connect
from tests.harness import (
    ROOT,
    Child,
    Procs,
    Simulator,
    delete_keys,
    start_simulator,
    wait_for,
)
from worker.endpoints.capacity import SlotTable

# The simulator stands in for a GPU server, which has its own machine; here it shares two
# cores with the clients, and a client that takes its CPU slows the "server" down. Every
# client (EagleGen's processes and the baseline alike) therefore runs niced.
NICE = 10
CLIENT = ["nice", "-n", str(NICE)]
MODEL = "eaglegen-sim"
RESULTS = ROOT / "bench" / "results"


def work_dir(kind: str) -> Path:
    """A scratch folder for one benchmark's logs and files (``EAGLEGEN_BENCH_DIR`` or /tmp)."""
    work = Path(os.environ.get("EAGLEGEN_BENCH_DIR", "/tmp")) / f"eaglegen-{kind}-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    return work


def save_results(kind: str, results: dict[str, Any]) -> Path:
    """Write a benchmark's results as bench/results/KIND-TIME.json (gitignored); the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    return path.relative_to(ROOT)


def write_prompts(path: Path, n: int, tag: str) -> Path:
    """``n`` distinct single-turn prompts (the simulator derives each answer's length from it)."""
    with path.open("w") as out:
        for i in range(n):
            out.write(
                json.dumps({"id": f"{tag}-{i}", "prompt": f"{tag} question {i}: why?"}) + "\n"
            )
    return path


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
        self.procs = Procs(self.dir, grace=30, nice=NICE)
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
        delete_keys(connect(self.redis_url), self.prefix, self.queue)

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

    def simulator(self, *options: str) -> Simulator:
        """Start a simulator (at normal priority) and wait until it answers."""
        return start_simulator(self.procs, *options, timeout=60)

    def worker(self, concurrency: int, **env: str) -> Child:
        """Start a worker process (niced, as every client)."""
        args = ["worker", "--concurrency", str(concurrency), "--loglevel", "WARNING"]
        return self.procs.start("worker", args, {**self.env, **env})

    def collector(self, run: str, out: Path) -> Child:
        """Start a collector for ``run`` (niced, as every client)."""
        return self.procs.start("collector", ["collect", "--run", run, "--out", str(out)], self.env)

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

    def wait_done(self, run: str, timeout: float, written: bool = True) -> int:
        """Until every sample of ``run`` is answered (and on disk when ``written``); returns
        how many times Redis was asked (each ask is ``POLL_COMMANDS`` commands)."""
        store = self.store(run)
        polls = 0

        def done() -> bool:
            nonlocal polls
            polls += 1
            counts = store.counts()
            if counts.total == 0:  # would read as complete
                raise RuntimeError(f"run {run} vanished: was the database flushed under us?")
            return counts.complete if written else counts.done + counts.failed == counts.total

        wait_for(done, timeout, f"run {run} to complete", every=0.05)
        return polls

    def warm_up(self, tmp: Path) -> None:
        """A few samples through the workers, so start-up costs stay out of the timings."""
        run = f"warmup-{uuid.uuid4().hex[:6]}"
        self.enqueue(run, write_prompts(tmp / f"{run}.jsonl", 4, run))
        self.wait_done(run, 120, written=False)

    def stop(self, proc: Child) -> None:
        """SIGTERM one child and wait for it (SIGKILL after 30 s)."""
        self.procs.stop(proc)

    def stop_all(self) -> None:
        """SIGTERM every child, SIGKILL the ones that linger."""
        self.procs.stop_all()


# RunStore.counts(), the bench's own progress poll: MULTI, six reads, EXEC.
POLL_COMMANDS = 8


@dataclass(frozen=True)
class RedisUse:
    """What the Redis server has done so far: commands by name, read events, CPU seconds.

    Server-wide: INFO covers every client of the server, other databases' included. Deltas
    between two readings, so nothing is reset under other users of the server.
    """

    commands: dict[str, int]
    reads: int
    cpu_s: float

    @classmethod
    def read(cls, client: redis.Redis) -> RedisUse:
        """The server's counters now."""
        stats = client.info("commandstats")
        cpu = client.info("cpu")
        commands = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
        reads = int(client.info("stats")["total_reads_processed"])
        return cls(commands, reads, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))

    def since(self, before: RedisUse, polls: int, samples: int) -> dict[str, Any]:
        """Per sample between ``before`` and now, less the bench's own ``polls``."""
        calls = {k: n - before.commands.get(k, 0) for k, n in self.commands.items()}
        total = sum(calls.values()) - polls * POLL_COMMANDS - 3  # and the 3 INFO of a reading
        cpu = self.cpu_s - before.cpu_s
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:12]
        return {
            "commands_per_sample": round(total / samples, 2),
            "reads_per_sample": round((self.reads - before.reads - polls - 3) / samples, 2),
            "cpu_ms_per_sample": round(cpu / samples * 1000, 3),
            "one_redis_ceiling_samples_per_s": round(samples / cpu) if cpu > 0 else None,
            "top_commands_per_sample": {k: round(n / samples, 2) for k, n in top},
            "note": f"server-wide (INFO of the whole server, other databases' clients too), "
            f"less the bench's own {polls} progress polls",
        }


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
