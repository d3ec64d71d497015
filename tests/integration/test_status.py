"""Status figures against a run whose outcome is known."""

from __future__ import annotations

import json

from tests.harness import free_port, wait_for
from tests.stack import Stack


def test_status_counts_match_a_run_with_known_retries_failures_and_tokens(stack: Stack, tmp_path):
    stack.simulator("--fail-first", "1", "--max-model-len", "200")
    rows = [{"prompt": f"question number {i}"} for i in range(5)] + [{"prompt": "long " * 300}]
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    worker = stack.worker(concurrency=3)
    stack.collector()
    stack.enqueue_unchecked(source, "--max-tokens", "64")  # the long prompt meets a 400
    stack.wait_complete()
    stack.procs.stop(worker)  # its last second of turn statistics is written as it stops
    records = stack.lines()
    tokens = sum(r["generation"]["usage"]["completion_tokens"] for r in records)

    status = json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)

    assert (status["done"], status["failed"], status["retries"]) == (5, 1, 5)
    assert status["completion_tokens"] == tokens and status["turns"] == 5
    assert status["errors"] == {"5xx": 5, "400": 1}
    assert "maximum context length" in status["last_errors"]["400"]
    assert status["goodput"] == {
        "kept_tokens": tokens, "wasted_tokens": 0, "fraction_kept": 1.0, "resumed_turns": 0,
        "resumed_tokens": 0, "discarded_checkpoints": 0, "ids_dropped_turns": 0,
        "aborted_requests": 0, "abort_saved_tokens": 0,
    }  # fmt: skip
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


def _metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"{name} {labels} not in metrics")


def test_workers_and_the_exporter_serve_prometheus_metrics(stack: Stack, tmp_path):
    import httpx

    stack.simulator("--fail-first", "1")
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"q {i}"}) + "\n" for i in range(3)))
    worker_port, exporter_port = free_port(), free_port()
    stack.worker(concurrency=2, EAGLEGEN_METRICS_PORT=str(worker_port))
    stack.collector()
    stack.procs.start("exporter", ["exporter", "--port", str(exporter_port)], stack.env)
    stack.enqueue(source)
    stack.wait_complete()

    def scrape(port: int) -> str | None:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return None

    wait_for(lambda: scrape(exporter_port) is not None, 30, "the exporter")
    worker = scrape(worker_port) or ""
    endpoint = stack.env["EAGLEGEN_ENDPOINTS"]
    assert _metric(worker, "eaglegen_requests_total", endpoint=endpoint, outcome="ok") == 3
    assert _metric(worker, "eaglegen_requests_total", endpoint=endpoint, outcome="5xx") == 3
    assert _metric(worker, "eaglegen_request_latency_seconds_count", endpoint=endpoint) == 3
    run = scrape(exporter_port) or ""
    assert _metric(run, "eaglegen_run_samples", run=stack.run_name, state="done") == 3
    assert _metric(run, "eaglegen_run_samples", run=stack.run_name, state="queued") == 0
    assert _metric(run, "eaglegen_run_retries", run=stack.run_name) == 3
