"""The run store's atomic transitions, against a real Redis."""

from __future__ import annotations

import time

import pytest

from common.errors import CollectorFenced
from common.models import Failure, Sample, SourceRef
from common.store import RunStore, Taken
from tests.fakes import turn


@pytest.fixture
def store(rdb) -> RunStore:
    return RunStore(rdb, "eaglegen", "unit")


def _sample(i: int) -> Sample:
    return Sample(
        id=f"s{i}", user_turns=[f"q{i}"], source=SourceRef(dataset="d", row=i, format="prompt")
    )


def test_a_sample_is_accepted_once_ever(store):
    assert store.accept([_sample(1), _sample(2)]) == [True, True]
    assert store.accept([_sample(1)]) == [False]
    assert store.known(["s1", "s3"]) == [True, False]


def test_a_live_lease_turns_away_every_other_holder(store):
    store.accept([_sample(1)])
    assert store.acquire("s1", "worker-a:gen-1", 30) == "ok"
    assert store.acquire("s1", "worker-a:gen-2", 30) == "leased"  # same process, other thread
    assert store.acquire("s1", "worker-b:gen-1", 30) == "leased"


def test_an_expired_lease_can_be_taken_over_and_the_old_holder_learns_it(store):
    store.accept([_sample(1)])
    assert store.acquire("s1", "old", 0.05) == "ok"
    time.sleep(0.1)  # let the lease expire: Redis time is the clock here
    assert store.acquire("s1", "new", 30) == "ok"
    assert store.renew([("s1", "old")], 30) == ["s1"]
    assert store.renew([("s1", "new")], 30) == []


def _stored(store, sample_id: str) -> None:
    """A result stored by the holder of the sample's lease, as a worker does."""
    assert store.take(sample_id, "w", 30).outcome == "ok"
    assert store.store_result(sample_id, "{}", 1, "w") == "stored"


def test_taking_a_sample_reads_its_prompt_attempts_and_answered_turns(store):
    store.accept([_sample(1)])
    first = store.take("s1", "a", 30)
    assert (first.outcome, first.attempts, first.partial) == ("ok", 1, [])
    assert first.sample == _sample(1)
    store.save_partial("s1", "a", [turn("one")])
    store.release("s1", "a")
    again = store.take("s1", "b", 30, retries=1)
    assert again.attempts == 2 and [t.content for t in again.partial] == ["one"]
    assert store.take("s1", "c", 30) == Taken("leased")
    assert store.store_result("s1", "{}", 3, "b") == "stored"
    # The prompt, the attempt count and the answered turns leave with the sample.
    assert store.r.hlen(store.keys.prompts) == 0 and store.leased_ids() == set()
    assert store.take("s1", "c", 30) == Taken("done")


def test_a_result_is_stored_once_and_ends_the_lease(store):
    store.accept([_sample(1)])
    store.acquire("s1", "a", 30)
    assert store.store_result("s1", '{"id": "s1"}', 7, "a") == "stored"
    assert store.store_result("s1", '{"id": "s1"}', 7, "a") == "duplicate"
    assert store.acquire("s1", "b", 30) == "done"
    counts = store.counts()
    assert (counts.done, counts.pending, counts.in_flight, counts.completion_tokens) == (1, 0, 0, 7)


def test_collected_results_leave_redis_and_count_as_written_once(store):
    store.accept([_sample(1), _sample(2)])
    _stored(store, "s1")
    _stored(store, "s2")
    lock = store.collector_lock(10)
    assert lock.hold()
    assert store.take_ready(lock.token, 10) == ["s1", "s2"]
    assert store.collecting() == ["s1", "s2"]
    assert store.commit_collected(lock.token, ["s1", "s2"]) == 2
    assert store.commit_collected(lock.token, ["s1", "s2"]) == 0
    assert store.counts().written == 2 and store.results_for(["s1"]) == [None]
    assert store.collecting() == []


