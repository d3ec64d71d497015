"""Which endpoints continue a checkpoint, shared by every worker process.

Each worker's client learns it by trying (``ChatClient.continues``: an exact token-id
continuation, or the chat probe). That stays per request the proof a continuation needs; what
is shared here is only where to send a checkpoint: a process started later (after a kill, a
scale-up) then does not send one to a server known to answer continuations afresh, and learn
it again by discarding that checkpoint. Best-effort: Redis errors leave routing as it was.
"""

from __future__ import annotations

import contextlib
import json
import time

import redis

from common.keys import EndpointKeys


class ContinuationSupport:
    """Endpoint -> whether it continues checkpoints, as any process learned it."""

    def __init__(self, client: redis.Redis | None, prefix: str) -> None:
        self.r = client
        self.key = EndpointKeys(prefix).continuation
        self._known: dict[str, bool] = {}

    def get(self, endpoint: str) -> bool | None:
        """True/False once some process learned it; None: not yet (or Redis away)."""
        if endpoint not in self._known and self.r is not None:
            with contextlib.suppress(redis.RedisError, ValueError, KeyError, TypeError):
                raw = self.r.hget(self.key, endpoint)
                if raw is not None:
                    self._known[endpoint] = bool(json.loads(str(raw))["on"])
        return self._known.get(endpoint)

    def share(self, endpoint: str, on: bool) -> None:
        """Tell the other processes what this one learned of ``endpoint`` (once per change)."""
        if self._known.get(endpoint) == on or self.r is None:
            return
        with contextlib.suppress(redis.RedisError):
            self.r.hset(self.key, endpoint, json.dumps({"on": on, "at": round(time.time(), 3)}))
            self._known[endpoint] = on
