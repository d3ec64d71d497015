"""What a collector may touch in a run: its lock, and the results it moves to disk.

Every script here is fenced by the run's collector lock, and the lock itself cannot be taken
on a retired run (``COLLECTOR_LOCK``), so a collector left following a retired run brings
none of its keys back.
"""

from __future__ import annotations

import contextlib
import uuid

import redis

from common import errors, lua
from common.keys import RunKeys
from common.store.base import RunBase


class RunLock:
    """The one collector's lock on a run: taken or extended on every turn of its loop."""

    def __init__(self, client: redis.Redis, keys: RunKeys, ttl_s: float) -> None:
        self.keys = keys
        self.name = keys.collector_lock
        self.token: str | None = None
        self._ttl_ms = int(ttl_s * 1000)
        self._hold = client.register_script(lua.COLLECTOR_LOCK)
        self._unlock = client.register_script(lua.COLLECTOR_UNLOCK)

    def hold(self) -> bool:
        """Take the lock if free, or extend it if ours; False if another collector has it.
        Raises ``RunRetired`` on a retired run."""
        token = self.token or uuid.uuid4().hex
        code = int(self._hold(keys=[self.name, self.keys.retired], args=[token, self._ttl_ms]))
        if code == -1:
            raise errors.RunRetired(f"run {self.keys.run!r} is retired: nothing to collect")
        self.token = token if code == 1 else None
        return code == 1

    def release(self) -> None:
        """Give the lock up if we hold it (else it expires by itself)."""
        if self.token is None:
            return
        with contextlib.suppress(redis.RedisError):
            self._unlock(keys=[self.name], args=[self.token])
        self.token = None


class CollectorStore(RunBase):
    """The collector's view of a run."""

    def take_ready(self, token: str, limit: int) -> list[str]:
        """Ids to write next, for the lock holder only: those a previous turn took and did not
        commit, else up to ``limit`` moved from the ready list to the collecting list."""
        k = self.keys
        taken = self._script(lua.TAKE_READY)(
            keys=[k.collector_lock, k.ready, k.collecting], args=[token, limit]
        )
        if taken == -1:
            raise errors.CollectorFenced(
                f"lost the collector lock of run {self.run!r} to another collector"
            )
        return [str(x) for x in taken]

    def ready_count(self) -> int:
        """Results waiting for the collector."""
        return int(self.r.llen(self.keys.ready)) + int(self.r.llen(self.keys.collecting))

    def collecting(self) -> list[str]:
        """Ids taken by a collector that had not committed them (it crashed)."""
        return [str(x) for x in self.r.lrange(self.keys.collecting, 0, -1)]

    def results_for(self, ids: list[str]) -> list[str | None]:
        """Record JSON of each id (None where it is no longer in Redis)."""
        if not ids:
            return []
        return [None if v is None else str(v) for v in self.r.hmget(self.keys.results, ids)]

    def commit_collected(self, token: str, ids: list[str]) -> int:
        """After the lines are fsynced: drop those results from Redis and count them written."""
        k = self.keys
        keys = [k.collector_lock, k.collecting, k.results, k.counters]
        n = int(self._script(lua.COMMIT_COLLECTED)(keys=keys, args=[token, *ids]))
        if n == -1:
            raise errors.CollectorFenced(
                f"lost the collector lock of run {self.run!r} to another collector"
            )
        return n

    def collector_lock(self, ttl_s: float) -> RunLock:
        """The lock held by the one collector allowed to write this run."""
        return RunLock(self.r, self.keys, ttl_s)
