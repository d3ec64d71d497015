"""A loopback OpenAI-compatible server that answers wrongly on purpose; its path picks how.

``http://127.0.0.1:PORT/<case>/v1`` is an endpoint whose ``/models``, chat stream and
``/metrics`` behave as ``<case>`` says (see ``CASES``). Every other case answers a short, good
stream, so a worker pointed at ``/ok/v1`` finishes its samples. Bodies are generated as they are
sent (a 400 MB body costs the server nothing), and every trickle ends when the client leaves.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "sk-hostile-0123456789"
TEXT = ["Hello", " big", " world"]
IDS = [11, 12, 13]
PROMPT_IDS = [1, 2, 3]


def chunk(delta: dict[str, object] | None = None, **extra: object) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0, "delta": delta or {}, "finish_reason": None}
    choice.update(extra)
    return {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def good_events(ids: bool = True) -> list[bytes]:
    """A whole answer: three text chunks with their ids, a finish, usage, [DONE]."""
    events = [sse({**chunk(), "prompt_token_ids": PROMPT_IDS})] if ids else []
    for text, tid in zip(TEXT, IDS, strict=True):
        extra = {"token_ids": [tid]} if ids else {}
        events.append(sse(chunk({"content": text}, **extra)))
    events.append(sse(chunk(finish_reason="stop")))
    usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    events.append(sse({"id": "x", "choices": [], "usage": usage}))
    return [*events, b"data: [DONE]\n\n"]


def tool_call_events(calls: list[dict[str, object]]) -> list[bytes]:
    """A turn of tool calls, one fragment each, then its finish, usage and [DONE]."""
    events = [sse(chunk({"tool_calls": [call]})) for call in calls]
    events.append(sse(chunk(finish_reason="tool_calls")))
    usage = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
    events.append(sse({"id": "x", "choices": [], "usage": usage}))
    return [*events, b"data: [DONE]\n\n"]


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# Wrong shapes: one event of valid JSON that is no chat chunk, then a normal end.
SHAPES = {
    "shape-choices": b'data: {"choices":[1]}\n\n',
    "shape-content": sse(chunk({"content": 5})),
    # Too deep for the JSON scanner at the default recursion limit; a content of the wrong
    # type where a raised limit parses it.
    "shape-deep": b'data: {"choices":[{"delta":{"content":' + _nested(5000).encode() + b"}}]}\n\n",
    "shape-usage": sse({"choices": [], "usage": {"prompt_tokens": "lots"}}),
    "shape-delta": sse({"choices": [{"index": 0, "delta": [1, 2]}]}),
}


class Hostile(BaseHTTPRequestHandler):
    """Dispatches on the first path segment (the case)."""

    protocol_version = "HTTP/1.1"
    server: HostileServer

    def log_message(self, *args: object) -> None:
        pass

    @property
    def case(self) -> str:
        return self.path.split("/")[1]

    def do_GET(self) -> None:
        self.server.count(self.case, "get")
        if self.path.endswith("/metrics"):
            return self._metrics()
        if self.case == "models-null" and self.server.calls(self.case, "get") <= 3:
            return self._send(200, b"null")
        if self.case == "models-list" and self.server.calls(self.case, "get") <= 3:
            return self._send(200, b"[]")
        if self.case == "trickle-models":
            return self._trickle_head()
        if self.case == "not-http":  # a status line no HTTP client parses (BadStatusLine)
            self.close_connection = True
            self._write(b"SSH-2.0-OpenSSH\r\n\r\n")
            return None
        self._send(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        self.body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.count(self.case, "post")
        if self.case.startswith("tools-"):  # what the client sends back is the test's point
            self.server.keep(self.case, self.body)
        handler = getattr(self, "_" + self.case.replace("-", "_"), None)
        if self.case in SHAPES:
            *events, done = good_events()
            return self._stream([*events, SHAPES[self.case], done])
        if handler is None:
            return self._stream(good_events())
        handler()

    # -- cases -----------------------------------------------------------------------------
    def _trickle_500(self) -> None:
        self._head(500, {"content-type": "text/plain"})
        self._dribble(b"x" * 10_000, 0.5)

    def _trickle_head(self) -> None:
        self._dribble(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 10_000, 0.5)

    def _huge_500(self) -> None:
        size = 400 << 20
        self._head(500, {"content-type": "text/plain", "content-length": str(size)})
        block = b"e" * (1 << 20)
        for _ in range(size >> 20):
            if not self._write(block):
                return

    def _gzip_bomb(self) -> None:
        self._head(200, {"content-type": "text/event-stream", "content-encoding": "gzip"})
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        zeros = b"\0" * (1 << 20)
        if not self._chunk(packer.compress(b"data: {")):
            return
        for _ in range(4096):  # 4 GB inflated, about 4 MB on the wire
            if not self._chunk(packer.compress(zeros) + packer.flush(zlib.Z_SYNC_FLUSH)):
                return
        self._end()

    def _unterminated(self) -> None:
        self._head(200, {"content-type": "text/event-stream"})
        if not self._chunk(b'data: {"choices": "'):
            return
        block = b"a" * (1 << 16)
        for _ in range(16384):  # 1 GB, one event that never ends
            if not self._chunk(block):
                return
        self._end()

    def _ids_first_only(self) -> None:
        events = good_events()
        # Ids on the first text chunk only: "Hello big world" as [11].
        for i in (2, 3):
            events[i] = sse(chunk({"content": TEXT[i - 1]}))
        self._stream(events)

    def _ids_string(self) -> None:
        events = good_events()
        events[1] = sse(chunk({"content": TEXT[0]}, token_ids="123"))
        self._stream(events)

    def _ids_extra(self) -> None:
        events = good_events()
        events[3] = sse(chunk({"content": TEXT[2]}, token_ids=[13, 14]))  # 4 ids, usage says 3
        self._stream(events)

    def _tools_one_index(self) -> None:
        """Parallel calls as Ollama's OpenAI API and some bridges stream them: each whole, all
        at index 0 with their own ids, the second's arguments a JSON object; after the tool
        results, a text answer."""
        if json.loads(self.body)["messages"][-1]["role"] == "tool":
            return self._stream(good_events(ids=False))
        calls = [
            {"index": 0, "id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"index": 0, "id": "call_b", "type": "function",
             "function": {"name": "get_time", "arguments": {"city": "Oslo"}}},
        ]  # fmt: skip
        self._stream(tool_call_events(calls))

    def _tool_id_int(self) -> None:
        # A call whose id is a number (the source calls get_weather, so the call matches).
        call = {
            "index": 0,
            "id": 7,
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
        events = [sse(chunk({"tool_calls": [call]})), sse(chunk(finish_reason="tool_calls"))]
        usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        events.append(sse({"id": "x", "choices": [], "usage": usage}))
        self._stream([*events, b"data: [DONE]\n\n"])

    def _completion_choices(self) -> None:
        # A capture server's completion (JSON, not a stream) whose choices are not objects.
        self._send(200, b'{"choices": [1]}')

    def _secret_500(self) -> None:
        quoted = f"bad request headers: Authorization: Bearer {SECRET}; retry later"
        body = json.dumps({"error": {"message": quoted, "code": 500}}).encode()
        self._send(500, body)

    def _secret_event(self) -> None:
        error = {"error": {"message": f"engine died; header was Bearer {SECRET}"}}
        self._stream([sse(error)])

    def _route_404(self) -> None:
        # A server (or a proxy) without the chat route: FastAPI's body, as vLLM sends it.
        self._send(404, b'{"detail":"Not Found"}')

    def _silent(self) -> None:
        self._hold(60.0)  # not a byte: a request queued behind others

    def _open_after_done(self) -> None:
        self._head(200, {"content-type": "text/event-stream"})
        for event in good_events():
            if not self._chunk(event):
                return
        self._hold(60.0)  # the body never ends: no last chunk

    # -- writing -----------------------------------------------------------------------------
    def _metrics(self) -> None:
        if self.case == "trickle-metrics":
            self._head(200, {"content-type": "text/plain"})
            self._dribble(b"# " + b"z" * 10_000, 0.5, chunked=True)
            return
        body = b"vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 5\n"
        self._send(200, body, "text/plain")

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self._head(status, {"content-type": kind, "content-length": str(len(body))})
        self._write(body)

    def _stream(self, events: list[bytes]) -> None:
        self._head(200, {"content-type": "text/event-stream"})
        for event in events:
            if not self._chunk(event):
                return
        self._end()

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if "content-length" not in headers:
            self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> bool:
        return not data or self._write(b"%x\r\n%s\r\n" % (len(data), data))

    def _end(self) -> None:
        self._write(b"0\r\n\r\n")

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:  # the client left
            self.close_connection = True
            return False

    def _dribble(self, data: bytes, every: float, chunked: bool = False) -> None:
        for i in range(len(data)):
            piece = data[i : i + 1]
            if not (self._chunk(piece) if chunked else self._write(piece)):
                return
            if self.server.stopping.wait(every):
                return
        self.close_connection = True

    def _hold(self, seconds: float) -> None:
        self.server.stopping.wait(seconds)
        self.close_connection = True


class HostileServer(ThreadingHTTPServer):
    """The server, counting requests per case and method."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Hostile)
        self.stopping = threading.Event()
        self._counts: dict[tuple[str, str], int] = {}
        self._bodies: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def endpoint(self, case: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{case}/v1"

    def count(self, case: str, method: str) -> None:
        with self._lock:
            self._counts[case, method] = self._counts.get((case, method), 0) + 1

    def keep(self, case: str, body: bytes) -> None:
        with self._lock:
            self._bodies.setdefault(case, []).append(body)

    def bodies(self, case: str) -> list[dict[str, object]]:
        """The request bodies a case was sent, in order."""
        with self._lock:
            return [json.loads(b) for b in self._bodies.get(case, [])]

    def calls(self, case: str, method: str) -> int:
        with self._lock:
            return self._counts.get((case, method), 0)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()


def serve() -> Iterator[HostileServer]:
    server = HostileServer()
    try:
        yield server
    finally:
        server.close()


def peak_rss_mb(pid: int) -> tuple[float, float]:
    """(RSS now, peak RSS) of a process, in MB, from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def elapsed(since: float) -> float:
    return round(time.monotonic() - since, 1)
