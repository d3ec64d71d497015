"""What a request will generate (pure): its prompt ids, its answer key and its output.

A chat request that does not ask for token ids keeps the original accounting (reasoning and
content tokens only, `count_prompt_tokens` for the prompt), so existing answers never change.
A request in the token-id world (return_token_ids, a continued final message, /v1/completions)
is counted as vLLM counts: prompt tokens are the prompt ids, and <think>, </think> and the
end-of-turn token are generated tokens like any other, within max_tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from simulator.answers import Message, count_prompt_tokens, expected_answer, prompt_key
from simulator.config import ReasoningField, SimConfig
from simulator.faults import context_error, prompt_too_long
from simulator.jobs import ChatRequest, CompletionRequest, Output, answer_pieces, raw_piece
from simulator.output import Generation, Resume, generation, model_output, resume_point
from simulator.tokenizer import (
    THINK,
    THINK_END,
    VOCAB_SIZE,
    content_text,
    decode_prompt,
    encode_chat,
    encode_prompt,
    encode_text,
    parse,
)
from simulator.tool_calls import SimCall
from simulator.tool_plans import tool_calls_of, tool_output


@dataclass(frozen=True)
class Plan:
    """An accepted request: its key, prompt and output."""

    key: str
    prompt_tokens: int
    prompt_ids: list[int]
    return_ids: bool
    output: Output


@dataclass(frozen=True)
class Rejection:
    """A request refused with HTTP 400 (key: the prompt key, when one is known)."""

    message: str
    key: str | None = None


def chat_plan(req: ChatRequest, cfg: SimConfig) -> Plan | Rejection:
    """Plan a chat completion."""
    with_ids = cfg.token_ids and bool(req.return_token_ids)
    if req.continue_final_message and cfg.ignore_continuations:
        return _ignored_continuation_plan(req, cfg, with_ids)
    if req.continue_final_message:
        return _continuation_plan(req, cfg, with_ids)
    calls = tool_calls_of(req, cfg)
    if calls:
        return _tool_plan(req, cfg, with_ids, calls)
    if with_ids:
        prompt_ids = encode_chat(req.messages, req.thinking, tools=req.tools)
        resume = Resume(model_output(req.messages, cfg, req.thinking), 0)
        return _raw_plan(prompt_key(req.messages), prompt_ids, resume, req.limit, cfg, True)
    return _legacy_plan(req, cfg)


def _tool_plan(
    req: ChatRequest, cfg: SimConfig, with_ids: bool, calls: list[SimCall]
) -> Plan | Rejection:
    key = prompt_key(req.messages)
    prompt_ids = encode_chat(req.messages, req.thinking, tools=req.tools)
    too_long, limit = fit_context(len(prompt_ids), req.limit, cfg)
    if too_long is not None:
        return Rejection(too_long, key)
    output = tool_output(req.messages, calls, cfg, req.thinking, limit)
    return Plan(key, len(prompt_ids), prompt_ids, with_ids, output)


def _legacy_plan(req: ChatRequest, cfg: SimConfig) -> Plan | Rejection:
    key = prompt_key(req.messages)
    prompt_tokens = count_prompt_tokens(req.messages)
    too_long, limit = fit_context(prompt_tokens, req.limit, cfg)
    if too_long is not None:
        return Rejection(too_long, key)
    answer = expected_answer(req.messages, limit, cfg, req.thinking)
    pieces = answer_pieces(answer, cfg.reasoning_field)
    # Ids of the legacy pieces feed only the prefix cache (legacy tags are fused to words).
    ids = [encode_text(text, key) for _, text in pieces]
    output = Output(pieces, ids, answer.finish_reason, answer.completion_tokens)
    return Plan(key, prompt_tokens, encode_chat(req.messages, req.thinking), False, output)


def _continuation_plan(req: ChatRequest, cfg: SimConfig, with_ids: bool) -> Plan | Rejection:
    messages = req.messages
    if messages[-1]["role"] != "assistant":
        return Rejection("continue_final_message needs the last message to be the assistant's")
    prompt_ids = encode_chat(messages, req.thinking, continue_final=True)
    partial = encode_text(content_text(messages[-1]), prompt_key(messages[:-1]))
    key, resume = _resume(messages, partial, req.thinking, cfg)
    return _raw_plan(key, prompt_ids, resume, req.limit, cfg, with_ids)


def _ignored_continuation_plan(
    req: ChatRequest, cfg: SimConfig, with_ids: bool
) -> Plan | Rejection:
    """A server that ignores continue_final_message: the partial answer is rendered as a
    closed turn, a generation prompt follows, and the question is answered afresh."""
    messages = req.messages
    prompt_ids = encode_chat(messages, req.thinking)
    fresh = Resume(model_output(messages[:-1], cfg, req.thinking), 0)
    return _raw_plan(prompt_key(messages[:-1]), prompt_ids, fresh, req.limit, cfg, with_ids)


def completion_plan(req: CompletionRequest, cfg: SimConfig) -> Plan | Rejection:
    """Plan a (legacy) completion: text or token-id prompt, output counted in ids."""
    ids = _prompt_ids(req.prompt, cfg)
    if isinstance(ids, Rejection):
        return ids
    if cfg.ignore_continuations:
        ids, key, resume = _ignored_partial(ids, cfg)
    else:
        key, resume = _completion_resume(ids, cfg)
    return_ids = cfg.token_ids and bool(req.return_token_ids)
    return _raw_plan(key, ids, resume, req.max_tokens, cfg, return_ids, "inline")


def _prompt_ids(
    prompt: str | list[int] | list[str] | list[list[int]], cfg: SimConfig
) -> list[int] | Rejection:
    one: str | list[int]
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        one = cast("str | list[int]", prompt)
    elif len(prompt) != 1:
        return Rejection("prompt: the simulator takes one prompt per request")
    else:
        one = prompt[0]
    if isinstance(one, str):
        return encode_prompt(one) or Rejection("prompt: the prompt is empty")
    if not cfg.token_ids:
        return Rejection("prompt: this server does not take token-id prompts")
    bad = next((i for i in one if not 0 <= i < VOCAB_SIZE), None)
    if bad is not None:
        return Rejection(f"Token id {bad} is out of vocabulary (size {VOCAB_SIZE}).")
    return list(one) or Rejection("prompt: the prompt is empty")


def _completion_resume(ids: list[int], cfg: SimConfig) -> tuple[str, Resume]:
    parsed = parse(ids)
    if parsed.structured and parsed.open_role == "assistant":
        partial, thinking = parsed.open_ids, True
        if partial[:2] == [THINK, THINK_END]:  # the template's thinking-off prompt
            partial, thinking = partial[2:], False
        found = resume_point(parsed.messages, partial, cfg, thinking)
        if found is not None:
            return prompt_key(parsed.messages), found
    # Not a prompt the simulated model could have produced: answer it as one user message.
    fresh = [{"role": "user", "content": decode_prompt(ids)}]
    return prompt_key(fresh), Resume(model_output(fresh, cfg), 0)


def _ignored_partial(ids: list[int], cfg: SimConfig) -> tuple[list[int], str, Resume]:
    """A server that drops a token-id prompt's partial answer: it answers the open assistant
    turn from its start, and echoes the prompt it actually used."""
    parsed = parse(ids)
    if not (parsed.structured and parsed.open_role == "assistant" and parsed.open_ids):
        key, resume = _completion_resume(ids, cfg)
        return ids, key, resume
    used = ids[: len(ids) - len(parsed.open_ids)]
    return used, prompt_key(parsed.messages), Resume(model_output(parsed.messages, cfg), 0)


def _resume(
    messages: Sequence[Message], partial: list[int], thinking: bool, cfg: SimConfig
) -> tuple[str, Resume]:
    before = messages[:-1]
    found = resume_point(before, partial, cfg, thinking)
    if found is not None:
        return prompt_key(before), found
    # A partial message the model would not have written: a fresh answer after all of it.
    return prompt_key(messages), Resume(model_output(messages, cfg, False), 0)


def fit_context(
    prompt_tokens: int, max_tokens: int | None, cfg: SimConfig
) -> tuple[str | None, int]:
    """What a server makes of a request's length: its error (None: served), and the most
    tokens it generates. Without max_tokens, the rest of the context window (as vLLM). With
    ``over_context`` "clamp" (vLLM 0.32), max_tokens is cut to the window left after the
    prompt (``get_max_tokens``) and only a prompt that fills the window is refused; with
    "refuse" (vLLM's releases that check the sum), prompt + max_tokens over it is a 400."""
    room = cfg.max_model_len - prompt_tokens
    if cfg.over_context == "clamp":
        if room <= 0:
            return prompt_too_long(prompt_tokens, cfg.max_model_len), 0
        return None, room if max_tokens is None else min(max_tokens, room)
    too_long = context_error(prompt_tokens, max_tokens, cfg.max_model_len)
    return too_long, room if max_tokens is None else max_tokens


def _raw_plan(
    key: str,
    prompt_ids: list[int],
    resume: Resume,
    max_tokens: int | None,
    cfg: SimConfig,
    return_ids: bool,
    reasoning_field: ReasoningField | None = None,
) -> Plan | Rejection:
    too_long, limit = fit_context(len(prompt_ids), max_tokens, cfg)
    if too_long is not None:
        return Rejection(too_long, key)
    made = generation(resume.output, resume.start, limit)
    output = raw_output(made, reasoning_field or cfg.reasoning_field)
    return Plan(key, len(prompt_ids), prompt_ids, return_ids, output)


def raw_output(made: Generation, reasoning_field: ReasoningField) -> Output:
    """Return the pieces of a generation in the token-id world: one id per piece."""
    pieces = [raw_piece(t, reasoning_field) for t in made.tokens]
    ids = [[t.id] for t in made.tokens]
    return Output(pieces, ids, made.finish_reason, made.completion_tokens)
