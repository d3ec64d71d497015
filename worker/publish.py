"""Putting sample ids on the queue (the producer, retry-failed, the reconciler, hand-backs)."""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery

from worker.contract import GENERATE_TASK, NORMAL_PRIORITY, URGENT_PRIORITY, task_args


def publish(app: Celery, queue: str, run: str, ids: Iterable[str], urgent: bool = False) -> int:
    """Send one task per id over one broker connection; returns how many were sent."""
    priority = URGENT_PRIORITY if urgent else NORMAL_PRIORITY
    sent = 0
    with app.producer_or_acquire() as producer:
        for sample_id in ids:
            app.send_task(
                GENERATE_TASK, args=task_args(run, sample_id), queue=queue,
                producer=producer, priority=priority,
            )  # fmt: skip
            sent += 1
    return sent
