"""broker.kombu_fix on a real Redis: kombu 5.7 on a closed channel raises AttributeError on an
ack or reject and stops the worker (as in `make chaos` when Redis is killed under running
tasks), with the fix it is the connection error Celery logs and survives; and kombu builds a new
redis.Redis object per ack, get and event, with the fix one per connection pool."""

from __future__ import annotations

import logging
import threading
import uuid

import kombu
import pytest
import redis

from broker import kombu_fix


@pytest.fixture
def message_on_a_closed_channel(redis_url: str):
    """A message received on a real Redis whose channel is then left as the consumer leaves it
    on reconnecting: its transport without a client, its connection pool gone."""
    conn = kombu.Connection(redis_url)
    queue = conn.SimpleQueue(f"kombu-fix-{uuid.uuid4().hex[:8]}")
    queue.put({"x": 1})
    message = queue.get(timeout=5)
    errors = conn.connection_errors
    transport, channel = message.channel.connection, message.channel
    client, channel._pool = transport.client, None
    transport.client = None
    yield message, errors
    transport.client = client
    queue.clear()
    queue.close()
    conn.release()


def test_a_reject_on_a_closed_channel_is_a_logged_connection_error(
    message_on_a_closed_channel, caplog: pytest.LogCaptureFixture
) -> None:
    kombu_fix.apply()
    message, errors = message_on_a_closed_channel
    with caplog.at_level(logging.CRITICAL):
        message.reject_log_error(logging.getLogger("test"), errors, requeue=False)
    assert "Couldn't reject" in caplog.text


@pytest.fixture
def queue(redis_url: str):
    conn = kombu.Connection(redis_url)
    queue = conn.SimpleQueue(f"kombu-fix-{uuid.uuid4().hex[:8]}")
    yield queue
    queue.clear()
    queue.close()
    conn.release()


def test_gets_and_acks_reuse_one_redis_client_per_connection_pool(queue, monkeypatch) -> None:
    kombu_fix.apply()
    for i in range(40):
        queue.put({"i": i})
    built: list[redis.Redis] = []
    original = redis.Redis.__init__

    def counting(self: redis.Redis, *args: object, **kwargs: object) -> None:
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    messages = [queue.get(timeout=5) for _ in range(40)]
    # Acked from 8 threads at once (kombu's pool holds 10 connections): one shared client is
    # safe, each command and pipeline takes a connection of its own from the pool.
    threads = [
        threading.Thread(target=lambda part=messages[i::8]: [m.ack() for m in part])
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) <= 1  # kombu unpatched: one per get and one per ack, 80
    channel = messages[0].channel
    with channel.conn_or_acquire() as client:
        assert not any(client.hexists(channel.unacked_key, m.delivery_tag) for m in messages)


def test_a_replaced_connection_pool_gets_a_new_client(queue) -> None:
    kombu_fix.apply()
    queue.put({"x": 1})
    message = queue.get(timeout=5)
    message.ack()
    channel = message.channel
    first = channel._create_client()
    assert channel._create_client() is first
    channel._disconnect_pools()  # what a reconnect does
    second = channel._create_client()
    assert second is not first and second.connection_pool is channel.pool
    assert second.ping()
