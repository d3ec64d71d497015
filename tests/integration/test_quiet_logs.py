"""Quiet by default: a real pipeline's logs grow by a few bytes per sample, not a line per task."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import wait_for
from tests.stack import Stack

SAMPLES = 400
BYTES_PER_SAMPLE = 20  # the goal: at most 20 KB of logs per 1,000 samples
FAST = ("--time-per-token", "0", "--ttft", "0", "--max-answer-tokens", "20",
        "--reasoning-tokens", "0")  # fmt: skip


def _logs(stack: Stack) -> list[Path]:
    return sorted(p for p in stack.tmp.glob("*.log") if not p.name.startswith("simulator"))


def _size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def test_a_run_at_the_default_level_logs_under_20_bytes_per_sample(stack: Stack, tmp_path):
    stack.simulator(*FAST)
    stack.worker(concurrency=8)
    stack.collector()
    logs = _logs(stack)
    worker_log = next(p for p in logs if p.name.startswith("worker"))
    wait_for(lambda: "ready." in worker_log.read_text(), 60, "the worker to be ready")
    wait_for(lambda: "answers" in worker_log.read_text(), 30, "the endpoint check")
    before = _size(logs)
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(SAMPLES)))
    stack.enqueue(source)
    stack.wait_complete(timeout=180)
    grown = _size(logs) - before
    text = "".join(p.read_text() for p in logs)
    assert "succeeded in" not in text and "HTTP Request" not in text, text[-2000:]
    assert grown <= SAMPLES * BYTES_PER_SAMPLE, text[-2000:]
