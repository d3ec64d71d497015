"""``eaglegen endpoints list|drain|undrain``: each endpoint's cluster-wide load, cap and state
(drained, out of a run's rotation)."""

from __future__ import annotations

import json
from typing import Annotated

import redis
import typer
from rich.table import Table

from cli.shared import console, fail, load_settings, open_store, out
from common.settings import Settings
from common.store import RunStore, known_runs
from worker.endpoints.capacity import EndpointView, SlotTable
from worker.pipeline.aborts import AbortSupport

endpoints_app = typer.Typer(
    help="Endpoints' requests in flight and caps across all workers; drain or undrain one.",
    no_args_is_help=True,
)

UrlArg = Annotated[str, typer.Argument(help="The endpoint's base URL, ending in /v1.")]


def _table(settings: Settings) -> SlotTable:
    client = open_store(settings).r
    caps = {url: settings.cap_for(url) for url in settings.endpoints}
    return SlotTable(client, settings.key_prefix, caps, settings.slot_ttl)


def _url(raw: str) -> str:
    url = raw.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
        fail(f"endpoint {raw!r} must be an http(s) URL ending in /v1", 2)
    return url


def _views(table: SlotTable, out: dict[str, dict[str, str]]) -> list[EndpointView]:
    views = table.snapshot()
    listed = {view.endpoint for view in views}
    # Drained endpoints, or out of a run's rotation, that this machine's settings do not list
    # still deserve a line.
    drained = table.drained()
    extra = sorted((drained | set(out)) - listed)
    return views + [EndpointView(url, 0, 0, False, url in drained) for url in extra]


def _out_of_rotation(client: redis.Redis, prefix: str) -> dict[str, dict[str, str]]:
    """Per endpoint, the runs whose rotation it is out of (it refused their requests), and why."""
    found: dict[str, dict[str, str]] = {}
    for run in known_runs(client, prefix):
        for url, why in RunStore(client, prefix, run).endpoints_out().items():
            found.setdefault(url, {})[run] = why
    return found


def _state(view: EndpointView, out: dict[str, str]) -> str:
    runs = [f"out of rotation for {run}: {why}" for run, why in sorted(out.items())]
    return "; ".join((["drained"] if view.drained else []) + runs) or "active"


@endpoints_app.command("list")
def list_endpoints(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Requests in flight (all workers), the cap and where it comes from, drained or not."""
    settings = load_settings()
    table = _table(settings)
    rotation = _out_of_rotation(table.r, settings.key_prefix)
    views = _views(table, rotation)
    aborts = AbortSupport.shown(table.r, settings.key_prefix)
    if as_json:
        rows = [{**view.__dict__, "abort": aborts.get(view.endpoint),
                 "out_of_rotation": rotation.get(view.endpoint, {})} for view in views]  # fmt: skip
        out.print_json(json.dumps(rows))
        return
    grid = Table("endpoint", "in flight", "cap", "cap from", "state", "abort")
    for v in views:
        source = "adaptive" if v.adaptive else "settings"
        state = _state(v, rotation.get(v.endpoint, {}))
        abort = aborts.get(v.endpoint, "- (not tried yet)")
        grid.add_row(v.endpoint, str(v.inflight), str(v.cap or "-"), source, state, abort)
    out.print(grid)


@endpoints_app.command()
def drain(url: UrlArg) -> None:
    """Send no new requests to an endpoint; those it runs finish."""
    endpoint = _url(url)
    _table(load_settings()).drain(endpoint)
    console.print(f"drained {endpoint}: no new requests go there (eaglegen endpoints undrain)")


@endpoints_app.command()
def undrain(url: UrlArg) -> None:
    """Send requests to a drained endpoint again."""
    endpoint = _url(url)
    if _table(load_settings()).undrain(endpoint):
        console.print(f"{endpoint} takes requests again")
    else:
        console.print(f"{endpoint} was not drained")


def register(app: typer.Typer) -> None:
    """Add the ``endpoints`` command group to the main app."""
    app.add_typer(endpoints_app, name="endpoints")
