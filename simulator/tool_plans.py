"""The output of a request whose answer calls tools (pure): its pieces and their ids.

The answer is the prompt's reasoning (as any answer's), then each call streamed in vLLM's
fragments (simulator/tool_calls.py), then the end-of-turn token. The ids of a call are those of
its text as the chat template renders it, cut where the fragments are cut, so a rendered
conversation and the streamed ids agree. Cut by max_tokens at a piece: ``length``.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.answers import FinishReason, Message, prompt_key
from simulator.config import SimConfig
from simulator.jobs import ChatRequest, Output, Piece, raw_piece
from simulator.output import model_output
from simulator.tokenizer import IM_END, decode, encode_text
from simulator.tool_calls import SimCall, call_text, chosen_calls, fragment

ARGUMENT_IDS = 3  # ids per streamed arguments fragment


def tool_calls_of(req: ChatRequest, cfg: SimConfig) -> list[SimCall]:
    """The calls the answer to ``req`` makes (empty: a text answer)."""
    if not req.tools:
        return []
    key = prompt_key(req.messages)
    return chosen_calls(req.messages, req.tools, req.tool_choice, key, cfg.tool_mismatch_share)


def tool_output(
    messages: Sequence[Message], calls: list[SimCall], cfg: SimConfig, thinking: bool,
    limit: int,
) -> Output:  # fmt: skip
    """The pieces of an answer that calls ``calls``, at most ``limit`` ids."""
    pieces: list[Piece] = []
    ids: list[list[int]] = []
    for token in model_output(messages, cfg, thinking):
        if token.role in ("open", "reasoning", "close"):
            pieces.append(raw_piece(token, cfg.reasoning_field))
            ids.append([token.id])
    for index, call in enumerate(calls):
        head, arguments, tail = call_text(call.name, call.arguments)
        pieces.append(("tool", fragment(call, index, "", first=True)))
        ids.append(encode_text(head))
        encoded = encode_text(arguments)
        for at in range(0, len(encoded), ARGUMENT_IDS):
            group = encoded[at : at + ARGUMENT_IDS]
            pieces.append(("tool", fragment(call, index, decode(group), first=False)))
            ids.append(group)
        pieces.append(("special", ""))
        ids.append(encode_text(tail))
    pieces.append(("special", ""))
    ids.append([IM_END])
    return _cut(pieces, ids, limit)


def _cut(pieces: list[Piece], ids: list[list[int]], limit: int) -> Output:
    kept, total = 0, 0
    while kept < len(pieces) and total + len(ids[kept]) <= limit:
        total += len(ids[kept])
        kept += 1
    finish: FinishReason = "tool_calls" if kept == len(pieces) else "length"
    return Output(pieces[:kept], ids[:kept], finish, total)
