"""A loopback TCP proxy in front of a real server that breaks or slows its streams on purpose.

The real vLLM server cannot be told to drop a connection mid-stream, and its tiny model
answers in a fraction of a second: this proxy sits between the workers and the server and
forwards bytes both ways, counting the server-sent events of each response. ``cut_after``:
the first ``cuts`` streamed responses are cut (both sockets closed) after that many events, as
a network cut or a server restart would; ``event_delay``: each event is held that long, so a
test has time to SIGKILL a worker mid-stream.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass


@dataclass
class ProxyConfig:
    cut_after: int = 0  # events of a stream passed before the cut (0: never cut)
    cuts: int = 0  # how many streams are cut, the first ones
    event_delay: float = 0.0  # seconds each event is held


class StreamProxy:
    """``127.0.0.1:<port>`` forwarding to ``upstream``; runs its own event loop in a thread."""

    def __init__(self, upstream_port: int, config: ProxyConfig) -> None:
        self.upstream_port = upstream_port
        self.config = config
        self.cut = 0  # streams cut so far
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StreamProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then the loop (nothing left to the GC)."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.sleep(0.1)  # the transports' close callbacks run on this loop

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self._writers.add(down_w)
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers.add(up_w)
        upward = asyncio.ensure_future(_pipe(down_r, up_w))
        try:
            await self._responses(up_r, down_w)
        except (ConnectionError, asyncio.CancelledError):
            pass  # a worker killed or the proxy stopping: the connection ends here either way
        finally:
            upward.cancel()
            for writer in (up_w, down_w):
                writer.transport.abort()  # at once: a cut is abrupt, and nothing waits to flush
                self._writers.discard(writer)

    async def _responses(self, up_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        """Forward the server's bytes, event by event; cut or slow streamed responses."""
        cfg = self.config
        events = 0  # of the response being forwarded (a keep-alive connection has several)
        cutting = False
        pending = b""
        while data := await up_r.read(65536):
            if data.startswith(b"HTTP/1.1"):
                events, pending = 0, b""
                cutting = cfg.cut_after > 0 and self.cut < cfg.cuts and b"event-stream" in data
                if cutting:
                    self.cut += 1
            pending += data
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                if b"data:" in event:
                    events += 1
                    if cfg.event_delay:
                        await asyncio.sleep(cfg.event_delay)
                down_w.write(event + b"\n\n")
                await down_w.drain()
                if cutting and events >= cfg.cut_after:
                    return  # the cut: both sockets close mid-response
            if pending and b"data:" not in pending:
                down_w.write(pending)  # headers and chunk framing pass through at once
                pending = b""
                await down_w.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass  # the other side closed: _client closes both
