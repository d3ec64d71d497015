"""Tool-calling rows: their tools, calls and results, checked and put in one form.

Two input shapes (docs/tools.md): OpenAI rows (``tools`` and ``messages`` holding assistant
``tool_calls`` and ``tool`` messages) and ShareGPT function calling (a ``tools`` column, as a
JSON string or a list; turns ``human``/``gpt``/``function_call``/``observation``, as in
LLaMA-Factory and the glaive/hermes/xlam family). Both become a :class:`ToolConversation`:
OpenAI function specs ``{"type": "function", "function": {...}}`` and the source messages in
OpenAI form, every call with an id and its ``arguments`` as a string, every tool result with
the id and name of the call it answers. Anything else about tools is an invalid row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from common.models import GenParams

Message = dict[str, Any]

_TOOL_ROLES = {"tool", "function_call", "observation", "function"}
_ROLES = {
    "system": "system", "developer": "system", "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "model": "assistant",
    "function_call": "call", "tool": "tool", "observation": "tool",
}  # fmt: skip


class ToolRowError(ValueError):
    """A tool spec, call or result that cannot be regenerated from (the message says why)."""


@dataclass(frozen=True)
class ToolConversation:
    """A row's tools, its tool_choice, system prompt and messages after it (OpenAI form)."""

    tools: list[dict[str, Any]]
    tool_choice: Any
    system: str | None
    messages: list[Message]

    @property
    def user_turns(self) -> list[str]:
        """The user messages' texts, in order."""
        return [m["content"] for m in self.messages if m["role"] == "user"]


def is_tool_row(row: dict[str, Any], messages: list[Any]) -> bool:
    """Whether a row has tools or tool turns (an empty ``tools`` column alone does not)."""
    if _given(row.get("tools")):
        return True
    return any(
        isinstance(m, dict)
        and (m.get("tool_calls") or str(m.get("role", m.get("from"))).lower() in _TOOL_ROLES)
        for m in messages
    )


