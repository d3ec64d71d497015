"""A stop flag that a signal handler may set: no lock is taken to set it.

``threading.Event.set`` takes the Event's lock, which a thread waiting on the Event holds for a
few instructions on each wake-up; a handler runs in the main thread, so a signal landing there
waits for a lock its own thread holds, for ever (a collector hung so on SIGTERM). Here the
handler sets a plain attribute and writes a byte down a pipe; waiters poll the pipe, which
stays readable once written, so every wait after the stop returns at once.
"""

from __future__ import annotations

import contextlib
import os
import select
from typing import Protocol


class Stop(Protocol):
    """What a loop reads of its stop request (``threading.Event`` fits too)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopFlag:
    """Set once, from a signal handler or any thread; waited on by any thread."""

    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def set(self) -> None:
        """Ask to stop; safe in a signal handler (a store and one non-blocking write)."""
        self._set = True
        with contextlib.suppress(BlockingIOError):  # a full pipe is readable already
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        """Whether a stop was asked for."""
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Until a stop is asked for or ``timeout`` s pass; whether one was."""
        if not self._set:
            # A signal in select() runs its handler and select() goes on (PEP 475) with the
            # pipe now readable; one before select() leaves it readable already.
            select.select([self._read], [], [], timeout)
        return self._set
