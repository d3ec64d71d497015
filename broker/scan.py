"""Which samples have a task message somewhere in the broker (kombu's Redis transport).

A message is either waiting in a queue list, or delivered and unacked (kombu keeps those in
the ``unacked`` hash with their delivery time in ``unacked_index``). The reconciler needs both
to tell a lost sample from one that is merely queued.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis

from broker.layout import UNACKED, UNACKED_INDEX, queue_lists
from broker.message import decode_args


@dataclass(frozen=True)
class MessageRef:
    """A task message for (run, sample): queued, or delivered at ``since`` (epoch seconds)."""

    run: str
    sample_id: str
    queued: bool
    since: float


def queued_count(client: redis.Redis, queue: str) -> int:
    """Messages waiting in ``queue`` (all priority sub-queues), in O(1)."""
    pipe = client.pipeline(transaction=False)
    for name in queue_lists(queue):
        pipe.llen(name)
    return sum(int(n) for n in pipe.execute())


PAGE = 500


def queued_refs(client: redis.Redis, queue: str) -> Iterator[MessageRef]:
    """Every generate-task message waiting in ``queue`` (all priority sub-queues).

    Read a page at a time: a whole long list at once is a memory peak in the pass, a
    high-water mark the worker's RSS then keeps. Producers push on the left and consumers pop
    on the right, so a later page can repeat a message (harmless) but never skips one.
    """
    for name in queue_lists(queue):
        start = 0
        while page := client.lrange(name, start, start + PAGE - 1):
            for raw in page:
                ref = _ref(_message(raw), queued=True, since=0.0)
                if ref is not None:
                    yield ref
            start += PAGE


def unacked_refs(client: redis.Redis) -> Iterator[MessageRef]:
    """Every delivered, not yet acknowledged generate-task message, with its delivery time."""
    scored: Any = client.zrange(UNACKED_INDEX, 0, -1, withscores=True)
    delivered = {str(tag): float(score) for tag, score in scored}
    for tag, raw in client.hgetall(UNACKED).items():
        message = _message(raw, delivered=True)
        if message is None:
            continue
        since = _eta(message) or delivered.get(str(tag), 0.0)
        ref = _ref(message, queued=False, since=since)
        if ref is not None:
            yield ref


def _message(raw: str | bytes, delivered: bool = False) -> dict[str, Any] | None:
    """A kombu message as its list (or, delivered, its unacked entry ``[message, ...]``) holds
    it; None for anything else: a foreign or garbled entry is no task of ours, and must not
    stop the reconciler's pass."""
    try:
        found = json.loads(raw)
        found = found[0] if delivered else found
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return found if isinstance(found, dict) else None


def _ref(message: dict[str, Any] | None, queued: bool, since: float) -> MessageRef | None:
    if message is None:
        return None
    args = decode_args(message)
    return None if args is None else MessageRef(args[0], args[1], queued, since)


def _eta(message: dict[str, Any]) -> float | None:
    # A retry waiting out its backoff sits in unacked until its ETA: it is alive until then.
    eta = (message.get("headers") or {}).get("eta")
    if not eta:
        return None
    try:
        return datetime.fromisoformat(eta).timestamp()
    except ValueError:
        return None
