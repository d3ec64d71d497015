"""What the simulated server counts: stats, vLLM-named Prometheus metrics, the generation log."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import prometheus_client as prom

from simulator.admission import Slots


@dataclass
class Stats:
    """Counters behind GET /sim/stats."""

    requests: int = 0
    completed: int = 0
    aborted: int = 0
    aborted_by_request: int = 0  # of them, stopped by POST /inference/v1/abort_requests
    rejected: int = 0
    tokens_generated: int = 0
    prefill_tokens_computed: int = 0  # prompt tokens not found in the prefix cache
    prefix_cache_queries: int = 0  # prompt tokens looked up, as vLLM counts them
    prefix_cache_hits: int = 0  # of those, tokens found cached
    hidden_states: int = 0  # hidden-state files written (--hidden-states-model)
    faults: Counter[str] = field(default_factory=Counter)
    generations_by_key: Counter[str] = field(default_factory=Counter)


class Metrics:
    """vLLM-named Prometheus metrics in a registry owned by one app."""

    def __init__(self, model_name: str, slots: Slots) -> None:
        self.registry = prom.CollectorRegistry()
        self._labels = {"model_name": model_name}
        self._gauge("vllm:num_requests_running", "Sequences running.", lambda: slots.running)
        self._gauge("vllm:num_requests_waiting", "Requests waiting.", lambda: slots.waiting)

        def usage() -> float:
            # Each sequence is assumed to fill an equal share of the KV cache.
            return min(1.0, slots.running / slots.capacity)

        self._gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100%).", usage)
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = self._counter("vllm:generation_tokens", "Tokens generated.")
        self.prefix_cache_queries = self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self._success = prom.Counter(
            "vllm:request_success",
            "Finished requests.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )

    def success(self, finish_reason: str) -> None:
        """Count one successfully finished request."""
        self._success.labels(finished_reason=finish_reason, **self._labels).inc()

    def exposition(self) -> bytes:
        """Return the Prometheus text exposition."""
        return prom.generate_latest(self.registry)

    def _gauge(self, name: str, doc: str, value: Callable[[], float]) -> None:
        gauge = prom.Gauge(name, doc, ["model_name"], registry=self.registry)
        gauge.labels(**self._labels).set_function(value)

    def _counter(self, name: str, doc: str) -> prom.Counter:
        counter = prom.Counter(name, doc, ["model_name"], registry=self.registry)
        return counter.labels(**self._labels)


class GenerationLog:
    """Append-only JSONL log of generation ends, flushed per line so it survives kills."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line (no-op without a path)."""
        if self.path is None:
            return
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file if it was opened."""
        if self._file is not None:
            self._file.close()
            self._file = None
