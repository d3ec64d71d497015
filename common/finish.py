"""The finish reasons that mean the model finished its answer: the one list.

A streamed turn is kept only when its last chunk names one of these. vLLM ends a request it
aborted (``POST /inference/v1/abort_requests``, a client gone, the engine shutting down) with
``finish_reason: "abort"`` and then usage and ``[DONE]``, as a whole answer would end; so do
some servers with ``"error"``. Those, a reason not listed here, and a stream that names none
are a broken stream: its partial output is a checkpoint or is thrown away, never a record or
a training row.
"""

from __future__ import annotations

FINISHED_REASONS = frozenset(
    {
        "stop",  # an end-of-turn token or a stop string (every server)
        "length",  # max_tokens or the context window (every server)
        "tool_calls",  # the model called a tool (OpenAI, vLLM, SGLang)
        "function_call",  # the same in OpenAI's older function-calling API
        "content_filter",  # the server's filter ended the answer (OpenAI, Azure)
        "repetition",  # vLLM's repetition detector ended it (FinishReason.REPETITION)
    }
)


def finished(reason: str | None) -> bool:
    """Whether a turn that ended with ``reason`` is a whole answer."""
    return reason in FINISHED_REASONS