def _given(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip() not in ("", "[]", "null")
    return bool(value)


def parse_tool_row(row: dict[str, Any], messages: list[Any]) -> ToolConversation:
    """The row as a ToolConversation, or ToolRowError."""
    tools = parse_tools(row.get("tools"))
    names = {t["function"]["name"] for t in tools}
    system: str | None = None
    out: list[Message] = []
    for i, raw in enumerate(messages):
        if not isinstance(raw, dict):
            raise ToolRowError(f"message {i} is not an object")
        role = _ROLES.get(str(raw.get("role", raw.get("from"))).lower())
        if role is None:
            raise ToolRowError(f"message {i} has unknown role {raw.get('role', raw.get('from'))!r}")
        if role == "system":
            text = _text(raw, i)
            system = text if system is None else f"{system}\n\n{text}"
        else:
            out.append(_message(role, raw, i, names))
    if isinstance(row.get("system"), str) and row["system"].strip() and system is None:
        system = row["system"]  # LLaMA-Factory keeps the system prompt in its own column
    return ToolConversation(tools, _tool_choice(row.get("tool_choice")), system, _link(out))


def parse_tools(value: Any) -> list[dict[str, Any]]:
    """The tool specs as OpenAI function specs; a JSON string is read first."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ToolRowError(f"'tools' is not valid JSON ({exc.msg})") from exc
    if value is None:
        value = []
    if not isinstance(value, list):
        raise ToolRowError(f"'tools' is a {type(value).__name__}, not a list")
    tools = [_spec(spec, i) for i, spec in enumerate(value)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise ToolRowError("'tools' names a function twice")
    if not tools:
        raise ToolRowError("tool calls but no 'tools'")
    return tools


def _spec(spec: Any, i: int) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ToolRowError(f"tool {i} is not an object")
    if "function" in spec:  # OpenAI form
        if spec.get("type", "function") != "function" or not isinstance(spec["function"], dict):
            raise ToolRowError(f"tool {i} is not a function tool")
        function = spec["function"]
    else:  # ShareGPT form: the function spec itself, sent wrapped
        function = spec
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolRowError(f"tool {i} has no function name")
    params = function.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ToolRowError(f"tool {i} ({name}) has parameters that are not an object")
    return {"type": "function", "function": function}


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        return value
    raise ToolRowError(f"'tool_choice' {value!r} is not auto, none, required or a function")


def _message(role: str, raw: dict[str, Any], i: int, names: set[str]) -> Message:
    if role == "user":
        return {"role": "user", "content": _text(raw, i)}
    if role == "call":  # ShareGPT: one call, or a list of parallel calls, as JSON
        return {"role": "assistant", "content": "", "tool_calls": _sharegpt_calls(raw, i, names)}
    if role == "tool":
        message: Message = {"role": "tool", "content": _result(raw, i)}
        if isinstance(raw.get("tool_call_id"), str):
            message["tool_call_id"] = raw["tool_call_id"]
        return message
    content = raw.get("content", raw.get("value"))
    text = "" if content is None else _text(raw, i, True)
    if not raw.get("tool_calls"):
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text, "tool_calls": _calls(raw["tool_calls"], i, names)}


def _text(raw: dict[str, Any], i: int, empty_ok: bool = False) -> str:
    return content_text(raw.get("content", raw.get("value")), f"message {i}", empty_ok)


def content_text(value: Any, where: str, empty_ok: bool = False) -> str:
    """A message's text; OpenAI content parts are joined (only text parts can be regenerated
    from). ToolRowError if there is none."""
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(value) or not all(isinstance(p, str) for p in parts):
            raise ToolRowError(f"{where} has non-text content parts")
        value = "".join(parts)  # type: ignore[arg-type]
    if not isinstance(value, str):
        raise ToolRowError(f"{where} content is {type(value).__name__}, not a string")
    if not empty_ok and not value.strip():
        raise ToolRowError(f"{where} is empty")
    return value


def _result(raw: dict[str, Any], i: int) -> str:
    value = raw.get("content", raw.get("value"))
    if isinstance(value, dict | list):  # a structured result is sent as its JSON
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str):
        raise ToolRowError(f"message {i}: a tool result must be a string")
    return value


def _sharegpt_calls(raw: dict[str, Any], i: int, names: set[str]) -> list[dict[str, Any]]:
    value = raw.get("value", raw.get("content"))
    try:
        found = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as exc:
        raise ToolRowError(f"message {i}: function_call is not JSON ({exc.msg})") from exc
    calls = found if isinstance(found, list) else [found]
    return _calls([{"function": c} if isinstance(c, dict) else c for c in calls], i, names)


def _calls(value: Any, i: int, names: set[str]) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ToolRowError(f"message {i}: tool_calls is not a non-empty list")
    return [_call(call, i, j, names) for j, call in enumerate(value)]


def _call(call: Any, i: int, j: int, names: set[str]) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ToolRowError(f"message {i}: call {j} has no function")
    name = function.get("name")
    if name not in names:
        raise ToolRowError(f"message {i}: call {j} names {name!r}, which is not in 'tools'")
    cid = call.get("id")
    return {
        "id": cid if isinstance(cid, str) and cid else f"call_{i}_{j}",
        "type": "function",
        "function": {"name": name, "arguments": _arguments(function.get("arguments"), i, j)},
    }


def _arguments(value: Any, i: int, j: int) -> str:
    if value is None:
        value = {}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ToolRowError(f"message {i}: call {j} arguments are not JSON") from exc
        if not isinstance(parsed, dict):
            raise ToolRowError(f"message {i}: call {j} arguments are not a JSON object")
        return value
    if not isinstance(value, dict):
        raise ToolRowError(f"message {i}: call {j} arguments are not an object")
    return json.dumps(value, ensure_ascii=False)


def _link(messages: list[Message]) -> list[Message]:
    """Tie every tool result to the call it answers; end on an assistant turn to regenerate."""
    calls: list[dict[str, Any]] = []
    answered = 0
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            call = _answered_call(message, calls, answered, i)
            message["tool_call_id"], message["name"] = call["id"], call["function"]["name"]
            answered += 1
            continue
        if calls and answered != len(calls):
            raise ToolRowError(f"message {i}: {len(calls)} tool calls, {answered} results")
        calls, answered = list(message.get("tool_calls") or []), 0
    if calls and answered != len(calls):
        raise ToolRowError(f"{len(calls)} tool calls at the end, {answered} results")
    if not messages or messages[0]["role"] != "user":
        raise ToolRowError("the first message after the system prompt is not the user's")
    if messages[-1]["role"] != "assistant":  # the answer to the last message is regenerated
        messages.append({"role": "assistant", "content": ""})
    return messages


def _answered_call(
    message: Message, calls: list[dict[str, Any]], answered: int, i: int
) -> dict[str, Any]:
    if not calls:
        raise ToolRowError(f"message {i}: a tool result without a tool call before it")
    wanted = message.get("tool_call_id")
    if wanted is not None:
        for call in calls:
            if call["id"] == wanted:
                return call
        raise ToolRowError(f"message {i}: tool_call_id {wanted!r} answers no call")
    if answered >= len(calls):
        raise ToolRowError(f"message {i}: more tool results than calls")
    return calls[answered]


def tool_identity(found: ToolConversation | None, params: GenParams) -> object:
    """What the sample id covers besides the system prompt and user turns: the tools, the
    tool_choice and the source messages the run regenerates along; None for other rows."""
    if found is None:
        return None
    return {"tools": found.tools, "tool_choice": found.tool_choice,
            "messages": params.script_of(found.messages)}  # fmt: skip
