"""ASGI delivery of a job: streamed as server-sent events or sent as one object."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from simulator.bodies import full_body, stream_batch, stream_opening, stream_tail
from simulator.faults import MID_STREAM_FAULTS
from simulator.generation import SimulatedDisconnect, generate
from simulator.jobs import Job, Piece
from simulator.state import SimState

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


class JobResponse(Response):
    """Runs one job's body and cancels it as soon as the client disconnects."""

    def __init__(
        self, body: Callable[[Send], Awaitable[None]],
        running: dict[str, asyncio.Event] | None = None, request_id: str = "",
        stop: asyncio.Event | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self._body = body
        self._running = running if running is not None else {}
        self._request_id = request_id
        self._stop = stop if stop is not None else asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Race the body against a client disconnect; re-raise a simulated disconnect.

        While it runs, its stop is in ``running`` under its request id: an abort sets it, and
        the body ends the answer as vLLM ends an aborted one."""
        work = asyncio.ensure_future(self._body(send))
        gone = asyncio.ensure_future(_client_gone(receive))
        self._running[self._request_id] = self._stop
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self._running.get(self._request_id) is self._stop:
                del self._running[self._request_id]
            work.cancel()
            gone.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
        if not work.cancelled():
            work.result()  # a SimulatedDisconnect propagates so uvicorn drops the connection


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _start(status: int, headers: Mapping[str, str]) -> dict[str, Any]:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": raw}


def _body(data: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def stream_job(state: SimState, job: Job, send: Send) -> None:
    """Send a job as server-sent events, as vLLM does for stream=true.

    The generation runs apart from the sending, as vLLM's engine runs apart from its API
    server: a client that does not read (paused) holds up only its own stream, and an abort
    stops the generation at once; what was generated is then sent, with the end of an
    aborted answer, once the client reads again."""
    await send(_start(200, {**SSE_HEADERS, "x-sim-key": job.key}))
    batches: asyncio.Queue[list[Piece] | None] = asyncio.Queue()
    producer = asyncio.ensure_future(_produce(state, job, batches))
    opening, sent = stream_opening(job), 0
    try:
        while (batch := await batches.get()) is not None:
            ids = job.ids_of(sent, sent + len(batch))
            finish = _last(job, sent + len(batch))
            data = stream_batch(job, batch, ids, sent == 0, finish)
            await send(_body(opening + data, more=True))
            opening, sent = b"", sent + len(batch)
        await producer  # a simulated fault drops the connection here
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
    ended = _ended(job, sent)
    finished = sent > 0 and _last(job, sent) is not None
    await send(_body(opening + stream_tail(ended, sent == 0, finished), more=False))


def _last(job: Job, sent: int) -> str | None:
    """The finish reason if the first ``sent`` pieces are all the job generates, else None."""
    if sent < len(job.pieces) or job.fault in MID_STREAM_FAULTS:
        return None
    return job.output.finish_reason


async def _produce(state: SimState, job: Job, batches: asyncio.Queue[list[Piece] | None]) -> None:
    """Generate the job's batches into ``batches``; None once it ended, however it ended."""
    try:
        async with contextlib.aclosing(generate(state, job)) as generated:
            async for batch in generated:
                batches.put_nowait(batch)
    finally:
        batches.put_nowait(None)


def _ended(job: Job, sent: int) -> Job:
    """The job as it ended: whole, or what an abort left of it."""
    return job.aborted(sent) if job.stop.is_set() and sent < len(job.pieces) else job


async def respond_job(state: SimState, job: Job, send: Send) -> None:
    """Send a job as one response object, as vLLM does for stream=false."""
    headers = {"content-type": "application/json", "x-sim-key": job.key}
    sent = 0
    try:
        async with contextlib.aclosing(generate(state, job)) as batches:
            async for batch in batches:
                sent += len(batch)
    except SimulatedDisconnect:
        # Start the response first, so dropping the connection is a broken response
        # rather than the clean 500 uvicorn would send for an unstarted one.
        await send(_start(200, headers))
        raise
    payload = json.dumps(full_body(_ended(job, sent)), ensure_ascii=False).encode()
    await send(_start(200, {**headers, "content-length": str(len(payload))}))
    await send(_body(payload, more=False))
