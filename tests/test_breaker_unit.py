"""The circuit breaker's rule, on an in-memory store."""

from __future__ import annotations

import pytest

from common import errors
from common.models import Failure
from tests.fakes import FakeStore, store_of
from worker.pipeline.breaker import MIN_ATTEMPTED, Breaker, reset


def _fail(store: FakeStore, breaker: Breaker, sample_id: str, kind: str = "bad_params") -> None:
    store.pending.discard(sample_id)
    failure = Failure(kind=kind, message="why", attempts=1, at=0.0)
    store.failed[sample_id] = failure
    breaker.failed(store, failure)


def _answer(store: FakeStore, *ids: str) -> None:
    store.pending.difference_update(ids)


def test_samples_attempted_failing_the_runs_way_open_it_at_the_minimum_count():
    store, breaker = store_of(30), Breaker()
    for i in range(MIN_ATTEMPTED - 1):
        _fail(store, breaker, f"s{i}")
    breaker.check(store)  # one short of the minimum: still closed
    _fail(store, breaker, f"s{MIN_ATTEMPTED - 1}")
    with pytest.raises(errors.CircuitOpen, match="10 of the run's 10 samples attempted failed"):
        breaker.check(store)


def test_a_samples_own_400s_never_open_it_however_many_come_first():
    store, breaker = store_of(40), Breaker()
    for i in range(30):  # a source sorted by length: its longest rows first, all over-long
        _fail(store, breaker, f"s{i}", "400")
    breaker.check(store)


def test_it_judges_by_the_rate_over_samples_attempted_not_by_the_first_to_fail():
    store, breaker = store_of(40), Breaker()
    for i in range(5):
        _fail(store, breaker, f"s{i}", "400")  # the rows' own: attempted, not the run's way
    _answer(store, "s5", "s6")
    for i in range(7, 25):  # 18 of 25 attempted: 72%
        _fail(store, breaker, f"s{i}", "404")
    breaker.check(store)
    for i in range(25, 40):  # 33 of 40 attempted: 82%
        _fail(store, breaker, f"s{i}", "no_endpoint")
    breaker.check(store)


def test_an_answered_sample_no_longer_keeps_it_closed_for_ever():
    store, breaker = store_of(40), Breaker()
    _answer(store, "s0")  # the server answered once, then its model was swapped
    for i in range(1, 12):
        _fail(store, breaker, f"s{i}", "404")
    with pytest.raises(errors.CircuitOpen, match="9 of the run's 10 samples attempted failed"):
        breaker.check(store)


def test_fast_failures_while_more_samples_are_in_flight_do_not_open_it():
    store, breaker = store_of(60), Breaker()
    store.leases = {f"s{i}": "w" for i in range(30, 50)}  # twenty long generations under way
    for i in range(15):
        _fail(store, breaker, f"s{i}")
    breaker.check(store)


def test_transient_failures_do_not_open_it():
    store, breaker = store_of(20), Breaker()
    for i in range(15):
        _fail(store, breaker, f"s{i}", "5xx")
    breaker.check(store)


def test_retry_failed_closes_it_and_brings_every_endpoint_back_seen_at_once():
    store, breaker = store_of(20), Breaker(clock=lambda: 0.0)  # the re-read interval never passes
    store.out_of_rotation["http://a/v1"] = "refused 3 requests in a row: HTTP 404"
    for i in range(10):
        _fail(store, breaker, f"s{i}")
    with pytest.raises(errors.CircuitOpen):
        breaker.check(store)
    reset(store)  # what retry-failed does before it requeues
    breaker.check(store)
    assert store.endpoints_out() == {}


def test_a_breaker_opened_by_an_older_version_still_reads():
    store = store_of(1)
    store.meta["breaker"] = '{"kind": "400", "message": "too long", "after": 5, "at": 0}'
    with pytest.raises(errors.CircuitOpen, match="5 of the run's 5 samples attempted"):
        Breaker().check(store)
