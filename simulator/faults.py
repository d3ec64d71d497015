"""Pure fault decisions for the simulator: which request fails, how, and where in the stream."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from simulator.config import SimConfig


class Fault(enum.Enum):
    """What goes wrong with one request (NONE: nothing)."""

    NONE = "none"
    HTTP_500 = "http_500"
    HTTP_429 = "http_429"
    STALL = "stall"
    DISCONNECT = "disconnect"


# Faults that strike after some tokens were sent, rather than instead of a response.
MID_STREAM_FAULTS = frozenset({Fault.STALL, Fault.DISCONNECT})


@dataclass(frozen=True)
class FaultPlan:
    """Fault policy: the first `fail_first` attempts of each prompt get HTTP 500, the next
    `disconnect_first` drop the connection mid-stream, then random faults."""

    fail_first: int = 0
    p_500: float = 0.0
    p_429: float = 0.0
    p_stall: float = 0.0
    p_disconnect: float = 0.0
    disconnect_first: int = 0
    cut_at: int = 0  # tokens sent before a mid-stream fault; 0: a random cut point

    @classmethod
    def from_config(cls, cfg: SimConfig) -> FaultPlan:
        """Build the plan from the fault fields of a SimConfig."""
        return cls(
            cfg.fail_first, cfg.p_500, cfg.p_429, cfg.p_stall, cfg.p_disconnect,
            cfg.disconnect_first, cfg.cut_at,
        )  # fmt: skip

    def decide(self, key: str, attempt: int, rng: random.Random) -> Fault:
        """Return the fault for the `attempt`-th (1-based) request of prompt `key`."""
        # The deterministic faults come first, so retry and resume tests need no probabilities.
        # A continuation (/v1/completions or continue_final_message) has the key of the chat
        # it continues, so it counts as that prompt's next attempt.
        if attempt <= self.fail_first:
            return Fault.HTTP_500
        if attempt <= self.fail_first + self.disconnect_first:
            return Fault.DISCONNECT
        return self._draw(rng.random())

    def cut(self, n_tokens: int, rng: random.Random) -> int:
        """Return how many of `n_tokens` are sent before a mid-stream fault."""
        if self.cut_at:
            # A fixed cut lets a test break a stream where it wants (in the reasoning, in the
            # answer); clamped so that the client still sees a truncated answer.
            return max(1, min(self.cut_at, n_tokens - 1))
        return cut_point(n_tokens, rng)

    def _draw(self, u: float) -> Fault:
        # One uniform draw over stacked intervals: at most one fault per request.
        bound = 0.0
        for fault, p in (
            (Fault.HTTP_500, self.p_500),
            (Fault.HTTP_429, self.p_429),
            (Fault.STALL, self.p_stall),
            (Fault.DISCONNECT, self.p_disconnect),
        ):
            bound += p
            if u < bound:
                return fault
        return Fault.NONE


def request_rng(seed: int, key: str, attempt: int) -> random.Random:
    """Return the RNG of one request attempt, independent of arrival order."""
    # Seeding per (seed, key, attempt) rather than sharing one RNG keeps chaos runs
    # reproducible even though concurrent requests arrive in varying order.
    return random.Random(f"{seed}:{key}:{attempt}")


def cut_point(n_tokens: int, rng: random.Random) -> int:
    """Return how many tokens are sent before a mid-stream fault (at least 1)."""
    # Strictly before the end when possible, so the client sees a truncated answer.
    return rng.randint(1, max(1, n_tokens - 1))


def prompt_too_long(prompt_tokens: int, max_model_len: int) -> str:
    """vLLM's message for a prompt that leaves no room for a completion token."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, your request "
        f"has {prompt_tokens} input tokens. Please reduce the length of the input messages."
    )


def context_error(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> str | None:
    """Return vLLM's context-length error message, or None if the request fits."""
    # Without max_tokens at least one completion token must still fit.
    completion = max_tokens if max_tokens is not None else 0
    needed = prompt_tokens + (max_tokens if max_tokens is not None else 1)
    if prompt_tokens <= max_model_len and needed <= max_model_len:
        return None
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + completion} tokens ({prompt_tokens} in the messages, {completion} in "
        "the completion). Please reduce the length of the messages or completion."
    )
