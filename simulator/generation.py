"""One generation: a slot, the time to first token, paced tokens, then the planned ending."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

from simulator.faults import MID_STREAM_FAULTS, Fault
from simulator.jobs import Job, Piece, batch_pieces
from simulator.state import EndEvent, SimState


class SimulatedDisconnect(Exception):
    """Raised inside a response so that uvicorn drops the connection mid-answer."""


async def generate(state: SimState, job: Job) -> AsyncGenerator[list[Piece]]:
    """Yield the job's token batches while holding a slot; always release it and log the end."""
    await state.slots.acquire()
    uncached = state.on_start(job)
    event: EndEvent = "aborted"  # what a cancellation (client gone) leaves in place
    sent = 0
    try:
        await _pause(state.cfg.ttft + uncached * state.cfg.prefill_time_per_token)
        pieces = job.pieces[: job.cut] if job.fault in MID_STREAM_FAULTS else job.pieces
        async for batch in _paced(pieces, state.cfg.time_per_token, state.cfg.fast_chunk_tokens):
            sent += len(batch)
            state.on_tokens(len(batch))
            yield batch
        if job.fault is Fault.STALL:
            event = "stalled"
            await _stall(state)
            raise SimulatedDisconnect("stall over")
        if job.fault is Fault.DISCONNECT:
            event = "disconnected"
            raise SimulatedDisconnect("simulated disconnect")
        event = "completed"
    finally:
        state.slots.release()
        state.on_end(job, event, sent)


async def _paced(
    pieces: list[Piece], time_per_token: float, fast_chunk: int
) -> AsyncIterator[list[Piece]]:
    if time_per_token <= 0:
        # No pacing: tokens go out ``fast_chunk`` at a time (1 streams like vLLM, one a chunk).
        for batch in batch_pieces(pieces, fast_chunk):
            yield batch
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(pieces, start=1):
        # Sleep to an absolute schedule so per-sleep overhead does not accumulate.
        await asyncio.sleep(max(0.0, start + i * time_per_token - loop.time()))
        yield [piece]


async def _pause(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)


async def _stall(state: SimState) -> None:
    # Ends on server shutdown too; a client disconnect cancels the whole task instead.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(state.stopping.wait(), state.cfg.stall_seconds)
