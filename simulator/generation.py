"""One generation: a slot, the time to first token, paced tokens, then the planned ending."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any

from simulator.faults import MID_STREAM_FAULTS, Fault
from simulator.jobs import Job, Piece, batch_pieces
from simulator.state import EndEvent, SimState


class SimulatedDisconnect(Exception):
    """Raised inside a response so that uvicorn drops the connection mid-answer."""


async def generate(state: SimState, job: Job) -> AsyncGenerator[list[Piece]]:
    """Yield the job's token batches while holding a slot; always release it and log the end.

    An abort (``job.stop``) ends it before its next token, without an error: the response
    then ends as vLLM ends an aborted request (simulator/delivery.py)."""
    if not await _until(job.stop, state.slots.acquire()):
        state.abort_requested.discard(job.request_id)  # aborted waiting: nothing generated
        return
    uncached = state.on_start(job)
    event: EndEvent = "aborted"  # what a cancellation (client gone) or an abort leaves
    sent = 0
    try:
        ttft = state.cfg.ttft + uncached * state.cfg.prefill_time_per_token
        if not await _until(job.stop, asyncio.sleep(ttft)):
            return
        pieces = job.pieces[: job.cut] if job.fault in MID_STREAM_FAULTS else job.pieces
        paced = _paced(pieces, state.cfg.time_per_token, state.cfg.fast_chunk_tokens, job.stop)
        async for batch in paced:
            sent += len(batch)
            state.on_tokens(len(batch))
            yield batch
        if job.stop.is_set() and sent < len(pieces):
            return  # aborted
        if job.fault is Fault.STALL:
            if not await _until(job.stop, _stall(state)):
                return  # aborted while it stalled: it ends as an abort
            event = "stalled"
            raise SimulatedDisconnect("stall over")
        if job.fault is Fault.DISCONNECT:
            event = "disconnected"
            raise SimulatedDisconnect("simulated disconnect")
        event = "completed"
    finally:
        state.slots.release()
        state.on_end(job, event, sent)


async def _paced(
    pieces: list[Piece], time_per_token: float, fast_chunk: int, stop: asyncio.Event
) -> AsyncIterator[list[Piece]]:
    if time_per_token <= 0:
        # No pacing: tokens go out ``fast_chunk`` at a time (1 streams like vLLM, one a chunk).
        for batch in batch_pieces(pieces, fast_chunk):
            if stop.is_set():
                return
            yield batch
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(pieces, start=1):
        # Sleep to an absolute schedule so per-sleep overhead does not accumulate.
        if not await _until(
            stop, asyncio.sleep(max(0.0, start + i * time_per_token - loop.time()))
        ):
            return
        yield [piece]


async def _until(stop: asyncio.Event, step: Coroutine[Any, Any, None]) -> bool:
    """Run ``step`` unless ``stop`` is set first (then it is cancelled); whether it ran."""
    if stop.is_set():
        step.close()
        return False
    work = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    return work.done() and not work.cancelled()


async def _stall(state: SimState) -> None:
    # Ends on server shutdown too; a client disconnect cancels the whole task instead.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(state.stopping.wait(), state.cfg.stall_seconds)
