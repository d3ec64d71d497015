"""The stream decoder (TurnStream), the token-id memory (IdSupport) and the status mapping."""

from __future__ import annotations

import json

import pytest

from common import errors
from common.models import TurnResult
from worker.chat.client import IdSupport, status_error, translate_errors
from worker.chat.stream import TurnStream

E = "http://e/v1"


def event(payload: object) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def delta(ids: list[int] | None = None, finish: str | None = None, **fields: str) -> bytes:
    choice: dict[str, object] = {"index": 0, "delta": fields, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return event({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})


# A vLLM stream with return_token_ids: prompt ids first, one token per chunk, a chunk without
# text for a special token, the finish, the usage, [DONE].
VLLM = b"".join(
    [
        event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
               "prompt_token_ids": [1, 2, 3]}),
        delta([258]),
        delta([300], reasoning="Think"),
        delta([301], reasoning=" hard"),
        delta([259]),
        delta([400], content="Hé"),
        delta([401], content=" ✓"),
        delta([257], finish="stop"),
        event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}),
        b"data: [DONE]\n\n",
    ]
)  # fmt: skip


def read(stream: bytes, pieces: list[bytes] | None = None) -> TurnStream:
    turn = TurnStream(E)
    for piece in pieces if pieces is not None else [stream]:
        turn.feed(piece)
    return turn


def assert_vllm_turn(turn: TurnStream) -> None:
    result = turn.result(0.5, "m")
    assert (result.reasoning, result.content, result.finish_reason) == (
        "Think hard",
        "Hé ✓",
        "stop",
    )
    assert result.prompt_token_ids == [1, 2, 3]
    assert result.token_ids == [258, 300, 301, 259, 400, 401, 257]
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 7)
    assert turn.done and turn.tokens() == 7


def test_a_vllm_stream_gives_text_ids_finish_and_usage():
    assert_vllm_turn(read(VLLM))


@pytest.mark.parametrize("size", [1, 2, 7, 64])
def test_reads_cut_anywhere_even_inside_a_character_give_the_same_turn(size):
    pieces = [VLLM[i : i + size] for i in range(0, len(VLLM), size)]
    assert_vllm_turn(read(VLLM, pieces))


def test_crlf_framing_and_a_cr_at_the_end_of_a_read():
    crlf = VLLM.replace(b"\n", b"\r\n")
    cut = crlf.index(b"\r\n\r\n") + 1  # the read ends between CR and LF
    assert_vllm_turn(read(crlf, [crlf[:cut], crlf[cut:]]))
    last = len(crlf) - 1  # the last read is the final LF alone
    assert_vllm_turn(read(crlf, [crlf[:last], crlf[last:]]))


def test_general_events_comments_fields_and_multiline_data():
    stream = b"".join(
        [
            b": keep-alive comment\n\n",
            b"event: message\nid: 7\ndata: " + delta(content="a")[6:-2] + b"\n\n",
            b"data:" + delta(content="b")[6:],  # no space after the colon
            b'data: {"choices": [{"delta": {"content": "c"},\ndata: "finish_reason": "stop"}]}\n\n',
            b"retry: 10\n\n",
            b"data:  [DONE]\n\n",
        ]
    )
    turn = read(stream)
    assert turn.done and "".join(turn.content) == "abc" and turn.finish_reason == "stop"


def test_nothing_after_done_is_parsed():
    turn = read(delta(content="x", finish="stop") + b"data: [DONE]\n\ndata: {broken\n\n")
    assert turn.done and turn.content == ["x"]


def test_an_error_event_in_the_stream_is_a_server_error():
    with pytest.raises(errors.ServerError, match="engine died"):
        read(event({"error": {"message": "engine died", "code": 500}}))


@pytest.mark.parametrize("body", [b"data: [1, 2]\n\n", b"data: {nope}\n\n", b"data: {}}\n\n"])
def test_a_payload_that_is_not_a_json_object_is_a_bad_response(body):
    with pytest.raises(errors.BadResponse), translate_errors(E):
        read(body)


def test_a_stream_without_a_finish_reason_was_cut():
    with pytest.raises(errors.Disconnected, match="without a finish_reason"):
        read(delta(content="half")).result(0.1, "m")


def test_an_empty_answer_is_an_error_unless_cut_by_length():
    with pytest.raises(errors.EmptyResponse):
        read(delta(content=" ", finish="stop")).result(0.1, "m")
    assert read(delta(finish="length")).result(0.1, "m").finish_reason == "length"


def test_inline_think_tags_become_reasoning_and_no_ids_mean_none():
    turn = read(delta(content="<think>r</think>\n\nanswer", finish="stop")).result(0.1, "m")
    assert (turn.reasoning, turn.content) == ("r", "answer")
    assert turn.prompt_token_ids is None and turn.token_ids is None


def test_reasoning_content_is_read_as_reasoning():
    turn = read(delta(reasoning_content="old", finish="stop")).result(0.1, "m")
    assert turn.reasoning == "old"


# --- token-id memory ------------------------------------------------------------------------


def turn(with_ids: bool) -> TurnResult:
    ids = [1] if with_ids else None
    return TurnResult(content="a", finish_reason="stop", prompt_token_ids=ids, token_ids=ids)


def test_auto_asks_until_an_endpoint_answers_without_ids():
    support = IdSupport("auto", E)
    assert support.ask()
    support.answered(turn(True))
    assert support.ask() and support.known is True
    other = IdSupport("auto", E)
    other.answered(turn(False))
    assert not other.ask()


def test_auto_takes_a_refusal_of_the_field_as_no_ids_and_other_400s_as_they_are():
    support = IdSupport("auto", E)
    assert not support.refused(errors.BadRequest("HTTP 400: max_tokens too large"))
    assert support.ask()
    assert support.refused(errors.BadRequest("Unrecognized argument: return_token_ids"))
    assert not support.ask()


def test_on_fails_without_ids_and_then_before_asking():
    support = IdSupport("on", E)
    with pytest.raises(errors.NoTokenIds, match="EAGLEGEN_TOKEN_IDS=on") as raised:
        support.answered(turn(False))
    assert raised.value.endpoint == E
    with pytest.raises(errors.NoTokenIds):
        support.ask()
    refusing = IdSupport("on", E)
    with pytest.raises(errors.NoTokenIds, match="refuses"):
        refusing.refused(errors.BadRequest("return_token_ids: extra fields not permitted"))
    assert issubclass(errors.NoTokenIds, errors.PermanentError)


def test_off_never_asks():
    assert not IdSupport("off", E).ask()


# --- HTTP statuses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, errors.BadRequest), (401, errors.AuthError), (404, errors.NotFound),
     (408, errors.ServerError), (429, errors.RateLimited), (503, errors.ServerError),
     (302, errors.BadResponse)],
)  # fmt: skip
def test_statuses_map_to_the_exception_tree(status, kind):
    assert type(status_error(status, b"", E)) is kind


@pytest.mark.parametrize(
    "body",
    [
        b'{"error": {"message": "maximum context length is 200", "code": 400}}',
        b'{"object": "error", "message": "maximum context length is 200"}',
        b"maximum context length is 200",
    ],
)
def test_the_servers_message_is_kept(body):
    assert str(status_error(400, body, E)).endswith("HTTP 400: maximum context length is 200")