def test_only_the_collector_lock_holder_can_take_or_commit(store):
    store.accept([_sample(1), _sample(2)])
    _stored(store, "s1")
    _stored(store, "s2")
    old, new = store.collector_lock(0.2), store.collector_lock(10)
    assert old.hold()
    assert store.take_ready(old.token, 1) == ["s1"]
    time.sleep(0.3)  # the old holder is paused past its lock ...
    assert new.hold()  # ... and a successor takes the run over
    assert store.take_ready(new.token, 5) == ["s1"]  # what the old holder left comes first
    with pytest.raises(CollectorFenced):
        store.commit_collected(old.token, ["s1"])
    with pytest.raises(CollectorFenced):
        store.take_ready(old.token, 5)
    assert store.collecting() == ["s1"] and store.counts().written == 0
    assert not old.hold()
    assert store.commit_collected(new.token, ["s1"]) == 1
    assert store.take_ready(new.token, 5) == ["s2"]


def test_a_commit_removes_only_the_ids_it_names(store):
    store.accept([_sample(i) for i in (1, 2, 3)])
    for i in (1, 2, 3):
        _stored(store, f"s{i}")
    lock = store.collector_lock(10)
    assert lock.hold() and store.take_ready(lock.token, 5) == ["s1", "s2", "s3"]
    assert store.commit_collected(lock.token, ["s2"]) == 1  # not the head of the list
    assert store.collecting() == ["s1", "s3"]
    assert store.commit_collected(lock.token, ["s1", "s3"]) == 2
    assert store.collecting() == [] and store.counts().written == 3


def test_failed_samples_go_back_to_pending_on_request(store):
    store.accept([_sample(1)])
    store.take("s1", "a", 30)
    store.store_failure("s1", Failure(kind="400", message="too long", attempts=1, at=0.0), "a")
    assert store.counts().failed == 1
    assert store.requeue_failed() == ["s1"]
    counts = store.counts()
    assert (counts.failed, counts.pending) == (0, 1)


def test_expired_leases_are_reaped_and_live_ones_kept(store):
    store.accept([_sample(1), _sample(2)])
    store.acquire("s1", "dead", 0.05)
    store.acquire("s2", "alive", 30)
    time.sleep(0.1)
    assert store.reap_expired_leases() == ["s1"]
    assert store.leased_ids() == {"s2"}


def test_results_missing_from_the_ready_list_are_found(store):
    store.accept([_sample(1)])
    _stored(store, "s1")
    store.r.delete(store.keys.ready)  # as if lost in a Redis restart
    assert store.orphan_results() == ["s1"]
    lock = store.collector_lock(10)
    assert lock.hold()
    assert store.requeue_result("s1") and store.take_ready(lock.token, 5) == ["s1"]


def test_a_live_lease_reaped_after_a_long_outage_is_taken_back_by_its_holder(store):
    store.accept([_sample(1), _sample(2)])
    store.acquire("s1", "alive", 0.05)
    store.acquire("s2", "alive", 30)
    time.sleep(0.1)  # Redis unreachable longer than the lease: it looks expired
    assert store.reap_expired_leases() == ["s1"]  # the reconciler got there first
    assert store.renew([("s1", "alive"), ("s2", "alive")], 30) == []  # not lost: taken back
    assert store.leased_ids() == {"s1", "s2"}
    assert store.acquire("s1", "other", 30) == "leased"


def test_a_lease_another_worker_holds_is_lost_and_its_result_and_failure_refused(store):
    store.accept([_sample(1)])
    store.acquire("s1", "old", 0.05)
    time.sleep(0.1)
    assert store.acquire("s1", "new", 30) == "ok"
    assert store.renew([("s1", "old")], 30) == ["s1"]
    assert store.store_result("s1", "{}", 5, "old") == "lease_lost"
    failure = Failure(kind="5xx", message="late", attempts=1, at=0.0)
    assert store.store_failure("s1", failure, "") == "lease_lost"
    assert store.counts().pending == 1 and store.store_result("s1", "{}", 5, "new") == "stored"
