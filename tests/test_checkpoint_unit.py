"""Checkpoints of a turn in progress, without a server: when one is due, what the processor
saves and continues, with in-memory fakes at its boundaries (tests/fakes.py).

The real fenced script is tested against Redis in tests/integration/test_checkpoint_store.py;
the whole path (client, simulator, workers) in tests/integration/test_resume.py.
"""

from __future__ import annotations

import json
import time

import pytest
import redis

from common import errors
from common.models import Checkpoint
from common.settings import Settings
from common.store import Taken
from tests.fakes import FakeClient, FakeEndpoints, FakeObserver, FakeStore, sample, turn
from worker.chat.checkpoints import CLOCK_EVERY, TurnCheckpoints
from worker.pipeline.leases import LeaseKeeper
from worker.pipeline.processing import SampleProcessor


def ckpt(tokens: int, turn_index: int = 0, endpoint: str = "http://x/v1", **more) -> Checkpoint:
    return Checkpoint(
        turn=turn_index, endpoint=endpoint, model="m", prompt_token_ids=[1, 2],
        token_ids=list(range(tokens)), content="c" * tokens, tokens=tokens, **more,
    )  # fmt: skip


class Recording:
    """A store whose checkpoint writes are recorded, refused, or fail like a Redis outage."""

    run = "r"

    def __init__(self, answer: bool | Exception = True) -> None:
        self.answer = answer
        self.saved: list[Checkpoint] = []

    def save_checkpoint(self, sample_id: str, token: str, checkpoint: Checkpoint) -> bool:
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer:
            self.saved.append(checkpoint)
        return self.answer


def progress(store, tokens=256, seconds=10.0, resumed=None) -> TurnCheckpoints:
    settings = Settings(checkpoint_tokens=tokens, checkpoint_seconds=seconds)
    return TurnCheckpoints(store, "a", "tok", settings, resumed)  # type: ignore[arg-type]


def test_a_checkpoint_is_due_every_n_tokens_counted_from_the_last_save():
    p = progress(Recording(), tokens=256)
    assert not p.due(1) and not p.due(255)
    assert p.due(256)
    p.save(ckpt(300))
    assert not p.due(300) and not p.due(555)
    assert p.due(556)


def test_a_resumed_turn_counts_from_its_checkpoint_whichever_count_the_client_gives():
    whole = progress(Recording(), tokens=256, resumed=ckpt(1000))
    assert not whole.due(1001) and whole.due(1256)  # the turn's count
    this_request = progress(Recording(), tokens=256, resumed=ckpt(1000))
    assert not this_request.due(10) and this_request.due(256)  # this request's count


def test_time_alone_makes_a_checkpoint_due_when_tokens_are_off():
    p = progress(Recording(), tokens=0, seconds=0.3)
    assert not any(p.due(n) for n in range(1, 1000))  # no token count triggers one
    time.sleep(0.35)  # the interval passes
    assert any(p.due(1000) for _ in range(CLOCK_EVERY))  # the clock is read every few calls
    p.save(ckpt(1000))
    assert not any(p.due(1000) for _ in range(CLOCK_EVERY))  # nothing new since


def test_a_redis_error_while_saving_is_logged_and_pauses_periodic_saves(caplog):
    p = progress(Recording(redis.ConnectionError("down")), tokens=10)
    assert p.due(10)
    p.save(ckpt(10))  # does not raise: the generation goes on
    assert "not saved" in caplog.text
    assert not any(p.due(n) for n in range(11, 500))  # no save per 10 tokens into a dead Redis


def test_a_refused_save_ends_the_attempt_at_once_as_a_lost_lease():
    store = Recording(answer=False)
    p = progress(store, tokens=10)
    with pytest.raises(errors.LeaseLost):
        p.save(ckpt(10))
    assert p.refused and not p.due(1000)


def test_a_checkpoint_names_the_answered_history_it_extends():
    first, other = turn("first answer"), turn("another first answer")
    marked = ckpt(10, turn_index=1).on_history([first])
    assert marked.history_turns == 1 and marked.extends([first])
    assert not marked.extends([other]) and not marked.extends([])


def test_a_checkpoint_taken_on_another_history_is_discarded_not_resumed():
    first, other = turn("first answer"), turn("another first answer")
    stale = ckpt(10, turn_index=1).on_history([other])  # a stale worker's turn 1
    assert Taken("ok", 1, sample("a"), [first], stale).resume_point() is None
    fresh = ckpt(10, turn_index=1).on_history([first])
    assert Taken("ok", 1, sample("a"), [first], fresh).resume_point() == fresh
    unmarked = ckpt(10, turn_index=1)  # no proof of its history: not trusted past turn 0
    assert Taken("ok", 1, sample("a"), [first], unmarked).resume_point() is None


# -- the processor -------------------------------------------------------------------------


def _processor(store, *script, **settings):
    settings_ = Settings(**settings)
    leases = LeaseKeeper(lambda run: store, settings_.lease_ttl)
    client = FakeClient(*script)
    endpoints = FakeEndpoints(client)
    proc = SampleProcessor(settings_, lambda run: store, endpoints, leases, FakeObserver())
    return proc, client, endpoints


