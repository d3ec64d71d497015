"""Two patches to kombu's Redis transport (``kombu.transport.redis.Channel``), applied by
``apply()`` when a ``BrokerApp`` is built. Each is next to its code below.

Applies to: kombu 5.7.x, the range pyproject allows (``kombu>=5.7.0,<6``); written against
5.7.0, whose ``Channel._connparams`` and ``Channel._create_client`` they wrap. On a kombu
upgrade, run ``tests/test_kombu_fix.py`` (each patch has a test that fails without it) and drop
a patch whose defect upstream fixed.
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
    # Defect (reproduced by make chaos, and by tests/test_kombu_fix.py without Redis dying):
    # Redis is killed while tasks run; the consumer drops its connection to reconnect; a task
    # that then ends acks or rejects its message on the old channel, whose transport has no
    # client any more. ``_connparams`` reads ``self.connection.client.hostname``, and the
    # AttributeError escapes Celery's ``reject_log_error`` (it catches connection errors
    # only), so the event loop shuts the worker down, handing its other tasks back. The same
    # AttributeError path was reported upstream on a channel close (celery/kombu#582, kombu
    # 3.0); 5.7.0 still raises it here. Raising redis's ConnectionError instead makes it the logged,
    # survivable error Celery expects; the message stays unacked and comes back (reconciler
    # or visibility timeout), where a finished sample is acknowledged without a second run.
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
    # Cost (reproduced by tests/test_kombu_fix.py, measured by bench/bench_kombu.py): every
    # ack, reject, task event and ``_get`` goes through ``conn_or_acquire``, which builds a new
    # ``redis.Redis`` around the channel's one pool; redis-py copies its response callbacks
    # and makes an event dispatcher each time, for an object that holds nothing but the pool.
    # No transport option turns this off and kombu's main branch does the same; no upstream
    # issue. A ``redis.Redis`` on a pool is safe to share between threads (each command or
    # pipeline takes its own connection), so the channel keeps one per pool and builds a new
    # one only when the pool was replaced (a reconnect sets ``_pool`` to None; a closed
    # channel then still fails as the patch above makes it fail).
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
