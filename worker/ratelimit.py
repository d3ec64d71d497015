"""Optional cluster-wide request and token rates (for hosted endpoints that enforce them).

GCRA (the generic cell rate algorithm): one number per limit in Redis, the theoretical arrival
time ``tat`` (ms, Redis clock). Each unit of cost moves it ``60 s / limit`` ahead; a request is
admitted while ``tat`` is at most ``burst`` ahead of now. Requests pay one unit each before
they are sent; tokens are only known afterwards, so a request is admitted while the token
budget is not overspent and its tokens are charged when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis

from common import lua
from common.keys import EndpointKeys

MINUTE_MS = 60_000.0


def gcra(tat: float, now: float, cost: float, interval: float, burst: float) -> tuple[float, float]:
    """``(new tat, wait)``: admitted when wait is 0, else try again after ``wait`` (same units)."""
    base = max(tat, now)
    wait = base + cost * interval - burst - now
    if wait > 0:
        return tat, wait
    return base + cost * interval, 0.0


class RateLimiter:
    """Requests/min and tokens/min shared by every worker; either may be None (no limit)."""

    def __init__(self, client: redis.Redis, prefix: str, rpm: int | None, tpm: int | None) -> None:
        self.rpm, self.tpm = rpm, tpm
        self._script = client.register_script(lua.GCRA)
        self._rpm_key = EndpointKeys(prefix).rpm
        self._tpm_key = EndpointKeys(prefix).tpm

    def wait_turn(self, check: Callable[[], None] | None, stop: threading.Event) -> None:
        """Block until a request may be sent under both limits (``check`` may abort)."""
        while True:
            wait_ms = self._admit()
            if wait_ms <= 0:
                return
            if check is not None:
                check()
            stop.wait(min(wait_ms / 1000, 1.0))

    def charge_tokens(self, tokens: int) -> None:
        """Count a finished request's tokens against the tokens/min limit."""
        if self.tpm is not None and tokens > 0:
            self._call(self._tpm_key, tokens, MINUTE_MS / self.tpm, 0.0, charge_only=True)

    def _admit(self) -> float:
        if self.tpm is not None:
            # Cost 0: only asks whether earlier requests' tokens are paid off.
            wait = self._call(self._tpm_key, 0, MINUTE_MS / self.tpm, 0.0)
            if wait > 0:
                return wait
        if self.rpm is not None:
            # One request's worth of burst: requests go out evenly, never a minute's in a lump.
            interval = MINUTE_MS / self.rpm
            return self._call(self._rpm_key, 1, interval, interval)
        return 0.0

    def _call(
        self, key: str, cost: int, interval: float, burst: float, charge_only: bool = False
    ) -> float:
        result = self._script(keys=[key], args=[cost, interval, burst, int(charge_only)])
        return float(result)
