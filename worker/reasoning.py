"""Where a model's reasoning comes from, whatever the server calls it.

vLLM now sends ``reasoning`` (PR #27752) and dropped ``reasoning_content`` (PR #33402); SGLang
and older vLLM send ``reasoning_content``; servers without a reasoning parser leave
``<think>...</think>`` inline in the content. All three end up in one place.
"""

from __future__ import annotations

from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def delta_reasoning(delta: Any) -> str | None:
    """The reasoning text of a streamed delta (or a full message), under either field name."""
    for name in ("reasoning", "reasoning_content"):
        value = getattr(delta, name, None)
        if value is None and isinstance(delta, dict):
            value = delta.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def split_inline_think(content: str) -> tuple[str | None, str]:
    """Split ``<think>r</think>answer`` into (reasoning, answer); (None, content) if absent.

    A chat template whose generation prompt already opened ``<think>`` leaves the model's
    output with only the closing tag, so that case counts as reasoning too.
    """
    close = content.find(THINK_CLOSE)
    if close < 0:
        return None, content
    head, answer = content[:close], content[close + len(THINK_CLOSE) :]
    start = head.find(THINK_OPEN)
    if start >= 0:
        if head[:start].strip():
            return None, content  # text before <think>: not a reasoning block, leave it alone
        head = head[start + len(THINK_OPEN) :]
    return head.strip("\n"), answer.lstrip("\n")


def finish_text(content: str, reasoning: str | None) -> tuple[str | None, str]:
    """Final (reasoning, content) of a turn from what was streamed."""
    if reasoning:
        return reasoning, content
    return split_inline_think(content)
