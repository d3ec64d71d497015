"""Each worker checks its clock against Redis's: at start, then every few minutes.

A worker whose clock is off by more than ``EAGLEGEN_MAX_CLOCK_SKEW`` misjudges Celery's retry
delays (ETAs written by one host, waited out by another) and makes the reconciler misread when
its messages were delivered. Nothing is corrected here (that is NTP's job); the skew is logged
and published for ``eaglegen status``. A reading is refreshed often enough to double as the
worker's sign of life: readings older than ``STALE_S`` (a worker that died without a clean
stop) are pruned by every live worker's check and by ``status``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time

import redis

from common import lua
from common.clock import measure_skew
from common.keys import clocks_key
from common.loop_errors import LoopErrors
from common.settings import Settings
from worker.pipeline.ticker import Ticker

log = logging.getLogger("eaglegen.clock")
EVERY_S = 15.0  # a reading's refresh: a live worker's is never older than this
STALE_S = 40.0  # a reading older than this is a dead worker's, pruned (gone within a minute)
WARN_EVERY_S = 300.0  # a skew over the limit is logged at most this often


class ClockWatch:
    """Measures this host's clock skew and publishes it under the worker's name."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.limit = settings.max_clock_skew
        self.key = clocks_key(settings.key_prefix)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._prune = client.register_script(lua.PRUNE_CLOCKS)
        self._warned_at = -WARN_EVERY_S
        self._ticker = Ticker("clock-watch", EVERY_S, self.check, LoopErrors.of(client, settings))

    def start(self) -> None:
        """Check now, then every few minutes."""
        self.check()
        self._ticker.start()

    def close(self) -> None:
        """Stop checking and withdraw this worker's reading."""
        self._ticker.close()
        with contextlib.suppress(redis.RedisError):  # a stale reading is ignored by status
            self.r.hdel(self.key, self.name)

    def check(self) -> None:
        """One reading, published, and logged when over the limit (skipped if Redis is away)."""
        try:
            skew = measure_skew(self.r)
            # "at" on Redis's clock, so that status ages every reading on one clock.
            reading = {"skew_s": round(skew.skew_s, 3), "at": round(time.time() - skew.skew_s, 3)}
            self.r.hset(self.key, self.name, json.dumps(reading))
            self._prune(keys=[self.key], args=[STALE_S])
        except redis.RedisError as exc:
            log.debug("clock check skipped: %s", exc)
            return
        if abs(skew.skew_s) > self.limit and time.monotonic() - self._warned_at >= WARN_EVERY_S:
            self._warned_at = time.monotonic()
            log.warning(
                "this host's clock is %+.1f s from Redis's (over EAGLEGEN_MAX_CLOCK_SKEW=%g s):"
                " retry delays and the reconciler's judgement assume agreeing clocks; run NTP",
                skew.skew_s, self.limit,
            )  # fmt: skip


def read_clocks(client: redis.Redis, prefix: str, now: float, fresh_s: float) -> dict[str, float]:
    """Worker name -> skew, for readings younger than ``fresh_s`` (by Redis's clock ``now``);
    dead workers' readings are pruned on the way."""
    client.register_script(lua.PRUNE_CLOCKS)(keys=[clocks_key(prefix)], args=[STALE_S])
    out: dict[str, float] = {}
    for name, raw in client.hgetall(clocks_key(prefix)).items():
        reading = json.loads(raw)
        if now - float(reading.get("at", 0)) <= fresh_s:
            out[str(name)] = float(reading["skew_s"])
    return out
