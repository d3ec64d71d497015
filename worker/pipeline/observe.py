"""What a worker process reports: run statistics in Redis, Prometheus metrics, a log summary."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis
from prometheus_client import CollectorRegistry

from common import errors
from common.keys import RunKeys
from common.logs import secrets_of
from common.loop_errors import LoopErrors
from common.metrics import RunCollector, WorkerMetrics, serve
from common.models import TurnResult
from common.settings import Settings
from common.stats import StatsRecorder
from worker.endpoints.server_cache import PrefixCacheCollector
from worker.pipeline.ticker import Ticker

log = logging.getLogger("eaglegen.worker")
# Turn and sample statistics are written this often: a killed worker loses at most this much
# of them (rates and distributions only; the exact counters are written with each sample).
STATS_FLUSH_S = 1.0


class Observer:
    """Counts every turn, error and finished sample in the run's stats, Prometheus and the log."""

    def __init__(
        self, client: redis.Redis, settings: Settings, in_flight: Callable[[], int]
    ) -> None:
        self.r = client
        self.settings = settings
        self.registry = CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry)
        self.summary = Summary()
        self._in_flight = in_flight
        self._secrets = secrets_of(settings)
        self._recorders: dict[str, StatsRecorder] = {}
        self._lock = threading.Lock()
        loops = LoopErrors.of(client, settings)
        every = min(self.summary.every_s, 15.0)
        self._ticker = Ticker("summary", every, self._log_summary, loops)
        self._flusher = Ticker("stats-flush", STATS_FLUSH_S, self.flush, loops)

    def start(self) -> None:
        """Serve Prometheus metrics (if a port is set) and log the summary every minute."""
        if self._ticker.started:
            return
        if self.settings.metrics_port:
            self.registry.register(RunCollector(self.r, self.settings))
            self.registry.register(PrefixCacheCollector(self.settings.endpoints))
            serve(self.registry, self.settings.metrics_port, self.settings.metrics_host)
        self._ticker.start()

    def start_flushing(self) -> None:
        """Write the run statistics added up in memory every ``STATS_FLUSH_S`` (once)."""
        self._flusher.start()

    def close(self) -> None:
        """Stop the summary and flush threads; write what is left."""
        self._ticker.close()
        self._flusher.close()
        self.flush()

    def flush(self) -> None:
        """Write every run's statistics added up since the last flush."""
        with self._lock:
            recorders = list(self._recorders.values())
        for recorder in recorders:
            try:
                recorder.flush()
            except redis.RedisError as exc:
                log.warning("run statistics not written (%s); kept for the next try", exc)

    def recorder(self, run: str) -> StatsRecorder:
        """The run's statistics writer (cached)."""
        with self._lock:
            if run not in self._recorders:
                keys = RunKeys(self.settings.key_prefix, run)
                self._recorders[run] = StatsRecorder(self.r, keys, self._secrets)
            return self._recorders[run]

    def turn(self, run: str, turn: TurnResult) -> None:
        """A turn came back from the model."""
        tokens = turn.usage.completion_tokens
        dropped = turn.token_ids_dropped is not None
        if dropped:
            log.warning("%s: token ids dropped from a turn: they %s", turn.endpoint,
                        turn.token_ids_dropped)  # fmt: skip
        recorder = self.recorder(run)
        recorder.turn(turn.endpoint, turn.latency_s, tokens, turn.resumed_from_tokens, dropped)
        self.metrics.turn(turn.endpoint, turn.latency_s, tokens, turn.resumed_from_tokens)
        if turn.discarded_tokens:  # a checkpoint it could not continue: generated again
            recorder.discarded(turn.discarded_tokens)
            self.metrics.wasted.labels(turn.endpoint).inc(turn.discarded_tokens)
        self.summary.add(turns=1, tokens=tokens)

    def error(self, run: str, exc: errors.GenerationError) -> None:
        """An attempt failed; the tokens it streamed are wasted. A hand-back or a takeover is
        no error: counted apart, and not against its endpoint."""
        if isinstance(exc, errors.HandedBack | errors.LeaseLost):
            self.recorder(run).handoff(exc.kind, exc.tokens_streamed)
            self.metrics.error(exc.endpoint or "none", exc.kind, exc.tokens_streamed)
            return
        self.recorder(run).error(exc.kind, str(exc), exc.endpoint, exc.tokens_streamed)
        self.metrics.error(exc.endpoint or "none", exc.kind, exc.tokens_streamed)
        self.summary.add(errors=1)

    def finished(self, run: str, tokens: int, kept: bool) -> None:
        """A sample's record was stored (kept) or was a duplicate."""
        self.recorder(run).finished(tokens, kept=kept)
        self.summary.add(samples=1)

    def _log_summary(self) -> None:
        self.summary.maybe_log(self._in_flight())


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
