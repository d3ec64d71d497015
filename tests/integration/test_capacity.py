"""Cluster-wide caps, routing, health and drains: real Redis, simulators and worker processes.

Nothing here flushes Redis (the suite's, or EAGLEGEN_CAPACITY_REDIS_URL's, which may be shared
with ``make bench``): every test works under its own key prefix and queue and deletes them
afterwards.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from cli.enqueue_cmd import run_enqueue
from common.models import GenParams
from common.settings import Settings
from common.store import RunStore, connect
from tests.harness import delete_keys, free_port, wait_for
from tests.services import reachable_redis
from tests.stack import Stack
from worker.endpoints.capacity import Slot, SlotTable
from worker.endpoints.ratelimit import RateLimiter

FAST = ("--time-per-token", "0.01", "--max-answer-tokens", "40", "--reasoning-tokens", "0")


@pytest.fixture(scope="session")
def redis_url(redis_url: str, suite_env: dict[str, str]) -> str:
    named = suite_env.get("EAGLEGEN_CAPACITY_REDIS_URL")
    return reachable_redis(named) if named else redis_url


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    yield connect(redis_url)  # no flush (see the module docstring)


@pytest.fixture
def stack(stack: Stack, redis_url: str) -> Iterator[Stack]:
    prefix = f"captest-{uuid.uuid4().hex[:8]}"
    stack.env["EAGLEGEN_KEY_PREFIX"] = prefix
    stack.settings = Settings(redis_url=redis_url, run=stack.run_name, key_prefix=prefix)
    stack.store = RunStore(connect(redis_url), prefix, stack.run_name)
    yield stack
    stack.procs.stop_all()
    delete_keys(stack.store.r, prefix, stack.env["EAGLEGEN_QUEUE"])


def _prompts(tmp: Path, n: int, tag: str = "q") -> Path:
    path = tmp / f"{tag}-{n}.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{tag} question {i}"}) + "\n" for i in range(n)))
    return path


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/sim/stats", timeout=5).json()


def _enqueue(stack: Stack, source: Path, params: GenParams | None = None) -> None:
    """Enqueue in this process: a CLI start-up costs seconds on a busy machine."""
    env = {k.removeprefix("EAGLEGEN_").lower(): v for k, v in stack.env.items()}
    params = params or GenParams()
    run_enqueue(Settings(**env), stack.store, str(source), params, "auto", None, None, None)


def _wait_answered(stack: Stack, timeout: float = 60) -> None:
    """Every sample answered or failed (no collector needed)."""

    def answered() -> bool:
        counts = stack.store.counts()
        return counts.total > 0 and counts.done + counts.failed == counts.total

    wait_for(answered, timeout, lambda: f"every sample answered ({stack.store.counts()})")


def _table(stack: Stack, caps: dict[str, int], ttl: float = 30) -> SlotTable:
    return SlotTable(stack.store.r, stack.settings.key_prefix, caps, ttl)


# -- the Redis side, without processes -------------------------------------------------------


def test_each_slot_goes_to_the_endpoint_with_the_most_free_capacity(stack: Stack):
    table = _table(stack, {"http://a/v1": 2, "http://b/v1": 4})
    both = ["http://a/v1", "http://b/v1"]
    taken = [table.try_acquire(f"t{i}", both) for i in range(7)]
    assert taken[:2] == ["http://b/v1", "http://b/v1"]  # 4 free beats 2 free
    assert sorted(taken[2:6]) == ["http://a/v1"] * 2 + ["http://b/v1"] * 2
    assert taken[6] is None  # both full
    table.release(Slot("http://a/v1", f"t{taken.index('http://a/v1')}"))
    assert table.try_acquire("t7", both) == "http://a/v1"


def test_drained_ineligible_and_adaptively_capped_endpoints_are_respected(stack: Stack):
    table = _table(stack, {"http://a/v1": 8, "http://b/v1": 8})
    both = ["http://a/v1", "http://b/v1"]
    table.drain("http://a/v1")
    assert {table.try_acquire(f"t{i}", both) for i in range(4)} == {"http://b/v1"}
    assert table.try_acquire("x", ["http://a/v1"]) is None
    table.undrain("http://a/v1")
    table.set_cap("http://b/v1", 4, ttl_s=30)  # b holds 4 already: full under the stored cap
    assert {table.try_acquire(f"u{i}", both) for i in range(3)} == {"http://a/v1"}
    views = {v.endpoint: v for v in table.snapshot()}
    assert (views["http://b/v1"].cap, views["http://b/v1"].adaptive) == (4, True)
    assert (views["http://a/v1"].inflight, views["http://a/v1"].cap) == (3, 8)


def test_an_expired_slot_frees_itself_and_a_late_renewal_counts_it_again(stack: Stack):
    table = _table(stack, {"http://a/v1": 1}, ttl=0.3)
    assert table.try_acquire("dead", ["http://a/v1"]) == "http://a/v1"
    assert table.try_acquire("other", ["http://a/v1"]) is None
    wait_for(lambda: table.snapshot()[0].inflight == 0, 3, "the lease to expire")
    assert table.try_acquire("other", ["http://a/v1"]) == "http://a/v1"
    dead = Slot("http://a/v1", "dead")
    assert table.renew([dead]) == [dead]  # gone from Redis: the caller decides
    assert table.restore([dead]) == 1
    assert table.snapshot()[0].inflight == 2


class WouldWait(Exception):
    """Raised by a ``check`` to show that a limiter made its caller wait."""


def _refuse() -> None:
    raise WouldWait


def test_the_request_rate_is_paced_across_limiters_sharing_redis(stack: Stack):
    prefix = stack.settings.key_prefix
    one = RateLimiter(stack.store.r, prefix, rpm=600, tpm=None)
    two = RateLimiter(stack.store.r, prefix, rpm=600, tpm=None)
    one.wait_turn(_refuse)
    with pytest.raises(WouldWait):  # 100 ms apart, whichever process asks
        two.wait_turn(_refuse)


def test_tokens_are_reserved_up_front_and_the_unused_part_refunded(stack: Stack):
    tokens = RateLimiter(stack.store.r, stack.settings.key_prefix, rpm=None, tpm=60_000)
    assert tokens.reserve_tokens(60_000, _refuse) == 60_000  # one minute's budget at once
    with pytest.raises(WouldWait):
        tokens.reserve_tokens(1_000, _refuse)
    tokens.settle_tokens(60_000, 10_000)  # it used 10,000: 50,000 come back
    assert tokens.reserve_tokens(40_000, _refuse) == 40_000
    with pytest.raises(WouldWait):
        tokens.reserve_tokens(20_000, _refuse)
    # Never more than a minute's budget, however much is asked (a fresh limiter: this one's
    # budget would take most of a minute to come back).
    fresh = RateLimiter(stack.store.r, f"{stack.settings.key_prefix}-fresh", rpm=None, tpm=60_000)
    assert fresh.reserve_tokens(10**9, None) == 60_000


# -- real workers ----------------------------------------------------------------------------


def test_a_tokens_per_minute_limit_bounds_the_requests_in_flight(stack: Stack, tmp_path):
    # Each request reserves ~6 prompt tokens + max_tokens 100: 600/min lets 5 start at once,
    # where twelve threads want to (before reservations, all twelve went).
    url = stack.simulator("--time-per-token", "0.05", "--min-answer-tokens", "30",
                          "--max-answer-tokens", "30", "--reasoning-tokens", "0")  # fmt: skip
    stack.worker(concurrency=12, EAGLEGEN_TPM="600")
    _enqueue(stack, _prompts(tmp_path, 12), GenParams(max_tokens=100))
    _wait_answered(stack)
    assert _stats(url)["peak_running"] <= 6
    assert stack.store.counts().done == 12


def test_requests_waiting_for_a_slot_do_not_prepay_the_request_rate(stack: Stack, tmp_path):
    # Six requests wait 5 s for a drained endpoint. Had they paid EAGLEGEN_RPM while waiting
    # (one a second), all six would start together when it comes back; paid after the slot,
    # they start a second apart and no more than three of these 2.5 s answers overlap.
    url = stack.simulator("--time-per-token", "0.05", "--min-answer-tokens", "50",
                          "--max-answer-tokens", "50", "--reasoning-tokens", "0")  # fmt: skip
    endpoint = stack.env["EAGLEGEN_ENDPOINTS"]
    table = _table(stack, {endpoint: 64})
    table.drain(endpoint)
    stack.worker(concurrency=6, EAGLEGEN_RPM="60")
    _enqueue(stack, _prompts(tmp_path, 6))
    wait_for(lambda: stack.store.counts().in_flight == 6, 30, "six samples waiting")
    time.sleep(5)  # the outage: its length is the test, not a synchronisation
    table.undrain(endpoint)
    _wait_answered(stack)
    assert _stats(url)["peak_running"] <= 4


def test_two_workers_with_a_cap_never_run_more_than_it_on_the_endpoint(stack: Stack, tmp_path):
    url = stack.simulator("--max-num-seqs", "32", *FAST)
    stack.env["EAGLEGEN_MAX_INFLIGHT"] = "4"
    stack.worker(concurrency=8)
    stack.worker(concurrency=8)
    _enqueue(stack, _prompts(tmp_path, 60))
    _wait_answered(stack)
    stats = _stats(url)
    assert stats["peak_running"] == 4  # reached, never exceeded, with 16 threads wanting more
    assert (stats["completed"], stack.store.counts().done) == (60, 60)


def test_a_slot_held_by_a_killed_worker_frees_itself_within_its_lease(stack: Stack, tmp_path):
    stack.simulator("--time-per-token", "1", "--min-answer-tokens", "100")
    table = _table(stack, {stack.env["EAGLEGEN_ENDPOINTS"]: 3})
    worker = stack.worker(concurrency=3, EAGLEGEN_MAX_INFLIGHT="3", EAGLEGEN_SLOT_TTL="2")
    _enqueue(stack, _prompts(tmp_path, 3))
    wait_for(lambda: table.snapshot()[0].inflight == 3, 30, "three slots to be taken")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    killed = time.monotonic()
    wait_for(lambda: table.snapshot()[0].inflight == 0, 5, "the dead worker's slots to expire")
    assert time.monotonic() - killed < 2 + 1  # lease time, plus polling slack


def test_a_failing_endpoint_is_taken_out_probed_and_brought_back(stack: Stack, tmp_path):
    good = stack.simulator("--max-num-seqs", "16", *FAST)
    dead_port = free_port()  # nothing listens there yet
    dead = f"http://127.0.0.1:{dead_port}"
    stack.env["EAGLEGEN_ENDPOINTS"] = f"{dead}/v1,{good}/v1"
    stack.worker(concurrency=4, EAGLEGEN_ENDPOINT_FAILURES="2", EAGLEGEN_ENDPOINT_COOLDOWN="1")
    _enqueue(stack, _prompts(tmp_path, 20, "first"))
    _wait_answered(stack)
    assert _stats(good)["completed"] == 20 and stack.store.counts().failed == 0
    # Out after 2 failures (plus the few already on their way): not half of the 20 first tries.
    assert stack.store.counts().retries <= 2 + 3
    stack.procs.start("simulator", ["simulate", "--port", str(dead_port), *FAST], {})
    wait_for(lambda: _answers(dead), 30, "the dead endpoint to come up")
    _table(stack, {}).drain(f"{good}/v1")  # new work can only go where the probe brings back
    _enqueue(stack, _prompts(tmp_path, 10, "second"))
    _wait_answered(stack, timeout=30)
    assert _stats(dead)["completed"] == 10


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_drained_endpoint_gets_no_new_requests(stack: Stack, tmp_path):
    first = stack.simulator(*FAST)
    second = stack.simulator(*FAST)
    stack.env["EAGLEGEN_ENDPOINTS"] = f"{first}/v1,{second}/v1"
    drained = stack.procs.run(["endpoints", "drain", f"{first}/v1"], stack.env)
    assert drained.returncode == 0, drained.stderr
    stack.worker(concurrency=6)
    _enqueue(stack, _prompts(tmp_path, 30))
    _wait_answered(stack)
    assert (_stats(first)["requests"], _stats(second)["completed"]) == (0, 30)
    listing = stack.procs.run(["endpoints", "list", "--json"], stack.env)
    states = {v["endpoint"]: v["drained"] for v in json.loads(listing.stdout)}
    assert states == {f"{first}/v1": True, f"{second}/v1": False}


def test_the_adaptive_cap_settles_at_what_the_server_runs_plus_a_small_queue(
    stack: Stack, tmp_path
):
    url = stack.simulator("--max-num-seqs", "6", "--time-per-token", "0.05",
                          "--min-answer-tokens", "30", "--reasoning-tokens", "0")  # fmt: skip
    endpoint = stack.env["EAGLEGEN_ENDPOINTS"]
    stack.worker(concurrency=12, EAGLEGEN_ADAPTIVE="true", EAGLEGEN_ADAPTIVE_INTERVAL="0.3")
    _enqueue(stack, _prompts(tmp_path, 200))
    cap = _table(stack, {endpoint: 64}).cap_key(endpoint)
    wait_for(lambda: stack.store.r.get(cap) == "7", 30, "the cap to reach 6 running + 1 waiting")
    httpx.post(f"{url}/sim/config", json={"max_num_seqs": 3}, timeout=5).raise_for_status()
    wait_for(lambda: stack.store.r.get(cap) == "4", 30, "the cap to follow the capacity down")
