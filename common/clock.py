"""Redis's clock as the cluster's one clock, and how far a host's own clock is from it.

Leases, slots and rate limits are judged inside Lua scripts on Redis's clock. What is judged
in Python across hosts (the reconciler's "delivered long ago", status rates) uses
``redis_time`` too. Celery's retry ETAs and kombu's delivery times are written on the workers'
own clocks, so those must agree with Redis's: each worker measures its skew and reports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import redis


def redis_time(client: redis.Redis) -> float:
    """Redis's clock, in seconds since the epoch."""
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


@dataclass(frozen=True)
class Skew:
    """This host's clock minus Redis's (positive: ahead), within ``± rtt_s / 2``."""

    skew_s: float
    rtt_s: float


def measure_skew(client: redis.Redis, local: Callable[[], float] = time.time) -> Skew:
    """One reading: Redis's time against the midpoint of the local times around it."""
    before = local()
    server = redis_time(client)
    after = local()
    return Skew(skew_s=(before + after) / 2 - server, rtt_s=after - before)
