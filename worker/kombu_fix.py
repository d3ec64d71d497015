"""A work-around for kombu 5.7's Redis transport: acknowledging on a channel whose connection
was closed raises AttributeError, which stops the worker.

Seen in ``make chaos``: Redis is killed while tasks run; the consumer drops its connection to
reconnect; a task that then ends rejects (or acks) its message on the old channel, whose
transport has no client any more. ``Channel._connparams`` reads ``self.connection.client.hostname``,
the AttributeError escapes Celery's ``reject_log_error`` (it only catches connection errors),
and the event loop shuts the worker down (exit 0, with its other tasks handed back). Raising a
redis ``ConnectionError`` instead turns it into the logged, survivable error Celery expects;
the message stays in the broker's unacked set and comes back (the reconciler, or kombu's
visibility timeout), where a finished sample is acknowledged without a second generation.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_MARK = "_eaglegen_closed_channel_fix"


def apply() -> None:
    """Patch ``kombu.transport.redis.Channel`` (Sentinel channels inherit it); idempotent."""
    original: Any = kombu_redis.Channel._connparams
    if getattr(original, _MARK, False):
        return

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("this channel's broker connection is closed")
        return original(self, asynchronous)

    setattr(_connparams, _MARK, True)
    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]
