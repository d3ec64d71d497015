"""The collector: results leave Redis only after their lines are on disk."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from collector.sink import JsonlSink
from common.errors import ConfigError
from common.store import RunStore

log = logging.getLogger("eaglegen.collector")
# Renewed on every loop turn (at least once a second); short so that a killed collector's
# successor waits seconds, not minutes.
LOCK_TTL = 10.0


@dataclass
class CollectStats:
    """What a collector run did."""

    written: int = 0
    skipped_present: int = 0
    missing: int = 0


class Collector:
    """Moves a run's results to its JSONL file, exactly one line per sample id."""

    def __init__(self, store: RunStore, sink: JsonlSink, batch: int = 256) -> None:
        self.store = store
        self.sink = sink
        self.batch = batch
        self.stats = CollectStats()
        self._lock_handle = store.collector_lock(LOCK_TTL)

    def run(
        self,
        stop: threading.Event,
        once: bool = False,
        on_batch: Callable[[CollectStats], None] = lambda stats: None,
    ) -> CollectStats:
        """Collect until ``stop`` is set (or, with ``once``, until nothing is ready)."""
        self._lock()
        try:
            while not stop.is_set():
                try:
                    if not self._step(once):
                        break
                except redis.ConnectionError as exc:
                    log.warning("Redis unreachable (%s); retrying", exc)
                    stop.wait(1.0)
                    continue
                on_batch(self.stats)
        finally:
            self._unlock()
        return self.stats

    def _step(self, once: bool) -> bool:
        # Ids left in the collecting list (a crash, or a commit lost to a Redis restart) go
        # first; the sink skips any already on disk.
        ids = self.store.collecting() or self._take(once)
        if not ids and once:
            return False
        self._flush(ids)
        return True

    def _unlock(self) -> None:
        self._lock_handle.release()  # if Redis is away, the lock expires by itself

    def _lock(self) -> None:
        # A killed collector's lock outlives it by up to LOCK_TTL: wait that long, no more.
        deadline = time.monotonic() + LOCK_TTL + 1
        while not self._lock_handle.hold():
            if time.monotonic() > deadline:
                raise ConfigError(f"another collector is already writing run {self.store.run!r}")
            time.sleep(0.5)

    def _take(self, once: bool) -> list[str]:
        self._lock_handle.hold()
        return self.store.take_ready(self.batch, 0 if once else 1.0)

    def _flush(self, ids: list[str]) -> None:
        if not ids:
            return
        records = self.store.results_for(ids)
        items = [(i, r) for i, r in zip(ids, records, strict=True) if r is not None]
        self.stats.missing += len(ids) - len(items)
        written = self.sink.append(items)
        self.stats.skipped_present += len(items) - written
        self.stats.written += written
        # Only now, with the lines fsynced, may the results leave Redis.
        self.store.commit_collected()
