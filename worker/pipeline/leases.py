"""The sample leases one worker process holds, renewed by time from one thread.

Leases are renewed by time, not by stream progress: a server that queues a request for
minutes must not make us look dead, and a dead process stops renewing at once. A lease found
taken by another worker sets its generation's cancel event; the generation stops at its next
check.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable

import redis

from common.loop_errors import LoopErrors
from common.store import WorkerStore
from worker.pipeline.ticker import Ticker

log = logging.getLogger("eaglegen.worker")


class LeaseKeeper:
    """(run, id) -> (lease token, cancel event) for every generation running in this process."""

    def __init__(
        self, store: Callable[[str], WorkerStore], ttl_s: float, errors: LoopErrors | None = None
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        # One generation per sample per process (``claim``), so (run, id) names it; its
        # lease token is its own, never shared with another thread.
        self._claimed: set[tuple[str, str]] = set()
        self._held: dict[tuple[str, str], tuple[str, threading.Event]] = {}
        self._lock = threading.Lock()
        self._ticker = Ticker("lease-renewer", ttl_s / 3, self._renew, errors)

    def start(self) -> None:
        """Start the renewal thread (once)."""
        self._ticker.start()

    def close(self) -> None:
        """Stop renewing; leases still held expire after their TTL."""
        self._ticker.close()

    def claim(self, run: str, sample_id: str) -> bool:
        """Reserve a sample for one generation in this process; False if one already runs."""
        with self._lock:
            if (run, sample_id) in self._claimed:
                return False
            self._claimed.add((run, sample_id))
            return True

    def hold(self, run: str, sample_id: str, token: str) -> threading.Event:
        """Register a claimed generation's lease token; returns its cancel event."""
        event = threading.Event()
        with self._lock:
            self._held[(run, sample_id)] = (token, event)
        return event

    def drop(self, run: str, sample_id: str) -> None:
        """The claimed generation ended: stop renewing its lease, free the claim."""
        with self._lock:
            self._held.pop((run, sample_id), None)
            self._claimed.discard((run, sample_id))

    def count(self) -> int:
        """Generations running now."""
        with self._lock:
            return len(self._held)

    def renew_once(self) -> None:
        """Extend every held lease; cancel the generations whose lease someone else took."""
        with self._lock:
            by_run: dict[str, list[tuple[str, str]]] = defaultdict(list)
            for (run, sample_id), (token, _) in self._held.items():
                by_run[run].append((sample_id, token))
        for run, held in by_run.items():
            for lost in self.store(run).renew(held, self.ttl_s):
                with self._lock:
                    entry = self._held.get((run, lost))
                if entry is not None:
                    entry[1].set()

    def _renew(self) -> None:
        try:
            self.renew_once()
        except redis.RedisError as exc:
            log.warning("lease renewal failed: %s", exc)
