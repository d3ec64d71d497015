"""The producer publishes each batch of task messages in one pipeline and stays idempotent:
a Redis server of the test's own, so its command statistics are the producer's alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.app import create_broker_app
from broker.layout import queue_lists
from broker.publish import publish
from common.settings import Settings
from common.store import connect
from tests.deploy.redis_servers import RedisServers
from tests.harness import Procs
from tests.stack import Stack

ROWS = 600  # three batches of the producer's 256


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    servers = RedisServers(tmp_path)
    yield f"redis://127.0.0.1:{servers.start()}/0"
    servers.stop_all()


def test_each_batch_is_one_pipeline_and_a_second_enqueue_sends_nothing(
    own_redis: str, procs: Procs, tmp_path: Path
):
    stack = Stack(procs, own_redis, tmp_path)
    source = tmp_path / "p.jsonl"
    rows = [{"prompt": f"question {i}"} for i in range(ROWS)] + [{"prompt": "question 7"}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    client = connect(own_redis)
    client.config_resetstat()

    first = stack.enqueue(source)

    stats = client.info("commandstats")
    reads = int(client.info("stats")["total_reads_processed"])
    assert "enqueued 600, already present 0, duplicates 1" in first.stdout
    assert stats["cmdstat_lpush"]["calls"] == ROWS and stack.queued() == ROWS
    # At least one read per message if each went on its own (667 measured); a pipeline comes
    # in the client's write chunks (91-170 reads measured, the CLI's start-up included).
    assert reads < ROWS / 2, reads

    second = stack.enqueue(source)

    assert "enqueued 0, already present 600, duplicates 1" in second.stdout
    assert client.info("commandstats")["cmdstat_lpush"]["calls"] == ROWS
    assert stack.queued() == ROWS and stack.store.counts().total == ROWS
    client.close()


def test_a_batch_redis_refuses_raises_the_redis_error_as_one_message_would(own_redis: str):
    app = create_broker_app(Settings(redis_url=own_redis, queue="q"))
    client = connect(own_redis)
    try:
        assert publish(app, "q", "r", ["a"]) == 1  # the queue is declared
        client.config_set("maxmemory", "1")  # every write refused: OOM
        # What the reconciler and the producer handle (a kombu batch error they would not).
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            publish(app, "q", "r", ["b", "c"])
    finally:
        client.config_set("maxmemory", "0")
        client.close()
        app.close()
    assert connect(own_redis).llen(queue_lists("q")[2]) == 1
