"""The finish reasons that mean the model finished its answer (kept in one place).

A turn whose ``finish_reason`` is another value (vLLM's ``abort``, ``error``, anything unknown)
was broken off: its text is a partial answer, never a record or a training row.
"""

from __future__ import annotations

FINISHED_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
