"""Soak: many zero-latency turns through real workers; what grows with the work.

    python bench/soak.py --samples 100000 --workers 2 --concurrency 32

One simulator answering at once, WORKERS worker processes at the default log level, one
collector, a producer feeding the run in the background under backpressure. Reports, as JSON:
each worker's RSS at every 10,000 samples written, log bytes per 1,000 samples (workers and
collector, start-up excluded), the run's Redis bytes before and after ``runs retire``, and the
collector's restart time on the file. Uses a Redis of its own (or ``--redis-url``'s, under its
own key prefix and queue, deleted afterwards).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from stack import Stack, rss_mib, write_prompts  # noqa: E402

from tests.harness import redis_url_or_own, wait_for  # noqa: E402

ZERO_LATENCY = ("--time-per-token", "0", "--ttft", "0", "--max-answer-tokens", "16",
                "--reasoning-tokens", "0", "--max-num-seqs", "256")  # fmt: skip
STEP = 10_000


def _log_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.log") if not p.name.startswith("sim"))


def _series(stack: Stack, workers: list, total: int, run: str) -> list[dict[str, object]]:
    store, points, mark = stack.store(run), [], STEP
    started = time.monotonic()
    while mark <= total:
        wait_for(lambda m=mark: store.counts().written >= m, 3600, f"{mark} samples written")
        rss = [round(rss_mib(w.pid), 1) for w in workers]
        points.append(
            {"written": mark, "seconds": round(time.monotonic() - started), "rss_mib": rss}
        )
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)
        mark += STEP
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--redis-url", help="a Redis to use (default: one of its own, on a free port)"
    )
    parser.add_argument(
        "--last-worker-env", action="append", default=[], metavar="KEY=VALUE",
        help="set in the last worker's environment only: a side-by-side comparison in one run",
    )  # fmt: skip
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as folder,
        Stack(redis_url_or_own(args.redis_url), Path(folder), "soak") as stack,
    ):
        print(json.dumps(_soak(stack, Path(folder), args), indent=1))


def _soak(stack: Stack, folder: Path, args: argparse.Namespace) -> dict[str, object]:
    sim = stack.simulator(*ZERO_LATENCY)
    stack.env["EAGLEGEN_ENDPOINTS"] = sim.endpoint
    stack.env["EAGLEGEN_MAX_INFLIGHT"] = "256"
    run, out = "soak", folder / "soak.jsonl"
    last = dict(item.split("=", 1) for item in args.last_worker_env)
    # At the default log level (not the benchmarks' WARNING): log bytes are a figure here.
    command = ["worker", "--concurrency", str(args.concurrency)]
    workers = [stack.procs.start("worker", command,
                                 {**stack.env, **(last if i == args.workers - 1 else {})})
               for i in range(args.workers)]  # fmt: skip
    stack.warm_up(folder)
    collector = stack.collector(run, out)
    logs_before = _log_bytes(stack.dir)
    source = write_prompts(folder / "prompts.jsonl", args.samples, "soak")
    feeder = threading.Thread(target=stack.enqueue, args=(run, source), daemon=True)
    feeder.start()
    wait_for(lambda: stack.store(run).counts().total > 0, 120, "the first samples enqueued")
    series = _series(stack, workers, args.samples, run)
    stack.wait_done(run, 600)
    logs = _log_bytes(stack.dir) - logs_before
    stack.stop(collector)
    return {
        "samples": args.samples, "workers": args.workers, "concurrency": args.concurrency,
        "last_worker_env": last,
        "rss_series": series, "log_bytes_per_1000_samples": round(logs * 1000 / args.samples),
        **_retire(stack, run), "collector_restart_s": _restart(stack, out),
    }  # fmt: skip


def _retire(stack: Stack, run: str) -> dict[str, int]:
    store = stack.store(run)
    before = store.memory_bytes()
    assert store.retire() == "retired"
    return {
        "redis_bytes_run_before_retire": before,
        "redis_bytes_retired_run": store.memory_bytes(),
    }


def _restart(stack: Stack, out: Path) -> float:
    from collector.sink import JsonlSink

    started = time.perf_counter()
    JsonlSink(out, "soak").close()
    return round(time.perf_counter() - started, 3)


if __name__ == "__main__":
    main()
