"""Candidate HTTP transports for the streamed chat call, side by side: CPU per request and per
streamed token, with one event per read and with reads coalesced.

    .venv/bin/python bench/bench_transports.py [--rounds 7] [--pause 0.05]

The comparison behind worker/chat/transport.py (docs/benchmarks.md). A zero-latency simulator
streams one token per chunk (``--fast-chunk-tokens 1``, as vLLM does); each candidate sends the
same chat request on a keep-alive connection and reads the body to its end, raw (nothing
parsed: the transport's own cost) and "+parse" (each read fed to :class:`TurnStream`). CPU is
this process's ``time.process_time``; per token is (256-token answer - 2-token answer) / 254;
"reads" is how many pieces the transport handed over for a long answer. ``--pause`` waits
that long after the response headers of the long answers, so the rest of the body piles up in
the socket and socket reads coalesce (as under load); 0 (default) leaves every event in a read
of its own. urllib3 rows appear only where urllib3 is importable (it is not a dependency). The
"own chunks" row decodes the chunked framing by hand over ``http.client``'s buffered reader,
every complete chunk of a read at once: what a hand-written decoder would add; the "bare
socket" row reads to the chunked terminator with no HTTP at all: the floor.
"""

from __future__ import annotations

import argparse
import http.client
import select
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpcore2
import httpx2 as httpx

from common.models import GenParams
from common.settings import Settings
from tests.harness import Procs, start_simulator
from worker.chat.client import ChatClient, chat_body
from worker.chat.stream import TurnStream
from worker.chat.transport import Connections

try:
    import urllib3
except ImportError:  # not a dependency: measured where someone installed it
    urllib3 = None

HEADERS = {"Authorization": "Bearer EMPTY", "Content-Type": "application/json"}
PATH = "/v1/chat/completions"
Reader = Callable[[bytes, float], Iterator[bytes]]  # (body, pause) -> the body's pieces


def readers(endpoint: str) -> dict[str, Reader]:
    """Each candidate: send the request, pause after the headers, yield the body's pieces."""
    host, port = endpoint.split("//")[1].split("/")[0].split(":")
    url = f"{endpoint}/chat/completions"
    hx = httpx.Client(headers=HEADERS)
    core = httpcore2.ConnectionPool()
    conns = Connections(endpoint, HEADERS, 10, 60, 4)
    local = threading.local()

    def fresh(conn: Any) -> bool:
        """A kept connection still open (the server's keep-alive timeout may have closed it)."""
        sock = getattr(conn, "sock", conn)
        return sock is not None and not select.select([sock], [], [], 0)[0]

    def stdlib(body: bytes) -> http.client.HTTPResponse:
        conn = getattr(local, "conn", None)
        if conn is None or not fresh(conn):
            conn = local.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", PATH, body, HEADERS)
        return conn.getresponse()

    def worker_transport(body: bytes, pause: float) -> Iterator[bytes]:
        with conns.stream("POST", url, content=body) as response:
            time.sleep(pause)
            yield from response.iter_raw()

    def httpx_raw(body: bytes, pause: float) -> Iterator[bytes]:
        with hx.stream("POST", url, content=body) as response:
            time.sleep(pause)
            yield from response.iter_raw()

    def httpcore_direct(body: bytes, pause: float) -> Iterator[bytes]:
        with core.stream("POST", url, headers=HEADERS, content=body) as response:
            time.sleep(pause)
            yield from response.iter_stream()

    def stdlib_read1(body: bytes, pause: float) -> Iterator[bytes]:
        response = stdlib(body)
        time.sleep(pause)
        while data := response.read1(65536):
            yield data

    def own_chunks(body: bytes, pause: float) -> Iterator[bytes]:
        response = stdlib(body)
        time.sleep(pause)
        yield from decode_chunks(response)

    def bare_socket(body: bytes, pause: float) -> Iterator[bytes]:
        sock = getattr(local, "sock", None)
        if sock is None or not fresh(sock):
            sock = local.sock = socket.create_connection((host, int(port)))
        head = f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head.encode() + b"Content-Type: application/json\r\n\r\n" + body)
        time.sleep(pause)
        tail = b""
        while not tail.endswith(b"\r\n0\r\n\r\n"):
            data = sock.recv(65536)
            tail = (tail + data)[-7:]
            yield data

    found: dict[str, Reader] = {
        "worker.chat.transport": worker_transport,
        "httpx2 iter_raw": httpx_raw,
        "httpcore2 direct": httpcore_direct,
        "http.client read1": stdlib_read1,
        "http.client, own chunks": own_chunks,
        "bare socket (floor)": bare_socket,
    }
    if urllib3 is not None:
        pool = urllib3.HTTPConnectionPool(host, int(port), retries=False)

        def urllib3_read1(body: bytes, pause: float) -> Iterator[bytes]:
            response = pool.urlopen("POST", PATH, body=body, headers=HEADERS, preload_content=False)
            time.sleep(pause)
            while data := response.read1(65536):
                yield data
            response.release_conn()

        def urllib3_stream(body: bytes, pause: float) -> Iterator[bytes]:
            response = pool.urlopen("POST", PATH, body=body, headers=HEADERS, preload_content=False)
            time.sleep(pause)
            yield from response.stream(65536)
            response.release_conn()

        found["urllib3 read1"] = urllib3_read1
        found["urllib3 stream"] = urllib3_stream
    return found


