"""The Celery application factory."""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery, signals

from common.settings import Settings
from worker.config import celery_config
from worker.runtime import WorkerRuntime
from worker.tasks import register_tasks


class EagleGenCelery(Celery):  # type: ignore[misc]
    """A Celery app that carries EagleGen's settings and a lazily built per-process runtime."""

    settings: Settings

    def __init__(self, settings: Settings) -> None:
        super().__init__("eaglegen", set_as_current=False)
        self.settings = settings
        self.conf.update(celery_config(settings))
        self._runtime: WorkerRuntime | None = None
        self._runtime_lock = threading.Lock()

    def runtime(self) -> WorkerRuntime:
        """The process's runtime, built on first use (after any fork)."""
        with self._runtime_lock:
            if self._runtime is None:
                self._runtime = WorkerRuntime(self.settings, self.publish_samples)
            return self._runtime

    def publish_samples(self, run: str, ids: list[str]) -> object:
        """Send samples back to the queue ahead of new work (reconciler, hand-back)."""
        from worker.publish import publish

        return publish(self, run, ids, urgent=True)


def create_app(settings: Settings) -> EagleGenCelery:
    """A configured app with EagleGen's tasks registered; connects to nothing yet."""
    app = EagleGenCelery(settings)
    register_tasks(app)
    _connect_signals(app)
    return app


def _connect_signals(app: EagleGenCelery) -> None:
    # Signals are global in Celery: only react for the worker running this app.
    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            app.runtime().start_reconciler()
            app.runtime().serve_metrics()

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if app._runtime is not None:
            app._runtime.begin_drain()

    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutting_down.connect(on_shutdown, weak=False)
