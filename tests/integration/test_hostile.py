"""Servers that answer wrongly instead of failing, driving real workers: every case ends bounded.

One sample per case against tests/hostile.py's server, whose path picks the behaviour. Each
case asserts how the sample ends (failed with its kind, or done), its attempts, the seconds it
took and the worker's peak RSS over its idle RSS. ``HOSTILE_REPORT=path`` appends each
case's figures as a JSON line (the same cases were run on the code before, for the figures).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from common.settings import Settings
from tests.harness import Child, wait_for
from tests.hostile import SECRET, HostileServer, elapsed, peak_rss_mb
from tests.stack import Stack

pytestmark = pytest.mark.faults  # make test-faults

RETRIES = 2  # so a failed sample had 3 attempts
LIMIT = float(os.environ.get("HOSTILE_LIMIT", "90"))  # seconds a case may take
RSS_MB = 100  # the worker's peak over its idle RSS, at most
WORKER = {
    "EAGLEGEN_MAX_RETRIES": str(RETRIES),
    "EAGLEGEN_MODEL": "m",
    "EAGLEGEN_PROBE_TIMEOUT": "2",
    "EAGLEGEN_ENDPOINT_COOLDOWN": "1",
    "EAGLEGEN_ENDPOINT_FAILURES": "10",
}


@dataclass
class Figures:
    case: str
    outcome: str  # failed, done, or running (not ended within LIMIT)
    kind: str | None
    attempts: int
    seconds: float
    idle_rss_mb: float
    peak_rss_mb: float
    message: str = ""


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    hostile = HostileServer()
    yield hostile
    hostile.close()


def _start(stack: Stack, endpoints: str, **env: str) -> tuple[Child, float]:
    """A worker on ``endpoints``, once it is up; its idle RSS."""
    stack.env["EAGLEGEN_ENDPOINTS"] = endpoints
    worker = stack.worker(concurrency=1, **{**WORKER, **env})
    wait_for(lambda: " ready." in stack.procs.logs(20000), 60, "the worker to be ready")
    return worker, peak_rss_mb(worker.pid)[0]


def _run(stack: Stack, tmp: Path, case: str, worker: Child, idle: float) -> Figures:
    source = tmp / "p.jsonl"
    source.write_text(json.dumps({"prompt": f"a question for {case}"}) + "\n")
    started = time.monotonic()
    stack.enqueue(source)
    [sample] = stack.store.pending_ids() or [""]
    peak = idle

    def ended() -> bool:
        nonlocal peak
        peak = max(peak, peak_rss_mb(worker.pid)[1])
        counts = stack.store.counts()
        return counts.done + counts.failed == counts.total

    try:
        wait_for(ended, LIMIT, "the sample to end")
        outcome = "failed" if stack.store.counts().failed else "done"
    except TimeoutError:
        outcome = "running"
    seconds = elapsed(started)
    failure = next(iter(stack.store.failures().values()), None)
    attempts = failure.attempts if failure else stack.store.attempts(sample)
    if outcome == "done":
        attempts = _record_attempts(stack, sample)
    figures = Figures(
        case, outcome, failure.kind if failure else None, attempts, seconds, round(idle, 1),
        round(peak, 1), failure.message[:200] if failure else "",
    )  # fmt: skip
    _report(figures)
    return figures


def _record_attempts(stack: Stack, sample: str) -> int:
    record = stack.store.r.hget(stack.store.keys.results, sample) if sample else None
    if record is None:
        return 1
    return int(json.loads(record)["generation"]["attempts"])


def _report(figures: Figures) -> None:
    path = os.environ.get("HOSTILE_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(asdict(figures)) + "\n")


def _bounded(figures: Figures, outcome: str, kind: str | None, attempts: int, seconds: float):
    assert (figures.outcome, figures.kind) == (outcome, kind), figures
    assert figures.attempts == attempts, figures
    assert figures.seconds < seconds, figures
    assert figures.peak_rss_mb - figures.idle_rss_mb < RSS_MB, figures


FAILING = [
    # case, kind, seconds: each attempt ends at once (a wrong shape) or at its deadline.
    ("shape-choices", "bad_response", 30),
    ("shape-content", "bad_response", 30),
    ("shape-deep", "bad_response", 30),
    ("shape-usage", "bad_response", 30),
    ("shape-delta", "bad_response", 30),
    ("tool-id-int", "bad_response", 30),  # pydantic refused it later, outside the client
    ("unterminated", "bad_response", 40),  # 16 MB event cap
    ("gzip-bomb", "bad_response", 40),
    ("huge-500", "5xx", 30),  # 8 KB of the 400 MB read, then the connection closed
    ("trickle-500", "5xx", 40),  # the body gets probe_timeout (2 s)
]


@pytest.mark.parametrize(("case", "kind", "seconds"), FAILING)
def test_a_wrong_answer_fails_the_sample_after_its_retries(
    stack: Stack, tmp_path, server, case, kind, seconds
):
    worker, idle = _start(stack, server.endpoint(case))
    _bounded(_run(stack, tmp_path, case, worker, idle), "failed", kind, RETRIES + 1, seconds)


def test_a_head_trickled_a_byte_at_a_time_ends_at_max_request_time(stack: Stack, tmp_path, server):
    worker, idle = _start(stack, server.endpoint("trickle-head"), EAGLEGEN_MAX_REQUEST_TIME="3")
    figures = _run(stack, tmp_path, "trickle-head", worker, idle)
    _bounded(figures, "failed", "timeout", RETRIES + 1, 40)


@pytest.mark.parametrize("case", ["ids-first-only", "ids-string", "ids-extra"])
def test_ids_that_disagree_with_the_text_are_dropped_and_counted(
    stack: Stack, tmp_path, server, case
):
    worker, idle = _start(stack, server.endpoint(case))
    stack.collector()
    _bounded(_run(stack, tmp_path, case, worker, idle), "done", None, 1, 30)
    wait_for(lambda: stack.lines(), 30, "the record")
    [turn] = stack.lines()[0]["generation"]["turns"]
    assert turn.get("token_ids") is None and turn.get("prompt_token_ids") is None
    # Counted in the run's statistics, which a worker flushes every few seconds.
    dropped = lambda: stack.store.r.hget(stack.store.keys.stats, "ids_dropped") == "1"  # noqa: E731
    wait_for(dropped, 30, "the dropped ids to be counted")


def test_ids_that_disagree_fail_the_sample_when_ids_are_required(stack: Stack, tmp_path, server):
    worker, idle = _start(stack, server.endpoint("ids-first-only"), EAGLEGEN_TOKEN_IDS="on")
    figures = _run(stack, tmp_path, "ids-first-only", worker, idle)
    _bounded(figures, "failed", "no_token_ids", 1, 30)
    assert "missing from 2 of 3 chunks with text" in figures.message


def test_a_body_held_open_after_done_keeps_the_turn(stack: Stack, tmp_path, server):
    worker, idle = _start(stack, server.endpoint("open-after-done"))
    figures = _run(stack, tmp_path, "open-after-done", worker, idle)
    _bounded(figures, "done", None, 1, 15)  # drain_timeout (2 s), not the stall timeout
    assert stack.store.counts().retries == 0


@pytest.mark.parametrize("case", ["models-null", "models-list"])
def test_a_models_list_that_is_none_takes_the_endpoint_out_until_it_answers_one(
    stack: Stack, tmp_path, server, case
):
    # Its first three GET /models answer null or []: the start-up check and two probes fail,
    # the prober lives on, the endpoint comes back, the sample is generated.
    worker, idle = _start(stack, server.endpoint(case), EAGLEGEN_MODEL="")
    _bounded(_run(stack, tmp_path, case, worker, idle), "done", None, 1, 30)
    assert server.calls(case, "get") >= 4


def test_one_slow_endpoint_delays_neither_the_others_nor_status(stack: Stack, tmp_path, server):
    slow, ok = server.endpoint("trickle-models"), server.endpoint("ok")
    worker, idle = _start(stack, f"{slow},{ok}", EAGLEGEN_MODEL="")
    figures = _run(stack, tmp_path, "trickle-models", worker, idle)
    _bounded(figures, "done", None, 1, 20)
    env = {**stack.env, "EAGLEGEN_ENDPOINTS": f"{server.endpoint('trickle-metrics')},{ok}"}
    started = time.monotonic()
    result = stack.procs.run(["status", "--json"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert elapsed(started) < 15  # each /metrics read is 2 s at most, all of it


class Events:
    """Every event of the broker, whole, received as Flower receives them."""

    def __init__(self, stack: Stack) -> None:
        from worker.app import create_app

        url, queue = stack.env["EAGLEGEN_REDIS_URL"], stack.env["EAGLEGEN_QUEUE"]
        app = create_app(Settings(redis_url=url, queue=queue))
        self.seen: list[dict[str, Any]] = []
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self.seen.append})
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def close(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(10)
        self._connection.release()


@pytest.mark.parametrize("case", ["secret-500", "secret-event"])
def test_a_server_quoting_the_key_reaches_no_event_log_or_failure(
    stack: Stack, tmp_path, server, case
):
    events = Events(stack)
    try:
        worker, idle = _start(
            stack, server.endpoint(case), EAGLEGEN_API_KEY=SECRET, EAGLEGEN_TASK_EVENTS="true"
        )
        figures = _run(stack, tmp_path, case, worker, idle)
        wait_for(lambda: _types(events).count("task-retried") == RETRIES, 30, "the retries")
    finally:
        events.close()
    _bounded(figures, "failed", "5xx", RETRIES + 1, 30)
    assert "Bearer ***" in figures.message
    retried = [e for e in events.seen if e["type"] == "task-retried"]
    assert retried and all("Bearer ***" in e["exception"] for e in retried)
    assert all("Bearer ***" in e["traceback"] for e in retried if e.get("traceback"))
    assert SECRET not in json.dumps(events.seen, default=str)
    assert SECRET not in stack.procs.logs(1 << 20)


def _types(events: Events) -> list[str]:
    return [e["type"] for e in events.seen]


def test_an_endpoint_url_with_credentials_is_refused_at_start(stack: Stack):
    env = {**stack.env, "EAGLEGEN_ENDPOINTS": "http://user:pa55word@127.0.0.1:1/v1"}
    result = stack.procs.run(["worker", "--concurrency", "1"], env, timeout=60)
    assert result.returncode != 0 and "holds credentials" in result.stderr
    assert "pa55word" not in result.stderr + result.stdout and "Traceback" not in result.stderr
