"""Sampling parameters: which exist, their allowed ranges, and the one check of them.

A parameter left unset is not sent, so the server's own generation config applies (vLLM's
``--generation-config auto`` reads the model's ``generation_config.json``): EAGLE-3 data must
be what the target model generates when it is served, and that is its own sampling. The same
check runs at ``enqueue`` (a one-line refusal), at ``retry-failed`` and in the worker on the
run's stored parameters (a sample failed once with the reason, not retried without end).
"""

from __future__ import annotations

import math
from typing import Any

# name -> (low, high, low is allowed): the OpenAI API's ranges, and vLLM's for its extras.
RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, True),
    "top_p": (0.0, 1.0, False),
    "min_p": (0.0, 1.0, True),
    "presence_penalty": (-2.0, 2.0, True),
    "frequency_penalty": (-2.0, 2.0, True),
    "repetition_penalty": (0.0, 2.0, False),
}
# top_k: -1 (or 0) turns it off in vLLM; otherwise at least 1.
SAMPLING = (*RANGES, "top_k")
# The keys of a model's generation_config.json that vLLM applies as sampling defaults.
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
SERVER_DEFAULT = "server default"


def check_value(name: str, value: float | int | None) -> float | int | None:
    """``value`` if allowed for ``name``; ValueError with the reason otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value}")
    if name == "top_k":
        if value != int(value) or (value < 1 and value not in (-1, 0)):
            raise ValueError(f"top_k must be -1 (off) or a whole number >= 1, not {value}")
        return int(value)
    low, high, low_ok = RANGES[name]
    if value > high or value < low or (value == low and not low_ok):
        bracket = "[" if low_ok else "("
        raise ValueError(f"{name} must be in {bracket}{low:g}, {high:g}], not {value:g}")
    return value


def describe(values: dict[str, Any]) -> dict[str, Any]:
    """Every sampling parameter with its value, or ``server default`` where unset."""
    return {name: SERVER_DEFAULT if values.get(name) is None else values[name] for name in SAMPLING}