def decode_chunks(response: http.client.HTTPResponse) -> Iterable[bytes]:
    """The chunked body decoded by hand from the buffered reader: all complete chunks of each
    read joined (trailers not supported; for measurement only)."""
    fp, pending = response.fp, b""
    while True:
        got = fp.read1(65536)
        if not got:
            raise http.client.IncompleteRead(pending)
        pending += got
        pieces, at = [], 0
        while (eol := pending.find(b"\r\n", at)) >= 0:
            size = int(pending[at:eol].split(b";", 1)[0], 16)
            if size == 0 and pending.endswith(b"\r\n\r\n", eol):
                response.fp = None  # consumed: the connection serves the next request
                yield b"".join(pieces)
                return
            if size == 0 or len(pending) < eol + 4 + size:
                break
            pieces.append(pending[eol + 2 : eol + 2 + size])
            at = eol + 4 + size
        pending = pending[at:]
        if pieces:
            yield b"".join(pieces)


def read(reader: Reader, body: bytes, pause: float, parse: bool) -> int:
    """One request read to its end; the number of pieces the transport handed over."""
    stream = TurnStream("bench") if parse else None
    pieces = 0
    for data in reader(body, pause):
        pieces += 1
        if stream is not None:
            stream.feed(data)
    assert stream is None or stream.finish_reason is not None
    return pieces


def cpu(work: Callable[[], Any], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        work()
    return (time.process_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.0)
    a = parser.parse_args()
    options = ["--time-per-token", "0", "--fast-chunk-tokens", "1", "--reasoning-tokens", "0"]
    options += ["--min-answer-tokens", "256", "--max-answer-tokens", "256"]
    with tempfile.TemporaryDirectory() as tmp, Procs(Path(tmp)) as procs:
        sim = start_simulator(procs, *options)
        model = httpx.get(f"{sim.endpoint}/models").json()["data"][0]["id"]
        candidates = readers(sim.endpoint)
        client = ChatClient(sim.endpoint, Settings(endpoints=[sim.endpoint], model=model))
        per: dict[tuple[str, str], list[float]] = {}
        pieces: dict[str, int] = {}
        for _ in range(a.rounds):
            for shape, tokens in (("short", 2), ("long", 1000)):
                params = GenParams(max_tokens=tokens)
                messages = [{"role": "user", "content": f"bench {shape}"}]
                body = chat_body(model, messages, params, True)
                n, pause = (a.requests, 0.0) if shape == "short" else (a.requests // 10, a.pause)
                for name, reader in candidates.items():
                    for parse in (False, True) if "floor" not in name else (False,):
                        side = f"{name} {'+parse' if parse else 'raw'}"
                        pieces[side] = read(reader, body, pause, parse)
                        work = lambda r=reader, p=parse, b=body, s=pause: read(r, b, s, p)  # noqa: E731
                        per.setdefault((side, shape), []).append(cpu(work, n))
                work = lambda m=messages, p=params: client.complete(m, p)  # noqa: E731
                per.setdefault(("ChatClient (never paused) +parse", shape), []).append(cpu(work, n))
        client.close()
    med = {key: statistics.median(v) for key, v in per.items()}
    print(f"{a.rounds} rounds, medians; pause after the long answers' headers {a.pause} s")
    for side in dict.fromkeys(side for side, _ in per):
        token = (med[(side, "long")] - med[(side, "short")]) / 254
        print(
            f"{side:34s} {med[(side, 'short')] * 1e3:6.3f} ms per request  "
            f"{token * 1e6:5.1f} us per token  reads {pieces.get(side, '-')}"
        )


if __name__ == "__main__":
    main()
