"""``eaglegen capture enqueue|worker``: hidden-state capture as a second distributed stage."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.shared import console, fail, load_settings, open_store, out, wait_for_redis
from common.errors import ConfigError
from common.settings import Settings

capture_app = typer.Typer(
    help="Capture the target's hidden states for offline EAGLE-3 training (capture/).",
    no_args_is_help=True,
)


@capture_app.command("enqueue")
def enqueue(
    tokenized_dir: Annotated[Path, typer.Argument(help="`eaglegen tokenize` output.")],
    run: Annotated[str, typer.Option("--run", help="Capture run name.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the files and manifest.")],
    layout: Annotated[str, typer.Option(help="specforge|speculators")],
    aux_layers: Annotated[
        str | None, typer.Option(help="i,j,k in the layout's convention (default: its own).")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="Target model folder (default: the tokenizer's); the run is pinned to it."
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Enqueue even if the disk looks too small.")] = False,
) -> None:
    """Queue one capture task per row of a tokenized dataset (each row once per run)."""
    from capture.app import create_capture_app
    from capture.enqueue import enqueue_rows, model_of
    from capture.identity import ModelIdentity
    from capture.layers import parse_aux
    from capture.model_config import ModelShape
    from capture.spec import LAYOUTS
    from capture.store import CaptureStore

    if layout not in LAYOUTS:
        fail(f"--layout must be specforge or speculators, not {layout!r}", 2)
    settings = load_settings(run=run)
    try:
        aux = parse_aux(aux_layers)
        target = model_of(tokenized_dir, model)
        shape = ModelShape.read(target)
        store = CaptureStore(open_store(settings).r, settings.key_prefix, settings.run)
        app = create_capture_app(settings)
        done = enqueue_rows(
            store, app.publish, tokenized_dir, out_dir, layout, aux, shape,
            app.settings.queue, force, ModelIdentity.of(target),
        )  # fmt: skip
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    console.print(
        f"enqueued {done.new}, already present {done.present} (rows {done.rows}); "
        f"estimate {done.estimate_bytes / 1e9:.3f} GB, free {done.free_bytes / 1e9:.1f} GB"
    )


@capture_app.command("worker")
def worker(
    model: Annotated[Path, typer.Option(help="Target model folder (transformers).")],
    device: Annotated[str, typer.Option(help="cpu or cuda:N.")] = "cpu",
    backend: Annotated[
        str,
        typer.Option(
            help="transformers (the model loaded here), vllm (capture servers) or synthetic "
            "(a stand-in for the GPU at --synthetic-rate, to measure the pipeline on CPU)."
        ),
    ] = "transformers",
    synthetic_rate: Annotated[
        float | None, typer.Option(min=1, help="--backend synthetic: padded tokens/s.")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Rows in flight (the largest batch).")
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Start a capture worker: the model loaded once, rows batched by token budget (or, with
    --backend vllm, each row sent to the capture servers of EAGLEGEN_ENDPOINTS)."""
    from capture.app import create_capture_app
    from common.logs import setup_logging

    if device != "cpu" and not device.startswith("cuda"):
        fail(f"--device must be cpu or cuda:N, not {device!r}", 2)
    if backend not in ("transformers", "vllm", "synthetic"):
        fail(f"--backend must be transformers, vllm or synthetic, not {backend!r}", 2)
    settings = load_settings(concurrency=concurrency or 8)
    setup_logging(settings, loglevel.upper())
    wait_for_redis(settings)
    app = create_capture_app(settings, str(model), device, backend, synthetic_rate)
    try:
        app.parts()  # the model is loaded before the first message is taken
    except ConfigError as exc:
        fail(str(exc))
    app.worker_main(
        [
            "worker", f"--concurrency={settings.concurrency}", "--pool=threads",
            f"--loglevel={loglevel}", f"--queues={app.settings.queue}",
            f"--hostname=eaglegen-capture-{os.getpid()}@%h", "--without-mingle",
            "--without-gossip",
        ]
    )  # fmt: skip


@capture_app.command("verify")
def verify(
    run: Annotated[str, typer.Option("--run", help="Capture run name.")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Where its files are (default: the run's).")
    ] = None,
    sample: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of rows recomputed (0: none, 1: all).")
    ] = 0.01,
    model: Annotated[
        Path | None, typer.Option(help="Target model folder (default: the tokenizer's).")
    ] = None,
    device: Annotated[str, typer.Option(help="Device of the recompute: cpu or cuda:N.")] = "cpu",
    jobs: Annotated[
        int | None, typer.Option(min=1, help="Rows checked at a time (default: CPUs, at most 8).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
) -> None:
    """Check every file of a capture run (checksum, ids, lengths, shapes, values, final norm)
    and recompute a sample of rows with the model; exit 1 if any row is bad."""
    from capture.store import CaptureStore
    from capture.verify import open_verifier, render, verify_run

    settings = load_settings(run=run)
    spec = CaptureStore(open_store(settings).r, settings.key_prefix, settings.run).spec()
    if spec is None:
        fail(f"run {settings.run!r} is not a capture run")
    try:
        verifier = open_verifier(spec, settings.run, out_dir, model, device, sample)
    except ConfigError as exc:
        fail(str(exc))
    with _progress() as advance:
        report = verify_run(spec, verifier, sample, jobs or min(8, os.cpu_count() or 1), advance)
    data = report.to_json()
    if as_json:
        out.print_json(json.dumps(data))
    else:
        out.print(render(data), highlight=False)
    raise typer.Exit(0 if data["ok"] else 1)


@contextmanager
def _progress() -> Iterator[Callable[[int, int], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("verify", total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


def is_capture_run(settings: Settings) -> bool:
    """Whether ``status --run`` names a capture run."""
    from capture.store import CaptureStore

    store = CaptureStore(open_store(settings).r, settings.key_prefix, settings.run)
    return store.spec() is not None


def show_status(settings: Settings, as_json: bool) -> None:
    """``eaglegen status --run RUN`` of a capture run."""
    from capture import status
    from capture.store import CaptureStore

    store = CaptureStore(open_store(settings).r, settings.key_prefix, settings.run)
    data: dict[str, Any] = status.gather(store, settings.capture_queue)
    if as_json:
        out.print_json(json.dumps(data))
    else:
        out.print(status.render(data), highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``eaglegen capture …``."""
    app.add_typer(capture_app, name="capture")
