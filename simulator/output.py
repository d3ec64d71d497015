"""The simulated model's raw output in token ids (pure): what it generates, as vLLM counts it.

`simulator.answers` gives the reasoning and content words of an answer; here they become the
sequence the model emits: <think>, the reasoning, </think>, the content, and the end-of-turn
token. Every one of them is a generated token with one id, counted and limited by max_tokens
as vLLM counts them. Because it is a pure function of the prompt, a generation continued from
its first k ids gives exactly ids k.. of the unbroken one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from simulator.answers import FinishReason, Message, expected_answer, prompt_key
from simulator.config import SimConfig
from simulator.tokenizer import IM_END, KEY, THINK, THINK_END, WORD_IDS, key_text

Role = Literal["open", "reasoning", "close", "content", "end"]


@dataclass(frozen=True)
class RawToken:
    """One generated token: its id, its text and its place in the answer."""

    id: int
    text: str
    role: Role


@dataclass(frozen=True)
class Generation:
    """What one request generates: a slice of the model output and why it ended."""

    tokens: list[RawToken]
    finish_reason: FinishReason

    @property
    def token_ids(self) -> list[int]:
        """The generated ids, end-of-turn included when the answer stopped on it."""
        return [t.id for t in self.tokens]

    @property
    def completion_tokens(self) -> int:
        """Tokens generated, as vLLM's usage counts them."""
        return len(self.tokens)


def model_output(
    messages: Sequence[Message], cfg: SimConfig, thinking: bool = True
) -> list[RawToken]:
    """Return the whole untruncated output for these messages, ending on end-of-turn."""
    answer = expected_answer(messages, sys.maxsize, cfg, thinking)
    key = prompt_key(messages)
    tokens: list[RawToken] = []
    if answer.reasoning_tokens:
        tokens.append(RawToken(THINK, "<think>", "open"))
        tokens += [RawToken(WORD_IDS[t], t, "reasoning") for t in answer.reasoning_tokens]
        tokens.append(RawToken(THINK_END, "</think>", "close"))
    tokens += [_content_token(t, key) for t in answer.content_tokens]
    return [*tokens, RawToken(IM_END, "", "end")]  # special: no text, as vLLM skips it


def _content_token(text: str, key: str) -> RawToken:
    return RawToken(KEY if text == key_text(key) else WORD_IDS[text], text, "content")


def generation(output: Sequence[RawToken], start: int, limit: int) -> Generation:
    """Return the tokens from `start` on, at most `limit` of them (max_tokens)."""
    tokens = list(output[start : start + max(0, limit)])
    done = start >= len(output) or (bool(tokens) and tokens[-1].role == "end")
    return Generation(tokens, "stop" if done else "length")


@dataclass(frozen=True)
class Resume:
    """Where a partial generation stands in the model output it belongs to."""

    output: list[RawToken]
    start: int


def resume_point(
    messages: Sequence[Message], partial: Sequence[int], cfg: SimConfig, thinking: bool
) -> Resume | None:
    """Find the output that `partial` (ids generated so far) begins; None if none does."""
    # Content is the same with thinking on or off, so a partial that skipped the
    # reasoning (text-level continuation of the content) continues the content.
    for think in (thinking, False) if thinking else (False,):
        output = model_output(messages, cfg, think)
        if [t.id for t in output[: len(partial)]] == list(partial):
            return Resume(output, len(partial))
    return None
