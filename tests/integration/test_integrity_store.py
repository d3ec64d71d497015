"""Run integrity at the store, against the real scripts in a real Redis: every write that
changes a sample's progress is its lease holder's, a released lease stays released, a run has
one model, a retired run takes nothing more, dead workers leave no bookkeeping."""

from __future__ import annotations

import json
import time

import pytest

from common import checkpoint_log, errors
from common.keys import clocks_key, reconciler_lock_key
from common.models import Checkpoint, Failure, GenParams, Sample, SourceRef
from common.store import RunStore
from tests.fakes import turn
from worker.pipeline.clock_watch import STALE_S, read_clocks


@pytest.fixture
def store(rdb) -> RunStore:
    return RunStore(rdb, "eaglegen", "integrity")


def _sample(i: int, turns: int = 1) -> Sample:
    return Sample(
        id=f"s{i}", user_turns=[f"q{i}.{t}" for t in range(turns)],
        source=SourceRef(dataset="d", row=i, format="prompt"),
    )  # fmt: skip


def _failure() -> Failure:
    return Failure(kind="401", message="bad key", attempts=1, at=0.0)


# -- leases: released means released ---------------------------------------------------------


def test_a_renewal_from_a_snapshot_taken_before_release_does_not_take_the_lease_back(store):
    store.accept([_sample(1)])
    assert store.take("s1", "gen", 30).outcome == "ok"
    snapshot = [("s1", "gen")]  # the renewer reads its held leases ...
    assert store.release("s1", "gen")  # ... the generation ends and gives its lease back ...
    assert store.renew(snapshot, 30) == ["s1"]  # ... and the late renewal lands: refused
    assert store.leased_ids() == set() and not store.r.hexists(store.keys.lease_owner, "s1")
    # So the failure that follows is not mistaken for another worker's lease.
    assert store.take("s1", "gen-2", 30).outcome == "ok"


def test_only_the_reaped_holder_takes_its_lease_back_and_only_while_no_one_else_has(store):
    store.accept([_sample(1), _sample(2)])
    store.take("s1", "paused", 0.05)
    store.take("s2", "paused", 0.05)
    time.sleep(0.1)
    assert sorted(store.reap_expired_leases()) == ["s1", "s2"]
    assert store.renew([("s1", "stranger")], 30) == ["s1"]  # not its lease, reaped or not
    assert store.take("s2", "successor", 30).outcome == "ok"
    assert store.renew([("s1", "paused"), ("s2", "paused")], 30) == ["s2"]
    assert store.leased_ids() == {"s1", "s2"} and store.r.hlen(store.keys.reaped) == 0


# -- fenced progress writes ------------------------------------------------------------------


def test_a_stale_holder_cannot_save_answered_turns_over_its_successor(store):
    store.accept([_sample(1, turns=3)])
    store.take("s1", "old", 0.05)
    store.save_partial("s1", "old", [turn("old one")])
    time.sleep(0.1)
    assert store.take("s1", "new", 30).outcome == "ok"  # the old holder is paused past it
    store.save_partial("s1", "new", [turn("old one"), turn("new two")])
    with pytest.raises(errors.LeaseLost):
        store.save_partial("s1", "old", [turn("old one")])  # it wakes up: refused
    taken_partial = json.loads(store.r.hget(store.keys.prompts, store.keys.partial_field("s1")))
    assert [t["content"] for t in taken_partial] == ["old one", "new two"]


def test_no_write_lands_for_a_finished_sample(store):
    store.accept([_sample(1, turns=2)])
    store.take("s1", "a", 30)
    assert store.store_result("s1", "{}", 1, "a") == "stored"
    with pytest.raises(errors.LeaseLost):
        store.save_partial("s1", "a", [turn("late")])
    assert store.store_failure("s1", _failure(), "a") == "duplicate"
    assert store.r.hlen(store.keys.prompts) == 0 and store.counts().failed == 0


def test_result_and_failure_are_refused_without_the_lease(store):
    store.accept([_sample(1)])
    store.take("s1", "a", 30)
    store.release("s1", "a")
    assert store.store_result("s1", "{}", 1, "a") == "lease_lost"  # given back: not ours
    assert store.store_failure("s1", _failure(), "a") == "lease_lost"
    assert store.store_result("s1", "{}", 1, "") == "lease_lost"
    assert store.counts().pending == 1


