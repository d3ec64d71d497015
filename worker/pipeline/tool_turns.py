"""Tool-calling conversations (pure): what each turn sees, when to stop, the record.

A sample with tools is regenerated along its source messages (``Sample.script``): every
source assistant turn is one turn to generate. Under the default history, "on-policy while
the calls match", the model's own turns are the history: after a turn with tool calls, the
source's tool results follow, each carrying the id of the regenerated call it answers, as long
as the regenerated calls name the functions the source called there, in order; otherwise the
conversation ends at that turn (``stop_reason: "tool_call_mismatch"``). Arguments may differ:
they are kept and counted. A turn cut at the token limit ends it too, as cut
(``stop_reason: "length"``): its calls, if any, were cut with it, so they are not judged
against the source's. Under ``history="original"`` each turn is generated after the source's
own messages before it, and every source assistant turn is answered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.models import GenParams, Message, Record, Sample, TurnResult
from worker.pipeline.generate import generation_of

Messages = list[dict[str, Any]]
MISMATCH = "tool_call_mismatch"
CUT = "length"  # the turn's finish_reason: the conversation ends at a cut turn


@dataclass
class Walk:
    """The conversation so far, and what the next request sends (if any turn is left)."""

    conversation: Messages  # as recorded: the regenerated turns, results with their ids
    request: Messages | None = None  # the next turn's messages; None: the conversation ended
    stop_turn: int | None = None  # the turn the conversation stopped at, and why
    stop_reason: str | None = None  # MISMATCH or CUT
    arguments_differ: int = 0
    turns: int = 0  # turns answered and kept


@dataclass
class _State:
    sample: Sample
    answered: list[TurnResult]
    original: bool
    walk: Walk = field(default_factory=lambda: Walk([]))
    source: Messages = field(default_factory=list)  # the source's own history so far
    ids: dict[str, str] = field(default_factory=dict)  # source call id -> regenerated id


def request_fields(sample: Sample) -> dict[str, Any] | None:
    """What every request of the sample adds: its tools, and tool_choice ("auto" unless the
    row says otherwise); None for a sample without tools."""
    if sample.tools is None:
        return None
    return {"tools": sample.tools, "tool_choice": sample.tool_choice or "auto"}


def walk(sample: Sample, params: GenParams, answered: list[TurnResult]) -> Walk:
    """Replay the source messages with the turns answered so far."""
    assert sample.script is not None
    state = _State(sample, answered, params.history == "original")
    system = params.system_for(sample.system)
    if system:
        state.source.append({"role": "system", "content": system})
        state.walk.conversation.append({"role": "system", "content": system})
    for message in params.script_of(sample.script):
        if message["role"] != "assistant":
            _follow(state, message)
        elif not _answer(state, message):
            break
    return state.walk


def _follow(state: _State, message: dict[str, Any]) -> None:
    state.source.append(_sent(message))
    if message["role"] == "tool":
        mine = state.ids.get(message["tool_call_id"], message["tool_call_id"])
        message = {**message, "tool_call_id": mine}
    state.walk.conversation.append(message)


def _answer(state: _State, source: dict[str, Any]) -> bool:
    """Put the source assistant turn's regenerated answer in; False: the walk stops here."""
    walk, k = state.walk, state.walk.turns
    if k == len(state.answered):
        walk.request = [_sent(m) for m in (state.source if state.original else walk.conversation)]
        return False
    turn = state.answered[k]
    walk.conversation.append(assistant_message(turn))
    state.source.append(_sent(source))
    walk.turns += 1
    wanted, made = source.get("tool_calls") or [], turn.tool_calls or []
    matched = _names(wanted) == _names(made)
    pairs = list(zip(wanted, made, strict=True)) if matched else []
    state.ids = {w["id"]: m["id"] for w, m in pairs}
    walk.arguments_differ += sum(w["function"]["arguments"] != m["function"]["arguments"]
                                 for w, m in pairs)  # fmt: skip
    if state.original:
        return True
    # A cut answer cannot carry the conversation; it ends there whatever its calls were.
    why = CUT if turn.finish_reason == "length" else None if matched else MISMATCH
    if why is not None:
        walk.stop_turn, walk.stop_reason = k, why
    return why is None


def _names(calls: list[dict[str, Any]]) -> list[str]:
    return [c["function"]["name"] for c in calls]


def _sent(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a request carries it (a tool result's ``name`` is the record's only)."""
    return {k: v for k, v in message.items() if k != "name"} if "name" in message else message


def assistant_message(turn: TurnResult) -> dict[str, Any]:
    """A regenerated turn as history: its answer, reasoning and calls exactly as streamed."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    return message


def answer_tool_turns(
    sample: Sample, params: GenParams, answered: list[TurnResult],
    call: Callable[[Messages], TurnResult], save: Callable[[list[TurnResult]], None],
) -> list[TurnResult]:  # fmt: skip
    """Answer the sample's remaining turns in order, saving after each but the last."""
    done = list(answered)
    request = walk(sample, params, done).request
    while request is not None:
        done.append(call(request))
        request = walk(sample, params, done).request
        if request is not None:
            save(list(done))
    return done


def build_tool_record(
    run: str, sample: Sample, params: GenParams, turns: list[TurnResult], attempts: int
) -> Record:
    """The JSONL record of a finished tool-calling sample."""
    found = walk(sample, params, turns)
    generation = generation_of(
        params, turns, attempts, stop_reason=found.stop_reason, stop_turn=found.stop_turn,
        tool_arguments_differ=found.arguments_differ,
    )  # fmt: skip
    conversation = [Message.model_validate(m) for m in found.conversation]
    return Record(
        id=sample.id, run=run, conversations=conversation, source=sample.source,
        generation=generation, tools=sample.tools,
    )  # fmt: skip
