"""The servers' own prefix-cache figures, read from their ``/metrics`` (vLLM's counters).

vLLM counts, in tokens, the prompt tokens it looked up in its prefix cache
(``vllm:prefix_cache_queries``) and those it found (``vllm:prefix_cache_hits``), since it
started. ``eaglegen status`` and the Prometheus endpoints show them per endpoint, with their
ratio; a server that has no such counters (another engine, an old vLLM) shows none.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.endpoints.vllm_metrics import family_values, metrics_url

QUERIES = "vllm:prefix_cache_queries"
HITS = "vllm:prefix_cache_hits"
TIMEOUT_S = 2.0  # a loaded server renders /metrics slowly; status must not hang on it


@dataclass(frozen=True)
class CacheCounters:
    """One server's prefix-cache counters, in tokens, since it started."""

    queries: float
    hits: float

    @property
    def hit_rate(self) -> float | None:
        """Hits per token looked up (None before the first lookup)."""
        return self.hits / self.queries if self.queries else None

    def as_dict(self) -> dict[str, float | None]:
        """The JSON form ``status`` shows."""
        rate = self.hit_rate
        return {"queries": self.queries, "hits": self.hits,
                "hit_rate": None if rate is None else round(rate, 4)}  # fmt: skip


def parse_prefix_cache(text: str) -> CacheCounters | None:
    """The counters in a Prometheus exposition (summed over engines), or None without them."""
    values = family_values(text, (QUERIES, HITS))
    if QUERIES not in values:
        return None
    return CacheCounters(sum(values[QUERIES]), sum(values.get(HITS, [])))


def read_prefix_caches(
    endpoints: Sequence[str], timeout: float = TIMEOUT_S
) -> dict[str, CacheCounters | None]:
    """Every endpoint's counters, read in parallel; None where a server has none or is silent."""
    if not endpoints:
        return {}
    with (
        httpx.Client(timeout=timeout) as http,
        ThreadPoolExecutor(max_workers=min(len(endpoints), 8)) as pool,
    ):
        found = pool.map(lambda url: _read(http, url), endpoints)
        return dict(zip(endpoints, found, strict=True))


def _read(http: httpx.Client, endpoint: str) -> CacheCounters | None:
    try:
        response = http.get(metrics_url(endpoint))
        response.raise_for_status()
        return parse_prefix_cache(response.text)
    except (httpx.HTTPError, ValueError):
        return None


class PrefixCacheCollector(Collector):
    """Each endpoint's prefix-cache counters and hit rate, read from it at scrape time."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = list(endpoints)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["endpoint"]
        queries = CounterMetricFamily(
            "eaglegen_endpoint_prefix_cache_queries",
            "Prompt tokens the server looked up in its prefix cache since it started",
            labels=labels,
        )
        hits = CounterMetricFamily(
            "eaglegen_endpoint_prefix_cache_hits",
            "Prompt tokens the server found in its prefix cache since it started",
            labels=labels,
        )
        rate = GaugeMetricFamily(
            "eaglegen_endpoint_prefix_cache_hit_rate",
            "Prefix-cache hits per token looked up, since the server started",
            labels=labels,
        )
        for url, counters in read_prefix_caches(self.endpoints).items():
            if counters is None:
                continue
            queries.add_metric([url], counters.queries)
            hits.add_metric([url], counters.hits)
            if counters.hit_rate is not None:
                rate.add_metric([url], counters.hit_rate)
        yield from (queries, hits, rate)
