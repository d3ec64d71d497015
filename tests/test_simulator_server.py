"""Tests of the simulator HTTP server: a real uvicorn on an ephemeral port, real clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from simulator.admission import Slots
from simulator.answers import expected_answer, prompt_key
from simulator.config import SimConfig
from simulator.jobs import answer_pieces, batch_pieces
from simulator.server import SimServer, create_server

MODEL = "eaglegen-sim"


def chat(text: str = "What is 2+2?") -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll `predicate` until it holds, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.01)


@dataclass
class Sim:
    """A simulator running in a background thread."""

    cfg: SimConfig
    url: str
    server: SimServer
    thread: threading.Thread
    clients: list[openai.OpenAI] = field(default_factory=list)

    def client(self, **kwargs: Any) -> openai.OpenAI:
        """An OpenAI client of this simulator, closed when the simulator stops."""
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="x", max_retries=0, **kwargs)
        self.clients.append(client)
        return client

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/sim/stats").json()  # type: ignore[no-any-return]

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"metric {name} not exposed")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "simulator did not shut down"


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def start_sim() -> Iterator[Callable[..., Sim]]:
    """Start simulators with SimConfig overrides; all are stopped after the test."""
    sims: list[Sim] = []

    def start(**overrides: Any) -> Sim:
        cfg = SimConfig(**overrides)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = create_server(cfg)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        sim = Sim(cfg, f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread)
        sims.append(sim)
        wait_until(lambda: _healthy(sim.url))
        return sim

    yield start
    for sim in sims:
        if sim.thread.is_alive():
            sim.stop()
        for client in sim.clients:
            client.close()


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    """A simulator with the default configuration."""
    return start_sim()


def reasoning_of(delta: Any) -> str:
    return getattr(delta, "reasoning", None) or ""


# --- basic endpoints --------------------------------------------------------------------------


def test_health_and_models_list_the_configured_model(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(model_name="m1")
    assert [m.id for m in sim.client().models.list()] == ["m1"]
    assert httpx.get(f"{sim.url}/v1/models").json()["data"][0]["owned_by"] == "eaglegen-simulator"


def test_streaming_sends_role_reasoning_content_finish_and_usage(sim: Sim) -> None:
    expected = expected_answer(chat(), None, sim.cfg)
    stream = sim.client().chat.completions.create(
        model=MODEL, messages=chat(), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(reasoning_of(d) for d in deltas) == expected.reasoning
    assert "".join(d.content or "" for d in deltas) == expected.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == expected.completion_tokens


def test_fast_chunk_tokens_1_streams_one_token_a_chunk_like_vllm(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(fast_chunk_tokens=1, reasoning_tokens=0)
    expected = expected_answer(chat(), None, sim.cfg)
    stream = sim.client().chat.completions.create(model=MODEL, messages=chat(), stream=True)
    texts = [c.choices[0].delta.content for c in stream if c.choices]
    tokens = [t for t in texts if t]  # without the role chunk and the finish chunk
    assert len(tokens) == expected.completion_tokens and "".join(tokens) == expected.content


def test_reasoning_never_shares_a_chunk_with_content(sim: Sim) -> None:
    stream = sim.client().chat.completions.create(model=MODEL, messages=chat(), stream=True)
    deltas = [c.choices[0].delta for c in stream]
    assert not any(reasoning_of(d) and d.content for d in deltas)


def test_non_streaming_returns_the_expected_answer_with_usage(sim: Sim) -> None:
    expected = expected_answer(chat(), None, sim.cfg)
    reply = sim.client().chat.completions.create(model=MODEL, messages=chat())
    message = reply.choices[0].message
    assert message.content == expected.content
    assert reasoning_of(message) == expected.reasoning
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens == 4 + 3


def test_every_answer_carries_the_prompt_key_header(sim: Sim) -> None:
    body = {"model": MODEL, "messages": chat()}
    response = httpx.post(f"{sim.url}/v1/chat/completions", json=body)
    assert response.headers["x-sim-key"] == prompt_key(chat())


def test_reasoning_content_field_is_used_when_configured(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(reasoning_field="reasoning_content")
    reply = sim.client().chat.completions.create(model=MODEL, messages=chat())
    extra = reply.choices[0].message.model_extra or {}
    assert extra["reasoning_content"] == expected_answer(chat(), None, sim.cfg).reasoning
    assert "reasoning" not in extra


def test_inline_reasoning_streams_think_tags_in_the_content(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(reasoning_field="inline")
    expected = expected_answer(chat(), None, sim.cfg)
    stream = sim.client().chat.completions.create(model=MODEL, messages=chat(), stream=True)
    content = "".join(c.choices[0].delta.content or "" for c in stream)
    assert content == f"<think>{expected.reasoning}</think>{expected.content}"


def test_thinking_disabled_sends_no_reasoning(sim: Sim) -> None:
    reply = sim.client().chat.completions.create(
        model=MODEL,
        messages=chat(),
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reasoning_of(reply.choices[0].message) == ""
    assert reply.choices[0].message.content == expected_answer(chat(), None, sim.cfg).content


def test_max_tokens_cuts_the_stream_with_finish_reason_length(sim: Sim) -> None:
    stream = sim.client().chat.completions.create(
        model=MODEL, messages=chat(), max_tokens=40, stream=True
    )
    finishes = [c.choices[0].finish_reason for c in stream if c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert sim.stats()["tokens_generated"] == 40


# --- request errors ---------------------------------------------------------------------------


def test_an_over_long_prompt_is_a_bad_request_and_not_a_generation(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(max_model_len=50)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 50 tokens"):
        sim.client().chat.completions.create(model=MODEL, messages=chat("word " * 60))
    with pytest.raises(openai.BadRequestError):
        sim.client().chat.completions.create(model=MODEL, messages=chat(), max_tokens=45)
    stats = sim.stats()
    assert stats["completed"] == stats["aborted"] == stats["tokens_generated"] == 0


def test_an_unknown_model_is_not_found(sim: Sim) -> None:
    with pytest.raises(openai.NotFoundError):
        sim.client().chat.completions.create(model="gpt-9", messages=chat())


@pytest.mark.parametrize(
    "body",
    [b"not json", b"{}", b'{"messages": []}', b'{"messages": [{"content": "no role"}]}'],
)
def test_an_invalid_body_is_a_400_json_error(sim: Sim, body: bytes) -> None:
    response = httpx.post(f"{sim.url}/v1/chat/completions", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == 400


# --- faults -----------------------------------------------------------------------------------


def test_fail_first_fails_the_first_attempt_then_succeeds(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(fail_first=1)
    client = sim.client()
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=chat())
    assert client.chat.completions.create(model=MODEL, messages=chat()).choices[0].message.content
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=chat("another prompt"))


def test_p_429_gives_a_rate_limit_error_with_retry_after(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(p_429=1.0)
    with pytest.raises(openai.RateLimitError) as caught:
        sim.client().chat.completions.create(model=MODEL, messages=chat())
    assert caught.value.response.headers["retry-after"] == "1"
    assert sim.stats()["faults"] == {"http_429": 1}


def test_a_disconnect_fault_breaks_the_stream_and_frees_the_slot(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(p_disconnect=1.0)
    received: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in sim.client().chat.completions.create(
            model=MODEL, messages=chat(), stream=True
        ):
            received.append(chunk.choices[0].delta.content or reasoning_of(chunk.choices[0].delta))
    assert "".join(received)  # some tokens arrived before the drop
    wait_until(lambda: sim.stats()["running"] == 0)
    assert sim.stats()["aborted"] == 1


def test_a_disconnect_fault_also_breaks_a_non_streaming_request(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(p_disconnect=1.0)
    with pytest.raises(openai.APIConnectionError):
        sim.client().chat.completions.create(model=MODEL, messages=chat())


def test_a_stall_times_out_the_client_and_frees_the_slot(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(p_stall=1.0)
    with pytest.raises(openai.APITimeoutError):
        list(
            sim.client(timeout=0.3).chat.completions.create(
                model=MODEL, messages=chat(), stream=True
            )
        )
    wait_until(lambda: sim.stats()["running"] == 0)
    assert sim.stats()["faults"] == {"stall": 1}


def test_a_stalled_generation_does_not_block_shutdown(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(p_stall=1.0)
    client = sim.client(timeout=30)
    worker = threading.Thread(target=_swallow, args=(client,), daemon=True)
    worker.start()
    wait_until(lambda: sim.stats()["running"] == 1)
    started = time.monotonic()
    sim.stop()
    assert time.monotonic() - started < 3


def _swallow(client: openai.OpenAI) -> None:
    with contextlib.suppress(openai.APIError):
        list(client.chat.completions.create(model=MODEL, messages=chat(), stream=True))


def test_a_client_leaving_mid_stream_frees_its_slot(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(time_per_token=0.01)
    body = {"model": MODEL, "messages": chat(), "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()  # keep it: dropping the iterator closes the response
        next(lines)
        assert sim.stats()["running"] == 1
    wait_until(lambda: sim.stats()["running"] == 0)
    assert sim.stats()["aborted"] == 1


# --- capacity ---------------------------------------------------------------------------------


def _slow_calls(sim: Sim, n: int) -> list[str]:
    """Run n concurrent requests; return their contents."""
    client = sim.client()

    def call(i: int) -> str:
        reply = client.chat.completions.create(model=MODEL, messages=chat(f"q{i}"))
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(call, range(n)))


def test_requests_beyond_max_num_seqs_wait_their_turn(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(
        max_num_seqs=2,
        time_per_token=0.03,  # long enough that the third request waits, even on a busy machine
        min_answer_tokens=20,
        max_answer_tokens=20,
        reasoning_tokens=0,
    )
    most_waiting = 0.0
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(_slow_calls, sim, 6)
        while not done.done():
            most_waiting = max(most_waiting, sim.metric("vllm:num_requests_waiting"))
        assert all(content.startswith("[") for content in done.result())
    assert most_waiting > 0
    stats = sim.stats()
    assert stats["peak_running"] == 2 and stats["completed"] == 6
    assert sim.metric("vllm:request_success_total") == 6


def test_sim_config_raises_capacity_at_runtime(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim(max_num_seqs=1, time_per_token=0.01, min_answer_tokens=20, reasoning_tokens=0)
    response = httpx.post(f"{sim.url}/sim/config", json={"max_num_seqs": 3})
    assert response.json()["max_num_seqs"] == 3
    _slow_calls(sim, 3)
    assert sim.stats()["peak_running"] == 3


def test_shrinking_capacity_lets_running_requests_finish(start_sim: Callable[..., Sim]) -> None:
    # Answers of 40 tokens at 50 ms: both are still running when a loaded machine looks.
    sim = start_sim(
        max_num_seqs=2, time_per_token=0.05, min_answer_tokens=40, max_answer_tokens=40,
        reasoning_tokens=0,
    )  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(_slow_calls, sim, 2)
        wait_until(lambda: sim.stats()["running"] == 2, timeout=15.0)
        httpx.post(f"{sim.url}/sim/config", json={"max_num_seqs": 1})
        assert len(done.result()) == 2
    assert sim.stats()["completed"] == 2 and sim.stats()["max_num_seqs"] == 1


def test_sim_config_rejects_unknown_fields(sim: Sim) -> None:
    response = httpx.post(f"{sim.url}/sim/config", json={"max_num_seqs": 0})
    assert response.status_code == 400
    assert httpx.post(f"{sim.url}/sim/config", json={"seed": 3}).status_code == 400


# --- log and metrics --------------------------------------------------------------------------


def test_the_log_gets_one_line_per_generation_end(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    log = tmp_path / "sim.jsonl"
    sim = start_sim(log_path=log, time_per_token=0.005)
    sim.client().chat.completions.create(model=MODEL, messages=chat("one"), max_tokens=3)
    body = {"model": MODEL, "messages": chat("two"), "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        next(lines)
    wait_until(lambda: len(log.read_text().splitlines()) == 2)
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first["key"] == prompt_key(chat("one"))
    assert (first["event"], first["completion_tokens"], first["finish_reason"]) == (
        "completed",
        3,
        "length",
    )
    assert (second["key"], second["event"]) == (prompt_key(chat("two")), "aborted")
    assert second["finish_reason"] is None


def test_metrics_count_prompt_and_generated_tokens(sim: Sim) -> None:
    sim.client().chat.completions.create(model=MODEL, messages=chat(), max_tokens=10)
    assert sim.metric("vllm:prompt_tokens_total") == 4 + 3
    assert sim.metric("vllm:generation_tokens_total") == 10
    assert sim.metric("vllm:kv_cache_usage_perc") == 0
    assert sim.stats()["generations_by_key"] == {prompt_key(chat()): 1}


# --- pure pieces of the server ----------------------------------------------------------------


def test_fast_batches_hold_at_most_16_tokens_of_a_single_kind() -> None:
    pieces = answer_pieces(expected_answer(chat(), None, SimConfig()), "reasoning")
    batches = batch_pieces(pieces, 16)
    assert [p for b in batches for p in b] == pieces
    assert all(len(b) <= 16 and len({kind for kind, _ in b}) == 1 for b in batches)


def test_slots_admit_waiters_in_fifo_order() -> None:
    async def scenario() -> list[int]:
        slots, order = Slots(1), []
        await slots.acquire()

        async def waiter(i: int) -> None:
            await slots.acquire()
            order.append(i)
            slots.release()

        tasks = [asyncio.create_task(waiter(i)) for i in range(4)]
        await asyncio.sleep(0)
        assert slots.waiting == 4
        slots.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_slots_shrink_without_evicting_and_admit_below_the_new_cap() -> None:
    async def scenario() -> None:
        slots = Slots(2)
        await slots.acquire()
        await slots.acquire()
        slots.resize(1)
        waiter = asyncio.create_task(slots.acquire())
        slots.release()
        await asyncio.sleep(0)
        assert not waiter.done() and slots.running == 1  # still at the new cap
        slots.release()
        await waiter
        assert slots.running == 1 and slots.peak == 2

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_up_its_place() -> None:
    async def scenario() -> None:
        slots = Slots(1)
        await slots.acquire()
        waiter = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert slots.waiting == 0
        slots.release()
        assert slots.running == 0

    asyncio.run(scenario())
