"""The Celery app every role reaches the broker through: configured, patched, no tasks.

The producer, ``retry-failed`` and the reconciler publish with it as it is; the worker adds
its task and its parts to it (``worker.app``). Building one connects to nothing.
"""

from __future__ import annotations

from celery import Celery

from broker import kombu_fix
from broker.config import celery_config
from broker.lean import LeanAMQP
from broker.publish import publish
from common.settings import Settings


class BrokerApp(Celery):  # type: ignore[misc]
    """A Celery app that carries EagleGen's settings and sends lean task messages."""

    settings: Settings

    def __init__(self, settings: Settings) -> None:
        kombu_fix.apply()  # idempotent; before any channel of this app exists
        # LeanAMQP: task messages without Celery's empty fields, most of a queued sample's bytes.
        super().__init__("eaglegen", set_as_current=False, amqp=LeanAMQP)
        self.settings = settings
        self.conf.update(celery_config(settings))

    def publish_samples(self, run: str, ids: list[str]) -> object:
        """Send samples back to the queue ahead of new work (reconciler, hand-back)."""
        return publish(self, self.settings.queue, run, ids, urgent=True)


def create_broker_app(settings: Settings) -> BrokerApp:
    """An app to publish with; the worker's own is ``worker.app.create_app``."""
    return BrokerApp(settings)
