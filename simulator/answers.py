"""Deterministic simulated answers: a pure function of the prompt (no network, no clock).

This module is a contract other EagleGen code relies on: given the messages of a request,
anyone can recompute the key, the prompt-token count and the exact answer the simulator
sends, and match any answer back to its prompt through the `[key]` first content token.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from simulator.config import SimConfig
from simulator.sampling import draw

Message = Mapping[str, Any]
# "abort": a request stopped by POST /inference/v1/abort_requests (vLLM's FinishReason.ABORT).
FinishReason = Literal["stop", "length", "tool_calls", "abort"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Small and fixed on purpose: answers must not change between releases.
WORDS: tuple[str, ...] = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
    "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
    "yankee", "zulu", "draft", "eagle", "token", "model", "answer", "reason",
    "think", "step", "first", "then", "so", "because", "the", "a",
    "value", "result", "check", "again", "note", "hence", "we", "it",
)  # fmt: skip


@dataclass(frozen=True)
class SimAnswer:
    """One simulated completion; each token list concatenates to its text."""

    reasoning: str
    content: str
    reasoning_tokens: list[str]
    content_tokens: list[str]
    finish_reason: FinishReason
    completion_tokens: int


def prompt_key(messages: Sequence[Message]) -> str:
    """Return the 16-hex-char sha256 key of the messages' roles and contents."""
    # Only role, content and tool calls count: history may carry reasoning_content, which
    # must not change which answer a prompt gets; calls count by name and arguments (not ids).
    canonical = [_canonical(m) for m in messages]
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _canonical(message: Message) -> dict[str, Any]:
    canonical = {"role": message["role"], "content": message["content"]}
    calls = message.get("tool_calls")
    if calls:  # absent from other messages, whose keys stay as they were
        canonical["tool_calls"] = [
            [(c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
            for c in calls if isinstance(c, Mapping)
        ]  # fmt: skip
    return canonical


def count_prompt_tokens(messages: Sequence[Message]) -> int:
    """Approximate prompt tokens: 4 per message (template overhead) plus whitespace words."""
    # An approximation, not a tokenizer: it only has to be deterministic and monotone.
    return sum(4 + len(_message_text(m).split()) for m in messages)


def _message_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: only text parts carry words
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def expected_answer(
    messages: Sequence[Message],
    max_tokens: int | None,
    cfg: SimConfig,
    thinking: bool = True,
) -> SimAnswer:
    """Return the exact answer the simulator gives to these messages."""
    key = prompt_key(messages)
    seed = key + draw()  # a request that samples (simulator/sampling.py) draws its own
    # Separate streams keep the content identical whether or not thinking is on.
    reasoning = _reasoning_tokens(random.Random(f"{seed}:reasoning"), thinking, cfg)
    content = _content_tokens(random.Random(f"{seed}:content"), key, cfg)
    limit = _token_limit(messages, max_tokens, cfg)
    return _truncate(reasoning, content, limit)


def _reasoning_tokens(rng: random.Random, thinking: bool, cfg: SimConfig) -> list[str]:
    if not thinking or cfg.reasoning_tokens <= 0:
        return []
    words = _words(rng, rng.randint(1, cfg.reasoning_tokens))
    # The first reasoning token has no leading space so the text does not start with one.
    return [words[0].lstrip().capitalize(), *words[1:]]


def _content_tokens(rng: random.Random, key: str, cfg: SimConfig) -> list[str]:
    n = rng.randint(cfg.min_answer_tokens, cfg.max_answer_tokens)
    # A stream of its own: the other answers stay what they are without a tail.
    if random.Random(f"{key}:long").random() < cfg.long_answer_share:
        n = cfg.long_answer_tokens
    # The key as first token lets anyone match an answer back to its prompt.
    return [f"[{key}]", *_words(rng, n - 1)]


def _words(rng: random.Random, n: int) -> list[str]:
    return [" " + rng.choice(WORDS) for _ in range(n)]


def _token_limit(messages: Sequence[Message], max_tokens: int | None, cfg: SimConfig) -> int:
    # Like vLLM: without max_tokens the completion may use the rest of the context window.
    if max_tokens is not None:
        return max_tokens
    return max(0, cfg.max_model_len - count_prompt_tokens(messages))


def _truncate(reasoning: list[str], content: list[str], limit: int) -> SimAnswer:
    # Reasoning is generated first, so it consumes the max_tokens budget first (as in vLLM).
    kept_reasoning = reasoning[:limit]
    kept_content = content[: max(0, limit - len(kept_reasoning))]
    cut = len(kept_reasoning) + len(kept_content) < len(reasoning) + len(content)
    return SimAnswer(
        reasoning="".join(kept_reasoning),
        content="".join(kept_content),
        reasoning_tokens=kept_reasoning,
        content_tokens=kept_content,
        finish_reason="length" if cut else "stop",
        completion_tokens=len(kept_reasoning) + len(kept_content),
    )


def inline_tokens(answer: SimAnswer) -> list[str]:
    """Return the answer as content-only tokens with the reasoning inside `<think>…</think>`."""
    if not answer.reasoning_tokens:
        return list(answer.content_tokens)
    tokens = [THINK_OPEN + answer.reasoning_tokens[0], *answer.reasoning_tokens[1:]]
    # The closing tag belongs to the first content token: a reasoning cut short by max_tokens
    # leaves the think block open, as a real model would.
    if answer.content_tokens:
        tokens += [THINK_CLOSE + answer.content_tokens[0], *answer.content_tokens[1:]]
    return tokens


def inline_content(answer: SimAnswer) -> str:
    """Return the content text of the answer in `inline` reasoning mode."""
    return "".join(inline_tokens(answer))
