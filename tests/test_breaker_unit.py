"""The circuit breaker's rule, on an in-memory store."""

from __future__ import annotations

import pytest

from common import errors
from common.models import Failure
from tests.fakes import FakeStore, sample
from worker.pipeline.breaker import Breaker, reset


def _fail(store: FakeStore, breaker: Breaker, sample_id: str, kind: str = "400") -> None:
    store.pending.discard(sample_id)
    failure = Failure(kind=kind, message="too long", attempts=1, at=0.0)
    store.failed[sample_id] = failure
    breaker.failed(store, failure)


def _store(n: int) -> FakeStore:
    store = FakeStore()
    for i in range(n):
        store.add(sample(f"s{i}"))
    return store


def test_five_permanent_failures_of_one_kind_and_no_answer_open_it():
    store, breaker = _store(20), Breaker()
    for i in range(4):
        _fail(store, breaker, f"s{i}")
    breaker.check(store)  # four: still closed
    _fail(store, breaker, "s4")
    with pytest.raises(errors.CircuitOpen, match="first 5 samples all failed with 400"):
        breaker.check(store)


def test_fast_failures_while_more_samples_are_in_flight_do_not_open_it():
    store, breaker = _store(30), Breaker()
    store.leases = {f"s{i}": "w" for i in range(10, 20)}  # ten long generations under way
    for i in range(6):
        _fail(store, breaker, f"s{i}")
    breaker.check(store)


@pytest.mark.parametrize("other", ["5xx", "404"])
def test_transient_or_mixed_failures_do_not_open_it(other):
    store, breaker = _store(20), Breaker()
    for i in range(8):
        _fail(store, breaker, f"s{i}", "400" if i % 2 else other)
    breaker.check(store)


def test_an_answered_sample_keeps_it_closed():
    store, breaker = _store(20), Breaker()
    store.pending.discard("s19")  # answered: done 1
    for i in range(8):
        _fail(store, breaker, f"s{i}")
    breaker.check(store)


def test_a_breaker_closed_by_retry_failed_is_seen_at_once_by_a_process_that_saw_it_open():
    store, breaker = _store(20), Breaker(clock=lambda: 0.0)  # the re-read interval never passes
    for i in range(5):
        _fail(store, breaker, f"s{i}")
    with pytest.raises(errors.CircuitOpen):
        breaker.check(store)
    reset(store)  # what retry-failed does before it requeues
    breaker.check(store)
