"""Two patches to kombu 5.7's Redis transport, applied by ``apply()`` in ``BrokerApp``.

1. Acknowledging on a channel whose connection was closed raises AttributeError, which stops
   the worker. Seen in ``make chaos``: Redis is killed while tasks run; the consumer drops its
   connection to reconnect; a task that then ends rejects (or acks) its message on the old
   channel, whose transport has no client any more. ``Channel._connparams`` reads
   ``self.connection.client.hostname``, the AttributeError escapes Celery's
   ``reject_log_error`` (it only catches connection errors), and the event loop shuts the
   worker down (exit 0, with its other tasks handed back). Raising a redis ``ConnectionError``
   instead turns it into the logged, survivable error Celery expects; the message stays in the
   broker's unacked set and comes back (the reconciler, or kombu's visibility timeout), where a
   finished sample is acknowledged without a second generation.

2. Every ack, reject, task event and ``_get`` builds a new ``redis.Redis`` object around the
   channel's one connection pool (``Channel.conn_or_acquire`` calls ``_create_client``): redis-py
   8 copies its ~200 response callbacks into a new case-insensitive dict and makes an event
   dispatcher each time, ~70-80 us of CPU, for an object that holds nothing but the pool. No
   transport option turns this off (kombu's main branch does the same). A ``redis.Redis`` on a
   pool is safe to share between threads (each command or pipeline takes its own connection
   from the pool), so the channel keeps one per pool and builds a new one only when the pool
   was replaced (a reconnect sets ``_pool`` to None; a closed channel then still fails as in 1).
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_MARK = "_eaglegen_closed_channel_fix"
_CLIENT = "_eaglegen_client"  # the channel's attribute holding its reused client


def apply() -> None:
    """Patch ``kombu.transport.redis.Channel`` (Sentinel channels inherit it); idempotent."""
    _closed_channel_is_a_connection_error()
    _one_client_per_pool()


def _closed_channel_is_a_connection_error() -> None:
    original: Any = kombu_redis.Channel._connparams
    if getattr(original, _MARK, False):
        return

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("this channel's broker connection is closed")
        return original(self, asynchronous)

    setattr(_connparams, _MARK, True)
    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]


def _one_client_per_pool() -> None:
    original: Any = kombu_redis.Channel._create_client
    if getattr(original, _MARK, False):
        return

    def _create_client(self: Any, asynchronous: bool = False) -> Any:
        if asynchronous:  # built once per channel already (its cached ``client`` property)
            return original(self, asynchronous)
        pool = self.pool  # builds the pool if it was dropped; raises on a closed channel
        client = self.__dict__.get(_CLIENT)
        if client is None or client.connection_pool is not pool:
            client = original(self, asynchronous)
            self.__dict__[_CLIENT] = client  # two threads racing here both get a valid client
        return client

    setattr(_create_client, _MARK, True)
    kombu_redis.Channel._create_client = _create_client  # type: ignore[method-assign]
