"""The decoder and the producer against hostile input, without a network: wrong shapes raise
BadResponse, an endless event is capped without re-copying, ids that disagree are dropped."""

from __future__ import annotations

import sys
import time

import pytest

from common import errors
from common.models import GenParams
from common.redact import redact
from common.settings import Settings
from producer.enqueue import Feeder
from producer.readers import RawRow, SourceInfo, _parse_line
from tests.hostile import SHAPES, UNFINISHED, HostileServer, chunk, ended_with, good_events, sse
from worker.chat.client import ChatClient, translate_errors
from worker.chat.stream import TurnStream
from worker.tasks import unexpected


def feed_all(stream: TurnStream, events: list[bytes]) -> None:
    with translate_errors("e"):
        for event in events:
            stream.feed(event)
        stream.result(0.0, "m")


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_a_wrong_shape_is_a_bad_response(case: str) -> None:
    *events, done = good_events()
    with pytest.raises(errors.BadResponse):
        feed_all(TurnStream("e"), [*events, SHAPES[case], done])


@pytest.mark.parametrize("reason", ["abort", "error", "paused_for_maintenance"])
def test_a_stream_that_ends_unfinished_is_no_answer_but_a_checkpoint(reason: str) -> None:
    stream = TurnStream("e")
    with pytest.raises(errors.Unfinished, match=reason):
        feed_all(stream, ended_with(reason))
    saved = stream.checkpoint()
    assert saved is not None and (saved.content, saved.token_ids) == ("Hello big", [11, 12])


@pytest.mark.parametrize("reason", ["stop", "length", "tool_calls", "content_filter"])
def test_a_finish_that_means_the_model_finished_is_an_answer(reason: str) -> None:
    stream = TurnStream("e")
    feed_all(stream, ended_with(reason))
    assert stream.result(0.0, "m").finish_reason == reason


@pytest.mark.parametrize("case", sorted(UNFINISHED))
def test_the_client_gives_an_unfinished_turn_back_as_an_error_with_its_checkpoint(
    case: str,
) -> None:
    server = HostileServer()
    url = server.endpoint(case)
    client = ChatClient(url, Settings(endpoints=[url], model="m"))
    try:
        with pytest.raises(errors.Disconnected) as caught:
            client.complete([{"role": "user", "content": "q"}], GenParams(max_tokens=50))
    finally:
        client.close()
        server.close()
    saved = caught.value.checkpoint
    assert saved is not None and (saved.content, saved.tokens) == ("Hello big", 2)


def test_tool_calls_are_left_for_their_decoder() -> None:
    events = good_events()
    events.insert(2, sse(chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]})))
    stream = TurnStream("e")
    feed_all(stream, events)
    assert stream.content == ["Hello", " big", " world"]


def test_an_event_without_an_end_is_capped_in_linear_time() -> None:
    stream = TurnStream("e")
    stream.max_event = 32 << 20
    stream.feed(b'data: {"choices": "')
    block = b"a" * 65536
    started = time.process_time()
    with pytest.raises(errors.BadResponse, match="over 33554432 bytes"):
        for _ in range(1024):
            stream.feed(block)
    assert time.process_time() - started < 1.0  # the quadratic re-copy took 5.3 s


def test_an_event_in_many_reads_is_parsed_once_it_ends() -> None:
    stream = TurnStream("e")
    whole = b"".join(good_events())
    for i in range(0, len(whole), 7):
        stream.feed(whole[i : i + 7])
    assert stream.result(0.0, "m").token_ids == [11, 12, 13]


def test_crlf_framing_split_across_reads_still_ends_events() -> None:
    stream = TurnStream("e")
    whole = b"".join(good_events()).replace(b"\n", b"\r\n")
    for i in range(0, len(whole), 3):
        stream.feed(whole[i : i + 3])
    assert stream.result(0.0, "m").content == "Hello big world"


def _with_ids(replace: dict[int, bytes]) -> TurnStream:
    events = good_events()
    for index, event in replace.items():
        events[index] = event
    stream = TurnStream("e")
    feed_all(stream, events)
    return stream


