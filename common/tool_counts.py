"""How tool-calling conversations ended, counted per run for ``status``.

Counted once per sample, when its record is first stored (a sample generated twice after a
redelivery counts once), in the run's counters hash: conversations, those kept whole, those
stopped at each turn by a call of another function than the source's, those stopped at each
turn by a cut answer (``stop_reason: "length"``), and calls whose arguments differ from the
source's.
"""

from __future__ import annotations

from typing import Any

import redis

from common.keys import RunKeys
from common.models import Record

_PREFIX = "tools:"
_STOPPED = f"{_PREFIX}stopped_at_turn:"
_CUT = f"{_PREFIX}cut_at_turn:"


def count(r: redis.Redis, keys: RunKeys, record: Record) -> None:
    """Count one stored record of a sample with tools."""
    generation = record.generation
    pipe = r.pipeline(transaction=False)
    pipe.hincrby(keys.counters, f"{_PREFIX}conversations", 1)
    if generation.stop_turn is None:
        pipe.hincrby(keys.counters, f"{_PREFIX}whole", 1)
    else:  # stop_reason "length" is the turn's finish_reason: cut, not another call
        cut = generation.stop_reason == "length"
        pipe.hincrby(keys.counters, f"{_CUT if cut else _STOPPED}{generation.stop_turn}", 1)
    differ = generation.tool_arguments_differ or 0
    if differ:
        pipe.hincrby(keys.counters, f"{_PREFIX}arguments_differ", differ)
    pipe.execute()


def read(r: redis.Redis, keys: RunKeys) -> dict[str, Any] | None:
    """The run's tool-call figures; None when it has no tool-calling conversation."""
    fields = {str(k): int(v) for k, v in r.hgetall(keys.counters).items()}
    total = fields.get(f"{_PREFIX}conversations", 0)
    if not total:
        return None
    stopped, cut = _per_turn(fields, _STOPPED), _per_turn(fields, _CUT)
    return {
        "conversations": total,
        "kept_whole": fields.get(f"{_PREFIX}whole", 0),
        "stopped": sum(stopped.values()),
        "stopped_at_turn": stopped,
        "cut": sum(cut.values()),
        "cut_at_turn": cut,
        "arguments_differ": fields.get(f"{_PREFIX}arguments_differ", 0),
    }


def _per_turn(fields: dict[str, int], prefix: str) -> dict[str, int]:
    """The counts under ``prefix`` by turn, in turn order."""
    found = {int(name[len(prefix) :]): n for name, n in fields.items() if name.startswith(prefix)}
    return {str(turn): found[turn] for turn in sorted(found)}
