"""The bad-input catalogue: each case ends in a clear line or a counted skip, never a traceback,
and loses nothing already done."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.harness import wait_for
from tests.stack import Stack


class _BadEndpoint(BaseHTTPRequestHandler):
    """Answers /html/v1/... with a proxy page and /empty/v1/... with an empty answer."""

    def do_GET(self) -> None:  # /v1/models
        self._send(200, "application/json", json.dumps({"data": [{"id": "m"}]}))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path.startswith("/html"):
            self._send(200, "text/html", "<html><body>502 Bad Gateway</body></html>")
            return
        chunk = {
            "id": "x",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}],
        }
        self._send(200, "text/event-stream", f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n")

    def _send(self, status: int, kind: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def bad_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BadEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _write(tmp_path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _fails_cleanly(stack: Stack, args: list[str], expected: str) -> None:
    result = stack.procs.run(args, {**stack.env, "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_rows_without_a_user_turn_or_in_another_format_are_counted(stack: Stack, tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": "fine"}]},
        {"messages": [{"role": "system", "content": "no user here"}]},
        {"prompt": "a row in another format"},
        {"messages": [{"role": "user", "content": ["not", "parts"]}]},
    ]
    source = _write(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    result = stack.enqueue(source)
    assert "enqueued 1, already present 0, duplicates 0, invalid 3" in result.stdout
    assert "line 2: skipped, no user turn" in result.stderr
    assert "line 3: skipped, no 'messages' list (format openai)" in result.stderr
    assert "line 4: skipped, message 0 has non-text content parts" in result.stderr


def test_a_file_in_no_known_format_is_all_invalid(stack: Stack, tmp_path):
    source = _write(tmp_path, "x.jsonl", b'{"text": "a"}\n{"body": "b"}\n')
    result = stack.enqueue(source)
    assert "enqueued 0, already present 0, duplicates 0, invalid 2" in result.stdout
    assert "matches no known format" in result.stderr


def test_a_json_file_that_is_not_an_array_is_refused(stack: Stack, tmp_path):
    source = _write(tmp_path, "o.json", b'{"prompt": "a"}')
    _fails_cleanly(stack, ["enqueue", str(source)], "must be an array of rows")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("missing.jsonl", "no such file: missing.jsonl"),
        ("no-such-org/no-such-dataset", "cannot open dataset 'no-such-org/no-such-dataset'"),
    ],
)
def test_a_source_that_does_not_exist_is_one_clear_line(stack: Stack, source, expected):
    _fails_cleanly(stack, ["enqueue", source], expected)


def test_bad_generation_parameters_are_one_clear_line(stack: Stack, tmp_path):
    source = _write(tmp_path, "p.jsonl", b'{"prompt": "a"}\n')
    _fails_cleanly(stack, ["enqueue", str(source), "--turns", "some"], "--turns must be")
    _fails_cleanly(stack, ["enqueue", str(source), "--format", "csv"], "--format must be")


@pytest.mark.parametrize(
    ("path", "kind", "reason"),
    [("/html/v1", "disconnect", "without a finish_reason"), ("/empty/v1", "empty", "empty answer")],
)
def test_an_endpoint_answering_garbage_fails_the_sample_with_the_reason(
    stack: Stack, tmp_path, bad_endpoint, path, kind, reason
):
    stack.env["EAGLEGEN_ENDPOINTS"] = bad_endpoint + path
    stack.worker(concurrency=1, EAGLEGEN_MAX_RETRIES="2")
    stack.enqueue(_write(tmp_path, "p.jsonl", b'{"prompt": "a"}\n'))
    wait_for(lambda: stack.store.counts().failed == 1, 60, "the sample to fail")
    [failure] = stack.store.failures().values()
    assert failure.kind == kind and reason in failure.message
    assert failure.attempts == 3


def test_an_answer_cut_at_max_tokens_is_kept_and_marked_not_retried(stack: Stack, tmp_path):
    stack.simulator("--min-answer-tokens", "50", "--reasoning-tokens", "0")
    stack.worker(concurrency=2)
    stack.collector()
    stack.enqueue(
        _write(tmp_path, "p.jsonl", b'{"turns": ["a"]}\n{"turns": ["b", "c"]}\n'),
        "--max-tokens",
        "8",
    )
    stack.wait_complete()
    records = stack.lines()
    assert len(records) == 2 and stack.store.counts().retries == 0
    for record in records:
        assert record["generation"]["finish_reason"] == "length"
        assert record["generation"]["attempts"] == 1
        assert len(record["conversations"]) == 2  # a cut first turn ends the conversation
