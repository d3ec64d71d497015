"""Optional cluster-wide request and token rates (for hosted endpoints that enforce them).

GCRA (the generic cell rate algorithm): one number per limit in Redis, the theoretical arrival
time ``tat`` (ms, Redis clock). Each unit of cost moves it ``60 s / limit`` ahead; a request is
admitted while ``tat`` is at most ``burst`` ahead of now. Requests pay one unit each before
they are sent. Tokens are only known afterwards, so a request reserves what it may use (its
prompt, estimated, plus ``max_tokens``: what hosted APIs count against the limit too) within
one minute's budget, and the difference is refunded or charged when it ends. Without the
reservation every request in flight was admitted at once and the budget was overshot by
concurrency x tokens per request.
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
        self._closed = threading.Event()

    def close(self) -> None:
        """Let every waiting request go (to be handed back by its caller)."""
        self._closed.set()

    def wait_turn(self, check: Callable[[], None] | None) -> None:
        """Block until a request may be sent under the requests/min limit (``check`` may abort)."""
        if self.rpm is not None:
            # One request's worth of burst: requests go out evenly, never a minute's in a lump.
            interval = MINUTE_MS / self.rpm
            self._wait(lambda: self._call(self._rpm_key, 1, interval, interval), check)

    def reserve_tokens(self, tokens: int, check: Callable[[], None] | None) -> int:
        """Block until ``tokens`` fit in the tokens/min budget, and take them; returns what was
        taken (at most one minute's budget, so that one large request can still go)."""
        if self.tpm is None:
            return 0
        taken = max(0, min(tokens, self.tpm))
        interval = MINUTE_MS / self.tpm
        self._wait(lambda: self._call(self._tpm_key, taken, interval, MINUTE_MS), check)
        return taken

    def settle_tokens(self, reserved: int, used: int) -> None:
        """Charge what a request used beyond its reservation, or refund what it did not use."""
        if self.tpm is not None and used != reserved:
            self._call(self._tpm_key, used - reserved, MINUTE_MS / self.tpm, 0.0, charge_only=True)

    def _wait(self, admit: Callable[[], float], check: Callable[[], None] | None) -> None:
        while (wait_ms := admit()) > 0 and not self._closed.is_set():
            if check is not None:
                check()
            self._closed.wait(min(wait_ms / 1000, 1.0))

    def _call(
        self, key: str, cost: int, interval: float, burst: float, charge_only: bool = False
    ) -> float:
        result = self._script(keys=[key], args=[cost, interval, burst, int(charge_only)])
        return float(result)
