"""``eaglegen endpoints list|drain|undrain``: each endpoint's cluster-wide load, cap and state."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from cli.shared import console, fail, load_settings, open_store, out
from common.settings import Settings
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


def _views(table: SlotTable) -> list[EndpointView]:
    views = table.snapshot()
    listed = {view.endpoint for view in views}
    # Drained endpoints this machine's settings do not list still deserve a line.
    extra = sorted(table.drained() - listed)
    return views + [EndpointView(url, 0, 0, False, True) for url in extra]


@endpoints_app.command("list")
def list_endpoints(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Requests in flight (all workers), the cap and where it comes from, drained or not."""
    settings = load_settings()
    table = _table(settings)
    views = _views(table)
    aborts = AbortSupport.shown(table.r, settings.key_prefix)
    if as_json:
        rows = [{**view.__dict__, "abort": aborts.get(view.endpoint)} for view in views]
        out.print_json(json.dumps(rows))
        return
    grid = Table("endpoint", "in flight", "cap", "cap from", "state", "abort")
    for v in views:
        source = "adaptive" if v.adaptive else "settings"
        state = "drained" if v.drained else "active"
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
