"""Collector records as a worker writes them against the simulator, built without a network."""

from __future__ import annotations

from functools import cache
from typing import Any

from simulator.config import SimConfig
from simulator.hf_tokenizer import build
from simulator.output import generation, model_output
from simulator.tokenizer import encode_chat


@cache
def sim_tokenizer() -> Any:
    """The simulator's tokenizer as a fast tokenizer, built once per session."""
    return build()


def sim_record(
    rid: str, questions: list[str], thinking: bool = True, max_tokens: int = 10_000
) -> dict[str, Any]:
    """A record answering ``questions`` in turn, with the server's ids, as the worker keeps it."""
    conversation: list[dict[str, Any]] = []
    turns = []
    for question in questions:
        conversation.append({"role": "user", "content": question})
        history = [{"role": m["role"], "content": m["content"]} for m in conversation]
        made = generation(model_output(history, SimConfig(), thinking), 0, max_tokens)
        answer = {"role": "assistant", "content": _text(made.tokens, "content")}
        if reasoning := _text(made.tokens, "reasoning"):
            answer["reasoning_content"] = reasoning
        conversation.append(answer)
        prompt = encode_chat(history, thinking)
        turns.append(
            {"finish_reason": made.finish_reason,
             "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(made.tokens)},
             "prompt_token_ids": prompt, "token_ids": made.token_ids}
        )  # fmt: skip
        if made.finish_reason == "length":
            break
    kwargs = {} if thinking else {"chat_template_kwargs": {"enable_thinking": False}}
    generation_block = {"turns": turns, "params": kwargs}
    return {"schema": 1, "id": rid, "conversations": conversation, "generation": generation_block}


def _text(tokens: list[Any], role: str) -> str:
    return "".join(t.text for t in tokens if t.role == role)
