"""Redis client objects kombu builds in a real Celery worker, per acked task, with and without
broker.kombu_fix's one-client-per-pool patch, side by side.

    .venv/bin/python bench/bench_kombu.py [--redis-url URL] [--tasks 1000]

Starts a Celery worker (threads pool, concurrency 8, acks_late, prefetch 1, as EagleGen's) on
a queue and unacked keys of its own, sends ``--tasks`` no-op tasks, waits until every one is
acked, stops the worker and reads what it counted: ``redis.Redis`` constructions (and their
time) and the worker's CPU from ready to shutdown. Unpatched and patched alternate per round.
A Redis of its own unless --redis-url names one (a database nothing else writes to: the
queue's keys are deleted before each run).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis
from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from tests.harness import redis_url_or_own

QUEUE = "eaglegen-bench-kombu"
KEYS = {"unacked_key": f"{QUEUE}-unacked", "unacked_index_key": f"{QUEUE}-unacked-index"}
COUNT: dict[str, float] = {"clients": 0, "seconds": 0.0}


def make_app(url: str, events: bool) -> Celery:
    app = Celery("bench_kombu", broker=url)
    app.conf.update(
        task_acks_late=True, worker_prefetch_multiplier=1, worker_pool="threads",
        worker_concurrency=8, task_default_queue=QUEUE, task_ignore_result=True,
        worker_send_task_events=events, worker_hijack_root_logger=False,
        broker_transport_options={"max_connections": 24, "visibility_timeout": 3600, **KEYS},
        broker_connection_retry_on_startup=True,
    )  # fmt: skip
    app.task(name="noop")(noop)
    return app


def noop(i: int) -> int:
    return i


def count_clients() -> None:
    """Count and time every redis.Redis construction in this process."""
    original = redis.Redis.__init__

    def init(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        original(self, *args, **kwargs)
        COUNT["seconds"] += time.perf_counter() - start
        COUNT["clients"] += 1

    redis.Redis.__init__ = init  # type: ignore[method-assign]


def worker(url: str, events: bool, fix: bool, out: Path) -> None:
    count_clients()
    if fix:
        from broker import kombu_fix

        kombu_fix.apply()
    app = make_app(url, events)

    @worker_ready.connect
    def ready(**_: Any) -> None:
        COUNT.update(clients=0, seconds=0.0, cpu=time.process_time())
        out.with_suffix(".ready").touch()

    @worker_shutdown.connect
    def done(**_: Any) -> None:
        COUNT["cpu"] = time.process_time() - COUNT["cpu"]
        out.write_text(json.dumps(COUNT))

    app.worker_main(
        ["worker", "--loglevel", "WARNING", "-Q", QUEUE, "--without-gossip", "--without-mingle",
         "--without-heartbeat"]
    )  # fmt: skip


def run(url: str, events: bool, fix: bool, tasks: int, tmp: Path) -> dict[str, float]:
    r = redis.Redis.from_url(url)
    r.delete(QUEUE, *KEYS.values())
    out = tmp / f"count-{fix}.json"
    for path in (out, out.with_suffix(".ready")):
        path.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--redis-url", url, "--worker", "--fix" if fix else ""]
    command += ["--events"] if events else []
    with open(tmp / "worker.log", "a") as log:
        child = subprocess.Popen([c for c in command if c], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while not out.with_suffix(".ready").exists():
            if child.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start: {(tmp / 'worker.log').read_text()}")
            time.sleep(0.05)
        app = make_app(url, events)
        with app.producer_or_acquire() as producer:
            for i in range(tasks):
                app.send_task("noop", (i,), producer=producer)
        deadline = time.monotonic() + 600
        while r.llen(QUEUE) or r.hlen(KEYS["unacked_key"]):
            if time.monotonic() > deadline:
                raise SystemExit("the tasks did not finish in 10 minutes")
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(60)
    return dict(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="a Redis to use (default: one of its own)")
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--events", action="store_true", help="task events on")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fix", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        worker(a.redis_url, a.events, a.fix, Path(os.environ["BENCH_KOMBU_OUT"]))
        return
    a.redis_url = redis_url_or_own(a.redis_url)
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(a.rounds):
            for fix in (False, True):
                os.environ["BENCH_KOMBU_OUT"] = str(Path(tmp) / f"count-{fix}.json")
                got = run(a.redis_url, a.events, fix, a.tasks, Path(tmp))
                each = got["seconds"] / max(got["clients"], 1) * 1e6
                print(
                    f"round {n} {'patched  ' if fix else 'unpatched'} events={a.events}: "
                    f"{got['clients']:.0f} redis.Redis built for {a.tasks} tasks "
                    f"({got['clients'] / a.tasks:.2f} per task, {each:.0f} us each), "
                    f"worker CPU {got['cpu'] / a.tasks * 1e6:.0f} us per task",
                    flush=True,
                )


if __name__ == "__main__":
    main()
