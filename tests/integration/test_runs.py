"""``eaglegen runs`` and ``runs retire``: real Redis, simulator, worker and collector processes."""

from __future__ import annotations

import json

import httpx

from broker.layout import UNACKED
from tests.harness import wait_for
from tests.stack import Stack

FAST = ("--time-per-token", "0", "--ttft", "0", "--max-answer-tokens", "20",
        "--reasoning-tokens", "0")  # fmt: skip


def _prompts(tmp_path, n: int):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def _runs(stack: Stack) -> dict[str, dict]:
    result = stack.procs.run(["runs", "--json"], stack.env)
    assert result.returncode == 0, result.stderr
    return {row["run"]: row for row in json.loads(result.stdout)}


def _run_keys(stack: Stack) -> list[str]:
    """The run's keys that stay (the 10-second rate buckets expire by themselves)."""
    pattern = f"{stack.settings.key_prefix}:{{{stack.run_name}}}:*"
    r = stack.store.r
    return sorted(key for key in r.scan_iter(match=pattern, count=1000) if r.ttl(key) == -1)


def test_a_collected_run_is_retired_to_a_summary_and_cannot_take_samples_again(
    stack: Stack, tmp_path
):
    stack.simulator(*FAST)
    stack.worker(concurrency=8)
    stack.collector()
    source = _prompts(tmp_path, 40)
    stack.enqueue(source)
    stack.wait_complete()
    row = _runs(stack)[stack.run_name]
    assert (row["state"], row["total"], row["written"], row["failed"]) == ("complete", 40, 40, 0)
    full = row["redis_bytes"]
    assert full > 0

    result = stack.procs.run(["runs", "retire", stack.run_name], stack.env)
    assert result.returncode == 0, result.stderr
    assert _run_keys(stack) == [stack.store.keys.retired]  # every other key is gone
    row = _runs(stack)[stack.run_name]
    assert (row["state"], row["total"], row["written"]) == ("retired", 40, 40)
    # Only the summary key is left (asserted above); it grew past 1 KB with the batched
    # statistics and per-endpoint figures it keeps, still a constant, not per sample.
    assert 0 < row["redis_bytes"] < full and row["redis_bytes"] < 2048

    again = stack.procs.run(["enqueue", str(source)], stack.env)
    assert again.returncode == 1
    assert "was retired" in again.stderr and "new --run" in again.stderr
    assert _run_keys(stack) == [stack.store.keys.retired]  # nothing was added
    assert len(stack.lines()) == 40
    twice = stack.procs.run(["runs", "retire", stack.run_name], stack.env)
    assert twice.returncode == 0 and "already retired" in twice.stderr


def test_a_run_not_fully_written_is_retired_only_with_force(stack: Stack, tmp_path):
    stack.enqueue(_prompts(tmp_path, 5))  # no worker: all five pending
    assert _runs(stack)[stack.run_name]["state"] == "running"
    refused = stack.procs.run(["runs", "retire", stack.run_name], stack.env)
    assert refused.returncode == 1
    assert "not fully written" in refused.stderr and "5 pending" in refused.stderr
    assert stack.store.counts().pending == 5  # nothing removed
    forced = stack.procs.run(["runs", "retire", stack.run_name, "--force"], stack.env)
    assert forced.returncode == 0, forced.stderr
    assert stack.store.retired_summary()["unfinished"] == 5
    # The queued messages of a retired run are acknowledged without calling the model.
    url = stack.simulator(*FAST)
    stack.worker(concurrency=4)
    dropped = lambda: stack.queued() == 0 and stack.store.r.hlen(UNACKED) == 0  # noqa: E731
    wait_for(dropped, 60, "the retired run's messages to be acknowledged")
    assert httpx.get(f"{url}/sim/stats", timeout=5).json()["requests"] == 0
    assert _run_keys(stack) == [stack.store.keys.retired]
