"""Collector start-up on a big JSONL file: with its id index, after a lost index (full scan).

    python bench/collector_startup.py --lines 1000000 --line-bytes 1000

Writes the file in a temporary folder (lines * line_bytes bytes), through ``JsonlSink`` so the
index is the collector's own, then times opening it three ways. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from collector.sink import JsonlSink
from common.ids import sample_id

BATCH = 256


def _write(path: Path, lines: int, line_bytes: int) -> None:
    sink = JsonlSink(path, "bench")
    pad = "x" * max(line_bytes - 120, 0)
    for start in range(0, lines, BATCH):
        items = []
        for i in range(start, min(start + BATCH, lines)):
            sid = sample_id(None, [f"prompt {i}"])
            items.append((sid, json.dumps({"schema": 1, "id": sid, "run": "bench", "a": pad})))
        sink.append(items)
    sink.close()


def _open(path: Path) -> dict[str, float]:
    started = time.perf_counter()
    sink = JsonlSink(path, "bench")
    took = time.perf_counter() - started
    sink.close()
    return {"seconds": round(took, 3), "ids": len(sink.ids), "scanned_bytes": sink.scanned_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--line-bytes", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "out.jsonl"
        _write(path, args.lines, args.line_bytes)
        with_index = _open(path)
        with path.open("ab") as fh:  # 1,000 lines fsynced by a collector killed before its index
            fh.write(b"".join(
                json.dumps({"schema": 1, "id": f"late{i}", "run": "bench"}).encode() + b"\n"
                for i in range(1000)
            ))  # fmt: skip
        behind = _open(path)
        path.with_name(path.name + ".ids").unlink()
        full_scan = _open(path)
        print(json.dumps({
            "lines": args.lines, "file_bytes": path.stat().st_size, "with_index": with_index,
            "index_1000_lines_behind": behind, "no_index_full_scan": full_scan,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
