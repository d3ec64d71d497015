"""The client against tests/hostile.py's loopback server, in process: each request ends by its
deadline however the server trickles, error bodies are read a few KB, a held-open body keeps
its turn, a slow /metrics costs status its timeout and no more."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from common import errors
from common.models import GenParams
from common.settings import Settings
from tests.hostile import HostileServer
from worker.chat.client import ChatClient
from worker.endpoints.server_cache import read_prefix_caches

ASK = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    hostile = HostileServer()
    yield hostile
    hostile.close()


def client(server: HostileServer, case: str, **settings: object) -> ChatClient:
    url = server.endpoint(case)
    return ChatClient(url, Settings(endpoints=[url], model="m", **settings))


def timed(call) -> tuple[float, object]:
    started = time.monotonic()
    try:
        return time.monotonic() - started, call()
    except errors.EagleGenError as exc:
        return time.monotonic() - started, exc


def test_a_head_trickled_a_byte_at_a_time_ends_at_the_request_deadline(server):
    chat = client(server, "trickle-head", max_request_time=2)
    seconds, found = timed(lambda: chat.complete(ASK, GenParams()))
    assert isinstance(found, errors.TimeoutError_) and 1.9 < seconds < 4


def test_a_trickled_models_list_ends_at_the_probe_timeout(server):
    chat = client(server, "trickle-models", probe_timeout=1)
    seconds, found = timed(chat.probe)
    assert isinstance(found, errors.TimeoutError_) and seconds < 3


@pytest.mark.parametrize("case", ["trickle-500", "huge-500"])
def test_an_error_body_gives_its_first_kilobytes_within_the_probe_timeout(server, case):
    chat = client(server, case, probe_timeout=1)
    seconds, found = timed(lambda: chat.complete(ASK, GenParams()))
    assert isinstance(found, errors.ServerError) and seconds < 3
    assert len(str(found)) < 1100


def test_a_body_held_open_after_done_keeps_the_turn_after_the_drain_limit(server):
    chat = client(server, "open-after-done", drain_timeout=0.5)
    seconds, found = timed(lambda: chat.complete(ASK, GenParams()))
    assert not isinstance(found, Exception), found
    assert found.content == "Hello big world" and seconds < 3  # type: ignore[attr-defined]


def test_the_check_runs_while_the_head_is_awaited(server):
    chat = client(server, "silent", max_request_time=30)
    asked = []

    def check() -> None:
        asked.append(1)
        if len(asked) >= 2:
            raise errors.LeaseLost("taken over")

    seconds, found = timed(lambda: chat.complete(ASK, GenParams(), check))
    assert isinstance(found, errors.LeaseLost) and seconds < 5


def test_one_trickled_metrics_costs_status_its_timeout(server):
    urls = [server.endpoint("trickle-metrics"), server.endpoint("ok")]
    started = time.monotonic()
    found = read_prefix_caches(urls, timeout=1.0)
    assert time.monotonic() - started < 2.5
    assert found[urls[0]] is None and found[urls[1]] is not None
