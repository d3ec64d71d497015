"""Typed messages and records: JSON on the wire, a schema version on records."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.sampling import SAMPLING, check_value

SCHEMA_VERSION = 1

Role = Literal["system", "user", "assistant", "tool"]
# A tool call in OpenAI's form: {"id", "type": "function", "function": {"name", "arguments"}},
# ``arguments`` the exact string the model wrote.
ToolCall = dict[str, Any]


class GenParams(BaseModel):
    """Generation parameters, fixed for the life of a run (a retried sample may carry its own).

    A sampling parameter left None is not sent: the server's generation config applies.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_tokens: int = Field(default=2048, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    turns: Literal["all", "first"] = "all"
    system: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Tool-calling conversations (docs/tools.md): None is "on-policy while the calls match";
    # "original" answers each source assistant turn after the source's own history.
    history: Literal["original"] | None = None

    @field_validator(*SAMPLING, mode="before")
    @classmethod
    def _in_range(cls, value: Any, info: Any) -> Any:
        return check_value(info.field_name, value)

    def sampling(self) -> dict[str, float | int]:
        """The sampling fields a request sends: only those set."""
        return {name: v for name in SAMPLING if (v := getattr(self, name)) is not None}

    # The one rule of which turns and which system prompt a run uses: the sample id (producer)
    # and the generated conversation (worker) both come from it, so they cannot diverge.
    def turns_of(self, user_turns: list[str]) -> list[str]:
        """The user turns a run answers: all of them, or only the first."""
        return user_turns[:1] if self.turns == "first" else list(user_turns)

    def script_of(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A tool-calling sample's source messages a run follows: all, or up to the second
        user message."""
        if self.turns != "first":
            return messages
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        return messages[: users[1]] if len(users) > 1 else messages

    def system_for(self, source_system: str | None) -> str | None:
        """The run's system prompt overrides the source's."""
        return self.system if self.system is not None else source_system


class SourceRef(BaseModel):
    """Where a sample came from (its first occurrence)."""

    dataset: str
    split: str | None = None
    row: int
    format: str


class Sample(BaseModel):
    """A prompt to answer: an optional system prompt and the user turns, in order."""

    id: str
    system: str | None = None
    user_turns: list[str]
    source: SourceRef
    # A tool-calling conversation (docs/tools.md): its tools in OpenAI function-spec form, the
    # row's tool_choice, and the source messages after the system prompt (user, assistant with
    # their tool_calls, tool results), which its turns are regenerated along.
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    script: list[dict[str, Any]] | None = None
    # Set by ``retry-failed`` with new parameters: this sample's, instead of the run's.
    params: GenParams | None = None


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class TurnStats(BaseModel):
    """How one assistant turn was generated (its text lives in ``conversations``).

    ``prompt_token_ids`` and ``token_ids`` are the server's own ids, where it gives them
    (vLLM's ``return_token_ids``): the prompt as the server tokenized it, and the completion as
    generated, end-of-turn token included when it stopped on it. Absent (None) otherwise.
    Together they are the exact sequence a training row holds, and the token-id prompt a
    broken turn can be continued from.
    """

    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    latency_s: float = 0.0
    endpoint: str = ""
    model: str = ""
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    # Tokens of this turn generated before a break and continued from its checkpoint (0: the
    # turn streamed unbroken). The ids and text above are the whole turn either way.
    resumed_from_tokens: int = 0
    # Tokens of a checkpoint this turn could not continue (a server not proven to continue a
    # partial answer), so generated again from the start: wasted, never joined.
    discarded_tokens: int | None = None
    discarded_from: str | None = None  # the endpoint that had generated those tokens
    # Calls whose arguments the server sent as a JSON object, not a string: serialised once by
    # the client (``json.dumps``), so their text is not the model's own.
    tool_arguments_serialised: int | None = None
    # What cut a turn that ended with finish_reason "length": "max_tokens", or "context" when
    # it stopped short of max_tokens (vLLM gives a request at most the context window left
    # after its prompt, max_model_len - prompt tokens). None: the turn was not cut.
    cut_by: Literal["context", "max_tokens"] | None = None
    # Why the server's ids were dropped (they disagreed with the text); not in records.
    token_ids_dropped: str | None = Field(default=None, exclude=True)


class TurnResult(TurnStats):
    """One generated assistant turn."""

    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None  # as streamed: ids, names, argument strings

    def stats(self) -> TurnStats:
        """The turn without its text."""
        text = {"content", "reasoning", "tool_calls"}
        return TurnStats.model_validate(self.model_dump(exclude=text))


class Checkpoint(BaseModel):
    """A turn cut short: what the server had generated so far, saved to continue from.

    Written by the worker under the sample's lease while the turn streams (every
    ``checkpoint_tokens`` tokens or ``checkpoint_seconds``) and when the stream breaks; the
    next run of the sample continues it instead of generating it again: exactly from
    ``prompt_token_ids + token_ids`` where the server gave ids, else from the text.
    """

    turn: int  # index of the assistant turn in the sample's conversation
    endpoint: str
    model: str
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None  # generated so far; None when the server gave no ids
    content: str = ""  # the answer text so far
    reasoning: str = ""  # the reasoning text so far
    tokens: int = 0  # generated so far: len(token_ids), else about one per text chunk
    resumed_from_tokens: int = 0  # of ``tokens``, how many an earlier checkpoint carried
    # Tokens of earlier attempts at this turn set aside (checkpoints no server could continue),
    # carried on so that the record counts every discard, not only the last.
    discarded_tokens: int = 0
    # Which answered history the turn extends: how many answers came before it and a digest
    # of them (``history_digest``). A checkpoint taken after other answers (a stale worker's)
    # continues another conversation and is discarded, never resumed. None: not recorded.
    history_turns: int | None = None
    history: str | None = None

    def on_history(self, answered: list[TurnResult]) -> Checkpoint:
        """This checkpoint, marked as extending the answers ``answered``."""
        return self.model_copy(
            update={"history_turns": len(answered), "history": history_digest(answered)}
        )

    def extends(self, answered: list[TurnResult]) -> bool:
        """Whether the checkpoint was taken on exactly the answers ``answered`` (one without
        the mark is trusted only for a first turn, where there is no history to differ)."""
        if self.history is None:
            return not answered
        return self.history_turns == len(answered) and self.history == history_digest(answered)


def history_digest(answered: list[TurnResult]) -> str:
    """A digest of the answers a turn is generated after (their text and token ids)."""
    digest = hashlib.sha256()
    for turn in answered:
        part = [turn.content, turn.reasoning or "", turn.token_ids or []]
        digest.update(json.dumps(part, ensure_ascii=False).encode())
    return digest.hexdigest()[:32]


class Message(BaseModel):
    role: Role
    content: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None  # a tool result: the id of the call it answers
    name: str | None = None  # a tool result: the function's name


class Generation(BaseModel):
    model: str
    endpoint: str
    finish_reason: str | None
    usage: Usage
    turns: list[TurnStats]
    attempts: int
    latency_s: float
    params: GenParams
    # Why a conversation ended before its source did ("tool_call_mismatch"), at which turn.
    stop_reason: str | None = None
    stop_turn: int | None = None
    tool_arguments_differ: int | None = None  # calls whose arguments differ from the source's


class Record(BaseModel):
    """One JSONL line: a superset of SpecForge's ``{"id", "conversations"}``."""

    schema_version: int = Field(default=SCHEMA_VERSION, alias="schema")
    id: str
    run: str
    conversations: list[Message]
    source: SourceRef
    generation: Generation
    tools: list[dict[str, Any]] | None = None  # OpenAI function specs, as sent

    model_config = ConfigDict(populate_by_name=True)

    def to_json(self) -> str:
        """The record as one JSON line (no newline), optional fields left out."""
        return self.model_dump_json(by_alias=True, exclude_none=True)


class Failure(BaseModel):
    """Why a sample ended in the failed set."""

    kind: str
    message: str
    attempts: int
    at: float
