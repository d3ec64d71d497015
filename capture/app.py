"""The capture worker's Celery app and the composition root of its process.

A second worker kind beside generation's: the broker package's app on its own queue
(``EAGLEGEN_CAPTURE_QUEUE``), generation's task adapter under its own task name, and one target
model per process that every task thread's rows share through the batcher
(``capture/parts.py``, loaded only in a worker: an enqueue imports neither torch nor
transformers). ``--backend vllm`` takes the states from vLLM capture servers instead
(``capture/vllm_backend.py``): the model folder is then read for its config and final norm only.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from broker.app import BrokerApp
from broker.message import CAPTURE_TASK
from broker.publish import publish
from common.settings import Settings
from worker.tasks import connect_signals, register_tasks

if TYPE_CHECKING:
    from capture.parts import CaptureParts, Target
    from capture.processor import RowProcessor


def capture_settings(settings: Settings) -> Settings:
    """The process's settings with the capture queue as its queue (Celery, reconciler)."""
    return settings.model_copy(update={"queue": settings.capture_queue})


class CaptureApp(BrokerApp):
    """The broker's app for capture: publishes capture tasks and, in a worker, runs them."""

    def __init__(
        self, settings: Settings, model_dir: str | None, device: str,
        backend: str = "transformers", synthetic_rate: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__(capture_settings(settings))
        self.model_dir = model_dir
        self.device = device
        self.capture_backend = backend
        self.synthetic_rate = synthetic_rate
        self._parts: CaptureParts | None = None
        self._parts_lock = threading.Lock()

    def parts(self) -> CaptureParts:
        """The process's parts (and its model), built on first use."""
        with self._parts_lock:
            if self._parts is None:
                if self.model_dir is None:
                    raise RuntimeError("a capture app without --model cannot run tasks")
                from capture.parts import CaptureParts

                self._parts = CaptureParts(
                    self.settings, self._target(self.model_dir), self.publish_samples,
                    batched=self.capture_backend != "vllm",
                )  # fmt: skip
            return self._parts

    def _target(self, model_dir: str) -> Target:
        if self.device != "cpu" or self.capture_backend != "transformers":
            _one_host_thread()
        if self.capture_backend == "vllm":
            from capture.vllm_backend import VllmForward

            return VllmForward(self.settings, model_dir)
        if self.capture_backend == "synthetic":
            from capture.synthetic import H200_8B_TOKENS_PER_S, SyntheticTarget

            return SyntheticTarget(model_dir, self.synthetic_rate or H200_8B_TOKENS_PER_S)
        from capture.forward import TargetModel

        return TargetModel(model_dir, self.device)

    def processor(self) -> RowProcessor:
        """The task's view: the processor, with leases renewed."""
        parts = self.parts()
        parts.start_capturing()
        return parts.processor

    def publish_samples(self, run: str, ids: list[str]) -> object:
        """Send rows back to the capture queue ahead of new work (reconciler, hand-back)."""
        return self.publish(run, ids, urgent=True)

    def publish(self, run: str, ids: list[str], urgent: bool = False) -> int:
        """One capture task per row id on the capture queue."""
        return publish(self, self.settings.queue, run, ids, urgent=urgent, task=CAPTURE_TASK)

    def _started(self) -> None:
        self.parts().start()

    def _shut_down(self) -> None:
        if self._parts is not None:
            self._parts.close()


def _one_host_thread() -> None:
    """The host only copies, encodes and writes here (the forward pass runs elsewhere): one
    torch thread per task thread, instead of an intra-op pool started by each of them."""
    import torch

    torch.set_num_threads(1)


def create_capture_app(
    settings: Settings, model_dir: str | None = None, device: str = "cpu",
    backend: str = "transformers", synthetic_rate: float | None = None,
) -> CaptureApp:  # fmt: skip
    """A configured capture app; connects to nothing, loads no model until a task needs it."""
    app = CaptureApp(settings, model_dir, device, backend, synthetic_rate)
    register_tasks(app, app.settings, app.processor, app.publish_samples, name=CAPTURE_TASK)
    connect_signals(app, app._started, lambda: None, app._shut_down)
    return app
