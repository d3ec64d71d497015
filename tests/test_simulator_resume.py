"""The simulator's side of exact resume: deterministic mid-stream drops, and continuations.

`--disconnect-first N` drops the first N attempts of each prompt mid-stream (`--cut-at K`: after
K tokens), and a continuation (/v1/completions from token ids, or continue_final_message from
text) counts as the next attempt of the prompt it continues, so it goes through. A continuation
from the first k ids or the first k tokens' text gives exactly the rest of the unbroken answer.
A real uvicorn on an ephemeral port (the fixtures of test_simulator_server).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from simulator.answers import expected_answer
from simulator.config import SimConfig
from simulator.faults import Fault, FaultPlan
from simulator.tokenizer import THINK_END
from tests.harness import Procs, start_simulator
from tests.test_simulator_server import MODEL, Sim, chat, sim, start_sim
from tests.test_simulator_token_ids import post, stream, streamed_ids, unbroken

__all__ = ["sim", "start_sim"]  # fixtures shared with test_simulator_server

Body = dict[str, Any]


# --- the fault plan (pure) ------------------------------------------------------------------


def test_disconnect_first_drops_the_attempts_after_fail_first() -> None:
    plan = FaultPlan(fail_first=1, disconnect_first=2)
    rng = random.Random(0)
    decisions = [plan.decide("k", attempt, rng) for attempt in (1, 2, 3, 4)]
    assert decisions == [Fault.HTTP_500, Fault.DISCONNECT, Fault.DISCONNECT, Fault.NONE]


def test_cut_at_fixes_the_cut_but_still_truncates() -> None:
    rng = random.Random(0)
    assert FaultPlan(cut_at=5).cut(40, rng) == 5
    assert FaultPlan(cut_at=50).cut(40, rng) == 39  # never the whole answer
    assert FaultPlan(cut_at=3).cut(1, rng) == 1  # at least one token
    assert 1 <= FaultPlan().cut(40, rng) <= 39  # 0: the random cut point


def test_the_config_carries_the_knobs_to_the_plan() -> None:
    plan = FaultPlan.from_config(SimConfig(disconnect_first=2, cut_at=7))
    assert (plan.disconnect_first, plan.cut_at) == (2, 7)


# --- over HTTP ------------------------------------------------------------------------------


def dropped(url: str, path: str, body: Body) -> tuple[list[Body], int]:
    """Return the chunks of a stream the server at `url` dropped, and how many ids they had."""
    chunks: list[Body] = []
    payload = {"model": MODEL, "stream": True, **body}
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", f"{url}{path}", json=payload, timeout=10) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks, len(streamed_ids(chunks))


def test_disconnect_first_drops_the_first_attempt_at_the_cut_then_a_continuation_completes(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(disconnect_first=1, cut_at=6)
    healthy = start_sim()
    prompt, ids = unbroken(healthy, chat("drop once"))
    body = {"messages": chat("drop once"), "return_token_ids": True}
    chunks, sent = dropped(sim.url, "/v1/chat/completions", body)
    got = streamed_ids(chunks)
    assert sent == 6 and got == ids[:6]
    # The continuation is the prompt's second attempt: not dropped, and exact.
    rest = stream(
        sim,
        "/v1/completions",
        {"prompt": prompt + got, "max_tokens": 2000, "return_token_ids": True},
    )
    assert got + streamed_ids(rest) == ids
    assert sim.stats()["faults"] == {"disconnect": 1}
    # Another prompt has its own first attempt, dropped too (here without ids: text only).
    other, _ = dropped(sim.url, "/v1/chat/completions", {"messages": chat("other")})
    assert other and sim.stats()["faults"] == {"disconnect": 2}


def split_points(ids: list[int]) -> dict[str, int]:
    close = ids.index(THINK_END)
    return {"reasoning": 3, "content": close + 4}


@pytest.mark.parametrize("where", ["reasoning", "content"])
def test_a_completion_continues_the_raw_text_of_the_unbroken_answer(sim: Sim, where: str) -> None:
    full = expected_answer(chat("text too"), None, sim.cfg)
    prompt, ids = unbroken(sim, chat("text too"))
    k = split_points(ids)[where]
    chunks = stream(
        sim,
        "/v1/completions",
        {"prompt": prompt + ids[:k], "max_tokens": 2000, "return_token_ids": True},
    )
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert streamed_ids(chunks) == ids[k:]
    # The raw text the model goes on with: no reasoning parser on /v1/completions.
    whole = f"<think>{full.reasoning}</think>{full.content}"
    tokens = ["<think>", *full.reasoning_tokens, "</think>", *full.content_tokens]
    assert "".join(tokens) == whole
    assert text == "".join(tokens[k:])


@pytest.mark.parametrize("where", ["reasoning", "content"])
@pytest.mark.parametrize("token_ids", [True, False])
def test_continue_final_message_gives_the_rest_of_the_unbroken_text(
    start_sim: Callable[..., Sim], where: str, token_ids: bool
) -> None:
    sim = start_sim(token_ids=token_ids)
    full = expected_answer(chat("go on"), None, sim.cfg)
    r, c = full.reasoning_tokens, full.content_tokens
    if where == "reasoning":
        partial = "<think>" + "".join(r[:2])
        rest_reasoning, rest_content = "".join(r[2:]), full.content
    else:
        partial = f"<think>{full.reasoning}</think>" + "".join(c[:3])
        rest_reasoning, rest_content = "", "".join(c[3:])
    chunks = stream(
        sim,
        "/v1/chat/completions",
        {
            "messages": [*chat("go on"), {"role": "assistant", "content": partial}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning") or "" for d in deltas) == rest_reasoning
    assert "".join(d.get("content") or "" for d in deltas) == rest_content
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_continuation_is_cut_by_max_tokens_where_the_unbroken_answer_is(sim: Sim) -> None:
    prompt, ids = unbroken(sim, chat("short"), max_tokens=12)
    assert len(ids) == 12
    reply = post(
        sim,
        "/v1/completions",
        {"prompt": prompt + ids[:5], "max_tokens": 7, "return_token_ids": True},
    ).json()
    assert reply["choices"][0]["token_ids"] == ids[5:]
    assert reply["choices"][0]["finish_reason"] == "length"


def test_the_command_line_takes_the_knobs(tmp_path: Path) -> None:
    # `eaglegen simulate --disconnect-first 1 --cut-at 4`, as the pipeline tests start it.
    with Procs(tmp_path) as procs:
        sim = start_simulator(procs, "--disconnect-first", "1", "--cut-at", "4")
        body = {"messages": chat("by the cli"), "return_token_ids": True}
        _, sent = dropped(sim.url, "/v1/chat/completions", body)
        assert sent == 4
        assert sim.stats()["faults"] == {"disconnect": 1}


def test_an_answer_continued_with_its_reasoning_apart_goes_on_with_the_answer(sim: Sim) -> None:
    # The client's form once the answer began: the reasoning in reasoning_content (which the
    # simulated template, like a template that drops old reasoning, leaves out), the answer
    # so far as the content.
    full = expected_answer(chat("apart"), None, sim.cfg)
    partial = "".join(full.content_tokens[:4])
    message = {"role": "assistant", "content": partial, "reasoning_content": full.reasoning}
    chunks = stream(
        sim,
        "/v1/chat/completions",
        {
            "messages": [*chat("apart"), message],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not "".join(d.get("reasoning") or "" for d in deltas)
    assert partial + "".join(d.get("content") or "" for d in deltas) == full.content
