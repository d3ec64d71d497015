"""Admission to the simulated server: vLLM's running batch and its FIFO waiting queue."""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    """FIFO admission of at most `capacity` concurrent sequences; capacity may change live."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.peak = 0
        self._queue: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Number of requests queued for a slot."""
        return len(self._queue)

    async def acquire(self) -> None:
        """Wait (FIFO) until a slot is free, then take it."""
        if not self._queue and self.running < self.capacity:
            self._take()
            return
        ticket = asyncio.get_running_loop().create_future()
        self._queue.append(ticket)
        try:
            await ticket
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise

    def release(self) -> None:
        """Give a slot back and admit the next waiters that now fit."""
        self.running -= 1
        self._admit()

    def resize(self, capacity: int) -> None:
        """Change capacity; running sequences keep their slots when it shrinks."""
        self.capacity = capacity
        self._admit()

    def _take(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)

    def _admit(self) -> None:
        while self._queue and self.running < self.capacity:
            ticket = self._queue.popleft()
            if not ticket.done():  # a cancelled waiter may still sit in the queue
                ticket.set_result(None)
                self._take()

    def _abandon(self, ticket: asyncio.Future[None]) -> None:
        if ticket in self._queue:
            self._queue.remove(ticket)
        elif ticket.done() and not ticket.cancelled():
            # The slot was granted just as the waiter was cancelled: hand it on.
            self.release()
