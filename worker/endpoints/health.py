"""Per-process health of one endpoint: taken out after repeated failures, probed, brought back.

Pure state with an explicit clock, so the rules are tested without a network. Each worker
process judges for itself: what it sees is what its own requests would meet.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import errors

# Failures that say the server (not the request or the model) is in trouble. A 429 means it
# is alive and busy; a stall or an empty answer can be one slow or odd generation.
SERVER_DOWN: tuple[type[errors.GenerationError], ...] = (
    errors.ConnectError,
    errors.TimeoutError_,
    errors.ServerError,
    errors.BadResponse,
)


def counts_against(exc: BaseException) -> bool:
    """Whether a failed request says the endpoint itself is failing."""
    return isinstance(exc, SERVER_DOWN)


@dataclass
class EndpointHealth:
    """Consecutive failures and, once out, when the next probe is due."""

    threshold: int
    cooldown: float
    max_cooldown: float = 600.0
    failures: int = 0
    out_until: float | None = None
    _next_cooldown: float = 0.0

    @property
    def out(self) -> bool:
        """Taken out: no requests until a probe succeeds."""
        return self.out_until is not None

    def success(self) -> bool:
        """A request succeeded; True if that brought the endpoint back."""
        was_out = self.out
        self.failures, self.out_until, self._next_cooldown = 0, None, 0.0
        return was_out

    def failure(self, now: float) -> bool:
        """A request failed against the server; True if that took the endpoint out.

        The last endpoint goes out too: while none is in, requests wait for a probe to bring
        one back instead of spending their retries on a server that is restarting.
        """
        self.failures += 1
        if self.out or self.failures < self.threshold:
            return False
        self._take_out(now)
        return True

    def mark_down(self, now: float) -> None:
        """Out at once (the start-up check could not reach it); probed after the cool-down."""
        if not self.out:
            self._take_out(now)

    def probe_due(self, now: float) -> bool:
        """Out, and its cool-down is over."""
        return self.out_until is not None and now >= self.out_until

    def probe_failed(self, now: float) -> None:
        """Stay out, for twice as long as last time (up to ``max_cooldown``)."""
        self._take_out(now)

    def _take_out(self, now: float) -> None:
        wait = self._next_cooldown or self.cooldown
        self.out_until = now + wait
        self._next_cooldown = min(wait * 2, self.max_cooldown)
