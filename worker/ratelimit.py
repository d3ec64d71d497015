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

from common.keys import endpoint_key

MINUTE_MS = 60_000.0


def gcra(tat: float, now: float, cost: float, interval: float, burst: float) -> tuple[float, float]:
    """``(new tat, wait)``: admitted when wait is 0, else try again after ``wait`` (same units)."""
    base = max(tat, now)
    wait = base + cost * interval - burst - now
    if wait > 0:
        return tat, wait
    return base + cost * interval, 0.0


# KEYS: tat   ARGV: cost, interval_ms, burst_ms, charge_only (1: pay without being checked)
# The same formula as ``gcra``; returns the wait in ms (0: admitted and paid).
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
local cost, interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local base = math.max(tat, now)
local wait = base + cost * interval - burst - now
if wait > 0 and ARGV[4] ~= '1' then return tostring(wait) end
local new = base + cost * interval
redis.call('SET', KEYS[1], tostring(new), 'PX', math.ceil(new - now + burst) + 1000)
return '0'
"""


class RateLimiter:
    """Requests/min and tokens/min shared by every worker; either may be None (no limit)."""

    def __init__(self, client: redis.Redis, prefix: str, rpm: int | None, tpm: int | None) -> None:
        self.rpm, self.tpm = rpm, tpm
        self._script = client.register_script(_GCRA)
        self._rpm_key = endpoint_key(prefix, "rpm")
        self._tpm_key = endpoint_key(prefix, "tpm")

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
