"""``eaglegen status``: a run's figures as JSON, a table, or a live view (``--watch``)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from cli.status_truth import truth
from common import tool_counts
from common.clock import redis_time
from common.loop_errors import read_loop_errors
from common.sampling import SAMPLING, SERVER_DEFAULT
from common.settings import Settings
from common.stats import Snapshot, eta_seconds, read_snapshot
from common.store import RunCounts, RunStore


def gather(store: RunStore, settings: Settings) -> dict[str, Any]:
    """Every figure ``status`` shows, as one JSON-ready dict (a few Redis round trips)."""
    counts = store.counts()
    snap = read_snapshot(store.r, store.keys, since=counts.started_at)
    end = time.time()
    if counts.complete and snap.last_finished_at:
        # A finished run's rates are those it had at its end, not diluted by time since.
        end = snap.last_finished_at
        snap = read_snapshot(store.r, store.keys, now=end, since=counts.started_at)
    data: dict[str, Any] = {**counts.as_dict(), **snap.as_dict(), **truth(store, settings, counts)}
    elapsed = end - counts.started_at if counts.started_at else None
    data["elapsed_s"] = round(elapsed, 1) if elapsed else None
    data["samples_per_s_since_start"] = round(counts.done / elapsed, 3) if elapsed else None
    data["tokens_per_s_since_start"] = (
        round(counts.completion_tokens / elapsed, 1) if elapsed else None
    )
    data["expired_leases"] = store.expired_lease_count()
    data["eta_s"] = _eta(counts, snap, data, settings)
    kept = counts.completion_tokens
    data["goodput"] = {
        "kept_tokens": kept,
        "wasted_tokens": snap.wasted_tokens,
        "fraction_kept": round(kept / (kept + snap.wasted_tokens), 4) if kept else None,
        # Turns continued from a checkpoint, and the tokens they did not generate again.
        "resumed_turns": snap.resumed_turns,
        "resumed_tokens": snap.resumed_tokens,
        "ids_dropped_turns": snap.ids_dropped_turns,
        # Checkpoints dropped because the server was not proven to continue them (their
        # tokens are in wasted_tokens: the turns started again rather than be corrupted).
        "discarded_checkpoints": snap.discarded_checkpoints,
        # Orphaned requests aborted on their server, and what they had left of max_tokens.
        **_aborts(store),
    }
    data["endpoints"] = _endpoints(store, settings, snap.endpoints, data.pop("served_endpoints"))
    tools = tool_counts.read(store.r, store.keys)
    if tools is not None:  # conversations with tool calls: how many ended, and where
        data["tool_calls"] = tools
    data["clocks_off"] = _clocks_off(store, settings)
    # Exceptions background loops (reconciler, renewals, heartbeat...) survived, all workers.
    data["loop_errors"] = read_loop_errors(store.r, settings.key_prefix)
    # One model per run: the pinned one, and the endpoints refused for serving another.
    data["model"] = store.pinned_model()
    data["refused_endpoints"] = store.refused_endpoints()
    return data


def _aborts(store: RunStore) -> dict[str, int]:
    aborted, saved = store.r.hmget(store.keys.counters, ["aborted", "abort_saved_tokens"])
    return {"aborted_requests": int(aborted or 0), "abort_saved_tokens": int(saved or 0)}


def _clocks_off(store: RunStore, settings: Settings) -> dict[str, float]:
    """Workers whose clock is further from Redis's than the limit: name -> skew (s)."""
    from worker.pipeline.clock_watch import EVERY_S, read_clocks

    clocks = read_clocks(store.r, settings.key_prefix, redis_time(store.r), 2 * EVERY_S)
    return {name: skew for name, skew in clocks.items() if abs(skew) > settings.max_clock_skew}


