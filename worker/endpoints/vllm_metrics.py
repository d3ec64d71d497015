"""Reading vLLM's Prometheus ``/metrics``: where it is, and the values of named families.

The adaptive caps (gauges: running, waiting, KV-cache usage) and the prefix-cache figures
(counters: tokens looked up and found) both read it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

from prometheus_client.parser import text_string_to_metric_families

from worker.chat import transport

METRICS_BODY = 8 << 20  # bytes: vLLM's exposition is far smaller; more is not one
# What a read of /metrics may raise: no answer, or an exposition that does not parse.
READ_ERRORS = (transport.TransportError, ValueError, TypeError, IndexError, KeyError)


class MetricsReader:
    """GETs servers' ``/metrics`` on the one HTTP stack: keep-alive connections per server,
    each read bounded as a whole (connect, head and body) by its timeout."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._pools: dict[str, transport.Connections] = {}
        self._lock = threading.Lock()

    def text(self, endpoint: str) -> str:
        """The exposition of ``endpoint``'s server; TransportError or ValueError if none."""
        url = metrics_url(endpoint)
        status, body = self._pool(url).get(url, self.timeout, METRICS_BODY)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        return body.decode("utf-8", "replace")

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    def _pool(self, url: str) -> transport.Connections:
        with self._lock:
            if url not in self._pools:
                self._pools[url] = transport.Connections(
                    url, {}, self.timeout, self.timeout, max_idle=2
                )
            return self._pools[url]


def metrics_url(endpoint: str) -> str:
    """vLLM serves /metrics at the root, beside /v1."""
    return endpoint.removesuffix("/v1") + "/metrics"


def family_values(text: str, names: Collection[str]) -> dict[str, list[float]]:
    """Each named family's sample values (one per engine or model), by family name.

    A counter's family is named without ``_total`` and its samples with it; both are found.
    """
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removesuffix("_total")
        if name in names:
            wanted = (name, f"{name}_total")
            found.setdefault(name, []).extend(s.value for s in family.samples if s.name in wanted)
    return found
