"""HTTP/1.1 to one OpenAI-compatible endpoint: keep-alive connections shared by threads.

The chat client's transport, on the standard library's ``http.client``. vLLM streams one token
per server-sent event and each event is one HTTP chunk; httpx's HTTP layer (h11) parses each
chunk in Python before any of ours, ``http.client`` decodes one in a few C-level reads
(``HTTPResponse.read1``). bench/bench_client.py compares the two.

What it keeps from httpx: one keep-alive connection per concurrent stream (idle ones are
reused last-in first-out, and one the server has closed is noticed before reuse), a connect
timeout and a read timeout (no byte for N seconds: the stall timeout), TLS verified against the
same CA store (``SSL_CERT_FILE`` included), fixed headers on every request. Failures are raised
as the exceptions below, by phase; ``worker.chat.client.translate_errors`` maps them to EagleGen's.
Proxies are not supported (httpx honoured ``HTTP_PROXY``); no redirects are followed (neither
did httpx by default).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx2

# Big enough for any burst of events: read1 returns what one HTTP chunk holds anyway.
_READ = 65536


class TransportError(Exception):
    """A failure talking HTTP to the endpoint."""


class ConnectFailed(TransportError):
    """No connection: refused, unreachable, name not resolved, TLS handshake refused."""


class ConnectTimeout(TransportError):
    """Connecting (or sending the request) took longer than its timeout."""


class ReadTimeout(TransportError):
    """No byte of the response within the read (stall) timeout."""


class Dropped(TransportError):
    """The connection closed, or the HTTP framing broke, before the response ended."""


class Response:
    """One response: status, headers, and its body read as it arrives."""

    def __init__(self, raw: http.client.HTTPResponse) -> None:
        self._raw = raw
        self.status_code = raw.status
        self.headers = raw.headers
        self.complete = False  # the body was read to its end: the connection can be reused

    def iter_raw(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (chunked framing removed), to its end."""
        decoder = _decoder(self.headers.get("content-encoding"))
        read = self._raw.read1
        with _reading():
            while data := read(_READ):
                yield decoder.decompress(data) if decoder else data
            if self._raw.length:  # read1 ends a Content-Length body cut short without a word
                raise http.client.IncompleteRead(b"", self._raw.length)
        self._raw.close()
        self.complete = True
        if decoder:
            yield decoder.flush()

    # httpx's name for the decoded body: the same here, a gzip/deflate body is always decoded.
    iter_bytes = iter_raw

    def read(self) -> bytes:
        """The whole body."""
        return b"".join(self.iter_raw())


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
        # The CA store httpx used (the system's, or SSL_CERT_FILE / SSL_CERT_DIR).
        self._tls = httpx2.create_ssl_context() if self._https else None
        self._headers = headers
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def stream(
        self, method: str, url: str, content: bytes | None = None, timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Iterator[Response]:  # fmt: skip
        """Send a request; the response is read inside the block.

        The connection goes back to the pool if the body was read to its end, else it is
        closed (an unread body would be read by the next request).
        """
        conn = self._acquire(timeout)
        response = None
        try:
            sent = {**self._headers, **headers} if headers else self._headers
            response = Response(self._send(conn, method, urlsplit(url).path, content, sent))
            yield response
        finally:
            # A body read to its end leaves the connection clean, even when the caller then
            # raised (an error status); no socket left means the server said close.
            if response is not None and response.complete and conn.sock is not None:
                self._release(conn)
            else:
                conn.close()

    def get(self, url: str, timeout: float | None = None) -> tuple[int, bytes]:
        """A GET's status and whole body."""
        with self.stream("GET", url, timeout=timeout) as response:
            return response.status_code, response.read()

    def close(self) -> None:
        """Close the idle connections; those in use close when their response ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _send(
        self, conn: http.client.HTTPConnection, method: str, path: str, content: bytes | None,
        headers: dict[str, str],
    ) -> http.client.HTTPResponse:  # fmt: skip
        try:
            conn.request(method, path, content, headers)
        except TimeoutError as exc:
            raise ConnectTimeout(f"timed out sending the request: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise Dropped(f"sending the request: {exc!r}") from exc
        with _reading():
            return conn.getresponse()

    def _acquire(self, timeout: float | None) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not _dropped(conn):
                    conn.sock.settimeout(timeout or self._read_timeout)
                    return conn
                conn.close()
        return self._connect(timeout)

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        limit = min(timeout, self._connect_timeout) if timeout else self._connect_timeout
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


@contextmanager
def _reading() -> Iterator[None]:
    """Failures while waiting for or reading a response, by kind."""
    try:
        yield
    except TimeoutError as exc:  # socket.timeout: no byte within the read timeout
        raise ReadTimeout(str(exc) or "timed out") from exc
    except ssl.SSLError as exc:
        raise Dropped(f"TLS: {exc}") from exc
    except zlib.error as exc:  # a compressed body that does not decompress
        raise ValueError(f"undecodable body: {exc}") from exc
    except (OSError, http.client.HTTPException) as exc:  # reset, IncompleteRead, bad framing
        raise Dropped(repr(exc)) from exc


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
