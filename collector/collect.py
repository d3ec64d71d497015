"""The collector: results leave Redis only after their lines are on disk.

Exactly one collector writes a run: it holds the run's lock in Redis, and the scripts that
take and commit results check that lock's token (fencing), so a collector paused past its lock
wakes up unable to touch its successor's work, notices, and stops. Redis being unreachable or
stalled only pauses the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from collector.sink import JsonlSink
from common.errors import CollectorFenced, ConfigError
from common.stop import Stop
from common.store import CollectorStore

log = logging.getLogger("eaglegen.collector")
IDLE_MAX_S = 1.0  # longest pause between looks at an empty ready list
REDIS_PAUSE_S = 1.0
LINGER_S = 0.1  # after a batch smaller than the limit, before the next look
SUMMARY_S = 60.0  # one INFO line this often: a collector that says nothing looks hung


@dataclass
class CollectStats:
    """What a collector run did."""

    written: int = 0
    skipped_present: int = 0
    missing: int = 0


class Collector:
    """Moves a run's results to its JSONL file, exactly one line per sample id."""

    def __init__(
        self, store: CollectorStore, sink: JsonlSink, batch: int = 256, lock_ttl: float = 10.0
    ) -> None:
        self.store = store
        self.sink = sink
        self.batch = batch
        self.lock_ttl = lock_ttl
        self.stats = CollectStats()
        self._lock = store.collector_lock(lock_ttl)
        self._idle = 0.0
        self._summary_at = time.monotonic()
        self._summary_written = 0

    def run(
        self,
        stop: Stop,
        once: bool = False,
        on_batch: Callable[[CollectStats], None] = lambda stats: None,
    ) -> CollectStats:
        """Collect until ``stop`` is set (or, with ``once``, until nothing is ready)."""
        self._take_lock(stop)
        try:
            while not stop.is_set() and self._turn(stop, once):
                on_batch(self.stats)
                self._maybe_log_summary()
        finally:
            self._lock.release()  # if Redis is away, the lock expires by itself
        return self.stats

    def _turn(self, stop: Stop, once: bool) -> bool:
        """One batch; False when ``once`` has nothing left. Redis errors only pause it."""
        try:
            return self._step(stop, once)
        except CollectorFenced:
            # The lock may be gone without a successor (a Redis restart lost it): take it
            # again and redo the batch from the collecting list; else stop.
            if self._lock.hold():
                return True
            raise
        except redis.RedisError as exc:
            log.warning("Redis unreachable or stalled (%s); retrying", _short(exc))
            stop.wait(REDIS_PAUSE_S)
            return True

    def _step(self, stop: Stop, once: bool) -> bool:
        # Ids left in the collecting list (a crash, or a commit lost to a Redis restart) come
        # first; the sink skips any already on disk.
        self._renew()
        ids = self.store.take_ready(self.token, self.batch)
        if not ids:
            if once:
                return False
            self._idle = min(max(self._idle * 2, 0.05), IDLE_MAX_S)
            stop.wait(self._idle)
            return True
        self._idle = 0.0
        self._flush(ids)
        if len(ids) < self.batch and not once:
            # Results trickle in one by one: let a batch build up, or each would cost its own
            # fsync and a dozen Redis commands.
            stop.wait(LINGER_S)
        return True

    @property
    def token(self) -> str:
        """Our lock token (fences the take and commit scripts)."""
        return self._lock.token or ""

    def _renew(self) -> None:
        if not self._lock.hold():
            raise CollectorFenced(
                f"lost the collector lock of run {self.store.run!r} to another collector "
                "(this one was paused or cut off longer than its lock); stopping"
            )

    def _maybe_log_summary(self) -> None:
        elapsed = time.monotonic() - self._summary_at
        if elapsed < SUMMARY_S:
            return
        written = self.stats.written - self._summary_written
        self._summary_at, self._summary_written = time.monotonic(), self.stats.written
        try:
            waiting, pending = self.store.ready_count(), self.store.pending_count()
        except redis.RedisError:
            return
        log.info(
            "run %s: %d records written (%.1f/s over the last %.0f s); %d answered samples "
            "waiting to be written, %d samples still to answer",
            self.store.run, self.stats.written, written / elapsed, elapsed, waiting, pending,
        )  # fmt: skip

    def _take_lock(self, stop: Stop) -> None:
        # A killed collector's lock outlives it by up to its TTL: wait that long, no more
        # (time with Redis unreachable does not count).
        deadline = time.monotonic() + self.lock_ttl + 1
        said = False
        while not stop.is_set():
            try:
                if self._lock.hold():
                    return
                if not said:
                    said = True
                    log.warning(
                        "another collector holds the lock of run %r: waiting up to %.0f s for "
                        "it to expire (a collector that died lets go within its %.0f s TTL; a "
                        "live one keeps it, and this one then gives up)",
                        self.store.run, self.lock_ttl + 1, self.lock_ttl,
                    )  # fmt: skip
            except redis.RedisError as exc:
                log.warning("Redis unreachable (%s); waiting for it", _short(exc))
                deadline = time.monotonic() + self.lock_ttl + 1
                stop.wait(REDIS_PAUSE_S)
                continue
            if time.monotonic() > deadline:
                raise ConfigError(f"another collector is already writing run {self.store.run!r}")
            stop.wait(0.5)

    def _flush(self, ids: list[str]) -> None:
        records = self.store.results_for(ids)
        items = [(i, r) for i, r in zip(ids, records, strict=True) if r is not None]
        self.stats.missing += len(ids) - len(items)
        written = self.sink.append(items)
        self.stats.skipped_present += len(items) - written
        self.stats.written += written
        # Only now, with the lines fsynced, may the results leave Redis.
        self.store.commit_collected(self.token, ids)


def _short(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]
