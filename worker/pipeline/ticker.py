"""A function called every few seconds from a daemon thread: the shape of every background
job of a worker process (lease renewal, reconciliation, the log summary)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from common.loop_errors import LoopErrors, guarded


class Ticker:
    """Calls ``tick`` every ``every_s`` seconds, from ``start()`` until ``close()``; a tick
    that raises is counted in ``errors`` (logged, shown by ``status``) and the next one runs."""

    def __init__(
        self, name: str, every_s: float, tick: Callable[[], None], errors: LoopErrors | None = None
    ) -> None:
        self.name = name
        self.every_s = every_s
        self.tick = tick
        self.errors = errors if errors is not None else LoopErrors()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether ``start()`` ran."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def close(self) -> None:
        """No tick after the current one."""
        self._stop.set()

    def _run(self) -> None:
        tick = guarded(self.name, self.tick, self.errors)
        while not self._stop.wait(self.every_s):
            tick()
