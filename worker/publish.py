"""Putting sample ids on the queue (used by the producer, retry-failed and the reconciler)."""

from __future__ import annotations

from collections.abc import Iterable

from worker.app import EagleGenCelery
from worker.tasks import GENERATE_TASK

# kombu's Redis transport keeps one list per priority step (0, 3, 6, 9) and serves 0 first.
# New work goes in at 6; samples coming back from a dead or stopping worker go in at 0, so
# they run next instead of waiting behind the whole queue.
NORMAL_PRIORITY = 6
URGENT_PRIORITY = 0


def publish(app: EagleGenCelery, run: str, ids: Iterable[str], urgent: bool = False) -> int:
    """Send one task per id over one broker connection; returns how many were sent."""
    priority = URGENT_PRIORITY if urgent else NORMAL_PRIORITY
    sent = 0
    with app.producer_or_acquire() as producer:
        for sample_id in ids:
            app.send_task(
                GENERATE_TASK, args=[run, sample_id], queue=app.settings.queue,
                producer=producer, priority=priority,
            )  # fmt: skip
            sent += 1
    return sent
