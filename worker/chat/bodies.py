"""The JSON bodies of the requests a ``ChatClient`` sends: a streamed chat turn, the chat
continuation of a turn's text, the /v1/completions continuation of its ids."""

from __future__ import annotations

import json
from typing import Any

from common.models import Checkpoint, GenParams
from worker.chat.reasoning import partial_message

Messages = list[dict[str, Any]]


def chat_body(
    model: str, messages: Messages, params: GenParams, token_ids: bool,
    fields: dict[str, Any] | None = None,
) -> bytes:  # fmt: skip
    """The JSON body of one streamed chat completion (``fields``: the sample's tools)."""
    body = _chat_fields(model, messages, params, params.max_tokens)
    if fields:
        body.update(fields)
    if token_ids:
        body["return_token_ids"] = True
    return encode(body)


def continue_body(
    model: str, messages: Messages, params: GenParams, resume: Checkpoint, max_tokens: int
) -> bytes:
    """The chat completion that continues a turn's text: the partial answer as the final
    assistant message, left open (vLLM's ``continue_final_message``), for what is left of
    max_tokens. No ids asked: they would not be the ids the model generated."""
    partial = partial_message(resume.reasoning, resume.content)
    body = _chat_fields(model, [*messages, partial], params, max_tokens)
    body["continue_final_message"] = True
    body["add_generation_prompt"] = False
    return encode(body)


def completion_body(model: str, prompt: list[int], params: GenParams, max_tokens: int) -> bytes:
    """The streamed /v1/completions request that continues a turn exactly from its ids: the
    chat's prompt ids then the ids generated so far, the same sampling, what is left of
    max_tokens. Special tokens are skipped from the text as on the chat API (vLLM's default),
    so the text matches; ``</think>`` is not special for the models that use it."""
    body = {"prompt": prompt, **_streamed(model, params, max_tokens), "return_token_ids": True}
    return encode(body)


def _streamed(model: str, params: GenParams, max_tokens: int) -> dict[str, Any]:
    """What every generation request shares: the model, the limit, the sampling (unset: the
    server's generation config applies), streamed with a usage chunk at the end."""
    return {
        "model": model, "max_tokens": max_tokens, **params.sampling(),
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def _chat_fields(
    model: str, messages: Messages, params: GenParams, max_tokens: int
) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, **_streamed(model, params, max_tokens)}
    if params.chat_template_kwargs:
        body["chat_template_kwargs"] = params.chat_template_kwargs
    return body


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()
