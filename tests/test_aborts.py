"""Aborting a request on its server: the simulator's abort route, support learned and kept in
Redis, the ids vLLM knows a request by, what an abort saves (real HTTP on loopback), and which
broken streams a worker aborts itself (in-memory fakes)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from common import errors
from common.models import Checkpoint
from common.request_store import RequestRef
from common.settings import Settings
from common.store import RunStore
from tests.fakes import FakeStore, sample
from tests.test_simulator_server import Sim, sim, start_sim
from worker.pipeline.aborts import (
    Aborter,
    AbortSupport,
    TurnRequests,
    abort_ids,
    abort_url,
    saved_tokens,
)

__all__ = ["sim", "start_sim"]


def _stream(url: str, request_id: str, seen: list[str]) -> threading.Thread:
    """A slow chat stream named ``request_id``, read in a thread; ``seen`` gets its lines."""

    def read() -> None:
        body = {
            "messages": [{"role": "user", "content": "abort me"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30,
                              headers={"X-Request-Id": request_id}) as response:  # fmt: skip
                seen.extend(response.iter_lines())
        except httpx.RemoteProtocolError:
            seen.append("cut")

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _ref(sim: Sim, server_id: str, **more: Any) -> RequestRef:
    return RequestRef(endpoint=f"{sim.url}/v1", server_id=server_id, token="t", **more)


def test_the_simulator_stops_the_named_generation_and_ends_its_stream_as_vllm_does(
    start_sim: Callable[..., Sim], rdb: Any, tmp_path: Path
) -> None:
    log = tmp_path / "sim.jsonl"
    sim = start_sim(time_per_token=0.05, min_answer_tokens=200, max_answer_tokens=200,
                    log_path=log)  # fmt: skip
    kept, stopped = [], []
    threads = [_stream(sim.url, "keep", kept), _stream(sim.url, "stop", stopped)]
    stats = f"{sim.url}/sim/stats"
    while httpx.get(stats).json()["tokens_generated"] < 4:
        pass  # both are generating (each polls a few ms: the server paces at 50 ms a token)
    aborter = Aborter(rdb, Settings())
    store = RunStore(rdb, "eaglegen", "unit")
    assert aborter.orphan(store, _ref(sim, "chatcmpl-stop", max_tokens=500), None, "test")
    for thread in threads:
        thread.join(30)
    assert "data: [DONE]" in kept
    # vLLM's end of an aborted stream: a last chunk "abort" without tokens, usage, [DONE].
    *_, last, usage, done = [line for line in stopped if line]
    [choice] = json.loads(last.removeprefix("data: "))["choices"]
    assert (choice["finish_reason"], choice["delta"], choice["token_ids"]) == ("abort", {}, [])
    sent = sum(len(json.loads(x[6:])["choices"][0].get("token_ids", [])) for x in stopped
               if x.startswith("data: {") and json.loads(x[6:])["choices"])  # fmt: skip
    assert 0 < json.loads(usage.removeprefix("data: "))["usage"]["completion_tokens"] == sent
    assert done == "data: [DONE]"
    found = httpx.get(stats).json()
    assert found["aborted_by_request"] == 1 and found["completed"] == 1
    assert rdb.hmget(store.keys.counters, ["aborted", "abort_saved_tokens"]) == ["1", "500"]
    assert AbortSupport.shown(rdb, "eaglegen") == {f"{sim.url}/v1": "on"}
    # The log tells an end by abort request from a client gone (make chaos counts them).
    ends = [json.loads(line) for line in log.read_text().splitlines()]
    pairs = {(e["event"], e["abort_requested"]) for e in ends}
    assert pairs == {("aborted", True), ("completed", False)}


def test_a_server_that_refuses_is_learned_once_and_not_asked_again(
    start_sim: Callable[..., Sim], rdb: Any
) -> None:
    sim = start_sim(abort_requests=False)
    aborter = Aborter(rdb, Settings())
    assert aborter.probe(f"{sim.url}/v1") is False
    hint = "abort off: start vLLM with --enable-scale-out (HTTP 403)"
    assert AbortSupport.shown(rdb, "eaglegen") == {f"{sim.url}/v1": hint}
    another = Aborter(rdb, Settings())  # another process: it reads what was learned
    assert another.probe(f"{sim.url}/v1") is False
    assert not another.abort(_ref(sim, "chatcmpl-x"), "test")


def test_a_server_that_answers_is_learned_on(start_sim: Callable[..., Sim], rdb: Any) -> None:
    sim = start_sim()
    assert Aborter(rdb, Settings()).probe(f"{sim.url}/v1") is True


@pytest.mark.parametrize(
    ("server_id", "ids"),
    [("chatcmpl-eaglegen-1", ["chatcmpl-eaglegen-1"]),
     ("cmpl-eaglegen-1", ["cmpl-eaglegen-1", "cmpl-eaglegen-1-0"])],
)  # fmt: skip
def test_a_completion_is_aborted_by_the_id_vllm_gives_its_one_prompt_too(
    server_id: str, ids: list[str]
) -> None:
    assert abort_ids(server_id) == ids


def test_the_abort_route_sits_beside_the_openai_base() -> None:
    assert abort_url("http://h:8000/v1") == "http://h:8000/inference/v1/abort_requests"
    assert abort_url("https://h/x/v1/") == "https://h/x/inference/v1/abort_requests"


def test_an_abort_saves_at_most_what_the_request_had_left_past_its_checkpoint() -> None:
    ref = RequestRef(endpoint="e", server_id="i", token="t", max_tokens=1000, base=200)
    ckpt = Checkpoint(turn=0, endpoint="e", model="m", tokens=500)
    assert saved_tokens(ref, ckpt) == 700  # 300 of its 1,000 were generated
    assert saved_tokens(ref, None) == 1000
    assert saved_tokens(ref, ckpt.model_copy(update={"endpoint": "other"})) == 1000


class Orphans:
    """An aborter that records what it is asked to abort."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def orphan(self, store: Any, ref: RequestRef, checkpoint: Any, why: str) -> bool:
        self.asked.append((ref.server_id, why))
        return True


