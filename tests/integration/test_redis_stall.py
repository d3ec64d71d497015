"""Redis stalled (SIGSTOP) longer than a socket timeout under a running pipeline."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from tests.harness import Procs, free_port, start_redis, wait_for
from tests.services import require_tool
from tests.stack import Stack

pytestmark = pytest.mark.faults  # make test-faults


def test_the_collector_and_workers_ride_out_a_stalled_redis(procs: Procs, tmp_path):
    require_tool("redis-server")
    port = free_port()
    (tmp_path / "redis").mkdir()
    server = start_redis(procs, port, tmp_path / "redis", "--save", "", "--appendonly", "no")
    stack = Stack(procs, f"redis://127.0.0.1:{port}/0", tmp_path)
    stack.simulator("--time-per-token", "0.01")
    worker = stack.worker(concurrency=8)
    collector = stack.collector()
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"q {i}"}) + "\n" for i in range(40)))
    stack.enqueue(source)
    wait_for(lambda: stack.store.counts().written >= 5, 60, "the first lines")
    server.send_signal(signal.SIGSTOP)
    time.sleep(12)  # longer than every client's socket timeout (redis-py's and ours)
    server.send_signal(signal.SIGCONT)
    stack.wait_complete(timeout=120)
    assert collector.poll() is None and worker.poll() is None
    ids = Counter(r["id"] for r in stack.lines())
    assert len(ids) == 40 and max(ids.values()) == 1
    assert "Redis unreachable or stalled" in procs.logs(20000)


def test_a_worker_started_while_redis_is_down_comes_up_with_it(procs: Procs, tmp_path):
    require_tool("redis-server")
    port = free_port()
    (tmp_path / "redis").mkdir()
    stack = Stack(procs, f"redis://127.0.0.1:{port}/0", tmp_path)
    stack.simulator()
    worker = stack.worker(concurrency=2)
    wait_for(lambda: "waiting for it" in procs.logs(), 30, "the worker to say it waits")
    assert worker.poll() is None
    start_redis(procs, port, tmp_path / "redis", "--save", "", "--appendonly", "no")
    stack.collector()
    source = tmp_path / "p.jsonl"
    source.write_text(json.dumps({"prompt": "hello"}) + "\n")
    stack.enqueue(source)
    stack.wait_complete(timeout=90)
    assert len(stack.lines()) == 1


def test_a_bare_worker_keeps_consuming_after_redis_restarts_from_its_aof(procs: Procs, tmp_path):
    require_tool("redis-server")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    durable = ("--appendonly", "yes", "--appendfsync", "always", "--save", "")
    server = start_redis(procs, port, data, *durable)
    stack = Stack(procs, f"redis://127.0.0.1:{port}/0", tmp_path)
    stack.simulator("--time-per-token", "0.02")
    worker = stack.worker(concurrency=4)
    stack.collector()
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps({"prompt": f"a {i}"}) + "\n" for i in range(6)))
    second.write_text("".join(json.dumps({"prompt": f"b {i}"}) + "\n" for i in range(6)))
    stack.enqueue(first)
    wait_for(lambda: stack.store.counts().in_flight > 0, 30, "generations in flight")
    procs.kill(server)  # a crash with messages unacked, then a restart from the AOF
    start_redis(procs, port, data, *durable)
    stack.wait_complete(timeout=120)
    stack.enqueue(second)
    stack.wait_complete(timeout=120)
    assert worker.poll() is None, "the worker process ended after the restart"
    ids = Counter(r["id"] for r in stack.lines())
    assert len(ids) == 12 and max(ids.values()) == 1
