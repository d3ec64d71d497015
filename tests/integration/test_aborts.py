"""Orphaned generations aborted on their server, with real workers, Redis and simulators.

A worker paused past its lease (SIGSTOP: a frozen VM, a long GC pause) keeps its streams open,
so the server would generate them to ``max_tokens`` for no one while another worker generates
the same samples again. The reconciler that reaps the lease aborts them
(``/inference/v1/abort_requests`` by the server's own ids); a server that refuses (vLLM without
``--enable-scale-out``) is remembered and shown.
"""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.harness import ROOT, wait_for
from tests.integration.test_resume import reference
from tests.stack import Stack

PROMPTS = ROOT / "data" / "vicuna_bench_question.jsonl"
LONG = ("--min-answer-tokens", "200", "--max-answer-tokens", "240", "--reasoning-tokens", "0")
FAST_RECOVERY = {"EAGLEGEN_LEASE_TTL": "3", "EAGLEGEN_RECONCILE_INTERVAL": "1"}


def _sim(url: str) -> dict[str, object]:
    stats: dict[str, object] = httpx.get(f"{url}/sim/stats", timeout=5).json()
    return stats


def _running_requests(stack: Stack) -> dict[str, dict[str, object]]:
    raw = stack.store.r.hgetall(stack.store.keys.requests)
    return {str(k): json.loads(v) for k, v in raw.items()}


def _pause_and_take_over(stack: Stack, url: str, samples: int) -> None:
    """A worker paused with ``samples`` streams open; a second one reaps and finishes them."""
    paused = stack.worker(concurrency=samples)
    stack.enqueue(PROMPTS, "--limit", str(samples))
    wait_for(lambda: len(_running_requests(stack)) == samples, 60, "every request named")
    paused.send_signal(signal.SIGSTOP)
    try:
        stack.worker(concurrency=samples)
        stack.collector()
        stack.wait_complete()
    finally:
        paused.send_signal(signal.SIGCONT)


def test_a_paused_workers_streams_are_aborted_when_its_leases_are_reaped(
    stack: Stack,
) -> None:
    stack.env.update(FAST_RECOVERY)
    url = stack.simulator("--time-per-token", "0.05", *LONG)  # answers of ~11 s
    _pause_and_take_over(stack, url, 2)
    stats = _sim(url)
    assert stats["aborted_by_request"] == 2, stats  # both orphans stopped on the server
    finished = stats["generations_by_key"]
    assert isinstance(finished, dict) and sorted(finished.values()) == [1, 1]  # none twice
    status = stack.procs.run(["status", "--json"], stack.env)
    goodput = json.loads(status.stdout)["goodput"]
    assert goodput["aborted_requests"] == 2 and goodput["abort_saved_tokens"] > 0
    listed = stack.procs.run(["endpoints", "list", "--json"], stack.env)
    assert [row["abort"] for row in json.loads(listed.stdout)] == ["on"]


def test_a_server_that_refuses_aborts_is_remembered_and_shown(
    stack: Stack,
) -> None:
    stack.env.update(FAST_RECOVERY)
    url = stack.simulator("--time-per-token", "0.05", "--no-abort-requests", *LONG)
    _pause_and_take_over(stack, url, 2)
    stats = _sim(url)
    assert stats["aborted_by_request"] == 0
    listed = stack.procs.run(["endpoints", "list", "--json"], stack.env)
    [row] = json.loads(listed.stdout)
    assert row["abort"] == "abort off: start vLLM with --enable-scale-out (HTTP 403)"
    status = json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)
    assert status["endpoints"][stack.env["EAGLEGEN_ENDPOINTS"]]["abort"] == row["abort"]
    assert status["goodput"]["aborted_requests"] == 0


def test_a_worker_whose_request_was_aborted_while_it_was_paused_stores_the_whole_answer(
    stack: Stack, redis_url: str, tmp_path
) -> None:
    # The sample's lease expires while its worker is paused; a reconciler pass reaps it and
    # aborts the request (the simulator ends the stream as vLLM does: finish_reason "abort",
    # usage, [DONE]); the worker wakes, its renewal takes the lease back, and it reads that
    # end. It must not store what the abort left as the answer.
    source = tmp_path / "one.jsonl"
    source.write_text(PROMPTS.read_text().splitlines()[0] + "\n")
    sim = ("--time-per-token", "0.05", *LONG)
    [expected] = reference(stack.procs, redis_url, tmp_path, source, sim=sim)
    stack.env.update(EAGLEGEN_LEASE_TTL="3", EAGLEGEN_RECONCILE_INTERVAL="600")
    url = stack.simulator(*sim)
    paused = stack.worker(concurrency=1)
    stack.enqueue(source)
    wait_for(lambda: len(_running_requests(stack)) == 1, 60, "the request named")
    wait_for(lambda: int(_sim(url)["tokens_generated"]) >= 20, 60, "the answer under way")
    paused.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: _reconciled(stack) and _sim(url)["aborted_by_request"] == 1, 60,
                 "the lease reaped and the request aborted")  # fmt: skip
    finally:
        paused.send_signal(signal.SIGCONT)
    stack.collector()
    stack.wait_complete()
    [record] = stack.lines()
    turns = record["generation"]["turns"]
    assert [t["finish_reason"] for t in turns] == ["stop"], turns
    assert turns[0]["token_ids"] == expected["generation"]["turns"][0]["token_ids"]
    assert record["conversations"] == expected["conversations"]
    assert turns[0]["resumed_from_tokens"] > 0  # continued from where the abort left it
    counts = stack.store.counts()  # EagleGen's own abort: handed back, not a retry
    assert (counts.failed, counts.retries) == (0, 0), counts


def _reconciled(stack: Stack) -> bool:
    """One reconciler pass (it reaps expired leases and aborts their requests)."""
    passed = stack.procs.run(["reconcile"], stack.env)
    assert passed.returncode == 0, passed.stderr
    return not _running_requests(stack)


pytestmark = [pytest.mark.integration, pytest.mark.faults]
