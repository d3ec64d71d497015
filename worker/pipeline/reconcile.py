"""The reconciler: finds samples that fell through and puts them back in the queue.

Celery on Redis is at-least-once at best: a message can be lost (a retry whose publish failed,
a Redis restart losing its last second, a crash between two steps) and a dead worker's
messages only come back after the visibility timeout, hours away. The reconciler compares each
run's pending ids with the live leases and the broker's messages and re-publishes the rest.
A sample is re-published only when two passes in a row find it lost: a message is briefly in
neither the queue nor the unacked hash while a worker takes it, and the producer stores a
sample just before publishing it. A duplicate would be harmless (the worker acks it without
calling the model) but could sit behind the whole queue while its sample waits.

A pass's cost is bounded whatever ``max_pending`` is: it decodes the waiting messages only
when there are at most ``reconcile_scan_max`` of them. Above that it checks only the samples
it can judge without the queue (delivered messages, expired leases): a dead worker's samples
come back as fast as ever, and a sample whose message vanished is found once the queue is
short again (at the latest when the producer's input is all queued and the queue drains).
One process passes at a time, and its lock is extended while a pass runs.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis

from broker.scan import MessageRef, queued_count, queued_refs, unacked_refs
from common.clock import redis_time
from common.keys import reconciler_lock_key
from common.locks import HeldLock
from common.loop_errors import LoopErrors
from common.settings import Settings
from common.store import ReconcileStore, WorkerStore, known_runs
from worker.pipeline.aborts import Aborter
from worker.pipeline.ticker import Ticker

log = logging.getLogger("eaglegen.reconcile")
Publish = Callable[[str, list[str]], object]
Keep = Callable[[], bool]


def _always() -> bool:
    return True


@dataclass
class RunReport:
    """What one reconciliation pass found and fixed in one run."""

    run: str
    pending: int = 0
    expired_leases: list[str] = field(default_factory=list)
    republished: list[str] = field(default_factory=list)
    results_relisted: list[str] = field(default_factory=list)
    queue_scanned: bool = True
    aborted: int = 0  # requests of reaped leases aborted on their server

    @property
    def fixed(self) -> int:
        """Samples put back on their way."""
        return len(self.republished) + len(self.results_relisted)

    def line(self) -> str:
        """One line for logs and the CLI."""
        return (
            f"run {self.run}: pending {self.pending}, expired leases "
            f"{len(self.expired_leases)} ({self.aborted} requests aborted), re-enqueued "
            f"{len(self.republished)}, results "
            f"re-listed for the collector {len(self.results_relisted)}"
            + ("" if self.queue_scanned else " (queue too long to scan: lost messages later)")
        )


def lost_samples(
    pending: set[str], leased: set[str], refs: Iterable[MessageRef], now: float, grace: float
) -> set[str]:
    """Pending ids with neither a lease nor a message that is still alive.

    A queued message is alive. A delivered one is alive for ``grace`` seconds after its
    delivery (or its retry ETA): a live worker takes the lease at once, so a delivered message
    with no lease after that long belongs to a dead worker. ``now`` is Redis's clock; delivery
    times and ETAs are the workers' (kombu and Celery write them), which each worker checks
    against Redis's (worker/pipeline/clock_watch.py).
    """
    alive = {r.sample_id for r in refs if r.queued or now - r.since < grace}
    return pending - leased - alive


class Reconciler:
    """Runs reconciliation passes over every run (or one)."""

    def __init__(
        self, client: redis.Redis, settings: Settings, publish: Publish,
        aborter: Aborter | None = None,
    ) -> None:  # fmt: skip
        self.r = client
        self.settings = settings
        self.publish = publish
        # The requests of reaped leases are aborted: their holders no longer read them.
        self.aborter = aborter if aborter is not None else Aborter(client, settings)
        self._suspects: dict[str, set[str]] = {}  # run -> lost in the previous pass

    def run_once(self, runs: list[str] | None = None, keep: Keep = _always) -> list[RunReport]:
        """One pass; returns a report per run. ``keep`` False: the lock was lost, stop."""
        names = [r for r in runs or known_runs(self.r, self.settings.key_prefix)
                 if self._serves(r)]  # fmt: skip
        scanned = queued_count(self.r, self.settings.queue) <= self.settings.reconcile_scan_max
        refs = self._message_refs(scanned)
        reports = []
        for name in names:
            if not keep():
                break
            reports.append(self._reconcile(name, refs.get(name, []), scanned, keep))
        for report in reports:
            if report.fixed or report.expired_leases:
                log.warning("reconciled %s", report.line())
        return reports

    def _serves(self, run: str) -> bool:
        # Only our queue's runs: we see only our queue's messages, and what we re-publish goes
        # to our queue, whose workers may use other endpoints and another model.
        queue = ReconcileStore(self.r, self.settings.key_prefix, run).queue()
        return (queue or Settings.model_fields["queue"].default) == self.settings.queue

    def _message_refs(self, scan_queue: bool) -> dict[str, list[MessageRef]]:
        # Delivered messages are bounded by the workers' prefetch: always read.
        queued = queued_refs(self.r, self.settings.queue) if scan_queue else iter(())
        by_run: dict[str, list[MessageRef]] = defaultdict(list)
        for ref in [*queued, *unacked_refs(self.r)]:
            by_run[ref.run].append(ref)
        return by_run

    def _reconcile(
        self, run: str, refs: list[MessageRef], scanned: bool, keep: Keep
    ) -> RunReport:  # fmt: skip
        store = ReconcileStore(self.r, self.settings.key_prefix, run)
        holders = store.reap_expired()
        report = RunReport(run, expired_leases=list(holders), queue_scanned=scanned)
        if holders:
            # Their requests are aborted, and counted, as a worker taking them over would;
            # only the reaped holders' own: another worker may have taken a lease since.
            aborting = WorkerStore(self.r, self.settings.key_prefix, run)
            report.aborted = self.aborter.reaped_from(aborting, holders)
        pending = self._candidates(store, report, refs)
        if pending:
            lost = lost_samples(
                pending, store.leased_ids(), refs, redis_time(self.r), self.settings.lease_ttl
            )
            confirmed = lost & self._suspects.get(run, set())
            self._suspects[run] = lost - confirmed
            report.republished = sorted(confirmed)
            if confirmed and keep():
                self.publish(run, report.republished)
        report.results_relisted = [i for i in store.orphan_results() if store.requeue_result(i)]
        return report

    def _candidates(
        self, store: ReconcileStore, report: RunReport, refs: list[MessageRef]
    ) -> set[str]:
        """The pending ids this pass can judge: all of them when the queue was read."""
        if report.queue_scanned:
            pending = store.pending_ids()
            report.pending = len(pending)
            return pending
        report.pending = store.pending_count()
        judged = {ref.sample_id for ref in refs if not ref.queued} | set(report.expired_leases)
        return store.still_pending(judged)


class ReconcilerLoop:
    """Reconciliation passes in the background; per queue, one process cluster-wide runs
    each pass (the lock is the queue's: every pool's runs are reconciled by its own)."""

    def __init__(
        self, client: redis.Redis, settings: Settings, publish: Publish, lock: str | None = None,
        aborter: Aborter | None = None,
    ) -> None:  # fmt: skip
        self.reconciler = Reconciler(client, settings, publish, aborter)
        self.interval = settings.reconcile_interval
        # Shorter than the interval, so the lock is free again when the next pass is due.
        # ``lock``: another queue's own (capture's queue has its own lock).
        lock = lock or reconciler_lock_key(settings.key_prefix, settings.queue)
        self._lock = HeldLock(client, lock, self.interval * 0.9)
        self._ticker = Ticker(
            "reconciler", self.interval, self._tick, LoopErrors.of(client, settings)
        )

    def start(self) -> None:
        """Start passing every ``reconcile_interval`` seconds (once)."""
        self._ticker.start()

    def close(self) -> None:
        """Stop after the current pass."""
        self._ticker.close()

    def _tick(self) -> None:
        try:
            if self._lock.hold():
                self._pass()
        except redis.RedisError as exc:
            log.warning("reconciliation skipped: %s", exc)

    def _pass(self) -> None:
        started = time.monotonic()
        # Extended while the pass runs: a slow pass must not overlap another process's.
        with self._lock.kept() as keep:
            self.reconciler.run_once(keep=keep)
        took = time.monotonic() - started
        if took > self.interval:
            log.warning("a reconciliation pass took %.1f s (interval %.0f s)", took, self.interval)
