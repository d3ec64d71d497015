"""An endpoint refusing a run's requests: the sample goes to another, the endpoint leaves the
run's rotation after a few refusals in a row (the processor, with in-memory fakes)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from common import errors
from common.settings import Settings
from tests.fakes import FakeClient, FakeObserver, FakeStore, store_of, turn
from worker.pipeline.leases import LeaseKeeper
from worker.pipeline.processing import SampleProcessor
from worker.pipeline.rotation import OUT_AFTER

A, B = "http://a/v1", "http://b/v1"


class TwoEndpoints:
    """Routes each request to the first endpoint not avoided, as the pool's routing may."""

    def __init__(self, a: FakeClient, b: FakeClient) -> None:
        a.endpoint, b.endpoint = A, B
        self.clients = [a, b]

    @contextlib.contextmanager
    def borrow(
        self, check: Any = None, hint: Any = None, avoid: Any = frozenset()
    ) -> Iterator[Any]:
        yield next(c for c in self.clients if c.endpoint not in avoid)


def _answer(endpoint: str) -> Any:
    return turn().model_copy(update={"endpoint": endpoint})


def _404() -> errors.NotFound:
    return errors.NotFound(f"{A}: HTTP 404: The model `m` does not exist.")


def _processor(store: FakeStore, a: FakeClient, b: FakeClient) -> SampleProcessor:
    settings = Settings(endpoints=[A, B])
    leases = LeaseKeeper(lambda run: store, settings.lease_ttl)
    endpoints = TwoEndpoints(a, b)
    return SampleProcessor(settings, lambda run: store, endpoints, leases, FakeObserver())


def test_a_request_an_endpoint_refuses_goes_to_another_before_the_sample_can_fail():
    store = store_of(1)
    a, b = FakeClient(_404()), FakeClient(_answer(B))
    assert _processor(store, a, b).process("r", "s0") == "done"
    assert (len(a.calls), len(b.calls)) == (1, 1)
    assert store.failed == {} and store.out_of_rotation == {}


def test_refusals_in_a_row_take_the_endpoint_out_of_the_runs_rotation_for_every_sample():
    store = store_of(OUT_AFTER + 2)
    a = FakeClient(*[_404() for _ in range(OUT_AFTER)])
    b = FakeClient(*[_answer(B) for _ in range(OUT_AFTER + 2)])
    proc = _processor(store, a, b)
    for i in range(OUT_AFTER + 2):
        assert proc.process("r", f"s{i}") == "done"
    assert len(a.calls) == OUT_AFTER  # not asked again once out
    why = store.out_of_rotation[A]
    assert why.startswith(f"refused {OUT_AFTER} requests in a row: ") and "HTTP 404" in why
    assert A not in why  # named beside the reason wherever it is shown


def test_an_answer_between_refusals_keeps_the_endpoint_in_rotation():
    store = store_of(4)
    a = FakeClient(_404(), _answer(A), *[_404() for _ in range(OUT_AFTER - 1)])
    b = FakeClient(*[_answer(B) for _ in range(3)])
    proc = _processor(store, a, b)
    assert [proc.process("r", f"s{i}") for i in range(4)] == ["done"] * 4
    assert store.out_of_rotation == {}


def test_a_sample_every_endpoint_refuses_fails_with_the_refusal_once():
    store = store_of(1)
    a, b = FakeClient(_404()), FakeClient(errors.AuthError(f"{B}: HTTP 401: bad key"))
    with pytest.raises(errors.AuthError):
        _processor(store, a, b).process("r", "s0")
    assert store.failed["s0"].kind == "auth" and store.failed["s0"].attempts == 1


def test_a_samples_own_400_fails_it_on_the_first_endpoint_alone():
    store = store_of(1)
    a, b = FakeClient(errors.BadRequest(f"{A}: HTTP 400: maximum context length")), FakeClient()
    with pytest.raises(errors.BadRequest):
        _processor(store, a, b).process("r", "s0")
    assert b.calls == [] and store.failed["s0"].kind == "400" and store.out_of_rotation == {}


def test_with_every_endpoint_out_a_sample_fails_without_a_request_and_says_why():
    store = store_of(1)
    store.out_of_rotation = {A: "refused 3 requests in a row: HTTP 404", B: "... HTTP 401"}
    a, b = FakeClient(), FakeClient()
    with pytest.raises(errors.NoEndpoint, match=f"{A}: refused 3 requests in a row: HTTP 404"):
        _processor(store, a, b).process("r", "s0")
    assert a.calls == b.calls == [] and store.failed["s0"].kind == "no_endpoint"


def test_endpoints_retry_failed_brought_back_are_seen_before_a_sample_would_fail():
    store = store_of(2)
    store.out_of_rotation = {A: "refused 3 requests in a row: HTTP 404", B: "... HTTP 404"}
    a, b = FakeClient(_answer(A)), FakeClient()
    proc = _processor(store, a, b)
    with pytest.raises(errors.NoEndpoint):
        proc.process("r", "s0")
    store.bring_endpoints_back()  # what retry-failed does
    assert proc.process("r", "s1") == "done"  # well within the process's re-read interval
