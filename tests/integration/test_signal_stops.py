"""Every long-running process stops within its grace on SIGTERM or Ctrl-C (SIGINT), whenever
the signal comes: hundreds of processes (collector, exporter, simulator, worker), each sent one
signal at a random moment, most of them once serving, some while still starting.

Five to seven minutes on two loaded cores, hence the fault tier. A signal that lands inside a
wait's own code is rare for a real process (none of 144 old collectors and exporters hung here):
tests/test_stop_signals.py checks the handlers themselves, in a loop that is always inside it.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest
import redis

from common.keys import workers_key
from common.store import RunStore
from tests.harness import Child, Procs, free_port, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(1200)]

BATCH = 8  # processes started, then signalled, together
STARTING = 0.2  # the share signalled while starting (before they serve)
READY_S = 120.0
DEAD_ENDPOINT = "http://127.0.0.1:1/v1"  # a worker needs one; nothing is generated


@dataclass
class Role:
    """How to start one process of a role, tell when it serves, and how long it may take."""

    name: str
    count: int
    grace_s: float
    start: Callable[[Procs, str, int], tuple[Child, Callable[[], bool]]]


@dataclass
class Tally:
    stops: int = 0
    hung: list[str] = field(default_factory=list)


def _collector(procs: Procs, url: str, n: int) -> tuple[Child, Callable[[], bool]]:
    run = f"sig-{n}"
    proc = procs.start("collector", ["collect", "--out", f"{run}.jsonl"], _env(url, run))
    lock = RunStore(redis.Redis.from_url(url), "eaglegen", run).keys.collector_lock
    client = redis.Redis.from_url(url)
    return proc, lambda: bool(client.exists(lock))


def _exporter(procs: Procs, url: str, n: int) -> tuple[Child, Callable[[], bool]]:
    port = free_port()
    proc = procs.start("exporter", ["exporter", "--port", str(port)], _env(url, f"sig-{n}"))
    return proc, lambda: _answers(f"http://127.0.0.1:{port}/metrics")


def _simulator(procs: Procs, url: str, n: int) -> tuple[Child, Callable[[], bool]]:
    port = free_port()
    proc = procs.start("simulator", ["simulate", "--port", str(port)])
    return proc, lambda: _answers(f"http://127.0.0.1:{port}/health")


def _worker(procs: Procs, url: str, n: int) -> tuple[Child, Callable[[], bool]]:
    env = {**_env(url, f"sig-{n}"), "EAGLEGEN_QUEUE": f"q-sig-{n}",
           "EAGLEGEN_ENDPOINTS": DEAD_ENDPOINT, "EAGLEGEN_SHUTDOWN_GRACE": "2"}  # fmt: skip
    proc = procs.start("worker", ["worker", "--concurrency", "2", "--loglevel", "WARNING"], env)
    client, name = redis.Redis.from_url(url), f"{socket.gethostname()}:{proc.pid}"
    return proc, lambda: bool(client.hexists(workers_key("eaglegen"), name))


ROLES = [
    Role("collector", 96, 10.0, _collector),
    Role("exporter", 48, 10.0, _exporter),
    Role("simulator", 48, 10.0, _simulator),
    Role("worker", 32, 30.0, _worker),  # its shutdown grace (2 s), then Celery's own stop
]


def _env(url: str, run: str) -> dict[str, str]:
    return {"EAGLEGEN_REDIS_URL": url, "EAGLEGEN_RUN": run}


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _serving_or_gone(proc: Child, ready: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: ready() or proc.poll() is not None


def _batch(
    role: Role, procs: Procs, url: str, first: int, rng: random.Random, tally: Tally
) -> None:
    started = [role.start(procs, url, first + i) for i in range(min(BATCH, role.count - first))]
    for proc, ready in started:
        if rng.random() >= STARTING:
            wait_for(_serving_or_gone(proc, ready), READY_S, f"a {role.name} to serve")
    sent: list[tuple[Child, float, signal.Signals]] = []
    for proc, _ in started:
        time.sleep(rng.uniform(0, 1.0 / len(started)))
        sig = rng.choice((signal.SIGTERM, signal.SIGINT))
        proc.send_signal(sig)
        sent.append((proc, time.monotonic(), sig))
    for proc, at, sig in sent:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, at + role.grace_s - time.monotonic()))
        if proc.poll() is None:
            tally.hung.append(f"{role.name} pid {proc.pid} ({sig.name})")
            procs.kill(proc)
        tally.stops += 1


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_process_stops_within_its_grace_on_a_signal_at_a_random_moment(
    role: Role, procs: Procs, redis_url: str, rdb: redis.Redis
):
    rng, tally = random.Random(), Tally()
    for first in range(0, role.count, BATCH):
        _batch(role, procs, redis_url, first, rng, tally)
    print(f"{role.name}: {tally.stops} stops, {len(tally.hung)} past their grace")
    assert not tally.hung, f"{len(tally.hung)} of {tally.stops} did not stop: {tally.hung}"
