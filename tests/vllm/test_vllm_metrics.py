"""vLLM's scheduler limit, read from its real ``/metrics`` while the pipeline pushes more."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import wait_for
from tests.stack import Stack
from tests.vllm.server import Server, report, start_server, stop_server
from worker.endpoints.capacity import EndpointView, SlotTable

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]  # server start-up included

MAX_NUM_SEQS = 2
PROMPTS = 120


@pytest.fixture(scope="module")
def small_server(
    vllm_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A second server that runs at most two sequences at once."""
    logs = tmp_path_factory.mktemp("vllm-small")
    server = start_server(logs, "--max-num-seqs", str(MAX_NUM_SEQS))
    report(f"vLLM server (--max-num-seqs {MAX_NUM_SEQS}) ready in {server.started_s} s")
    yield server
    stop_server(server)


TRIES = 5  # three in a row once failed on one stretch of stale gauges (each try is ~7 s)


def retried(test: Callable[[Stack, Server], None]) -> Callable[[Stack, Server], None]:
    """Run a gauge-reading test up to five times, each on a fresh run, before failing it.

    This CPU build's ``/metrics`` gauges lag the scheduler by up to seconds and sometimes stay
    at 0 through a whole ~10 s batch of this tiny model (seen at earlier commits too, whatever
    the client): one unlucky batch says nothing about the pipeline. Every try is reported.
    """

    @functools.wraps(test)
    def run(stack: Stack, small_server: Server) -> None:
        for attempt in range(1, TRIES + 1):
            try:
                test(stack, small_server)
                report(f"{test.__name__}: passed on try {attempt}")
                return
            except (AssertionError, TimeoutError) as exc:
                report(f"{test.__name__}: try {attempt} failed: {str(exc)[:120]}")
                if attempt == TRIES:
                    raise
            stack.procs.stop_all()
            fresh = stack.tmp / f"try-{attempt + 1}"
            fresh.mkdir()
            stack = Stack(stack.procs, stack.env["EAGLEGEN_REDIS_URL"], fresh)

    return run


class GaugeSampler:
    """Reads ``/metrics`` in a thread, as often as the server answers, until stopped; then
    adds the (running, waiting) of the stats lines the server logged in that time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.reads: list[tuple[float, float]] = []  # (running, waiting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GaugeSampler:
        self._mark()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        # The server's own stats lines logged meanwhile: a second view of the same scheduler.
        self.reads += self.server.logged_load()[self._logged :]

    def _mark(self) -> None:
        self._logged = len(self.server.logged_load())

    def _run(self) -> None:
        while not self._stop.is_set():
            gauges = self.server.gauges()
            running = gauges["vllm:num_requests_running"]
            self.reads.append((running, gauges["vllm:num_requests_waiting"]))


@retried
def test_the_server_runs_at_most_max_num_seqs_while_more_requests_wait(
    stack: Stack, small_server: Server
) -> None:
    with GaugeSampler(small_server) as sampler:
        _run_long_prompts(stack, small_server)
        stack.wait_complete(timeout=300)
    assert sampler.reads, "no /metrics read while the run went on"
    running = [r for r, _ in sampler.reads]
    assert max(running) <= MAX_NUM_SEQS
    # Both at once: the server was full and the pipeline had more requests in it.
    assert any(r == MAX_NUM_SEQS and w > 0 for r, w in sampler.reads), sampler.reads
    assert len(stack.lines()) == PROMPTS
    saturated = sum(r == MAX_NUM_SEQS for r in running)
    report(
        f"max-num-seqs {MAX_NUM_SEQS}: {len(running)} /metrics reads, {saturated} with "
        f"{MAX_NUM_SEQS} running, waiting up to {max(w for _, w in sampler.reads):g}"
    )


def _endpoint(stack: Stack, endpoint: str) -> EndpointView:
    """The endpoint's cap and requests in flight, as every worker sees them in Redis."""
    table = SlotTable(stack.store.r, stack.settings.key_prefix, {endpoint: 64}, 30)
    [view] = table.snapshot()
    return view


def long_prompts(folder: Path) -> Path:
    """PROMPTS single-turn prompts of ~1,300 tokens each.

    With the bundled short prompts this tiny model answers in ~0.1 s, and on two cores vLLM's
    API process (chat template, tokenizer, one SSE event per token) is then slower than its
    engine: sixteen requests in flight reach the engine one or two at a time, its waiting queue
    stays empty and there is nothing for /metrics to show. A long prefill makes the engine the
    bottleneck, as a GPU server under load is, so requests wait where the gauges count them.
    """
    filler = " please explain the history of the world in detail" * 150
    path = folder / "long.jsonl"
    rows = ({"question_id": i, "turns": [f"question {i}:{filler}"]} for i in range(PROMPTS))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run_long_prompts(stack: Stack, server: Server, **env: str) -> None:
    stack.env |= {"EAGLEGEN_ENDPOINTS": server.endpoint, **env}
    stack.worker(concurrency=16)
    stack.collector()
    stack.enqueue(long_prompts(stack.tmp), "--max-tokens", "64")  # the answer path is 27


@retried
def test_an_endpoint_cap_bounds_what_the_server_holds_whatever_the_worker_concurrency(
    stack: Stack, small_server: Server
) -> None:
    cap = MAX_NUM_SEQS + 1
    with GaugeSampler(small_server) as sampler:
        _run_long_prompts(stack, small_server, EAGLEGEN_MAX_INFLIGHT=str(cap))
        stack.wait_complete(timeout=300)
    assert max(r + w for r, w in sampler.reads) <= cap, sampler.reads
    assert any(r == MAX_NUM_SEQS for r, _ in sampler.reads)
    assert len(stack.lines()) == PROMPTS


@retried
def test_adaptive_caps_follow_the_real_metrics_down_to_what_the_server_runs(
    stack: Stack, small_server: Server
) -> None:
    adaptive = {"EAGLEGEN_ADAPTIVE": "true", "EAGLEGEN_ADAPTIVE_INTERVAL": "0.3"}
    _run_long_prompts(stack, small_server, EAGLEGEN_MAX_INFLIGHT="64", **adaptive)
    caps: list[int] = []

    def cap_came_down() -> bool:
        view = _endpoint(stack, small_server.endpoint)
        caps.append(view.cap)
        return view.adaptive and view.cap <= MAX_NUM_SEQS + 2  # running + a small queue

    wait_for(cap_came_down, 120, lambda: f"the adaptive cap to come down (caps {caps[-20:]})")
    # Requests sent before the cap came down still run or wait; the cap bounds what follows.
    view = lambda: _endpoint(stack, small_server.endpoint)  # noqa: E731
    wait_for(lambda: view().inflight <= view().cap, 120, "the requests sent before to drain")
    with GaugeSampler(small_server) as sampler:
        stack.wait_complete(timeout=300)
    waiting = max(w for _, w in sampler.reads)
    # Without a cap the 16 streams queue 14 (the first test); the driver's probes add a few.
    assert waiting <= 2 * MAX_NUM_SEQS + 2, sampler.reads
    assert len(stack.lines()) == PROMPTS
    report(f"adaptive: cap 64 -> {caps[-1]}; waiting at most {waiting:g} afterwards")
