"""Redis Sentinel: every process finds the master through local sentinels, and follows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from common.store import connect
from tests.deploy.redis_servers import RedisServers, assert_not_in_logs
from tests.harness import Procs, wait_for
from tests.stack import Stack

pytestmark = pytest.mark.integration

MASTER, PASSWORD = "eaglegen-master", "sentinel-pw-8c2f41"
AUTH = ["--requirepass", PASSWORD, "--masterauth", PASSWORD]


def direct(port: int) -> redis.Redis:
    return redis.Redis(port=port, password=PASSWORD, decode_responses=True)


def sentinel_url(*ports: int) -> str:
    # Credentials on the first part and the database on the last, as people write them.
    first, *rest = [f"127.0.0.1:{port}" for port in ports]
    return ";".join([f"sentinel://:{PASSWORD}@{first}", *(f"sentinel://{h}" for h in rest)]) + "/0"


def test_the_pipeline_runs_through_two_sentinels(
    servers: RedisServers, procs: Procs, tmp_path: Path
):
    master = servers.start(*AUTH)
    sentinels = [servers.sentinel(master, MASTER, PASSWORD) for _ in range(2)]
    stack = Stack(procs, f"redis://:{PASSWORD}@127.0.0.1:{master}/0", tmp_path)  # the observer
    stack.env["EAGLEGEN_REDIS_URL"] = sentinel_url(*sentinels)
    stack.env["EAGLEGEN_REDIS_SENTINEL_MASTER"] = MASTER
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"sentinel {i}"}) + "\n" for i in range(4)))
    stack.simulator()
    stack.worker(concurrency=4)
    stack.collector()
    assert "enqueued 4," in stack.enqueue(source).stdout
    stack.wait_complete(timeout=60)
    assert len({record["id"] for record in stack.lines()}) == 4
    assert_not_in_logs(tmp_path, PASSWORD)


def test_the_store_client_follows_a_failover_to_the_new_master(servers: RedisServers):
    old = servers.start(*AUTH)
    new = servers.start(*AUTH, "--replicaof", "127.0.0.1", str(old))
    wait_for(lambda: direct(new).info("replication")["master_link_status"] == "up", 15,
             "the replica to sync")  # fmt: skip
    sentinel = servers.sentinel(old, MASTER, PASSWORD)
    ask = redis.Redis(port=sentinel, decode_responses=True)
    wait_for(lambda: _promotable(ask), 15, "the sentinel to connect to the replica")
    client = connect(sentinel_url(sentinel), MASTER)
    client.set("before", "1")
    ask.execute_command("SENTINEL", "FAILOVER", MASTER)
    wait_for(lambda: _writes_land_on(client, direct(new)), 20, "a write on the promoted replica")
    assert direct(new).get("before") == "1"


def _writes_land_on(client: redis.Redis, target: redis.Redis) -> bool:
    try:
        client.set("after", "1")
    except (redis.ConnectionError, redis.ReadOnlyError):
        return False  # mid-failover: the next call asks the sentinel again
    return target.info("replication")["role"] == "master" and target.get("after") == "1"


def _promotable(sentinel: redis.Redis) -> bool:
    replicas = sentinel.sentinel_slaves(MASTER)
    return any(
        not r["is_disconnected"] and not r["is_sdown"] and r["master-link-status"] == "ok"
        for r in replicas
    )
