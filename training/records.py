"""Read and validate the collector's JSONL records, in the forms the training jobs accept.

Accepted rows: the collector's schema-1 record; plain SpecForge rows (``{"id", "conversations"}``
with ``role``/``content``/``reasoning_content``); ShareGPT rows (``from``/``value``). Reasoning is
read from ``reasoning_content`` or from vLLM's newer ``reasoning`` field. Messages are turned into
the dicts a chat template sees, with reasoning under both ``reasoning_content`` and ``thinking``
(gpt-oss reads the latter), exactly as ``transformers`` passes them.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.finish import FINISHED_REASONS

_ROLES = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "human": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
}
_PASSTHROUGH = ("tool_calls", "tool_call_id", "name")


class RecordError(ValueError):
    """A row that cannot be used; the message says why in a few words."""


@dataclass(frozen=True, slots=True)
class TurnMeta:
    """What the collector recorded about one assistant turn's request.

    ``prompt_ids`` and ``completion_ids``: the server's own token ids of the turn's prompt and
    of what it generated (``generation.turns[i].prompt_token_ids`` / ``token_ids``), if kept.
    """

    finish_reason: str | None = None
    prompt_tokens: int | None = None
    prompt_ids: array[int] | None = None
    completion_ids: array[int] | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One conversation ready for rendering: template-ready messages and per-turn metadata."""

    id: str
    messages: tuple[dict[str, Any], ...]
    assistant_at: tuple[int, ...]
    turns: tuple[TurnMeta, ...]
    template_kwargs: dict[str, Any]
    tools: list[dict[str, Any]] | None = None  # the functions the conversation could call

    @property
    def has_ids(self) -> bool:
        """Whether every turn carries the server's prompt and completion ids."""
        return all(t.prompt_ids is not None and t.completion_ids is not None for t in self.turns)


def _message(raw: Any, index: int) -> dict[str, Any]:
    """Return the template-ready dict for one raw message, or raise RecordError."""
    if not isinstance(raw, dict):
        raise RecordError(f"message {index} is not an object")
    role = _ROLES.get(str(raw.get("role", raw.get("from", ""))).lower())
    if role is None:
        raise RecordError(f"message {index} has no known role")
    content = raw.get("content", raw.get("value"))
    if content is None and role == "assistant":
        if not raw.get("tool_calls"):  # its answer was lost: trained on, it would teach nothing
            raise RecordError(f"message {index} is an assistant message without content")
        content = ""
    if not isinstance(content, str):
        raise RecordError(f"message {index} content is not a string")
    msg: dict[str, Any] = {"role": role, "content": content}
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if reasoning is not None and not isinstance(reasoning, str):
        raise RecordError(f"message {index} reasoning is not a string")
    if reasoning:  # empty reasoning is not sent back to the server either
        msg["thinking"] = reasoning
        msg["reasoning_content"] = reasoning
    for key in _PASSTHROUGH:
        if raw.get(key) is not None:
            msg[key] = raw[key]
    return msg


def _turn_meta(generation: dict[str, Any], count: int) -> tuple[TurnMeta, ...]:
    """Return one TurnMeta per assistant turn from the record's ``generation`` block."""
    raw_turns = generation.get("turns")
    last_reason = generation.get("finish_reason")
    if not isinstance(raw_turns, list) or len(raw_turns) != count:
        return (*([TurnMeta()] * (count - 1)), TurnMeta(_str_or_none(last_reason)))
    out = []
    for raw in raw_turns:
        turn = _dict(raw)
        prompt = _dict(turn.get("usage")).get("prompt_tokens")
        # 0 means the server reported no usage: nothing to check against.
        known = isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0
        reason = _str_or_none(turn.get("finish_reason"))
        ids = _ids(turn.get("prompt_token_ids")), _ids(turn.get("token_ids"))
        out.append(TurnMeta(reason, prompt if known else None, *ids))
    return tuple(out)


def _ids(value: Any) -> array[int] | None:
    """Return a list of token ids as an int32 array; None if absent; RecordError if malformed."""
    if value is None:
        return None
    try:
        ids = array("i", value)  # at C speed: a string, float or huge number is refused here
    except (TypeError, OverflowError):
        raise RecordError("token ids are not a list of integers") from None
    if not isinstance(value, list) or (ids and min(ids) < 0):
        raise RecordError("token ids are not a list of non-negative integers")
    return ids


