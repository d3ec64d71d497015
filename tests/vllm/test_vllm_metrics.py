"""vLLM's scheduler limit, read from its real ``/metrics`` while the pipeline pushes more."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import ROOT, Stack, wait_for
from tests.vllm.conftest import Server, report, start_server, stop_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]  # server start-up included

MAX_NUM_SEQS = 2


@pytest.fixture(scope="module")
def small_server(
    vllm_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A second server that runs at most two sequences at once."""
    log = tmp_path_factory.mktemp("vllm-small") / "server.log"
    server = start_server(log, "--max-num-seqs", str(MAX_NUM_SEQS))
    report(f"vLLM server (--max-num-seqs {MAX_NUM_SEQS}) ready in {server.started_s} s")
    yield server
    stop_server(server)


def test_the_server_runs_at_most_max_num_seqs_while_more_requests_wait(
    stack: Stack, small_server: Server
) -> None:
    stack.env["EAGLEGEN_ENDPOINTS"] = small_server.endpoint
    stack.worker(concurrency=16)
    stack.collector()
    stack.enqueue(ROOT / "data" / "vicuna_bench_question.jsonl", "--limit", "80")
    running: list[float] = []
    waiting: list[float] = []

    def sample_then_check_complete() -> bool:
        gauges = small_server.gauges()
        running.append(gauges["vllm:num_requests_running"])
        waiting.append(gauges["vllm:num_requests_waiting"])
        return stack.store.counts().complete

    wait_for(sample_then_check_complete, 300, "the run to complete", every=0.05)
    assert max(running) <= MAX_NUM_SEQS
    assert max(running) == MAX_NUM_SEQS and max(waiting) > 0  # the pipeline pushed more
    assert len(stack.lines()) == 80
    report(f"max-num-seqs {MAX_NUM_SEQS}: running peaked at {max(running):g}, "
           f"waiting at {max(waiting):g} over {len(running)} /metrics reads")  # fmt: skip
