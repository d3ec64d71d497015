"""Simulated tool calls (pure): which functions an answer calls, and their streamed pieces.

The rule, deterministic so that tests can write conversations it follows: a request with
``tools`` calls the functions whose names appear in the messages since the last assistant
turn (the user's question, or the tool results), in the order they first appear, in parallel
when there are several; with none named it answers in text (as after a tool result). A share
``tool_mismatch_share`` of such answers (drawn per prompt) calls another function of the list
in place of the first one, to exercise a client's stop on a call the source did not make.
``tool_choice`` is honoured: "none" never calls, "required" or a named function always does.

Streamed as vLLM's hermes parser sends calls: per call, first ``{index, id, type, function:
{name}}``, then ``{index, function: {arguments}}`` pieces; ``finish_reason: "tool_calls"``. In
the token-id world each call is the text ``<tool_call>{"name": N, "arguments": A}</tool_call>``
(what the simulator's chat template renders for an assistant's ``tool_calls``), so ids and
the rendered conversation agree.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.answers import WORDS, Message

Piece = tuple[str, str]  # (kind, text) as simulator.jobs has it


@dataclass(frozen=True)
class SimCall:
    """One call the simulated model makes."""

    id: str
    name: str
    arguments: str


def chosen_calls(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], tool_choice: Any,
    key: str, mismatch_share: float,
) -> list[SimCall]:  # fmt: skip
    """The calls the answer to ``messages`` makes (empty: it answers in text)."""
    specs = {_name(t): t for t in tools if _name(t)}
    if not specs or tool_choice == "none":
        return []
    names = named_functions(messages, list(specs))
    if isinstance(tool_choice, Mapping):
        wanted = (tool_choice.get("function") or {}).get("name")
        names = [wanted] if wanted in specs else names
    if not names and tool_choice == "required":
        names = [next(iter(specs))]
    rng = random.Random(f"{key}:tools")
    if names and rng.random() < mismatch_share:
        others = [n for n in specs if n not in names]
        if others:
            names = [rng.choice(others), *names[1:]]
    return [_call(specs[n], key, i, rng) for i, n in enumerate(names)]


def _name(tool: Mapping[str, Any]) -> str:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    return name if isinstance(name, str) else ""


def named_functions(messages: Sequence[Message], names: list[str]) -> list[str]:
    """Functions named since the last assistant turn, in order of first appearance."""
    tail: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "assistant":
            break
        content = message.get("content")
        tail.insert(0, content if isinstance(content, str) else "")
    text = "\n".join(tail)
    found = [(text.find(n), n) for n in names if n in text]
    return [n for _, n in sorted(found)]


def _call(spec: Mapping[str, Any], key: str, index: int, rng: random.Random) -> SimCall:
    function = spec["function"]
    properties = (function.get("parameters") or {}).get("properties") or {}
    args = {p: _value(s, rng) for p, s in properties.items() if isinstance(s, Mapping)}
    digest = hashlib.sha256(f"{key}:call:{index}".encode()).hexdigest()[:16]
    return SimCall(f"chatcmpl-tool-{digest}", function["name"], json.dumps(args))


def _value(schema: Mapping[str, Any], rng: random.Random) -> Any:
    kind = schema.get("type")
    if kind == "integer":
        return rng.randint(1, 99)
    if kind == "number":
        return rng.randint(1, 999) / 10
    if kind == "boolean":
        return rng.random() < 0.5
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    return rng.choice(WORDS)


def call_text(name: str, arguments: str) -> tuple[str, str, str]:
    """A call as the template writes it: (opening up to the arguments, arguments, closing)."""
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": ', arguments, "}</tool_call>"


def rendered_calls(calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant message's ``tool_calls`` as the chat template renders them."""
    out = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append("".join(call_text(str(function.get("name")), arguments)))
    return "".join(out)


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools as the template puts them in the system turn."""
    return "<tools>" + json.dumps(list(tools), ensure_ascii=False) + "</tools>"


def fragment(call: SimCall, index: int, part: str, first: bool) -> str:
    """The ``delta.tool_calls`` entry of one piece, as JSON text (a piece carries a string)."""
    if first:
        entry: dict[str, Any] = {"index": index, "id": call.id, "type": "function",
                                 "function": {"name": call.name}}  # fmt: skip
    else:
        entry = {"index": index, "function": {"arguments": part}}
    return json.dumps(entry, ensure_ascii=False)
