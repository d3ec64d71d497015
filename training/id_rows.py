"""Training rows from the server's own token ids, and how they differ from the template's.

A record whose turns carry ``prompt_token_ids`` and ``token_ids`` (``common/models.py``)
holds the exact sequences the target saw and produced. The row ending at turn k is
``prompt_ids[k] + token_ids[k]``, trained (mask 1) on ``token_ids[k]``: what the model
generated, its think tokens and end-of-turn token included, as it generated them.

Earlier turns are trained inside a later row where its prompt repeats them exactly: turn j's
prompt and completion ids begin turn k's prompt ids. That is the rule rendered rows follow
(:func:`training.render.group_turns`), on ids instead of text: templates that drop earlier
reasoning from the history (Qwen3, the simulator's) give one row per turn, templates that keep
it verbatim one row per conversation, and ``--per-turn`` works as for rendered rows.

The template is still rendered, as a cross-check. A row from ids that differs from the
template's row for the same turn is drift (another template version, special tokens,
whitespace such as the ``\\n\\n`` vLLM puts before an answer): the first differing position is
found here and shown decoded on both sides by the caller.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from training.records import Record
from training.render import PerTurn, group_turns


@dataclass(frozen=True, slots=True)
class IdRow:
    """A row from ids: its last turn, the turns it trains, ids, mask and where turns end."""

    last: int
    turns: tuple[int, ...]
    ids: array[int]
    mask: Any  # numpy int8
    cuts: tuple[tuple[int, int], ...]  # (earlier turn, token index where its context ends)


def id_rows(record: Record, per_turn: PerTurn) -> tuple[list[IdRow], int]:
    """Return the rows of a record with ids, and how many turns no row trains on."""
    import numpy as np

    prompts = [t.prompt_ids or array("i") for t in record.turns]
    contexts = [
        p + (t.completion_ids or array("i")) for p, t in zip(prompts, record.turns, strict=True)
    ]
    rows = []
    unmasked = 0
    for last, earlier, untrained in group_turns(prompts, contexts, per_turn):
        ids = array("i", contexts[last])
        mask = np.zeros(len(ids), dtype=np.int8)
        for j in (*earlier, last):
            mask[len(prompts[j]) : len(contexts[j])] = 1
        cuts = tuple((j, len(contexts[j])) for j in earlier)
        rows.append(IdRow(last, (*earlier, last), ids, mask, cuts))
        unmasked += untrained
    return rows, unmasked


def difference(
    ids: array[int], mask: Any, other_ids: array[int], other_mask: Any
) -> tuple[int, str] | None:
    """Return the first position where a row from ids differs from the template's, and how.

    "token" or "mask"; None if they agree. Template tokens after the end of the ids row that
    no loss covers (the closing tags and end-of-turn a template adds after a turn cut at
    max_tokens, which the model never generated) change nothing in training: not a difference.
    """
    n = len(ids)
    if ids != other_ids and not (ids == other_ids[:n] and not other_mask[n:].any()):
        pairs = enumerate(zip(ids, other_ids, strict=False))  # the shorter may be a prefix
        first = next((i for i, (a, b) in pairs if a != b), None)
        return (min(n, len(other_ids)) if first is None else first), "token"
    differs = (mask != other_mask[:n]).nonzero()[0]
    return (int(differs[0]), "mask") if len(differs) else None


def show(decode: Callable[[list[int]], str], ids: Sequence[int], at: int, width: int = 8) -> str:
    """The tokens around position ``at``, decoded, the one at ``at`` in ⟦brackets⟧."""
    before = decode(list(ids[max(0, at - width) : at]))
    here = decode(list(ids[at : at + 1]))
    after = decode(list(ids[at + 1 : at + 1 + width]))
    return f"{before}⟦{here}⟧{after}"
