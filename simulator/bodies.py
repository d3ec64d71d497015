"""Response bodies (pure): the OpenAI / vLLM JSON objects and their SSE framing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from simulator.answers import SimAnswer, inline_tokens
from simulator.config import ReasoningField
from simulator.jobs import Job, Piece


def error_body(
    status: int, message: str, err_type: str, param: str | None = None
) -> dict[str, Any]:
    """Return a vLLM-style error object."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def usage_body(job: Job) -> dict[str, int]:
    """Return the usage object of a finished job."""
    done = job.answer.completion_tokens
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": done,
        "total_tokens": job.prompt_tokens + done,
    }


def chunk_body(job: Job, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """Return one chat.completion.chunk with a single choice."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {**_envelope(job, "chat.completion.chunk"), "choices": [choice]}


def usage_chunk_body(job: Job) -> dict[str, Any]:
    """Return the trailing usage chunk (no choices) sent when include_usage is set."""
    return {**_envelope(job, "chat.completion.chunk"), "choices": [], "usage": usage_body(job)}


def delta_body(batch: list[Piece], reasoning_field: ReasoningField) -> dict[str, str]:
    """Return the delta carrying one same-kind batch of tokens."""
    kind = batch[0][0]
    name = "content" if kind == "content" else reasoning_field
    return {name: "".join(text for _, text in batch)}


def completion_body(job: Job) -> dict[str, Any]:
    """Return the non-streaming chat.completion object of a finished job."""
    choice = {
        "index": 0,
        "message": message_body(job.answer, job.reasoning_field),
        "logprobs": None,
        "finish_reason": job.answer.finish_reason,
    }
    return {**_envelope(job, "chat.completion"), "choices": [choice], "usage": usage_body(job)}


def message_body(answer: SimAnswer, reasoning_field: ReasoningField) -> dict[str, Any]:
    """Return the assistant message; empty texts are null, as vLLM sends them."""
    if reasoning_field == "inline":
        return {"role": "assistant", "content": "".join(inline_tokens(answer)) or None}
    return {
        "role": "assistant",
        "content": answer.content or None,
        reasoning_field: answer.reasoning or None,
    }


def _envelope(job: Job, obj: str) -> dict[str, Any]:
    return {"id": job.request_id, "object": obj, "created": job.created, "model": job.model}


def sse(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()
