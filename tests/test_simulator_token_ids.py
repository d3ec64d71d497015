"""Token ids over HTTP: return_token_ids, /v1/completions with token-id prompts, exact resume.

A real uvicorn on an ephemeral port (the fixtures of test_simulator_server), real clients.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from simulator.answers import expected_answer, prompt_key
from simulator.config import SimConfig
from simulator.output import model_output
from simulator.tokenizer import IM_END, KEY, THINK, THINK_END, decode, decode_prompt, encode_chat
from tests.test_simulator_server import MODEL, Sim, chat, sim, start_sim

__all__ = ["sim", "start_sim"]  # fixtures shared with test_simulator_server

Body = dict[str, Any]


def post(sim: Sim, path: str, body: Body) -> httpx.Response:
    return httpx.post(f"{sim.url}{path}", json={"model": MODEL, **body}, timeout=10)


def stream(sim: Sim, path: str, body: Body) -> list[Body]:
    """Return the JSON chunks of a streamed response."""
    chunks = []
    payload = {"model": MODEL, "stream": True, **body}
    with httpx.stream("POST", f"{sim.url}{path}", json=payload, timeout=10) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def streamed_ids(chunks: list[Body]) -> list[int]:
    return [i for c in chunks for choice in c["choices"] for i in choice.get("token_ids", [])]


def unbroken(sim: Sim, messages: list[Any], **extra: Any) -> tuple[list[int], list[int]]:
    """Return (prompt ids, completion ids) of one non-streamed chat with token ids."""
    body = post(
        sim, "/v1/chat/completions", {"messages": messages, "return_token_ids": True, **extra}
    )
    reply = body.json()
    return reply["prompt_token_ids"], reply["choices"][0]["token_ids"]


def test_a_stream_carries_prompt_ids_first_then_each_chunks_delta_ids(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim()
    expected = expected_answer(chat(), None, sim.cfg)
    chunks = stream(
        sim,
        "/v1/chat/completions",
        {"messages": chat(), "return_token_ids": True, "stream_options": {"include_usage": True}},
    )
    assert chunks[0]["prompt_token_ids"] == encode_chat(chat())
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert all("token_ids" in c["choices"][0] for c in chunks[1:] if c["choices"])
    ids = streamed_ids(chunks)
    assert ids == [t.id for t in model_output(chat(), sim.cfg)]
    text = f"<think>{expected.reasoning}</think>{expected.content}<|im_end|>"
    assert decode(ids, prompt_key(chat())) == text
    assert (ids[0], ids[len(expected.reasoning_tokens) + 1], ids[-1]) == (THINK, THINK_END, IM_END)
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == len(ids)  # vLLM counts the tags and end of turn
    assert usage["prompt_tokens"] == len(chunks[0]["prompt_token_ids"])


def test_each_chunks_ids_are_its_own_delta(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(time_per_token=0.001)
    key = prompt_key(chat())
    chunks = stream(sim, "/v1/chat/completions", {"messages": chat(), "return_token_ids": True})
    for chunk in chunks[1:]:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        text = delta.get("content") or delta.get("reasoning") or ""
        ids = choice["token_ids"]
        assert len(ids) <= 1  # paced: one token a chunk
        assert text == decode([i for i in ids if i not in (THINK, THINK_END, IM_END)], key)


def test_non_streaming_ids_sit_where_vllm_puts_them(sim: Sim) -> None:
    reply = post(sim, "/v1/chat/completions", {"messages": chat(), "return_token_ids": True}).json()
    assert reply["prompt_token_ids"] == encode_chat(chat())
    ids = reply["choices"][0]["token_ids"]
    assert ids == [t.id for t in model_output(chat(), sim.cfg)]
    assert reply["usage"]["completion_tokens"] == len(ids)
    message = reply["choices"][0]["message"]
    assert message["content"] == expected_answer(chat(), None, sim.cfg).content


def test_without_the_flag_nothing_changes(sim: Sim) -> None:
    reply = post(sim, "/v1/chat/completions", {"messages": chat()}).json()
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
    assert (
        reply["usage"]["completion_tokens"]
        == expected_answer(chat(), None, sim.cfg).completion_tokens
    )


def test_max_tokens_counts_ids_and_cuts_with_length(sim: Sim) -> None:
    _, ids = unbroken(sim, chat(), max_tokens=5)
    assert ids == [t.id for t in model_output(chat(), sim.cfg)][:5]
    reply = post(
        sim, "/v1/chat/completions", {"messages": chat(), "return_token_ids": True, "max_tokens": 5}
    )
    assert reply.json()["choices"][0]["finish_reason"] == "length"


def test_thinking_off_puts_an_empty_think_block_in_the_prompt(sim: Sim) -> None:
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    prompt, ids = unbroken(sim, chat(), **kwargs)
    assert prompt[-2:] == [THINK, THINK_END]
    assert ids[0] == KEY and THINK not in ids


# --- exact resume through /v1/completions ---------------------------------------------------


def resume_points(ids: list[int]) -> list[int]:
    """First token, inside the reasoning, at </think>, the key, inside the content, the end."""
    close = ids.index(THINK_END)
    return [1, 3, close, close + 1, close + 2, len(ids) - 5, len(ids) - 1]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_token_id_prompt_continues_the_answer_exactly(sim: Sim, streamed: bool) -> None:
    prompt, ids = unbroken(sim, chat("resume me"))
    for k in resume_points(ids):
        body = {"prompt": prompt + ids[:k], "max_tokens": 2000, "return_token_ids": True}
        if streamed:
            chunks = stream(sim, "/v1/completions", body)
            rest = streamed_ids(chunks)
            assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt + ids[:k]
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        else:
            choice = post(sim, "/v1/completions", body).json()["choices"][0]
            rest = choice["token_ids"]
            assert choice["prompt_token_ids"] == prompt + ids[:k]
            assert choice["finish_reason"] == "stop"
        assert rest == ids[k:], f"resumed at {k}"


def test_a_resumed_truncated_answer_ends_where_the_unbroken_one_does(sim: Sim) -> None:
    prompt, ids = unbroken(sim, chat("cut me"), max_tokens=30)
    assert len(ids) == 30
    for k in (1, 12, 29):
        body = {"prompt": prompt + ids[:k], "max_tokens": 30 - k, "return_token_ids": True}
        reply = post(sim, "/v1/completions", body).json()
        assert reply["choices"][0]["token_ids"] == ids[k:]
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"] == {
            "prompt_tokens": len(prompt) + k,
            "completion_tokens": 30 - k,
            "total_tokens": len(prompt) + 30,
        }


def test_a_later_turn_and_thinking_off_resume_exactly(sim: Sim) -> None:
    first = expected_answer(chat("turn one"), None, sim.cfg).content
    history = [*chat("turn one"), {"role": "assistant", "content": first}, *chat("turn two")]
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    prompt, ids = unbroken(sim, history, **kwargs)
    assert KEY in prompt[: -len(ids)]  # turn one's "[key]" is one id in the history too
    reply = post(
        sim,
        "/v1/completions",
        {"prompt": prompt + ids[:3], "max_tokens": 999, "return_token_ids": True},
    )
    assert reply.json()["choices"][0]["token_ids"] == ids[3:]


def test_a_text_prompt_continues_like_its_ids(sim: Sim) -> None:
    prompt, ids = unbroken(sim, chat("as text"))
    text = decode_prompt(prompt + ids[:6])
    reply = post(
        sim, "/v1/completions", {"prompt": text, "max_tokens": 999, "return_token_ids": True}
    ).json()
    choice = reply["choices"][0]
    assert choice["prompt_token_ids"] == prompt + ids[:6]
    assert choice["token_ids"] == ids[6:]
    assert choice["text"] == decode(ids[6:-1], prompt_key(chat("as text")))  # raw text, no parser


def test_completions_honour_max_tokens_and_default_to_16(sim: Sim) -> None:
    prompt, ids = unbroken(sim, chat())
    reply = post(sim, "/v1/completions", {"prompt": prompt, "return_token_ids": True}).json()
    assert reply["choices"][0]["token_ids"] == ids[:16]
    assert reply["object"] == "text_completion" and reply["id"].startswith("cmpl-")


def test_a_foreign_prompt_gets_a_deterministic_answer(sim: Sim) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "return_token_ids": True}
    first, again = (post(sim, "/v1/completions", body).json() for _ in range(2))
    assert first["choices"][0]["token_ids"] == again["choices"][0]["token_ids"]
    assert len(first["choices"][0]["token_ids"]) == 8


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": [1, 2, 99999]}, "out of vocabulary"),
        ({"prompt": []}, "empty"),
        ({"prompt": ["a", "b"]}, "one prompt per request"),
    ],
)
def test_bad_completion_prompts_are_400s(sim: Sim, body: Body, message: str) -> None:
    response = post(sim, "/v1/completions", body)
    assert response.status_code == 400 and message in response.json()["error"]["message"]


# --- text-level continuation on the chat API ------------------------------------------------


def continued(sim: Sim, messages: list[Any], **extra: Any) -> httpx.Response:
    body = {
        "messages": messages,
        "continue_final_message": True,
        "add_generation_prompt": False,
        "return_token_ids": True,
        **extra,
    }
    return post(sim, "/v1/chat/completions", body)


def test_continue_final_message_continues_the_partial_content(sim: Sim) -> None:
    full = expected_answer(chat(), None, sim.cfg)
    partial = "".join(full.content_tokens[:5])
    reply = continued(sim, [*chat(), {"role": "assistant", "content": partial}]).json()
    message = reply["choices"][0]["message"]
    assert partial + message["content"] == full.content
    assert message.get("reasoning") is None
    assert reply["choices"][0]["token_ids"][-1] == IM_END


def test_continue_final_message_continues_a_partial_reasoning(sim: Sim) -> None:
    full = expected_answer(chat(), None, sim.cfg)
    partial = "<think>" + "".join(full.reasoning_tokens[:2])
    reply = continued(sim, [*chat(), {"role": "assistant", "content": partial}]).json()
    message = reply["choices"][0]["message"]
    assert "".join(full.reasoning_tokens[:2]) + message["reasoning"] == full.reasoning
    assert message["content"] == full.content


def test_continue_final_message_with_a_generation_prompt_is_a_400(sim: Sim) -> None:
    body = {
        "messages": [*chat(), {"role": "assistant", "content": "x"}],
        "continue_final_message": True,
    }
    response = post(sim, "/v1/chat/completions", body)
    assert response.status_code == 400
    assert "add_generation_prompt" in response.json()["error"]["message"]


# --- a server without the extension ---------------------------------------------------------


def test_no_token_ids_server_ignores_the_flag_and_refuses_id_prompts(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(token_ids=False)
    reply = post(sim, "/v1/chat/completions", {"messages": chat(), "return_token_ids": True}).json()
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
    legacy = expected_answer(chat(), None, SimConfig())
    assert reply["usage"]["completion_tokens"] == legacy.completion_tokens
    chunks = stream(sim, "/v1/chat/completions", {"messages": chat(), "return_token_ids": True})
    assert not streamed_ids(chunks) and "prompt_token_ids" not in chunks[0]
    refused = post(sim, "/v1/completions", {"prompt": encode_chat(chat())})
    assert refused.status_code == 400
    text = post(sim, "/v1/completions", {"prompt": "hello", "return_token_ids": True}).json()
    assert text["choices"][0]["text"] and "token_ids" not in text["choices"][0]


def partial_stream(sim: Sim, body: Body) -> list[int]:
    """Return the ids a stream delivered before the server dropped it."""
    ids: list[int] = []
    payload = {"model": MODEL, "stream": True, **body}
    url = f"{sim.url}/v1/chat/completions"
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", url, json=payload) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                ids += chunk["choices"][0].get("token_ids", [])
    return ids


def test_a_dropped_stream_resumes_exactly_on_another_server(start_sim: Callable[..., Sim]) -> None:
    broken, healthy = start_sim(p_disconnect=1.0), start_sim()
    body = {"messages": chat("drop me"), "return_token_ids": True}
    got = partial_stream(broken, body)
    prompt, ids = unbroken(healthy, chat("drop me"))
    assert 0 < len(got) < len(ids) and ids[: len(got)] == got
    resumed = post(
        healthy,
        "/v1/completions",
        {"prompt": prompt + got, "max_tokens": 2000, "return_token_ids": True},
    )
    assert got + resumed.json()["choices"][0]["token_ids"] == ids
