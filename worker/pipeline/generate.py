"""Pure generation logic: which turns to answer, what history each sees, the final record.

No Redis, no HTTP, no Celery: the caller passes in how to call the model and how to save
progress, so this is tested on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.models import (
    Generation,
    GenParams,
    Message,
    Record,
    Sample,
    TurnResult,
    Usage,
)

Messages = list[dict[str, Any]]


def user_turns(sample: Sample, params: GenParams) -> list[str]:
    """The user turns to answer under the run's ``turns`` setting."""
    return params.turns_of(sample.user_turns)


def system_prompt(sample: Sample, params: GenParams) -> str | None:
    """The run's system prompt overrides the source's."""
    return params.system_for(sample.system)


def history(sample: Sample, params: GenParams, answered: list[TurnResult]) -> Messages:
    """Messages the server sees for the next turn: the model's own earlier answers included."""
    messages: Messages = []
    system = system_prompt(sample, params)
    if system:
        messages.append({"role": "system", "content": system})
    turns = user_turns(sample, params)
    for i, answer in enumerate(answered):
        messages.append({"role": "user", "content": turns[i]})
        messages.append(_assistant_message(answer))
    messages.append({"role": "user", "content": turns[len(answered)]})
    return messages


def _assistant_message(answer: TurnResult) -> dict[str, Any]:
    # Templates that keep reasoning in history read ``reasoning_content``; sending it back
    # keeps the server's view of the conversation equal to what the model produced.
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    return message


def with_cut(turn: TurnResult, max_tokens: int) -> TurnResult:
    """``turn`` with what cut it, if it was cut: a ``length`` finish short of ``max_tokens``
    was cut by the context window (a larger max_tokens could not have helped it)."""
    if turn.finish_reason != "length":
        return turn
    done = turn.usage.completion_tokens
    by = "context" if 0 < done < max_tokens else "max_tokens"
    return turn.model_copy(update={"cut_by": by})


def answer_turns(
    sample: Sample,
    params: GenParams,
    answered: list[TurnResult],
    call: Callable[[Messages], TurnResult],
    save: Callable[[list[TurnResult]], None],
) -> list[TurnResult]:
    """Answer the remaining turns in order, saving after each so a retry resumes there."""
    done = list(answered)
    wanted = len(user_turns(sample, params))
    while len(done) < wanted:
        turn = call(history(sample, params, done))
        done.append(turn)
        if turn.finish_reason == "length":
            break  # a cut answer can't carry the conversation: later turns would build on it
        if len(done) < wanted:
            save(list(done))
    return done


def build_record(
    run: str, sample: Sample, params: GenParams, turns: list[TurnResult], attempts: int
) -> Record:
    """The JSONL record of a finished sample."""
    conversation: list[Message] = []
    system = system_prompt(sample, params)
    if system:
        conversation.append(Message(role="system", content=system))
    for question, answer in zip(user_turns(sample, params), turns, strict=False):
        conversation.append(Message(role="user", content=question))
        conversation.append(
            Message(role="assistant", content=answer.content, reasoning_content=answer.reasoning)
        )
    return Record(
        id=sample.id, run=run, conversations=conversation, source=sample.source,
        generation=generation_of(params, turns, attempts),
    )  # fmt: skip


def generation_of(
    params: GenParams, turns: list[TurnResult], attempts: int, **extra: Any
) -> Generation:
    """How a sample's turns were generated: the last turn's model and finish, summed usage
    and latency, each turn's stats (``extra``: more fields, such as a stop reason)."""
    last = turns[-1]
    usage = Usage(
        prompt_tokens=sum(t.usage.prompt_tokens for t in turns),
        completion_tokens=sum(t.usage.completion_tokens for t in turns),
    )
    return Generation(
        model=last.model, endpoint=last.endpoint, finish_reason=last.finish_reason, usage=usage,
        turns=[t.stats() for t in turns], attempts=attempts,
        latency_s=round(sum(t.latency_s for t in turns), 3), params=params, **extra,
    )  # fmt: skip
