"""Run statistics: what the recorder writes and what a snapshot reads back, without Redis."""

import pytest
import redis

from common.keys import RunKeys
from common.stats import LATENCY_BOUNDS, StatsRecorder, percentile, read_snapshot


class FakeHashes:
    """Hashes in memory behind redis-py's pipeline calls (the only ones stats uses)."""

    def __init__(self):
        self.h: dict[str, dict[str, float | str]] = {}
        self.queued = []
        self.executed = 0  # round trips
        self.fail_next = False

    def pipeline(self, transaction=False):
        return self

    def _hash(self, key):
        return self.h.setdefault(key, {})

    def hincrby(self, key, field, amount):
        self.queued.append(lambda: self._add(key, field, amount))

    hincrbyfloat = hincrby

    def _add(self, key, field, amount):
        self._hash(key)[field] = self._hash(key).get(field, 0) + amount

    def hset(self, key, field, value):
        self.queued.append(lambda: self._hash(key).__setitem__(field, value))

    def expire(self, key, seconds):
        self.queued.append(lambda: None)

    def register_script(self, source):
        """STATS_WRITE, played in memory: one round trip, nothing on a retired run."""

        def run(keys, args):
            self.executed += 1
            if self.fail_next:
                self.fail_next = False
                raise redis.ConnectionError("gone")
            if keys[0] in self.h:
                return 0
            for i in range(0, len(args), 4):
                op, index, name, value = args[i : i + 4]
                key = keys[index - 1]
                if op in ("i", "f"):
                    self._add(key, name, value)
                elif op == "s":
                    self._hash(key)[name] = value
            return 1

        return run

    def exists(self, key):  # asked outside the pipeline: a round trip of its own
        self.executed += 1
        return int(key in self.h)

    def hgetall(self, key):
        self.queued.append(lambda: {k: str(v) for k, v in self.h.get(key, {}).items()})

    def hmget(self, key, fields):
        self.queued.append(lambda: [self.h.get(key, {}).get(f) for f in fields])

    def execute(self):
        self.executed += 1
        if self.fail_next:
            self.fail_next, self.queued = False, []
            raise redis.ConnectionError("gone")
        out = [step() for step in self.queued]
        self.queued = []
        return out


KEYS = RunKeys("eaglegen", "r")


def test_turns_errors_and_finished_samples_add_up_in_the_snapshot():
    client = FakeHashes()
    rec = StatsRecorder(client, KEYS, secrets=["sk-hidden"])
    rec.turn("http://e/v1", 1.5, 100)
    rec.turn("http://e/v1", 0.5, 300)
    rec.error("5xx", "boom sk-hidden", "http://e/v1", wasted_tokens=40)
    rec.finished(400, kept=True)
    rec.finished(50, kept=False)
    rec.flush()
    snap = read_snapshot(client, KEYS, now=1000.0, since=0.0)
    assert (snap.turns, snap.completion_tokens_turns, snap.mean_latency) == (2, 400, 1.0)
    assert snap.wasted_tokens == 90 and snap.errors == {"5xx": 1}
    assert "sk-hidden" not in snap.last_errors["5xx"]
    assert snap.endpoints["http://e/v1"]["errors"] == 1.0


def test_the_p95_is_the_upper_bound_of_its_histogram_bucket():
    counts = {LATENCY_BOUNDS.index(1): 95, LATENCY_BOUNDS.index(8): 5}
    assert percentile(counts, LATENCY_BOUNDS, 0.95) == 1.0
    assert percentile(counts, LATENCY_BOUNDS, 0.99) == 8.0
    assert percentile({}, LATENCY_BOUNDS, 0.95) is None


def _turns(client: FakeHashes) -> int:
    return read_snapshot(client, KEYS, now=1000.0, since=0.0).turns


def test_turns_and_finished_samples_reach_redis_when_flushed_in_one_round_trip():
    client = FakeHashes()
    rec = StatsRecorder(client, KEYS, secrets=[])
    for _ in range(50):
        rec.turn("http://e/v1", 0.2, 30)
        rec.finished(30, kept=True, now=1000.0)
    assert _turns(client) == 0 and client.executed == 1  # the read only
    rec.flush()
    assert client.executed == 2  # one write for all fifty, refused inside Redis if retired
    rec.flush()  # nothing new: no round trip
    assert client.executed == 2
    snap = read_snapshot(client, KEYS, now=1000.0, since=0.0)
    assert (snap.turns, snap.completion_tokens_turns) == (50, 1500)
    assert snap.samples_per_s_minute > 0 and snap.last_finished_at == 1000.0


def test_a_flush_that_fails_keeps_its_figures_for_the_next_one():
    client = FakeHashes()
    rec = StatsRecorder(client, KEYS, secrets=[])
    rec.turn("http://e/v1", 0.2, 30)
    client.fail_next = True
    with pytest.raises(redis.ConnectionError):
        rec.flush()
    rec.turn("http://e/v1", 0.2, 30)
    rec.flush()
    assert _turns(client) == 2
