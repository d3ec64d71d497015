"""Slot leases are renewed only while their request still holds them: real Redis.

The renewer snapshots the held slots, then renews them in Redis. A request that ends between
the two must not get its slot back (a phantom holding capacity for a whole slot lease); a
request whose lease truly expired while it still runs must be counted again.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import Any

from common.settings import Settings
from tests.fakes import FakeClient
from tests.stack import Stack
from worker.endpoints.capacity import Slot, SlotTable
from worker.endpoints.pool import EndpointPool

URL = "http://a/v1"


class RacingTable(SlotTable):
    """Runs ``before_renew`` between the renewer's snapshot and its script: the race, every time."""

    before_renew: Any = None

    def renew(self, slots: Collection[Slot]) -> list[Slot]:
        if self.before_renew is not None:
            self.before_renew()
        return super().renew(slots)


def _pool(stack: Stack, cap: int = 4, ttl: float = 30.0) -> tuple[EndpointPool, RacingTable]:
    prefix = stack.settings.key_prefix
    settings = Settings(endpoints=[URL], max_inflight=cap, slot_ttl=ttl, key_prefix=prefix)
    table = RacingTable(stack.store.r, prefix, {URL: cap}, ttl)
    client = FakeClient()
    return EndpointPool(settings, stack.store.r, table, {URL: client}), table  # type: ignore[dict-item]


def _in_flight(table: SlotTable) -> int:
    return table.snapshot()[0].inflight


def test_a_slot_released_after_the_renewers_snapshot_is_not_put_back(stack: Stack):
    pool, table = _pool(stack)
    borrowed: AbstractContextManager[object] = pool.borrow()
    borrowed.__enter__()
    assert _in_flight(table) == 1
    table.before_renew = lambda: borrowed.__exit__(None, None, None)  # the request ends
    assert pool.renew_slots() == 0
    assert _in_flight(table) == 0  # no phantom: the capacity is free at once
    assert stack.store.r.zcard(table.slots_key(URL)) == 0


def test_a_slot_that_expired_while_its_request_runs_is_counted_again(stack: Stack):
    pool, table = _pool(stack, ttl=0.3)
    with pool.borrow():
        stack.store.r.delete(table.slots_key(URL))  # pruned after a renewer fell behind
        assert _in_flight(table) == 0
        assert pool.renew_slots() == 1
        assert _in_flight(table) == 1
    assert _in_flight(table) == 0


def test_requests_ending_while_the_renewer_runs_flat_out_leave_no_slot_behind(stack: Stack):
    pool, table = _pool(stack, cap=8)
    stop = threading.Event()
    restored: list[int] = []

    def renewer() -> None:
        while not stop.is_set():
            restored.append(pool.renew_slots())

    def requests() -> None:
        for _ in range(600):
            with pool.borrow():
                pass

    renewing = threading.Thread(target=renewer)
    renewing.start()
    workers = [threading.Thread(target=requests) for _ in range(6)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    renewing.join()
    assert len(restored) > 50  # the renewer really ran alongside the requests
    assert sum(restored) == 0  # with 30 s leases nothing expired: nothing to put back
    assert stack.store.r.zcard(table.slots_key(URL)) == 0
