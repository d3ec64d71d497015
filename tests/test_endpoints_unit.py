"""Routing in the endpoint pool: free capacity, health, waiting, giving slots back.

The slot table (Redis) is replaced by an in-memory one with the same contract.
"""

import threading
import time

import pytest
import redis

from common import errors
from common.settings import Settings
from tests.fakes import FakeClient, turn
from tests.harness import free_port, wait_for
from worker.endpoints.capacity import CapacityUnavailable, FreeSignal, Routed
from worker.endpoints.pool import EndpointPool
from worker.endpoints.routing import Load, RouteHint, choose

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

    def try_route(self, token, ranking, eligible, load_bound, wait):
        loads = {u: Load(len(self.taken[u]), self.caps[u], u in eligible) for u in ranking}
        choice = choose(ranking, loads, load_bound, wait)
        if choice.wait:
            return Routed(None, waiting_for=ranking[0])
        if choice.endpoint is not None:
            self.taken[choice.endpoint].add(token)
        return Routed(choice.endpoint)

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


def _pool(caps, max_request_time=5.0, failures=2, redis=None, **routing):
    settings = Settings(
        endpoints=list(caps), max_request_time=max_request_time, endpoint_failures=failures,
        **routing,
    )  # fmt: skip
    table = FakeTable(caps)
    clients = {url: FakeClient(*[turn()] * 10) for url in caps}
    return EndpointPool(settings, redis, table, clients), table


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


# -- routing by prefix cache ---------------------------------------------------------------


def _later_turn_of(endpoint):
    return RouteHint("some prompt", previous=endpoint)


def test_a_later_turn_goes_back_to_its_previous_server_while_its_load_allows():
    pool, _ = _pool({A: 4, B: 4})
    with pool.borrow() as first:  # least loaded: A and B tie
        other = B if first is pool.clients[A] else A
        with pool.borrow(hint=_later_turn_of(other)) as client:
            assert client is pool.clients[other]
        mine = A if other == B else B
        with pool.borrow(hint=_later_turn_of(mine)) as client:
            assert client is pool.clients[mine]  # one ahead of the other: within 1.25 x


def test_a_full_previous_server_is_waited_for_then_left_for_the_least_loaded():
    pool, _ = _pool({A: 1, B: 1}, affinity_wait=0.3)
    with pool.borrow(hint=_later_turn_of(A)):
        started = time.monotonic()
        with pool.borrow(hint=_later_turn_of(A)) as client:
            waited = time.monotonic() - started
            assert client is pool.clients[B]
    assert 0.3 <= waited < 3


def test_a_slot_freed_on_the_previous_server_goes_to_the_turn_waiting_for_it():
    pool, table = _pool({A: 1, B: 1}, affinity_wait=10)
    got: list[object] = []
    holder = pool.borrow(hint=_later_turn_of(A))
    holder.__enter__()
    waiter = threading.Thread(
        target=lambda: got.append(pool.borrow(hint=_later_turn_of(A)).__enter__())
    )
    waiter.start()
    wait_for(lambda: len(pool.signal._lines.get(A, ())) == 1, 5, "the turn to wait for A")
    assert table.taken[B] == set()  # B stayed free: the turn waits for its own server
    started = time.monotonic()
    holder.__exit__(None, None, None)
    waiter.join(5)
    assert got == [pool.clients[A]] and time.monotonic() - started < 2


def test_a_failing_previous_server_is_not_waited_for():
    pool, _ = _pool({A: 1, B: 1}, failures=1, affinity_wait=10)
    with pytest.raises(errors.ConnectError), pool.borrow(hint=_later_turn_of(A)):
        raise errors.ConnectError("refused")
    started = time.monotonic()
    with pool.borrow(hint=_later_turn_of(A)) as client:
        assert client is pool.clients[B] and time.monotonic() - started < 1


def test_least_loaded_routing_ignores_the_hint():
    pool, _ = _pool({A: 1, B: 3}, routing="least-loaded")
    with pool.borrow(hint=_later_turn_of(A)) as client:
        assert client is pool.clients[B]


