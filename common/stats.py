"""Run statistics: throughput, latency and token distributions, errors, goodput.

Everything is kept in a handful of Redis hashes per run, updated with HINCRBY (added up in each
worker and written about once a second), so reading a run's figures costs a few round trips
whatever its size (1M samples included). Rates come from 10-second buckets that expire;
percentiles from fixed histogram buckets.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from common import lua
from common.keys import RunKeys
from common.redact import redact

BUCKET_S = 10
RATE_WINDOW_S = 60
# Upper bounds of histogram buckets (seconds, tokens): roughly x1.5 steps.
LATENCY_BOUNDS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240, 480, 900, 1800, 3600)
TOKEN_BOUNDS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def bucket_index(value: float, bounds: tuple[float, ...]) -> int:
    """Index of the first bucket whose upper bound holds ``value`` (len(bounds) = overflow)."""
    for i, bound in enumerate(bounds):
        if value <= bound:
            return i
    return len(bounds)


def percentile(counts: dict[int, int], bounds: tuple[float, ...], q: float) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` (None without data)."""
    total = sum(counts.values())
    if not total:
        return None
    rank = math.ceil(q * total)
    seen = 0
    for i in sorted(counts):
        seen += counts[i]
        if seen >= rank:
            return float(bounds[i]) if i < len(bounds) else math.inf
    return math.inf


def eta_seconds(remaining: int, rate_per_s: float) -> float | None:
    """Seconds left at the current rate (None when nothing moves)."""
    if remaining <= 0:
        return 0.0
    return remaining / rate_per_s if rate_per_s > 0 else None


