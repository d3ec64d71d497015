"""Nothing lost, nothing generated twice: dead workers, lost messages, duplicates, SIGTERM."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from broker.app import create_broker_app
from broker.publish import publish
from tests.harness import wait_for
from tests.stack import Stack

pytestmark = pytest.mark.faults  # make test-faults

FAST_RECOVERY = {"EAGLEGEN_LEASE_TTL": "3", "EAGLEGEN_RECONCILE_INTERVAL": "1"}


def _prompts(tmp_path, n, words=3):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i} " * words}) + "\n" for i in range(n)))
    return path


def _sim_stats(url):
    return httpx.get(f"{url}/sim/stats", timeout=5).json()


def test_a_killed_workers_samples_run_again_within_the_lease_time(stack: Stack, tmp_path):
    stack.env.update(FAST_RECOVERY)
    stack.simulator(
        "--time-per-token",
        "0.05",
        "--min-answer-tokens",
        "60",
        "--max-answer-tokens",
        "80",
        "--reasoning-tokens",
        "0",
    )
    doomed = stack.worker(concurrency=4)
    stack.enqueue(_prompts(tmp_path, 4))
    wait_for(lambda: stack.store.counts().in_flight == 4, 30, "the worker to lease 4 samples")
    doomed.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    doomed.wait()
    stack.worker(concurrency=4)
    wait_for(
        lambda: (
            len(stack.store.r.hgetall(stack.store.keys.lease_owner)) == 4
            and all(
                str(doomed.pid) not in owner
                for owner in stack.store.r.hvals(stack.store.keys.lease_owner)
            )
        ),
        30,
        "the samples to be leased by the new worker",
    )
    # lease 3 s + reconcile 1 s + a new worker's start-up (slow on a loaded 2-core machine);
    # without leases this would be the visibility timeout, over an hour.
    assert time.monotonic() - killed_at < 30
    stack.collector()
    stack.wait_complete()
    assert sorted(r["id"] for r in stack.lines()) == sorted(
        stack.store.r.smembers(stack.store.keys.accepted)
    )


def test_messages_for_finished_samples_are_acked_without_calling_the_model(stack, tmp_path):
    url = stack.simulator()
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(_prompts(tmp_path, 5))
    stack.wait_complete()
    before = _sim_stats(url)["requests"]
    ids = sorted(stack.store.r.smembers(stack.store.keys.accepted))
    queue = stack.env["EAGLEGEN_QUEUE"]
    publish(create_broker_app(stack.settings), queue, stack.run_name, ids * 2)
    wait_for(
        lambda: stack.queued() == 0,
        30,
        "the duplicate messages to be consumed",
    )
    wait_for(lambda: not stack.store.r.hlen("unacked"), 30, "the duplicates to be acked")
    assert _sim_stats(url)["requests"] == before
    assert len(stack.lines()) == 5


def test_reconcile_reenqueues_samples_whose_messages_were_lost(stack: Stack, tmp_path):
    stack.enqueue(_prompts(tmp_path, 6))
    stack.store.r.delete(*stack.queue_keys())  # as if Redis had lost them
    result = stack.procs.run(["reconcile", "--run", stack.run_name], stack.env)
    assert result.returncode == 0, result.stderr
    assert "re-enqueued 6" in result.stdout
    again = stack.procs.run(["reconcile", "--run", stack.run_name], stack.env)
    assert "re-enqueued 0" in again.stdout  # the new messages count as alive
    stack.simulator()
    stack.worker(concurrency=4)
    stack.collector()
    stack.wait_complete()
    assert len(stack.lines()) == 6


def test_sigterm_hands_in_flight_samples_back_to_the_queue(stack: Stack, tmp_path):
    stack.env.update({"EAGLEGEN_SHUTDOWN_GRACE": "1"})
    url = stack.simulator(
        "--time-per-token",
        "0.2",
        "--min-answer-tokens",
        "100",
        "--max-answer-tokens",
        "120",
        "--reasoning-tokens",
        "0",
    )
    first = stack.worker(concurrency=3)
    stack.enqueue(_prompts(tmp_path, 3))
    wait_for(lambda: _sim_stats(url)["running"] == 3, 30, "three generations to start")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    counts = stack.store.counts()
    assert (counts.pending, counts.in_flight, counts.failed) == (3, 0, 0)
    assert stack.queued() == 3
    stack.procs.stop_all()


def test_sigterm_on_the_collector_flushes_and_exits(stack: Stack, tmp_path):
    stack.simulator()
    stack.worker(concurrency=4)
    stack.enqueue(_prompts(tmp_path, 10))
    wait_for(lambda: stack.store.counts().done == 10, 60, "all answers")
    collector = stack.collector()
    wait_for(lambda: stack.store.counts().written == 10, 30, "the collector to write")
    collector.send_signal(signal.SIGTERM)
    assert collector.wait(timeout=15) == 0
    assert len(stack.lines()) == 10
