"""Reconciler pass time and peak memory against the queue's length, with and without the scan
limit.

    .venv/bin/python bench/bench_reconcile.py 200000 [--redis-url URL]

Fills a queue with N real task messages (copies of one published by Celery) and as many
pending ids, times two passes at each limit, then one more under tracemalloc for the peak of
Python memory a pass allocates (what a worker's RSS keeps as its high-water mark), then
deletes what it made.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.app import create_broker_app
from broker.layout import queue_lists
from broker.publish import publish
from common.models import GenParams
from common.settings import Settings
from common.store import RunStore, connect
from tests.harness import redis_url_or_own
from worker.pipeline.reconcile import Reconciler


def fill(r, store: RunStore, key: str, proto: dict, n: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        args = json.loads(base64.b64decode(proto["body"]))
        args[0] = [store.run, f"id{i}"]
        body = base64.b64encode(json.dumps(args).encode()).decode()
        tag = {**proto["properties"], "delivery_tag": uuid.uuid4().hex}
        message = {**proto, "body": body, "properties": tag}
        pipe.lpush(key, json.dumps(message))
        pipe.sadd(store.keys.pending, f"id{i}")
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("messages", type=int)
    parser.add_argument(
        "--redis-url", help="a Redis to use (default: one of its own, on a free port)"
    )
    a = parser.parse_args()
    a.redis_url = redis_url_or_own(a.redis_url)
    queue, run = f"benchq-{uuid.uuid4().hex[:6]}", f"benchrun-{uuid.uuid4().hex[:6]}"
    s = Settings(redis_url=a.redis_url, run=run, queue=queue)
    r = connect(a.redis_url)
    store = RunStore(r, s.key_prefix, run)
    store.ensure_params(GenParams(), queue)
    try:
        publish(create_broker_app(s), queue, run, ["proto"])
        key = next(k for k in queue_lists(queue) if r.llen(k))
        proto = json.loads(r.lpop(key))
        fill(r, store, key, proto, a.messages)
        for limit in (20_000, 10**9):
            rec = Reconciler(r, s.model_copy(update={"reconcile_scan_max": limit}), lambda *x: None)
            for _ in range(2):
                started = time.perf_counter()
                rec.run_once([run])
                took = time.perf_counter() - started
                print(f"queue {a.messages}, scan limit {limit}: pass {took:.3f} s")
            tracemalloc.start()
            rec.run_once([run])
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(f"queue {a.messages}, scan limit {limit}: peak {peak / 2**20:.1f} MiB")
    finally:
        r.delete(*queue_lists(queue))
        store.delete()


if __name__ == "__main__":
    main()
