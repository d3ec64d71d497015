"""The capture task: a thin adapter from a message (run, row id) to the row processor.

What follows an error is generation's own rule (``worker.tasks.after_error``): the same
exception tree, backoff and retry limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

from common import errors
from common.settings import Settings
from worker.contract import CAPTURE_TASK
from worker.tasks import Processor, after_error


def register_capture_task(
    app: Celery, settings: Settings, processor: Callable[[], Processor],
    hand_back: Callable[[str, list[str]], object],
) -> None:  # fmt: skip
    """Attach the capture task to ``app``."""

    @app.task(bind=True, name=CAPTURE_TASK, max_retries=None)  # type: ignore[untyped-decorator]
    def capture(self: Any, run: str, row_id: str) -> str:
        work = processor()
        try:
            return work.process(run, row_id, self.request.retries)
        except Exception as exc:
            step = after_error(exc, self.request.retries, settings)
            if step is None:
                raise
            if step.action == "hand_back":
                hand_back(run, [row_id])
                return "handed-back"
            if step.action == "drop":
                return "lease-lost"
            if step.action == "fail":
                assert isinstance(exc, errors.GenerationError)
                work.fail(run, row_id, exc)
                return "failed"
            if step.counts_as_retry:
                work.count_retry(run)
            raise self.retry(countdown=step.countdown, exc=exc) from None
