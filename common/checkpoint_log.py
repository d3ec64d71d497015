"""The storage format of a checkpoint: a header written once, then pieces appended.

A checkpoint is kept in two places. The header is the ``Checkpoint`` without what grows (no
ids, no text, ``tokens`` 0): it goes into the sample's checkpoint field, where LEASE_TAKE reads
it with the prompt. What the turn generated goes into the sample's checkpoint log, a string
each save appends one line to: ``[ids, content, reasoning, tokens]`` generated since the save
before. So the bytes a turn sends to Redis grow with its length, not with its square; a save
rewrites the whole of it only when it starts (the first save of an attempt at the turn) or
when what it has no longer extends what was saved.

Pure: no Redis. ``common/checkpoint_store.py`` writes both parts with one fenced script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from common.models import Checkpoint


@dataclass(frozen=True)
class Saved:
    """How far a checkpoint was saved: what the next piece starts after."""

    ids: int = 0
    content: int = 0
    reasoning: int = 0
    tokens: int = 0
    log_bytes: int = 0  # length of the log in Redis after that save (bytes, as STRLEN)


def header(checkpoint: Checkpoint) -> str:
    """The header of ``checkpoint``: everything but what grows (ids [] when it has ids)."""
    empty_ids: list[int] | None = [] if checkpoint.token_ids is not None else None
    head = checkpoint.model_copy(update={"token_ids": empty_ids, "content": "", "reasoning": "",
                                         "tokens": 0})  # fmt: skip
    return head.model_dump_json()


def piece(checkpoint: Checkpoint, since: Saved) -> str:
    """The log line of what ``checkpoint`` holds beyond ``since``."""
    ids = checkpoint.token_ids[since.ids :] if checkpoint.token_ids is not None else []
    line = [ids, checkpoint.content[since.content :], checkpoint.reasoning[since.reasoning :],
            checkpoint.tokens - since.tokens]  # fmt: skip
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


def extends(checkpoint: Checkpoint, saved: Checkpoint) -> bool:
    """Whether ``checkpoint`` is ``saved`` plus more, so a piece can be appended to it.

    Ids only ever grow in a stream; text may not (reasoning split off the answer afterwards):
    compared, the one cost that grows with the turn, a memory compare.
    """
    names = ("turn", "endpoint", "model", "resumed_from_tokens", "discarded_tokens",
             "history_turns", "history")  # fmt: skip
    for name in names:
        if getattr(checkpoint, name) != getattr(saved, name):
            return False
    if (checkpoint.token_ids is None) != (saved.token_ids is None):
        return False
    if len(checkpoint.token_ids or ()) < len(saved.token_ids or ()):
        return False
    if checkpoint.prompt_token_ids != saved.prompt_token_ids:
        return False
    return (checkpoint.tokens >= saved.tokens and checkpoint.content.startswith(saved.content)
            and checkpoint.reasoning.startswith(saved.reasoning))  # fmt: skip


def saved(checkpoint: Checkpoint, log_bytes: int) -> Saved:
    """The mark after saving ``checkpoint`` (the log then ``log_bytes`` long)."""
    ids = len(checkpoint.token_ids) if checkpoint.token_ids is not None else 0
    return Saved(ids, len(checkpoint.content), len(checkpoint.reasoning), checkpoint.tokens,
                 log_bytes)  # fmt: skip


def decode(head: str, log: str | None) -> Checkpoint | None:
    """The checkpoint a header and its log hold; None without a header (none kept)."""
    if not head:
        return None
    base = Checkpoint.model_validate_json(head)
    ids: list[int] = []
    content: list[str] = []
    reasoning: list[str] = []
    tokens = 0
    for line in (log or "").splitlines():
        more_ids, more_content, more_reasoning, more_tokens = json.loads(line)
        ids += more_ids
        content.append(more_content)
        reasoning.append(more_reasoning)
        tokens += more_tokens
    update = {
        "token_ids": ids if base.token_ids is not None else None, "content": "".join(content),
        "reasoning": "".join(reasoning), "tokens": tokens,
    }  # fmt: skip
    return base.model_copy(update=update)
