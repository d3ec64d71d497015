"""All run state in Redis: one view per role, atomic transitions as Lua scripts.

A sample moves accepted -> pending -> (leased while generating) -> done (result stored) ->
written (collector has it on disk), or -> failed. Every transition that touches more than one
key is one script, so a crash between two steps cannot leave a sample half-moved.

Each role gets the class of what it may touch: ``ProducerStore`` (producer), ``WorkerStore``
(worker), ``ReconcileStore`` (reconciler), ``CollectorStore`` (collector), ``StatusStore``
(status, runs, metrics), ``LifecycleStore`` (retry-failed, retire). ``RunStore`` is all of them
at once, for the tools that act as several roles (the CLI, the demo, tests).
"""

from __future__ import annotations

import threading

import redis

from common.store.base import SOCKET_TIMEOUT_S, RunBase, connect, known_runs, retired_runs
from common.store.collector import CollectorStore, RunLock
from common.store.lifecycle import LifecycleStore, RetireOutcome
from common.store.model_pin import ModelPin
from common.store.producer import ACCEPT_CHUNK, ProducerStore
from common.store.reconcile import ReconcileStore
from common.store.status import RunCounts, StatusStore
from common.store.worker import LeaseOutcome, StoreOutcome, Taken, WorkerStore

__all__ = [
    "ACCEPT_CHUNK", "SOCKET_TIMEOUT_S", "CollectorStore", "LeaseOutcome", "LifecycleStore",
    "ModelPin", "ProducerStore", "ReconcileStore", "RetireOutcome", "RunBase", "RunCounts",
    "RunLock", "RunStore", "RunStores", "StatusStore", "StoreOutcome", "Taken", "WorkerStore",
    "connect", "known_runs", "retired_runs",
]  # fmt: skip


class RunStore(ProducerStore, WorkerStore, ReconcileStore, CollectorStore, LifecycleStore):
    """Every role's view of one run (for tools acting as several roles)."""

    @staticmethod
    def retired_runs(client: redis.Redis, prefix: str) -> list[str]:
        """Names of every retired run in this Redis."""
        return retired_runs(client, prefix)

    @staticmethod
    def known_runs(client: redis.Redis, prefix: str) -> list[str]:
        """Names of every run in this Redis."""
        return known_runs(client, prefix)


class RunStores:
    """One ``RunStore`` per run over one client, built on first use."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.r = client
        self.prefix = prefix
        self._stores: dict[str, RunStore] = {}
        self._lock = threading.Lock()

    def __call__(self, run: str) -> RunStore:
        with self._lock:
            if run not in self._stores:
                self._stores[run] = RunStore(self.r, self.prefix, run)
            return self._stores[run]
