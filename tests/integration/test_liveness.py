"""Heartbeats and endpoint health entries in a real Redis: who counts as alive, what expires."""

from __future__ import annotations

import json

import redis

from common.clock import redis_time
from common.keys import EndpointKeys, workers_key
from common.liveness import FRESH_S, HEALTH_TTL_S, Beat, live_workers, prune, read_beats


def test_stale_heartbeats_and_unserved_old_health_entries_expire(rdb: redis.Redis):
    now = redis_time(rdb)
    alive = Beat("host:1", "q", ["http://a/v1"], 2, now)
    frozen = Beat("host:2", "q", ["http://b/v1"], 8, now - FRESH_S - 1)
    gone = Beat("host:3", "q", [], 0, now - 10_000)
    for beat in (alive, frozen, gone):
        rdb.hset(workers_key("eaglegen"), beat.name, beat.as_json())
    health = EndpointKeys("eaglegen").health
    old = json.dumps({"state": "up", "at": now - HEALTH_TTL_S - 1})
    new = json.dumps({"state": "down", "at": now})
    rdb.hset(health, mapping={"http://a/v1": old, "http://ghost/v1": old, "http://new/v1": new})

    beats = read_beats(rdb, "eaglegen")
    assert [b.name for b in live_workers(beats, now, "q")] == ["host:1"]
    assert live_workers(beats, now, "other") == []
    prune(rdb, "eaglegen", now)

    assert sorted(rdb.hkeys(workers_key("eaglegen"))) == ["host:1", "host:2"]
    # Served by a live worker (however old its entry), or recent: kept. The ghost: gone.
    assert sorted(rdb.hkeys(health)) == ["http://a/v1", "http://new/v1"]
