"""Streamed tool calls put back together: ``delta.tool_calls`` fragments joined by ``index``.

vLLM streams a call as ``{index, id, type, function: {name}}`` and then argument pieces
``{index, function: {arguments}}``; parallel calls have their own indexes and may interleave.
The result is exact: each id as streamed (the first one sent for its index), each name as
streamed, ``arguments`` the pieces concatenated (never parsed or re-serialised).
"""

from __future__ import annotations

from typing import Any

from common import errors


class ToolCallParts:
    """The tool calls of one streamed choice, assembled as the fragments arrive."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, fragments: Any) -> None:
        """Merge one delta's ``tool_calls`` list."""
        if not isinstance(fragments, list):
            raise ValueError(f"delta.tool_calls is not a list: {fragments!r:.80}")
        for fragment in fragments:
            self._merge(fragment)

    def _merge(self, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            raise ValueError(f"a tool call fragment is not an object: {fragment!r:.80}")
        index = fragment.get("index")
        if index is None:  # not OpenAI's shape: a fragment with an id opens the next call
            last = max(self._calls, default=-1)
            index = last + 1 if fragment.get("id") or last < 0 else last
        if not isinstance(index, int):
            raise ValueError(f"a tool call fragment's index is not an integer: {index!r:.40}")
        call = self._calls.setdefault(index, {"id": None, "name": None, "arguments": []})
        if fragment.get("id") and call["id"] is None:
            call["id"] = fragment["id"]
        function = fragment.get("function") or {}
        if not isinstance(function, dict):
            raise ValueError(f"a tool call's function is not an object: {function!r:.80}")
        if function.get("name") and call["name"] is None:
            call["name"] = function["name"]
        pieces = function.get("arguments")
        if pieces:
            call["arguments"].append(str(pieces))

    def __bool__(self) -> bool:
        return bool(self._calls)

    def calls(self) -> list[dict[str, Any]]:
        """The calls in index order, in OpenAI's form; a call without a name is a bad response."""
        out = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call["name"]:
                raise errors.BadResponse(f"tool call {index} was streamed without a function name")
            out.append({
                "id": call["id"] or "", "type": "function",
                "function": {"name": call["name"], "arguments": "".join(call["arguments"])},
            })  # fmt: skip
        return out
