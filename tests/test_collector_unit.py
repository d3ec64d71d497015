"""The collector loop over an in-memory store and a real JSONL file."""

import json
import threading

import pytest
import redis

from collector.collect import Collector
from collector.sink import JsonlSink
from common.errors import CollectorFenced, ConfigError
from tests.fakes import FakeLock, FakeStore


@pytest.fixture
def sinks():
    """Open sinks, closed at teardown (an unclosed file is an error under -W error)."""
    opened = []

    def open_sink(path):
        opened.append(JsonlSink(path, "r"))
        return opened[-1]

    yield open_sink
    for sink in opened:
        sink.close()


def _record(i):
    return json.dumps({"schema": 1, "id": i, "run": "r"})


def _ready(store, *ids):
    for i in ids:
        store.results[i] = _record(i)
        store.ready.append(i)


def _lines(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_ready_results_are_written_once_and_only_then_leave_the_store(tmp_path, sinks):
    store = FakeStore()
    _ready(store, "a", "b")
    sink = sinks(tmp_path / "out.jsonl")
    stats = Collector(store, sink, batch=1).run(threading.Event(), once=True)
    assert _lines(tmp_path / "out.jsonl") == ["a", "b"]
    assert stats.written == 2 and store.results == {} and store.counters["written"] == 2


def test_ids_left_in_collecting_by_a_crash_go_first_and_are_not_written_twice(tmp_path, sinks):
    path = tmp_path / "out.jsonl"
    path.write_text(_record("a") + "\n")
    store = FakeStore()
    _ready(store, "b")
    store.results["a"] = _record("a")
    store.collecting_ = ["a"]  # written before the crash, not yet committed
    stats = Collector(store, sinks(path)).run(threading.Event(), once=True)
    assert _lines(path) == ["a", "b"]
    assert (stats.written, stats.skipped_present) == (1, 1)


def test_a_second_collector_that_cannot_get_the_lock_refuses(tmp_path, sinks):
    store = FakeStore(lock=FakeLock(free=False))
    collector = Collector(store, sinks(tmp_path / "out.jsonl"), lock_ttl=0.1)
    with pytest.raises(ConfigError, match="another collector"):
        collector.run(threading.Event(), once=True)


def test_the_loop_rides_out_a_lost_redis_connection(tmp_path, sinks):
    store = FakeStore()
    _ready(store, "a")
    real_take = store.take_ready
    failures = iter([redis.ConnectionError("gone")])

    def flaky(token, limit):
        for exc in failures:
            raise exc
        return real_take(token, limit)

    store.take_ready = flaky
    stop = threading.Event()
    stats = Collector(store, sinks(tmp_path / "out.jsonl")).run(stop, once=True)
    assert stats.written == 1


def test_a_collector_that_lost_its_lock_to_another_stops_without_committing(tmp_path, sinks):
    store = FakeStore()
    _ready(store, "a", "b")
    sink = sinks(tmp_path / "out.jsonl")
    collector = Collector(store, sink, batch=1)
    first_batch = []

    def lose_after_first(stats):
        first_batch.append(stats.written)
        store.lock.held, store.lock.free = False, False  # paused past its lock; another took it

    with pytest.raises(CollectorFenced):
        collector.run(threading.Event(), on_batch=lose_after_first)
    assert store.results.keys() == {"b"} and store.ready == ["b"]