@dataclass
class Snapshot:
    """What ``status`` shows beyond the basic counts."""

    turns: int = 0
    completion_tokens_turns: int = 0
    latency_sum: float = 0.0
    samples_per_s_minute: float = 0.0
    tokens_per_s_minute: float = 0.0
    latency_p95: float | None = None
    tokens_p95: float | None = None
    wasted_tokens: int = 0
    resumed_turns: int = 0  # turns continued from a checkpoint
    resumed_tokens: int = 0  # tokens those turns did not generate again
    ids_dropped_turns: int = 0  # turns whose server ids disagreed with their text: kept without
    discarded_checkpoints: int = 0  # checkpoints no proven continuation could take on
    last_finished_at: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    last_errors: dict[str, str] = field(default_factory=dict)
    # Samples given back by a stopping worker, or taken over by another: not errors.
    handoffs: dict[str, int] = field(default_factory=dict)
    endpoints: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def mean_latency(self) -> float | None:
        """Mean seconds per turn."""
        return self.latency_sum / self.turns if self.turns else None

    @property
    def mean_tokens(self) -> float | None:
        """Mean completion tokens per turn."""
        return self.completion_tokens_turns / self.turns if self.turns else None

    def as_dict(self) -> dict[str, Any]:
        """JSON form, merged into ``status --json``."""
        return {
            "samples_per_s_last_minute": round(self.samples_per_s_minute, 3),
            "tokens_per_s_last_minute": round(self.tokens_per_s_minute, 1),
            "turns": self.turns,
            "mean_latency_s": _round(self.mean_latency),
            "p95_latency_s": self.latency_p95,
            "mean_completion_tokens": _round(self.mean_tokens),
            "p95_completion_tokens": self.tokens_p95,
            # Percentiles come from fixed histogram buckets: each is its bucket's upper edge.
            "p95_is_upper_bound": True,
            "wasted_tokens": self.wasted_tokens,
            "errors": self.errors,
            "last_errors": self.last_errors,
            "handoffs": self.handoffs,
            "endpoints": self.endpoints,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class StatsBatch:
    """Statistics added up in memory between two writes: increments per (hash, field)."""

    ints: Counter[tuple[str, str]] = field(default_factory=Counter)
    floats: dict[tuple[str, str], float] = field(default_factory=dict)
    expiring: set[str] = field(default_factory=set)  # rate buckets touched
    last_finished_at: float | None = None

    def add(self, key: str, name: str, amount: int) -> None:
        """Count ``amount`` more in a hash field."""
        self.ints[(key, name)] += amount

    def add_float(self, key: str, name: str, amount: float) -> None:
        """Add ``amount`` to a hash field holding a sum of seconds."""
        self.floats[(key, name)] = self.floats.get((key, name), 0.0) + amount

    def merge(self, other: StatsBatch) -> None:
        """Take in a batch that could not be written (it goes out with the next write)."""
        self.ints.update(other.ints)
        for where, amount in other.floats.items():
            self.add_float(*where, amount)
        self.expiring |= other.expiring
        if other.last_finished_at is not None:
            self.last_finished_at = max(self.last_finished_at or 0.0, other.last_finished_at)

    def __bool__(self) -> bool:
        return bool(self.ints or self.floats or self.last_finished_at is not None)

    def write(self, ops: StatsOps, stats_key: str) -> None:
        """Add the batch's writes to ``ops``."""
        for (key, name), amount in self.ints.items():
            ops.add("i", key, name, amount)
        for (key, name), total in self.floats.items():
            ops.add("f", key, name, total)
        for bucket in self.expiring:
            ops.add("e", bucket, "", RATE_WINDOW_S * 3)
        if self.last_finished_at is not None:
            ops.add("s", stats_key, "last_finished_at", repr(self.last_finished_at))


class StatsOps:
    """Statistics writes for one ``STATS_WRITE`` call: refused as a whole on a retired run."""

    def __init__(self, keys: RunKeys) -> None:
        self.keys = [keys.retired]
        self.args: list[str | int | float] = []

    def add(self, op: str, key: str, name: str, value: str | int | float) -> None:
        """One write: op 'i' HINCRBY, 'f' HINCRBYFLOAT, 's' HSET, 'e' EXPIRE."""
        if key not in self.keys:
            self.keys.append(key)
        self.args += [op, self.keys.index(key) + 1, name, value]

    def send(self, client: redis.Redis) -> None:
        """Write them all, unless the run is retired."""
        client.register_script(lua.STATS_WRITE)(keys=self.keys, args=self.args)


class StatsRecorder:
    """Writes a run's statistics; one per (process, run).

    Turns and finished samples are added up in memory and written by ``flush()``, which a
    worker calls about once a second: one round trip a second instead of two per sample. They
    feed rates, latency and token distributions; a worker killed outright loses at most its
    last second of them. What must stay exact (done, failed, written, completion tokens,
    retries, redeliveries) is written by the store's scripts with the transition itself.
    Errors are rare and written at once.
    """

    def __init__(self, client: redis.Redis, keys: RunKeys, secrets: list[str]) -> None:
        self.r = client
        self.keys = keys
        self.secrets = secrets
        self._batch = StatsBatch()
        self._lock = threading.Lock()

    def turn(
        self, endpoint: str, latency_s: float, completion_tokens: int, resumed_from: int = 0,
        ids_dropped: bool = False,
    ) -> None:  # fmt: skip
        """A turn came back from the model (``resumed_from``: tokens it continued from a
        checkpoint instead of generating them again)."""
        k = self.keys
        with self._lock:
            b = self._batch
            b.add(k.stats, "turns", 1)
            b.add(k.stats, "turn_tokens", completion_tokens)
            b.add_float(k.stats, "latency_sum", latency_s)
            b.add(k.stats, f"lat:{bucket_index(latency_s, LATENCY_BOUNDS)}", 1)
            b.add(k.stats, f"tok:{bucket_index(completion_tokens, TOKEN_BOUNDS)}", 1)
            b.add(k.endpoint_stats, f"{endpoint}|requests", 1)
            b.add(k.endpoint_stats, f"{endpoint}|tokens", completion_tokens)
            b.add_float(k.endpoint_stats, f"{endpoint}|latency_sum", latency_s)
            if resumed_from:
                b.add(k.stats, "resumed", 1)
                b.add(k.stats, "resumed_tokens", resumed_from)
            if ids_dropped:
                b.add(k.stats, "ids_dropped", 1)

    def discarded(self, tokens: int) -> None:
        """Checkpointed tokens a turn could not continue from and generated again (wasted)."""
        with self._lock:
            self._batch.add(self.keys.stats, "wasted_tokens", tokens)
            self._batch.add(self.keys.stats, "discarded_checkpoints", 1)

    def finished(self, tokens: int, kept: bool, now: float | None = None) -> None:
        """A sample's result was stored (kept) or was a duplicate (its tokens wasted)."""
        now = time.time() if now is None else now
        with self._lock:
            b = self._batch
            if not kept:
                b.add(self.keys.stats, "wasted_tokens", tokens)
                return
            # The time of the last stored result: rates freeze there once the run completes.
            b.last_finished_at = max(b.last_finished_at or 0.0, now)
            bucket = self.keys.rate_bucket(int(now) // BUCKET_S)
            b.add(bucket, "samples", 1)
            b.add(bucket, "tokens", tokens)
            b.expiring.add(bucket)

    def flush(self) -> None:
        """Write what was added up since the last flush, in one round trip."""
        with self._lock:
            batch, self._batch = self._batch, StatsBatch()
        if not batch:
            return
        # A run retired since the last flush keeps only its summary: the script refuses the
        # writes that would bring its statistics keys back.
        ops = StatsOps(self.keys)
        batch.write(ops, self.keys.stats)
        try:
            ops.send(self.r)
        except redis.RedisError:
            with self._lock:  # kept for the next flush rather than lost
                self._batch.merge(batch)
            raise

    def handoff(self, kind: str, wasted_tokens: int) -> None:
        """A sample handed back or taken over: no error, and none of its endpoint's (refused
        on a retired run: a worker letting a sample go after ``runs retire --force`` must not
        bring the run's statistics back)."""
        ops = StatsOps(self.keys)
        ops.add("i", self.keys.stats, f"handoff:{kind}", 1)
        ops.add("i", self.keys.stats, "wasted_tokens", wasted_tokens)
        ops.send(self.r)

    def error(self, kind: str, message: str, endpoint: str | None, wasted_tokens: int) -> None:
        """An attempt failed; tokens it had streamed are thrown away."""
        k = self.keys
        ops = StatsOps(k)
        ops.add("i", k.stats, f"err:{kind}", 1)
        ops.add("s", k.stats, f"lasterr:{kind}", redact(message, self.secrets)[:300])
        ops.add("i", k.stats, "wasted_tokens", wasted_tokens)
        if endpoint:
            ops.add("i", k.endpoint_stats, f"{endpoint}|errors", 1)
        ops.send(self.r)


def read_snapshot(
    client: redis.Redis, keys: RunKeys, now: float | None = None, since: float | None = None
) -> Snapshot:
    """Everything ``status`` shows beyond the counts, in one round trip.

    ``since`` (the run's start) bounds the rate window, so a young run's rate is not diluted
    by the seconds before it existed.
    """
    now = time.time() if now is None else now
    first = int(now - RATE_WINDOW_S) // BUCKET_S + 1
    buckets = [keys.rate_bucket(b) for b in range(first, int(now) // BUCKET_S + 1)]
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.stats)
    pipe.hgetall(keys.endpoint_stats)
    for bucket in buckets:
        pipe.hmget(bucket, ["samples", "tokens"])
    stats, endpoint_stats, *rates = pipe.execute()
    snap = _from_stats(stats)
    # The current bucket is partly filled: divide by the time actually covered.
    covered = max(min(now - first * BUCKET_S, now - (since or 0.0)), 1.0)
    snap.samples_per_s_minute = sum(int(r[0] or 0) for r in rates) / covered
    snap.tokens_per_s_minute = sum(int(r[1] or 0) for r in rates) / covered
    snap.endpoints = _endpoints(endpoint_stats)
    return snap


def _from_stats(stats: dict[str, str]) -> Snapshot:
    snap = Snapshot(
        turns=int(stats.get("turns", 0)),
        completion_tokens_turns=int(stats.get("turn_tokens", 0)),
        latency_sum=float(stats.get("latency_sum", 0.0)),
        wasted_tokens=int(stats.get("wasted_tokens", 0)),
        resumed_turns=int(stats.get("resumed", 0)),
        resumed_tokens=int(stats.get("resumed_tokens", 0)),
        ids_dropped_turns=int(stats.get("ids_dropped", 0)),
        discarded_checkpoints=int(stats.get("discarded_checkpoints", 0)),
        last_finished_at=float(stats["last_finished_at"]) if "last_finished_at" in stats else None,
    )
    lat = {int(k[4:]): int(v) for k, v in stats.items() if k.startswith("lat:")}
    tok = {int(k[4:]): int(v) for k, v in stats.items() if k.startswith("tok:")}
    snap.latency_p95 = percentile(lat, LATENCY_BOUNDS, 0.95)
    snap.tokens_p95 = percentile(tok, TOKEN_BOUNDS, 0.95)
    snap.errors = {k[4:]: int(v) for k, v in stats.items() if k.startswith("err:")}
    snap.last_errors = {k[8:]: v for k, v in stats.items() if k.startswith("lasterr:")}
    snap.handoffs = {k[8:]: int(v) for k, v in stats.items() if k.startswith("handoff:")}
    return snap


def _endpoints(raw: dict[str, str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, value in raw.items():
        endpoint, _, name = key.rpartition("|")
        out.setdefault(endpoint, {})[name] = float(value)
    return out
