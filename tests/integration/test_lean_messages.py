"""Task messages leave out Celery's empty fields (every integration test's workers run them,
retries included: tests/integration/test_pipeline.py).

A queued sample is mostly its message: Celery's own was 1,075 bytes for two short arguments.
"""

from __future__ import annotations

import base64
import json

import redis

from broker.app import create_broker_app
from broker.layout import queue_lists
from broker.message import GENERATE_TASK, decode_args
from broker.publish import publish
from common.settings import Settings


def _queued(rdb: redis.Redis, queue: str) -> list[dict[str, object]]:
    return [json.loads(raw) for key in queue_lists(queue) for raw in rdb.lrange(key, 0, -1)]


def test_a_queued_message_holds_only_what_is_set(redis_url: str, rdb: redis.Redis) -> None:
    app = create_broker_app(Settings(redis_url=redis_url, queue="lean"))
    publish(app, "lean", "run-a", ["id-1", "id-2"])
    messages = _queued(rdb, "lean")
    assert len(messages) == 2
    for message in messages:
        raw = json.dumps(message)
        assert len(raw) < 600, raw  # Celery's empty fields would take it well over
        headers = message["headers"]
        assert isinstance(headers, dict)
        assert headers["task"] == GENERATE_TASK and headers["retries"] == 0
        assert None not in headers.values() and "timelimit" not in headers
        assert headers["argsrepr"] in ("['run-a', 'id-1']", "['run-a', 'id-2']")
        assert "reply_to" not in message["properties"]  # type: ignore[operator]
        assert "argsrepr" not in message["properties"]  # type: ignore[operator]
        assert json.loads(base64.b64decode(str(message["body"])))[2] == {}
        assert decode_args(message) in (("run-a", "id-1"), ("run-a", "id-2"))


def test_a_retry_message_keeps_its_eta(redis_url: str) -> None:
    app = create_broker_app(Settings(redis_url=redis_url))
    message = app.amqp.create_task_message("tid", GENERATE_TASK, ["r", "i"], {}, 30, retries=2)
    assert message.headers["eta"] and message.headers["retries"] == 2
    assert "shadow" not in message.headers and "root_id" not in message.headers
