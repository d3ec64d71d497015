"""Leases and the reconciler under takeovers and several queues, with real processes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.harness import wait_for
from tests.stack import Stack

pytestmark = pytest.mark.faults  # make test-faults


def _prompts(tmp: Path, n: int) -> Path:
    path = tmp / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def test_a_worker_paused_past_its_lease_on_its_last_retry_does_not_fail_the_sample(
    stack: Stack, tmp_path
):
    stack.simulator("--time-per-token", "0.03", "--min-answer-tokens", "150")
    stack.env.update(
        EAGLEGEN_LEASE_TTL="2", EAGLEGEN_RECONCILE_INTERVAL="1", EAGLEGEN_MAX_RETRIES="0"
    )
    paused = stack.worker(concurrency=1)
    stack.enqueue(_prompts(tmp_path, 1))
    wait_for(lambda: stack.store.counts().in_flight == 1, 30, "the sample to start")
    paused.send_signal(signal.SIGSTOP)
    try:
        stack.worker(concurrency=1)  # takes over once the lease has expired
        [sample_id] = stack.store.pending_ids()
        wait_for(lambda: stack.store.attempts(sample_id) >= 2, 60, "the takeover")
    finally:
        paused.send_signal(signal.SIGCONT)
    stack.collector()
    stack.wait_complete(timeout=90)
    counts = stack.store.counts()
    assert (counts.done, counts.failed, counts.retries) == (1, 0, 0)
    assert len(stack.lines()) == 1


def test_the_reconciler_leaves_another_queues_runs_alone(stack: Stack, tmp_path):
    url = stack.simulator()
    stack.enqueue(_prompts(tmp_path, 4))  # queued on this test's queue; no worker serves it
    other = {**stack.env, "EAGLEGEN_QUEUE": stack.env["EAGLEGEN_QUEUE"] + "-b",
             "EAGLEGEN_RECONCILE_INTERVAL": "0.5"}  # fmt: skip
    stack.procs.start("worker-b", ["worker", "--concurrency", "2"], other)
    wait_for(lambda: "ready" in stack.procs.logs(), 30, "the other queue's worker")
    time.sleep(3)  # six reconciler passes on the other queue
    assert httpx.get(f"{url}/sim/stats").json()["requests"] == 0
    assert stack.queued() == 4 and stack.store.counts().pending == 4
    reconcile = stack.procs.run(["reconcile"], other)
    assert reconcile.returncode == 0 and stack.run_name not in reconcile.stdout
    stack.worker(concurrency=2)
    stack.collector()
    stack.wait_complete()


def test_enqueueing_a_run_from_another_queue_is_a_clear_error(stack: Stack, tmp_path):
    source = _prompts(tmp_path, 2)
    stack.enqueue(source)
    other = {**stack.env, "EAGLEGEN_QUEUE": "elsewhere"}
    result = stack.procs.run(["enqueue", str(source)], other)
    assert result.returncode == 1 and "is served by queue" in result.stderr
