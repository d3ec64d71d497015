"""Record size with and without token ids: the bundled prompts, real workers, the simulator.

    .venv/bin/python bench/bench_record_size.py [--redis-url URL]

Runs the bundled prompts (data/*.jsonl, 160 samples, 80 of them with two turns) through a
worker and a collector twice, with EAGLEGEN_TOKEN_IDS=auto (the simulator gives ids) and off,
and prints the JSONL bytes per record of each, and how much of the first is ids.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.store import connect
from tests.harness import ROOT, Procs, delete_keys, redis_url_or_own
from tests.stack import Stack

SOURCES = [ROOT / "data" / "mt_bench_question.jsonl", ROOT / "data" / "vicuna_bench_question.jsonl"]


def run(redis_url: str, mode: str, tmp: Path) -> list[str]:
    """The JSONL lines of the bundled prompts generated with EAGLEGEN_TOKEN_IDS=mode."""
    with Procs(tmp) as procs:
        stack = Stack(procs, redis_url, tmp)
        stack.simulator("--max-num-seqs", "32")
        stack.worker(concurrency=16, EAGLEGEN_TOKEN_IDS=mode)
        stack.collector()
        try:
            for source in SOURCES:
                stack.enqueue(source)
            stack.wait_complete(timeout=300)
            return stack.out.read_text().splitlines()
        finally:
            procs.stop_all()
            delete_keys(connect(redis_url), stack.settings.key_prefix, stack.env["EAGLEGEN_QUEUE"])


def id_bytes(line: str) -> int:
    """Bytes the ids take in one record (as the collector writes them, no spaces)."""
    turns = json.loads(line)["generation"]["turns"]
    fields = [(k, t[k]) for t in turns for k in ("prompt_token_ids", "token_ids") if k in t]
    return sum(len(f'"{k}":{json.dumps(v, separators=(",", ":"))},') for k, v in fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis-url", help="a Redis to use (default: one of its own, on a free port)"
    )
    a = parser.parse_args()
    a.redis_url = redis_url_or_own(a.redis_url)
    sizes = {}
    for mode in ("auto", "off"):
        with tempfile.TemporaryDirectory() as tmp:
            lines = run(a.redis_url, mode, Path(tmp))
        sizes[mode] = sum(len(x.encode()) + 1 for x in lines) / len(lines)
        ids = sum(id_bytes(x) for x in lines) / len(lines)
        print(f"EAGLEGEN_TOKEN_IDS={mode}: {len(lines)} records, {sizes[mode]:.0f} bytes per "
              f"record, of which ids {ids:.0f}")  # fmt: skip
    print(f"growth with ids: x{sizes['auto'] / sizes['off']:.2f} "
          f"(+{sizes['auto'] - sizes['off']:.0f} bytes per record)")  # fmt: skip


if __name__ == "__main__":
    main()
