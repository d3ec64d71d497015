"""Putting sample ids on the queue (the producer, retry-failed, the reconciler, hand-backs)."""

from __future__ import annotations

from collections.abc import Iterable

import redis
from celery import Celery
from kombu.exceptions import BatchPublishError
from kombu.utils.uuid import uuid

from broker.message import GENERATE_TASK, NORMAL_PRIORITY, URGENT_PRIORITY, task_args


def publish(
    app: Celery, queue: str, run: str, ids: Iterable[str], urgent: bool = False,
    task: str = GENERATE_TASK,
) -> int:  # fmt: skip
    """Send one task per id, pipelined over one broker connection; returns how many were sent.

    kombu's publish batch sends the messages' LPUSHes together (one round trip per batch, not
    one each). A failed flush raises the Redis error behind it, as a single publish would:
    its samples are pending already, so the reconciler re-publishes any whose message is lost.
    """
    try:
        return _publish(app, queue, run, ids, URGENT_PRIORITY if urgent else NORMAL_PRIORITY, task)
    except BatchPublishError as exc:
        if isinstance(exc.__cause__, redis.RedisError):
            raise exc.__cause__ from exc
        raise


def _publish(
    app: Celery, queue: str, run: str, ids: Iterable[str], priority: int, task: str
) -> int:
    # Celery's own two steps under send_task: build the message, send it (signals, sent event
    # and retry policy included). send_task around them routes, merges options, wraps the
    # result and acquires a producer per message, work a batch of ours does once.
    amqp = app.amqp
    sent = 0
    with app.producer_or_acquire() as producer, producer.batch():
        for sample_id in ids:
            message = amqp.create_task_message(uuid(), task, task_args(run, sample_id), {})
            amqp.send_task_message(
                producer, task, message, queue=queue, priority=priority,
                declare=None if sent == 0 else [],  # declared with the first message
            )  # fmt: skip
            sent += 1
    return sent