def test_a_release_wakes_the_first_come_of_those_who_can_use_its_slot():
    signal = FreeSignal()
    woke: list[str] = []

    def wait(endpoint, ticket):
        signal.wait(signal.generation(), 10, endpoint, ticket)
        woke.append(endpoint or "any")

    # B's waiter came first, then one for any endpoint, then A's.
    threads = [threading.Thread(target=wait, args=args) for args in ((B, 1), (None, 2), (A, 3))]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(signal._lines.get(e) for e in (A, B, None)), 5, "all three to wait")
    signal.notify(endpoint=A)  # B's waiter cannot use it: the one for any came before A's
    wait_for(lambda: woke == ["any"], 5, "the waiter for any endpoint")
    signal.notify(endpoint=A)
    wait_for(lambda: woke == ["any", A], 5, "A's waiter")
    assert not signal._lines.get(A) and signal._lines.get(B)  # B's still waits
    signal.notify(endpoint=B)
    for thread in threads:
        thread.join(5)
    assert woke == ["any", A, B]


def _resumed_on(pool, checkpoint_from):
    """The endpoint a turn continuing a checkpoint of ``checkpoint_from`` is sent to."""
    with pool.borrow(hint=RouteHint("k").resuming(checkpoint_from)) as client:
        return next(url for url, c in pool.clients.items() if c is client)


def test_a_checkpoint_continues_on_its_server_unless_that_one_cannot_continue_it():
    C = "http://c/v1"
    pool, _ = _pool({A: 1, B: 3, C: 3})
    assert _resumed_on(pool, A) == A  # not learned yet: its cache holds the prefix
    pool.clients[A].continuing = False  # it answered a continuation afresh
    assert _resumed_on(pool, A) in (B, C)  # one not known not to continue
    pool.clients[C].continuing = True
    assert _resumed_on(pool, A) == C  # one proven to continue first
    pool.clients[C].continuing = False
    assert _resumed_on(pool, C) == B


def test_a_server_that_cannot_continue_gets_no_checkpoint_while_another_can():
    pool, _ = _pool({A: 5, B: 1}, affinity_wait=0)
    pool.clients[A].continuing = False
    with pool.borrow(hint=RouteHint("k").resuming(B)) as first:
        assert first is pool.clients[B]
        # B is full: the next checkpoint waits for B rather than start again on A's free
        # slots; a turn without a checkpoint goes to A.
        with pool.borrow(hint=RouteHint("k")) as fresh:
            assert fresh is pool.clients[A]
        waited = threading.Event()

        def resume() -> None:
            with pool.borrow(hint=RouteHint("k").resuming(A)) as client:
                waited.set()
                assert client is pool.clients[B]

        thread = threading.Thread(target=resume)
        thread.start()
        assert not waited.wait(0.3)
    thread.join(10)
    assert waited.is_set()
    pool.clients[B].continuing = False  # none can: not held back, it starts again anywhere
    with pool.borrow(hint=RouteHint("k").resuming(B)):  # B's one slot
        assert _resumed_on(pool, B) == A


def test_what_one_process_learned_of_continuations_routes_the_checkpoints_of_the_next(rdb):
    first, _ = _pool({A: 3, B: 2}, redis=rdb)
    first.clients[A].continuing = False  # A answered a continuation afresh
    with first.borrow() as client:  # the request that taught it (A: the most free slots)
        assert client is first.clients[A]
    later, _ = _pool({A: 3, B: 2}, redis=rdb)  # a worker started afterwards: learned nothing
    assert later.clients[A].continues() is None
    assert _resumed_on(later, A) == B


def test_routing_of_checkpoints_goes_on_without_redis():
    # The shared knowledge is a preference: with its Redis unreachable, what this process
    # learned still routes, and sharing it fails quietly.
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    pool, _ = _pool({A: 3, B: 2}, redis=away)
    pool.clients[A].continuing = False
    with pool.borrow() as client:  # the request that taught it, shared in vain
        assert client is pool.clients[A]
    assert _resumed_on(pool, A) == B
    pool.clients[A].continuing = None  # not learned here, Redis unread: nothing to route by
    assert _resumed_on(pool, A) == A
