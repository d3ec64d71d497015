"""Exceptions that background loops survived, counted for ``status``.

A background loop (the reconciler, lease renewal, heartbeat, clock watch, the endpoints' and
capture's loops) must outlive any one failing turn: a garbled value in Redis or a defect that
raises once would otherwise end its thread for the life of the process, silently (with the
reconciler's, a lost sample is never re-published). Each loop catches what its turn raises,
logs the first exception of each type with its traceback, and counts every one here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from common.keys import loop_errors_key
from common.logs import secrets_of
from common.redact import redact
from common.settings import Settings

log = logging.getLogger("eaglegen.loops")
LAST_CHARS = 300


class LoopErrors:
    """Counts survived exceptions per loop, in this process and (if given) in Redis."""

    def __init__(
        self, client: redis.Redis | None = None, prefix: str = "eaglegen",
        secrets: list[str] | None = None,
    ) -> None:  # fmt: skip
        self.r = client
        self.key = loop_errors_key(prefix)
        self.secrets = secrets or []
        self.counts: dict[str, int] = {}
        self._logged: set[tuple[str, type[BaseException]]] = set()
        self._lock = threading.Lock()

    @classmethod
    def of(cls, client: redis.Redis, settings: Settings) -> LoopErrors:
        """The counter of one process's loops, published under ``settings``' prefix."""
        return cls(client, settings.key_prefix, secrets_of(settings))

    def survived(self, loop: str, exc: Exception) -> None:
        """One turn of ``loop`` raised ``exc``; the loop goes on (never raises)."""
        with self._lock:
            self.counts[loop] = self.counts.get(loop, 0) + 1
            first = (loop, type(exc)) not in self._logged
            self._logged.add((loop, type(exc)))
        if first:  # once per loop and type: a loop failing every second must not flood the log
            log.error("background loop %s survived an exception; it goes on", loop,
                      exc_info=exc)  # fmt: skip
        self._publish(loop, exc)

    def _publish(self, loop: str, exc: Exception) -> None:
        if self.r is None:
            return
        line = " ".join(redact(f"{type(exc).__name__}: {exc}", self.secrets).split())
        try:
            pipe = self.r.pipeline(transaction=False)
            pipe.hincrby(self.key, loop, 1)
            pipe.hset(self.key, f"{loop}:last", line[:LAST_CHARS])
            pipe.execute()
        except redis.RedisError:
            pass  # counted here and logged; Redis being away is what the loops wait out


def guarded(loop: str, turn: Callable[[], None], errors: LoopErrors) -> Callable[[], None]:
    """``turn``, made to return whatever it raises (an ``Exception``), counted in ``errors``."""

    def run() -> None:
        try:
            turn()
        except Exception as exc:  # the loop's next turn may succeed: it must get one
            errors.survived(loop, exc)

    return run


def restarted(
    loop: str, body: Callable[[], None], errors: LoopErrors, stop: threading.Event,
    pause_s: float = 1.0,
) -> Callable[[], None]:  # fmt: skip
    """``body`` (a loop that returns once ``stop`` is set), run again ``pause_s`` after any
    exception it raises, counted in ``errors``."""

    def run() -> None:
        while not stop.is_set():
            try:
                body()
                return
            except Exception as exc:  # its thread is the loop's only one: it must go on
                errors.survived(loop, exc)
                stop.wait(pause_s)

    return run


def read_loop_errors(client: redis.Redis, prefix: str) -> dict[str, dict[str, object]]:
    """Loop name -> {"count", "last"}: what ``status`` shows (empty: none ever survived)."""
    raw = {str(k): str(v) for k, v in client.hgetall(loop_errors_key(prefix)).items()}
    return {
        name: {"count": int(value), "last": raw.get(f"{name}:last", "")}
        for name, value in raw.items()
        if not name.endswith(":last")
    }
