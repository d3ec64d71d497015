"""What a new user meets: an endpoint that is down at start, and status on the edges of a run
(before it exists, after it ends, with a dead worker's leases, with redelivered messages)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.harness import free_port, wait_for
from tests.stack import Stack


def _prompts(tmp: Path, n: int) -> Path:
    path = tmp / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def _status(stack: Stack) -> dict:
    result = stack.procs.run(["status", "--json"], stack.env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_endpoint_down_at_start_is_named_shown_in_status_and_waited_for(stack: Stack, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    stack.env.update(EAGLEGEN_ENDPOINTS=url, EAGLEGEN_ENDPOINT_COOLDOWN="1")
    stack.worker(concurrency=4)
    wait_for(lambda: "cannot be reached" in stack.procs.logs(), 30, "the worker to name it")
    stack.enqueue(_prompts(tmp_path, 5))
    wait_for(lambda: _status(stack)["endpoints"].get(url, {}).get("state") == "down", 15, "status")
    assert "cannot connect" in _status(stack)["endpoints"][url]["problem"]
    time.sleep(3)  # the server stays down a while: samples must wait, not fail
    assert stack.store.counts().failed == 0
    stack.procs.start("simulator", ["simulate", "--port", str(port)], {})
    stack.collector()
    stack.wait_complete(timeout=90)
    counts = stack.store.counts()
    assert (counts.done, counts.failed) == (5, 0)
    wait_for(lambda: _status(stack)["endpoints"][url]["state"] == "up", 15, "status to say up")


def test_watch_started_before_enqueue_waits_for_the_run_and_its_end(stack: Stack, tmp_path):
    stack.simulator()
    watch = stack.procs.start("watch", ["status", "--watch", "--interval", "0.2"], stack.env)
    time.sleep(1.5)
    assert watch.poll() is None, "status --watch gave up before the run existed"
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(_prompts(tmp_path, 4))
    stack.wait_complete()
    wait_for(lambda: watch.poll() is not None, 20, "the live view to end with the run")
    assert watch.returncode == 0


def test_a_finished_runs_rates_are_frozen_and_p95_is_labelled_an_upper_bound(
    stack: Stack, tmp_path
):
    stack.simulator()
    worker = stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(_prompts(tmp_path, 6))
    stack.wait_complete()
    stack.procs.stop(worker)  # its last second of rates is written as it stops
    first = _status(stack)
    time.sleep(1.5)
    second = _status(stack)
    assert first["samples_per_s_since_start"] == second["samples_per_s_since_start"] > 0
    assert first["samples_per_s_last_minute"] == second["samples_per_s_last_minute"] > 0
    assert second["p95_is_upper_bound"] is True
    view = stack.procs.run(["status"], {**stack.env, "COLUMNS": "120"}).stdout
    assert "p95 ≤" in view


def test_eta_counts_a_dead_workers_leases_and_redeliveries_are_counted(stack: Stack, tmp_path):
    stack.simulator("--time-per-token", "0.05", "--min-answer-tokens", "200")
    stack.env.update(EAGLEGEN_LEASE_TTL="2", EAGLEGEN_RECONCILE_INTERVAL="1")
    worker = stack.worker(concurrency=2)
    stack.enqueue(_prompts(tmp_path, 2))
    wait_for(lambda: stack.store.counts().in_flight == 2, 30, "both samples to start")
    worker.send_signal(signal.SIGKILL)
    wait_for(lambda: stack.store.expired_lease_count() == 2, 15, "the leases to expire")
    status = _status(stack)
    assert status["expired_leases"] == 2 and status["eta_s"] >= 2
    stack.simulator()  # a fast server for the second attempt
    stack.worker(concurrency=2)
    stack.collector()
    stack.wait_complete(timeout=90)
    status = _status(stack)
    assert status["redeliveries"] == 2 and status["retries"] == 0


def test_a_killed_worker_leaves_exact_counts_behind(stack: Stack, tmp_path):
    stack.simulator()
    worker = stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(_prompts(tmp_path, 20))
    wait_for(lambda: stack.store.counts().done == 20, 60, "every sample stored")
    worker.send_signal(signal.SIGKILL)  # no last flush of its turn statistics
    worker.wait()
    stack.wait_complete()
    tokens = sum(r["generation"]["usage"]["completion_tokens"] for r in stack.lines())
    status = _status(stack)
    # Written with each sample's own transition, so exact whenever the worker died.
    assert (status["done"], status["failed"], status["written"]) == (20, 0, 20)
    assert status["completion_tokens"] == tokens and status["complete"] and status["eta_s"] == 0
    assert status["turns"] <= 20  # rates and distributions: at most its last second is lost


def test_a_running_workers_statistics_reach_status_within_seconds(stack: Stack, tmp_path):
    stack.simulator()
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(_prompts(tmp_path, 8))
    stack.wait_complete()
    seen: dict = {}

    def all_turns_counted() -> bool:
        seen.update(_status(stack))
        return seen["turns"] == 8 and seen["samples_per_s_last_minute"] > 0

    wait_for(all_turns_counted, 10, lambda: f"the worker's statistics to be written: {seen}")
