"""One capture worker process's parts: the target, the batcher, leases, reconciler, writers."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Protocol

import redis

from capture.batcher import Batcher, Runner, Unbatched
from capture.forward import States
from capture.manifest import ManifestWriters
from capture.processor import RowProcessor, RunView
from capture.store import CaptureStore
from common.keys import capture_reconciler_lock_key
from common.loop_errors import LoopErrors
from common.settings import Settings
from common.store import RunStores, connect
from worker.pipeline.leases import LeaseKeeper
from worker.pipeline.reconcile import ReconcilerLoop
from worker.pipeline.ticker import Ticker


class Target(Protocol):
    """Where states come from: a model loaded here (``capture/forward.py``) or vLLM capture
    servers (``capture/vllm_backend.py``)."""

    layers: int

    def forward(self, batch: list[list[int]], aux: tuple[int, int, int]) -> list[States]: ...

    def close(self) -> None: ...


class CaptureParts:
    """One capture process's parts, wired; threads start in ``start()``."""

    def __init__(
        self, settings: Settings, model: Target, hand_back: Any, batched: bool = True
    ) -> None:
        self.settings = settings
        self.redis: redis.Redis = connect(settings.redis_url, settings.redis_sentinel_master)
        self.loop_errors = LoopErrors.of(self.redis, settings)
        stores = RunStores(self.redis, settings.key_prefix)
        self.leases = LeaseKeeper(stores, settings.lease_ttl, self.loop_errors)
        linger = settings.capture_linger if settings.concurrency > 1 else 0.0
        # Servers batch their requests themselves: each row then goes on its own.
        self.batcher: Runner = (
            Batcher(model.forward, settings.capture_token_budget, linger)
            if batched
            else Unbatched(model.forward)
        )
        self.model = model
        self._views: dict[str, RunView] = {}
        self._lock = threading.Lock()
        self.processor = RowProcessor(self.view, self.batcher, self.leases, settings)
        lock = capture_reconciler_lock_key(settings.key_prefix)
        self.reconciler = ReconcilerLoop(self.redis, settings, hand_back, lock)
        self.manifests = ManifestWriters(self.redis, settings)
        self._flusher = Ticker("capture-stats", 1.0, self._flush, self.loop_errors)

    def view(self, run: str) -> RunView:
        """A run's spec, rows and layers, read once per process."""
        with self._lock:
            if run not in self._views:
                store = CaptureStore(self.redis, self.settings.key_prefix, run)
                self._views[run] = RunView(store, self.model.layers)
            return self._views[run]

    def start_capturing(self) -> None:
        """What a task needs running: lease renewal."""
        self.leases.start()
        self._flusher.start()

    def start(self) -> None:
        """Everything, once the worker is ready."""
        self.start_capturing()
        self.reconciler.start()
        self.manifests.start()

    def close(self) -> None:
        """Stop every thread and close the connection."""
        self.reconciler.close()
        self.manifests.close()
        self._flusher.close()
        self.leases.close()
        self.batcher.close()
        self.model.close()
        self._flush()
        self.redis.close()

    def _flush(self) -> None:
        with self._lock:
            views = list(self._views.values())
        for view in views:
            with contextlib.suppress(redis.RedisError):  # kept for the next flush
                view.stats.flush()
