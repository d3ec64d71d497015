"""The collector loop over an in-memory store and a real JSONL file."""

import json
import threading

import pytest
import redis

from collector.collect import Collector
from collector.sink import JsonlSink
from common.errors import ConfigError
from tests.fakes import FakeLock, FakeStore


def _ready(store, *ids):
    for i in ids:
        store.results[i] = json.dumps({"id": i})
        store.ready.append(i)


def _lines(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_ready_results_are_written_once_and_only_then_leave_the_store(tmp_path):
    store = FakeStore()
    _ready(store, "a", "b")
    sink = JsonlSink(tmp_path / "out.jsonl")
    stats = Collector(store, sink, batch=1).run(threading.Event(), once=True)
    assert _lines(tmp_path / "out.jsonl") == ["a", "b"]
    assert stats.written == 2 and store.results == {} and store.counters["written"] == 2


def test_ids_left_in_collecting_by_a_crash_go_first_and_are_not_written_twice(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({"id": "a"}) + "\n")
    store = FakeStore()
    _ready(store, "b")
    store.results["a"] = json.dumps({"id": "a"})
    store.collecting_ = ["a"]  # written before the crash, not yet committed
    stats = Collector(store, JsonlSink(path)).run(threading.Event(), once=True)
    assert _lines(path) == ["a", "b"]
    assert (stats.written, stats.skipped_present) == (1, 1)


def test_a_second_collector_that_cannot_get_the_lock_refuses(tmp_path, monkeypatch):
    monkeypatch.setattr("collector.collect.LOCK_TTL", 0.1)
    store = FakeStore(lock=FakeLock(free=False))
    collector = Collector(store, JsonlSink(tmp_path / "out.jsonl"))
    with pytest.raises(ConfigError, match="another collector"):
        collector.run(threading.Event(), once=True)


def test_the_loop_rides_out_a_lost_redis_connection(tmp_path):
    store = FakeStore()
    _ready(store, "a")
    real_take = store.take_ready
    failures = iter([redis.ConnectionError("gone")])

    def flaky(limit, block_s):
        for exc in failures:
            raise exc
        return real_take(limit, block_s)

    store.take_ready = flaky
    stop = threading.Event()
    stats = Collector(store, JsonlSink(tmp_path / "out.jsonl")).run(stop, once=True)
    assert stats.written == 1
