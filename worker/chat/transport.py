"""HTTP/1.1 to one OpenAI-compatible endpoint: keep-alive connections shared by threads.

The chat client's transport, on the standard library's ``http.client``. vLLM streams one token
per server-sent event and each event is one HTTP chunk; httpx's HTTP layer (h11) parses each
chunk in Python before any of ours, ``http.client`` decodes one in a few C-level reads
(``HTTPResponse.read1``). bench/bench_client.py compares the two.

The one HTTP stack of EagleGen: chat streams, ``/models``, probes and every ``/metrics`` read
(adaptive caps, prefix-cache figures, ``status``). One keep-alive connection per concurrent
stream (idle ones are reused last-in first-out, and one the server has closed is noticed before
reuse), a connect timeout, a read timeout (no byte for N seconds: the stall timeout), and one
deadline per request over connect, response head and body together: a watchdog thread shuts
the socket of a request past it, so a head or body trickled a byte at a time, or a flood of 1xx
responses, cannot hold a call past its deadline. Bodies read whole are capped; a compressed
body is inflated at most ``_INFLATE`` bytes per step. TLS is verified against the system CAs
(``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` honoured by OpenSSL). Failures are raised as the
exceptions below, by phase; ``worker.chat.client.translate_errors`` maps them to EagleGen's.
Proxies are not supported; no redirects are followed.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import math
import select
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

# Big enough for any burst of events: read1 returns what one HTTP chunk holds anyway.
_READ = 65536
# A compressed body is inflated this much at most per step: a bomb costs no more memory.
_INFLATE = 1 << 20
# How often a request waiting for its response head runs its check (a lost lease, a drain).
_CHECK_EVERY = 1.0


class TransportError(Exception):
    """A failure talking HTTP to the endpoint."""


class ConnectFailed(TransportError):
    """No connection: refused, unreachable, name not resolved, TLS handshake refused."""


class ConnectTimeout(TransportError):
    """Connecting (or sending the request) took longer than its timeout."""


class ReadTimeout(TransportError):
    """No byte of the response within the read (stall) timeout."""


class DeadlineExceeded(TransportError):
    """The request as a whole (connect, head and body) ran past its deadline."""


class Dropped(TransportError):
    """The connection closed, or the HTTP framing broke, before the response ended."""


class BodyTooLarge(ValueError):
    """A body read whole was longer than its cap: not an answer of an OpenAI server."""


class _Watch:
    """One request's deadline, watched by :class:`_Watchdog`."""

    __slots__ = ("deadline", "fired", "sock")

    def __init__(self, deadline: float, sock: socket.socket | None) -> None:
        self.deadline = deadline
        self.sock = sock
        self.fired = False


