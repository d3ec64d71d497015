"""A breaker that sees endpoints (issue 33): an endpoint refusing the run's requests is taken out
of rotation and its samples go to another one; a row's own 400 fails that row alone; only
failures that do not depend on the endpoint open the run's breaker. Real workers, real
servers on loopback (the simulator, tests/hostile.py's server)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import start_simulator
from tests.hostile import HostileServer
from tests.stack import Stack

MODEL = "eaglegen-sim"  # the simulator's default model name
ANSWER = ("--max-answer-tokens", "20")


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    server = HostileServer()
    yield server
    server.close()


def _status(stack: Stack) -> dict[str, Any]:
    result = stack.procs.run(["status", "--json"], stack.env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _source(tmp: Path, rows: list[str]) -> Path:
    source = tmp / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": row}) + "\n" for row in rows))
    return source


def _figures(stack: Stack) -> Counter[str]:
    """done, and failed samples by kind (printed: the issue's before/after figures)."""
    kinds = Counter(f.kind for f in stack.store.failures().values())
    figures = Counter({"done": stack.store.counts().done, **kinds})
    print(f"figures: {dict(figures)}")
    return figures


@pytest.mark.parametrize("refusal", ["model not found", "no chat route"])
def test_one_endpoint_answering_404_leaves_every_sample_to_the_healthy_one(
    stack: Stack, tmp_path, hostile: HostileServer, refusal: str
):
    good = start_simulator(stack.procs, *ANSWER).endpoint
    if refusal == "model not found":  # vLLM's 404 for a model it does not serve
        bad = start_simulator(stack.procs, "--model-name", "another", *ANSWER).endpoint
    else:
        bad = hostile.endpoint("route-404")
    stack.env.update(EAGLEGEN_ENDPOINTS=f"{good},{bad}", EAGLEGEN_MODEL=MODEL)
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(_source(tmp_path, [f"question {i} about the sea" for i in range(20)]))
    stack.wait_complete()

    assert _figures(stack) == Counter(done=20)
    assert {t["endpoint"] for r in stack.lines() for t in r["generation"]["turns"]} == {good}
    status = _status(stack)
    assert status["circuit_open"] is None
    assert "HTTP 404" in status["endpoints"][bad]["out_of_rotation"]
    assert "out_of_rotation" not in status["endpoints"][good]
    text = stack.procs.run(["status"], stack.env).stdout
    assert "out of rotation: " in text
    listed = json.loads(stack.procs.run(["endpoints", "list", "--json"], stack.env).stdout)
    rows = {row["endpoint"]: row for row in listed}
    assert "HTTP 404" in rows[bad]["out_of_rotation"][stack.run_name]
    assert rows[good]["out_of_rotation"] == {}
    text = stack.procs.run(["endpoints", "list"], {**stack.env, "COLUMNS": "300"}).stdout
    assert f"out of rotation for {stack.run_name}" in text


def test_over_long_rows_first_fail_alone_and_the_rows_after_them_are_done(stack: Stack, tmp_path):
    # Sorted by length, longest first: each of the first five is over the context by itself
    # (about 2 tokens a word at this server), so the server answers each with a 400.
    rows = ["long " + "word " * 250] * 5 + [f"question {i}" for i in range(15)]
    rows[:5] = [f"{i} {row}" for i, row in enumerate(rows[:5])]
    stack.enqueue_unchecked(_source(tmp_path, rows), "--max-tokens", "40")
    stack.simulator("--max-model-len", "400", *ANSWER)
    stack.worker(concurrency=2)
    stack.collector()
    stack.wait_complete()

    assert _figures(stack) == Counter({"done": 15, "400": 5})
    assert _status(stack)["circuit_open"] is None
    message = next(iter(stack.store.failures().values())).message
    assert "maximum context length" in message

    again = stack.procs.run(["retry-failed"], stack.env)
    assert "requeued 5 failed samples" in again.stdout, again.stdout + again.stderr
    stack.wait_complete()
    assert _figures(stack) == Counter({"done": 15, "400": 5})
    assert _status(stack)["circuit_open"] is None


def test_every_endpoint_refusing_the_same_way_still_opens_the_breaker_until_retried(
    stack: Stack, tmp_path
):
    sims = [start_simulator(stack.procs, "--model-name", name, *ANSWER) for name in "ab"]
    endpoints = [sim.endpoint for sim in sims]
    stack.env.update(EAGLEGEN_ENDPOINTS=",".join(endpoints), EAGLEGEN_MODEL=MODEL)
    stack.enqueue(_source(tmp_path, [f"question {i}" for i in range(40)]))
    stack.worker(concurrency=2)
    stack.collector()
    stack.wait_complete()

    figures = _figures(stack)
    assert set(figures) <= {"done", "404", "no_endpoint", "circuit_open"}
    assert figures["done"] == 0 and figures["circuit_open"] >= 20
    status = _status(stack)
    assert "samples attempted" in status["circuit_open"]
    for endpoint in endpoints:
        assert f"`{MODEL}` does not exist" in status["endpoints"][endpoint]["out_of_rotation"]

    # The cause fixed (the servers restarted with the run's model), retry-failed closes the
    # breaker and brings both endpoints back.
    for sim in sims:
        stack.procs.stop(sim.proc)
        start_simulator(stack.procs, *ANSWER, port=int(sim.url.rsplit(":", 1)[1]))
    again = stack.procs.run(["retry-failed"], stack.env)
    assert "requeued 40 failed samples" in again.stdout, again.stdout + again.stderr
    stack.wait_complete()
    assert _figures(stack) == Counter(done=40)
    status = _status(stack)
    assert status["circuit_open"] is None
    assert not any("out_of_rotation" in e for e in status["endpoints"].values())
