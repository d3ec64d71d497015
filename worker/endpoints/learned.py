"""A yes or no learned of each endpoint (it aborts requests by id; it continues checkpoints):
found out by one process, kept in a Redis hash for all, as JSON ``{"on": ..., "at": ...}``
with whatever else the finder adds. Once known, an endpoint's answer is read from Redis once
per process."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import redis


class LearnedPerEndpoint:
    """Endpoint -> what was learned of it, in the Redis hash ``key`` (no Redis: this process
    only). Redis errors and foreign values raise; callers decide what a failure means."""

    def __init__(self, client: redis.Redis | None, key: str) -> None:
        self.r = client
        self.key = key
        self._known: dict[str, bool] = {}

    def known(self, endpoint: str) -> bool | None:
        """What this process has read or learned of ``endpoint``, without asking Redis."""
        return self._known.get(endpoint)

    def get(self, endpoint: str) -> bool | None:
        """True/False once learned (by any process); None: not yet."""
        return self.get_many([endpoint])[endpoint]

    def get_many(self, endpoints: Iterable[str]) -> dict[str, bool | None]:
        """``get`` of each, in one round trip for those this process does not know yet."""
        wanted = list(endpoints)
        missing = [e for e in wanted if e not in self._known]
        if missing and self.r is not None:
            for endpoint, raw in zip(missing, self.r.hmget(self.key, missing), strict=True):
                if raw is not None:
                    self._known[endpoint] = bool(json.loads(str(raw))["on"])
        return {e: self._known.get(e) for e in wanted}

    def learn(self, endpoint: str, on: bool, **more: Any) -> None:
        """Remember what ``endpoint`` answered, here and for every process."""
        self._known[endpoint] = on
        if self.r is not None:
            self.r.hset(self.key, endpoint, json.dumps({"on": on, **more, "at": time.time()}))
