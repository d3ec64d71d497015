"""What ``status`` says about who is working on a run and how its samples end: live workers
and collector, the breaker, cut turns, the parameters the run was frozen with, and the notes
that say plainly when nothing can progress."""

from __future__ import annotations

from typing import Any

from common.clock import redis_time
from common.errors import InvalidParams
from common.keys import CONTEXT_CUT_TURNS, CUT_TURNS, DROPPED_TURNS, RESTARTED
from common.liveness import collector_alive, live_workers, read_beats
from common.sampling import describe
from common.settings import Settings
from common.store import RunCounts, RunStore
from worker.pipeline.breaker import trip_reason


def truth(store: RunStore, settings: Settings, counts: RunCounts) -> dict[str, Any]:
    """The figures above, JSON-ready (a few Redis round trips)."""
    now = redis_time(store.r)
    queue = store.queue() or settings.queue
    beats = read_beats(store.r, settings.key_prefix)
    live = live_workers(beats, now, queue)
    cut, dropped, context, restarted = store.r.hmget(
        store.keys.counters, [CUT_TURNS, DROPPED_TURNS, CONTEXT_CUT_TURNS, RESTARTED]
    )
    data: dict[str, Any] = {
        "queue": queue,
        "workers": [
            {
                "name": b.name,
                "in_flight": b.in_flight,
                "endpoints": b.endpoints,
                "seen_s_ago": round(max(now - b.at, 0.0), 1),
            }
            for b in live
        ],
        "collector_alive": collector_alive(store.r, store.keys),
        "cut_turns": int(cut or 0),
        "dropped_turns": int(dropped or 0),
        # Of cut_turns, those cut by the context window, not by max_tokens.
        "context_cut_turns": int(context or 0),
        # Failed samples retried under new parameters: each started again from its first turn.
        "restarted_samples": int(restarted or 0),
        "circuit_open": trip_reason(store),
        **_params(store),
    }
    data["notes"] = notes(counts, data)
    data["served_endpoints"] = sorted({url for b in live for url in b.endpoints})
    return data


def _params(store: RunStore) -> dict[str, Any]:
    try:
        params = store.params()
    except InvalidParams as exc:
        return {"params": None, "params_error": str(exc)}
    if params is None:
        return {"params": None}
    shown = params.model_dump(exclude_none=True)
    return {"params": {**shown, **describe(shown)}}


def notes(counts: RunCounts, data: dict[str, Any]) -> list[str]:
    """One line per reason the run is not progressing or not being written."""
    found = []
    unfinished = counts.pending > 0
    if data["circuit_open"]:
        found.append(f"circuit open: {data['circuit_open']}")
    if unfinished and not data["workers"]:
        queue = data["queue"]
        where = (
            ""
            if queue == Settings.model_fields["queue"].default
            else f" with EAGLEGEN_QUEUE={queue}"
        )
        found.append(
            f"no worker is serving this run's queue ({queue}): start `eaglegen worker`{where}"
        )
    if counts.written < counts.done and not data["collector_alive"]:
        found.append(
            f"no collector is writing this run: {counts.done - counts.written} answered samples "
            "wait in Redis; start `eaglegen collect --out FILE`"
        )
    found += _cut_notes(data)
    return found


def _cut_notes(data: dict[str, Any]) -> list[str]:
    """What the cut turns call for: a larger max_tokens helps only those cut by it."""
    context = data["context_cut_turns"]
    by_max_tokens = data["cut_turns"] - context
    found = []
    if by_max_tokens:
        found.append(
            f"{by_max_tokens} turns were cut at max_tokens (finish_reason: length): raise "
            "--max-tokens for them"
        )
    if context:
        found.append(
            f"{context} turns were cut by the context window (prompt + answer reached the "
            "server's max_model_len; a larger --max-tokens cannot help): serve the model with "
            "a longer --max-model-len, or use --turns first"
        )
    if data["cut_turns"] and data["dropped_turns"]:
        found.append(f"cut turns left {data['dropped_turns']} later user turns unanswered")
    return found
