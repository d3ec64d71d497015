"""The reconciler's cost does not grow with the queue, and its passes never overlap: real Redis.

Messages are real kombu messages put on the test's queue by ``broker.publish``; delivered ones
are staged in kombu's ``unacked`` hash as a dead worker would leave them.
"""

from __future__ import annotations

import json
import threading
import time

from broker.app import create_broker_app
from broker.layout import UNACKED, UNACKED_INDEX
from broker.publish import publish
from broker.scan import PAGE, queued_refs
from common.models import GenParams, Sample, SourceRef
from common.settings import Settings
from tests.harness import wait_for
from tests.stack import Stack
from worker.pipeline.reconcile import Reconciler, ReconcilerLoop

LIMIT = 50


def _settings(stack: Stack, **extra: object) -> Settings:
    return Settings(
        redis_url=stack.env["EAGLEGEN_REDIS_URL"], run=stack.run_name,
        queue=stack.env["EAGLEGEN_QUEUE"], reconcile_scan_max=LIMIT, lease_ttl=20, **extra,
    )  # fmt: skip


def _samples(stack: Stack, n: int) -> list[str]:
    """``n`` pending samples of the test's run, with no message yet."""
    stack.store.ensure_params(GenParams(), stack.env["EAGLEGEN_QUEUE"])
    source = SourceRef(dataset="t", row=0, format="prompt")
    ids = [f"s{i}" for i in range(n)]
    stack.store.accept([Sample(id=i, user_turns=["q"], source=source) for i in ids])
    return ids


def _publish(stack: Stack, settings: Settings, ids: list[str]) -> None:
    publish(create_broker_app(settings), settings.queue, stack.run_name, ids)


class Republished:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, run: str, ids: list[str]) -> None:
        self.calls.append((run, ids))

    def ids(self) -> list[str]:
        return [i for _, ids in self.calls for i in ids]


def _die_holding(stack: Stack, sample_id: str, delivered_ago: float) -> None:
    """Move the sample's queued message to ``unacked``, delivered long ago to a dead worker."""
    r = stack.store.r
    for key in stack.queue_keys():
        for raw in r.lrange(key, 0, -1):
            message = json.loads(raw)
            if f'"{sample_id}"' in _body(message):
                r.lrem(key, 1, raw)
                tag = message["properties"]["delivery_tag"]
                r.hset(UNACKED, tag, json.dumps([message, "", stack.env["EAGLEGEN_QUEUE"]]))
                r.zadd(UNACKED_INDEX, {tag: time.time() - delivered_ago})
                return
    raise AssertionError(f"no queued message for {sample_id}")


def _body(message: dict) -> str:
    import base64

    return base64.b64decode(message["body"]).decode()


def test_over_the_scan_limit_the_queue_is_not_read_and_a_lost_sample_is_found_later(
    stack: Stack,
):
    settings = _settings(stack)
    ids = _samples(stack, 2 * LIMIT)
    _publish(stack, settings, ids[1:])  # s0's message is lost
    republished = Republished()
    reconciler = Reconciler(stack.store.r, settings, republished)
    for _ in range(3):
        (report,) = reconciler.run_once([stack.run_name])
        assert not report.queue_scanned and report.pending == 2 * LIMIT
    assert republished.ids() == []  # not judged: its absence from the queue is unknown
    # Workers take the oldest messages (kombu pushes left, pops right) and finish s1..s50.
    for key in stack.queue_keys():
        stack.store.r.ltrim(key, 0, LIMIT - 2)  # s51..s99 stay queued
    stack.store.r.srem(stack.store.keys.pending, *ids[1 : LIMIT + 1])
    reports = [reconciler.run_once([stack.run_name])[0] for _ in range(2)]
    assert all(report.queue_scanned for report in reports)
    assert republished.ids() == ["s0"]  # two passes agreed; the queued ones stay alone


def test_a_dead_workers_sample_comes_back_even_while_the_queue_is_too_long_to_read(
    stack: Stack,
):
    settings = _settings(stack)
    ids = _samples(stack, 2 * LIMIT)
    _publish(stack, settings, ids)
    _die_holding(stack, "s7", delivered_ago=600)
    _die_holding(stack, "s8", delivered_ago=1)  # just delivered: its worker takes the lease
    republished = Republished()
    reconciler = Reconciler(stack.store.r, settings, republished)
    reports = [reconciler.run_once([stack.run_name])[0] for _ in range(2)]
    assert not any(report.queue_scanned for report in reports)
    assert republished.ids() == ["s7"]


def _slow_pass(loop: ReconcilerLoop, entered: threading.Event, finish: threading.Event):
    kept: list = []  # the pass's keep() check, then what it said at the end

    def run_once(keep):  # what a pass over a huge backlog looks like to its lock
        kept.append(keep)
        entered.set()
        finish.wait(10)
        kept.append(keep())
        return []

    loop.reconciler.run_once = run_once  # type: ignore[method-assign]
    thread = threading.Thread(target=loop._pass)
    return thread, kept


def _first_in_a_slow_pass(stack: Stack):
    """Two reconciler loops (lock lives 0.27 s); the first holds the lock, inside a pass."""
    settings = _settings(stack, reconcile_interval=0.3)
    first, second = (ReconcilerLoop(stack.store.r, settings, Republished()) for _ in range(2))
    entered, finish = threading.Event(), threading.Event()
    thread, kept = _slow_pass(first, entered, finish)
    assert first._lock.hold()
    thread.start()
    assert entered.wait(5)
    return first, second, thread, kept, finish


def test_a_pass_longer_than_its_lock_keeps_the_lock_so_passes_never_overlap(stack: Stack):
    _, second, thread, kept, finish = _first_in_a_slow_pass(stack)
    deadline = time.monotonic() + 1.2  # four lock lifetimes: it is extended all along
    while time.monotonic() < deadline:
        assert not second._lock.hold()
        time.sleep(0.05)
    finish.set()
    thread.join()
    assert kept[1] is True
    wait_for(second._lock.hold, 5, "the lock to free itself after the pass")


def test_a_pass_that_lost_its_lock_is_told_to_stop(stack: Stack):
    first, second, thread, kept, finish = _first_in_a_slow_pass(stack)
    stack.store.r.delete(first._lock.name)  # as if it had expired during a Redis stall
    assert second._lock.hold()
    wait_for(lambda: not kept[0](), 5, "the pass to learn that its lock is gone")
    finish.set()
    thread.join()
    assert kept[1] is False


def test_the_queue_is_read_page_by_page_without_missing_a_message(stack: Stack):
    ids = [f"p{i}" for i in range(3 * PAGE + 7)]
    publish(create_broker_app(_settings(stack)), stack.env["EAGLEGEN_QUEUE"], stack.run_name, ids)
    refs = list(queued_refs(stack.store.r, stack.env["EAGLEGEN_QUEUE"]))
    assert sorted(r.sample_id for r in refs) == sorted(ids)
    assert all(r.queued and r.run == stack.run_name for r in refs)
