"""Prompt formats: detect a row's format and reduce it to (system prompt, user turns).

Assistant turns in the source are discarded: the target model regenerates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from producer.tools import (
    ToolConversation,
    ToolRowError,
    content_text,
    is_tool_row,
    parse_tool_row,
)

FORMATS = ("openai", "sharegpt", "turns", "prompt")
PROMPT_COLUMNS = ("prompt", "question", "instruction")
_SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
    "system": "system",
}  # fmt: skip
_OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


class InvalidRow(ValueError):
    """A row that cannot become a sample; the message says why."""


@dataclass(frozen=True)
class Prompt:
    """What a sample asks: an optional system prompt and the user turns in order."""

    system: str | None
    user_turns: list[str]
    tools: ToolConversation | None = None  # a tool-calling conversation (producer/tools.py)


def detect_format(row: dict[str, Any]) -> str | None:
    """The format a row is written in, or None if it matches none."""
    if isinstance(row.get("messages"), list):
        return "openai"
    if isinstance(row.get("conversations"), list):
        return "sharegpt"
    if "turns" in row:
        return "turns"
    if any(col in row for col in PROMPT_COLUMNS):
        return "prompt"
    return None


def to_prompt(row: dict[str, Any], fmt: str) -> Prompt:
    """Reduce a row of format ``fmt`` to a Prompt, or raise InvalidRow."""
    if fmt in ("openai", "sharegpt"):
        key = "messages" if fmt == "openai" else "conversations"
        messages = row.get(key)
        if not isinstance(messages, list):
            raise InvalidRow(f"no '{key}' list (format {fmt})")
        prompt = _tool_prompt(row, messages) if is_tool_row(row, messages) else None
        prompt = prompt or _from_messages(messages)
    elif fmt == "turns":
        prompt = Prompt(_optional_text(row, "system"), _turns(row.get("turns")))
    elif fmt == "prompt":
        prompt = Prompt(_optional_text(row, "system"), [_single_prompt(row)])
    else:
        raise InvalidRow(f"unknown format {fmt!r}")
    if not prompt.user_turns:
        raise InvalidRow("no user turn")
    return prompt


def _tool_prompt(row: dict[str, Any], messages: list[Any]) -> Prompt:
    try:
        found = parse_tool_row(row, messages)
    except ToolRowError as exc:
        raise InvalidRow(str(exc)) from exc
    return Prompt(found.system, found.user_turns, found)


def _from_messages(messages: list[Any]) -> Prompt:
    system: str | None = None
    users: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRow(f"message {i} is not an object")
        role = _role(message, i)
        text = _text(message.get("content", message.get("value")), f"message {i}")
        if role == "system":
            system = text if system is None else f"{system}\n\n{text}"
        elif role == "user":
            users.append(text)
    return Prompt(system, users)


def _role(message: dict[str, Any], index: int) -> str:
    raw = message.get("role", message.get("from"))
    role = _OPENAI_ROLES.get(str(raw)) or _SHAREGPT_ROLES.get(str(raw).lower())
    if role is None:
        raise InvalidRow(f"message {index} has unknown role {raw!r}")
    return role


def _text(value: Any, where: str) -> str:
    try:
        return content_text(value, where)
    except ToolRowError as exc:
        raise InvalidRow(str(exc)) from exc


def _turns(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise InvalidRow("'turns' is not a list")
    return [_text(turn, f"turn {i}") for i, turn in enumerate(value)]


def _single_prompt(row: dict[str, Any]) -> str:
    column = next((col for col in PROMPT_COLUMNS if col in row), None)
    if column is None:
        raise InvalidRow(f"no {', '.join(PROMPT_COLUMNS)} column (format prompt)")
    text = _text(row[column], f"'{column}'")
    extra = row.get("input")
    if column == "instruction" and isinstance(extra, str) and extra.strip():
        text = f"{text}\n\n{extra}"
    return text


def _optional_text(row: dict[str, Any], key: str) -> str | None:
    value = row.get(key)
    return value if isinstance(value, str) and value.strip() else None