def _eta(counts: RunCounts, snap: Snapshot, data: dict[str, Any], settings: Settings) -> int | None:
    if counts.pending and (not data["workers"] or data["circuit_open"]):
        return None  # nobody works on it: no number would be true
    # The last minute's rate only: a run that stopped progressing has no ETA.
    eta = eta_seconds(counts.total - counts.done - counts.failed, snap.samples_per_s_minute)
    if data["expired_leases"] and not counts.complete:
        # A dead worker's samples come back after two reconciler passes, then run again.
        wait = 2 * settings.reconcile_interval + (snap.mean_latency or 0.0)
        eta = max(eta or 0.0, wait)
    return None if eta is None else round(eta)


def _endpoints(
    store: RunStore, settings: Settings, stats: dict[str, dict[str, float]], served: list[str]
) -> dict[str, dict[str, Any]]:
    from worker.endpoints.capacity import SlotTable
    from worker.pipeline.aborts import AbortSupport

    # This run's endpoints: those its live workers serve, those it has figures of, and those
    # this command was pointed at (EAGLEGEN_ENDPOINTS); not every endpoint this Redis has seen.
    out_of_rotation = store.endpoints_out()
    shown = set(served) | set(stats) | set(out_of_rotation)
    if "endpoints" in settings.model_fields_set or not shown:
        shown |= set(settings.endpoints)
    caps = {url: settings.cap_for(url) for url in sorted(shown)}
    table = SlotTable(store.r, settings.key_prefix, caps, settings.slot_ttl)
    out: dict[str, dict[str, Any]] = {}
    for view in table.snapshot():
        out[view.endpoint] = {"in_flight": view.inflight, "cap": view.cap,
                              "drained": view.drained}  # fmt: skip
    for url, abort in AbortSupport.shown(store.r, settings.key_prefix).items():
        if url in out or url in settings.endpoints:
            out.setdefault(url, {})["abort"] = abort
    for url, state in table.health().items():
        if url not in shown:
            continue
        entry = out.setdefault(url, {})
        entry["state"] = state.get("state", "-")
        entry["problem"] = state.get("message") or None
        entry["state_at"] = state.get("at")
    for url, why in out_of_rotation.items():  # for this run only: it refused the run's requests
        out.setdefault(url, {})["out_of_rotation"] = why
    _add_prefix_caches(out, settings)
    for url, figures in stats.items():
        entry = out.setdefault(url, {})
        requests, errors = figures.get("requests", 0.0), figures.get("errors", 0.0)
        entry.update(
            requests=int(requests), tokens=int(figures.get("tokens", 0)), errors=int(errors),
            error_rate=round(errors / max(requests + errors, 1), 4),
            mean_latency_s=round(figures.get("latency_sum", 0) / requests, 3) if requests else None,
        )  # fmt: skip
    return out


def _add_prefix_caches(out: dict[str, dict[str, Any]], settings: Settings) -> None:
    """Each server's prefix-cache figures, from its own /metrics (not asked if it is down)."""
    from worker.endpoints.server_cache import read_prefix_caches

    asked = [url for url in settings.endpoints if out.get(url, {}).get("state") != "down"]
    for url, counters in read_prefix_caches(asked).items():
        out.setdefault(url, {})["prefix_cache"] = counters.as_dict() if counters else None


