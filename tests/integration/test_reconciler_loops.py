"""The reconciler against a real Redis, in process: its abort never hits a later holder's live
request, and no exception in a pass ends its thread."""

from __future__ import annotations

import time
from typing import Any

import pytest

from broker.layout import queue_lists
from common.keys import EndpointKeys, runs_key
from common.models import Sample, SourceRef
from common.request_store import RequestRef
from common.settings import Settings
from common.store import RunStore, WorkerStore
from tests.harness import free_port, wait_for
from worker.pipeline import reconcile
from worker.pipeline.reconcile import Reconciler, ReconcilerLoop

RUN = "loops"


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, run=RUN, queue=f"q-{RUN}", reconcile_interval=0.2)


@pytest.fixture
def store(rdb, settings: Settings) -> RunStore:
    found = RunStore(rdb, settings.key_prefix, RUN)
    source = SourceRef(dataset="d", row=0, format="prompt")
    found.accept([Sample(id="s1", user_turns=["q"], source=source)])
    found.r.hset(found.keys.meta, "queue", settings.queue)
    found.r.sadd(runs_key(settings.key_prefix), RUN)
    return found


def _request(token: str) -> RequestRef:
    # A port nothing listens on: the abort itself fails fast; what matters is what is popped.
    return RequestRef(endpoint=f"http://127.0.0.1:{free_port()}/v1", server_id=f"chatcmpl-{token}",
                      token=token, max_tokens=100)  # fmt: skip


def _expired_holder(store: RunStore, token: str) -> RequestRef:
    ref = _request(token)
    assert store.take("s1", token, 0.001).outcome == "ok"
    assert store.record_request("s1", ref)
    time.sleep(0.01)  # a lease of 1 ms on Redis's clock: expired by now
    return ref


def test_the_reaper_aborts_only_the_request_of_the_holder_it_reaped(
    store: RunStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    """Between the reap and the pop, another worker takes the lease and records its own live
    request: the reaper must leave that one alone (before: it popped and aborted it)."""
    _expired_holder(store, "old-holder")
    real = reconcile.WorkerStore

    def taken_in_between(*args: Any) -> WorkerStore:
        # The reap has run; a live worker takes the lease and starts streaming now.
        assert store.take("s1", "new-holder", 30).outcome == "ok"
        assert store.record_request("s1", _request("new-holder"))
        return real(*args)

    monkeypatch.setattr(reconcile, "WorkerStore", taken_in_between)
    [report] = Reconciler(store.r, settings, lambda run, ids: None).run_once([RUN])
    assert report.expired_leases == ["s1"]
    left = store.pop_own_request("s1", "new-holder")
    assert left is not None, "the new holder's live request was aborted"


def test_the_reaper_aborts_the_reaped_holders_request(store: RunStore, settings: Settings):
    _expired_holder(store, "old-holder")
    Reconciler(store.r, settings, lambda run, ids: None).run_once([RUN])
    assert store.r.hget(store.keys.requests, "s1") is None  # popped (and its abort tried)


def test_a_pass_that_hits_a_garbled_entry_does_not_end_the_reconciler(
    store: RunStore, settings: Settings
):
    """A garbled abort_support entry, or a message in the queue list that is not JSON, raised
    out of a pass and ended the thread for the process's life: a lost sample was then never
    re-published."""
    ref = _expired_holder(store, "old-holder")
    store.r.hset(EndpointKeys(settings.key_prefix).abort_support, ref.endpoint, "not json")
    store.r.lpush(queue_lists(settings.queue)[0], "not json either")
    published: list[str] = []
    loop = ReconcilerLoop(store.r, settings, lambda run, ids: published.extend(ids))
    loop.start()
    try:
        # Reaped (its abort meets the garbled entry), then lost twice in a row: re-published.
        wait_for(lambda: published == ["s1"], 30, "the lost sample to be re-published")
    finally:
        loop.close()
