"""Where kombu's Redis transport keeps messages: not EagleGen's keys, read by the scanner.

kombu (``kombu.transport.redis``, 5.x) keeps one list per priority step, served 0 first, named
``queue`` then ``queue + sep + step``; delivered messages wait for their ack in the ``unacked``
hash, their delivery times in ``unacked_index``.
"""

from __future__ import annotations

PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"


def queue_lists(queue: str) -> list[str]:
    """The broker lists holding ``queue``'s waiting messages, one per priority step."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]
