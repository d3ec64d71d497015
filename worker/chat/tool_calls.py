"""Streamed tool calls put back together: ``delta.tool_calls`` fragments joined by ``index``.

vLLM streams a call as ``{index, id, type, function: {name}}`` and then argument pieces
``{index, function: {arguments}}``; parallel calls have their own indexes and may interleave.
Some bridges (Ollama's OpenAI API, some LiteLLM and Dynamo versions) stream every parallel call
under one ``index``, each with its own ``id``: a fragment whose ``id`` or name differs from the
call open at its index opens the next call there, never joins it. Calls come out in index order,
those sharing an index in the order they were opened.

The result is exact: each id and name as first streamed for its call, ``arguments`` the pieces
concatenated (never parsed or re-serialised). Arguments sent as a JSON object instead of a
string (some bridges) are serialised once with ``json.dumps`` and counted
(``serialised``); any other type, an id or a name that is not a string, is a bad response.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from common import errors


@dataclass
class _Call:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    object_arguments: bool = False  # sent as a JSON object, serialised here


class ToolCallParts:
    """The tool calls of one streamed choice, assembled as the fragments arrive."""

    def __init__(self) -> None:
        self._calls: list[_Call] = []  # in the order they were opened
        self._open: dict[int, _Call] = {}  # the call each index's fragments go to

    def add(self, fragments: Any) -> None:
        """Merge one delta's ``tool_calls`` list."""
        if not isinstance(fragments, list):
            raise ValueError(f"delta.tool_calls is not a list: {fragments!r:.80}")
        for fragment in fragments:
            self._merge(fragment)

    def _merge(self, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            raise ValueError(f"a tool call fragment is not an object: {fragment!r:.80}")
        function = fragment.get("function") or {}
        if not isinstance(function, dict):
            raise ValueError(f"a tool call's function is not an object: {function!r:.80}")
        cid, name = _text(fragment, "id"), _text(function, "name")
        call = self._call_for(self._index(fragment), cid, name)
        call.id = call.id or cid
        call.name = call.name or name
        _add_arguments(call, function.get("arguments"))

    def _index(self, fragment: dict[str, Any]) -> int:
        index = fragment.get("index")
        if index is None:  # not OpenAI's shape: the last call opened, unless the id says other
            return self._calls[-1].index if self._calls else 0
        if type(index) is not int:
            raise ValueError(f"a tool call fragment's index is not an integer: {index!r:.40}")
        return index

    def _call_for(self, index: int, cid: str | None, name: str | None) -> _Call:
        """The call open at ``index``, or a new one there if the fragment's id or name is
        another's (one id naming two functions is a bad response)."""
        call = self._open.get(index)
        if call is not None and call.id and cid == call.id:
            if name and call.name and name != call.name:
                raise ValueError(f"tool call {cid!r:.60} streamed two function names")
            return call
        if call is None or _differs(call.id, cid) or _differs(call.name, name):
            call = _Call(index)
            self._calls.append(call)
            self._open[index] = call
        return call

    def __bool__(self) -> bool:
        return bool(self._calls)

    @property
    def serialised(self) -> int:
        """Calls whose arguments were sent as a JSON object and serialised here."""
        return sum(call.object_arguments for call in self._calls)

    def calls(self) -> list[dict[str, Any]]:
        """The calls in index order, in OpenAI's form; a call without a name is a bad response."""
        out = []
        for call in sorted(self._calls, key=lambda c: c.index):  # stable: opening order kept
            if not call.name:
                raise errors.BadResponse(
                    f"tool call {call.index} was streamed without a function name"
                )
            out.append({
                "id": call.id or "", "type": "function",
                "function": {"name": call.name, "arguments": "".join(call.arguments)},
            })  # fmt: skip
        return out


def _text(fields: dict[str, Any], key: str) -> str | None:
    """A server-supplied id or name: a string, or absent (None or empty)."""
    value = fields.get(key)
    if value is None or value == "":
        return None
    if type(value) is not str:
        raise ValueError(f"a tool call's {key} is a {type(value).__name__}: {value!r:.40}")
    return value


def _differs(known: str | None, sent: str | None) -> bool:
    return known is not None and sent is not None and sent != known


def _add_arguments(call: _Call, pieces: Any) -> None:
    """Append an ``arguments`` piece: a string, or once a whole JSON object (serialised)."""
    if pieces is None or pieces == "":
        return
    if call.object_arguments:
        raise ValueError("a tool call's arguments continue after a JSON object")
    if type(pieces) is str:
        call.arguments.append(pieces)
    elif type(pieces) is dict and not call.arguments:
        call.arguments.append(json.dumps(pieces, ensure_ascii=False))
        call.object_arguments = True
    else:
        kind = type(pieces).__name__
        raise ValueError(f"a tool call's arguments are a {kind}: {pieces!r:.60}")
