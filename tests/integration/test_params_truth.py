"""What a record and `status` say about the parameters a run was generated with (issue 33,
items 4 and 8): a sample retried under new parameters starts again from its first turn, a
turn cut by the context window is told apart from one cut at max_tokens, enqueue suggests a
max_tokens that leaves the prompts room and freezes no run it accepted nothing into, and a
bad endpoint list or an endpoint that answers no HTTP is one line. Real workers, collector and
simulator."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.harness import free_port, wait_for
from tests.hostile import HostileServer
from tests.stack import Stack

# Each turn of the simulator's answers is this long, reasoning aside.
ANSWER = ("--min-answer-tokens", "120", "--max-answer-tokens", "120", "--reasoning-tokens", "0")


def _status(stack: Stack) -> dict[str, Any]:
    result = stack.procs.run(["status", "--json"], stack.env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _two_turns(tmp: Path, n: int = 1) -> Path:
    """A short first question, then one long enough that the second turn's prompt is ~250
    tokens (the first answer's 120 included)."""
    source = tmp / "two.jsonl"
    rows = [{"turns": [f"question {i}", "tell me more " + "word " * 100]} for i in range(n)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return source


def _prompts(tmp: Path, n: int, words: int) -> Path:
    source = tmp / "p.jsonl"
    rows = [{"prompt": f"question {i} " + "word " * words} for i in range(n)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return source


def test_retry_failed_with_new_parameters_starts_each_sample_again_from_its_first_turn(
    stack: Stack, tmp_path: Path
) -> None:
    # The second turn's prompt (~250) + max_tokens 200 is over the 400-token window: a 400,
    # permanent, after the first turn was answered (120 tokens, under max_tokens 200).
    stack.simulator("--max-model-len", "400", *ANSWER)
    stack.enqueue(_two_turns(tmp_path), "--max-tokens", "200")
    stack.worker(concurrency=1)
    wait_for(lambda: stack.store.counts().failed == 1, 60, "the sample to fail")
    [failure] = stack.store.failures().values()
    assert failure.kind == "400"

    stack.collector()
    result = stack.procs.run(["retry-failed", "--max-tokens", "20"], stack.env)
    assert result.returncode == 0, result.stderr
    stack.wait_complete()
    [record] = stack.lines()
    generation = record["generation"]
    assert generation["params"]["max_tokens"] == 20
    # Every turn was generated under the recorded parameters: the first one again, cut at 20.
    for turn in generation["turns"]:
        assert turn["usage"]["completion_tokens"] <= 20, generation["turns"]
    assert generation["turns"][0]["cut_by"] == "max_tokens"
    # retry-failed and status say so.
    assert "1 start again from their first turn" in result.stdout, result.stdout
    assert _status(stack)["restarted_samples"] == 1


def test_a_turn_cut_by_the_context_window_is_recorded_and_advised_as_such(
    stack: Stack, tmp_path: Path
) -> None:
    # As vLLM 0.32: the second turn's max_tokens is cut to what the window leaves (~150).
    stack.simulator("--max-model-len", "400", "--over-context", "clamp", *ANSWER)
    stack.worker(concurrency=2)
    stack.collector()
    stack.enqueue(_two_turns(tmp_path, 2), "--max-tokens", "200")
    stack.wait_complete()

    for record in stack.lines():
        first, second = record["generation"]["turns"]
        assert first["finish_reason"] == "stop" and "cut_by" not in first
        assert second["finish_reason"] == "length" and second["cut_by"] == "context"
        used = second["usage"]["prompt_tokens"] + second["usage"]["completion_tokens"]
        assert used == 400 and second["usage"]["completion_tokens"] < 200
    status = _status(stack)
    assert (status["cut_turns"], status["context_cut_turns"]) == (2, 2)
    assert any("2 turns were cut by the context window" in n for n in status["notes"])
    assert not any("raise --max-tokens" in n for n in status["notes"]), status["notes"]


def test_enqueue_suggests_a_max_tokens_that_leaves_the_prompts_room(
    stack: Stack, tmp_path: Path
) -> None:
    stack.simulator("--max-model-len", "2048")
    source = _prompts(tmp_path, 20, words=50)
    refused = stack.procs.run(["enqueue", str(source), "--max-tokens", "4000"], stack.env)
    assert refused.returncode == 1
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, refused.stderr
    suggested = int(re.search(r"use at most (\d+)", lines[0]).group(1))  # type: ignore[union-attr]
    assert suggested <= 2048 - 50
    result = stack.enqueue(source, "--max-tokens", str(suggested))
    assert "enqueued 20," in result.stdout and "too long" not in result.stdout, result.stdout


def test_an_enqueue_that_accepts_nothing_freezes_no_parameters(
    stack: Stack, tmp_path: Path
) -> None:
    stack.simulator("--max-model-len", "2048")
    source = _prompts(tmp_path, 20, words=50)
    # Fits the window by itself, and leaves no prompt room: every row is too long.
    first = stack.enqueue(source, "--max-tokens", "2043")
    assert "enqueued 0," in first.stdout and "too long 20" in first.stdout
    assert not stack.store.exists()
    again = stack.enqueue(source, "--max-tokens", "1024")
    assert "enqueued 20," in again.stdout
    assert stack.store.params().max_tokens == 1024  # type: ignore[union-attr]
    assert "use at most" in first.stdout  # the first summary said what would fit


def test_space_separated_endpoints_are_a_one_line_error(stack: Stack, tmp_path: Path) -> None:
    two = f"http://127.0.0.1:{free_port()}/v1 http://127.0.0.1:{free_port()}/v1"
    result = stack.procs.run(
        ["enqueue", str(_prompts(tmp_path, 2, words=3))], {**stack.env, "EAGLEGEN_ENDPOINTS": two}
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "comma-separated" in lines[0]
    assert not stack.store.exists()


def test_enqueue_with_no_endpoint_answering_says_so_in_one_line(
    stack: Stack, tmp_path: Path
) -> None:
    hostile = HostileServer()
    try:
        endpoints = f"{hostile.endpoint('not-http')},http://127.0.0.1:{free_port()}/v1"
        env = {**stack.env, "EAGLEGEN_ENDPOINTS": endpoints}
        result = stack.procs.run(["enqueue", str(_prompts(tmp_path, 2, words=3))], env)
    finally:
        hostile.close()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and "no endpoint gave its max_model_len" in lines[0], result.stderr
    assert "BadStatusLine" in lines[0] and "enqueued 2," in result.stdout