@pytest.mark.parametrize(
    ("replace", "why"),
    [
        ({2: sse(chunk({"content": " big"})), 3: sse(chunk({"content": " world"}))}, "missing"),
        ({1: sse(chunk({"content": "Hello"}, token_ids="123"))}, "not lists"),
        ({1: sse(chunk({"content": "Hello"}, token_ids=["1"]))}, "integers"),
        ({3: sse(chunk({"content": " world"}, token_ids=[13, 14]))}, "usage"),
        ({0: sse({**chunk(), "prompt_token_ids": "1 2 3"})}, "prompt"),
    ],
)
def test_ids_that_disagree_with_the_text_are_dropped(replace: dict[int, bytes], why: str) -> None:
    stream = _with_ids(replace)
    turn = stream.result(0.0, "m")
    assert turn.token_ids is None and turn.prompt_token_ids is None
    assert turn.token_ids_dropped is not None and why in turn.token_ids_dropped
    assert turn.content == "Hello big world"
    checkpoint = stream.checkpoint()
    assert checkpoint is not None and checkpoint.token_ids is None  # checkpoints the same


def test_ids_that_agree_are_kept() -> None:
    turn = _with_ids({}).result(0.0, "m")
    assert (turn.prompt_token_ids, turn.token_ids, turn.token_ids_dropped) == (
        [1, 2, 3],
        [11, 12, 13],
        None,
    )


def test_a_quoted_bearer_token_is_masked() -> None:
    assert redact("header Authorization: Bearer sk-abc123; x", []) == (
        "header Authorization: Bearer ***; x"
    )


def test_an_unexpected_exception_becomes_an_attempt_with_its_reason_masked() -> None:
    found = unexpected(KeyError("sk-secret-key"), ["sk-secret-key"])
    assert isinstance(found, errors.Unexpected) and "sk-secret-key" not in str(found)
    assert unexpected(errors.StallError("x"), []).__class__ is errors.StallError


def test_an_endpoint_url_with_credentials_is_refused_without_printing_them() -> None:
    with pytest.raises(ValueError, match="holds credentials") as caught:
        Settings(endpoints=["http://user:pa55@host:8000/v1"])
    assert "pa55" not in str(caught.value).split("input_value")[0]


def test_a_row_nested_too_deep_is_an_invalid_row() -> None:
    deep = b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}\n"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default, which some imports of the suite raise
    try:
        row = _parse_line(7, deep)
    finally:
        sys.setrecursionlimit(limit)
    assert row.data is None and row.error == "JSON nested too deep"


class _Store:
    """The store calls a Feeder makes, in memory: pending count, known ids, acceptance."""

    def __init__(self) -> None:
        self.pending = 0
        self.accepted: list[str] = []

    def known(self, ids: list[str]) -> list[bool]:
        return [False for _ in ids]

    def pending_count(self) -> int:
        return self.pending

    def accept(self, samples: list, producer: str = "") -> list[bool]:
        self.accepted += [s.id for s in samples]
        self.pending += len(samples)
        return [True for _ in samples]

    def beat(self, producer: str, alive: bool = True) -> None:
        """The producer heartbeat (a no-op here)."""


def _feeder(store: _Store, **options: object) -> tuple[Feeder, list[tuple[int, str]]]:
    invalid: list[tuple[int, str]] = []
    feeder = Feeder(
        store=store, params=GenParams(), info=SourceInfo("d", None), publish=lambda ids: None,
        on_invalid=lambda row, why: invalid.append((row, why)), **options,
    )  # type: ignore[arg-type]  # fmt: skip
    return feeder, invalid


def test_a_huge_or_wrongly_typed_row_is_counted_and_the_good_rows_are_accepted() -> None:
    store = _Store()
    feeder, invalid = _feeder(store, max_row_bytes=4 << 20)
    rows = [
        RawRow(0, {"prompt": "fine"}),
        RawRow(1, {"prompt": "x" * (10 << 20)}),
        RawRow(2, {"prompt": {"nested": [1, 2]}}),
        RawRow(3, None, "JSON nested too deep"),
        RawRow(4, {"prompt": "also fine"}),
    ]
    counts = feeder.run(rows)
    assert (counts.enqueued, counts.invalid) == (2, 3)
    assert [row for row, _ in invalid] == [1, 2, 3]
    assert "over EAGLEGEN_MAX_ROW_BYTES" in invalid[0][1]


def test_backpressure_counts_bytes_as_well_as_samples() -> None:
    store = _Store()
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        store.pending = 0  # the workers caught up

    store.pending = 1  # one sample of another producer's waits
    feeder, _ = _feeder(store, max_pending_bytes=1 << 20, wait=wait)
    rows = [RawRow(i, {"prompt": f"{i} " + "y" * (300 << 10)}) for i in range(8)]
    feeder.run(rows)
    assert len(store.accepted) == 8 and waits == [0.5]  # 2.4 MB waited for room
