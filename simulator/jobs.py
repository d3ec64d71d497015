"""What a request asks for, and the job (tokens, ids, fault, cut) built from it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.answers import FinishReason, SimAnswer, inline_tokens
from simulator.config import ReasoningField
from simulator.faults import Fault
from simulator.output import RawToken

# special: a token without text; tool: a delta.tool_calls entry (its JSON as the text)
Kind = Literal["reasoning", "content", "special", "tool"]
Piece = tuple[Kind, str]
Endpoint = Literal["chat", "completion"]


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
    temperature: float | None = None  # > 0 with --vary-answers: an answer of its own
    top_p: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_ids: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _check_continuation(self) -> ChatRequest:
        if self.continue_final_message and self.add_generation_prompt:
            # vLLM's own message for the same mistake.
            raise ValueError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        return self

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


class CompletionRequest(BaseModel):
    """The part of an OpenAI (legacy) completion request the simulator looks at."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # vLLM's default, as OpenAI's
    temperature: float | None = None  # > 0 with --vary-answers: an answer of its own
    top_p: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None

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
    prefill_time_per_token: float | None = Field(default=None, ge=0.0)


@dataclass(frozen=True)
class Output:
    """What a request generates, in emission order, and how it ends."""

    pieces: list[Piece]
    piece_ids: list[list[int]]  # the ids of each piece (one each, except legacy fused tags)
    finish_reason: FinishReason
    completion_tokens: int


class AbortRequest(BaseModel):
    """The body of POST /inference/v1/abort_requests: the server's own request ids."""

    request_ids: list[str]


@dataclass(frozen=True)
class Job:
    """One admitted request: what to send and how it ends."""

    request_id: str
    created: int
    model: str
    key: str
    endpoint: Endpoint
    prompt_tokens: int
    prompt_ids: list[int]
    return_ids: bool  # send prompt_token_ids / token_ids
    output: Output
    reasoning_field: ReasoningField
    fault: Fault
    cut: int
    include_usage: bool
    # Set by POST /inference/v1/abort_requests: the generation ends at its next token.
    stop: asyncio.Event = field(default_factory=asyncio.Event, compare=False, repr=False)

    @property
    def pieces(self) -> list[Piece]:
        """The tokens to send, each tagged with the field it goes to."""
        return self.output.pieces

    def ids_of(self, start: int, end: int) -> list[int]:
        """Return the ids of pieces [start, end)."""
        return [i for ids in self.output.piece_ids[start:end] for i in ids]

    def aborted(self, sent: int) -> Job:
        """The job as an abort after ``sent`` pieces leaves it: those pieces, finish "abort"
        (vLLM: the output ``abort_requests`` queues, no new token in it)."""
        done = self.output.piece_ids[:sent]
        output = Output(self.pieces[:sent], done, "abort", sum(len(ids) for ids in done))
        return replace(self, output=output)


def answer_pieces(answer: SimAnswer, reasoning_field: ReasoningField) -> list[Piece]:
    """Return the tokens in emission order, each tagged with the delta field it goes to."""
    if reasoning_field == "inline":
        return [("content", t) for t in inline_tokens(answer)]
    return [("reasoning", t) for t in answer.reasoning_tokens] + [
        ("content", t) for t in answer.content_tokens
    ]


def raw_piece(token: RawToken, reasoning_field: ReasoningField) -> Piece:
    """Return the piece of one raw token: its text goes where vLLM's parser would send it."""
    if token.role == "end":
        return ("special", "")
    if reasoning_field == "inline" or token.role == "content":
        return ("content", token.text)
    # The reasoning parser sends the think tags as empty deltas (their ids still travel).
    return ("reasoning", token.text) if token.role == "reasoning" else ("special", "")


def batch_pieces(pieces: list[Piece], size: int) -> list[list[Piece]]:
    """Group consecutive pieces of the same kind into batches of at most `size`."""
    batches: list[list[Piece]] = []
    for piece in pieces:
        last = batches[-1] if batches else None
        same = last is not None and last[0][0] == piece[0] != "tool"  # one call fragment a chunk
        if last is not None and same and len(last) < size:
            last.append(piece)
        else:
            batches.append([piece])
    return batches
