"""The capture worker's Celery app and the composition root of its process.

A second worker kind beside generation's: its own queue (``EAGLEGEN_CAPTURE_QUEUE``), the
same Celery configuration, leases, reconciler and collector, and one target model per process
that every task thread's rows share through the batcher.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import redis
from celery import Celery, signals

from capture.batcher import Batcher
from capture.forward import TargetModel
from capture.manifest import ManifestWriters
from capture.processor import RowProcessor, RunView
from capture.store import CaptureStore
from capture.tasks import register_capture_task
from common.keys import capture_reconciler_lock_key
from common.settings import Settings
from common.store import RunStores, connect
from worker import kombu_fix
from worker.config import celery_config
from worker.contract import CAPTURE_TASK
from worker.lean_messages import LeanAMQP
from worker.leases import LeaseKeeper
from worker.publish import publish
from worker.reconcile import ReconcilerLoop
from worker.ticker import Ticker


def capture_settings(settings: Settings) -> Settings:
    """The process's settings with the capture queue as its queue (Celery, reconciler)."""
    return settings.model_copy(update={"queue": settings.capture_queue})


class CaptureParts:
    """One capture process's parts, wired; threads start in ``start()``."""

    def __init__(self, settings: Settings, model: TargetModel, hand_back: Any) -> None:
        self.settings = settings
        self.redis: redis.Redis = connect(settings.redis_url, settings.redis_sentinel_master)
        self.leases = LeaseKeeper(RunStores(self.redis, settings.key_prefix), settings.lease_ttl)
        linger = settings.capture_linger if settings.concurrency > 1 else 0.0
        self.batcher = Batcher(model.forward, settings.capture_token_budget, linger)
        self.model = model
        self._views: dict[str, RunView] = {}
        self._lock = threading.Lock()
        self.processor = RowProcessor(self.view, self.batcher, self.leases, settings.lease_ttl)
        lock = capture_reconciler_lock_key(settings.key_prefix)
        self.reconciler = ReconcilerLoop(self.redis, settings, hand_back, lock)
        self.manifests = ManifestWriters(self.redis, settings)
        self._flusher = Ticker("capture-stats", 1.0, self._flush)

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
        self._flush()
        self.redis.close()

    def _flush(self) -> None:
        with self._lock:
            views = list(self._views.values())
        for view in views:
            with contextlib.suppress(redis.RedisError):  # kept for the next flush
                view.stats.flush()


class CaptureCelery(Celery):  # type: ignore[misc]
    """A Celery app for capture workers, carrying the settings and, in a worker, its parts."""

    def __init__(self, settings: Settings, model_dir: str | None, device: str) -> None:
        super().__init__("eaglegen-capture", set_as_current=False, amqp=LeanAMQP)
        self.settings = settings
        self.conf.update(celery_config(settings))
        self.model_dir = model_dir
        self.device = device
        self._parts: CaptureParts | None = None
        self._parts_lock = threading.Lock()

    def parts(self) -> CaptureParts:
        """The process's parts (and its model), built on first use."""
        with self._parts_lock:
            if self._parts is None:
                if self.model_dir is None:
                    raise RuntimeError("a capture app without --model cannot run tasks")
                model = TargetModel(self.model_dir, self.device)
                self._parts = CaptureParts(self.settings, model, self.publish_rows)
            return self._parts

    def processor(self) -> RowProcessor:
        """The task's view: the processor, with leases renewed."""
        parts = self.parts()
        parts.start_capturing()
        return parts.processor

    def publish_rows(self, run: str, ids: list[str]) -> object:
        """Send rows back to the capture queue ahead of new work (reconciler, hand-back)."""
        return self.publish(run, ids, urgent=True)

    def publish(self, run: str, ids: list[str], urgent: bool = False) -> int:
        """One capture task per row id on the capture queue."""
        return publish(self, self.settings.queue, run, ids, urgent=urgent, task=CAPTURE_TASK)


def create_capture_app(
    settings: Settings, model_dir: str | None = None, device: str = "cpu"
) -> CaptureCelery:
    """A configured capture app (``settings`` as given, or made capture's by the caller)."""
    kombu_fix.apply()
    app = CaptureCelery(capture_settings(settings), model_dir, device)
    register_capture_task(app, app.settings, app.processor, app.publish_rows)
    _connect_signals(app)
    return app


def _connect_signals(app: CaptureCelery) -> None:
    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            app.parts().start()

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if app._parts is not None and getattr(sender, "app", app) is app:
            app._parts.close()

    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
