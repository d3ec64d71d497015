"""Sampling at temperature > 0: each request drawing its own answer (``--vary-answers``).

By default the simulator answers a prompt the same way every time, whatever the temperature,
which hides a class of defects: a sample whose turns come from two attempts looks consistent
when both attempts answered alike. With ``vary_answers`` a chat request at temperature > 0
gets an answer of its own (still starting with the prompt's key), as a real server's would;
at temperature 0 the answer stays the prompt's one, as greedy decoding does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DRAW: ContextVar[str] = ContextVar("sim_draw", default="")


def draw() -> str:
    """The current request's own draw ('' when its answer is the prompt's deterministic one)."""
    return _DRAW.get()


@contextmanager
def sampled(vary: bool, temperature: float | None, request_number: int) -> Iterator[None]:
    """Plan one request's answer as a draw of its own, if it samples (``vary`` and a
    temperature above 0)."""
    token = _DRAW.set(f"#{request_number}" if vary and (temperature or 0) > 0 else "")
    try:
        yield
    finally:
        _DRAW.reset(token)
