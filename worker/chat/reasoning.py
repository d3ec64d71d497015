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


def partial_message(reasoning: str, content: str) -> dict[str, str]:
    """The assistant message that continues a turn cut short (``continue_final_message``).

    A reasoning with no answer yet goes back inline and open (``<think>`` and the reasoning as
    the content), so the model goes on thinking: templates render such content as is. Once
    the answer began, the reasoning goes in ``reasoning_content`` (where chat templates such as
    Qwen3's and DeepSeek's take it from) and the content is the answer so far: a template that
    rewrites a ``<think>`` block it finds in the content (Qwen3's, normalising its newlines)
    would leave vLLM unable to find the final message in the prompt (HTTP 400). A server
    without a reasoning parser left the tags in the content: they are split off the same way.
    """
    if not reasoning and THINK_CLOSE in content:
        head, _, content = content.partition(THINK_CLOSE)
        reasoning = head.partition(THINK_OPEN)[2] if THINK_OPEN in head else head
    if not content:
        return {"role": "assistant", "content": THINK_OPEN + reasoning if reasoning else ""}
    message = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


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
