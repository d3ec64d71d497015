"""Prometheus metrics: per-process request metrics from workers, run-level gauges from Redis.

Flower exports task events but no queue depth; these fill the gap. Workers serve their own
request counters and latency histograms; ``eaglegen exporter`` serves every run's state
(queued, in flight, done, failed, written, tokens) read from Redis at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.settings import Settings
from common.stats import read_snapshot
from common.store import RunStore

LATENCY_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)


class WorkerMetrics:
    """One worker process's request metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "eaglegen_requests", "Model calls by endpoint and outcome (ok or error class)",
            ["endpoint", "outcome"], registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "eaglegen_completion_tokens", "Completion tokens received", ["endpoint"],
            registry=registry,
        )  # fmt: skip
        self.wasted = Counter(
            "eaglegen_wasted_tokens", "Tokens streamed by attempts that failed", ["endpoint"],
            registry=registry,
        )  # fmt: skip
        self.resumed = Counter(
            "eaglegen_resumed_tokens",
            "Tokens of turns continued from a checkpoint instead of generated again",
            ["endpoint"], registry=registry,
        )  # fmt: skip
        self.aborted = Counter(
            "eaglegen_aborted_requests", "Orphaned requests aborted on their server",
            ["endpoint"], registry=registry,
        )  # fmt: skip
        self.abort_saved = Counter(
            "eaglegen_abort_saved_tokens",
            "Tokens aborted requests had left of max_tokens (at most what the aborts saved)",
            ["endpoint"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "eaglegen_request_latency_seconds", "Seconds per assistant turn", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.inflight = Gauge(
            "eaglegen_inflight", "Requests this process has in flight", ["endpoint"],
            registry=registry,
        )  # fmt: skip

    def turn(self, endpoint: str, latency_s: float, tokens: int, resumed: int = 0) -> None:
        """A successful turn (``resumed``: its tokens that came from a checkpoint)."""
        self.requests.labels(endpoint, "ok").inc()
        self.tokens.labels(endpoint).inc(tokens)
        if resumed:
            self.resumed.labels(endpoint).inc(resumed)
        self.latency.labels(endpoint).observe(latency_s)

    def abort(self, endpoint: str, saved_tokens: int) -> None:
        """An orphaned request aborted on its server."""
        self.aborted.labels(endpoint).inc()
        self.abort_saved.labels(endpoint).inc(saved_tokens)

    def error(self, endpoint: str, kind: str, wasted_tokens: int) -> None:
        """A failed attempt."""
        self.requests.labels(endpoint, kind).inc()
        self.wasted.labels(endpoint).inc(wasted_tokens)


class RunCollector(Collector):
    """Every run's figures, read from Redis at scrape time."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = GaugeMetricFamily(
            "eaglegen_run_samples", "Samples of a run by state", labels=["run", "state"]
        )
        tokens = GaugeMetricFamily(
            "eaglegen_run_tokens", "Completion tokens of a run: kept or wasted",
            labels=["run", "kind"],
        )  # fmt: skip
        retries = GaugeMetricFamily("eaglegen_run_retries", "Retries of a run", labels=["run"])
        for run in RunStore.known_runs(self.r, self.settings.key_prefix):
            self._add_run(RunStore(self.r, self.settings.key_prefix, run), samples, tokens, retries)
        yield from (samples, tokens, retries)

    def _add_run(
        self, store: RunStore, samples: GaugeMetricFamily, tokens: GaugeMetricFamily,
        retries: GaugeMetricFamily,
    ) -> None:  # fmt: skip
        counts = store.counts()
        for state in ("total", "queued", "in_flight", "done", "failed", "written"):
            samples.add_metric([store.run, state], getattr(counts, state))
        snap = read_snapshot(self.r, store.keys)
        tokens.add_metric([store.run, "kept"], counts.completion_tokens)
        tokens.add_metric([store.run, "wasted"], snap.wasted_tokens)
        saved = store.r.hget(store.keys.counters, "abort_saved_tokens")
        tokens.add_metric([store.run, "abort_saved"], int(saved or 0))
        retries.add_metric([store.run], counts.retries)


def serve(registry: CollectorRegistry, port: int, host: str) -> None:
    """Serve ``registry`` on http://host:port/metrics in a background thread."""
    start_http_server(port, addr=host, registry=registry)
