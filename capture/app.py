"""The capture worker's Celery app and the composition root of its process.

A second worker kind beside generation's: its own queue (``EAGLEGEN_CAPTURE_QUEUE``), the
same Celery configuration, leases, reconciler and collector, and one target model per process
that every task thread's rows share through the batcher.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

from common.settings import Settings
from worker import kombu_fix
from worker.config import celery_config
from worker.contract import CAPTURE_TASK
from worker.lean_messages import LeanAMQP
from worker.publish import publish
from worker.tasks import register_tasks

if TYPE_CHECKING:  # torch and transformers load only in a worker, not for an enqueue
    from capture.parts import CaptureParts
    from capture.processor import RowProcessor


def capture_settings(settings: Settings) -> Settings:
    """The process's settings with the capture queue as its queue (Celery, reconciler)."""
    return settings.model_copy(update={"queue": settings.capture_queue})


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
                from capture.forward import TargetModel
                from capture.parts import CaptureParts

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
    register_tasks(app, app.settings, app.processor, app.publish_rows, name=CAPTURE_TASK)
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
