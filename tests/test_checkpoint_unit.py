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

from common import checkpoint_log, errors
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
    """A store whose checkpoint writes are recorded, refused, or fail like a Redis outage;
    ``answer`` -1: the log is never as expected (every append refused, whole writes land)."""

    run = "r"

    def __init__(self, answer: bool | int | Exception = True) -> None:
        self.answer = answer
        self.writes: list[tuple[str, str, int]] = []  # (header, piece, log bytes expected)
        self.head, self.log = "", ""

    def save_checkpoint(
        self, sample_id: str, token: str, header: str, piece: str, log_bytes: int = 0
    ) -> int:
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer is False:
            return 0
        self.writes.append((header, piece, log_bytes))
        if not header and (self.answer == -1 or len(self.log.encode()) != log_bytes):
            return -1
        self.head, self.log = (header, piece) if header else (self.head, self.log + piece)
        return len(self.log.encode())

    @property
    def saved(self) -> Checkpoint | None:
        return checkpoint_log.decode(self.head, self.log)


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


def _grown(tokens: int, **more) -> Checkpoint:
    return ckpt(tokens, reasoning="r" * (tokens // 2), **more)


def test_after_the_first_whole_save_each_save_appends_only_what_is_new():
    store = Recording()
    p = progress(store, tokens=32)
    for n in (32, 64, 96):
        assert p.keep(_grown(n))
    assert [bool(head) for head, _, _ in store.writes] == [True, False, False]
    assert store.saved == _grown(96).on_history([])  # marked: no answers before
    # The two appends carry 32 ids and 32 characters each, not the whole turn again.
    assert json.loads(store.writes[2][1]) == [list(range(64, 96)), "c" * 32, "r" * 16, 32]


def test_bytes_sent_grow_with_the_turn_not_with_its_square():
    def sent(n: int) -> int:
        store = Recording()
        p = progress(store, tokens=32)
        for tokens in range(32, n + 1, 32):
            p.keep(_grown(tokens))
        assert store.saved == _grown(n).on_history([])  # marked: no answers before
        return sum(len(head) + len(piece) for head, piece, _ in store.writes)

    assert sent(8000) < 15 * sent(800)  # 10x the tokens: ~10x the bytes (ids get longer), not 100x


def test_a_checkpoint_that_does_not_extend_the_saved_one_is_written_whole():
    store = Recording()
    p = progress(store, tokens=32)
    p.keep(_grown(40))
    shifted = _grown(80).model_copy(update={"content": "moved" + "c" * 75})  # text re-split
    p.keep(shifted)
    assert [bool(head) for head, _, _ in store.writes] == [True, True]
    assert store.saved == shifted.on_history([])  # marked: no answers before


def test_a_log_not_as_this_writer_left_it_is_written_whole_again():
    store = Recording(answer=-1)  # every append finds another length (the log was dropped)
    p = progress(store, tokens=32)
    p.keep(_grown(32))
    assert p.keep(_grown(64))
    assert [bool(head) for head, _, _ in store.writes] == [True, False, True]
    assert store.saved == _grown(64).on_history([])  # marked: no answers before


def test_a_checkpoint_without_ids_appends_its_text():
    store = Recording()
    p = progress(store, tokens=32)
    for n in (10, 20):
        p.keep(ckpt(n).model_copy(update={"token_ids": None, "prompt_token_ids": None}))
    assert store.saved is not None and store.saved.token_ids is None
    assert store.saved.content == "c" * 20 and store.saved.tokens == 20


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
    progress = client.options[0]["progress"]  # its requests are still named, to abort them
    assert client.options[0]["resume"] is None and progress.checkpoints is None
    assert not progress.due(10_000)
    assert "a" not in store.checkpoints


def test_a_checkpoint_write_failing_does_not_stop_the_generation():
    store = FakeStore()
    store.add(sample("a"))

    def down(*args, **kwargs):
        raise redis.ConnectionError("down")

    store.save_checkpoint = down  # type: ignore[method-assign]
    proc, _, _ = _processor(store, _streams(ckpt(256), ckpt(512), then=turn("whole")))
    assert proc.process("r", "a") == "done"