def test_a_reaped_holder_that_nobody_replaced_may_still_store_its_answer(store):
    store.accept([_sample(1)])
    store.take("s1", "slow", 0.05)
    time.sleep(0.1)
    store.reap_expired_leases()
    assert store.store_result("s1", "{}", 1, "slow") == "stored"  # minutes of GPU kept


def test_a_checkpoint_made_after_another_first_answer_is_discarded_at_take(store):
    store.accept([_sample(1, turns=2)])
    store.take("s1", "old", 0.05)
    store.save_partial("s1", "old", [turn("old one")])
    stale = Checkpoint(turn=1, endpoint="e", model="m", content="x", tokens=5)
    marked = stale.on_history([turn("old one")])
    piece = checkpoint_log.piece(marked, checkpoint_log.Saved())
    assert store.save_checkpoint("s1", "old", checkpoint_log.header(marked), piece) > 0
    time.sleep(0.1)
    # What the issue found: turn 1 from one attempt, a checkpoint on another history.
    store.r.hset(
        store.keys.prompts, store.keys.partial_field("s1"),
        json.dumps([turn("new one").model_dump()]),
    )  # fmt: skip
    taken = store.take("s1", "new", 30)
    assert taken.checkpoint is not None and taken.resume_point() is None


# -- one model per run -----------------------------------------------------------------------


def test_the_first_model_asked_for_is_pinned_and_another_endpoint_refused(store):
    assert store.pin_model("qwen-a", "http://a/v1") == "qwen-a"
    assert store.pin_model("qwen-b", "http://b/v1") == "qwen-a"
    assert store.pinned_model() == "qwen-a"
    refused = store.refused_endpoints()
    assert list(refused) == ["http://b/v1"] and "qwen-b" in refused["http://b/v1"]


# -- retired runs are closed -----------------------------------------------------------------


def test_retire_waits_for_a_live_producer_and_a_collector_unless_forced(store):
    store.accept([_sample(1)], producer="p1")
    store.take("s1", "a", 30)
    store.store_result("s1", "{}", 1, "a")
    lock = store.collector_lock(10)
    assert lock.hold()
    assert store.take_ready(lock.token or "", 10) == ["s1"]
    store.commit_collected(lock.token or "", ["s1"])
    assert store.retire() == "producing"  # the producer's heartbeat is live
    store.beat("p1", alive=False)
    assert store.retire() == "collecting"  # a collector holds the lock
    lock.release()
    assert store.retire() == "retired"
    summary = store.retired_summary()
    assert summary is not None and (summary["total"], summary["written"]) == (1, 1)


def test_nothing_lands_in_a_retired_run(store):
    store.accept([_sample(1), _sample(2)], producer="p1")
    store.take("s1", "a", 30)
    assert store.retire(force=True) == "retired"
    with pytest.raises(errors.RunRetired):
        store.accept([_sample(3)], producer="p1")
    with pytest.raises(errors.RunRetired):
        store.beat("p1")
    assert store.take("s2", "b", 30).outcome == "retired"
    assert store.store_result("s1", "{}", 1, "a") == "duplicate"
    store.incr("retries")
    with pytest.raises(errors.RunRetired):
        store.collector_lock(10).hold()
    assert store.pin_model("m", "http://a/v1") == "m"
    # Only the summary is left, and it did not move.
    left = [k for k in store.r.scan_iter(match="eaglegen:{integrity}:*")]
    assert left == [store.keys.retired]
    assert store.retired_summary()["total"] == 2  # type: ignore[index]


def test_a_producer_starting_on_a_retired_run_brings_none_of_its_keys_back(store):
    store.ensure_params(GenParams(), "q")
    assert store.retire(force=True) == "retired"
    with pytest.raises(errors.RunRetired):
        store.ensure_params(GenParams(), "q")
    assert not store.r.exists(store.keys.meta)


# -- bounded bookkeeping, one reconciler per queue -------------------------------------------


def test_a_dead_workers_clock_reading_is_pruned(rdb):
    key = clocks_key("eaglegen")
    now = float(rdb.time()[0])
    rdb.hset(key, "dead:1", json.dumps({"skew_s": 0.0, "at": now - STALE_S - 5}))
    rdb.hset(key, "alive:2", json.dumps({"skew_s": 0.1, "at": now}))
    assert read_clocks(rdb, "eaglegen", now, 600) == {"alive:2": 0.1}
    assert rdb.hkeys(key) == ["alive:2"]


def test_each_queue_has_its_own_reconciler_lock():
    assert reconciler_lock_key("eaglegen", "a") != reconciler_lock_key("eaglegen", "b")
