"""Putting sample ids on the queue (used by the producer, retry-failed and the reconciler)."""

from __future__ import annotations

from collections.abc import Iterable

from worker.app import EagleGenCelery
from worker.tasks import GENERATE_TASK


def publish(app: EagleGenCelery, run: str, ids: Iterable[str]) -> int:
    """Send one task per id over one broker connection; returns how many were sent."""
    sent = 0
    with app.producer_or_acquire() as producer:
        for sample_id in ids:
            app.send_task(
                GENERATE_TASK, args=[run, sample_id], queue=app.settings.queue, producer=producer
            )
            sent += 1
    return sent
