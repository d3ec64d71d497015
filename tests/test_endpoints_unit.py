"""Routing in the endpoint pool: free capacity, health, waiting, giving slots back.

The slot table (Redis) is replaced by an in-memory one with the same contract.
"""

import threading

import pytest

from common import errors
from common.settings import Settings
from tests.fakes import FakeClient, turn
from worker.capacity import CapacityUnavailable
from worker.endpoints import EndpointPool

A, B = "http://a/v1", "http://b/v1"


class FakeTable:
    """Caps per endpoint; picks the eligible one with the most free slots, like the script."""

    def __init__(self, caps):
        self.caps = dict(caps)
        self.taken: dict[str, set[str]] = {url: set() for url in caps}
        self.reported: dict[str, tuple[bool, str]] = {}

    def try_acquire(self, token, eligible):
        free = {u: self.caps[u] - len(self.taken[u]) for u in self.caps if u in eligible}
        best = max(free, key=lambda u: free[u], default=None)
        if best is None or free[best] <= 0:
            return None
        self.taken[best].add(token)
        return best

    def release(self, slot):
        self.taken[slot.endpoint].discard(slot.token)

    def renew(self, slots):
        return [s for s in slots if s.token not in self.taken[s.endpoint]]

    def restore(self, slots):
        for slot in slots:
            self.taken[slot.endpoint].add(slot.token)
        return len(slots)

    def report_health(self, endpoint, state, message=""):
        self.reported[endpoint] = (state, message)


def _pool(caps, max_request_time=5.0, failures=2):
    settings = Settings(
        endpoints=list(caps), max_request_time=max_request_time, endpoint_failures=failures
    )
    table = FakeTable(caps)
    clients = {url: FakeClient(*[turn()] * 10) for url in caps}
    return EndpointPool(settings, None, table, clients), table


def test_each_request_goes_to_the_endpoint_with_the_most_free_slots():
    pool, table = _pool({A: 1, B: 3})
    with pool.borrow() as first, pool.borrow() as second:
        assert first is pool.clients[B] and second is pool.clients[B]
        assert pool.held() == 2
    assert pool.held() == 0 and table.taken == {A: set(), B: set()}


def test_an_endpoint_failing_in_a_row_is_taken_out_and_gets_no_requests():
    pool, table = _pool({A: 4, B: 1}, failures=2)
    for _ in range(2):
        with pytest.raises(errors.ServerError), pool.borrow():
            raise errors.ServerError("500")  # both land on A, the one with most room
    assert pool.health[A].out and table.reported[A] == ("down", "500")
    with pool.borrow() as client:
        assert client is pool.clients[B]


def test_when_every_endpoint_is_out_a_request_waits_for_one_to_come_back():
    pool, table = _pool({A: 1}, max_request_time=0.2, failures=1)
    with pytest.raises(errors.ConnectError), pool.borrow():
        raise errors.ConnectError("refused")
    assert pool.health[A].out
    got = threading.Event()
    waiter = threading.Thread(target=lambda: pool.borrow().__enter__() and got.set())
    waiter.start()
    assert not got.wait(0.6), "gave up or went to a down endpoint while none was in"
    pool._record(A, None)  # a probe found it back
    assert got.wait(5) and table.reported[A] == ("up", "")
    waiter.join()


def test_a_rate_limit_or_a_bad_request_does_not_count_against_the_endpoint():
    pool, _ = _pool({A: 4, B: 1}, failures=1)
    for exc in (errors.RateLimited("429"), errors.BadRequest("400")):
        with pytest.raises(type(exc)), pool.borrow():
            raise exc
    assert not pool.health[A].out


def test_a_request_waits_for_a_slot_and_gets_it_when_one_is_given_back():
    pool, _ = _pool({A: 1})
    got = threading.Event()
    with pool.borrow():
        waiter = threading.Thread(target=lambda: pool.borrow().__enter__() and got.set())
        waiter.start()
        assert not got.wait(0.2)  # full: it waits, holding nothing
    assert got.wait(5), "the waiter was not woken by the release"
    waiter.join()


def test_a_waiting_request_gives_up_when_its_check_raises():
    pool, _ = _pool({A: 1})

    def lost():
        raise errors.LeaseLost("taken")

    with pool.borrow(), pytest.raises(errors.LeaseLost), pool.borrow(lost):
        pass


def test_no_slot_within_the_request_time_is_a_transient_capacity_error():
    pool, _ = _pool({A: 1}, max_request_time=0.1)
    with pool.borrow(), pytest.raises(CapacityUnavailable), pool.borrow():
        pass


def test_the_start_up_check_takes_out_an_unreachable_endpoint_but_not_one_that_refuses():
    pool, table = _pool({A: 1, B: 1})
    pool.clients[A].probe_error = errors.ConnectError("cannot connect")
    pool.clients[B].probe_error = errors.AuthError("HTTP 401")
    pool.check_all()
    assert pool.health[A].out and table.reported[A] == ("down", "cannot connect")
    assert not pool.health[B].out and table.reported[B] == ("refusing", "HTTP 401")
