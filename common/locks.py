"""Redis locks held by one process of the cluster: the collector's, adaptive caps', the
reconciler's. redis-py's ``Lock`` does the work; this adds "take it, or keep it if ours",
which every holder here needs on each turn of its loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import redis
from redis.exceptions import LockError


class HeldLock:
    """A lock a loop takes or extends on every turn; lost when its holder stops renewing."""

    def __init__(self, client: redis.Redis, name: str, ttl_s: float) -> None:
        # thread_local=False: the lock belongs to the process's loop, whatever thread renews it.
        self._lock = client.lock(name, timeout=ttl_s, blocking=False, thread_local=False)
        self.name = name
        self._ttl = ttl_s

    def hold(self) -> bool:
        """Take the lock if free, or extend it to a full TTL if ours; False if another has it."""
        if self._lock.local.token is not None:
            try:
                return bool(self._lock.reacquire())
            except LockError:
                self._lock.local.token = None  # expired and perhaps taken: start again
        return bool(self._lock.acquire(blocking=False))

    @contextlib.contextmanager
    def kept(self) -> Iterator[Callable[[], bool]]:
        """Keep the (held) lock extended while the body runs, however long it takes.

        Yields a check that turns False once an extension failed: another process may hold the
        lock now, and the body should stop acting on the lock's behalf.
        """
        done, lost = threading.Event(), threading.Event()

        def extend() -> None:
            while not done.wait(self._ttl / 3):
                if not self._extended():
                    lost.set()
                    return

        thread = threading.Thread(target=extend, name=f"keep-{self.name}", daemon=True)
        thread.start()
        try:
            yield lambda: not lost.is_set()
        finally:
            done.set()
            thread.join()

    def _extended(self) -> bool:
        try:
            return self.hold()
        except redis.RedisError:
            return False

    @property
    def token(self) -> str | None:
        """The value in Redis while we hold the lock (checked by fenced scripts)."""
        raw = self._lock.local.token
        return raw.decode() if isinstance(raw, bytes) else raw

    def release(self) -> None:
        """Give the lock up if we hold it (else it expires by itself)."""
        with contextlib.suppress(LockError, redis.RedisError):
            self._lock.release()
