"""The Celery application factory."""

from __future__ import annotations

import threading

from celery import Celery

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
                self._runtime = WorkerRuntime(self.settings)
            return self._runtime


def create_app(settings: Settings) -> EagleGenCelery:
    """A configured app with EagleGen's tasks registered; connects to nothing yet."""
    app = EagleGenCelery(settings)
    register_tasks(app)
    return app
