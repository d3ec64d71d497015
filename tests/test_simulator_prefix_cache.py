"""The per-server prefix cache over HTTP: vLLM's metrics, /sim/stats, later turns, prefill time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from simulator.answers import expected_answer
from simulator.tokenizer import encode_chat
from tests.test_simulator_server import MODEL, Sim, chat, sim, start_sim

__all__ = ["sim", "start_sim"]  # fixtures shared with test_simulator_server


def ask(sim: Sim, messages: list[Any], **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, **extra}
    response = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def blocks(tokens: int, size: int = 16) -> int:
    return tokens // size * size


def common_prefix(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_a_repeated_prompt_hits_all_its_blocks_but_the_last_token(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim()
    messages = chat("word " * 40)
    n = len(encode_chat(messages))
    ask(sim, messages)
    assert sim.metric("vllm:prefix_cache_hits_total") == 0
    ask(sim, messages)
    assert sim.metric("vllm:prefix_cache_queries_total") == 2 * n
    assert sim.metric("vllm:prefix_cache_hits_total") == blocks(n - 1)
    stats = sim.stats()
    assert stats["prefix_cache_queries"] == 2 * n
    assert stats["prefix_cache_hits"] == blocks(n - 1)
    assert stats["prefill_tokens_computed"] == 2 * n - blocks(n - 1)


def test_a_later_turn_hits_the_first_turns_prompt_and_answer(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(reasoning_tokens=0)
    first = ask(sim, chat("turn one"), return_token_ids=True)
    generated = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    content = first["choices"][0]["message"]["content"]
    history = [*chat("turn one"), {"role": "assistant", "content": content}, *chat("two")]
    second = encode_chat(history)
    shared = common_prefix(generated, second)
    assert shared > len(first["prompt_token_ids"])  # the answer's blocks count too
    before = sim.stats()["prefix_cache_hits"]
    ask(sim, history)
    assert sim.stats()["prefix_cache_hits"] - before == blocks(min(shared, len(second) - 1))


def test_a_small_cache_forgets_the_least_recently_used_prompt(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(prefix_cache_blocks=4, reasoning_tokens=0, max_answer_tokens=16)
    old, new = chat("alpha " * 60), chat("bravo " * 60)
    ask(sim, old, max_tokens=1)
    ask(sim, new, max_tokens=1)
    assert sim.stats()["prefix_cache_blocks"] == 4
    hits = sim.stats()["prefix_cache_hits"]
    ask(sim, old, max_tokens=1)
    assert sim.stats()["prefix_cache_hits"] == hits


def test_prefill_time_is_spent_on_uncached_tokens_only(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(prefill_time_per_token=0.01, reasoning_tokens=0)
    messages = chat("word " * 150)
    n = len(encode_chat(messages))
    assert n * 0.01 >= 1.5
    started = time.monotonic()
    ask(sim, messages, max_tokens=1)
    cold = time.monotonic() - started
    started = time.monotonic()
    ask(sim, messages, max_tokens=1)
    warm = time.monotonic() - started
    assert cold >= n * 0.01
    assert warm < cold / 3  # at most one block and the last token computed again


def test_prefill_time_is_a_runtime_knob(sim: Sim) -> None:
    response = httpx.post(f"{sim.url}/sim/config", json={"prefill_time_per_token": 0.5})
    assert response.json()["prefill_time_per_token"] == 0.5


def test_the_defaults_keep_todays_timings_and_answers(sim: Sim) -> None:
    assert sim.cfg.prefill_time_per_token == 0
    reply = ask(sim, chat())
    assert (
        reply["choices"][0]["message"]["content"] == expected_answer(chat(), None, sim.cfg).content
    )