def _streams(*checkpoints: Checkpoint, then):
    """A script step: the stream saves ``checkpoints`` as the client would, then ends in
    ``then`` (a turn, or an exception)."""

    def play(progress):
        for c in checkpoints:
            if progress is not None and progress.due(c.tokens):
                progress.save(c)
        return then

    return play


def test_periodic_checkpoints_are_written_under_the_lease_and_leave_with_the_result():
    store = FakeStore()
    store.add(sample("a"))
    seen = {}

    def stream(progress):
        progress.save(ckpt(256))
        seen["mid"] = store.checkpoints.get("a")
        return turn("whole")

    proc, client, _ = _processor(store, stream)
    assert proc.process("r", "a") == "done"
    assert seen["mid"] == ckpt(256).on_history([])  # written while the lease was held
    assert "a" not in store.checkpoints  # and gone with the stored result
    assert client.options[0]["turn"] == 0 and client.options[0]["resume"] is None


def test_a_broken_stream_saves_its_break_point_and_the_retry_continues_it_on_its_server():
    store = FakeStore()
    store.add(sample("a"))
    broken = errors.Disconnected("cut")
    broken.checkpoint, broken.tokens_streamed = ckpt(700, endpoint="http://x/v1"), 700
    resumed = turn("whole").model_copy(update={"resumed_from_tokens": 700})
    proc, client, endpoints = _processor(store, broken, resumed)
    with pytest.raises(errors.Disconnected):
        proc.process("r", "a")
    assert store.checkpoints["a"].tokens == 700 and store.leases == {}  # saved, lease given back
    assert broken.tokens_streamed == 0  # kept, so not wasted
    assert proc.process("r", "a") == "done"
    assert client.options[1]["resume"] == ckpt(700, endpoint="http://x/v1").on_history([])
    assert endpoints.hints[1].previous == "http://x/v1"  # its prefix is cached there
    record = json.loads(store.results["a"])
    assert record["generation"]["turns"][0]["resumed_from_tokens"] == 700


def test_a_later_break_of_a_resumed_turn_wastes_only_what_it_did_not_keep():
    store = FakeStore()
    store.add(sample("a"))
    again = errors.Disconnected("cut again")
    # 700 continued from the first checkpoint, 300 more streamed, 250 of them in the snapshot
    again.checkpoint, again.tokens_streamed = ckpt(950, resumed_from_tokens=700), 300
    proc, _, _ = _processor(store, again)
    store.checkpoints["a"] = ckpt(700)
    with pytest.raises(errors.Disconnected):
        proc.process("r", "a")
    assert store.checkpoints["a"].tokens == 950 and again.tokens_streamed == 50


def test_a_lost_lease_saves_nothing():
    store = FakeStore()
    store.add(sample("a"))
    lost = errors.LeaseLost("taken")
    lost.checkpoint = ckpt(500)
    proc, _, _ = _processor(store, lost)
    with pytest.raises(errors.LeaseLost):
        proc.process("r", "a")
    assert "a" not in store.checkpoints


def test_a_checkpoint_of_a_turn_already_answered_is_not_continued():
    store = FakeStore()
    store.add(sample("a", ("q1", "q2")))
    store.partial["a"] = [turn("one")]
    store.checkpoints["a"] = ckpt(100, turn_index=0)  # stale: turn 0 is answered
    assert Taken("ok", 1, None, [turn("one")], ckpt(100, turn_index=0)).resume_point() is None
    proc, client, _ = _processor(store, turn("two"))
    assert proc.process("r", "a") == "done"
    assert client.options[0]["turn"] == 1 and client.options[0]["resume"] is None


def test_answering_a_turn_drops_its_checkpoint_and_the_next_turn_starts_fresh():
    store = FakeStore()
    store.add(sample("a", ("q1", "q2")))
    store.checkpoints["a"] = ckpt(100, turn_index=0)
    first = turn("one").model_copy(update={"resumed_from_tokens": 100})
    proc, client, _ = _processor(store, first, errors.ServerError("500"), turn("two"))
    with pytest.raises(errors.ServerError):
        proc.process("r", "a")
    assert "a" not in store.checkpoints  # turn 0 answered: its checkpoint went with it
    assert proc.process("r", "a") == "done"
    resumes = [(o["turn"], o["resume"] is not None) for o in client.options]
    assert resumes == [(0, True), (1, False), (1, False)]


def test_resume_off_neither_continues_nor_saves():
    store = FakeStore()
    store.add(sample("a"))
    store.checkpoints["a"] = ckpt(100)
    proc, client, _ = _processor(store, turn("whole"), resume="off")
    assert proc.process("r", "a") == "done"
    assert client.options[0]["resume"] is None and client.options[0]["progress"] is None
    assert "a" not in store.checkpoints


def test_a_checkpoint_write_failing_does_not_stop_the_generation():
    store = FakeStore()
    store.add(sample("a"))

    def down(*args, **kwargs):
        raise redis.ConnectionError("down")

    store.save_checkpoint = down  # type: ignore[method-assign]
    proc, _, _ = _processor(store, _streams(ckpt(256), ckpt(512), then=turn("whole")))
    assert proc.process("r", "a") == "done"
