"""This worker's heartbeat: written every few seconds, withdrawn when it stops (see
``common/liveness.py`` for who reads it and what it means)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable

import redis

from common.clock import redis_time
from common.keys import workers_key
from common.liveness import BEAT_S, Beat, prune
from common.loop_errors import LoopErrors
from common.settings import Settings
from worker.pipeline.ticker import Ticker

log = logging.getLogger("eaglegen.worker")


class Heartbeat:
    """Publishes that this process serves its queue, and on which endpoints."""

    def __init__(
        self, client: redis.Redis, settings: Settings, in_flight: Callable[[], int]
    ) -> None:
        self.r = client
        self.settings = settings
        self.key = workers_key(settings.key_prefix)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._in_flight = in_flight
        self._ticker = Ticker("heartbeat", BEAT_S, self.beat, LoopErrors.of(client, settings))

    def start(self) -> None:
        """Beat now, then every ``BEAT_S``."""
        self.beat()
        self._ticker.start()

    def close(self) -> None:
        """Stop beating and withdraw the heartbeat: status no longer counts this worker."""
        self._ticker.close()
        with contextlib.suppress(redis.RedisError):
            self.r.hdel(self.key, self.name)

    def beat(self) -> None:
        """One heartbeat (skipped while Redis is away: the worker then looks gone, and is)."""
        try:
            now = redis_time(self.r)
            beat = Beat(self.name, self.settings.queue, list(self.settings.endpoints),
                        self._in_flight(), now)  # fmt: skip
            self.r.hset(self.key, self.name, beat.as_json())
            prune(self.r, self.settings.key_prefix, now)
        except redis.RedisError as exc:
            log.debug("heartbeat skipped: %s", exc)
