"""Exact resume against real vLLM: a turn broken mid-stream continues to the unbroken ids.

A proxy on loopback (``tests/vllm/proxy.py``) sits between the workers and the server: it cuts
the first streams after a number of events (a dropped connection), or holds each event long
enough to SIGKILL a worker mid-stream. At temperature 0 the continued turn, sent to
``/v1/completions`` as the prompt's ids plus the ids generated before the break, must give
exactly the token ids, reasoning and answer of the same prompts run unbroken.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from common.models import Checkpoint
from tests.harness import ROOT, wait_for
from tests.stack import Stack
from tests.vllm.proxy import ProxyConfig, StreamProxy
from tests.vllm.server import Server, report

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SOURCE = str(ROOT / "data" / "vicuna_bench_question.jsonl")
ENQUEUE = (SOURCE, "--limit", "4", "--max-tokens", "64", "--temperature", "0")  # greedy: comparable


@pytest.fixture
def proxy(vllm_server: Server) -> Iterator[StreamProxy]:
    port = urlparse(vllm_server.url).port
    assert port is not None
    running = StreamProxy(port, ProxyConfig()).start()
    yield running
    running.stop()


def _turns(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each sample's turns: ids, text and how far each resumed from."""
    found = {}
    for record in records:
        answers = [m for m in record["conversations"] if m["role"] == "assistant"]
        found[record["id"]] = [
            {**stats, "content": a["content"], "reasoning": a.get("reasoning_content")}
            for stats, a in zip(record["generation"]["turns"], answers, strict=True)
        ]
    return found


def _unbroken(stack: Stack, server: Server, tmp: Path) -> dict[str, list[dict[str, Any]]]:
    """The same prompts straight to the server, in a run of their own."""
    ref = Stack(stack.procs, stack.settings.redis_url, tmp)
    ref.env.update(stack.env, EAGLEGEN_RUN=ref.run_name, EAGLEGEN_QUEUE=f"q-{ref.run_name}")
    ref.env["EAGLEGEN_ENDPOINTS"] = server.endpoint
    worker, collector = ref.worker(concurrency=4), ref.collector()
    ref.enqueue(*ENQUEUE)
    ref.wait_complete(300)
    for child in (worker, collector):
        ref.procs.stop(child)
    return _turns(ref.lines())


def _assert_same(resumed: dict[str, Any], unbroken: dict[str, Any]) -> int:
    """Every turn equal to the unbroken one; the number of tokens continued, not regenerated."""
    assert resumed.keys() == unbroken.keys()
    carried = 0
    for sample_id, turns in resumed.items():
        for got, want in zip(turns, unbroken[sample_id], strict=True):
            assert got["token_ids"] == want["token_ids"], sample_id
            assert got["prompt_token_ids"] == want["prompt_token_ids"], sample_id
            assert (got["reasoning"], got["content"]) == (want["reasoning"], want["content"])
            assert got["finish_reason"] == want["finish_reason"]
            assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
            carried += got.get("resumed_from_tokens", 0)
    return carried


@pytest.mark.parametrize("cut_after", [6, 20], ids=["in-reasoning", "in-answer"])
def test_a_dropped_stream_continues_to_exactly_the_unbroken_ids(
    stack: Stack, vllm_server: Server, proxy: StreamProxy, tmp_path: Path, cut_after: int
) -> None:
    unbroken = _unbroken(stack, vllm_server, tmp_path / "unbroken")
    proxy.config.cut_after, proxy.config.cuts = cut_after, 4
    stack.env["EAGLEGEN_ENDPOINTS"] = proxy.endpoint
    stack.env["EAGLEGEN_CHECKPOINT_TOKENS"] = "4"
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(*ENQUEUE)
    stack.wait_complete(300)
    assert proxy.cut == 4
    carried = _assert_same(_turns(stack.lines()), unbroken)
    assert carried >= 4 * (cut_after - 2), carried  # each cut turn continued, not restarted
    report(f"resume after a cut at event {cut_after}: 4 of 4 turns equal the unbroken ids, "
           f"{carried} tokens continued instead of generated again")  # fmt: skip


def test_a_worker_killed_mid_stream_is_continued_by_the_next_one(
    stack: Stack, vllm_server: Server, proxy: StreamProxy, tmp_path: Path
) -> None:
    unbroken = _unbroken(stack, vllm_server, tmp_path / "unbroken")
    proxy.config.event_delay = 0.15  # a ~27-token answer takes ~4 s: time to kill mid-stream
    stack.env.update(
        EAGLEGEN_ENDPOINTS=proxy.endpoint, EAGLEGEN_CHECKPOINT_TOKENS="2",
        EAGLEGEN_LEASE_TTL="5", EAGLEGEN_RECONCILE_INTERVAL="2",
    )  # fmt: skip
    first = stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(*ENQUEUE)
    wait_for(lambda: bool(_checkpoints(stack, 6)), 120, "a checkpoint of 6 tokens mid-stream")
    saved = _checkpoints(stack, 6)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    proxy.config.event_delay = 0.0
    stack.worker(concurrency=4)
    stack.wait_complete(300)
    carried = _assert_same(_turns(stack.lines()), unbroken)
    assert carried >= 6, carried
    report(f"resume after a worker SIGKILL: {len(saved)} turns checkpointed mid-stream, all "
           f"records equal the unbroken ids, {carried} tokens continued")  # fmt: skip


def _checkpoints(stack: Stack, min_tokens: int) -> list[Checkpoint]:
    """The run's checkpoints with at least ``min_tokens`` tokens (an empty list: none yet)."""
    found = stack.store.checkpoints().values()
    return [c for c in found if c.tokens >= min_tokens and c.token_ids is not None]
