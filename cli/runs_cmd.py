"""``eaglegen runs`` and ``eaglegen runs retire NAME``: every run's state and Redis footprint,
and removing a finished run's keys while a small summary stays."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from cli.shared import console, fail, load_settings, open_store, out
from common.errors import InvalidParams
from common.sampling import SERVER_DEFAULT, describe
from common.store import RunStore

runs_app = typer.Typer(
    help="Runs in this Redis: state, samples, Redis bytes; retire a finished one.",
    invoke_without_command=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


@runs_app.callback()
def runs(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List runs with their state, samples and the Redis memory their keys use."""
    if ctx.invoked_subcommand is not None:
        return
    rows = _rows()
    if as_json:
        out.print_json(json.dumps(rows))
        return
    grid = Table("run", "state", "total", "written", "failed", "redis bytes", "parameters")
    for row in rows:
        figures = [str(row[name]) for name in ("run", "state", "total", "written", "failed")]
        grid.add_row(*figures, f"{row['redis_bytes']:,}", _params_text(row["params"]))
    out.print(grid)


def _params_text(params: object) -> str:
    if not isinstance(params, dict):
        return str(params or "-")
    chosen = [f"{k} {v}" for k, v in params.items() if v != SERVER_DEFAULT]
    return ", ".join(chosen) + "; other sampling: the server's defaults"


def _rows() -> list[dict[str, object]]:
    settings = load_settings()
    client = open_store(settings).r
    prefix = settings.key_prefix
    names = sorted({*RunStore.known_runs(client, prefix), *RunStore.retired_runs(client, prefix)})
    return [_row(RunStore(client, prefix, name)) for name in names]


def _row(store: RunStore) -> dict[str, object]:
    summary = store.retired_summary()
    if summary is not None:
        state = "retired"
        figures = {name: summary.get(name) for name in ("total", "written", "failed")}
    else:
        counts = store.counts()
        state = store.state(counts)
        figures = {"total": counts.total, "written": counts.written, "failed": counts.failed}
    return {"run": store.run, "state": state, **figures, "redis_bytes": store.memory_bytes(),
            "params": _frozen_params(store, summary)}  # fmt: skip


def _frozen_params(store: RunStore, summary: dict[str, object] | None) -> object:
    """What the run was frozen with; unset sampling shown as the server's default."""
    if summary is not None:
        raw = summary.get("params")
    else:
        try:
            found = store.params()
        except InvalidParams as exc:
            return str(exc)
        raw = found.model_dump(exclude_none=True) if found else None
    if not isinstance(raw, dict):
        return None
    shown = {k: v for k, v in raw.items() if v is not None}
    return {**shown, **describe(shown)}


@runs_app.command()
def retire(
    name: Annotated[str, typer.Argument(help="The run to retire.")],
    force: Annotated[
        bool, typer.Option("--force", help="Retire even with samples pending, unwritten or failed.")
    ] = False,
) -> None:
    """Remove a finished run's keys from Redis, keeping a small summary."""
    settings = load_settings(run=name)
    store = open_store(settings)
    if not store.exists() and store.retired_summary() is None:
        fail(f"no run named {name!r}")
    before = store.memory_bytes()
    outcome = store.retire(force)
    if outcome == "already":
        console.print(f"run {name!r} was already retired")
    elif outcome == "unfinished":
        counts = store.counts()
        fail(f"run {name!r} is not fully written ({counts.pending} pending, "
             f"{counts.done - counts.written} answered but not on disk, {counts.failed} failed); "
             "finish and collect it (eaglegen retry-failed for failures), or --force")  # fmt: skip
    else:
        after = store.memory_bytes()
        console.print(f"retired run {name!r}: Redis bytes {before:,} -> {after:,} (a summary)")


def register(app: typer.Typer) -> None:
    """Add the ``runs`` command group to the main app."""
    app.add_typer(runs_app, name="runs")