def render(data: dict[str, Any], clip: bool = True) -> Group:
    """The human view of ``gather``'s figures; ``clip``: long messages shortened (a terminal;
    piped output keeps every URL and message whole)."""
    total = data["total"] or 1
    finished = data["done"] + data["failed"]
    head = Text(f"run {data['run']}: {finished}/{data['total']} "
                f"({100 * finished / total:.1f}%)  ETA {_duration(data['eta_s'])}")  # fmt: skip
    bar = Table.grid(expand=clip)  # a bare ProgressBar leaves no line break after it
    bar.add_row(ProgressBar(total=total, completed=finished, width=None if clip else 60))
    tables: list[RenderableType] = [
        _main_table(data),
        _errors_table(data, clip),
        _endpoint_table(data, clip),
    ]
    parts: list[RenderableType] = [head, bar, _who(data), _params_line(data), *tables]
    if data.get("restarted_samples"):
        parts.append(Text(
            f"retried under new parameters: {data['restarted_samples']} samples, each started "
            "again from its first turn"
        ))  # fmt: skip
    parts += [Text(note, style="yellow") for note in data.get("notes", [])]
    tools = data.get("tool_calls")
    if tools:
        parts.append(_tools_line(tools))
    for name, skew in sorted(data.get("clocks_off", {}).items()):
        parts.append(Text(f"clock of worker {name} is {skew:+.1f} s from Redis's: run NTP",
                          style="yellow"))  # fmt: skip
    for name, seen in sorted(data.get("loop_errors", {}).items()):
        line = f"background loop {name} survived {seen['count']} exceptions (last: {seen['last']})"
        parts.append(Text(line + "; see the workers' logs", style="yellow"))
    return Group(*parts)


def _tools_line(tools: dict[str, Any]) -> Text:
    """How the tool-calling conversations ended: whole, at another function's call, cut."""
    return Text(
        f"tool-call conversations {tools['conversations']}: kept whole {tools['kept_whole']},"
        f" stopped at a call of another function {tools['stopped']}"
        + _where(tools["stopped_at_turn"])
        + f", cut (finish_reason length) {tools['cut']}"
        + _where(tools["cut_at_turn"])
        + f"; calls with other arguments {tools['arguments_differ']}"
    )  # fmt: skip


def _where(per_turn: dict[str, int]) -> str:
    where = ", ".join(f"turn {t}: {n}" for t, n in per_turn.items())
    return f" ({where})" if where else ""


def _main_table(d: dict[str, Any]) -> Group:
    t = Table(show_header=True, header_style="bold", box=None)
    cols = ("total", "queued", "in flight", "done", "failed", "written", "retries", "redelivered",
            "cut turns", "turns dropped")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right")
    keys = ("total", "queued", "in_flight", "done", "failed", "written", "retries", "redeliveries",
            "cut_turns", "dropped_turns")  # fmt: skip
    t.add_row(*(str(d[k]) for k in keys))
    rates = Table(show_header=True, header_style="bold", box=None)
    for col in ("", "samples/s", "tokens/s"):
        rates.add_column(col, justify="right")
    rates.add_row("last minute", _num(d["samples_per_s_last_minute"]),
                  _num(d["tokens_per_s_last_minute"]))  # fmt: skip
    rates.add_row("since start", _num(d["samples_per_s_since_start"]),
                  _num(d["tokens_per_s_since_start"]))  # fmt: skip
    # p95s are histogram bucket edges: an upper bound, labelled as such.
    dist = Table("per turn", "mean", "p95 ≤", box=None, header_style="bold")
    dist.add_row("completion tokens", _num(d["mean_completion_tokens"]),
                 _num(d["p95_completion_tokens"]))  # fmt: skip
    dist.add_row("latency s", _num(d["mean_latency_s"]), _num(d["p95_latency_s"]))
    g = d["goodput"]
    dist.add_row("tokens kept / wasted", str(g["kept_tokens"]), str(g["wasted_tokens"]))
    if g["ids_dropped_turns"]:
        dist.add_row("turns with ids dropped", str(g["ids_dropped_turns"]), "")
    if g["resumed_turns"]:
        dist.add_row("turns / tokens resumed", str(g["resumed_turns"]), str(g["resumed_tokens"]))
    if g["discarded_checkpoints"]:
        dist.add_row("checkpoints not continuable", str(g["discarded_checkpoints"]), "")
    if g["aborted_requests"]:
        dist.add_row("requests aborted / tokens saved ≤", str(g["aborted_requests"]),
                     str(g["abort_saved_tokens"]))  # fmt: skip
    outer = Table.grid(padding=(0, 4))
    outer.add_row(rates, dist)
    return Group(t, outer)


