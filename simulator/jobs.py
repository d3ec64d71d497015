"""What a chat-completion request asks for, and the job (tokens, fault, cut) built from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.answers import SimAnswer, inline_tokens
from simulator.config import ReasoningField
from simulator.faults import Fault

Kind = Literal["reasoning", "content"]
Piece = tuple[Kind, str]


class StreamOptions(BaseModel):
    """OpenAI `stream_options`."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The part of an OpenAI chat-completion request the simulator looks at."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None  # accepted and ignored: answers are deterministic
    top_p: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for m in messages:
            if not isinstance(m.get("role"), str) or "content" not in m:
                raise ValueError("every message needs a string 'role' and a 'content'")
        return messages

    @property
    def limit(self) -> int | None:
        """max_completion_tokens wins over the deprecated max_tokens, as in vLLM."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def thinking(self) -> bool:
        """chat_template_kwargs.enable_thinking, default on."""
        return bool((self.chat_template_kwargs or {}).get("enable_thinking", True))

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class ConfigUpdate(BaseModel):
    """Body of POST /sim/config: the knobs that may change at runtime."""

    model_config = ConfigDict(extra="forbid")
    max_num_seqs: int | None = Field(default=None, ge=1)
    time_per_token: float | None = Field(default=None, ge=0.0)
    ttft: float | None = Field(default=None, ge=0.0)


@dataclass(frozen=True)
class Job:
    """One admitted chat completion: what to send and how it ends."""

    request_id: str
    created: int
    model: str
    key: str
    prompt_tokens: int
    answer: SimAnswer
    reasoning_field: ReasoningField
    pieces: list[Piece]
    fault: Fault
    cut: int
    include_usage: bool


def answer_pieces(answer: SimAnswer, reasoning_field: ReasoningField) -> list[Piece]:
    """Return the tokens in emission order, each tagged with the delta field it goes to."""
    if reasoning_field == "inline":
        return [("content", t) for t in inline_tokens(answer)]
    return [("reasoning", t) for t in answer.reasoning_tokens] + [
        ("content", t) for t in answer.content_tokens
    ]


def batch_pieces(pieces: list[Piece], size: int) -> list[list[Piece]]:
    """Group consecutive pieces of the same kind into batches of at most `size`."""
    batches: list[list[Piece]] = []
    for piece in pieces:
        last = batches[-1] if batches else None
        if last is not None and len(last) < size and last[0][0] == piece[0]:
            last.append(piece)
        else:
            batches.append([piece])
    return batches
