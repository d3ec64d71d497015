"""``eaglegen status --run RUN`` for a capture run: rows done, failed, bytes, rate, ETA."""

from __future__ import annotations

import time
from typing import Any

from capture.store import CaptureStore
from common.loop_errors import read_loop_errors
from common.stats import eta_seconds, read_snapshot


def gather(store: CaptureStore) -> dict[str, Any]:
    """A capture run's figures (all read from Redis)."""
    spec = store.spec()
    counts = store.runs.counts()
    snap = read_snapshot(store.r, store.keys, since=counts.started_at)
    failures = store.runs.failures()
    kinds: dict[str, int] = {}
    for failure in failures.values():
        kinds[failure.kind] = kinds.get(failure.kind, 0) + 1
    remaining = counts.total - counts.done - counts.failed
    eta = eta_seconds(remaining, snap.samples_per_s_minute)
    return {
        "run": store.run, "kind": "capture",
        "layout": spec.layout if spec else None, "out": spec.out_dir if spec else None,
        "total": counts.total, "queued": counts.queued, "in_flight": counts.in_flight,
        "done": counts.done, "failed": counts.failed, "written": counts.written,
        "complete": counts.complete, "tokens": counts.completion_tokens,
        "bytes": store.bytes_written(), "retries": counts.retries,
        "redeliveries": counts.redeliveries,
        "rows_per_s": round(snap.samples_per_s_minute, 3),
        "tokens_per_s": round(snap.tokens_per_s_minute, 1),
        "eta_s": None if eta is None else round(eta), "failures": kinds,
        "last_errors": {k: f.message for k, f in list(failures.items())[:3]},
        "loop_errors": read_loop_errors(store.r, store.runs.prefix),
        "at": time.time(),
    }  # fmt: skip


def render(d: dict[str, Any]) -> str:
    """The plain-text view."""
    eta = "-" if d["eta_s"] is None else f"{d['eta_s']} s"
    lines = [
        f"capture run {d['run']} ({d['layout']}, {d['out']})"
        + (" complete" if d["complete"] else ""),
        f"rows {d['total']}: done {d['done']}, failed {d['failed']}, queued {d['queued']}, "
        f"in flight {d['in_flight']}, in manifest {d['written']}",
        f"written {d['bytes'] / 1e6:.2f} MB, {d['tokens']} tokens; {d['rows_per_s']} rows/s, "
        f"{d['tokens_per_s']} tokens/s (last minute); ETA {eta}",
        f"retries {d['retries']}, redeliveries {d['redeliveries']}",
    ]
    if d["failures"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(d["failures"].items()))
        lines.append(f"failed by kind: {kinds}")
        lines += [f"  row {row}: {message}" for row, message in d["last_errors"].items()]
    return "\n".join(lines)