def _who(d: dict[str, Any]) -> Text:
    workers = d.get("workers", [])
    names = ", ".join(f"{w['name']} ({w['in_flight']} in flight)" for w in workers)
    line = f"workers: {len(workers)} live" + (f" [{names}]" if names else "")
    line += f"; collector: {'writing' if d.get('collector_alive') else 'none'}"
    return Text(line)


def _params_line(d: dict[str, Any]) -> Text:
    if d.get("params_error"):
        return Text(f"parameters: {d['params_error']}", style="red")
    params = d.get("params") or {}
    fixed = [f"{k} {v}" for k, v in params.items() if k not in SAMPLING]
    chosen = [f"{k} {v}" for k, v in params.items() if k in SAMPLING and v != SERVER_DEFAULT]
    sampling = ", ".join(chosen) + ", others " if chosen else ""
    return Text(f"parameters: {', '.join(fixed)}; sampling: {sampling}the server's defaults")


def _errors_table(d: dict[str, Any], clip: bool = True) -> Table:
    t = Table("errors", "count", "last message", box=None, header_style="bold")
    for kind, count in sorted(d["errors"].items()):
        message = d["last_errors"].get(kind, "")
        t.add_row(kind, str(count), message[:100] if clip else message)
    for kind, count in sorted(d.get("handoffs", {}).items()):
        t.add_row(f"{kind} (not an error)", str(count), _HANDOFF_MEANING.get(kind, ""))
    return t


_HANDOFF_MEANING = {
    "handed_back": "a stopping worker gave the sample back to the queue",
    "lease_lost": "another worker took the sample over (this one was paused or cut off)",
}


def _endpoint_table(d: dict[str, Any], clip: bool = True) -> Table:
    t = Table("endpoint", "state", "in flight", "cap", "requests", "tokens", "error rate",
              "mean s", "cache hits", "abort", box=None, header_style="bold")  # fmt: skip
    for url, e in sorted(d["endpoints"].items()):
        cap = str(e.get("cap", "-")) + (" (drained)" if e.get("drained") else "")
        t.add_row(url, _state(e, clip), str(e.get("in_flight", "-")), cap,
                  str(e.get("requests", 0)),
                  str(e.get("tokens", 0)), _num(e.get("error_rate")),
                  _num(e.get("mean_latency_s")), _hit_rate(e), e.get("abort", "-"))  # fmt: skip
    if not clip:  # rich would still fold a long cell to the width: let nothing shrink
        for column in t.columns:
            column.no_wrap = True
    return t


def _hit_rate(e: dict[str, Any]) -> str:
    rate = (e.get("prefix_cache") or {}).get("hit_rate")
    return "-" if rate is None else f"{rate:.1%}"


def _state(e: dict[str, Any], clip: bool = True) -> str:
    if e.get("out_of_rotation"):
        why = e["out_of_rotation"]
        return f"out of rotation: {why[:80] if clip else why}"
    if e.get("state") in ("down", "refusing"):
        problem = e.get("problem") or ""
        return f"{e['state']}: {problem[:80] if clip else problem}"
    return str(e.get("state", "-"))


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def watch(console: Console, store: RunStore, settings: Settings, interval: float) -> None:
    """Redraw the view every ``interval`` seconds until interrupted or the run completes.

    Started before ``enqueue``, it waits for the run to appear and to get its samples.
    """
    if not store.exists():
        with console.status(f"waiting for run {store.run!r} to appear (Ctrl-C to stop)"):
            while not store.exists():
                time.sleep(interval)
    clip = console.is_terminal
    with Live(render(gather(store, settings), clip), console=console, auto_refresh=False) as live:
        while True:
            data = gather(store, settings)
            live.update(render(data, clip), refresh=True)
            if data["complete"] and data["total"] > 0:
                return
            time.sleep(interval)
