"""The Celery application factory and the composition root of a worker process.

This is the only module that knows the others: it builds the parts (leases, endpoints,
observation, processing, reconciliation), hands each what it needs, and starts and stops them
from Celery's worker signals. The parts import none of it.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from celery import Celery, signals

from common.settings import Settings
from common.store import RunStores, connect
from worker import kombu_fix
from worker.aborts import Aborter
from worker.clock_watch import ClockWatch
from worker.config import celery_config
from worker.endpoints import EndpointPool
from worker.lean_messages import LeanAMQP
from worker.leases import LeaseKeeper
from worker.observe import Observer
from worker.processing import SampleProcessor
from worker.publish import publish
from worker.reconcile import ReconcilerLoop
from worker.tasks import register_tasks


class WorkerParts:
    """One worker process's parts, wired; threads start in ``start()``, not here."""

    def __init__(self, settings: Settings, hand_back: Any) -> None:
        self.settings = settings
        self.redis: redis.Redis = connect(settings.redis_url, settings.redis_sentinel_master)
        self.stores = RunStores(self.redis, settings.key_prefix)
        self.leases = LeaseKeeper(self.stores, settings.lease_ttl)
        self.endpoints = EndpointPool.build(settings, self.redis)
        self.observer = Observer(self.redis, settings, self.leases.count)
        self.aborter = Aborter(self.redis, settings, self.observer.metrics.abort)
        self.processor = SampleProcessor(
            settings, self.stores, self.endpoints, self.leases, self.observer, self.aborter
        )
        self.reconciler = ReconcilerLoop(self.redis, settings, hand_back, self.aborter)
        self.clock = ClockWatch(self.redis, settings)

    def start_generating(self) -> None:
        """What a task needs running: lease renewal, the endpoints' threads, statistics."""
        self.leases.start()
        self.endpoints.start()
        self.observer.start_flushing()

    def start(self) -> None:
        """Everything, once the worker is ready: also reconciliation, metrics and the summary."""
        self.start_generating()
        # Whether each endpoint aborts requests, learned before an orphan needs it (status
        # shows it); off the start-up path: a server still starting answers later.
        threading.Thread(target=self._probe_aborts, name="abort-probe", daemon=True).start()
        self.observer.start()
        self.reconciler.start()
        self.clock.start()

    def _probe_aborts(self) -> None:
        for endpoint in self.settings.endpoints:
            self.aborter.probe(endpoint)

    def close(self) -> None:
        """Stop every thread, give back endpoint slots, close connections."""
        self.clock.close()
        self.reconciler.close()
        self.observer.close()
        self.leases.close()
        self.endpoints.close()
        self.redis.close()


class EagleGenCelery(Celery):  # type: ignore[misc]
    """A Celery app that carries EagleGen's settings and, in a worker, its parts."""

    settings: Settings

    def __init__(self, settings: Settings) -> None:
        # LeanAMQP: task messages without Celery's empty fields (~40% of a queued sample's bytes).
        super().__init__("eaglegen", set_as_current=False, amqp=LeanAMQP)
        self.settings = settings
        self.conf.update(celery_config(settings))
        self._parts: WorkerParts | None = None
        self._parts_lock = threading.Lock()

    def parts(self) -> WorkerParts:
        """The process's parts, built on first use (after any fork)."""
        with self._parts_lock:
            if self._parts is None:
                self._parts = WorkerParts(self.settings, self.publish_samples)
            return self._parts

    def processor(self) -> SampleProcessor:
        """The task's view: the processor, with leases renewed and endpoints running."""
        parts = self.parts()
        parts.start_generating()  # idempotent; a task can arrive before worker_ready
        return parts.processor

    def publish_samples(self, run: str, ids: list[str]) -> object:
        """Send samples back to the queue ahead of new work (reconciler, hand-back)."""
        return publish(self, self.settings.queue, run, ids, urgent=True)


def create_app(settings: Settings) -> EagleGenCelery:
    """A configured app with EagleGen's tasks registered; connects to nothing yet."""
    kombu_fix.apply()
    app = EagleGenCelery(settings)
    register_tasks(app, settings, app.processor, app.publish_samples)
    _connect_signals(app)
    return app


def _connect_signals(app: EagleGenCelery) -> None:
    # Signals are global in Celery: only react for the worker running this app.
    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            app.parts().start()

    def on_stopping(sender: Any = None, **_: Any) -> None:
        if app._parts is not None:
            app._parts.processor.begin_drain()

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if app._parts is not None and getattr(sender, "app", app) is app:
            app._parts.close()

    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutting_down.connect(on_stopping, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
