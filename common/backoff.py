"""Retry delays: exponential backoff with full jitter (AWS architecture blog's variant)."""

from __future__ import annotations

import random


def backoff_delay(retries: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``retries + 1``: uniform in [0, min(cap, base*2^n)]."""
    ceiling = min(cap, base * (2 ** min(retries, 32)))
    return (rng or random).uniform(0, ceiling)
