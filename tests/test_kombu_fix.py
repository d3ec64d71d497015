"""kombu 5.7 on a closed channel: an ack or reject raised AttributeError and stopped the worker
(seen in `make chaos` when Redis was killed under running tasks); with worker.kombu_fix it is
the connection error Celery logs and survives."""

from __future__ import annotations

import logging
import uuid

import kombu
import pytest

from worker import kombu_fix


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
