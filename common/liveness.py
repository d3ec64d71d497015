"""Who is working on a run: workers by their heartbeats, the collector by its lock.

Each worker process writes a heartbeat (its queue, endpoints, requests in flight) every
``BEAT_S`` seconds on Redis's clock and withdraws it when it stops; one older than
``FRESH_S`` is a dead or frozen worker. A run is served by the workers of its queue. Its
collector is alive while the collector lock exists (renewed every loop turn, it expires a
lock TTL after its holder stopped). Endpoint health entries that no live worker serves and
nobody touched for ``HEALTH_TTL_S`` are dropped: a test server gone for good leaves no ghost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from common.keys import EndpointKeys, RunKeys, workers_key

BEAT_S = 5.0
FRESH_S = 3 * BEAT_S
FORGET_S = 600.0  # a heartbeat this old is removed (a SIGKILLed worker never withdraws its own)
HEALTH_TTL_S = 600.0


@dataclass(frozen=True)
class Beat:
    """One worker's last heartbeat."""

    name: str
    queue: str
    endpoints: list[str]
    in_flight: int
    at: float  # Redis's clock

    def as_json(self) -> str:
        """The stored form."""
        return json.dumps({"queue": self.queue, "endpoints": self.endpoints,
                           "in_flight": self.in_flight, "at": round(self.at, 3)})  # fmt: skip


def read_beats(client: redis.Redis, prefix: str) -> list[Beat]:
    """Every heartbeat in Redis, live or not."""
    beats = []
    for name, raw in client.hgetall(workers_key(prefix)).items():
        try:
            data: dict[str, Any] = json.loads(raw)
            beats.append(Beat(str(name), str(data["queue"]), list(data.get("endpoints", [])),
                              int(data.get("in_flight", 0)), float(data["at"])))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue  # a heartbeat written by another version: not ours to judge
    return beats


def live_workers(beats: list[Beat], now: float, queue: str | None = None) -> list[Beat]:
    """Heartbeats younger than ``FRESH_S`` (of ``queue``'s workers, if given)."""
    return [b for b in beats if now - b.at <= FRESH_S and (queue is None or b.queue == queue)]


def collector_alive(client: redis.Redis, keys: RunKeys) -> bool:
    """Whether a collector holds the run's lock (it renews it at least once a second)."""
    return bool(client.exists(keys.collector_lock))


def prune(client: redis.Redis, prefix: str, now: float) -> None:
    """Drop heartbeats of workers gone long ago, and health entries of endpoints no live
    worker serves that nobody reported on for ``HEALTH_TTL_S``."""
    beats = read_beats(client, prefix)
    gone = [b.name for b in beats if now - b.at > FORGET_S]
    served = {url for b in live_workers(beats, now) for url in b.endpoints}
    health_key = EndpointKeys(prefix).health
    stale = []
    for url, raw in client.hgetall(health_key).items():
        try:
            at = float(json.loads(raw).get("at", 0))
        except (ValueError, TypeError, AttributeError):
            at = 0.0
        if url not in served and now - at > HEALTH_TTL_S:
            stale.append(url)
    if gone:
        client.hdel(workers_key(prefix), *gone)
    if stale:
        client.hdel(health_key, *stale)
