"""The lean server-sent-events parser the streaming client reads chunks with."""

import pytest

from common import errors
from worker.client import sse_chunks


def test_chunks_read_as_attributes_and_stop_at_done():
    lines = [
        'data: {"choices": [{"delta": {"content": "hi", "reasoning": "r"}}]}',
        "",
        ": a comment line",
        'data: {"choices": [], "usage": {"completion_tokens": 3}}',
        "data: [DONE]",
        'data: {"never": "read"}',
    ]
    first, last = list(sse_chunks(lines, "http://e/v1"))
    assert first.choices[0].delta.content == "hi" and first.usage is None
    assert first.choices[0].delta.reasoning == "r"
    assert last.usage.completion_tokens == 3 and last.choices == []


def test_an_error_event_in_the_stream_is_a_server_error():
    lines = ['data: {"error": {"message": "engine died", "code": 500}}']
    with pytest.raises(errors.ServerError, match="engine died"):
        list(sse_chunks(lines, "http://e/v1"))
