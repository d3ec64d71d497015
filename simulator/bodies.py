"""Response bodies (pure): the OpenAI / vLLM JSON objects and their SSE framing.

Token ids go where vLLM 0.32 puts them when a request sets return_token_ids. Chat: the first
chunk carries `prompt_token_ids` at the top level and every later chunk's choice `token_ids`
(its delta's ids); a full response carries `prompt_token_ids` at the top level and the
choice `token_ids`. Completions: both fields sit in the choice (prompt ids in the first chunk).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from simulator.config import ReasoningField
from simulator.jobs import Job, Piece


def error_body(
    status: int, message: str, err_type: str, param: str | None = None
) -> dict[str, Any]:
    """Return a vLLM-style error object."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


# vLLM names its build on the last chunk (with usage) and on whole responses.
FINGERPRINT = "eaglegen-sim"


def usage_body(job: Job) -> dict[str, Any]:
    """Return the usage object of a finished job; on the chat API of a server that parses
    reasoning, vLLM counts the reasoning tokens apart."""
    done = job.output.completion_tokens
    usage: dict[str, Any] = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": done,
        "total_tokens": job.prompt_tokens + done,
    }
    if job.endpoint == "chat" and job.reasoning_field != "inline":
        thought = sum(
            len(ids)
            for (kind, _), ids in zip(job.pieces, job.output.piece_ids, strict=False)
            if kind == "reasoning"
        )
        usage["completion_tokens_details"] = {"reasoning_tokens": thought}
    return usage


def stream_opening(job: Job) -> bytes:
    """Return what a stream starts with: chat's role chunk (with the prompt ids)."""
    if job.endpoint == "completion":
        return b""
    body = chunk_body(job, {"role": "assistant", "content": ""})
    if job.return_ids:
        body["prompt_token_ids"] = job.prompt_ids
        body["prompt_text"] = None  # vLLM's, beside the ids (its text only when asked for)
    return sse(body)


def stream_batch(
    job: Job, batch: list[Piece], ids: list[int], first: bool, finish: str | None = None
) -> bytes:
    """Return the chunk of one same-kind batch of tokens; ``finish``: the last one, which
    carries the finish reason (vLLM sends it with the last token, no chunk of its own)."""
    if job.endpoint == "completion":
        return sse(text_chunk_body(job, "".join(t for _, t in batch), ids, first, finish))
    delta = delta_body(batch, job.reasoning_field)
    if finish is not None and not delta:
        delta = {"content": ""}  # vLLM's parser gives the end-of-turn token an empty content
    return sse(chunk_body(job, delta, finish, ids=ids))


def stream_tail(job: Job, first: bool, finished: bool = False) -> bytes:
    """Return the finish chunk (unless the last token's chunk carried it: ``finished``), the
    usage chunk if asked for, and [DONE]. An abort's finish chunk has no token (vLLM's
    ``abort_requests`` output), and a request aborted before its first token has none."""
    finish = job.output.finish_reason
    if finished or (finish == "abort" and first):
        tail = b""
    elif job.endpoint == "completion":
        tail = sse(text_chunk_body(job, "", [], first, finish))
    else:
        tail = sse(chunk_body(job, {}, finish, ids=[]))
    if job.include_usage:
        last = {"choices": [], "usage": usage_body(job), "system_fingerprint": FINGERPRINT}
        tail += sse({**_envelope(job), **last})
    return tail + sse("[DONE]")


def chunk_body(
    job: Job, delta: dict[str, Any], finish_reason: str | None = None, ids: list[int] | None = None
) -> dict[str, Any]:
    """Return one chat.completion.chunk with a single choice (a last one names its
    ``stop_reason``, null here: no stop string or token is ever asked for)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    if job.return_ids and ids is not None:
        choice["token_ids"] = ids
    return {**_envelope(job), "choices": [choice]}


def text_chunk_body(
    job: Job, text: str, ids: list[int], first: bool, finish_reason: str | None = None
) -> dict[str, Any]:
    """Return one streamed text_completion chunk (vLLM names every field in each)."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    if job.return_ids:
        choice["prompt_token_ids"] = job.prompt_ids if first else None
        choice["token_ids"] = ids
    return {**_envelope(job), "choices": [choice]}


def delta_body(batch: list[Piece], reasoning_field: ReasoningField) -> dict[str, Any]:
    """Return the delta carrying one same-kind batch of tokens (empty for special tokens)."""
    kind = batch[0][0]
    if kind == "special":
        return {}
    if kind == "tool":
        return {"tool_calls": [json.loads(text) for _, text in batch]}
    name = "content" if kind == "content" else reasoning_field
    return {name: "".join(text for _, text in batch)}


def full_body(job: Job) -> dict[str, Any]:
    """Return the non-streaming response object of a finished job."""
    if job.endpoint == "completion":
        return _text_completion_body(job)
    return completion_body(job)


def completion_body(job: Job) -> dict[str, Any]:
    """Return the non-streaming chat.completion object of a finished job."""
    choice = {
        "index": 0,
        "message": message_body(job.pieces, job.reasoning_field),
        "logprobs": None,
        "finish_reason": job.output.finish_reason,
    }
    body = {**_envelope(job, full=True), "choices": [choice], "usage": usage_body(job)}
    if job.return_ids:
        choice["token_ids"] = job.ids_of(0, len(job.pieces))
        body["prompt_token_ids"] = job.prompt_ids
    return body


def _text_completion_body(job: Job) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": "".join(text for _, text in job.pieces),
        "logprobs": None,
        "finish_reason": job.output.finish_reason,
    }
    if job.return_ids:
        choice["token_ids"] = job.ids_of(0, len(job.pieces))
        choice["prompt_token_ids"] = job.prompt_ids
    return {**_envelope(job), "choices": [choice], "usage": usage_body(job)}


def message_body(pieces: list[Piece], reasoning_field: ReasoningField) -> dict[str, Any]:
    """Return the assistant message; empty texts are null, as vLLM sends them."""
    content = "".join(text for kind, text in pieces if kind == "content") or None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    calls = joined_calls([json.loads(text) for kind, text in pieces if kind == "tool"])
    if calls:
        message["tool_calls"] = calls
    if reasoning_field == "inline":
        return message
    reasoning = "".join(text for kind, text in pieces if kind == "reasoning") or None
    return {**message, reasoning_field: reasoning}


def joined_calls(fragments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole calls of a non-streamed answer, from its call fragments."""
    calls: dict[int, dict[str, Any]] = {}
    for f in fragments:
        call = calls.setdefault(
            f["index"],
            {"id": f.get("id"), "type": "function", "function": {"name": None, "arguments": ""}},
        )
        call["function"]["name"] = call["function"]["name"] or f["function"].get("name")
        call["function"]["arguments"] += f["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)]


def _envelope(job: Job, full: bool = False) -> dict[str, Any]:
    chat = "chat.completion" if full else "chat.completion.chunk"
    obj = "text_completion" if job.endpoint == "completion" else chat
    return {"id": job.request_id, "object": obj, "created": job.created, "model": job.model}


def sse(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()