def _dict(value: Any) -> dict[str, Any]:
    """Return ``value`` if it is a dict, else an empty dict."""
    return value if isinstance(value, dict) else {}


def _str_or_none(value: Any) -> str | None:
    """Return ``value`` if it is a string, else None."""
    return value if isinstance(value, str) else None


def parse_record(obj: Any) -> Record:
    """Validate one decoded JSON row and return it as a Record, or raise RecordError."""
    if not isinstance(obj, dict):
        raise RecordError("row is not a JSON object")
    raw = obj.get("conversations", obj.get("conversation", obj.get("messages")))
    if not isinstance(raw, list) or not raw:
        raise RecordError("no conversations list")
    messages = [_message(m, i) for i, m in enumerate(raw)]
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant_at:
        raise RecordError("no assistant turn")
    # Messages after the last answer were never answered: nothing to train on there.
    messages = messages[: assistant_at[-1] + 1]
    generation = _dict(obj.get("generation"))
    kwargs = _dict(generation.get("params")).get("chat_template_kwargs")
    return Record(
        id=_record_id(obj, raw),
        messages=tuple(messages),
        assistant_at=tuple(assistant_at),
        turns=_finished(_turn_meta(generation, len(assistant_at))),
        template_kwargs=dict(kwargs) if isinstance(kwargs, dict) else {},
        tools=_tools(obj.get("tools")),
    )


def _finished(turns: tuple[TurnMeta, ...]) -> tuple[TurnMeta, ...]:
    """The turns, unless one was broken off (vLLM's ``abort``, ``error``, an unknown reason):
    its text is a partial answer, and the turns after it were generated on top of it."""
    for k, turn in enumerate(turns):
        if turn.finish_reason is not None and turn.finish_reason not in FINISHED_REASONS:
            raise RecordError(f"turn {k} did not finish (finish_reason {turn.finish_reason!r})")
    return turns


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """The record's tool specs (a JSON string is read), or None; RecordError if malformed."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except ValueError:
            raise RecordError("'tools' is not valid JSON") from None
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RecordError("'tools' is not a list of objects")
    return value


def _record_id(obj: dict[str, Any], raw: list[Any]) -> str:
    """Return the row's id, or a content hash for rows that carry none."""
    rid = obj.get("id", obj.get("conversation_id"))
    if isinstance(rid, str | int) and not isinstance(rid, bool) and str(rid):
        return str(rid)
    blob = json.dumps(raw, sort_keys=True, ensure_ascii=False).encode()
    return "sha1-" + hashlib.sha1(blob).hexdigest()[:16]


def parse_line(line: str | bytes) -> Record:
    """Decode and validate one JSONL line, or raise RecordError."""
    try:
        obj = json.loads(line)
    except ValueError as exc:  # also UnicodeDecodeError for bytes that are not UTF-8
        raise RecordError(f"broken JSON ({exc.__class__.__name__})") from None
    return parse_record(obj)


def iter_lines(path: Path, chunk_lines: int) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
    """Yield (bytes read so far, chunk of (line number, line)) for the non-blank lines of path."""
    chunk: list[tuple[int, bytes]] = []
    done = 0
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            done += len(raw)
            if not raw.strip():
                continue
            chunk.append((number, raw))
            if len(chunk) >= chunk_lines:
                yield done, chunk
                chunk = []
    if chunk:
        yield done, chunk


def specforge_row(
    row_id: str,
    messages: tuple[dict[str, Any], ...],
    finish_reason: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Return a conversations row both trainers read, with what their tools check.

    ``status: "success"`` is what SpecForge's expand and validate scripts require;
    ``finish_reason`` is the row's last turn's; the record's chat template kwargs
    (``enable_thinking`` …) sit at the top level, where SpecForge's preprocessing passes every
    extra column to the chat template, so each row renders with the settings it was generated
    with. A tool-calling conversation keeps its ``tools`` at the top level too (where SpecForge
    passes them to the template) and each message's ``tool_calls``, ``tool_call_id`` and
    ``name``.
    """
    out = []
    for m in messages:
        item = {"role": m["role"], "content": m["content"]}
        if m.get("reasoning_content"):
            item["reasoning_content"] = m["reasoning_content"]
        item.update((key, m[key]) for key in _PASSTHROUGH if m.get(key) is not None)
        out.append(item)
    row: dict[str, Any] = {**(template_kwargs or {}), "id": row_id, "conversations": out}
    if tools:
        row["tools"] = tools
    return row | {"status": "success", "finish_reason": finish_reason}
