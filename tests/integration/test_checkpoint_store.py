"""A turn's checkpoint in the run store, against a real Redis: fenced by the lease, returned by
the take, gone with the answered turn, the result, the failure and the retired run."""

from __future__ import annotations

import time

import pytest

from common import checkpoint_log
from common.models import Checkpoint, Failure, Sample, SourceRef
from common.store import RunStore
from tests.fakes import turn


@pytest.fixture
def store(rdb) -> RunStore:
    return RunStore(rdb, "eaglegen", "unit")


def save(store: RunStore, sample_id: str, token: str, checkpoint: Checkpoint) -> bool:
    """The whole checkpoint, as a turn's first save writes it."""
    head = checkpoint_log.header(checkpoint)
    piece = checkpoint_log.piece(checkpoint, checkpoint_log.Saved())
    return store.save_checkpoint(sample_id, token, head, piece) > 0


def _sample(i: int, turns: int = 1) -> Sample:
    return Sample(
        id=f"s{i}", user_turns=[f"q{i}.{t}" for t in range(turns)],
        source=SourceRef(dataset="d", row=i, format="prompt"),
    )  # fmt: skip


def ckpt(tokens: int, turn_index: int = 0) -> Checkpoint:
    return Checkpoint(
        turn=turn_index, endpoint="http://e/v1", model="m", prompt_token_ids=[5, 6, 7],
        token_ids=list(range(100, 100 + tokens)), content="x" * tokens, tokens=tokens,
    )  # fmt: skip


def test_only_the_lease_holder_writes_and_the_next_take_returns_it(store):
    store.accept([_sample(1)])
    assert store.take("s1", "old", 0.05).checkpoint is None
    assert save(store, "s1", "old", ckpt(10))
    time.sleep(0.1)  # the old holder pauses (SIGSTOP) past its lease
    taken = store.take("s1", "new", 30)
    assert taken.checkpoint == ckpt(10) and taken.resume_point() == ckpt(10)
    assert not save(store, "s1", "old", ckpt(99))  # it wakes up: refused
    assert store.checkpoint("s1") == ckpt(10)
    assert save(store, "s1", "new", ckpt(20))
    assert store.checkpoint("s1") == ckpt(20)


def test_no_one_writes_a_checkpoint_without_a_lease(store):
    store.accept([_sample(1)])
    assert not save(store, "s1", "anyone", ckpt(5))  # never leased
    store.take("s1", "a", 0.05)
    time.sleep(0.1)
    assert store.reap_expired_leases() == ["s1"]
    # Reaped from "a" and taken by no one since: still a's (IS_HOLDER, as LEASE_RENEW).
    assert save(store, "s1", "a", ckpt(5))
    store.take("s1", "b", 30)
    assert not save(store, "s1", "a", ckpt(6))  # taken over: a's is refused
    store.release("s1", "b")
    assert not save(store, "s1", "b", ckpt(7))  # given back
    assert not save(store, "s1", "anyone", ckpt(8))
    assert store.checkpoint("s1") == ckpt(5)


def test_a_reaped_lease_keeps_its_checkpoint_for_the_next_holder(store):
    store.accept([_sample(1)])
    store.take("s1", "dead", 0.05)
    save(store, "s1", "dead", ckpt(300))
    time.sleep(0.1)
    store.reap_expired_leases()  # the reconciler finds the dead worker's lease
    assert store.take("s1", "next", 30).checkpoint == ckpt(300)


def test_answering_the_turn_empties_its_checkpoint_in_the_same_write(store):
    store.accept([_sample(1, turns=2)])
    store.take("s1", "a", 30)
    save(store, "s1", "a", ckpt(50, turn_index=0))
    store.save_partial("s1", "a", [turn("one")])
    store.release("s1", "a")
    taken = store.take("s1", "b", 30)
    assert [t.content for t in taken.partial] == ["one"] and taken.checkpoint is None


def test_a_checkpoint_of_an_earlier_turn_is_no_resume_point(store):
    store.accept([_sample(1, turns=2)])
    store.take("s1", "a", 30)
    store.r.hset(store.keys.prompts, "s1|partial", '[{"content": "one"}]')  # turn 0 answered
    save(store, "s1", "a", ckpt(50, turn_index=0))  # yet its checkpoint is left
    store.release("s1", "a")
    taken = store.take("s1", "b", 30)
    assert taken.checkpoint is not None and taken.resume_point() is None


def test_the_result_the_failure_and_retirement_delete_it(store):
    store.accept([_sample(1), _sample(2)])
    for sample_id in ("s1", "s2"):
        store.take(sample_id, "a", 30)
        save(store, sample_id, "a", ckpt(40))
    assert store.store_result("s1", "{}", 40, "a") == "stored"
    failure = Failure(kind="5xx", message="m", attempts=9, at=0.0)
    assert store.store_failure("s2", failure, "a") == "stored"
    # The failed sample's prompt and attempts stay for a requeue; no checkpoint is left.
    assert sorted(store.r.hkeys(store.keys.prompts)) == ["s2", "s2|attempts"]
    assert store.requeue_failed() == ["s2"]
    assert store.take("s2", "b", 30).checkpoint is None  # requeued: from the start
    save(store, "s2", "b", ckpt(40))
    assert store.retire(force=True) == "retired"
    assert not store.r.exists(store.keys.prompts)
    assert not list(store.r.scan_iter(match=store.keys.checkpoint_logs))


def test_a_piece_is_appended_only_at_the_length_its_writer_left_the_log(store):
    store.accept([_sample(1)])
    store.take("s1", "a", 30)
    first, more = ckpt(10), ckpt(25)
    head = checkpoint_log.header(first)
    length = store.save_checkpoint(
        "s1", "a", head, checkpoint_log.piece(first, checkpoint_log.Saved())
    )
    piece = checkpoint_log.piece(more, checkpoint_log.saved(first, length))
    assert store.save_checkpoint("s1", "a", "", piece, length - 1) == -1  # not as it left it
    grown = store.save_checkpoint("s1", "a", "", piece, length)
    assert grown == length + len(piece.encode())
    assert store.checkpoint("s1") == more and store.take("s1", "a", 30).checkpoint == more
    assert store.save_checkpoint("s1", "b", "", piece, grown) == 0  # not the holder: refused


def test_an_answered_turn_takes_its_log_along_and_an_append_finds_no_header(store):
    store.accept([_sample(1, turns=2)])
    store.take("s1", "a", 30)
    assert save(store, "s1", "a", ckpt(10))
    store.save_partial("s1", "a", [turn("one")])
    assert not store.r.exists(store.keys.checkpoint_log("s1"))
    assert (
        store.save_checkpoint(
            "s1", "a", "", checkpoint_log.piece(ckpt(12), checkpoint_log.Saved()), 0
        )
        == -1
    )
    assert store.checkpoint("s1") is None
