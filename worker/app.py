"""The worker's Celery app and the composition root of a worker process.

This is the only module that knows the others: it builds the parts (leases, endpoints and
their clients, caps and rate limits, observation, processing, reconciliation), hands each what
it needs, starts their threads and stops them from Celery's worker signals. The parts import
none of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis

from broker.app import BrokerApp
from common.loop_errors import LoopErrors, restarted
from common.settings import Settings
from common.store import RunStores, connect
from worker.endpoints.adaptive import AdaptiveDriver
from worker.endpoints.capacity import SlotTable
from worker.endpoints.pool import EndpointPool, chat_client, rate_limiter
from worker.pipeline.aborts import Aborter
from worker.pipeline.clock_watch import ClockWatch
from worker.pipeline.heartbeat import Heartbeat
from worker.pipeline.leases import LeaseKeeper
from worker.pipeline.observe import Observer
from worker.pipeline.processing import SampleProcessor
from worker.pipeline.reconcile import ReconcilerLoop
from worker.tasks import connect_signals, register_tasks


class WorkerParts:
    """One worker process's parts, wired; threads start in ``start()``, not here."""

    def __init__(self, settings: Settings, hand_back: Any) -> None:
        self.settings = settings
        self.redis: redis.Redis = connect(settings.redis_url, settings.redis_sentinel_master)
        self.stores = RunStores(self.redis, settings.key_prefix)
        self.loop_errors = LoopErrors.of(self.redis, settings)
        self.leases = LeaseKeeper(self.stores, settings.lease_ttl, self.loop_errors)
        self.endpoints = build_endpoints(settings, self.redis)
        self.observer = Observer(self.redis, settings, self.leases.count)
        self.aborter = Aborter(self.redis, settings, self.observer.metrics.abort)
        self.processor = SampleProcessor(
            settings, self.stores, self.endpoints, self.leases, self.observer, self.aborter
        )
        self.reconciler = ReconcilerLoop(self.redis, settings, hand_back, aborter=self.aborter)
        self.clock = ClockWatch(self.redis, settings)
        self.heartbeat = Heartbeat(self.redis, settings, self.leases.count)
        self.settings = settings
        self._endpoint_threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()

    def start_generating(self) -> None:
        """What a task needs running: lease renewal, the endpoints' threads, statistics."""
        self.leases.start()
        self._start_endpoints()
        self.observer.start_flushing()

    def _start_endpoints(self) -> None:
        """Renew slots, probe endpoints, hear wake-ups (and adapt caps): once per process."""
        with self._start_lock:
            if self._endpoint_threads:
                return
            pool = self.endpoints
            loops: dict[str, Callable[[], None]] = {
                "endpoint-check": pool.check_all, "slot-renewer": pool.renew_loop,
                "endpoint-prober": pool.probe_loop, "slot-wakeups": pool.listen,
            }  # fmt: skip
            if self.settings.adaptive:
                driver = AdaptiveDriver(self.settings, self.redis, pool.table)
                loops["adaptive-caps"] = lambda: driver.run(pool.stopped)
            self._endpoint_threads = [
                _thread(restarted(name, target, self.loop_errors, pool.stopped), name)
                for name, target in loops.items()
            ]

    def start(self) -> None:
        """Everything, once the worker is ready: also reconciliation, metrics and the summary."""
        self.start_generating()
        # Whether each endpoint aborts requests, learned before an orphan needs it (status
        # shows it); off the start-up path: a server still starting answers later.
        threading.Thread(target=self._probe_aborts, name="abort-probe", daemon=True).start()
        self.observer.start()
        self.reconciler.start()
        self.clock.start()
        self.heartbeat.start()

    def _probe_aborts(self) -> None:
        for endpoint in self.settings.endpoints:
            self.aborter.probe(endpoint)

    def close(self) -> None:
        """Stop every thread, give back endpoint slots, close connections."""
        self.heartbeat.close()
        self.clock.close()
        self.reconciler.close()
        self.observer.close()
        self.leases.close()
        self.endpoints.close()
        self.redis.close()


def build_endpoints(settings: Settings, client: redis.Redis) -> EndpointPool:
    """The pool of the configured endpoints, with their caps, rate limits and clients."""
    limiter = rate_limiter(settings, client)
    clients = {url: chat_client(url, settings, limiter) for url in settings.endpoints}
    caps = {url: settings.cap_for(url) for url in settings.endpoints}
    table = SlotTable(client, settings.key_prefix, caps, settings.slot_ttl)
    return EndpointPool(settings, client, table, clients, limiter)


def _thread(target: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


class EagleGenCelery(BrokerApp):
    """The broker's app with EagleGen's task and, in a worker, its parts."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
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

    def begin_drain(self) -> None:
        """The worker is stopping: in-flight samples get the grace time, then go back."""
        if self._parts is not None:
            self._parts.processor.begin_drain()

    def close_parts(self) -> None:
        """The worker has shut down: stop the parts, if any were built."""
        if self._parts is not None:
            self._parts.close()


def create_app(settings: Settings) -> EagleGenCelery:
    """A configured app with EagleGen's tasks registered; connects to nothing yet."""
    app = EagleGenCelery(settings)
    register_tasks(app, settings, app.processor, app.publish_samples)
    connect_signals(app, lambda: app.parts().start(), app.begin_drain, app.close_parts)
    return app
