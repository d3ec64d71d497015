"""``eaglegen status --run RUN`` for a capture run: rows done, failed, bytes, rate, ETA, the
live capture workers of its queue (and a note when none serves it), and once complete the
temporary files left in its folder (a walk of the folder: only then)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from capture.files import stale_temporaries
from capture.store import CaptureStore
from common.clock import redis_time
from common.liveness import live_workers, read_beats
from common.loop_errors import read_loop_errors
from common.stats import eta_seconds, read_snapshot


def gather(store: CaptureStore, default_queue: str) -> dict[str, Any]:
    """A capture run's figures (read from Redis; temporaries from its folder once complete)."""
    spec = store.spec()
    counts = store.runs.counts()
    snap = read_snapshot(store.r, store.keys, since=counts.started_at)
    failures = store.runs.failures()
    kinds: dict[str, int] = {}
    for failure in failures.values():
        kinds[failure.kind] = kinds.get(failure.kind, 0) + 1
    remaining = counts.total - counts.done - counts.failed
    eta = eta_seconds(remaining, snap.samples_per_s_minute)
    data = {
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
        "stray_temporaries": _temporaries(spec.out_dir) if spec and counts.complete else None,
        **_workers(store, default_queue), "at": time.time(),
    }  # fmt: skip
    data["notes"] = notes(data)
    return data


def _workers(store: CaptureStore, default_queue: str) -> dict[str, Any]:
    now = redis_time(store.r)
    queue = store.runs.queue() or default_queue
    live = live_workers(read_beats(store.r, store.runs.prefix), now, queue)
    refused = store.refused_workers()
    workers = [
        {"name": b.name, "in_flight": b.in_flight, "refuses": refused.get(b.name)} for b in live
    ]
    return {"queue": queue, "workers": workers}


def _temporaries(out_dir: str) -> int:
    return len(stale_temporaries(Path(out_dir)))


def notes(d: dict[str, Any]) -> list[str]:
    """Why the run is not progressing, in plain words."""
    left = d["total"] - d["done"] - d["failed"]
    found = [f"worker {w['name']} refuses the run's rows: {w['refuses']}" for w in d["workers"]
             if w["refuses"]]  # fmt: skip
    if left and len(found) == len(d["workers"]):
        found.append(
            f"no capture worker serves queue {d['queue']}"
            + (" with the run's model" if found else "")
            + f": start one with `eaglegen capture worker --model MODEL` and "
            f"EAGLEGEN_CAPTURE_QUEUE={d['queue']}"
        )
    return found


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
        f"capture workers on {d['queue']}: "
        + (", ".join(f"{w['name']} ({w['in_flight']} rows)" for w in d["workers"]) or "none"),
    ]
    if d["stray_temporaries"] is not None:
        lines.append(f"stray temporary files: {d['stray_temporaries']}")
    lines += [f"note: {n}" for n in d["notes"]]
    if d["failures"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(d["failures"].items()))
        lines.append(f"failed by kind: {kinds}")
        lines += [f"  row {row}: {message}" for row, message in d["last_errors"].items()]
    return "\n".join(lines)
