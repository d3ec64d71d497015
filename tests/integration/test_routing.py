"""Prefix-cache-aware routing: the Redis script, then real workers against simulators."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis

from cli.enqueue_cmd import run_enqueue
from common.models import GenParams
from common.settings import Settings
from tests.harness import free_port, wait_for
from tests.stack import Stack
from worker.endpoints.capacity import Slot, SlotTable
from worker.endpoints.routing import Choice, Load, choose

URLS = [f"http://{name}/v1" for name in "abcd"]
FAST = ("--time-per-token", "0.005", "--max-answer-tokens", "24", "--reasoning-tokens", "0")


# -- the script, against its reference -------------------------------------------------------


def test_the_routing_script_decides_as_the_reference_policy_on_random_states(rdb: redis.Redis):
    rng = random.Random(15)
    seen: Counter[str] = Counter()
    for case in range(300):
        table = SlotTable(rdb, f"route{case}", {url: rng.randint(1, 6) for url in URLS}, 60)
        loads = {url: _random_load(table, url, rng) for url in URLS}
        out = {url for url in URLS if rng.random() < 0.1}  # taken out here after failures
        loads = {
            url: Load(v.inflight, v.cap, v.eligible and url not in out) for url, v in loads.items()
        }
        ranking = rng.sample(URLS, len(URLS))
        wait, bound = rng.random() < 0.5, rng.choice([1.0, 1.25, 2.0])
        expected = choose(ranking, loads, bound, wait)
        got = table.try_route("new", ranking, [u for u in URLS if u not in out], bound, wait)
        assert got.endpoint == expected.endpoint, (case, loads, ranking, wait, bound)
        assert (got.waiting_for == ranking[0]) is expected.wait
        views = {view.endpoint: view.inflight for view in table.snapshot()}
        assert views == {url: loads[url].inflight + (url == got.endpoint) for url in URLS}
        seen[_kind(expected, ranking)] += 1
    assert set(seen) == {"first", "later", "wait", "none"}, seen


def _kind(choice: Choice, ranking: list[str]) -> str:
    if choice.wait or choice.endpoint is None:
        return "wait" if choice.wait else "none"
    return "first" if choice.endpoint == ranking[0] else "later"


def _random_load(table: SlotTable, url: str, rng: random.Random) -> Load:
    """Some slots taken on ``url``, under an adaptive cap or drained now and then."""
    cap = table.caps[url]
    if rng.random() < 0.3:
        cap = rng.randint(1, 6)
        table.set_cap(url, cap, ttl_s=60)
    taken = rng.randint(0, cap)
    for i in range(taken):
        table.try_acquire(f"{url}-{i}", [url])
    drained = rng.random() < 0.15
    if drained:
        table.drain(url)
    return Load(taken, cap, eligible=not drained)


def test_routing_never_takes_more_than_a_cap_or_a_drained_endpoint(rdb: redis.Redis):
    table = SlotTable(rdb, "routecap", {URLS[0]: 2, URLS[1]: 3}, ttl_s=60)
    table.drain(URLS[1])
    got = [table.try_route(f"t{i}", URLS[:2], URLS[:2], 1.25, False).endpoint for i in range(4)]
    assert got == [URLS[0], URLS[0], None, None]


# -- real workers ------------------------------------------------------------------------------


def _conversations(tmp: Path, n: int, turns: int, tag: str = "c") -> Path:
    path = tmp / f"{tag}-{n}x{turns}.jsonl"
    rows = [
        {"turns": [f"{tag} {i} turn {t}: tell me more" for t in range(turns)]} for i in range(n)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _enqueue(stack: Stack, source: Path) -> None:
    env = {k.removeprefix("EAGLEGEN_").lower(): v for k, v in stack.env.items()}
    run_enqueue(Settings(**env), stack.store, str(source), GenParams(), "auto", None, None, None)


def _simulators(stack: Stack, n: int, *options: str) -> list[str]:
    urls = [stack.simulator(*FAST, *options) for _ in range(n)]
    stack.env["EAGLEGEN_ENDPOINTS"] = ",".join(f"{url}/v1" for url in urls)
    return urls


def _turn_endpoints(stack: Stack) -> list[list[str]]:
    return [[t["endpoint"] for t in r["generation"]["turns"]] for r in stack.lines()]


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/sim/stats", timeout=5).json()


def test_later_turns_land_where_the_first_turn_ran_and_hit_its_cache(stack: Stack, tmp_path):
    urls = _simulators(stack, 3)
    stack.worker(concurrency=6)
    stack.collector()
    _enqueue(stack, _conversations(tmp_path, 30, turns=3))
    stack.wait_complete()
    routes = _turn_endpoints(stack)
    assert len(routes) == 30 and all(len(set(route)) == 1 for route in routes), routes
    assert {route[0] for route in routes} == {f"{url}/v1" for url in urls}  # first turns spread
    assert all(_stats(url)["prefix_cache_hits"] > 0 for url in urls)


@pytest.mark.parametrize("routing", ["cache", "least-loaded"])
def test_on_full_servers_cache_routing_keeps_conversations_together_and_least_loaded_does_not(
    stack: Stack, tmp_path, routing
):
    # Twice the threads of the slots: every freed slot has takers.
    _simulators(stack, 2, "--time-per-token", "0.02")
    stack.worker(concurrency=8, EAGLEGEN_ROUTING=routing, EAGLEGEN_MAX_INFLIGHT="2")
    stack.collector()
    _enqueue(stack, _conversations(tmp_path, 16, turns=3))
    stack.wait_complete()
    scattered = sum(len(set(route)) > 1 for route in _turn_endpoints(stack))
    assert scattered <= 2 if routing == "cache" else scattered >= 4


def _one_slow_conversation(stack: Stack, tmp_path: Path, **worker_env: str) -> tuple[str, str]:
    """Two servers (cap 2), one two-turn conversation; returns (its first turn's server, the
    other) while its first turn runs."""
    _simulators(stack, 2, "--time-per-token", "0.1")
    stack.worker(concurrency=2, EAGLEGEN_MAX_INFLIGHT="2", **worker_env)
    stack.collector()
    _enqueue(stack, _conversations(tmp_path, 1, turns=2))
    wait_for(lambda: sum(_inflight(stack).values()) == 1, 30, "the first turn to start")
    first = next(url for url, n in _inflight(stack).items() if n)
    return first, next(url for url in _inflight(stack) if url != first)


def _table(stack: Stack) -> SlotTable:
    caps = dict.fromkeys(stack.env["EAGLEGEN_ENDPOINTS"].split(","), 2)
    return SlotTable(stack.store.r, stack.settings.key_prefix, caps, 60)


def _inflight(stack: Stack) -> dict[str, int]:
    return {view.endpoint: view.inflight for view in _table(stack).snapshot()}


def test_a_full_previous_server_is_waited_for_then_the_turn_goes_elsewhere(stack: Stack, tmp_path):
    first, other = _one_slow_conversation(stack, tmp_path, EAGLEGEN_AFFINITY_WAIT="3")
    table = _table(stack)
    # Others fill its server (put in beyond the cap: they stay when the first turn ends) and
    # take a slot on the other one: 3 of 4 slots busy, a cluster worth waiting on.
    table.restore([Slot(first, "squatter-1"), Slot(first, "squatter-2")])
    table.try_acquire("busy", [other])
    wait_for(lambda: _inflight(stack)[first] == 2, 30, "the first turn to end")
    ended = time.monotonic()
    wait_for(lambda: _inflight(stack)[other] == 2, 30, "the second turn to start")
    assert time.monotonic() - ended >= 3 - 0.3  # it waited out EAGLEGEN_AFFINITY_WAIT
    stack.wait_complete(timeout=60)
    assert _turn_endpoints(stack) == [[first, other]]


def test_a_drained_previous_server_is_not_waited_for(stack: Stack, tmp_path):
    first, other = _one_slow_conversation(stack, tmp_path, EAGLEGEN_AFFINITY_WAIT="60")
    _table(stack).drain(first)
    wait_for(lambda: _inflight(stack)[first] == 0, 30, "the first turn to end")
    stack.wait_complete(timeout=30)  # well within the minute it would wait for a full one
    assert _turn_endpoints(stack) == [[first, other]]


def test_a_turn_waiting_for_its_server_leaves_as_soon_as_that_server_is_drained(
    stack: Stack, tmp_path
):
    first, other = _one_slow_conversation(stack, tmp_path, EAGLEGEN_AFFINITY_WAIT="60")
    table = _table(stack)
    table.restore([Slot(first, "squatter-1"), Slot(first, "squatter-2")])
    table.try_acquire("busy", [other])
    wait_for(lambda: _inflight(stack)[first] == 2, 30, "the first turn to end")
    assert stack.store.counts().in_flight == 1  # its second turn waits for the full server
    drained = time.monotonic()
    table.drain(first)
    wait_for(lambda: _inflight(stack)[other] == 2, 30, "the second turn to start elsewhere")
    assert time.monotonic() - drained < 5  # not the minute it would wait for a full one
    stack.wait_complete(timeout=60)
    assert _turn_endpoints(stack) == [[first, other]]


def test_caps_hold_under_cache_routing_with_two_workers(stack: Stack, tmp_path):
    urls = _simulators(stack, 3, "--time-per-token", "0.02")
    stack.env["EAGLEGEN_MAX_INFLIGHT"] = "2"
    stack.worker(concurrency=6)
    stack.worker(concurrency=6)
    stack.collector()
    _enqueue(stack, _conversations(tmp_path, 24, turns=3))
    stack.wait_complete(timeout=120)
    assert all(_stats(url)["peak_running"] <= 2 for url in urls)
    assert sum(_stats(url)["completed"] for url in urls) == 72
    sticky = sum(len(set(route)) == 1 for route in _turn_endpoints(stack))
    assert sticky >= 24 * 0.75  # full servers: some turns waited, a few went elsewhere


def test_status_and_prometheus_show_each_servers_cache_hit_rate(stack: Stack, tmp_path):
    urls = _simulators(stack, 2)
    port = free_port()
    stack.worker(concurrency=4, EAGLEGEN_METRICS_PORT=str(port))
    stack.collector()
    _enqueue(stack, _conversations(tmp_path, 8, turns=3))
    stack.wait_complete()
    expected = {f"{url}/v1": _stats(url) for url in urls}
    done = stack.procs.run(["status", "--json"], stack.env)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)["endpoints"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for endpoint, stats in expected.items():
        rate = stats["prefix_cache_hits"] / stats["prefix_cache_queries"]
        assert 0 < rate < 1
        assert status[endpoint]["prefix_cache"] == {
            "queries": stats["prefix_cache_queries"], "hits": stats["prefix_cache_hits"],
            "hit_rate": round(rate, 4),
        }  # fmt: skip
        line = f'eaglegen_endpoint_prefix_cache_hit_rate{{endpoint="{endpoint}"}} {rate}'
        assert line in metrics
    view = stack.procs.run(["status"], {**stack.env, "COLUMNS": "200"}).stdout
    assert "cache hits" in view and f"{rate:.1%}" in view
