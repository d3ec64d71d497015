"""No sample runs for ever: an attempt that ends in any exception counts, and its last one is
stored as failed by its lease holder; past EAGLEGEN_MAX_ATTEMPTS takes, the take fails it.

Real workers against tests/hostile.py's loopback server and the real Redis. Before these
fixes, an integer tool-call id made one sample run 42 times in 40 s (``failed 0``), and a
sample whose attempts never reached the processor's failure path (its stored prompt unreadable)
was taken again after every lease expiry, for ever.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.models import Sample, SourceRef
from common.store import RunStore
from tests.harness import ROOT, wait_for
from tests.hostile import HostileServer
from tests.stack import Stack

RETRIES = 1
FAST = {
    "EAGLEGEN_MAX_RETRIES": str(RETRIES),
    "EAGLEGEN_MODEL": "m",
    "EAGLEGEN_LEASE_TTL": "1",
    "EAGLEGEN_RECONCILE_INTERVAL": "1",
}


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    hostile = HostileServer()
    yield hostile
    hostile.close()


def _status(stack: Stack) -> dict:
    return json.loads(stack.procs.run(["status", "--json"], stack.env, timeout=60).stdout)


def _failed_once(stack: Stack, timeout: float) -> None:
    def ended() -> bool:
        counts = stack.store.counts()
        return counts.failed == 1 and counts.pending == 0

    wait_for(ended, timeout, lambda: f"the sample to fail ({stack.store.counts()})")


def test_an_integer_tool_call_id_fails_the_sample_once_within_its_retries(
    stack: Stack, tmp_path: Path, server: HostileServer
):
    source = tmp_path / "tools.jsonl"
    source.write_text((ROOT / "data/tool_calls_openai.jsonl").read_text().splitlines()[0] + "\n")
    stack.env["EAGLEGEN_ENDPOINTS"] = server.endpoint("tool-id-int")
    stack.worker(concurrency=1, **FAST)
    stack.enqueue(source)
    _failed_once(stack, 60)
    [failure] = stack.store.failures().values()
    assert failure.attempts <= RETRIES + 1, failure
    counters = stack.store.r.hgetall(stack.store.keys.counters)
    failed_counters = {k: int(v) for k, v in counters.items() if k.startswith("failed:")}
    assert sum(failed_counters.values()) == 1, failed_counters  # stored once
    assert _status(stack)["failed"] == 1


def test_a_sample_taken_max_attempts_times_is_failed_by_the_take(stack: Stack, tmp_path: Path):
    """A sample whose every attempt ends before the processor can store anything (here:
    answered turns this version cannot read, so the take itself raises) is failed by the
    take."""
    stack.simulator()
    source = tmp_path / "p.jsonl"
    source.write_text(json.dumps({"prompt": "one question"}) + "\n")
    stack.enqueue(source)
    [sample] = stack.store.pending_ids()
    stack.store.r.hset(stack.store.keys.prompts, stack.store.keys.partial_field(sample), "[{")
    stack.worker(concurrency=1, EAGLEGEN_MAX_ATTEMPTS="3", **FAST)
    _failed_once(stack, 90)
    [failure] = stack.store.failures().values()
    assert (failure.kind, failure.attempts) == ("attempts_exhausted", 3), failure
    assert _status(stack)["failed"] == 1
    shown = stack.procs.run(["failed", "--json"], stack.env, timeout=60).stdout
    assert json.loads(shown)[0]["kind"] == "attempts_exhausted"


def test_the_take_past_the_ceiling_fails_the_sample_until_it_is_retried(rdb):
    store = RunStore(rdb, "eaglegen", "ceiling")
    source = SourceRef(dataset="d", row=0, format="prompt")
    sample = Sample(id="s1", user_turns=["q"], source=source)
    store.accept([sample])
    for n in range(1, 4):
        taken = store.take("s1", f"w{n}", 30, ceiling=3)
        assert (taken.outcome, taken.attempts) == ("ok", n)
        store.release("s1", f"w{n}")
    assert store.take("s1", "w4", 30, ceiling=3).outcome == "exhausted"
    assert store.take("s1", "w5", 30, ceiling=3).outcome == "done"  # failed: no longer pending
    failure = store.failures()["s1"]
    assert (failure.kind, failure.attempts) == ("attempts_exhausted", 3)
    assert store.counts().failed == 1 and not store.leased_ids()
    assert store.requeue_failed() == ["s1"]  # retry-failed starts its count again
    assert store.take("s1", "w6", 30, ceiling=3).attempts == 1
