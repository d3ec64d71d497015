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


def partial_message(reasoning: str, content: str) -> str:
    """The assistant message that continues a turn cut short, as the model had written it.

    For ``continue_final_message`` on the chat API: the reasoning goes back inline, as the
    model wrote it (``<think>``, the reasoning, ``</think>`` once the answer began), since chat
    templates render an assistant message's content as is (Qwen3's splits a ``</think>`` it
    finds back into its reasoning block). A reasoning with no answer yet stays open, so the
    model goes on thinking; a server without a reasoning parser already left its tags inline.
    """
    if not reasoning:
        return content
    if not content:
        return THINK_OPEN + reasoning
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{content}"


def continue_text(
    reasoning: str, content: str, more_reasoning: str, more_content: str, raw: bool
) -> tuple[str, str]:
    """(reasoning, content) of a turn continued after a break: what it had, then what came.

    ``more_*`` is what the continuation streamed. ``raw``: it came from ``/v1/completions``,
    where the server's reasoning parser does not run, so all of it is in ``more_content`` and a
    reasoning still open goes on up to the model's end-of-reasoning marker, which vLLM's
    parsers drop without trimming anything around it. From the chat API (``raw`` false) the
    parser split it, unless the server has none (then ``</think>`` is in the text).
    """
    if content or not reasoning:
        # Past the reasoning, or no parser split it off (inline tags stay in the content, for
        # finish_text to split at the end, as for an unbroken turn): all of it follows on.
        return reasoning, content + more_reasoning + more_content
    if more_reasoning:
        return reasoning + more_reasoning, more_content
    head, close, tail = more_content.partition(THINK_CLOSE)
    if close:
        return reasoning + head, tail
    # No marker: from /v1/completions the reasoning is still going (the checkpoint ends on a
    # token with text, never on the marker itself); from a chat parser, the answer began.
    return (reasoning + more_content, "") if raw else (reasoning, more_content)
