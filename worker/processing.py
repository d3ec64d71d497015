"""Per-process worker state: Redis, HTTP clients, held leases; created lazily after fork."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable

import redis
from prometheus_client import CollectorRegistry

from common import errors
from common.keys import reconciler_lock_key
from common.logs import secrets_of
from common.metrics import WorkerMetrics
from common.models import Failure, GenParams, Sample, TurnResult
from common.redact import redact
from common.settings import Settings
from common.stats import StatsRecorder
from common.store import RunStore, connect
from worker.endpoints import EndpointPool
from worker.generate import Messages, answer_turns, build_record

log = logging.getLogger("eaglegen.worker")
Publish = Callable[[str, list[str]], object]


class WorkerRuntime:
    """Everything a task needs, built once per worker process."""

    def __init__(self, settings: Settings, publish: Publish) -> None:
        self.settings = settings
        self.publish = publish
        self.redis: redis.Redis = connect(settings.redis_url, settings.redis_sentinel_master)
        self.endpoints = EndpointPool(settings, self.redis)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stores: dict[str, RunStore] = {}
        self._params: dict[str, GenParams] = {}
        self._recorders: dict[str, StatsRecorder] = {}
        self.registry = CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry)
        self._summary = Summary()
        self._secrets = secrets_of(settings)
        # (run, id) -> (lease token, cancel event). A token per generation, not per process:
        # a duplicate message taken by another thread of this process must not share a lease.
        self._held: dict[tuple[str, str], tuple[str, threading.Event]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._drain_deadline: float | None = None
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)
        self._renewer.start()
        self._reconciler: threading.Thread | None = None

    def serve_metrics(self) -> None:
        """Expose this process's request metrics (and run gauges) for Prometheus, if enabled."""
        if self.settings.metrics_port:
            from common.metrics import RunCollector, serve

            self.registry.register(RunCollector(self.redis, self.settings))
            serve(self.registry, self.settings.metrics_port, self.settings.metrics_host)

    def start_reconciler(self) -> None:
        """Run reconciliation passes in the background (one process cluster-wide at a time)."""
        if self._reconciler is None:
            self._reconciler = threading.Thread(
                target=self._reconcile_loop, name="reconciler", daemon=True
            )
            self._reconciler.start()

    def begin_drain(self) -> None:
        """SIGTERM: let in-flight generations finish within the grace time, then hand back."""
        self._drain_deadline = time.monotonic() + self.settings.shutdown_grace
        log.warning(
            "stopping: in-flight samples get %.0f s to finish, then go back to the queue",
            self.settings.shutdown_grace,
        )

    def store(self, run: str) -> RunStore:
        """The run's store (cached)."""
        with self._lock:
            if run not in self._stores:
                self._stores[run] = RunStore(self.redis, self.settings.key_prefix, run)
            return self._stores[run]

    def params(self, run: str) -> GenParams:
        """The run's generation parameters (fixed for its life, so cached)."""
        if run not in self._params:
            found = self.store(run).params()
            if found is None:
                raise errors.PermanentError(f"run {run!r} has no parameters in Redis")
            self._params[run] = found
        return self._params[run]

    def process(self, run: str, sample_id: str) -> str:
        """Generate one sample under a lease; returns what happened (for the task's result)."""
        store = self.store(run)
        token = f"{self.owner}:{uuid.uuid4().hex[:8]}"
        outcome = store.acquire(sample_id, token, self.settings.lease_ttl)
        if outcome != "ok":
            log.debug("skip %s/%s: %s", run, sample_id, outcome)
            return f"skipped:{outcome}"
        cancelled = self._hold(run, sample_id, token)
        try:
            return self._generate(store, sample_id, cancelled)
        finally:
            self._drop(run, sample_id)
            store.release(sample_id, token)

    def _generate(self, store: RunStore, sample_id: str, cancelled: threading.Event) -> str:
        sample = store.load_sample(sample_id)
        if sample is None:
            raise errors.PermanentError(f"sample {sample_id} has no stored prompt")
        params = self.params(store.run)

        def check() -> None:
            if cancelled.is_set():
                raise errors.LeaseLost(f"lease on {sample_id} taken by another worker")
            if self._drain_deadline is not None and time.monotonic() > self._drain_deadline:
                raise errors.HandedBack(f"worker stopping; {sample_id} goes back to the queue")

        turns = answer_turns(
            sample, params, store.load_partial(sample_id),
            call=lambda messages: self._call(store.run, messages, params, check),
            save=lambda done: store.save_partial(sample_id, done),
        )  # fmt: skip
        return self._finish(store, sample, params, turns)

    def _call(self, run: str, messages: Messages, params: GenParams, check: object) -> TurnResult:
        recorder = self.recorder(run)
        try:
            with self.endpoints.borrow(check) as client:  # type: ignore[arg-type]
                turn = client.complete(messages, params, check)  # type: ignore[arg-type]
        except errors.GenerationError as exc:
            recorder.error(exc.kind, str(exc), exc.endpoint, exc.tokens_streamed)
            self.metrics.error(exc.endpoint or "none", exc.kind, exc.tokens_streamed)
            self._summary.add(errors=1)
            raise
        recorder.turn(turn.endpoint, turn.latency_s, turn.usage.completion_tokens)
        self.metrics.turn(turn.endpoint, turn.latency_s, turn.usage.completion_tokens)
        self._summary.add(turns=1, tokens=turn.usage.completion_tokens)
        return turn

    def recorder(self, run: str) -> StatsRecorder:
        """The run's statistics writer (cached)."""
        with self._lock:
            if run not in self._recorders:
                store = RunStore(self.redis, self.settings.key_prefix, run)
                self._recorders[run] = StatsRecorder(self.redis, store.keys, self._secrets)
            return self._recorders[run]

    def _finish(
        self, store: RunStore, sample: Sample, params: GenParams, turns: list[TurnResult]
    ) -> str:
        record = build_record(store.run, sample, params, turns, store.attempts(sample.id))
        tokens = sum(t.usage.completion_tokens for t in turns)
        stored = store.store_result(sample.id, record.to_json(), tokens)
        self.recorder(store.run).finished(tokens, kept=stored)
        self._summary.add(samples=1)
        outcome = "done" if stored else "duplicate"
        log.debug(
            "sample run=%s id=%s outcome=%s turns=%d tokens=%d attempts=%d latency_s=%.2f",
            store.run, sample.id, outcome, len(turns), tokens, record.generation.attempts,
            record.generation.latency_s,
        )  # fmt: skip
        return outcome

    def fail(self, run: str, sample_id: str, exc: errors.GenerationError) -> None:
        """Record a sample as failed, with the error's class and message."""
        store = self.store(run)
        # The reason is kept in Redis and shown by `status`; a server may quote the key back.
        message = redact(str(exc), secrets_of(self.settings))[:1000]
        failure = Failure(
            kind=exc.kind, message=message, attempts=store.attempts(sample_id), at=time.time()
        )
        store.store_failure(sample_id, failure)
        log.warning("failed %s/%s: %s", run, sample_id, failure.message)

    def _hold(self, run: str, sample_id: str, token: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._held[(run, sample_id)] = (token, event)
        return event

    def _drop(self, run: str, sample_id: str) -> None:
        with self._lock:
            self._held.pop((run, sample_id), None)

    def _renew_loop(self) -> None:
        # Leases are renewed by time, not by stream progress: a server that queues a request
        # for minutes must not make us look dead; a dead process stops renewing at once.
        while not self._stop.wait(self.settings.lease_ttl / 3):
            try:
                self._renew_once()
            except redis.RedisError as exc:
                log.warning("lease renewal failed: %s", exc)
            self._summary.maybe_log(len(self._held))

    def _renew_once(self) -> None:
        with self._lock:
            by_run: dict[str, list[tuple[str, str]]] = defaultdict(list)
            for (run, sample_id), (token, _) in self._held.items():
                by_run[run].append((sample_id, token))
        for run, held in by_run.items():
            for lost in self.store(run).renew(held, self.settings.lease_ttl):
                with self._lock:
                    entry = self._held.get((run, lost))
                if entry is not None:
                    entry[1].set()

    def _reconcile_loop(self) -> None:
        from worker.reconcile import Reconciler

        reconciler = Reconciler(self.redis, self.settings, self.publish)
        interval = self.settings.reconcile_interval
        lock = reconciler_lock_key(self.settings.key_prefix)
        while not self._stop.wait(interval):
            try:
                # One reconciler per cluster per interval: the lock outlives the pass.
                if self.redis.set(lock, self.owner, nx=True, px=int(interval * 900)):
                    reconciler.run_once()
            except redis.RedisError as exc:
                log.warning("reconciliation skipped: %s", exc)

    def close(self) -> None:
        """Stop renewing and close connections."""
        self._stop.set()
        self.endpoints.close()
        self.redis.close()


class Summary:
    """Counts for the periodic info-level line a worker logs."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._counts = {"samples": 0, "turns": 0, "tokens": 0, "errors": 0}

    def add(self, **amounts: int) -> None:
        """Count finished samples, turns, tokens or errors."""
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def maybe_log(self, in_flight: int) -> None:
        """Log and reset the counts once ``every_s`` has passed."""
        with self._lock:
            elapsed = time.monotonic() - self._since
            if elapsed < self.every_s:
                return
            c, self._counts = self._counts, dict.fromkeys(self._counts, 0)
            self._since = time.monotonic()
        log.info(
            "last %.0f s: %d samples, %d turns, %d tokens (%.1f tok/s), %d errors; %d in flight",
            elapsed, c["samples"], c["turns"], c["tokens"], c["tokens"] / elapsed, c["errors"],
            in_flight,
        )  # fmt: skip
