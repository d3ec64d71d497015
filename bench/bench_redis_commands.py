"""Redis commands per sample of a run with no faults, counted exactly on a private Redis.

    .venv/bin/python bench/bench_redis_commands.py [--samples 200] [-- SIMULATOR OPTIONS]

Starts its own redis-server (no persistence, nothing else on it, so ``INFO commandstats`` is
this run's alone), a simulator, one worker (8 threads) and a collector; enqueues N distinct
single-turn prompts and prints the commands the run cost, per sample and by command, between
the enqueue and the run's completion (the completion is polled every 2 s: a few commands).
The code measured is that of the checkout this script is in (``PYTHONPATH`` of the children),
so two checkouts compare side by side. Simulator options after ``--`` set the answers'
lengths (``--max-answer-tokens 200``: turns under one checkpoint interval).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness import ROOT, Procs, free_port, start_redis, wait_for
from tests.stack import Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("sim", nargs="*", help="simulator options (after --)")
    a = parser.parse_args()
    print(f"code of {ROOT}")
    with tempfile.TemporaryDirectory() as tmp, Procs(Path(tmp)) as procs:
        work = Path(tmp)
        port = free_port()
        start_redis(procs, port, work, "--save", "", "--appendonly", "no")
        stack = Stack(procs, f"redis://127.0.0.1:{port}/0", work)
        stack.simulator(*a.sim)
        source = work / "prompts.jsonl"
        rows = [json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(a.samples)]
        source.write_text("".join(rows))
        stack.worker(concurrency=8)
        stack.collector()
        wait_for(lambda: "ready" in procs.logs(), 60, "the worker to start")
        before = calls(stack)
        stack.enqueue(source)
        wait_for(lambda: stack.store.counts().complete, 600, "the run's end", every=2.0)
        spent = calls(stack) - before
        tokens = [t["usage"]["completion_tokens"] for r in stack.lines()
                  for t in r["generation"]["turns"]]  # fmt: skip
    total, mean = sum(spent.values()), sum(tokens) / len(tokens)
    print(f"{a.samples} samples (completion tokens per turn: mean {mean:.0f}, max {max(tokens)})"
          f": {total} commands, {total / a.samples:.1f} per sample")  # fmt: skip
    print(", ".join(f"{k} {v / a.samples:.2f}" for k, v in sorted(spent.items())))


def calls(stack: Stack) -> Counter[str]:
    """Calls of every command so far (commands inside scripts included)."""
    stats = stack.store.r.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


if __name__ == "__main__":
    main()
