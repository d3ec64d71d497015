"""Exact resume against real vLLM, at the client: a turn broken mid-stream and continued from
its checkpoint equals the unbroken turn (temperature 0; the tiny model's planted path).

The stream is broken by the client (``check`` raising after N network reads, as a lost lease
does), at every point of the turn in turn: in the reasoning, at ``</think>``, in the answer.
The exact path continues on ``/v1/completions`` from the token ids; the text path (ids off)
with ``continue_final_message``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from common import errors
from common.models import Checkpoint, GenParams, TurnResult
from common.settings import Settings
from tests.vllm.server import Server
from worker.chat.client import ChatClient

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]  # server start-up included

ASK = [{"role": "user", "content": "Say something short."}]


@pytest.fixture
def client(vllm_server: Server) -> Iterator[ChatClient]:
    made = ChatClient(vllm_server.endpoint, Settings(endpoints=[vllm_server.endpoint]))
    yield made
    made.close()


class Finished(Exception):
    """The turn ended before the read it was to be broken at."""


def broken_after(client: ChatClient, reads: int, params: GenParams) -> Checkpoint | None:
    """The checkpoint of the turn aborted after ``reads`` network reads (None: nothing with
    text had arrived); Finished when the turn finished before that read."""
    seen = 0

    def check() -> None:
        nonlocal seen
        seen += 1
        if seen == reads:
            raise errors.LeaseLost("aborted by the test")

    try:
        client.complete(ASK, params, check)
    except errors.LeaseLost as exc:
        return exc.checkpoint
    raise Finished


def checkpoints(client: ChatClient, params: GenParams) -> Iterator[Checkpoint]:
    """A checkpoint at every read of the turn."""
    for reads in range(1, 10_000):
        try:
            checkpoint = broken_after(client, reads, params)
        except Finished:
            return
        if checkpoint is not None:
            yield checkpoint


def same(resumed: TurnResult, unbroken: TurnResult, checkpoint: Checkpoint) -> None:
    where = f"resumed from {checkpoint.tokens} tokens: {checkpoint.model_dump()}"
    assert resumed.token_ids == unbroken.token_ids, where
    assert resumed.prompt_token_ids == unbroken.prompt_token_ids, where
    assert (resumed.reasoning, resumed.content) == (unbroken.reasoning, unbroken.content), where
    assert resumed.finish_reason == unbroken.finish_reason, where
    assert resumed.usage == unbroken.usage, where
    assert resumed.resumed_from_tokens == checkpoint.tokens, where


@pytest.mark.parametrize("max_tokens", [64, 12])
def test_a_turn_broken_anywhere_resumes_exactly_from_its_ids(
    client: ChatClient, max_tokens: int
) -> None:
    params = GenParams(max_tokens=max_tokens, temperature=0.0)
    unbroken = client.complete(ASK, params)
    assert unbroken.token_ids is not None and unbroken.reasoning
    if max_tokens == 12:
        assert unbroken.finish_reason == "length"
    seen: list[tuple[int, bool]] = []
    for checkpoint in checkpoints(client, params):
        assert checkpoint.token_ids == unbroken.token_ids[: checkpoint.tokens]
        resumed = client.complete(ASK, params, resume=checkpoint)
        same(resumed, unbroken, checkpoint)
        seen.append((checkpoint.tokens, bool(checkpoint.content)))
    assert client.completions is True
    assert any(not in_answer for _, in_answer in seen), seen  # broken in the reasoning
    if unbroken.content:
        assert any(in_answer for _, in_answer in seen), seen  # and in the answer


def test_a_turn_without_ids_resumes_from_its_text(vllm_server: Server) -> None:
    endpoint = vllm_server.endpoint
    client = ChatClient(endpoint, Settings(endpoints=[endpoint], token_ids="off"))
    try:
        params = GenParams(max_tokens=64, temperature=0.0)
        unbroken = client.complete(ASK, params)
        results: list[dict[str, Any]] = []
        for checkpoint in checkpoints(client, params):
            assert checkpoint.token_ids is None
            resumed = client.complete(ASK, params, resume=checkpoint)
            results.append(
                {
                    "from": (checkpoint.reasoning, checkpoint.content),
                    "ok": (resumed.reasoning, resumed.content)
                    == (unbroken.reasoning, unbroken.content),
                    "got": (resumed.reasoning, resumed.content),
                }
            )
        assert results and all(r["ok"] for r in results), (unbroken, results)
        assert client.chat_continues is True  # vLLM's continuation probe passed
    finally:
        client.close()
