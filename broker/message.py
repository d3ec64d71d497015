"""The task message: its name, its arguments, its priorities, and how to read one back.

A leaf module: the producer, the task adapter, the reconciler and the broker scan all agree on
the message through it, and it imports nothing of theirs.
"""

from __future__ import annotations

import base64
import json
from typing import Any

GENERATE_TASK = "eaglegen.generate"
CAPTURE_TASK = "eaglegen.capture"  # capture/: the same (run, id) message on its own queue
TASK_NAMES = (GENERATE_TASK, CAPTURE_TASK)

# kombu's Redis transport keeps one list per priority step (0, 3, 6, 9) and serves 0 first.
# New work goes in at 6; samples coming back from a dead or stopping worker go in at 0, so
# they run next instead of waiting behind the whole queue.
NORMAL_PRIORITY = 6
URGENT_PRIORITY = 0


def task_args(run: str, sample_id: str) -> list[str]:
    """A message carries only (run, id): prompts stay in Redis, secrets stay out of Flower."""
    return [run, sample_id]


def decode_args(message: dict[str, Any]) -> tuple[str, str] | None:
    """(run, id) of a raw kombu message of an EagleGen task; None for anything else."""
    headers = message.get("headers") or {}
    if headers.get("task") not in TASK_NAMES:
        return None
    try:
        args = json.loads(base64.b64decode(message["body"]))[0]
        return str(args[0]), str(args[1])
    except (KeyError, IndexError, ValueError, TypeError):
        return None