def _turn_requests() -> tuple[TurnRequests, FakeStore, Orphans]:
    store = FakeStore()
    store.add(sample("a"))
    store.leases["a"] = "tok"
    orphans = Orphans()
    requests = TurnRequests(store, "a", "tok", orphans, None, 1000)  # type: ignore[arg-type]
    requests.started("http://e/v1", "chatcmpl-1")
    return requests, store, orphans


def test_a_stream_this_side_lets_go_is_aborted_once() -> None:
    requests, store, orphans = _turn_requests()
    assert store.requests["a"].server_id == "chatcmpl-1"  # kept beside the lease
    requests.gave_up(errors.StallError("stalled"))
    requests.gave_up(errors.StallError("stalled again"))
    assert orphans.asked == [("chatcmpl-1", "stall")] and "a" not in store.requests


def test_a_stream_the_server_ended_or_someone_else_aborted_is_left_alone() -> None:
    requests, store, orphans = _turn_requests()
    requests.gave_up(errors.Disconnected("the server closed it"))
    requests.gave_up(errors.ServerError("an error in the stream"))
    assert orphans.asked == [] and "a" in store.requests
    store.pop_requests(["a"])  # the worker that took the lease over aborted it
    requests.gave_up(errors.LeaseLost("taken"))
    assert orphans.asked == []


def test_a_stream_ended_unfinished_by_the_reaper_s_abort_is_handed_back_with_its_checkpoint():
    requests, store, orphans = _turn_requests()
    store.pop_requests(["a"])  # the reconciler reaped the paused worker's lease, aborted it
    ended = errors.Unfinished("stream ended with finish_reason 'abort'")
    ended.checkpoint = Checkpoint(turn=0, endpoint="e", model="m", tokens=81)
    handed = requests.gave_up(ended)
    assert isinstance(handed, errors.HandedBack) and handed.checkpoint == ended.checkpoint
    assert orphans.asked == []


def test_a_stream_the_server_ended_unfinished_by_itself_stays_a_broken_stream():
    requests, store, orphans = _turn_requests()
    ended = errors.Unfinished("stream ended with finish_reason 'abort'")
    assert requests.gave_up(ended) is ended  # a retry, counted: the server's own doing
    assert "a" not in store.requests and orphans.asked == []  # nothing left to abort
