"""Status figures against a run whose outcome is known."""

from __future__ import annotations

import json

from tests.integration.conftest import Stack


def test_status_counts_match_a_run_with_known_retries_failures_and_tokens(stack: Stack, tmp_path):
    stack.simulator("--fail-first", "1", "--max-model-len", "200")
    rows = [{"prompt": f"question number {i}"} for i in range(5)] + [{"prompt": "long " * 300}]
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stack.worker(concurrency=3)
    stack.collector()
    stack.enqueue(source, "--max-tokens", "64")
    stack.wait_complete()
    records = stack.lines()
    tokens = sum(r["generation"]["usage"]["completion_tokens"] for r in records)

    status = json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)

    assert (status["done"], status["failed"], status["retries"]) == (5, 1, 5)
    assert status["completion_tokens"] == tokens and status["turns"] == 5
    assert status["errors"] == {"5xx": 5, "400": 1}
    assert "maximum context length" in status["last_errors"]["400"]
    assert status["goodput"] == {"kept_tokens": tokens, "wasted_tokens": 0, "fraction_kept": 1.0}
    assert status["samples_per_s_last_minute"] > 0 and status["eta_s"] == 0
    [endpoint] = [e for url, e in status["endpoints"].items() if "requests" in e]
    assert (endpoint["requests"], endpoint["tokens"], endpoint["errors"]) == (5, tokens, 6)
    assert status["mean_completion_tokens"] == tokens / 5


def test_the_live_view_renders_every_section(stack: Stack, tmp_path):
    stack.simulator()
    source = tmp_path / "p.jsonl"
    source.write_text(json.dumps({"prompt": "hello"}) + "\n")
    stack.worker(concurrency=1)
    stack.collector()
    stack.enqueue(source)
    stack.wait_complete()
    view = stack.procs.run(["status", "--watch"], {**stack.env, "COLUMNS": "120"}).stdout
    for label in (
        "1/1 (100.0%)",
        "in flight",
        "last minute",
        "since start",
        "p95",
        "tokens kept / wasted",
        "errors",
        "endpoint",
    ):
        assert label in view, label