class _Watchdog:
    """One thread that shuts the socket of every request past its deadline.

    A blocked ``recv`` then returns, whatever ``http.client`` was reading (a head, a chunk
    header, a 1xx flood): socket timeouts alone bound one read, not a request.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._ended = 0

    def watch(self, deadline: float, sock: socket.socket | None) -> _Watch:
        entry = _Watch(deadline, sock)
        self.move(entry, deadline)
        return entry

    def move(self, entry: _Watch, deadline: float) -> None:
        """Set ``entry``'s deadline (earlier or later); the old heap item is then stale."""
        with self._cond:
            entry.deadline = deadline
            heapq.heappush(self._heap, (deadline, next(self._order), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadlines")
                self._thread.daemon = True
                self._thread.start()
            if self._heap[0][2] is entry:
                self._cond.notify()

    def done(self, entry: _Watch) -> None:
        """The request ended: its heap item is dropped when it comes due, or at a compaction
        (a turn's deadline is an hour away; thousands of short requests end before it)."""
        with self._cond:
            entry.sock = None
            self._ended += 1
            if self._ended > 1024 and self._ended * 2 > len(self._heap):
                self._heap = [item for item in self._heap if item[2].sock is not None]
                heapq.heapify(self._heap)
                self._ended = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                due, _, entry = heapq.heappop(self._heap)
                sock = entry.sock if entry.deadline == due else None
                if sock is not None:
                    entry.fired = True
            if sock is not None:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()  # its thread starts with the first request, not at import


class Response:
    """One response: status, headers, and its body read as it arrives."""

    def __init__(self, raw: http.client.HTTPResponse, watch: _Watch) -> None:
        self._raw = raw
        self._watch = watch
        self.status_code = raw.status
        self.headers = raw.headers
        self.complete = False  # the body was read to its end: the connection can be reused

    def iter_raw(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (chunked framing removed), to its end."""
        decoder = _decoder(self.headers.get("content-encoding"))
        read = self._raw.read1
        with _reading(self._watch):
            while data := read(_READ):
                if decoder is None:
                    yield data
                else:
                    yield from _inflate(decoder, data)
            if self._raw.length:  # read1 ends a Content-Length body cut short without a word
                raise http.client.IncompleteRead(b"", self._raw.length)
        if self._watch.fired:  # the watchdog's shutdown reads as an end of the body
            raise DeadlineExceeded("the request ran past its deadline")
        self._raw.close()
        self.complete = True
        if decoder:
            yield decoder.flush()

    # httpx's name for the decoded body: the same here, a gzip/deflate body is always decoded.
    iter_bytes = iter_raw

    def read(self, limit: int) -> bytes:
        """The whole body; :class:`BodyTooLarge` past ``limit`` bytes (then not read on)."""
        parts: list[bytes] = []
        size = 0
        for data in self.iter_raw():
            size += len(data)
            if size > limit:
                raise BodyTooLarge(f"a body over {limit} bytes")
            parts.append(data)
        return b"".join(parts)

    def head_of(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (an error's message); never raises on a body
        that breaks, stalls or runs past its deadline: what had arrived is returned."""
        parts: list[bytes] = []
        size = 0
        try:
            for data in self.iter_raw():
                parts.append(data)
                size += len(data)
                if size >= limit:
                    break
        except (TransportError, ValueError):
            pass
        return b"".join(parts)[:limit]

    def limit(self, seconds: float) -> None:
        """From now on, this much time at most for the rest of the body."""
        deadline = time.monotonic() + seconds
        if deadline < self._watch.deadline and self._watch.sock is not None:
            _WATCHDOG.move(self._watch, deadline)


class Connections:
    """Keep-alive connections to one endpoint; safe to share across threads."""

    def __init__(
        self,
        endpoint: str,
        headers: dict[str, str],
        connect_timeout: float,
        read_timeout: float,
        max_idle: int,
    ) -> None:
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {endpoint}")
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        # The system CAs, or SSL_CERT_FILE / SSL_CERT_DIR (read by OpenSSL's default paths).
        self._tls = ssl.create_default_context() if self._https else None
        self._headers = headers
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def stream(
        self,
        method: str,
        url: str,
        content: bytes | None = None,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        check: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Iterator[Response]:
        """Send a request; the response is read inside the block, all of it by ``deadline``
        (``time.monotonic()``; None: each read has its timeout, the whole none, as for a
        benchmark). ``timeout``: per read, instead of the read (stall) timeout;
        ``check`` runs every second while the response head is awaited, and may raise;
        ``headers`` go with the transport's own (a request id, say).

        The connection goes back to the pool if the body was read to its end, else it is
        closed (an unread body would be read by the next request).
        """
        conn = self._acquire(timeout, deadline or math.inf)
        watch = _WATCHDOG.watch(deadline, conn.sock) if deadline else _Watch(math.inf, None)
        response = None
        try:
            sent = {**self._headers, **headers} if headers else self._headers
            raw = self._send(conn, method, urlsplit(url).path, content, sent, watch, check)
            response = Response(raw, watch)
            yield response
        finally:
            if watch.sock is not None:
                _WATCHDOG.done(watch)
            # A body read to its end leaves the connection clean, even when the caller then
            # raised (an error status); no socket left means the server said close.
            if response is not None and response.complete and conn.sock is not None:
                self._release(conn)
            else:
                conn.close()

    def get(self, url: str, timeout: float, limit: int) -> tuple[int, bytes]:
        """A GET's status and whole body (at most ``limit`` bytes), all within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.stream("GET", url, timeout=timeout, deadline=deadline) as response:
            if response.status_code != 200:
                return response.status_code, response.head_of(min(limit, ERROR_BODY))
            return response.status_code, response.read(limit)

    def post(self, url: str, content: bytes, timeout: float, limit: int) -> tuple[int, bytes]:
        """A POST's status and the first ``limit`` bytes of its body, all within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.stream("POST", url, content=content, timeout=timeout, deadline=deadline) as r:
            return r.status_code, r.head_of(limit)

    def close(self) -> None:
        """Close the idle connections; those in use close when their response ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _send(
        self, conn: http.client.HTTPConnection, method: str, path: str, content: bytes | None,
        headers: dict[str, str], watch: _Watch, check: Callable[[], None] | None,
    ) -> http.client.HTTPResponse:  # fmt: skip
        with _reading(watch):
            try:
                conn.request(method, path, content, headers)
            except TimeoutError as exc:
                raise ConnectTimeout(f"timed out sending the request: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise Dropped(f"sending the request: {exc!r}") from exc
            if check is not None:
                _await_head(conn, check, self._read_timeout)
            response = conn.getresponse()
        if watch.fired:  # the shutdown reads as the end of the head: headers cut short
            raise DeadlineExceeded("the request ran past its deadline")
        return response

    def _acquire(self, timeout: float | None, deadline: float) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not _dropped(conn):
                    conn.sock.settimeout(timeout or self._read_timeout)
                    return conn
                conn.close()
        return self._connect(timeout, deadline)

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, timeout: float | None, deadline: float) -> http.client.HTTPConnection:
        limit = min(timeout or self._connect_timeout, self._connect_timeout)
        limit = max(min(limit, deadline - time.monotonic()), 0.001)
        conn: http.client.HTTPConnection
        if self._tls is not None:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=limit, context=self._tls
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=limit)
        try:
            conn.connect()
        except TimeoutError as exc:
            conn.close()
            raise ConnectTimeout(f"timed out connecting: {exc}") from exc
        except OSError as exc:  # refused, unreachable, DNS (socket.gaierror), ssl.SSLError
            conn.close()
            raise ConnectFailed(str(exc) or repr(exc)) from exc
        conn.sock.settimeout(timeout or self._read_timeout)
        return conn


# An error body is kept up to this much for its message; the rest is not read.
ERROR_BODY = 8192


def _await_head(conn: http.client.HTTPConnection, check: Callable[[], None], stall: float) -> None:
    """Wait for the first byte of the response, running ``check`` every second meanwhile."""
    sock: socket.socket = conn.sock
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    waited = 0.0
    while not poller.poll(_CHECK_EVERY * 1000):
        check()
        waited += _CHECK_EVERY
        if waited >= stall:
            raise TimeoutError("no response head within the stall timeout")


@contextmanager
def _reading(watch: _Watch) -> Iterator[None]:
    """Failures while waiting for or reading a response, by kind."""
    try:
        yield
    except TransportError as exc:
        if watch.fired:
            raise DeadlineExceeded("the request ran past its deadline") from exc
        raise
    except TimeoutError as exc:  # socket.timeout: no byte within the read timeout
        if watch.fired:
            raise DeadlineExceeded("the request ran past its deadline") from exc
        raise ReadTimeout(str(exc) or "timed out") from exc
    except ssl.SSLError as exc:
        raise _dropped_or_late(watch, f"TLS: {exc}") from exc
    except zlib.error as exc:  # a compressed body that does not decompress
        raise ValueError(f"undecodable body: {exc}") from exc
    except (OSError, http.client.HTTPException) as exc:  # reset, IncompleteRead, bad framing
        raise _dropped_or_late(watch, repr(exc)) from exc


def _dropped_or_late(watch: _Watch, what: str) -> TransportError:
    # The watchdog's shutdown looks like a dropped connection to the reader.
    if watch.fired:
        return DeadlineExceeded("the request ran past its deadline")
    return Dropped(what)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle connection that is closed or has bytes waiting (the server's FIN): unusable."""
    sock: socket.socket | None = conn.sock
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()  # not select(): it fails on descriptors past 1023
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _decoder(encoding: str | None) -> Any:
    """A decompressor for a gzip/deflate body (a proxy's doing: requests ask for identity)."""
    if not encoding or encoding == "identity":
        return None
    if encoding in ("gzip", "deflate"):
        return zlib.decompressobj(zlib.MAX_WBITS | 32)  # either header, detected
    raise ValueError(f"unsupported content-encoding {encoding!r}")


def _inflate(decoder: Any, data: bytes) -> Iterator[bytes]:
    """``data`` inflated in steps of at most ``_INFLATE`` bytes."""
    out = decoder.decompress(data, _INFLATE)
    while True:
        if out:
            yield out
        if not decoder.unconsumed_tail:
            return
        out = decoder.decompress(decoder.unconsumed_tail, _INFLATE)
